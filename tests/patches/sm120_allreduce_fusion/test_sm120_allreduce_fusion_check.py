"""sm120-allreduce-fusion: the gate, the backend resolver and the workspace preflight of every covered release.

Static tests run the release's own functions, compiled from the pristine sources, from ``rewrite()`` (what the
runtime patch compiles) and from the committed diff applied with ``patch -p1``, with their inputs set through
their globals.  Runtime tests import the real SGLang 0.5.9 and 0.5.23 with the overlay active.
"""
from __future__ import annotations

import ast
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import FunctionType, SimpleNamespace

import pytest

from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DISABLED, DRIFTED, UPSTREAM, Drift
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patching.diffs import diff_for
from sglang_pcie.patching import register
from sglang_pcie.patches.sm120_allreduce_fusion import check as sm120
from sglang_pcie.patches.sm120_allreduce_fusion import swap
from sglang_pcie.patching import baked
from sglang_pcie.runtime import code_swap
from sglang_pcie.patches.sm120_allreduce_fusion import check_inserted as inserted
from sglang_pcie.patches.sm120_allreduce_fusion.check import (ADD_NORM, COMMUNICATOR, FUSION, HELPER, PATCH,
                                                              PREFLIGHT_SIZES, RESOLVER)
from sglang_pcie.patching.releases import COVERED_RELEASES, fetch_source
from sglang_pcie.runtime.settings import load_settings

from support import REPO
from support.releases import release_copy

OPT_IN_REASON = register.entry(sm120.PATCH_ID).opt_in.off_reason
GPUS = ("sm90", "sm100", "sm120", "sm89", "none")


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".post")[0].split("."))


def expected_layout(version: str) -> dict:
    """Where each release keeps what the patch changes (read off the wheels; see the patch module's docstring)."""
    v = release(version)
    return {
        "gate": (COMMUNICATOR, "apply_flashinfer_allreduce_fusion") if v <= (0, 5, 20)
        else (ADD_NORM, "apply_flashinfer_allreduce_fusion") if v == (0, 5, 21)
        else (ADD_NORM, "flashinfer_ar_fusion_applies"),
        "resolver": v >= (0, 5, 14),
        "preflight": v >= (0, 5, 11),
        "helper_host": COMMUNICATOR if v <= (0, 5, 9) else FUSION,
    }


# -- compiling the release's functions with chosen inputs

def compile_functions(source: str, names: list[str]) -> dict:
    """Code objects of the named top-level functions of ``source``, to be bound to chosen globals."""
    module = compile(source, "<release>", "exec", dont_inherit=True)
    return {name: code_swap.code_of(module, name) for name in names}


def bind(codes: dict, inputs: dict) -> dict:
    """The functions of ``codes`` sharing one namespace that holds ``inputs`` (and each other)."""
    namespace = dict(inputs)
    namespace.update({name: FunctionType(code, namespace, name) for name, code in codes.items()})
    return namespace


def gate_inputs(gpu, sm120_ready, backend, dp_attention, flashinfer, unavailable, cp_size):
    """The gate's globals for one machine and one configuration (every name any release's gate reads)."""
    def helper():
        assert gpu not in ("sm90", "sm100"), "the SM120 helper ran on SM90/SM100"
        return gpu == "sm120" and sm120_ready

    args = SimpleNamespace(enable_flashinfer_allreduce_fusion=backend is not None,
                           flashinfer_allreduce_fusion_backend=backend, attn_cp_size=cp_size)
    return {
        "_is_sm90_supported": gpu == "sm90", "_is_sm100_supported": gpu == "sm100",
        "_is_flashinfer_available": flashinfer, "FUSE_ALLREDUCE_MAX_BATCH_SIZE": 2048,
        "is_dp_attention_enabled": lambda: dp_attention,
        "get_global_server_args": lambda: args, "get_server_args": lambda: args,
        "get_exec": lambda: SimpleNamespace(comm=args),
        "is_flashinfer_allreduce_unavailable": lambda: unavailable,
        "uses_cutedsl_ar_fusion": lambda: backend == "cutedsl",
        HELPER: helper,
    }


GATE_CASES = list(itertools.product([None, "auto", "cutedsl"], [False, True], [False, True], [False, True], [1, 2]))
BATCH_SIZES = (0, 1, 2048, 2049)


def gate_table(code, gpu, sm120_ready=False):
    """{(configuration, batch size): the gate's answer} on one machine."""
    table = {}
    for case in GATE_CASES:
        gate = FunctionType(code, gate_inputs(gpu, sm120_ready, *case))
        for batch_size in BATCH_SIZES:
            table[case, batch_size] = gate(batch_size)
    return table


def assert_gate_truth_table(pristine_code, patched_code):
    for gpu in GPUS:
        pristine = gate_table(pristine_code, gpu)
        for ready in (False, True):
            patched = gate_table(patched_code, gpu, ready)
            if gpu != "sm120":  # exactly the release's answers, value and type
                assert [(v, type(v)) for v in patched.values()] == [(v, type(v)) for v in pristine.values()], gpu
            elif ready:  # SM120 is admitted as SM90 is
                assert patched == gate_table(pristine_code, "sm90")
                assert any(patched.values())
            else:
                assert not any(patched.values())
        if gpu == "sm120":
            assert not any(pristine.values())  # what the patch is for


# The states of an SM120 machine the patched resolver tells apart: not opted in (SGLang's own behaviour), opted in
# with a condition missing (off, not failing), opted in and able to run.
SM120_STATES = ("not-opted-in", "opted-in-unable", "ready")


def resolver_inputs(version, gpu, state):
    def helper():
        assert gpu not in ("sm90", "sm100"), "the SM120 helper ran on SM90/SM100"
        return gpu == "sm120" and state == "ready"

    platform = SimpleNamespace(is_sm90=gpu == "sm90", is_sm100=gpu == "sm100")
    return {"is_sm90_supported": lambda: gpu == "sm90", "is_sm100_supported": lambda: gpu == "sm100",
            "get_platform": lambda: platform, HELPER: helper, inserted.IS_SM120: lambda: gpu == "sm120",
            inserted.OPTED_IN: lambda: state != "not-opted-in"}


def resolver_table(codes, version, gpu, state="not-opted-in"):
    resolve = bind(codes, resolver_inputs(version, gpu, state))[RESOLVER]
    table = {}
    for backend, multi_node in itertools.product(["auto", "trtllm", "mnnvl", "cutedsl"], [False, True]):
        try:
            table[backend, multi_node] = ("returns", resolve(backend, multi_node))
        except ValueError as exc:
            table[backend, multi_node] = ("raises", str(exc))
    return table


def assert_resolver_truth_table(version, pristine_codes, patched_codes):
    sm120_runs = {("auto", False), ("trtllm", False)}  # what the SM12x TRT-LLM all-reduce can do: one node
    pristine_sm90 = resolver_table(pristine_codes, version, "sm90")
    for gpu in GPUS:
        pristine = resolver_table(pristine_codes, version, gpu)
        for state in SM120_STATES:
            patched = resolver_table(patched_codes, version, gpu, state)
            if gpu != "sm120" or state == "not-opted-in":  # SGLang's own answers and errors, word for word
                assert patched == pristine, (gpu, state)
                continue
            ready = state == "ready"
            for case, outcome in patched.items():
                if case in sm120_runs:
                    assert outcome == ("returns", "trtllm" if ready else None), case
                elif not ready:  # the release's own refusal of SM120
                    assert outcome == pristine[case], case
                elif case == ("mnnvl", False):  # SM90 may use MNNVL on one node; SM120 has no multicast fabric
                    assert outcome[0] == "raises" and pristine_sm90[case] == ("returns", "mnnvl"), case
                else:  # as on SM90
                    assert outcome == pristine_sm90[case], case


class FakeDriver:
    """The CUDA driver calls the preflight makes (there is no driver on this machine); counts multicast queries."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUmemAllocationGranularity_flags:
        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1

    class CUmulticastGranularity_flags:
        CU_MULTICAST_GRANULARITY_RECOMMENDED = 1

    CUmulticastObjectProp = SimpleNamespace

    def __init__(self, multicast_error=False):
        self.multicast_error = multicast_error
        self.multicast_queries = 0

    def cuMemGetAllocationGranularity(self, prop, flag):
        return 0, 2 << 20

    def cuMulticastGetGranularity(self, prop, flag):
        self.multicast_queries += 1
        return (801, 0) if self.multicast_error else (0, 512 << 20)  # 801: CUDA_ERROR_NOT_SUPPORTED


def preflight_outcome(codes, ceil_align, gpu, sm120_ready, multicast_error):
    namespace = bind(codes, {"ceil_align": ceil_align, "torch": SimpleNamespace(float32="float32"),
                             HELPER: lambda: gpu == "sm120" and sm120_ready})
    driver = FakeDriver(multicast_error)
    prop = SimpleNamespace(requestedHandleTypes=1)
    try:
        sizes = namespace[PREFLIGHT_SIZES](driver, prop, 4, 2048, 7168, "bfloat16")
        return ("returns", sizes, driver.multicast_queries)
    except RuntimeError as exc:
        return ("raises", str(exc), driver.multicast_queries)


def assert_preflight_truth_table(pristine_codes, patched_codes, ceil_align):
    for gpu, multicast_error in itertools.product(GPUS, [False, True]):
        pristine = preflight_outcome(pristine_codes, ceil_align, gpu, False, multicast_error)
        for ready in (False, True):
            patched = preflight_outcome(patched_codes, ceil_align, gpu, ready, multicast_error)
            if gpu == "sm120" and ready:  # no multicast query; sizes rounded to the allocation granularity only
                assert patched[0] == "returns" and patched[2] == 0
                assert all(size % (2 << 20) == 0 for size in patched[1])
            else:
                assert patched == pristine, (gpu, ready, multicast_error)
        if gpu == "sm120" and multicast_error:
            assert pristine[0] == "raises"  # what the preflight change is for


def real_ceil_align(tree: SourceTree):
    functions = compile_functions(tree.source("sglang.srt.utils.common"), ["ceil_align", "ceil_div"])
    return bind(functions, {})["ceil_align"]


def apply_diff(version: str, tmp_path: Path) -> SourceTree:
    """A copy of the release's files the patch reads (the gate module, flashinfer_comm_fusion, the package
    marker), patched with ``patch -p1``."""
    pristine = Path(fetch_source(version))
    diff = REPO / "diffs" / version / f"{PATCH.id}.diff"
    touched = [line[len("+++ b/"):].strip() for line in diff.read_text().splitlines() if line.startswith("+++ b/")]
    for rel in set(touched) | {"sglang/__init__.py", "sglang/srt/layers/flashinfer_comm_fusion.py"}:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pristine / rel, tmp_path / rel)
    proc = subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", "-i", str(diff)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return SourceTree(tmp_path)


# -- static: every covered release

@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_release_fits_the_patch_where_expected(version):
    tree = SourceTree(fetch_source(version))
    layout = expected_layout(version)
    result = PATCH.check_source(tree)
    assert result.status == APPLICABLE, result.detail
    gate_module, gate_name = layout["gate"]
    assert sm120._find_gate(tree) == layout["gate"]
    sources = PATCH.rewrite(tree)
    assert f"{gate_name}" in result.detail and (RESOLVER in result.detail) == layout["resolver"]
    assert (PREFLIGHT_SIZES in result.detail) == layout["preflight"]
    assert f"def {HELPER}()" in sources[layout["helper_host"]]
    assert sorted(sources) == sorted({gate_module, layout["helper_host"]}
                                     | ({FUSION} if layout["resolver"] or layout["preflight"] else set()))
    for module, text in sources.items():  # every block the rewrite adds is marked; the result is valid Python
        ast.parse(text)
        old_lines = set(tree.source(module).splitlines())
        added = [line for line in text.splitlines() if line not in old_lines]
        assert any(sm120.MARKER in line for line in added)


@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_diff_and_monkeypatch_agree_and_keep_every_other_answer(version, tmp_path):
    """The committed diff, applied with ``patch -p1`` and by the runtime install (``swap``), gives the rewrite's
    text; the gate (and resolver, preflight) from it answer as the release's own everywhere but on SM120, where
    SM120 counts as SM90."""
    tree = SourceTree(fetch_source(version))
    committed = (REPO / "diffs" / version / f"{PATCH.id}.diff").read_text()
    assert committed == diff_for(PATCH, tree), "ci/generate-diffs is out of date"
    patched_tree = apply_diff(version, tmp_path)
    rewritten = PATCH.rewrite(tree)
    for module, text in rewritten.items():
        assert patched_tree.source(module) == text
    status, detail, swapped = swap.diffed_sources(version, fetch_source(version))
    assert (status, detail, swapped) == (APPLIED, f"sglang {version}: its own diff", rewritten)
    assert PATCH.check_source(patched_tree) == sm120.Result(APPLIED, "source carries the sglang-pcie diff")
    assert PATCH.rewrite(patched_tree) == {}

    gate_module, gate_name = expected_layout(version)["gate"]
    pristine_gate = compile_functions(tree.source(gate_module), [gate_name])[gate_name]
    for patched_source in (rewritten[gate_module], patched_tree.source(gate_module)):
        assert_gate_truth_table(pristine_gate, compile_functions(patched_source, [gate_name])[gate_name])

    names = {"resolver": [RESOLVER, "_mnnvl_supported"], "preflight": [PREFLIGHT_SIZES]}
    for part, functions in names.items():
        if not expected_layout(version)[part]:
            continue
        pristine = compile_functions(tree.source(FUSION), functions)
        for patched_source in (rewritten[FUSION], patched_tree.source(FUSION)):
            patched = compile_functions(patched_source, functions)
            if part == "resolver":
                assert_resolver_truth_table(version, pristine, patched)
            else:
                assert_preflight_truth_table(pristine, patched, real_ceil_align(tree))


def newer_release(tmp_path: Path, edit=None) -> SourceTree:
    """0.5.23's files (the gate, the fusion module) labelled 0.5.24, a release the wheel ships no diff for."""
    gate = "sglang/srt/layers/layer_boundary/residual/add_norm.py"
    fusion = "sglang/srt/layers/flashinfer_comm_fusion.py"
    root = release_copy("0.5.23", tmp_path / "src", only=["sglang/__init__.py", "sglang/srt/utils", gate, fusion,
                                                           "sglang/srt/runtime_context.py"])
    (root / "sglang" / "_version.py").write_text("__version__ = version = '0.5.24'\n")
    if edit:
        path = root / fusion
        path.write_text(edit(path.read_text()))
    return SourceTree(root)


def test_a_release_newer_than_the_wheel_gets_the_newest_diff_and_the_static_check_says_whether_it_fits(tmp_path):
    """A server on a release the wheel has no diff for applies the newest covered release's (``swap``); the static
    check says which, or drifted where that diff does not fit although the rewrite would."""
    tree = newer_release(tmp_path)
    assert tree.version == "0.5.24"
    result = PATCH.check_source(tree)
    assert result.status == APPLICABLE and result.detail.endswith(
        "; a server applies the diff of 0.5.23 (none shipped for 0.5.24)"), result.detail
    status, detail, sources = swap.diffed_sources("0.5.24", tree.root)
    assert (status, sources) == (APPLIED, PATCH.rewrite(tree))

    moved = newer_release(tmp_path / "moved", lambda text: text.replace(
        '            "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."',
        '            "FlashInfer all-reduce fusion requires SM90 or SM10X NVIDIA GPUs."'))
    result = PATCH.check_source(moved)
    assert result.status == DRIFTED and "but a server applies the diff the wheel ships: the 0.5.23 diff does not " \
        "apply to sglang 0.5.24: sglang/srt/layers/flashinfer_comm_fusion.py: hunk" in result.detail, result.detail
    assert PATCH.rewrite(moved)  # the rewrite alone would still fit


def test_every_release_switches_fusion_on_by_itself_only_on_sm90_sm100():
    """Why SGLANG_PCIE_SM120_FUSION=1 is needed on every covered release and server_args stays untouched: each
    release auto-enables the fusion under an SM90/SM100 test, and no code path sets it for SM120."""
    for version in COVERED_RELEASES:
        root = Path(fetch_source(version)) / "sglang" / "srt"
        files = [root / "server_args.py"] + sorted((root / "arg_groups").rglob("*.py"))
        sites = [site for path in files if path.is_file() for site in fusion_switch_sites(path.read_text())]
        automatic = [test for test in sites if "sm90" in test]
        assert automatic, f"{version}: no automatic enabling found"
        for test in sites:
            assert not any(word in test.lower() for word in ("sm120", "sm12", "blackwell")), (version, test)
            assert test in automatic or "enable_flashinfer_allreduce_fusion" in test, (version, test)


def fusion_switch_sites(source: str) -> list[str]:
    """The tests of the ``if`` statements whose body switches the fusion on (the flag or a backend)."""
    def switches_on(node):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            attr, value = node.targets[0].attr, node.value
            return ((attr == "enable_flashinfer_allreduce_fusion" and ast.unparse(value) == "True")
                    or (attr == "flashinfer_allreduce_fusion_backend" and ast.unparse(value) != "None"))
        if isinstance(node, ast.Dict):
            return any(isinstance(k, ast.Constant) and k.value == "flashinfer_allreduce_fusion_backend"
                       and ast.unparse(v) != "None" for k, v in zip(node.keys, node.values))
        if isinstance(node, ast.Call):
            return any(k.arg == "flashinfer_allreduce_fusion_backend" and ast.unparse(k.value) != "None"
                       for k in node.keywords)
        return False

    return [ast.unparse(node.test) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.If)
            and any(switches_on(inner) for stmt in node.body for inner in ast.walk(stmt))]


@pytest.mark.parametrize("value", ["1", "true", "TRUE", " on ", "yes", "0", "false", "", "off", "2", "enabled"])
def test_opt_in_asks_the_settings_through_the_guard(value, monkeypatch):
    """The inserted helper asks the guard every diff binds, which reads SGLANG_PCIE_SM120_FUSION as settings do."""
    monkeypatch.setenv("SGLANG_PCIE_SM120_FUSION", value)
    namespace = {}
    exec(helper_block(), namespace)
    assert namespace[inserted.OPTED_IN]() == load_settings({"SGLANG_PCIE_SM120_FUSION": value}).sm120_fusion


def helper_block() -> str:
    """The helper as a diff inserts it, with the guard before it."""
    return baked.guard_block(PATCH.id) + inserted.helper_block((), inserted.IS_SM120_BY_PROBE)


@pytest.mark.parametrize("version, majors", [("0.5.9", [9, 10]), ("0.5.23", [9, 10, 12])])
def test_flashinfer_sm12x_kernels_are_read_from_its_build_spec(sglang_env, version, majors):
    """The FlashInfer pinned by 0.5.9 (0.6.3) builds its TRT-LLM all-reduce for SM9x/SM10x only; the one of 0.5.23
    (0.7.2) also for SM12x, which FlashInfer PR #3903 added."""
    namespace = {}
    exec(helper_block(), namespace)
    site = subprocess.run([str(sglang_env(version).python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip()
    build_spec = Path(site) / "flashinfer" / "jit" / "comm.py"
    assert namespace["_sglang_pcie_trtllm_allreduce_majors"](build_spec) == majors


# -- static: what the check reports on changed sources

# What the check reads besides the gate module and flashinfer_comm_fusion: the version, and where the SM120 probe
# the inserted helper calls is defined.
READ_BY_THE_CHECK = ["sglang", "sglang.version", "sglang._version", sm120.RUNTIME_CONTEXT, sm120.UTILS,
                     sm120.UTILS_COMMON]


def copy_release(version: str, tmp_path: Path, modules: list[str]) -> SourceTree:
    pristine = SourceTree(fetch_source(version))
    paths = [pristine.path(m) for m in modules + READ_BY_THE_CHECK]
    return SourceTree(release_copy(version, tmp_path, only=[p.relative_to(pristine.root).as_posix() for p in paths if p]))


def edit(tree: SourceTree, module: str, old: str, new: str):
    path = tree.path(module)
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("version, module, old, new, status, reason", [
    ("0.5.9", COMMUNICATOR, "def apply_flashinfer_allreduce_fusion(", "def fusion_applies(", DRIFTED, "no fusion gate"),
    ("0.5.9", COMMUNICATOR, "(_is_sm90_supported or _is_sm100_supported)\n", "_is_sm90_supported\n", DRIFTED,
     "does not test `<sm90> or <sm100>` once"),
    ("0.5.9", COMMUNICATOR, "(_is_sm90_supported or _is_sm100_supported)\n",
     "(_is_sm90_supported or _is_hopper)\n", DRIFTED, "its `or` tests: _is_sm90_supported or _is_hopper"),
    # The hand fix this project started from: one sed adding SM120 to the gate (0.5.9 has no other part).
    ("0.5.9", COMMUNICATOR, "(_is_sm90_supported or _is_sm100_supported)\n",
     "(_is_sm90_supported or _is_sm100_supported or is_sm120_supported())\n", UPSTREAM, "already admitted"),
    # The same in another operand order.
    ("0.5.9", COMMUNICATOR, "(_is_sm90_supported or _is_sm100_supported)\n",
     "(is_sm120_supported() or _is_sm90_supported or _is_sm100_supported)\n", UPSTREAM, "already admitted"),
    # Only the gate opened upstream: the resolver still refuses SM120, so the patch still has work there.
    ("0.5.23", ADD_NORM, "(_is_sm90_supported or _is_sm100_supported)\n",
     "(_is_sm120_supported or _is_sm90_supported or _is_sm100_supported)\n", APPLICABLE,
     "patches _resolve_backend, _flashinfer_trtllm_workspace_allocation_sizes; helper in flashinfer_comm_fusion"),
    ("0.5.23", FUSION, "    if not (get_platform().is_sm90 or get_platform().is_sm100):\n",
     "    if not get_platform().is_sm90:\n", DRIFTED, "has no `if not (<sm90> or <sm100>): raise`"),
    ("0.5.23", FUSION, "def _resolve_backend(backend: str, is_multi_node: bool = False)",
     "def _resolve_backend(requested: str, is_multi_node: bool = False)", DRIFTED, "does not take backend"),
    ("0.5.23", FUSION, "        allocation_size = ceil_align(allocation_size, mc_granularity)\n", "", DRIFTED,
     "no loop rounding"),
    ("0.5.23", ADD_NORM, "def flashinfer_ar_fusion_applies(", "def fusion_applies(", DRIFTED, "no fusion gate"),
])
def test_changed_shapes_are_reported(version, module, old, new, status, reason, tmp_path):
    tree = copy_release(version, tmp_path, [expected_layout(version)["gate"][0], FUSION])
    edit(tree, module, old, new)
    result = PATCH.check_source(tree)
    assert result.status == status and reason in result.detail, result
    if status == DRIFTED:
        with pytest.raises(Drift):
            PATCH.rewrite(tree)
    elif status == UPSTREAM:
        assert PATCH.rewrite(tree) == {}
    else:  # the part upstream already opened is left as it is
        assert sorted(PATCH.rewrite(tree)) == [FUSION]


def test_verify_patches_exits_1_on_a_drifted_gate(tmp_path):
    tree = copy_release("0.5.23", tmp_path, [ADD_NORM, FUSION])
    edit(tree, ADD_NORM, "def flashinfer_ar_fusion_applies(", "def fusion_applies(")
    proc = subprocess.run([sys.executable, "-m", "sglang_pcie", "verify-patches", "--sglang-source", str(tmp_path),
                           "--json"], capture_output=True, text=True, cwd=REPO)
    rows = {row["id"]: row for row in json.loads(proc.stdout)["patches"]}
    assert proc.returncode == 1
    assert rows[PATCH.id]["status"] == DRIFTED and "no fusion gate" in rows[PATCH.id]["detail"]


# -- runtime: the real releases, with the overlay active


RUNTIME_EXPECTED = {
    "0.5.9": {"gate": f"{COMMUNICATOR}.apply_flashinfer_allreduce_fusion", "helper_host": COMMUNICATOR,
              "callers": [], "resolver": False,
              "diff_functions": {"apply_flashinfer_allreduce_fusion", HELPER, inserted.IS_SM120}},
    "0.5.23": {"gate": f"{ADD_NORM}.flashinfer_ar_fusion_applies", "helper_host": FUSION,
               "callers": ["sglang.srt.layers.layer_boundary.exit",
                           "sglang.srt.layers.layer_boundary.fusions.allreduce"],
               "resolver": True,
               "diff_functions": {"flashinfer_ar_fusion_applies", HELPER, inserted.IS_SM120, RESOLVER,
                                  PREFLIGHT_SIZES}},
}


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_runtime_gate_on_simulated_machines(sglang_env, version):
    expected = RUNTIME_EXPECTED[version]
    callers = json.dumps(expected["callers"])
    diff = REPO / "diffs" / version / f"{PATCH.id}.diff"
    # Opted in at import, so the patch is registered; the scenarios then stand in for the opt-in as the diff's
    # guard answered it (_sglang_pcie_sm120_opted_in).
    report = sglang_env(version).run_script_json("sm120_runtime.py", callers,
                                                 env={"SM120_TEST_DIFF": str(diff), "SGLANG_PCIE_SM120_FUSION": "1"})

    assert report["gate"] == expected["gate"] and report["helper_host"] == expected["helper_host"]
    assert report["gate_patched"] and report["check_runtime"] == APPLIED
    assert report["callers"] == {caller: True for caller in expected["callers"]}
    matches = report["diff_code_matches_live_code"]
    assert expected["diff_functions"] <= set(matches) and all(matches.values()), matches

    # SM120, opted in, peer access, FlashInfer with SM12x kernels: on; decided once (2 GPUs: 2 peer queries).
    ready = report["sm120_ready"]
    assert ready["gate"] == [True, True, True] and ready["log"] == []
    assert report["decided_once"] == [True, True, True, 2]
    # Without the opt-in (a baked diff whose guard said no): off, and nothing logged, as SGLang itself.
    no_opt_in = report["sm120_no_opt_in"]
    assert no_opt_in["gate"] == [False] * 3 and no_opt_in["log"] == []
    # Without peer access: off, one warning naming it.
    no_peer = report["sm120_no_peer_access"]
    assert no_peer["gate"] == [False] * 3 and len(no_peer["log"]) == 1
    assert no_peer["log"][0][0] == "WARNING" and "no peer-to-peer access" in no_peer["log"][0][1]
    # A FlashInfer without SM12x kernels for the TRT-LLM all-reduce: off, one warning naming it.
    no_kernels = report["sm120_no_sm12x_kernels"]
    assert no_kernels["gate"] == [False] * 3 and len(no_kernels["log"]) == 1
    assert "no SM12x kernels for its TRT-LLM all-reduce" in no_kernels["log"][0][1]
    # The FlashInfer each release pins: 0.5.9's 0.6.3 lacks SM12x kernels, 0.5.23's 0.7.2 has them.
    real = report["sm120_real_flashinfer"]
    if version == "0.5.9":
        assert real["gate"] == [False] * 3 and "FlashInfer 0.6.3 has no SM12x kernels" in real["log"][0][1]
    else:
        assert real["gate"] == [True] * 3 and real["log"] == []

    if expected["resolver"]:  # auto resolves to the single-node backend on SM120, or stays off without opt-in
        assert ready["resolver_auto"] == "trtllm"
        assert no_opt_in["resolver_auto"] == "ValueError: " + SGLANG_RESOLVER_ERROR  # SGLang's own, word for word
        assert no_peer["resolver_auto"] is None

    table = report["truth_table"]
    assert table["cases"] == 48 * 4
    assert table["equal_off_sm120"] and table["sm120_as_sm90"] and table["pristine_sm120_never"]


SGLANG_RESOLVER_ERROR = "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."



@pytest.mark.parametrize("env, reason", [
    ({}, OPT_IN_REASON),  # nothing opted in: not even registered
    ({"SGLANG_PCIE_SM120_FUSION": "0"}, OPT_IN_REASON),
    ({"SGLANG_PCIE_SM120_FUSION": "1", "SGLANG_PCIE_DISABLE_PATCHES": PATCH.id},
     "listed in SGLANG_PCIE_DISABLE_PATCHES"),
    ({"SGLANG_PCIE_SM120_FUSION": "1", "SGLANG_PCIE_DISABLE": "1"}, None),  # the overlay never activates
], ids=["unset", "zero", "disable-patches", "disable"])
def test_switched_off_leaves_sglang_as_shipped(sglang_env, env, reason):
    """Without the opt-in (or switched off) SGLang's gate and resolver are its own code, and its resolver still
    refuses SM120 with its own words."""
    state = sglang_env("0.5.23").run_script_json("sm120_not_opted_in.py", env=env)
    assert state == {"switched_off": reason, "own_code": True, "helper": False, "marked": False,
                     "resolver_own_code": True, "resolver_on_sm120": SGLANG_RESOLVER_ERROR}


def test_verify_patches_shows_the_opt_in(capsys, monkeypatch):
    from sglang_pcie.tools.cli import main

    monkeypatch.delenv("SGLANG_PCIE_SM120_FUSION", raising=False)
    monkeypatch.delenv("SGLANG_PCIE_DISABLE_PATCHES", raising=False)
    main(["verify-patches", "--sglang-source", str(fetch_source("0.5.23")), "--json"])
    row = next(r for r in json.loads(capsys.readouterr().out)["patches"] if r["id"] == PATCH.id)
    assert row["status"] == DISABLED and row["detail"].startswith(OPT_IN_REASON + " (source check: applicable")
    monkeypatch.setenv("SGLANG_PCIE_SM120_FUSION", "1")
    main(["verify-patches", "--sglang-source", str(fetch_source("0.5.23")), "--json"])
    row = next(r for r in json.loads(capsys.readouterr().out)["patches"] if r["id"] == PATCH.id)
    assert row["status"] == APPLICABLE


def test_plain_functions_only_refuses_a_changed_decorated_function_and_passes_a_plain_one(tmp_path):
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "m.py").write_text("import functools\n\n\n@functools.lru_cache\ndef gate():\n    return False\n\n\n"
                                  "def other():\n    return 1\n")
    tree = SourceTree(tmp_path)
    new = tree.source("sglang.m").replace("return False", "return True")
    with pytest.raises(Drift, match=r"^sglang.m.gate is decorated \(@functools.lru_cache\); "):
        sm120._plain_functions_only(tree, {"sglang.m": new})
    assert sm120._plain_functions_only(tree, {"sglang.m": tree.source("sglang.m").replace("1", "2")}) is None
