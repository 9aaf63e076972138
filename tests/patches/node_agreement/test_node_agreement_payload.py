"""node-agreement's comparison: what is compared (the environment, NCCL's config files, the exclusions), the one
line per differing setting, when it runs; then the real thing on CPU: ranks in child processes joined in a gloo
world through torch's TCP store (tests/support/scripts/agreement_rank.py), each "node" with its own settings."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from sglang_pcie.patches.node_agreement import payload as agreement
from sglang_pcie.patches.node_agreement import record as agreement_record
from sglang_pcie.patches.node_agreement import verdict as agreement_verdict
from sglang_pcie.patches.node_agreement.record import CONF_PROBLEM, Record
from sglang_pcie.runtime.bounded_read import MAX_BYTES
from sglang_pcie.runtime.results import is_patched
from sglang_pcie.tools.processes import free_port

from support import SUPPORT

SCRIPT = SUPPORT / "scripts" / "agreement_rank.py"
HOST = socket.gethostname()
P = agreement.PREFIX


# -- what one rank compares

def test_every_nccl_variable_is_compared_except_outputs_logging_and_the_config_files_path():
    env = {"NCCL_PROTO": "LL", "NCCL_IB_DISABLE": "1", "NCCL_SOME_FUTURE_SWITCH": "x", "NCCL_SOCKET_IFNAME": "eth0",
           "NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT", "NCCL_TOPO_DUMP_FILE": "/t.xml",
           "NCCL_CONF_FILE": "/c", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1", "SGLANG_PCIE_IPC_MAX_NUMEL": "57344",
           "SGLANG_PCIE_NCCL_DECIDED": "tuned", "SGLANG_PCIE_TUNED_FILE": "/home/a/t.json", "PATH": "/bin"}
    assert agreement_record.effective_values(env) == {
        "NCCL_PROTO": ("LL", None), "NCCL_IB_DISABLE": ("1", None), "NCCL_SOME_FUTURE_SWITCH": ("x", None),
        "NCCL_SOCKET_IFNAME": ("eth0", None), "NCCL_IB_HCA": ("mlx5_0", None),  # compared within a node
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": ("1", None), "SGLANG_PCIE_IPC_MAX_NUMEL": ("57344", None),
        "SGLANG_PCIE_NCCL_DECIDED": ("tuned", None)}
    assert all(agreement_record.excluded(name) for name in agreement_record.EXCLUDED)
    assert not any(agreement_record.excluded(name) for name in agreement_record.PER_NODE)
    assert agreement_record.excluded("NCCL_DEBUG_FILE") and not agreement_record.excluded("NCCL_ALGO")


def test_nccl_config_files_are_read_as_nccl_reads_them(tmp_path):
    user, system = tmp_path / "user.conf", tmp_path / "nccl.conf"
    user.write_text("# NCCL_ALGO=Ring is a comment\nNCCL_ALGO=Tree\nNCCL_PROTO=Simple\nnot a setting\n"
                    "NCCL_SOCKET_IFNAME==ens1f0\nNCCL_NET_GDR_LEVEL==PHB\nOTHER=1\nNCCL_ALGO=Ring\n")
    system.write_text("NCCL_ALGO=CollnetDirect\nNCCL_BUFFSIZE=4194304\r\n")
    values = agreement_record.effective_values({"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": ""},
                                        [str(user), str(tmp_path / "absent"), str(system)])
    assert values == {"NCCL_PROTO": ("LL", None),  # the environment wins, as NCCL's setenv(..., 0) lets it
                      "NCCL_ALGO": ("Tree", str(user)),  # the first file and the first line win
                      "NCCL_SOCKET_IFNAME": ("=ens1f0", str(user)),  # everything after the first '='
                      "NCCL_NET_GDR_LEVEL": ("=PHB", str(user))}  # NCCL_BUFFSIZE: set empty, the default
    assert agreement_record.effective_values({}, [str(system)])["NCCL_BUFFSIZE"] == ("4194304\r", str(system))


def test_a_config_file_that_cannot_be_read_within_bounds_is_compared_as_such(tmp_path):
    big = tmp_path / "nccl.conf"
    big.write_text("NCCL_ALGO=Tree\n" + "#" * MAX_BYTES)
    values = agreement_record.effective_values({}, [str(big)])
    assert list(values) == [CONF_PROBLEM] and values[CONF_PROBLEM][0].startswith(f"{big} not read: ")


def test_the_config_files_nccl_looks_for(tmp_path):
    assert agreement_record.conf_files({"NCCL_CONF_FILE": "/x/my.conf"}) == ["/x/my.conf", "/etc/nccl.conf"]
    assert agreement_record.conf_files({}, home=str(tmp_path)) == [str(tmp_path / ".nccl.conf"), "/etc/nccl.conf"]


def test_node_rank_from_the_launch_else_from_the_rank():
    assert agreement_record.node_rank(9, 16, {}, ["--nnodes", "2", "--node-rank", "1"]) == 1
    assert agreement_record.node_rank(9, 16, {"SGLANG_PCIE_NNODES": "2"}, ["--model-path", "m"]) == 1  # 8 ranks a node
    assert agreement_record.node_rank(9, 16, {"SGLANG_PCIE_NNODES": "3"}, []) is None  # 16 ranks do not split in 3
    torchrun = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1"}
    assert agreement_record.node_rank(9, 16, torchrun, []) == 1


def test_the_check_runs_only_where_the_launch_spans_nodes():
    assert agreement.spans_nodes(16, {"SGLANG_PCIE_NNODES": "2"}, 8) == "SGLANG_PCIE_NNODES=2"
    assert agreement.spans_nodes(16, {}, 8) == "a world of 16 ranks and 8 GPU(s) on this node"
    assert agreement.spans_nodes(8, {"SGLANG_PCIE_NNODES": "1"}, 8) is None
    assert agreement.spans_nodes(8, {"SGLANG_PCIE_NNODES": "two"}, None) is None
    assert agreement.local_gpu_count({"SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS": "1"}) is None


def test_records_travel_as_bounded_json():
    record = Record(3, "box-b", 1, {"NCCL_PROTO": ("LL", None), "NCCL_ALGO": ("x" * 1000, "/etc/nccl.conf")})
    back = Record.from_json(record.to_json())
    assert back == Record(3, "box-b", 1, {"NCCL_PROTO": ("LL", None),  # the text cut, the whole value's digest
                                          "NCCL_ALGO": ("x" * agreement_record.MAX_VALUE_CHARS, "/etc/nccl.conf", 1000,
                                                        agreement_record.digest("x" * 1000))})
    assert back.values["NCCL_ALGO"][3] == record.values["NCCL_ALGO"][3] and back.cut == 0
    many = Record(0, "h", None, {f"NCCL_V{i:03}": ("1", None) for i in range(600)})
    sent = Record.from_json(many.to_json())
    assert len(sent.values) == agreement_record.MAX_VALUES and sent.cut == 600 - agreement_record.MAX_VALUES
    assert max(sent.values) == f"NCCL_V{agreement_record.MAX_VALUES - 1:03}"  # the first ones by name
    for bad in (b"[]", b'{"rank": "0", "host": "h", "node": null, "values": {}}',
                b'{"rank": 0, "host": "h", "node": null, "values": {"A": ["1"]}, "cut": 0}',
                b'{"rank": 0, "host": "h", "node": null, "values": {"A": ["1", null]}, "cut": 0}',
                b'{"rank": 0, "host": "h", "node": null, "values": {}}', b"\xff",
                b" " * (agreement_record.MAX_RECORD_BYTES + 1)):
        with pytest.raises(ValueError):
            Record.from_json(bad)


# -- the lines

def records(*specs) -> list[Record]:
    """(rank, node, values) -> records on host box-<node>."""
    return [Record(rank, f"box-{node}", node, values) for rank, node, values in specs]


def test_one_line_per_differing_setting_naming_each_node_and_its_value():
    found = agreement_verdict.differences(records(
        (0, 0, {"NCCL_PROTO": ("LL", None), "NCCL_ALGO": ("Ring", None)}),
        (1, 0, {"NCCL_PROTO": ("LL", None), "NCCL_ALGO": ("Ring", "/etc/nccl.conf")}),  # same value: agrees
        (2, 1, {"NCCL_ALGO": ("Ring", None), "NCCL_BUFFSIZE": ("4194304", "/etc/nccl.conf")}),
        (3, 1, {"NCCL_ALGO": ("Ring", None), "NCCL_BUFFSIZE": ("4194304", "/etc/nccl.conf")})))
    assert found == {
        "NCCL_BUFFSIZE": f"{P}: NCCL_BUFFSIZE differs between nodes: node 0 (box-0, ranks 0-1) unset; "
                         "node 1 (box-1, ranks 2-3) '4194304' from /etc/nccl.conf",
        "NCCL_PROTO": f"{P}: NCCL_PROTO differs between nodes: node 0 (box-0, ranks 0-1) 'LL'; "
                      "node 1 (box-1, ranks 2-3) unset"}


def test_host_specific_settings_may_differ_between_nodes_not_within_one():
    hca = "NCCL_IB_HCA"
    found = agreement_verdict.differences(records(
        (0, 0, {hca: ("mlx5_0", None)}), (1, 0, {hca: ("mlx5_0", None)}),
        (2, 1, {hca: ("mlx5_2", None)}), (3, 1, {hca: ("mlx5_3", None)}),
        (4, 2, {hca: ("mlx5_4", None)})))
    assert found == {hca: f"{P}: NCCL_IB_HCA differs within a node (it may differ between nodes, not between the "
                          "ranks of one): node 1 (box-1, rank 2) 'mlx5_2'; node 1 (box-1, rank 3) 'mlx5_3'"}
    per_node = records((0, 0, {hca: ("mlx5_0", None)}), (1, 1, {hca: ("mlx5_1", None)}))
    assert agreement_verdict.differences(per_node) == {}


def test_ranks_of_one_node_that_differ_are_named_apart_and_long_values_cut():
    long = "x" * 100
    found = agreement_verdict.differences(records((0, 0, {"NCCL_X": (long, None)}), (1, 0, {}), (2, 1, {}),
                                          (5, 1, {}), (4, 1, {"NCCL_X": (long, None)})))
    cut = f"'{'x' * 80}...' (100 chars, sha256 {agreement_record.digest(long)[:12]})"
    assert found["NCCL_X"] == (f"{P}: NCCL_X differs between nodes: node 0 (box-0, rank 0) {cut}; "
                               "node 0 (box-0, rank 1) unset; node 1 (box-1, ranks 2, 5) unset; "
                               f"node 1 (box-1, rank 4) {cut}")
    assert agreement_verdict.ranks_text([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"
    assert agreement_verdict.node_label(Record(2, "h", None, {}), [2, 3]) == "h (ranks 2-3)"


def test_the_verdict_adds_what_it_means_and_the_first_rank_of_each_node_speaks():
    ranks = records((0, 0, {"NCCL_PROTO": ("LL", None)}), (1, 0, {"NCCL_PROTO": ("LL", None)}), (2, 1, {}))
    verdict = agreement_verdict.verdict(ranks[1], ranks, [3], {4: "not JSON"}, strict=False, wait_s=60)
    assert verdict.lines == [
        f"{P}: NCCL_PROTO differs between nodes: node 0 (box-0, ranks 0-1) 'LL'; node 1 (box-1, rank 2) unset",
        f"{P}: rank 3 sent no settings within 60 s (sglang-pcie not active there, node-agreement switched off, or "
        "an older sglang-pcie): their NCCL settings are unknown",
        f"{P}: rank 4 sent an unreadable record (not JSON)",
        f"{P}: 1 setting(s) differ between the 2 node(s) that sent theirs and the settings of ranks 3-4 could not be "
        "compared; NCCL ranks that disagree on protocol, algorithm or transport can hang at some message sizes: set "
        "the same values on every node (SGLANG_PCIE_STRICT=1 stops the start instead)"]
    assert (verdict.differing, verdict.unknown, verdict.nodes, verdict.speaks) == (["NCCL_PROTO"], [3, 4], 2, False)
    assert agreement_verdict.verdict(ranks[2], ranks, [], {}, strict=True, wait_s=60).lines[-1].endswith(
        "at some message sizes: the start stops (SGLANG_PCIE_STRICT=1)")
    agreeing = records((0, 0, {"NCCL_PROTO": ("LL", None)}), (1, 1, {"NCCL_PROTO": ("LL", "/etc/nccl.conf")}))
    assert agreement_verdict.verdict(agreeing[0], agreeing, [], {}, strict=True, wait_s=60).lines == []


# -- the wrappers

def test_wrap_marks_and_agreeing_follows_the_registers_gate(monkeypatch):
    def init_distributed_environment(world_size=-1, rank=-1):
        return "done"

    wrapped = agreement.agreeing(init_distributed_environment)
    assert is_patched(wrapped, agreement.PATCH_ID) and wrapped.__wrapped__ is init_distributed_environment
    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", agreement.PATCH_ID)
    monkeypatch.setattr("sglang_pcie.runtime.settings._PROCESS_SETTINGS", None)
    assert agreement.agreeing(init_distributed_environment) is init_distributed_environment


# -- the real comparison: ranks in child processes, a gloo world, torch's TCP store

@pytest.fixture(scope="module")
def torch_python(sglang_env):
    return sglang_env("0.5.9")  # torch, and this checkout's wheel


def run_world(env_of, ranks: list[dict], tmp_path: Path, timeout: float = 240) -> list[dict]:
    """Start every rank (``{"env": {...}, "args": [...]}``), wait for all; each rank's exit code, stdout JSON (or
    None) and stderr."""
    port = free_port()
    procs = []
    for rank, spec in enumerate(ranks):
        command = [str(env_of.python), str(SCRIPT), "--rank", str(rank), "--world", str(len(ranks)),
                   "--port", str(port), *spec.get("args", [])]
        procs.append(subprocess.Popen(command, env=env_of.env(spec.get("env")), cwd=env_of.workdir, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            lines = [line for line in out.splitlines() if line.startswith("{")]  # gloo says hello on stdout
            results.append({"rc": proc.returncode, "json": json.loads(lines[-1]) if lines else None, "err": err})
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return results


def node(n: int, nodes: int = 2, **env) -> dict:
    return {"env": {"SGLANG_PCIE_NNODES": str(nodes), **env}, "args": ["--nnodes", str(nodes), "--node-rank", str(n)]}


def said(result: dict) -> list[str]:
    return [line for line in result["err"].splitlines() if line.startswith(P)]


TUNED_LL = {"NCCL_PROTO": "LL", "SGLANG_PCIE_NCCL_DECIDED": "tuned"}
UNTUNED = {"SGLANG_PCIE_NCCL_DECIDED": "none"}


def expected_two_node_lines(strict: bool) -> list[str]:
    ending = ("the start stops (SGLANG_PCIE_STRICT=1)" if strict else
              "set the same values on every node (SGLANG_PCIE_STRICT=1 stops the start instead)")
    return [f"{P}: NCCL_PROTO differs between nodes: node 0 ({HOST}, rank 0) 'LL'; node 1 ({HOST}, rank 1) unset",
            f"{P}: SGLANG_PCIE_NCCL_DECIDED differs between nodes: node 0 ({HOST}, rank 0) 'tuned'; "
            f"node 1 ({HOST}, rank 1) 'none'",
            f"{P}: 2 setting(s) differ between the 2 node(s) of this server; NCCL ranks that disagree on protocol, "
            f"algorithm or transport can hang at some message sizes: {ending}"]


def test_two_nodes_that_disagree_are_named_and_the_start_goes_on(torch_python, tmp_path):
    results = run_world(torch_python, [node(0, **TUNED_LL), node(1, **UNTUNED)], tmp_path)
    for result in results:  # each node's first rank says it, once
        assert result["rc"] == 0 and result["json"]["started"], result["err"]
        assert said(result) == expected_two_node_lines(strict=False)
        assert result["json"]["verdict"]["differing"] == ["NCCL_PROTO", "SGLANG_PCIE_NCCL_DECIDED"]


def test_with_strict_the_start_of_every_rank_stops(torch_python, tmp_path):
    strict = {"SGLANG_PCIE_STRICT": "1"}
    results = run_world(torch_python, [node(0, **TUNED_LL, **strict), node(1, **UNTUNED, **strict)], tmp_path)
    for result in results:
        assert result["rc"] == 1 and result["json"] is None, result["err"]
        assert said(result) == expected_two_node_lines(strict=True)
        assert ("StrictModeError: sglang-pcie: SGLANG_PCIE_STRICT=1 and the nodes of this server disagree: "
                "NCCL_PROTO, SGLANG_PCIE_NCCL_DECIDED (the node-agreement lines name each node's value)"
                ) in result["err"]


@pytest.mark.parametrize("strict", [False, True], ids=["warn", "strict"])
def test_three_ranks_on_two_nodes_a_setting_from_a_config_file(torch_python, tmp_path, strict):
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_ALGO=Tree\n")
    flag = {"SGLANG_PCIE_STRICT": "1"} if strict else {}
    eth0, ens1 = {"NCCL_SOCKET_IFNAME": "eth0"}, {"NCCL_SOCKET_IFNAME": "ens1"}  # per host: not a difference
    results = run_world(torch_python, [node(0, **UNTUNED, **eth0, **flag), node(0, **UNTUNED, **eth0, **flag),
                                       node(1, **UNTUNED, **ens1, NCCL_CONF_FILE=str(conf), **flag)], tmp_path)
    line = (f"{P}: NCCL_ALGO differs between nodes: node 0 ({HOST}, ranks 0-1) unset; "
            f"node 1 ({HOST}, rank 2) 'Tree' from {conf}")
    for rank, result in enumerate(results):
        assert result["rc"] == (1 if strict else 0), result["err"]
        assert said(result)[:1] == ([] if rank == 1 else [line])  # rank 1 is not its node's first
        assert len(said(result)) == (0 if rank == 1 else 2)  # the line and what it means
        if not strict:
            assert result["json"]["verdict"]["nodes"] == 2 and result["json"]["verdict"]["differing"] == ["NCCL_ALGO"]


def test_agreeing_nodes_say_nothing(torch_python, tmp_path):
    same = {"NCCL_PROTO": "LL", "SGLANG_PCIE_NCCL_DECIDED": "pcie"}
    results = run_world(torch_python, [node(0, **same), node(1, **same)], tmp_path)
    for result in results:
        assert result["rc"] == 0 and said(result) == [] and P not in result["err"], result["err"]
        assert result["json"]["verdict"]["lines"] == [] and result["json"]["verdict"]["nodes"] == 2
        assert result["json"]["keys_written"] == [0, 1]  # compared, silently


def test_a_single_node_server_gathers_nothing(torch_python, tmp_path):
    # One node: every rank inherits one environment; even a rank whose settings differ is not looked at.
    results = run_world(torch_python, [{"env": TUNED_LL}, {"env": UNTUNED}], tmp_path)
    for result in results:
        assert result["rc"] == 0 and P not in result["err"], result["err"]
        assert result["json"]["verdict"] is None and result["json"]["keys_written"] == []


@pytest.mark.parametrize("absent", [0, 1], ids=["store-host-absent", "second-node-absent"])
def test_a_node_without_the_check_is_named_after_a_bounded_wait(torch_python, tmp_path, absent):
    ranks = [node(0, **UNTUNED), node(1, **UNTUNED)]
    ranks[absent]["args"] += ["--absent", "--linger", "8"]
    ranks[1 - absent]["args"] += ["--wait", "2"]
    results = run_world(torch_python, ranks, tmp_path)
    present = results[1 - absent]
    assert all(r["rc"] == 0 for r in results), [r["err"] for r in results]
    assert said(present)[0] == (f"{P}: rank {absent} sent no settings within 2 s (sglang-pcie not active there, "
                                "node-agreement switched off, or an older sglang-pcie): their NCCL settings are "
                                "unknown")
    assert present["json"]["verdict"]["unknown"] == [absent] and said(results[absent]) == []


# -- bounds: equal settings compare equal whatever their size; what a record could not hold is said

class DictStore:
    """The few calls of torch's store that the exchange makes, on a dict that already holds every other rank's
    record (written by ``agree`` runs before): ``wait`` returns at once, as it does when every key is there."""

    def __init__(self):
        self.data = {}

    def set(self, key, value):
        self.data[key] = value if isinstance(value, bytes) else value.encode()

    def wait(self, keys, timeout):
        if not all(k in self.data for k in keys):
            raise RuntimeError("timeout")

    def check(self, keys):
        return all(k in self.data for k in keys)

    def multi_get(self, keys):
        return [self.data[k] for k in keys]


def agree_all(monkeypatch, tmp_path, envs: list[dict], nodes: list[int], strict: bool = False):
    """Every rank's ``agree`` on one store, each rank with its own environment (no config file read) and node;
    every record is written before any rank compares. [(verdict or the StrictModeError, the lines it logged)]."""
    monkeypatch.setattr(agreement_record.sys, "argv", ["sglang"])
    monkeypatch.setattr(agreement_record, "versions", lambda: {})
    store = DictStore()
    full = [dict(env, NCCL_CONF_FILE=str(tmp_path / "absent.conf"), SGLANG_PCIE_NNODES=str(max(nodes) + 1))
            for env in envs]
    hosts = [f"box-{n}" for n in nodes]
    for rank, env in enumerate(full):
        record = agreement_record.own_record(rank, len(envs), env)
        store.set(f"{agreement.KEY}{rank}", Record(rank, hosts[rank], nodes[rank], record.values).to_json())
    results = []
    for rank, env in enumerate(full):
        logged = []
        monkeypatch.setattr(agreement_record.socket, "gethostname", lambda rank=rank: hosts[rank])
        monkeypatch.setattr(agreement_record, "node_rank", lambda r, w, e, argv=None: nodes[r])
        monkeypatch.setattr(agreement.logger, "error", lambda line, *a: logged.append(("error", line)))
        monkeypatch.setattr(agreement.logger, "warning", lambda line, *a: logged.append(("warning", line)))
        try:
            results.append((agreement.agree(store, rank, len(envs), env, strict, wait_s=0), logged))
        except agreement.StrictModeError as exc:
            results.append((exc, logged))
    return results


@pytest.mark.parametrize("strict", [False, True], ids=["warn", "strict"])
def test_equal_long_values_agree_between_nodes_and_strict_does_not_stop(monkeypatch, tmp_path, strict):
    plugin = "/opt/" + "p" * 294 + "/libnccl-net.so"  # 314 characters, longer than a record's bound
    assert len(plugin) == 314 > agreement_record.MAX_VALUE_CHARS
    results = agree_all(monkeypatch, tmp_path, [{"NCCL_NET_PLUGIN": plugin}] * 2, [0, 1], strict)
    for result, logged in results:
        assert not isinstance(result, Exception) and result.lines == [] and logged == [], logged


def test_equal_long_per_host_values_agree_within_a_node(monkeypatch, tmp_path):
    topo = "/etc/" + "t" * 286 + "/topo.xml"  # 300 characters
    assert len(topo) == 300
    envs = [{"NCCL_TOPO_FILE": topo}] * 2 + [{"NCCL_TOPO_FILE": "/other.xml"}] * 2  # per host: node 1 may differ
    for result, logged in agree_all(monkeypatch, tmp_path, envs, [0, 0, 1, 1]):
        assert result.lines == [] and logged == []


def test_long_values_that_differ_only_past_the_bound_are_told_apart(monkeypatch, tmp_path):
    common = "/opt/" + "p" * 400
    results = agree_all(monkeypatch, tmp_path, [{"NCCL_NET_PLUGIN": common + "a.so"},
                                                {"NCCL_NET_PLUGIN": common + "b.so"}], [0, 1], strict=True)
    for result, logged in results:
        assert isinstance(result, agreement.StrictModeError) and "NCCL_NET_PLUGIN" in str(result)
    line = [line for kind, line in results[0][1] if "NCCL_NET_PLUGIN" in line][0]
    a, b = (agreement_record.digest(common + end) for end in ("a.so", "b.so"))
    assert line == (f"{P}: NCCL_NET_PLUGIN differs between nodes: node 0 (box-0, rank 0) '{common[:80]}...' "
                    f"(409 chars, sha256 {a[:12]}); node 1 (box-1, rank 1) '{common[:80]}...' (409 chars, "
                    f"sha256 {b[:12]})")
    assert results[1][1] == results[0][1]  # both nodes say the same


def test_three_hundred_equal_variables_agree_and_both_nodes_say_the_same(monkeypatch, tmp_path):
    many = {f"NCCL_V{i:03}": "x" * 300 for i in range(300)}
    for result, logged in agree_all(monkeypatch, tmp_path, [many, many], [0, 1], strict=True):
        assert not isinstance(result, Exception) and result.lines == [] and logged == []
    other = dict(many, NCCL_V150="y")
    results = agree_all(monkeypatch, tmp_path, [many, other], [0, 1])
    assert [len(logged) for _, logged in results] == [2, 2] and results[0][1] == results[1][1]
    assert results[0][0].differing == ["NCCL_V150"]


def test_what_a_record_cannot_hold_is_said_not_reported_as_a_difference(monkeypatch, tmp_path):
    monkeypatch.setattr(agreement_record, "MAX_VALUES", 10)
    many = {f"NCCL_V{i:02}": str(i) for i in range(25)}
    results = agree_all(monkeypatch, tmp_path, [many, dict(many, NCCL_A0="extra")], [0, 1], strict=True)
    for result, logged in results:
        assert isinstance(result, agreement.StrictModeError) and "NCCL_A0" in str(result)
    # node 1's first ten values end one name earlier (NCCL_A0 is first): past node 1's last sent name, nothing
    # is compared, and that is said once, as a warning.
    assert [kind for kind, _ in results[0][1]] == ["error", "error", "warning"]
    assert results[0][1][2][1] == (
        f"{P}: ranks 0-1 sent only their first 10 settings (by name) of 25-26 (a record holds at most "
        f"{10} values and {agreement_record.MAX_RECORD_BYTES} bytes): settings after NCCL_V08 were not compared")
    same = agree_all(monkeypatch, tmp_path, [many, many], [0, 1], strict=True)
    for result, logged in same:
        assert result.lines == [] and result.notes and [kind for kind, _ in logged] == ["warning"]


def test_a_record_holds_its_bounds_whatever_the_values(monkeypatch):
    wide = "\u2603" * 1000  # 6 bytes a character in JSON
    record = Record(0, wide, 0, {f"NCCL_{wide}{i}": (wide, wide) for i in range(400)})
    raw = record.to_json()
    assert len(raw) <= agreement_record.MAX_RECORD_BYTES
    back = Record.from_json(raw)
    assert back.cut and len(back.values) + back.cut == 400 and back == Record.from_json(back.to_json())


def test_equal_long_settings_on_two_real_nodes_start_under_strict(torch_python, tmp_path):
    same = {"NCCL_NET_PLUGIN": "/opt/" + "p" * 294 + "/libnccl-net.so", "SGLANG_PCIE_NCCL_DECIDED": "none",
            "SGLANG_PCIE_STRICT": "1", **{f"NCCL_V{i:03}": "v" * 300 for i in range(300)}}
    results = run_world(torch_python, [node(0, **same), node(1, **same)], tmp_path)
    for result in results:
        assert result["rc"] == 0 and P not in result["err"], result["err"][-2000:]
        assert result["json"]["verdict"]["lines"] == [] and result["json"]["verdict"]["nodes"] == 2


def test_strict_mode_stops_where_a_rank_sent_nothing_and_says_whose_settings_are_unknown(monkeypatch, tmp_path):
    monkeypatch.setattr(agreement_record.sys, "argv", ["sglang"])
    monkeypatch.setattr(agreement_record, "versions", lambda: {})
    env = {"NCCL_CONF_FILE": str(tmp_path / "absent.conf"), "SGLANG_PCIE_NNODES": "2"}
    logged = []
    monkeypatch.setattr(agreement.logger, "error", lambda line, *a: logged.append(line))
    with pytest.raises(agreement.StrictModeError) as raised:
        agreement.agree(DictStore(), 0, 2, env, strict=True, wait_s=0)
    assert str(raised.value) == ("sglang-pcie: SGLANG_PCIE_STRICT=1 and the nodes of this server disagree: the "
                                 "settings of rank 1 unknown (the node-agreement lines name each node's value)")
    assert logged[0].startswith(f"{P}: rank 1 sent no settings within 0 s") and logged[-1].endswith(
        "the start stops (SGLANG_PCIE_STRICT=1)")
    assert "the settings of rank 1 could not be compared" in logged[-1]
    logged.clear()
    result = agreement.agree(DictStore(), 0, 2, env, strict=False, wait_s=0)  # without strict: said, and on
    assert result.unknown == [1] and result.differing == [] and len(logged) == 2


# -- the pieces, at their edges (issue #34 item 10)

def test_a_record_speaks_for_every_name_unless_cut_then_up_to_its_last():
    whole = Record(0, "h", None, {"B": ("1", None)})
    assert whole.holds("A") and whole.holds("Z")
    cut = Record(0, "h", None, {"A": ("1", None), "B": ("1", None)}, cut=3)
    assert cut.last == "B" and cut.holds("A") and cut.holds("B") and not cut.holds("C")
    empty = Record(0, "h", None, {}, cut=5)
    assert empty.last is None and not empty.holds("A")


def test_the_names_compared_stop_at_the_shortest_cut_record_inclusive():
    full = Record(0, "a", 0, {n: ("1", None) for n in "ABCD"})
    cut = Record(1, "b", 1, {n: ("1", None) for n in "AB"}, cut=2)
    assert agreement_verdict.compared([full, cut]) == ["A", "B"]
    assert agreement_verdict.compared([full, Record(1, "b", 1, {}, cut=4)]) == []
    assert agreement_verdict.compared([full]) == ["A", "B", "C", "D"]


def test_the_node_rank_edges(monkeypatch):
    assert agreement_record.node_rank(5, 8, {"SGLANG_PCIE_NNODES": "1"}, []) == 0  # one node: every rank is node 0
    assert agreement_record.node_rank(5, 8, {"SGLANG_PCIE_NNODES": "0"}, []) is None
    monkeypatch.setattr(agreement_record.sys, "argv", ["--node-rank=3", "--nnodes=2"])  # argv[0] is the program
    assert agreement_record.node_rank(5, 8, {}) is None
    monkeypatch.setattr(agreement_record.sys, "argv", ["sglang", "--nnodes=2", "--node-rank=3"])
    assert agreement_record.node_rank(5, 8, {}) == 3


def test_a_record_without_a_node_rank_is_placed_by_its_host_before_node_zero():
    nameless, zero = Record(1, "b", None, {}), Record(0, "a", 0, {})
    assert agreement_verdict.node_of(nameless) == (-1, "b")
    assert sorted([zero, nameless], key=agreement_verdict.node_of) == [nameless, zero]


def test_a_value_of_exactly_the_shown_length_is_shown_whole():
    text = "x" * agreement_verdict.SHOWN_CHARS
    assert agreement_verdict.shown((text, None, len(text), agreement_record.digest(text))) == repr(text)
    longer = text + "y"
    shown = agreement_verdict.shown((longer, "/f", len(longer), agreement_record.digest(longer)))
    assert shown.startswith(f"'{text}...' (")


def test_the_same_value_from_two_files_is_shown_apart():
    """Values are compared whole; the file each came from is shown: two ranks with the same value from different
    files are two parts of the line (no difference by themselves)."""
    recs = [Record(0, "a", 0, {"NCCL_PROTO": ("LL", "/etc/nccl.conf")}),
            Record(1, "a", 0, {"NCCL_PROTO": ("LL", "/home/u/.nccl.conf")}),
            Record(2, "b", 1, {"NCCL_PROTO": ("Simple", None)})]
    line = agreement_verdict.differences(recs)["NCCL_PROTO"]
    assert line.count("'LL' from") == 2 and "'Simple'" in line
    assert agreement_verdict.differences(recs[:2]) == {}


def test_the_cut_line_counts_one_total_or_a_range():
    same = [Record(r, "h", 0, {"A": ("1", None)}, cut=9) for r in (0, 1)]
    assert agreement_verdict.cut_line(same).startswith(f"{agreement.PREFIX}: ranks 0-1 sent only their first 1 "
                                                       "settings (by name) of 10 (a record holds")
    assert agreement_verdict.cut_line(same).endswith(": settings after A were not compared")
    apart = [same[0], Record(1, "h", 0, {"A": ("1", None), "B": ("1", None)}, cut=20)]
    assert "sent only their first 1-2 settings (by name) of 10-22" in agreement_verdict.cut_line(apart)
    assert agreement_verdict.cut_line([Record(0, "h", 0, {"A": ("1", None)})]) is None


def test_a_record_of_exactly_the_bound_is_read_and_a_source_must_be_text():
    raw = Record(0, "h", None, {"A": ("1", None)}).to_json()
    assert raw.startswith(b'{"cut": 0, "host": "h"')  # keys in order: the same record, the same bytes
    padded = raw + b" " * (agreement_record.MAX_RECORD_BYTES - len(raw))
    assert Record.from_json(padded).values["A"][0] == "1"
    with pytest.raises(ValueError):
        Record.from_json(b'{"rank": 0, "host": "h", "node": null, "values": {"A": ["1", 5, 1, "d"]}, "cut": 0}')


class FakeDist:
    def __init__(self, initialized=True, world=2, rank=0, store=True):
        self.initialized, self.world, self.rank = initialized, world, rank
        self.distributed_c10d = type("C10d", (), {"_get_default_store": staticmethod(lambda: "store")})() \
            if store else type("C10d", (), {})()

    def is_initialized(self):
        return self.initialized

    def get_world_size(self):
        return self.world

    def get_rank(self):
        return self.rank


@pytest.fixture
def fake_torch(monkeypatch):
    """A torch.distributed that says what a test wants; check_once not yet run in this process."""
    import sys
    import types

    dist = FakeDist()
    torch = types.ModuleType("torch")
    torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setitem(sys.modules, "torch.distributed.distributed_c10d", dist.distributed_c10d)
    monkeypatch.setattr(agreement, "_checked", False)
    monkeypatch.setattr(agreement, "local_gpu_count", lambda env: 8)
    monkeypatch.setattr("sglang_pcie.runtime.settings._PROCESS_SETTINGS", None)
    calls = []
    monkeypatch.setattr(agreement, "agree", lambda store, rank, world, env, strict: calls.append(
        (store, rank, world, strict)) or "verdict")
    return dist, calls


@pytest.mark.parametrize("initialized, world, env, runs", [
    (False, 16, {"SGLANG_PCIE_NNODES": "2"}, False),
    (True, 1, {"SGLANG_PCIE_NNODES": "2"}, False),  # one rank: nothing to compare
    (True, 2, {"SGLANG_PCIE_NNODES": "2"}, True),  # two ranks on two nodes
    (True, 8, {}, False),  # eight ranks, eight GPUs here: one node
    (True, 16, {}, True),  # sixteen ranks, eight GPUs here
])
def test_check_once_runs_where_the_world_spans_nodes_and_only_once(fake_torch, monkeypatch, initialized, world,
                                                                   env, runs):
    dist, calls = fake_torch
    dist.initialized, dist.world, dist.rank = initialized, world, 1
    monkeypatch.delenv("SGLANG_PCIE_STRICT", raising=False)
    assert agreement.check_once(env) == ("verdict" if runs else None)
    assert calls == ([("store", 1, world, False)] if runs else [])
    assert agreement.check_once(env) is None and len(calls) == (1 if runs else 0)  # once per process


def test_check_once_reads_the_process_environment_by_default(fake_torch, monkeypatch):
    dist, calls = fake_torch
    monkeypatch.setenv("SGLANG_PCIE_NNODES", "2")
    assert agreement.check_once() == "verdict" and len(calls) == 1


@pytest.mark.parametrize("strict", [False, True])
def test_a_comparison_that_fails_is_one_warning_or_with_strict_a_stop(fake_torch, monkeypatch, strict):
    from sglang_pcie.runtime.results import StrictModeError

    def broken(store, rank, world, env, strict):
        raise OSError("store gone")

    monkeypatch.setattr(agreement, "agree", broken)
    monkeypatch.setenv("SGLANG_PCIE_STRICT", "1" if strict else "0")
    warned = []
    monkeypatch.setattr(agreement.logger, "warning", lambda line, *a: warned.append(line))
    line = f"{agreement.PREFIX}: NCCL settings of the nodes not compared: OSError: store gone"
    if strict:
        with pytest.raises(StrictModeError, match="SGLANG_PCIE_STRICT=1 and"):
            agreement.check_once({"SGLANG_PCIE_NNODES": "2"})
        assert warned == []
    else:
        assert agreement.check_once({"SGLANG_PCIE_NNODES": "2"}) is None and warned == [line]


def test_the_runtime_problem_names_a_torch_without_the_default_store(fake_torch, monkeypatch):
    import sys

    assert agreement.runtime_problem() is None
    bare = FakeDist(store=False)
    monkeypatch.setattr(sys.modules["torch.distributed"], "distributed_c10d", bare.distributed_c10d)
    assert agreement.runtime_problem() == ("torch.distributed has no _get_default_store (the store the nodes' "
                                           "settings travel through)")


def test_an_elastic_joiner_does_not_compare(monkeypatch):
    ran = []
    monkeypatch.setattr(agreement, "check_once", lambda settings: ran.append(1))
    init = agreement.wrap(lambda *a, **k: "done")
    assert init(recovered_rank=True) == "done" and ran == []
    assert init() == "done" and init(recovered_rank=False) == "done" and ran == [1, 1]


def test_nccls_user_file_is_in_the_home_nccl_finds():
    assert agreement_record.conf_files({}, home="/home/u") == ["/home/u/.nccl.conf", "/etc/nccl.conf"]
    import pwd

    assert agreement_record.conf_files({}) == [os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".nccl.conf"),
                                        "/etc/nccl.conf"]
    assert agreement_record.conf_files({"NCCL_CONF_FILE": "/x.conf"}, home="/home/u") == ["/x.conf", "/etc/nccl.conf"]


def test_a_valid_record_over_the_byte_bound_is_refused():
    raw = Record(0, "h", None, {"A": ("1", None)}).to_json()
    with pytest.raises(ValueError, match="bytes"):
        Record.from_json(raw + b" " * (agreement_record.MAX_RECORD_BYTES + 1 - len(raw)))


def test_the_versions_compared_are_each_under_its_own_name(monkeypatch):
    import sys
    import types

    nccl = types.ModuleType("torch.cuda.nccl")
    nccl.version = lambda: (2, 27, 5)
    cuda = types.ModuleType("torch.cuda")
    cuda.nccl = nccl
    torch = types.ModuleType("torch")
    torch.cuda = cuda
    for name, module in (("torch", torch), ("torch.cuda", cuda), ("torch.cuda.nccl", nccl),
                         ("sglang", types.SimpleNamespace(__version__="0.5.23"))):
        monkeypatch.setitem(sys.modules, name, module)
    import sglang_pcie

    found = agreement_record.versions()
    assert found == {agreement_record.VERSIONS[0]: (sglang_pcie.__version__, None),
                     agreement_record.VERSIONS[1]: ("0.5.23", None), agreement_record.VERSIONS[2]: ("2.27.5", None)}
    monkeypatch.setitem(sys.modules, "sglang", None)
    assert agreement_record.VERSIONS[1] not in agreement_record.versions()  # not read: not compared


def test_one_visible_device_per_process_does_not_count_the_nodes_gpus(monkeypatch):
    import sys
    import types

    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 8)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert agreement.local_gpu_count({}) == 8
    for flag in ("1", "true", "Yes", " on "):
        assert agreement.local_gpu_count({"SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS": flag}) is None
    assert agreement.local_gpu_count({"SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS": "0"}) == 8


def test_the_record_bounds_are_the_documented_ones():
    """docs/node-agreement.md: at most 512 values and 256 KiB a record; longer than 80 characters shown cut, with
    12 hex digits of the sha256; the digest sent is 128 bits (32 hex characters)."""
    many = Record(0, "h", None, {f"NCCL_V{i:03}": ("1", None) for i in range(600)})
    sent = Record.from_json(many.to_json())
    assert (len(sent.values), sent.cut) == (512, 88)
    assert "(a record holds at most 512 values and 262144 bytes)" in agreement_verdict.cut_line([sent])
    value = sent.values["NCCL_V000"]
    assert len(value[3]) == 32 and value[3] == agreement_record.digest("1")
    text = "v" * 81
    assert agreement_verdict.shown((text, None, 81, agreement_record.digest(text))) == (
        f"'{'v' * 80}...' (81 chars, sha256 {agreement_record.digest(text)[:12]})")
    assert Record.from_json(Record(0, "h", None, {"A": ("x" * 300, None)}).to_json()).values["A"][0] == "x" * 256


def test_a_fresh_process_has_not_compared_yet(monkeypatch):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("agreement_fresh", agreement.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "agreement_fresh", fresh)  # dataclasses look their module up there
    spec.loader.exec_module(fresh)
    assert fresh._checked is False


def test_the_wrapper_compares_under_the_settings_it_was_handed(fake_torch, monkeypatch):
    """The settings the patch was gated with (handed by the install or the baked guard), not a second read."""
    from sglang_pcie.runtime.results import StrictModeError
    from sglang_pcie.runtime.settings import load_settings

    dist, calls = fake_torch
    dist.initialized, dist.world, dist.rank = True, 2, 1
    monkeypatch.setenv("SGLANG_PCIE_NNODES", "2")
    monkeypatch.setenv("SGLANG_PCIE_STRICT", "0")  # the process's own settings say otherwise
    init = agreement.wrap(lambda *a, **k: "done", settings=load_settings({"SGLANG_PCIE_STRICT": "1"}))
    assert init() == "done" and calls == [("store", 1, 2, True)]
    monkeypatch.setattr(agreement, "_checked", False)
    monkeypatch.setattr(agreement, "agree", lambda *args: (_ for _ in ()).throw(OSError("store gone")))
    with pytest.raises(StrictModeError, match="SGLANG_PCIE_STRICT=1 and"):
        init()
