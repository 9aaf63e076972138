"""sm120-allreduce-fusion: FlashInfer's all-reduce + residual + RMSNorm fusion on SM120 (RTX PRO 6000 Blackwell).

What each release has, re-derived from the pristine wheels 0.5.8-0.5.23:

* The gate ``(_is_sm90_supported or _is_sm100_supported) and ...`` is
  ``srt/layers/communicator.py::apply_flashinfer_allreduce_fusion`` up to 0.5.20,
  ``srt/layers/layer_boundary/residual/add_norm.py::apply_flashinfer_allreduce_fusion`` in 0.5.21 and
  ``add_norm.py::flashinfer_ar_fusion_applies`` from 0.5.22.  Other modules import it by name
  (``models/nemotron_h_utils.py`` 0.5.14-0.5.20, ``layer_boundary/exit.py`` and ``fusions/allreduce.py`` 0.5.21+).
* From 0.5.11 the workspace preflight (``flashinfer_comm_fusion.py::_flashinfer_trtllm_workspace_allocation_sizes``)
  rounds to the multicast granularity.  GPUs without multicast (SM120 over PCIe) fail that query, which turns the
  fusion off, although FlashInfer's TRT-LLM workspace never multicasts (``SymmDeviceMemory(enable_multicast=False)``).
* From 0.5.14 the backend resolver (``flashinfer_comm_fusion.py::_resolve_backend``) raises for anything but
  SM90/SM10x; it runs when the workspaces are pre-initialised, before CUDA-graph capture.
* Every release switches the fusion on by itself only on SM90/SM100 (server_args.py, later arg_groups/); that is
  left alone, so on SM120 the fusion is only ever the user's choice, and the user also sets
  SGLANG_PCIE_SM120_FUSION=1 (SGLang's option alone cannot tell a user's choice from its own defaults).

The change is written once, as source text (``rewrite``, in this module, which reads each release to find where
the change goes; what it inserts is ``check_inserted``, the helper itself code in ``payload.py``): the versioned
diffs are that text. In a server the wheel's diff for the installed release is applied to the installed files and
swapped into the live functions (``swap.py``, with ``runtime/code_swap``), so the modules that imported the gate by
name see the change as well, and no server process reads SGLang's source to rewrite it.

Nothing happens unless asked: without SGLANG_PCIE_SM120_FUSION=1 the patch is not registered at all
(``disabled_reason``), and the text baked into an image by ``apply-diffs`` asks the same gate through the guard
every diff binds (``_sglang_pcie_sm120_opted_in`` answers False unless the guard replaces it), so not opted in,
switched off or without sglang-pcie every patched function answers, raises and logs as SGLang's own.
"""
from __future__ import annotations

import ast
import re
from types import ModuleType
from typing import Mapping

from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DRIFTED, UPSTREAM, Drift, Patch, Result
from sglang_pcie.patching import baked, register
from sglang_pcie.runtime import code_swap
from sglang_pcie.patching.edits import SourceEdits
from sglang_pcie.patches.sm120_allreduce_fusion.check_inserted import (
    FUSION, GATE_COMMENT, HELPER, IMPORT_LINES, IS_SM120_BY_PLATFORM, IS_SM120_BY_PROBE, MARKER, PATCH_ID,
    PREFLIGHT_COMMENT, RESOLVER_COMMENT, RESOLVER_OFF, RUNTIME_CONTEXT, SM120_FACT, SM120_PROBE, UTILS, helper_block)
from sglang_pcie.patching.source import SourceTree, installed_sglang_root
from sglang_pcie.patches.sm120_allreduce_fusion import swap
from sglang_pcie.patching.source_text import in_release_span

COMMUNICATOR = "sglang.srt.layers.communicator"
ADD_NORM = "sglang.srt.layers.layer_boundary.residual.add_norm"
# Where the gate lives, newest last; the first one found is the release's gate.
GATE_LOCATIONS = (
    (COMMUNICATOR, "apply_flashinfer_allreduce_fusion"),  # up to 0.5.20
    (ADD_NORM, "apply_flashinfer_allreduce_fusion"),  # 0.5.21
    (ADD_NORM, "flashinfer_ar_fusion_applies"),  # 0.5.22+
)
RESOLVER = "_resolve_backend"  # where every covered release from 0.5.14 refuses anything but SM90/SM10x
PREFLIGHT_SIZES = "_flashinfer_trtllm_workspace_allocation_sizes"
# Parts that every covered release from this one on has; a source of such a release lacking one is drifted.
RESOLVER_SINCE = "0.5.14"
PREFLIGHT_SINCE = "0.5.11"
UTILS_COMMON = "sglang.srt.utils.common"


class Sm120AllreduceFusion(Patch):
    """Opt-in: without SGLANG_PCIE_SM120_FUSION=1 the patch is not even registered (the register's gate), so
    SGLang's own code, errors and messages are untouched (and the process pays nothing for it)."""

    id = PATCH_ID

    # -- static

    def check_source(self, tree: SourceTree) -> Result:
        try:
            status, detail, _ = _rewrite(tree)
        except Drift as exc:
            return Result(DRIFTED, str(exc))
        if status == APPLICABLE and _newer_than_covered(tree.version):
            # A server applies the wheel's diff (swap.py), the newest covered release's here: say whether it fits.
            shipped, said, _ = swap.diffed_sources(tree.version, tree.root)
            if shipped != APPLIED:
                return Result(DRIFTED, f"{detail}; but a server applies the diff the wheel ships: {said}")
            detail += f"; a server applies {said.partition(': ')[2]}"
        return Result(status, detail)

    def rewrite(self, tree: SourceTree) -> dict[str, str]:
        status, _, sources = _rewrite(tree)
        return sources if status == APPLICABLE else {}

    # -- runtime

    def check_runtime(self, modules: Mapping[str, ModuleType], settings) -> Result:
        """In effect where every function the shipped diff changes or adds carries the patch's mark."""
        root = installed_sglang_root()
        status, detail, sources = swap.diffed_sources(swap.sglang_version(), root)
        if status != APPLIED:
            return Result(status, detail)
        drifted = code_swap.not_swapped(modules, sources, self.id)
        if drifted is not None:
            return drifted
        gate_module, gate = _find_gate(SourceTree(root))
        return Result(APPLIED, f"{gate_module.rsplit('.', 1)[1]}.{gate} admits SM120 when opted in and able to run "
                               f"({detail})")


PATCH = Sm120AllreduceFusion()


def _newer_than_covered(version: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) > Version(register.COVERED_RELEASES[-1])
    except InvalidVersion:
        return False


# -- the source transformation (shared by the diffs, the static check and the runtime patch)

def _rewrite(tree: SourceTree) -> tuple[str, str, dict[str, str]]:
    """(status, detail, {module: new source}); raises Drift where the release's shape is not the expected one.

    Three parts: the gate, the backend resolver (0.5.14+), the workspace preflight (0.5.11+). A part upstream
    already opened to SM12x is left alone; the status is ``upstream`` only when no part is left to patch.
    """
    gate_module, gate_name = _find_gate(tree)
    gate_source = tree.source(gate_module)
    fusion_source = tree.source(FUSION)
    if fusion_source is None:
        raise Drift(f"{FUSION} is missing")
    if MARKER in gate_source or MARKER in fusion_source:
        return APPLIED, "source carries the sglang-pcie diff", {}
    gate_tree, fusion_tree = ast.parse(gate_source), ast.parse(fusion_source)
    version = tree.version
    gate_label = f"{gate_module.rsplit('.', 1)[1]}.{gate_name}"

    gate_test = _gate_capability(gate_tree, _function(gate_tree, gate_name), f"{gate_module}.{gate_name}")
    resolver = _find_resolver(fusion_tree, version)
    preflight = _find_preflight(fusion_tree, version)

    patched, upstream = [], []
    (upstream if _admits_sm12x(gate_test) else patched).append(gate_label)
    if resolver is not None:
        (upstream if _admits_sm12x(resolver[2]) else patched).append(resolver[0].name)
    if preflight is not None:
        patched.append(PREFLIGHT_SIZES)
    if not patched:
        return UPSTREAM, f"SM12x already admitted upstream by {', '.join(upstream)}: nothing left to patch", {}

    edits = {gate_module: SourceEdits(gate_source), FUSION: SourceEdits(fusion_source)}
    gate_edits = edits[gate_module]
    if gate_label in patched:
        gate_edits.insert_at(gate_test.end_lineno, gate_test.end_col_offset, f" or {HELPER}()")
        gate_edits.insert_lines(gate_test.lineno, GATE_COMMENT + "\n")
    if resolver is not None and resolver[0].name in patched:
        _resolver_edits(resolver, edits[FUSION])
    if preflight is not None:
        edits[FUSION].indent(preflight[0].lineno, preflight[1].end_lineno)
        edits[FUSION].insert_lines(preflight[0].lineno, PREFLIGHT_COMMENT)

    host = _host_helper(tree, gate_module, gate_tree, fusion_tree, edits)
    probe_name = _insert_helper(tree, fusion_tree, gate_tree if host == gate_module else fusion_tree, edits[host])

    sources = {module: e.text() for module, e in edits.items() if e.changed}
    _plain_functions_only(tree, sources)
    detail = f"patches {', '.join(patched)}; helper in {host.rsplit('.', 1)[1]} (reads {probe_name})"
    if upstream:
        detail += f"; SM12x already admitted upstream by {', '.join(upstream)}"
    return APPLICABLE, detail, sources


def _plain_functions_only(tree: SourceTree, sources: dict[str, str]) -> None:
    """The code swap changes plain functions only: a decorated one (lru_cache, torch.compiler.disable...) is
    another object in the live module. Drift, before anything runs, where the rewrite changes one."""
    for module, new_source in sources.items():
        changed, _ = code_swap.top_level_changes(tree.source(module), new_source)
        for node in tree.tree(module).body:
            if isinstance(node, ast.FunctionDef) and node.name in changed and node.decorator_list:
                decorators = ", ".join("@" + ast.unparse(d) for d in node.decorator_list)
                raise Drift(f"{module}.{node.name} is decorated ({decorators}); the patch swaps the code of plain "
                            "functions only")


def _host_helper(tree: SourceTree, gate_module: str, gate_tree: ast.Module, fusion_tree: ast.Module,
                 edits: dict[str, SourceEdits]) -> str:
    """The module the helper goes into (importing it into the gate module where that is another one).

    flashinfer_comm_fusion, when the gate module imports it at top level (0.5.10+) or when it needs the helper
    itself: one decision and one log line per process. Up to 0.5.9 only the gate module needs it, and it does not
    import flashinfer_comm_fusion."""
    fusion_import = tree.top_level_import(gate_module, FUSION)
    if not edits[FUSION].changed and fusion_import is None:
        return gate_module
    if edits[gate_module].changed:
        if fusion_import is None:
            raise Drift(f"{gate_module} no longer imports {FUSION} at module level, which would hold the helper "
                        "its gate calls")
        edits[gate_module].insert_lines(fusion_import.end_lineno + 1, IMPORT_LINES)
    return FUSION


def _insert_helper(tree: SourceTree, fusion_tree: ast.Module, host_tree: ast.Module, edits: SourceEdits) -> str:
    """The guard and the helper, written for this release, before the host's first definition; returns what the
    helper reads to tell SM120."""
    probe_name, probe_body = _sm120_probe(tree)
    block = helper_block(_flashinfer_entry_points(fusion_tree), probe_body)
    edits.insert_lines(edits.first_definition_line(host_tree), baked.guard_block(PATCH_ID) + "\n\n" + block + "\n\n")
    return probe_name


def _find_gate(tree: SourceTree) -> tuple[str, str]:
    for module, name in GATE_LOCATIONS:
        if tree.function(module, name) is not None:
            return module, name
    raise Drift("no fusion gate: " + ", ".join(f"{m}.{n}" for m, n in GATE_LOCATIONS) + " are all absent")


# Which GPUs an operand of a capability test stands for, read off its text (`_is_sm90_supported`,
# `get_platform().is_sm100`, `is_sm120_supported()`, `_is_blackwell`...).
_GPU_WORDS = {"sm90": r"sm_?90|hopper", "sm100": r"sm_?10\d|sm_?10x|blackwell", "sm12x": r"sm_?12|blackwell"}


def _gpus(operand: ast.expr) -> set[str]:
    text = ast.unparse(operand).lower()
    return {gpu for gpu, pattern in _GPU_WORDS.items() if re.search(pattern, text)}


def _or_operands(node: ast.BoolOp) -> list[ast.expr]:
    """The operands of an ``or`` chain, nested ``or``s flattened: ``a or (b or c)`` is a, b, c."""
    found = []
    for value in node.values:
        if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or):
            found.extend(_or_operands(value))
        else:
            found.append(value)
    return found


def _capability_tests(node: ast.AST) -> list[ast.BoolOp]:
    """The outermost ``or`` tests under ``node`` naming both SM90 and SM100, in any order."""
    found = []
    for child in ast.walk(node):
        if isinstance(child, ast.BoolOp) and isinstance(child.op, ast.Or):
            covered = set().union(*(_gpus(v) for v in _or_operands(child)))
            if {"sm90", "sm100"} <= covered and not any(child is inner or _contains(inner, child) for inner in found):
                found = [f for f in found if not _contains(child, f)] + [child]
    return found


def _contains(outer: ast.AST, inner: ast.AST) -> bool:
    return any(node is inner for node in ast.walk(outer))


def _admits_sm12x(test: ast.BoolOp) -> bool:
    return any("sm12x" in _gpus(v) for v in _or_operands(test))


def _gate_capability(module_tree: ast.Module, func: ast.FunctionDef, label: str) -> ast.BoolOp:
    """The gate's `<sm90> or <sm100>` test, wherever it sits in the gate (or in a function of its module that the
    gate calls, where a refactor moved it) and in whatever order."""
    tests = _capability_tests(func)
    if not tests:  # one level down: `_fusion_supported_arch() and ...`
        called = {n.func.id for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        helpers = [f for f in module_tree.body if isinstance(f, ast.FunctionDef) and f.name in called]
        tests = [test for helper in helpers for test in _capability_tests(helper)]
    if len(tests) != 1:
        ors = [ast.unparse(n) for n in ast.walk(func) if isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or)]
        found = f"; its `or` tests: {'; '.join(ors)}" if ors else ""
        raise Drift(f"{label} does not test `<sm90> or <sm100>` once ({len(tests)} such tests){found}")
    return tests[0]


def _find_resolver(fusion_tree: ast.Module, version) -> tuple[ast.FunctionDef, ast.If, ast.BoolOp] | None:
    """The function of flashinfer_comm_fusion that raises unless the GPU is SM90/SM10x (0.5.14+: _resolve_backend),
    its ``if not (<sm90> or <sm100>): raise``, and that test; None before 0.5.14 where there is none."""
    found = []
    for func in fusion_tree.body:
        if not isinstance(func, ast.FunctionDef):
            continue
        for stmt in ast.walk(func):
            test = stmt.test if isinstance(stmt, ast.If) else None
            if (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.BoolOp)
                    and _capability_tests(test.operand) == [test.operand]
                    and any(isinstance(s, ast.Raise) for s in stmt.body)):
                found.append((func, stmt, test.operand))
    if len(found) > 1:
        raise Drift(f"{FUSION}: {len(found)} places refuse non-SM90/SM10x GPUs: "
                    + ", ".join(f.name for f, _, _ in found))
    if not found:
        if in_release_span(version, RESOLVER_SINCE, None) or _function(fusion_tree, RESOLVER) is not None:
            raise Drift(f"{FUSION} has no `if not (<sm90> or <sm100>): raise` (every covered release from "
                        f"{RESOLVER_SINCE} has one, in {RESOLVER})")
        return None
    func, stmt, test = found[0]
    if not (len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Raise)):
        raise Drift(f"{FUSION}.{func.name}: the SM90/SM10x check does not just raise")
    args = [a.arg for a in func.args.args + func.args.kwonlyargs]
    missing = [name for name in ("backend", "is_multi_node") if name not in args]
    if missing:
        raise Drift(f"{FUSION}.{func.name}({', '.join(args)}) does not take {' and '.join(missing)}, which the "
                    "inserted code reads")
    return func, stmt, test


def _resolver_edits(resolver, edits: SourceEdits) -> None:
    """Admit SM120 in the resolver, and keep a backend it could run off (not failing) when a condition is missing."""
    _, stmt, capability = resolver
    edits.insert_at(capability.end_lineno, capability.end_col_offset, f" or {HELPER}()")
    edits.insert_lines(stmt.lineno, RESOLVER_COMMENT + "\n")
    edits.insert_lines(stmt.body[0].lineno, RESOLVER_OFF)


def _find_preflight(fusion_tree: ast.Module, version) -> tuple[ast.stmt, ast.stmt] | None:
    """From 0.5.11: the first and last statement of the multicast rounding in the preflight loop; None before."""
    users = sorted({f.name for f in fusion_tree.body if isinstance(f, ast.FunctionDef)
                    and any(isinstance(n, ast.Attribute) and n.attr == "cuMulticastGetGranularity"
                            for n in ast.walk(f))})
    if not users:
        if _function(fusion_tree, PREFLIGHT_SIZES) is not None:
            return None  # the preflight no longer asks for multicast: nothing there to patch
        if in_release_span(version, PREFLIGHT_SINCE, None):
            raise Drift(f"{FUSION}.{PREFLIGHT_SIZES} is missing (every covered release from {PREFLIGHT_SINCE} has "
                        "it)")
        return None
    if users != [PREFLIGHT_SIZES]:
        raise Drift(f"{FUSION}: the multicast query is in {', '.join(users)}, not only in {PREFLIGHT_SIZES}")
    loops = [n for n in ast.walk(_function(fusion_tree, PREFLIGHT_SIZES)) if isinstance(n, ast.For)]
    for loop in loops:
        body = loop.body
        start = next((i for i, s in enumerate(body) if "CUmulticastObjectProp" in ast.unparse(s)), None)
        end = next((i for i, s in enumerate(body)
                    if ast.unparse(s) == "allocation_size = ceil_align(allocation_size, mc_granularity)"), None)
        if start is None or end is None or end < start:
            continue
        if any("mc_" in ast.unparse(s) for s in body[end + 1:]):
            raise Drift(f"{FUSION}.{PREFLIGHT_SIZES} uses the multicast values after rounding to them")
        return body[start], body[end]
    raise Drift(f"{FUSION}.{PREFLIGHT_SIZES}: no loop rounding allocation_size to mc_granularity")


def _sm120_probe(tree: SourceTree) -> tuple[str, str]:
    """(what the helper reads, the body of _sglang_pcie_is_sm120) for this tree; Drift naming what is missing."""
    if tree.defines(RUNTIME_CONTEXT, "get_platform"):
        problem = _platform_fact_problem(tree, SM120_FACT)
        if problem:
            raise Drift(problem)
        return f"get_platform().{SM120_FACT}", IS_SM120_BY_PLATFORM
    if tree.defines(UTILS, SM120_PROBE):
        return f"{UTILS}.{SM120_PROBE}", IS_SM120_BY_PROBE
    raise Drift(f"{UTILS}.{SM120_PROBE} is missing (and there is no {RUNTIME_CONTEXT}.get_platform): the inserted "
                "helper asks it whether the GPU is SM12x")


def _platform_fact_problem(tree: SourceTree, fact: str) -> str | None:
    """None when ``get_platform().<fact>`` answers in this tree: the platform class defines it, or a table of
    the module maps it to a probe that ``sglang.srt.utils.common`` defines (0.5.19+)."""
    where = tree.origin(RUNTIME_CONTEXT, "get_platform")[0]  # runtime_context, or the module it re-exports from
    for node in ast.walk(tree.tree(where)):
        if isinstance(node, ast.ClassDef) and "Platform" in node.name and fact in _class_members(node):
            return None
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == fact:
                    probe = value.value if isinstance(value, ast.Constant) else None
                    if isinstance(probe, str) and not tree.defines(UTILS_COMMON, probe):
                        return (f"{where}: the platform answers {fact} through {UTILS_COMMON}.{probe}, "
                                "which is missing")
                    return None
    return (f"{where}.get_platform() has no {fact} fact, which the inserted helper reads (every covered "
            "release with get_platform has it)")


def _class_members(cls: ast.ClassDef) -> set[str]:
    """Names a class body defines: methods, properties, class attributes."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _flashinfer_entry_points(fusion_tree: ast.Module) -> tuple[str, ...]:
    """What the release calls on flashinfer.comm, under whatever names it imports or keeps it (`comm`,
    `_flashinfer_comm = comm`, `flashinfer.comm.X`)."""
    aliases = set()
    for node in ast.walk(fusion_tree):
        if isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.name == "flashinfer.comm" and a.asname)
        elif isinstance(node, ast.ImportFrom) and node.module == "flashinfer" and not node.level:
            aliases.update(a.asname or a.name for a in node.names if a.name == "comm")
    while True:  # names the module keeps it under: `_flashinfer_comm = comm`
        kept = {t.id for node in ast.walk(fusion_tree) if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Name) and node.value.id in aliases
                for t in node.targets if isinstance(t, ast.Name)} - aliases
        if not kept:
            break
        aliases |= kept
    names = {n.attr for n in ast.walk(fusion_tree) if isinstance(n, ast.Attribute)
             and ((isinstance(n.value, ast.Name) and n.value.id in aliases)
                  or ast.unparse(n.value) == "flashinfer.comm")}
    if not names:
        raise Drift(f"{FUSION} calls nothing on flashinfer.comm")
    return tuple(sorted(names))


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) > 1:
        raise Drift(f"{name} is defined {len(found)} times")
    return found[0] if found else None
