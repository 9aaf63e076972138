"""How many nodes a launch spans, from SGLang's arguments (both spellings, and its --config YAML file), torch's
launcher and SLURM; and what the NCCL decision does with it."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.runtime import launch as launches
from sglang_pcie.runtime.gpus import Topology
from sglang_pcie.runtime.launch import NODES_VAR, detect
from sglang_pcie.runtime.nccl import apply_for_process, decide
from sglang_pcie.runtime.settings import load_settings
from sglang_pcie.runtime import tuned_file

PCIE2 = Topology(["NVIDIA RTX PRO 6000 Blackwell"] * 2, nvlink=False, p2p=True, source="nvml",
                 uuids=["GPU-a", "GPU-b"])


@pytest.mark.parametrize("argv, env, nodes, rank, source", [
    (["--model-path", "m", "--tp", "4", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"], {},
     2, 1, "--nnodes 2"),
    (["--nnodes=3", "--node-rank=0"], {}, 3, 0, "--nnodes 3"),
    (["--model-path", "m", "--tp", "2"], {}, 1, None, "one node"),
    (["--nnodes", "1"], {}, 1, None, "--nnodes 1"),
    ([], {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}, 2, 1, "torch's launcher"),
    ([], {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, 1, None, "one node"),
    ([], {"SLURM_NNODES": "2", "SLURM_NODEID": "0"}, 2, 0, "SLURM_NNODES=2"),
    ([], {NODES_VAR: "2"}, 2, None, "from the launcher"),
])
def test_the_node_count_of_a_launch(argv, env, nodes, rank, source):
    launch = detect(argv, env)
    assert (launch.nodes, launch.node_rank) == (nodes, rank) and source in launch.source and launch.problem is None


def test_sglangs_config_file_form(tmp_path):
    config = tmp_path / "server.yaml"
    config.write_text("model-path: m\ntp-size: 4\nnnodes: 2\nnode-rank: 1\n")
    launch = detect(["--config", str(config)], {})
    assert (launch.nodes, launch.node_rank) == (2, 1) and f"nnodes: 2 in --config {config}" in launch.source
    assert detect(["--config", str(config), "--nnodes", "4"], {}).nodes == 4  # the command line wins


@pytest.mark.parametrize("make, said", [("missing", "no such file"), ("fifo", "is a FIFO"), ("bad", "not YAML")])
def test_a_config_file_that_cannot_be_read_is_one_reason_and_one_node(tmp_path, make, said):
    import os

    path = tmp_path / "server.yaml"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "bad":
        path.write_text("nnodes: [2\n")
    launch = detect(["--config", str(path)], {})
    assert launch.nodes == 1 and str(path) in launch.problem and said in launch.problem


def test_a_bad_count_is_named_and_read_as_one_node():
    launch = detect(["--nnodes", "two"], {})
    assert launch.nodes == 1 and "--nnodes two: not a positive number of nodes" in launch.problem


def write_one_box_file(path, values, winner):
    tuned_file.write_config(path, {"format": 2, "fingerprint": tuned_file.fingerprint(PCIE2), "winner": winner,
                                   "values": values})


def test_auto_applies_no_one_box_result_across_nodes_and_says_so_once(tmp_path, capsys):
    path = tmp_path / "tuned.json"
    write_one_box_file(path, {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, "ring-LL")
    env = {tuned_file.TUNED_FILE_VAR: str(path)}
    one_node = decide("auto", dict(env), probe=lambda: PCIE2, launch=detect(["--tp", "2"], env))
    assert one_node.values == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}  # the file fits one box
    two = decide("auto", dict(env), probe=lambda: PCIE2, launch=detect(["--tp", "4", "--nnodes", "2"], env))
    assert two.values == {} and "a launch over 2 nodes" in two.reason and "measured on 1 node(s), launched on 2" in two.reason
    assert "every node must run the same NCCL settings" in two.advice and two.as_dict()["nodes"]["count"] == 2


def test_the_launcher_writes_the_node_count_for_its_workers_and_one_line(tmp_path, capsys, monkeypatch):
    from sglang_pcie.runtime import gpus

    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: PCIE2)
    monkeypatch.setattr(launches.sys, "argv", ["launch_server", "--tp", "4", "--nnodes=2", "--node-rank=0"])
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    decision = apply_for_process(load_settings(env), env)
    assert env[NODES_VAR] == "2" and decision.values == {}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a launch over 2 nodes (--nnodes 2, this is node 0)" in err[0]
    worker = dict(env)
    assert apply_for_process(load_settings(worker), worker) is None and capsys.readouterr().err == ""


def test_an_explicit_profile_is_applied_across_nodes_with_one_line(monkeypatch, capsys):
    decision = decide("pcie", {}, probe=lambda: PCIE2, launch=detect(["--nnodes", "2"], {}))
    assert decision.values["NCCL_PROTO"] == "LL"
    assert decision.advice.startswith("SGLANG_PCIE_NCCL_PROFILE=pcie on a launch over 2 nodes")
    assert "every node must run the same NCCL settings" in decision.advice


def test_a_result_measured_across_the_same_nodes_applies(tmp_path):
    path = tmp_path / "tuned.json"
    fingerprint = tuned_file.fingerprint(PCIE2, {}, nodes=2)
    tuned_file.write_config(path, {"format": 2, "fingerprint": fingerprint, "winner": "proto-LL",
                                   "values": {"NCCL_PROTO": "LL"}})
    env = {tuned_file.TUNED_FILE_VAR: str(path)}
    decision = decide("auto", dict(env), probe=lambda: PCIE2, launch=detect(["--nnodes", "2"], env))
    assert decision.values == {"NCCL_PROTO": "LL"} and "measured across 2 nodes" in decision.advice
    assert json.loads(path.read_text())["fingerprint"]["nodes"] == 2
    one = decide("auto", dict(env), probe=lambda: PCIE2, launch=detect([], env))
    assert one.values == {}  # and a two-node result is no evidence for one box


def test_the_ipc_path_stays_off_across_nodes():
    from sglang_pcie.runtime.allreduce import FlashinferInstall, SglangInstall, decide_ipc

    wins = {"ipc": {"max_tokens": 2, "max_numel": 2 * 7168, "hidden": 7168, "tokens": [1, 2], "flashinfer": "0.7.2"}}
    sglang = SglangInstall(None, "0.5.23", True)
    fi = FlashinferInstall("0.7.2", True, "/x")
    decision = decide_ipc("auto", wins, PCIE2, {}, sglang, fi, launch=detect(["--nnodes", "2"], {}))
    assert decision.values == {} and "single-node" in decision.reason


@pytest.mark.parametrize("argv, env, nodes, rank", [
    ([], {"WORLD_SIZE": "10", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "2"}, 3, 2),  # not a multiple: a partial node
    ([], {"WORLD_SIZE": "9", "LOCAL_WORLD_SIZE": "8"}, 2, None),
    (["--model-path", "m", "--nnodes"], {}, 1, None),  # a trailing option without its value names nothing
    (["--nnodes", "2", "--node-rank"], {}, 2, None),
    (["--nnodes", "2", "--nnodes", "4"], {}, 4, None),  # argparse's rule: the last one wins
    (["--nnodes", "2", "--node-rank", "-1"], {}, 2, None),  # not a node rank
    (["--nnodes", "2"], {NODES_VAR: "3"}, 3, None),  # the launcher's count, written for its workers, comes first
])
def test_the_edges_of_a_launchs_node_count(argv, env, nodes, rank):
    launch = detect(argv, env)
    assert (launch.nodes, launch.node_rank) == (nodes, rank)


def test_the_command_line_wins_over_the_config_file_for_each_setting(tmp_path):
    config = tmp_path / "server.yaml"
    config.write_text("nnodes: 2\nnode-rank: 1\n")
    assert (detect(["--config", str(config), "--node-rank", "0"], {}).node_rank) == 0
    launch = detect(["--node-rank", "1", "--config", str(config), "--nnodes", "3"], {})
    assert (launch.nodes, launch.node_rank, launch.source) == (3, 1, "--nnodes 3")
    config.write_text("nnodes: 2\nnode_rank: 1\n")  # SGLang's attribute spelling works too
    assert detect(["--config", str(config)], {}).node_rank == 1
    config.write_text("nnodes: two\n")
    bad = detect(["--config", str(config)], {})
    assert bad.nodes == 1 and bad.problem == f"nnodes: two in --config {config}: not a positive number of nodes; read as one node"


@pytest.mark.parametrize("nodes, multi", [(1, False), (2, True)])
def test_multi_node_is_more_than_one_node(nodes, multi):
    assert launches.Launch(nodes, "x").multi_node is multi


def test_the_processs_own_arguments_are_read_without_its_program_name(monkeypatch):
    monkeypatch.setattr(launches.sys, "argv", ["--nnodes=2"])
    assert detect(None, {}).nodes == 1  # argv[0] is the program, never an option
    monkeypatch.setattr(launches.sys, "argv", ["launch_server", "--nnodes", "2"])
    assert detect(None, {}).nodes == 2


@pytest.mark.parametrize("argv, env, nodes, rank, source, problem", [
    ([], {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0"}, 2, 0, "torch's launcher", None),
    ([], {"SLURM_NNODES": "1", "SLURM_NODEID": "0"}, 1, None, "one node", None),  # SLURM on one node is one node
    ([], {"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1"}, 2, 1, "SLURM_NNODES=2", None),
    ([], {NODES_VAR: "0", "SLURM_NNODES": "2"}, 2, None, "SLURM_NNODES=2", None),  # 0 is no inherited count
    (["--nnodes", "2", "--node-rank", "0"], {}, 2, 0, "--nnodes 2", None),  # node 0 is a rank
    (["--nnodes", "0"], {}, 1, None, "one node", "--nnodes 0: not a positive number of nodes; read as one node"),
    (["--nnodes", "-2"], {}, 1, None, "one node", "--nnodes -2: not a positive number of nodes; read as one node"),
    ([], {"WORLD_SIZE": "0", "LOCAL_WORLD_SIZE": "4"}, 1, None, "one node", None),
])
def test_zero_is_a_rank_but_never_a_count(argv, env, nodes, rank, source, problem):
    launch = detect(argv, env)
    assert (launch.nodes, launch.node_rank, launch.problem) == (nodes, rank, problem) and source in launch.source


def test_a_config_path_holding_an_equals_sign(tmp_path):
    config = tmp_path / "a=b.yaml"
    config.write_text("nnodes: 2\n")
    launch = detect([f"--config={config}"], {})
    assert launch.nodes == 2 and launch.source == f"nnodes: 2 in --config {config}" and launch.problem is None


@pytest.mark.parametrize("text", ["- nnodes: 2\n", "just text\n", ""])
def test_a_config_file_that_is_not_a_mapping_says_nothing_about_nodes(tmp_path, text):
    config = tmp_path / "server.yaml"
    config.write_text(text)
    launch = detect(["--config", str(config)], {"SLURM_NNODES": "2"})
    assert (launch.nodes, launch.source, launch.problem) == (2, "SLURM_NNODES=2", None)


def test_a_config_problem_travels_with_the_count_found_elsewhere(tmp_path):
    missing = tmp_path / "none.yaml"
    for env, nodes in [({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, 2), ({"SLURM_NNODES": "3"}, 3), ({}, 1)]:
        launch = detect(["--config", str(missing)], env)
        assert launch.nodes == nodes and launch.problem == f"--config {missing}: no such file"


def test_describe_names_the_count_source_and_rank():
    assert detect(["--nnodes", "2", "--node-rank", "1"], {}).describe() == \
        "a launch over 2 nodes (--nnodes 2, this is node 1)"
    assert detect(["--nnodes", "2"], {}).describe() == "a launch over 2 nodes (--nnodes 2)"
