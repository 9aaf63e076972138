"""tune-nccl across nodes: the arguments, the multi-node fingerprint and how `auto` matches it, and two "nodes" on
this machine - two tune-nccl processes, each starting its runs with torch's launcher (torchrun) at 127.0.0.1, the real
worker on CPU tensors (gloo) in a real SGLang env - that step through the same runs and write the same file; a node
that never comes and nodes started with other arguments each end in one line."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import textwrap

import pytest

from sglang_pcie.runtime import gpus
from sglang_pcie.runtime import tuned_file as tuning
from sglang_pcie.runtime.gpus import Topology
from sglang_pcie.runtime.launch import detect
from sglang_pcie.runtime.nccl import decide
from sglang_pcie.tools import tune_nccl
from sglang_pcie.tools.cli import main as cli_main
from sglang_pcie.tools.tune_nccl import nodes as tune_nodes
from sglang_pcie.tools.tune_nccl.rendezvous import differences
from sglang_pcie.tools.tune_nccl.report import CONTENT_DIGEST, content_digest

from support import REPO

NO_GPU = Topology(detail="no NVIDIA driver, or it lists none")
BOX_A = Topology(["NVIDIA H200"] * 2, nvlink=False, p2p=True, source="nvml", uuids=["GPU-a0", "GPU-a1"])
BOX_B = Topology(["NVIDIA H200"] * 2, nvlink=False, p2p=True, source="nvml", uuids=["GPU-b0", "GPU-b1"])
BOX_C = Topology(["NVIDIA H200"] * 2, nvlink=False, p2p=True, source="nvml", uuids=["GPU-c0", "GPU-c1"])


def tune(argv: list) -> int:
    try:
        return cli_main(["tune-nccl", *argv])
    except SystemExit as exc:  # argparse's own errors
        return exc.code


ACROSS = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1"]


@pytest.mark.parametrize("argv, message", [
    (["--nnodes", "2"], "--nnodes 2: give --node-rank (0 to 1) and --master-addr (node 0's address)"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank 2: not below --nnodes 2"),
    (["--node-rank", "1"], "--node-rank and --master-addr need --nnodes above 1"),
    (["--master-addr", "h"], "--node-rank and --master-addr need --nnodes above 1"),
    ([*ACROSS, "--tp", "3"], "--tp 3: not a multiple of --nnodes 2"),
    (["--nnodes", "2", "--node-rank", "0", "--master-addr", "h;rm -rf /"], "is not a host name or address"),
    ([*ACROSS, "--master-port", "65535"], "is not a port from 1 to 65534"),
    ([*ACROSS, "--node-rank", "-1"], "is not a node rank"),
    ([*ACROSS, "--join-timeout", "0"], "positive number"),
])
def test_bad_arguments_across_nodes_exit_2_naming_the_value(argv, message, capsys):
    assert tune(["--backend", "gloo", "--out", "/nonexistent/x.json", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_dry_run_across_nodes_shows_torchs_launcher_for_this_node(monkeypatch, capsys):
    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: NO_GPU)
    assert tune(["--dry-run", "--tp", "4", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                 "--master-port", "29400", "--join-timeout", "90"]) == 0
    captured = capsys.readouterr()
    assert "pcie-ipc       not measured: SGLang's adapter serves the GPUs of one node (--nnodes 2)" in captured.out
    launcher = re.search(r"^each run here: (.*)$", captured.out, re.M).group(1)
    assert ("-m torch.distributed.run --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 10.0.0.1 "
            "--master-port 29400 --rdzv-conf timeout=90 --max-restarts 0 --no-python ") in launcher
    assert launcher.endswith("-m sglang_pcie.tools.tune_nccl --worker SPEC")
    assert ("node 1 of 2, 2 rank(s) here and 4 in all; torch's rendezvous at 10.0.0.1:29400 and :29401 (node 0 "
            "serves it), --join-timeout 90 s") in captured.err
    assert "showing what would run over 4 ranks; a real run needs 2 GPUs on each node" in captured.err


def test_steps_alternate_between_the_port_and_the_next():
    nodes = tune_nodes.Nodes(2, 0, "h", 29500, 60, 1, {})
    assert [nodes.port(step) for step in (1, 2, 3, 4)] == [29500, 29501, 29500, 29501]


def test_torchs_launcher_error_is_one_line_without_its_module_path():
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1',
             "torch.distributed.DistStoreError: Timed out after 11 seconds waiting for clients. 1/2 clients joined.",
             ""]
    assert tune_nodes.launcher_error(lines) == ("DistStoreError: Timed out after 11 seconds waiting for clients. "
                                                "1/2 clients joined.")
    assert tune_nodes.launcher_error(["[W] all fine"]) == ""


def test_nccls_own_word_on_the_network_is_picked_from_its_info_lines():
    lines = ["h:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>",
             "h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.2<0>",
             "h:1:1 [0] NCCL INFO Using network IB", "tune-nccl worker rank 0 +1.0s phase: process group up"]
    assert tune_nodes.nccl_network(lines) == ["NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.2<0>",
                                              "Using network IB"]
    assert tune_nodes.nccl_network(["h:1:1 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>"]) == [
        "NET/Socket : Using [0]lo:127.0.0.1<0>"]


def test_ranks_at_another_step_are_told_what_differs():
    mine = {"step": 3, "label": "proto-LL", "tokens": [1, 2]}
    assert differences(dict(mine, label="default", tokens=[1, 4]), mine) == (
        "label 'default' (here 'proto-LL'), tokens [1, 4] (here [1, 2])")


# ---------------------------------------------------------------------------------------------------------------
# The multi-node fingerprint, and how `auto` matches it


def two_node_file(path, *boxes, environ=None):
    fingerprint = tuning.multi_node_fingerprint([tuning.node_fingerprint(box, environ or {}) for box in boxes])
    tuning.write_config(path, {"format": tuning.FORMAT, "fingerprint": fingerprint, "winner": "proto-LL",
                               "values": {"NCCL_PROTO": "LL"}})
    return json.loads(path.read_text())


def test_the_fingerprint_records_the_node_count_every_nodes_gpus_and_network(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "IB_DEVICES", str(tmp_path / "ib"))
    (tmp_path / "ib" / "mlx5_0").mkdir(parents=True)
    env = {"NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1"}
    fingerprint = two_node_file(tmp_path / "t.json", BOX_A, BOX_B, environ=env)["fingerprint"]
    assert fingerprint["nodes"] == 2
    assert fingerprint["gpu_uuids"] == ["GPU-a0", "GPU-a1", "GPU-b0", "GPU-b1"] and len(fingerprint["gpus"]) == 4
    assert [node["gpu_uuids"] for node in fingerprint["node_fingerprints"]] == [BOX_A.uuids, BOX_B.uuids]
    node = fingerprint["node_fingerprints"][1]
    assert node["net_env"] == {"NCCL_IB_HCA": "mlx5_0"} and node["ib_devices"] == ["mlx5_0"]
    assert node["transport_env"] == {"NCCL_P2P_DISABLE": "1"}
    assert (fingerprint["nvlink"], fingerprint["p2p"]) == (False, True)
    assert tuning.describe_machine(fingerprint).startswith("2 nodes, 4 x NVIDIA H200")


def fingerprint_problem(change):
    fingerprint = tuning.multi_node_fingerprint([tuning.node_fingerprint(box, {}) for box in (BOX_A, BOX_B)])
    change(fingerprint)
    return tuning.validate_config({"format": 2, "fingerprint": fingerprint, "winner": "default", "values": {}})


@pytest.mark.parametrize("change, named", [
    (lambda fp: fp["node_fingerprints"].pop(), "node_fingerprints must hold one fingerprint per node"),
    (lambda fp: fp.pop("nodes"), "node_fingerprints must hold one fingerprint per node"),
    (lambda fp: fp["gpu_uuids"].reverse(), "must list every node's, in node order"),
    (lambda fp: fp["node_fingerprints"][1]["net_env"].update(LD_PRELOAD="x"), "net_env must map NCCL network"),
    (lambda fp: fp["node_fingerprints"][0].update(ib_devices="mlx5_0"), "ib_devices must be a list"),
    (lambda fp: fp["node_fingerprints"][0].update(extra=1), "node_fingerprints[0] must hold exactly"),
    (lambda fp: fp["node_fingerprints"][1].update(p2p="yes"),
     "fingerprint.node_fingerprints[1].p2p 'yes' is not true, false or null"),
])
def test_a_multi_node_fingerprint_holds_what_tune_nccl_writes(change, named):
    assert fingerprint_problem(lambda fp: None) is None
    assert named in fingerprint_problem(change)


def decided(path, topology, argv, environ=None):
    env = dict(environ or {}, **{tuning.TUNED_FILE_VAR: str(path)})
    return decide("auto", env, probe=lambda: topology, launch=detect(argv, env))


def test_auto_applies_a_multi_node_result_only_on_its_nodes_and_at_its_node_count(tmp_path):
    path = tmp_path / "t.json"
    two_node_file(path, BOX_A, BOX_B)
    for box in (BOX_A, BOX_B):  # every node of the measurement
        decision = decided(path, box, ["--nnodes", "2", "--node-rank", "1"])
        assert decision.values == {"NCCL_PROTO": "LL"} and "measured across 2 nodes" in decision.advice
    launched_by_torch = decided(path, BOX_B, [], {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    assert launched_by_torch.values == {"NCCL_PROTO": "LL"}
    for argv, said in ((["--tp", "2"], "measured on 2 node(s), launched on 1"),
                       (["--nnodes", "3"], "measured on 2 node(s), launched on 3")):
        decision = decided(path, BOX_A, argv)
        assert decision.values == {} and said in decision.reason
    elsewhere = decided(path, BOX_C, ["--nnodes", "2"])
    assert elsewhere.values == {} and "this node is none of the 2 nodes measured (closest, node 0: gpu_uuids" in (
        elsewhere.reason)
    other_network = decided(path, BOX_A, ["--nnodes", "2"], {"NCCL_IB_DISABLE": "1"})
    assert other_network.values == {} and 'net_env {} here {"NCCL_IB_DISABLE": "1"}' in other_network.reason


def test_the_content_digest_covers_everything_but_itself():
    config = {"winner": "default", "values": {}, "measured": {"wall_s": 1.0}}
    digest = content_digest(config)
    assert content_digest(dict(config, **{CONTENT_DIGEST: digest})) == digest
    assert content_digest(dict(config, measured={"wall_s": 1.5})) != digest


# ---------------------------------------------------------------------------------------------------------------
# Two nodes on this machine: real tune-nccl processes, torch's launcher, the real worker, gloo

# NVML lists no GPU on this machine, so each "node" shows two stand-in GPUs of its own (named for it): the
# fingerprint then shows that it holds every node's, gathered through the ranks. And one run misbehaves: proto-Simple's
# rank 3 (on node 1) finds wrong sums, as a broken all-reduce would; every node drops it and goes on. The rest is the
# real command and the real worker.
BROKEN_RANK = textwrap.dedent("""
    import json, os, sys
    from sglang_pcie.tools.tune_nccl import worker
    spec = json.loads(sys.argv[2])
    if spec.get("label") == "proto-Simple" and os.environ["RANK"] == "3":
        def broken(*args):
            raise RuntimeError("wrong sums after all-reduce at 1 tokens (4 of 4 buffers) [test: a broken rank]")
        worker.measure_nccl = broken
    sys.exit(worker.run_worker(spec))
""")
STAND_IN = textwrap.dedent("""
    import sys
    from sglang_pcie.runtime import gpus
    from sglang_pcie.tools import tune_nccl
    node = sys.argv.pop(1)
    stand_in = gpus.Topology([f"CPU stand-in (node {node})"] * 2, source="stand-in",
                             uuids=[f"GPU-stand-in-node{node}-{i}" for i in range(2)])
    gpus.probe_topology = lambda environ=None: stand_in
    tune_nccl.WORKER_COMMAND = [sys.executable, "-c", BROKEN_RANK_CODE]
    from sglang_pcie.tools.cli import main
    sys.exit(main(sys.argv[1:]))
""").replace("BROKEN_RANK_CODE", repr(BROKEN_RANK))
SWEEP = ["--backend", "gloo", "--nnodes", "2", "--master-addr", "127.0.0.1", "--tp", "4", "--tokens", "1,2",
         "--prefill-tokens", "none", "--hidden", "64", "--layers", "2"]
NODE_BOUND_S = 900  # the whole two-node sweep, on a loaded 2-core machine; a hang fails the test, not the run


def two_free_ports() -> int:
    """A port P where P and P + 1 are free now (the nodes meet at both)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two neighbouring free ports")


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SGLANG_PCIE_"))}
    return dict(env, PYTHONPATH=str(REPO))


def start_nodes(python, folder, argv_per_node: list[list[str]]) -> list[subprocess.Popen]:
    return [subprocess.Popen([str(python), "-c", STAND_IN, str(node), "tune-nccl", *argv,
                              "--node-rank", str(node), "--out", str(folder / f"node{node}.json")],
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for node, argv in enumerate(argv_per_node)]


def finish(processes) -> list[dict]:
    results = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=NODE_BOUND_S)
        except subprocess.TimeoutExpired:
            for each in processes:
                each.kill()
            raise
        results.append({"code": process.returncode, "out": out, "err": err})
    return results


@pytest.fixture(scope="module")
def two_nodes(torch_python, tmp_path_factory):
    folder = tmp_path_factory.mktemp("two-nodes")
    argv = [*SWEEP, "--profiles", "default,proto-LL,proto-Simple", "--master-port", str(two_free_ports()),
            "--join-timeout", "120"]
    results = finish(start_nodes(torch_python, folder, [argv, argv]))
    (folder / "transcript.txt").write_text("".join(
        f"===== node {node}: exit {r['code']}\n--- stderr\n{r['err']}--- stdout\n{r['out']}"
        for node, r in enumerate(results)))
    return folder, results


def test_two_nodes_step_together_and_write_the_same_file(two_nodes):
    folder, results = two_nodes
    for node, result in enumerate(results):
        assert result["code"] == 0, f"node {node}:\n{result['err'][-3000:]}"
    written = [(folder / f"node{node}.json").read_bytes() for node in (0, 1)]
    assert written[0] == written[1]
    config = json.loads(written[0])
    assert tuning.validate_config(config) is None and config[CONTENT_DIGEST] == content_digest(config)
    fingerprint = config["fingerprint"]
    assert fingerprint["nodes"] == 2
    assert [node["gpu_uuids"] for node in fingerprint["node_fingerprints"]] == [
        [f"GPU-stand-in-node{node}-{i}" for i in range(2)] for node in (0, 1)]
    assert fingerprint["gpus"] == ["CPU stand-in (node 0)"] * 2 + ["CPU stand-in (node 1)"] * 2
    assert all(node["net_env"] == {} and isinstance(node["ib_devices"], list)
               for node in fingerprint["node_fingerprints"])
    across = config["measured"]["nodes"]
    assert across["count"] == 2 and across["ranks_per_node"] == 2 and across["launcher"].startswith("torch")
    assert across["ranks"] == [{"rank": rank, "node": rank // 2, "device": "cpu"} for rank in range(4)]
    assert config["measured"]["tp"] == 4 and "over 4 ranks on 2 nodes" in config["rule"]
    assert len(config["table"]["default"]["runs"]) == 3 and config["table"]["proto-LL"]["runs"]
    broken = "RuntimeError: wrong sums after all-reduce at 1 tokens (4 of 4 buffers) [test: a broken rank]"
    assert config["table"]["proto-Simple"] == {"values": {"NCCL_PROTO": "Simple"}, "runs": [None],
                                               "verdict": f"dropped: rank 3 (node 1) failed: {broken}"}
    assert all(f"dropped: rank 3 (node 1) failed: {broken}" in r["err"] for r in results)  # said alike
    assert config["ipc"]["verdict"] == "not measured: SGLang's adapter serves the GPUs of one node (--nnodes 2)"
    # Lockstep: the same runs in the same order on both nodes, with the same figures (the slowest of all ranks).
    runs = [re.findall(r"^tune-nccl: (\[\d+/\d+\] \S+ +[\d.]+ s +(.*))$", r["err"], re.M) for r in results]
    assert len(runs[0]) == len(runs[1]) >= 5 and [line.split()[1] for line, _ in runs[0]] == [
        line.split()[1] for line, _ in runs[1]]
    measured = [[figures for _, figures in node_runs if "dropped" not in figures] for node_runs in runs]
    assert measured[0] == measured[1]
    assert "handing this node's result to every node" in results[0]["err"]
    assert "receiving node 0's result" in results[1]["err"]
    for node, result in enumerate(results):
        assert (f"written to {folder / f'node{node}.json'} (content sha256 {config[CONTENT_DIGEST]}; the same file "
                f"on all 2 nodes)") in result["out"]
    assert results[0]["out"].split("written to")[0] == results[1]["out"].split("written to")[0]  # table, verdict


DECIDE = textwrap.dedent("""
    import json, sys
    from sglang_pcie.runtime.gpus import Topology
    from sglang_pcie.runtime.launch import detect
    from sglang_pcie.runtime.nccl import decide
    path, cases = sys.argv[1], json.loads(sys.argv[2])
    answers = []
    for node, argv, environ in cases:
        box = Topology([f"CPU stand-in (node {node})"] * 2, source="stand-in",
                       uuids=[f"GPU-stand-in-node{node}-{i}" for i in range(2)])
        env = dict(environ, SGLANG_PCIE_TUNED_FILE=path)
        decision = decide("auto", env, probe=lambda: box, launch=detect(argv, env))
        answers.append({"applied": decision.config is not None, "reason": decision.reason})
    print(json.dumps(answers))
""")


def test_auto_in_the_servers_env_applies_the_two_node_file_only_where_it_was_measured(two_nodes, torch_python):
    folder, results = two_nodes
    assert results[0]["code"] == 0, results[0]["err"][-3000:]
    cases = [(0, ["--nnodes", "2", "--node-rank", "0"], {}), (1, ["--nnodes", "2", "--node-rank", "1"], {}),
             (1, [], {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}),  # torch's launcher across 2 nodes
             (0, ["--tp", "2"], {}), (0, ["--nnodes", "3"], {}),
             (2, ["--nnodes", "2"], {}),  # a node that was not measured
             (1, ["--nnodes", "2"], {"NCCL_SOCKET_IFNAME": "eth1"})]  # another network set-up
    done = subprocess.run([str(torch_python), "-c", DECIDE, str(folder / "node1.json"), json.dumps(cases)],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    assert [a["applied"] for a in answers] == [True, True, True, False, False, False, False], answers
    assert "measured on 2 node(s), launched on 1" in answers[3]["reason"]
    assert "measured on 2 node(s), launched on 3" in answers[4]["reason"]
    assert "this node is none of the 2 nodes measured" in answers[5]["reason"]
    assert 'net_env {} here {"NCCL_SOCKET_IFNAME": "eth1"}' in answers[6]["reason"]


def error_lines(result) -> list[str]:
    return [line for line in result["err"].splitlines() if "error" in line.lower()]


def test_a_node_that_never_comes_ends_the_sweep_in_one_line(torch_python, tmp_path):
    # Node 0 alone, and (at another port) node 1 alone: each waits --join-timeout, then says so once.
    alone = [[*SWEEP, "--profiles", "default", "--join-timeout", "10", "--master-port", str(two_free_ports())]
             for _ in (0, 1)]
    processes = start_nodes(torch_python, tmp_path, alone)
    results = finish(processes)
    for node, result in enumerate(results):
        assert result["code"] == 1 and "Traceback" not in result["err"], result["err"]
        assert len(error_lines(result)) == 1, result["err"]
        assert not (tmp_path / f"node{node}.json").exists()
    node0, node1 = (error_lines(result)[0] for result in results)
    assert node0.startswith("tune-nccl: error: step 1 (default): the 2 nodes did not all meet at torch's rendezvous "
                            "127.0.0.1:") and "within --join-timeout 10 s: DistStoreError: " in node0
    assert node0.endswith("(start tune-nccl with the same arguments and --node-rank 1 on the other node(s)); "
                          "nothing written")
    assert "within --join-timeout 10 s: DistNetworkError: " in node1
    assert node1.endswith("(is tune-nccl --node-rank 0 running there, with the same arguments?); nothing written")


def test_nodes_started_with_other_arguments_stop_at_the_first_step(torch_python, tmp_path):
    port = str(two_free_ports())
    common = ["--backend", "gloo", "--nnodes", "2", "--master-addr", "127.0.0.1", "--prefill-tokens", "none",
              "--hidden", "64", "--layers", "2", "--profiles", "default", "--join-timeout", "120",
              "--master-port", port]
    results = finish(start_nodes(torch_python, tmp_path, [[*common, "--tokens", "1,2"], [*common, "--tokens", "1,4"]]))
    said = []
    for node, result in enumerate(results):
        assert result["code"] == 1 and "Traceback" not in result["err"], result["err"]
        assert len(error_lines(result)) == 1 and not (tmp_path / f"node{node}.json").exists(), result["err"]
        said.append(error_lines(result)[0])
    assert said[0] == ("tune-nccl: error: step 1 (default): node 1 (rank 1) runs something else at step 1: tokens "
                       "[1, 4] (here [1, 2]); start every node with the same arguments; nothing written")
    assert "node 0 (rank 0) runs something else at step 1: tokens [1, 2] (here [1, 4])" in said[1]


def test_a_real_run_across_nodes_needs_torch_for_its_launcher(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    monkeypatch.setattr(tune_nccl, "WORKER_COMMAND", ["fake-worker"])  # even with another worker: torchrun is torch
    assert tune(["--backend", "gloo", "--out", str(tmp_path / "t.json"), *ACROSS]) == 1
    assert "needs torch, which is not installed for" in capsys.readouterr().err
