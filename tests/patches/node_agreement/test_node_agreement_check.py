"""The node-agreement patch: its hook against the pristine sources of every covered release (what runs before and
after it), the versioned diffs, the runtime install, and the real SGLang 0.5.9 / 0.5.23 with the overlay installed:
two ranks, one "node" on SGLANG_PCIE_NCCL_PROFILE=pcie and one on NCCL's defaults, started through SGLang's own
init_distributed_environment on gloo (tests/support/scripts/agreement_sglang_rank.py)."""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from support import REPO, SUPPORT
from support.releases import release_copy

from sglang_pcie.patching import baked
from sglang_pcie.patches.node_agreement import check as na
from sglang_pcie.patching.diffs import diff_for
from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DRIFTED, Drift, Result
from sglang_pcie.patches.node_agreement.check import PATCH
from sglang_pcie.patching.releases import COVERED_RELEASES
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patches.node_agreement import payload as agreement
from sglang_pcie.runtime.results import is_patched, mark
from sglang_pcie.tools.processes import free_port

STATE_FILE = "sglang/srt/distributed/parallel_state.py"
SCRIPT = SUPPORT / "scripts" / "agreement_sglang_rank.py"
# Where SGLang calls the hook, per release (read off the sources): each runs initialize_model_parallel next.
CALLERS = {"0.5.8": ("disaggregation/encode_server.py", "model_executor/model_runner.py"),
           "0.5.16": ("disaggregation/encode_server.py", "distributed/bootstrap.py"),
           "0.5.17": ("disaggregation/encode_server.py", "distributed/bootstrap.py", "weight_cache/daemon.py"),
           "0.5.19": ("disaggregation/encoder/server.py", "distributed/bootstrap.py", "weight_cache/daemon.py")}
# What the encoder server (0.5.21+) runs between the two: its own parallel context, no collective.
HARMLESS_BETWEEN = {"get_parallel", "divmod", "parallel.override_permanently"}
NIXL_CAVEAT = ("except that under some options it first runs torch.distributed.broadcast_object_list where not "
               "torch.distributed.is_initialized() and moe_a2a_backend == 'nixl' and not master_ip")


def released_before(version: str, other: str) -> bool:
    return COVERED_RELEASES.index(version) < COVERED_RELEASES.index(other)


def callers_of(version: str) -> tuple[str, ...]:
    return next(files for first, files in reversed(CALLERS.items()) if not released_before(version, first))


@pytest.fixture(scope="module")
def trees(pristine_source):
    return {version: SourceTree(pristine_source(version)) for version in COVERED_RELEASES}


def copy_state(version: str, tmp_path: Path) -> SourceTree:
    """What check_source reads (sglang/srt/distributed), copied so that a test can edit it."""
    return SourceTree(release_copy(version, tmp_path / version, only=[
        "sglang/__init__.py", "sglang/version.py", "sglang/srt/distributed"]))


def edit(tree: SourceTree, old: str, new: str, rel: str = STATE_FILE) -> None:
    path = tree.root / rel
    text = path.read_text()
    assert old in text, f"{old!r} not in {rel}"
    path.write_text(text.replace(old, new))


# -- static, every release

@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_every_covered_release_is_applicable(trees, version):
    assert na.hook_problems(trees[version]) == []
    result = PATCH.check_source(trees[version])
    assert result.status == APPLICABLE and result.detail.startswith(
        "wraps parallel_state.init_distributed_environment: when it returns the world group exists and no NCCL "
        "collective has run (the first is in initialize_model_parallel, called next)")
    # From 0.5.10, --moe-a2a-backend nixl without MASTER_ADDR broadcasts rank 0's address inside the hook first.
    assert (NIXL_CAVEAT in result.detail) == (not released_before(version, "0.5.10")), result.detail


def enclosing_calls(path: Path, name: str) -> list[list[ast.Call]]:
    """For each function of ``path`` that calls ``name``: its calls, in source order."""
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            calls = sorted((n for n in ast.walk(function) if isinstance(n, ast.Call)), key=lambda n: n.lineno)
            if any(ast.unparse(c.func).endswith(name) for c in calls):
                found.append(calls)
    return found


@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_every_caller_runs_initialize_model_parallel_next(trees, version):
    srt = trees[version].root / "sglang" / "srt"
    callers = sorted(str(p.relative_to(srt)) for p in srt.rglob("*.py") if p.name != "parallel_state.py"
                     and "init_distributed_environment(" in p.read_text(encoding="utf-8", errors="replace"))
    assert tuple(callers) == tuple(sorted(callers_of(version)))
    for rel in callers:
        for calls in enclosing_calls(srt / rel, "init_distributed_environment"):
            init = next(c for c in calls if ast.unparse(c.func).endswith("init_distributed_environment"))
            after = [c for c in calls if c.lineno > init.end_lineno]
            following = next(i for i, c in enumerate(after) if ast.unparse(c.func) == na.NEXT)
            between = {ast.unparse(c.func) for c in after[:following]}
            assert between <= HARMLESS_BETWEEN, (rel, between)


@pytest.mark.parametrize("version", ["0.5.8", "0.5.16", "0.5.23"])
def test_the_first_nccl_collective_is_the_tp_groups_pynccl_warm_up(trees, version):
    tree = trees[version]
    built = [c for c in ast.walk(tree.function(na.PARALLEL_STATE, na.NEXT)) if isinstance(c, ast.Call)
             and ast.unparse(c.func) == "init_model_parallel_group"]
    first = min(built, key=lambda c: c.lineno)
    assert {k.arg: ast.unparse(k.value) for k in first.keywords}["group_name"] == "'tp'"
    pynccl = tree.function("sglang.srt.distributed.device_communicators.pynccl", "PyNcclCommunicator.__init__")
    assert "self.all_reduce(data)" in ast.unparse(pynccl)  # "A small all_reduce for warmup"


@pytest.mark.parametrize("old, new, named", [
    ("def init_distributed_environment(", "def init_distributed_env(",
     "parallel_state has no module-level init_distributed_environment (renamed or moved?)"),
    ("use_pynccl=False,\n        use_pymscclpp", "use_pynccl=True,\n        use_pymscclpp",
     "init_world_group no longer passes use_pynccl=False"),
    ("    global _WORLD\n    if _WORLD is None:", "    torch.distributed.barrier()\n    global _WORLD\n"
     "    if _WORLD is None:", "runs a collective before returning: torch.distributed.barrier (line"),
    ("            timeout=timeout,\n        )", "            timeout=timeout,\n            device_id=local_rank,\n"
     "        )", "passes device_id to init_process_group"),
    ("def initialize_model_parallel(", "def initialize_parallel_groups(", "parallel_state has no "
     "initialize_model_parallel"),
])
def test_drifted_naming_what_moved(tmp_path, old, new, named):
    tree = copy_state("0.5.9", tmp_path)
    edit(tree, old, new)
    result = PATCH.check_source(tree)
    assert result.status == DRIFTED and named in result.detail, result


def test_a_helper_that_now_holds_init_process_group_is_followed(tmp_path):
    tree = copy_state("0.5.9", tmp_path)
    edit(tree, "        torch.distributed.init_process_group(", "        _init_default_group(")
    edit(tree, "def init_distributed_environment(", "def _init_default_group(**kwargs):\n"
         "    torch.distributed.init_process_group(**kwargs)\n\n\ndef init_distributed_environment(")
    assert PATCH.check_source(tree).status == APPLICABLE


# -- versioned diffs

@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_committed_diff_is_what_rewrite_generates(trees, version):
    committed = REPO / "diffs" / version / f"{PATCH.id}.diff"
    generated = diff_for(PATCH, trees[version])
    assert generated and committed.is_file() and committed.read_text() == generated, "run ci/generate-diffs"
    added = "".join(line[1:] + "\n" for line in generated.splitlines()
                    if line.startswith("+") and not line.startswith("+++"))
    assert added == na.GUARD + na.DECORATION
    assert [line for line in generated.splitlines() if line.startswith("+++ ")] == [f"+++ b/{STATE_FILE}"]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.16", "0.5.23"])
def test_diff_applies_and_then_reads_applied(version, tmp_path):
    tree = copy_state(version, tmp_path)
    diff = REPO / "diffs" / version / f"{PATCH.id}.diff"
    proc = subprocess.run(["patch", "-p1", "--batch", "--forward", "-i", str(diff)], cwd=tree.root,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hook = SourceTree(tree.root).function(na.PARALLEL_STATE, na.HOOK)
    assert [ast.unparse(d) for d in hook.decorator_list] == [baked.decorator_call(PATCH.id)]
    assert PATCH.check_source(SourceTree(tree.root)).status == APPLIED and PATCH.rewrite(SourceTree(tree.root)) == {}
    edit(tree, na.DECORATION, "")  # half a diff is not the diff
    assert PATCH.check_source(SourceTree(tree.root)).status == DRIFTED


def test_the_diffed_code_runs_without_sglang_pcie(monkeypatch):
    code = na.GUARD + na.DECORATION + "def init_distributed_environment(world_size=-1):\n    return world_size\n"
    monkeypatch.setitem(sys.modules, "sglang_pcie.patches.node_agreement.payload", None)  # as if not installed
    namespace: dict = {}
    exec(compile(code, "parallel_state", "exec"), namespace)
    function = namespace["init_distributed_environment"]
    assert function(2) == 2 and not hasattr(function, "__wrapped__")
    monkeypatch.delitem(sys.modules, "sglang_pcie.patches.node_agreement.payload")
    exec(compile(code, "parallel_state", "exec"), namespace)  # installed: the same wrapper as at runtime
    assert is_patched(namespace["init_distributed_environment"], PATCH.id)


# -- runtime install, on a stand-in module (the real one below)

def state_module() -> ModuleType:
    module = ModuleType(na.PARALLEL_STATE)

    def init_distributed_environment(world_size=-1, rank=-1):
        return "world"

    module.init_distributed_environment = init_distributed_environment
    return module


def test_install_wraps_once_and_changes_nothing_when_it_cannot(monkeypatch):
    monkeypatch.setattr(agreement, "runtime_problem", lambda: None)
    module = state_module()
    original = module.init_distributed_environment
    assert PATCH.install(module, None).status == APPLIED
    wrapped = module.init_distributed_environment
    assert is_patched(wrapped, PATCH.id) and wrapped.__wrapped__ is original
    assert PATCH.install(module, None).status == APPLIED and module.init_distributed_environment is wrapped
    assert PATCH.check_runtime({na.PARALLEL_STATE: module}, None).status == APPLIED
    monkeypatch.setattr(agreement, "runtime_problem", lambda: "torch.distributed has no _get_default_store")
    untouched = state_module()
    before = untouched.init_distributed_environment
    with pytest.raises(Drift, match="_get_default_store"):
        PATCH.install(untouched, None)
    assert untouched.init_distributed_environment is before
    del untouched.init_distributed_environment
    with pytest.raises(Drift, match="init_distributed_environment is missing"):
        PATCH.install(untouched, None)


def test_check_runtime_names_a_caller_left_with_the_unwrapped_function(monkeypatch):
    monkeypatch.setattr(agreement, "runtime_problem", lambda: None)
    module, package = state_module(), ModuleType(na.PACKAGE)
    package.init_distributed_environment = module.init_distributed_environment  # bound before the hook ran
    assert PATCH.check_runtime({na.PARALLEL_STATE: module}, None).status == DRIFTED
    PATCH.install(module, None)
    monkeypatch.setitem(sys.modules, na.PACKAGE, package)
    result = PATCH.check_runtime({na.PARALLEL_STATE: module}, None)
    assert result.status == DRIFTED and "bound before the hook ran" in result.detail
    # a baked diff: its guard marks what it replaced; where it met an error it left SGLang's own, and says so
    monkeypatch.delitem(sys.modules, na.PACKAGE)
    baked = state_module()
    setattr(baked, na.DECORATOR, lambda f: f)
    assert PATCH.check_runtime({na.PARALLEL_STATE: baked}, None) == Result(
        DRIFTED, "not in effect in this process: init_distributed_environment is not wrapped (its baked guard left "
                 "it as SGLang ships it)")
    mark(baked.init_distributed_environment, PATCH.id)
    assert PATCH.check_runtime({na.PARALLEL_STATE: baked}, None).status == APPLIED


# -- the real SGLang: two "nodes" on one machine, through SGLang's own init_distributed_environment

def start_two_nodes(env, strict: bool, timeout: float = 600) -> list[dict]:
    port, procs = free_port(), []
    for rank in range(2):
        overrides = {"SGLANG_PCIE_NCCL_PROFILE": "pcie" if rank == 0 else None,
                     "SGLANG_PCIE_STRICT": "1" if strict else None}
        command = [str(env.python), str(SCRIPT), "--rank", str(rank), "--world", "2", "--port", str(port),
                   "--nnodes", "2", "--node-rank", str(rank)]
        procs.append(subprocess.Popen(command, env=env.env(overrides), cwd=env.workdir, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            results.append({"rc": proc.returncode, "out": {k: v for line in lines for k, v in line.items()},
                            "said": [line[line.index(agreement.PREFIX):] for line in err.splitlines()
                                     if f"{agreement.PREFIX}:" in line and "StrictModeError" not in line],
                            "err": err})
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return results


PCIE_LINES = [f"sglang-pcie node-agreement: {name} differs between nodes: node 0 (HOST, rank 0) {value}; "
              f"node 1 (HOST, rank 1) {other}"
              for name, value, other in (("NCCL_ALGO", "'Ring'", "unset"), ("NCCL_BUFFSIZE", "'131072'", "unset"),
                                         ("NCCL_MAX_NCHANNELS", "'2'", "unset"), ("NCCL_MIN_NCHANNELS", "'2'", "unset"),
                                         ("NCCL_P2P_LEVEL", "'SYS'", "unset"), ("NCCL_PROTO", "'LL'", "unset"),
                                         ("SGLANG_PCIE_NCCL_DECIDED", "'pcie'", "'none'"))]


def check_hook(result: dict) -> None:
    assert result["out"]["hook"] == {"wrapped": True, "package_binds_it": True, "check_runtime": "applied",
                                     "results": {na.PARALLEL_STATE: "applied"}}, result["err"][-3000:]


def expected_lines(strict: bool) -> list[str]:
    import socket

    ending = ("the start stops (SGLANG_PCIE_STRICT=1)" if strict else
              "set the same values on every node (SGLANG_PCIE_STRICT=1 stops the start instead)")
    return [line.replace("HOST", socket.gethostname()) for line in PCIE_LINES] + [
        "sglang-pcie node-agreement: 7 setting(s) differ between the 2 node(s) of this server; NCCL ranks that "
        f"disagree on protocol, algorithm or transport can hang at some message sizes: {ending}"]


def test_sglang_0_5_9_nodes_that_disagree_stop_the_start_under_strict(sglang_env):
    for result in start_two_nodes(sglang_env("0.5.9"), strict=True):
        check_hook(result)
        assert result["rc"] == 1 and "started" not in result["out"], result["err"][-3000:]
        assert result["said"] == expected_lines(strict=True)
        assert "StrictModeError: sglang-pcie: SGLANG_PCIE_STRICT=1 and the nodes of this server disagree: NCCL_ALGO" \
            in result["err"]


def test_sglang_0_5_23_nodes_that_disagree_are_named_and_the_start_goes_on(sglang_env):
    for result in start_two_nodes(sglang_env("0.5.23"), strict=False):
        check_hook(result)
        assert result["rc"] == 0 and result["out"]["started"] and result["out"]["world"] == 2, result["err"][-3000:]
        assert result["said"] == expected_lines(strict=False)
