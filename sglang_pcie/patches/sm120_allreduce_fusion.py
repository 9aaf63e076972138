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

The change is written once, as source text (``rewrite``): the versioned diffs are that text, and ``apply`` compiles
the same text and puts the changed functions' code into the existing function objects (``__code__``), so the
modules that imported the gate by name see the change as well.
"""
from __future__ import annotations

import ast
import functools
import inspect
import linecache
import sys
from pathlib import Path
from types import CodeType, FunctionType, ModuleType
from typing import Mapping

from sglang_pcie.base import (APPLICABLE, APPLIED, DIFF_MARKER, DRIFTED, NOT_APPLICABLE, UPSTREAM, Drift, Patch,
                              Result, SourceTree, installed_sglang_root, is_patched, mark)

PATCH_ID = "sm120-allreduce-fusion"
MARKER = f"{DIFF_MARKER} {PATCH_ID}"
LOGGER_NAME = "sglang_pcie.sm120_allreduce_fusion"

COMMUNICATOR = "sglang.srt.layers.communicator"
ADD_NORM = "sglang.srt.layers.layer_boundary.residual.add_norm"
FUSION = "sglang.srt.layers.flashinfer_comm_fusion"
# Where the gate lives, newest last; the first one found is the release's gate.
GATE_LOCATIONS = (
    (COMMUNICATOR, "apply_flashinfer_allreduce_fusion"),  # up to 0.5.20
    (ADD_NORM, "apply_flashinfer_allreduce_fusion"),  # 0.5.21
    (ADD_NORM, "flashinfer_ar_fusion_applies"),  # 0.5.22+
)
GATE_CAPABILITY = ("_is_sm90_supported", "_is_sm100_supported")
RESOLVER = "_resolve_backend"
RESOLVER_CAPABILITY = {("is_sm90_supported()", "is_sm100_supported()"),  # 0.5.14-0.5.18
                       ("get_platform().is_sm90", "get_platform().is_sm100")}  # 0.5.19+
PREFLIGHT_SIZES = "_flashinfer_trtllm_workspace_allocation_sizes"
HELPER = "_sglang_pcie_sm120_fusion_ok"
IS_SM120 = "_sglang_pcie_is_sm120"

# Inserted into the release, self-contained (the diffs must work without sglang-pcie installed).
# __ENTRY_POINTS__ becomes what the release's flashinfer_comm_fusion.py calls on flashinfer.comm.
HELPER_BLOCK = '''\
# sglang-pcie: sm120-allreduce-fusion (begin).
# SM120 (RTX PRO 6000 Blackwell) joins SM90/SM100 in FlashInfer's all-reduce fusion only when the user opted
# in (SGLang's own fusion option and SGLANG_PCIE_SM120_FUSION=1) and the fused kernel can run: peer-to-peer
# access between the GPUs, and a FlashInfer with SM12x kernels for its TRT-LLM all-reduce (FlashInfer PR
# #3903) and the entry points this release calls. Decided once per process and the same way on every TP
# rank (all of them see the same GPUs): a rank that alone fell back to NCCL would hang its peers.
_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS = __ENTRY_POINTS__
_sglang_pcie_sm120_fusion = None  # the decision, once made


def _sglang_pcie_is_sm120():
    try:
        from sglang.srt.runtime_context import get_platform
    except ImportError:  # releases before 0.5.19
        from sglang.srt.utils import is_sm120_supported

        return bool(is_sm120_supported())
    return bool(get_platform().is_sm120)


def _sglang_pcie_sm120_fusion_ok():
    global _sglang_pcie_sm120_fusion
    if _sglang_pcie_sm120_fusion is None:
        import torch

        if torch.compiler.is_compiling():
            return False  # decided in eager code only, never while Dynamo traces the gate
        _sglang_pcie_sm120_fusion = _sglang_pcie_is_sm120() and _sglang_pcie_sm120_can_fuse()
    return _sglang_pcie_sm120_fusion


def _sglang_pcie_sm120_can_fuse():
    import logging
    import os

    log = logging.getLogger("sglang_pcie.sm120_allreduce_fusion")
    opt_in = os.environ.get("SGLANG_PCIE_SM120_FUSION", "").strip().lower()
    if opt_in not in ("1", "true", "yes", "on"):
        log.info("sglang-pcie: FlashInfer all-reduce fusion stays off on SM120: SGLANG_PCIE_SM120_FUSION=1 "
                 "is not set")
        return False
    missing = _sglang_pcie_flashinfer_missing() + _sglang_pcie_peer_access_missing()
    if missing:
        log.warning("sglang-pcie: FlashInfer all-reduce fusion stays off on SM120: %s", "; ".join(missing))
        return False
    return True


def _sglang_pcie_flashinfer_missing():
    import pathlib

    try:
        import flashinfer
        import flashinfer.comm
    except Exception as exc:
        return [f"FlashInfer cannot be imported ({type(exc).__name__}: {exc})"]
    version = getattr(flashinfer, "__version__", "?")
    absent = [name for name in _SGLANG_PCIE_FLASHINFER_ENTRY_POINTS if not hasattr(flashinfer.comm, name)]
    if absent:
        return [f"flashinfer.comm {version} lacks {', '.join(absent)}"]
    build_spec = pathlib.Path(flashinfer.__file__).parent / "jit" / "comm.py"
    if 12 not in _sglang_pcie_trtllm_allreduce_majors(build_spec):
        return [f"FlashInfer {version} has no SM12x kernels for its TRT-LLM all-reduce (FlashInfer PR #3903)"]
    return []


def _sglang_pcie_trtllm_allreduce_majors(build_spec):
    """The GPU majors FlashInfer builds its TRT-LLM all-reduce for (gen_trtllm_comm_module in jit/comm.py)."""
    import ast

    try:
        tree = ast.parse(build_spec.read_text())
    except (OSError, SyntaxError):
        return []
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef) and func.name == "gen_trtllm_comm_module":
            for call in ast.walk(func):
                for keyword in getattr(call, "keywords", ()):
                    if keyword.arg == "supported_major_versions":
                        return list(ast.literal_eval(keyword.value))
    return []


def _sglang_pcie_peer_access_missing():
    import torch

    count = torch.cuda.device_count()
    pairs = [(a, b) for a in range(count) for b in range(count) if a != b]
    blocked = [(a, b) for a, b in pairs if not torch.cuda.can_device_access_peer(a, b)]
    if not blocked:
        return []
    a, b = blocked[0]
    return [f"GPU {a} has no peer-to-peer access to GPU {b} "
            f"({len(blocked)} of {len(pairs)} pairs of visible GPUs lack it)"]


# sglang-pcie: sm120-allreduce-fusion (end).
'''
GATE_COMMENT = f"# {MARKER}: SM120 as SM90 once opted in and able to run"
RESOLVER_COMMENT = f"# {MARKER}: SM120 resolves as SM90 (auto -> trtllm) once opted in and able to run"
RESOLVER_OFF = f'''\
# {MARKER}: on SM120 with a condition missing (logged once), a backend it
# could run stays off instead of failing the server start.
if {IS_SM120}() and backend in ("auto", "trtllm") and not is_multi_node:
    return None
'''
PREFLIGHT_COMMENT = f'''\
# {MARKER}: FlashInfer's TRT-LLM workspace is unicast, and GPUs without
# multicast (SM120 over PCIe) fail the multicast query.
if not {HELPER}():
'''
IMPORT_LINES = f"from {FUSION} import (  # {MARKER}\n    {HELPER},\n)\n"


class Sm120AllreduceFusion(Patch):
    id = PATCH_ID
    summary = ("FlashInfer all-reduce + residual + RMSNorm fusion on SM120 (opt-in): the gate, the backend resolver "
               "and the workspace preflight admit SM120 where it can run")
    why = ("On 8 x RTX PRO 6000 Blackwell (SM120) over PCIe the fusion is never used: the gate admits only SM90 and "
           "SM100, and from 0.5.14 the backend resolver raises for anything else, so every layer pays a plain NCCL "
           "all-reduce followed by separate residual and RMSNorm kernels.")
    upstream = ("SGLang PR #32330 (SM12x enablement, closed after a TP4 regression), issue #15650 (auto-enabled "
                "fusion crashed CUDA-graph capture without SM12x kernels), FlashInfer PR #3903 (SM12x kernels)")
    remove_when = "SGLang's gate and resolver admit SM12x (with an explicit opt-in)"
    releases = ">=0.5.8,<=0.5.23"
    upstream_check = "the gate's capability test already names SM120 / SM12x / Blackwell besides SM90 and SM100"
    runtime_method = ("post-import hooks compile the rewritten source of the gate module and flashinfer_comm_fusion, "
                      "define the SM120 helper there and swap __code__ of the gate, the resolver and the workspace "
                      "preflight in place (callers that imported the gate by name see it too)")
    static_method = ("ast: the gate returns `(_is_sm90_supported or _is_sm100_supported) and ...`; the resolver "
                     "raises under `if not (<sm90> or <sm100>)`; the multicast query sits in the preflight loop")
    targets = (FUSION, COMMUNICATOR, ADD_NORM)

    # -- static

    def check_source(self, tree: SourceTree) -> Result:
        try:
            status, detail, _ = _rewrite(tree)
        except Drift as exc:
            return Result(DRIFTED, str(exc))
        return Result(status, detail)

    def rewrite(self, tree: SourceTree) -> dict[str, str]:
        status, _, sources = _rewrite(tree)
        return sources if status == APPLICABLE else {}

    # -- runtime

    def apply(self, module: ModuleType) -> Result:
        name = module.__name__
        source = inspect.getsource(module)
        if MARKER in source:
            return Result(APPLIED, "source carries the sglang-pcie diff")
        status, detail, sources = _rewrite_installed(installed_sglang_root())
        if status != APPLICABLE:
            return Result(status, detail)
        if name not in sources:
            return Result(NOT_APPLICABLE, f"nothing to change in {name} on this release")
        return _install(module, source, sources[name])

    def check_runtime(self, modules: Mapping[str, ModuleType]) -> Result:
        status, detail, sources = _rewrite_installed(installed_sglang_root())
        if status != APPLICABLE:
            return Result(status, detail)
        for name, new_source in sources.items():
            module = modules.get(name)
            if module is None:
                return Result(DRIFTED, f"{name} was not imported")
            changed, added = _top_level_changes(inspect.getsource(module), new_source)
            unpatched = [n for n in changed + _function_names(added)
                         if not is_patched(getattr(module, n, None), self.id)]
            if unpatched:
                return Result(DRIFTED, f"{name}: not patched in this process: {', '.join(unpatched)}")
        gate_module, gate = _find_gate(SourceTree(installed_sglang_root()))
        return Result(APPLIED, f"{gate_module.rsplit('.', 1)[1]}.{gate} admits SM120 when opted in and able to run")


PATCH = Sm120AllreduceFusion()


# -- the source transformation (shared by the diffs, the static check and the runtime patch)

def _rewrite(tree: SourceTree) -> tuple[str, str, dict[str, str]]:
    """(status, detail, {module: new source}); raises Drift where the release's shape is not the expected one."""
    gate_module, gate_name = _find_gate(tree)
    gate_source = tree.source(gate_module)
    fusion_source = tree.source(FUSION)
    if fusion_source is None:
        raise Drift(f"{FUSION} is missing")
    if MARKER in gate_source or MARKER in fusion_source:
        return APPLIED, "source carries the sglang-pcie diff", {}
    gate_tree, fusion_tree = ast.parse(gate_source), ast.parse(fusion_source)
    capability = _gate_capability(gate_tree, gate_module, gate_name)
    if capability is None:
        return UPSTREAM, f"{gate_name} already admits more than SM90/SM100", {}

    edits = {gate_module: _Edits(gate_source), FUSION: _Edits(fusion_source)}
    gate_edits = edits[gate_module]
    gate_edits.insert_at(capability.end_lineno, capability.end_col_offset, f" or {HELPER}()")
    gate_edits.insert_lines(capability.lineno, GATE_COMMENT + "\n")
    parts = [f"{gate_module.rsplit('.', 1)[1]}.{gate_name}"]
    if _resolver_edits(fusion_tree, edits[FUSION]):
        parts.append(RESOLVER)
    if _preflight_edits(fusion_tree, edits[FUSION]):
        parts.append(PREFLIGHT_SIZES)

    # The helper goes into flashinfer_comm_fusion when the gate module already imports from it (0.5.10+): one
    # decision and one log line per process.  Up to 0.5.9 the gate module alone needs it and does not import it.
    fusion_import = _top_level_import_from(gate_tree, FUSION)
    host = FUSION if fusion_import is not None else gate_module
    if fusion_import is not None:
        gate_edits.insert_lines(fusion_import.end_lineno + 1, IMPORT_LINES)
    host_tree = fusion_tree if host == FUSION else gate_tree
    entry_points = "".join(f"\n    {name!r}," for name in _flashinfer_entry_points(fusion_tree))
    block = HELPER_BLOCK.replace("__ENTRY_POINTS__", f"({entry_points}\n)")
    edits[host].insert_lines(_first_definition_line(host_tree, edits[host].lines), block + "\n\n")

    sources = {module: e.text() for module, e in edits.items() if e.changed}
    detail = f"patches {', '.join(parts)}; helper in {host.rsplit('.', 1)[1]}"
    return APPLICABLE, detail, sources


def _find_gate(tree: SourceTree) -> tuple[str, str]:
    for module, name in GATE_LOCATIONS:
        if tree.function(module, name) is not None:
            return module, name
    raise Drift("no fusion gate: " + ", ".join(f"{m}.{n}" for m, n in GATE_LOCATIONS) + " are all absent")


def _gate_capability(gate_tree: ast.Module, module: str, name: str) -> ast.BoolOp | None:
    """The gate's `(_is_sm90_supported or _is_sm100_supported)`; None when it admits more GPUs already."""
    func = _function(gate_tree, name)
    body = [s for s in func.body if not _is_docstring(s)]
    ret = body[0] if len(body) == 1 else None
    test = ret.value if isinstance(ret, ast.Return) else None
    first = test.values[0] if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else None
    if not (isinstance(first, ast.BoolOp) and isinstance(first.op, ast.Or)):
        raise Drift(f"{module}.{name} does not return `(<capability>) and ...`")
    operands = tuple(ast.unparse(v) for v in first.values)
    if operands == GATE_CAPABILITY:
        return first
    if len(operands) > 2 and operands[:2] == GATE_CAPABILITY and any(
            word in op.lower() for op in operands[2:] for word in ("sm120", "sm12", "blackwell")):
        return None
    raise Drift(f"{module}.{name} checks {' or '.join(operands)}, not {' or '.join(GATE_CAPABILITY)}")


def _resolver_edits(fusion_tree: ast.Module, edits: _Edits) -> bool:
    """From 0.5.14: admit SM120 in `_resolve_backend`; absent before (True when edited)."""
    func = _function(fusion_tree, RESOLVER)
    if func is None:
        if _function(fusion_tree, "resolve_flashinfer_allreduce_fusion_backend") is not None:
            raise Drift(f"{FUSION}: resolve_flashinfer_allreduce_fusion_backend without {RESOLVER}")
        return False
    args = [a.arg for a in func.args.args]
    if args[:2] != ["backend", "is_multi_node"]:
        raise Drift(f"{FUSION}.{RESOLVER}({', '.join(args)}) does not take (backend, is_multi_node)")
    for stmt in func.body:
        test = stmt.test if isinstance(stmt, ast.If) else None
        if not (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
                and isinstance(test.operand, ast.BoolOp) and isinstance(test.operand.op, ast.Or)):
            continue
        capability = test.operand
        if tuple(ast.unparse(v) for v in capability.values) not in RESOLVER_CAPABILITY:
            continue
        if not (len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Raise)):
            raise Drift(f"{FUSION}.{RESOLVER}: the SM90/SM10x check does not just raise")
        raise_stmt = stmt.body[0]
        edits.insert_at(capability.end_lineno, capability.end_col_offset, f" or {HELPER}()")
        edits.insert_lines(stmt.lineno, RESOLVER_COMMENT + "\n")
        edits.insert_lines(raise_stmt.lineno, RESOLVER_OFF)
        return True
    raise Drift(f"{FUSION}.{RESOLVER} has no `if not (<sm90> or <sm100>): raise ...`")


def _preflight_edits(fusion_tree: ast.Module, edits: _Edits) -> bool:
    """From 0.5.11: skip the multicast rounding of the workspace preflight on SM120 (True when edited)."""
    users = sorted({f.name for f in fusion_tree.body if isinstance(f, ast.FunctionDef)
                    and any(isinstance(n, ast.Attribute) and n.attr == "cuMulticastGetGranularity"
                            for n in ast.walk(f))})
    if not users:
        return False
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
        edits.indent(body[start].lineno, body[end].end_lineno)
        edits.insert_lines(body[start].lineno, PREFLIGHT_COMMENT)
        return True
    raise Drift(f"{FUSION}.{PREFLIGHT_SIZES}: no loop rounding allocation_size to mc_granularity")


def _flashinfer_entry_points(fusion_tree: ast.Module) -> tuple[str, ...]:
    """What the release calls on flashinfer.comm (imported there as `comm`, kept as `_flashinfer_comm`)."""
    names = {n.attr for n in ast.walk(fusion_tree) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id in ("comm", "_flashinfer_comm")}
    if not names:
        raise Drift(f"{FUSION} calls nothing on flashinfer.comm")
    return tuple(sorted(names))


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) > 1:
        raise Drift(f"{name} is defined {len(found)} times")
    return found[0] if found else None


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _top_level_import_from(tree: ast.Module, module: str) -> ast.ImportFrom | None:
    return next((n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == module and n.level == 0), None)


def _first_definition_line(tree: ast.Module, lines: list[str]) -> int:
    """Line of the module's first top-level def/class, moved up over its decorators and the comments above it."""
    first = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    line = min([first.lineno] + [d.lineno for d in first.decorator_list])
    while line > 1 and lines[line - 2].lstrip().startswith("#"):
        line -= 1
    return line


class _Edits:
    """Insertions into a source text by (1-based) line and column, applied bottom-up so positions stay valid."""

    def __init__(self, text: str):
        self.lines = text.splitlines(keepends=True)
        self._edits = []  # (line, order, column, kind, payload); order: same-line edits before inserted lines

    @property
    def changed(self) -> bool:
        return bool(self._edits)

    def insert_at(self, line: int, column: int, text: str):
        """Insert ``text`` at an ast position (``column`` counts UTF-8 bytes, as ast does)."""
        self._edits.append((line, 1, column, "at", text))

    def insert_lines(self, before: int, text: str):
        """Insert lines before line ``before``, indented as it is now; ``text`` is written unindented."""
        target = self.lines[before - 1] if before <= len(self.lines) else ""
        indent = target[:len(target) - len(target.lstrip())] if target.strip() else ""
        lines = [indent + line if line.strip() else line for line in text.splitlines(keepends=True)]
        self._edits.append((before, 0, 0, "lines", lines))

    def indent(self, first: int, last: int):
        self._edits.append((first, 1, -1, "indent", last))

    def text(self) -> str:
        lines = list(self.lines)
        for line, _, column, kind, payload in sorted(self._edits, key=lambda e: e[:3], reverse=True):
            i = line - 1
            if kind == "at":
                raw = lines[i].encode()
                lines[i] = (raw[:column] + payload.encode() + raw[column:]).decode()
            elif kind == "indent":
                for j in range(i, payload):
                    lines[j] = "    " + lines[j] if lines[j].strip() else lines[j]
            else:
                lines[i:i] = payload
        return "".join(lines)


# -- the runtime side: the same text, compiled into the live modules

@functools.lru_cache(maxsize=4)
def _rewrite_installed(root: Path) -> tuple[str, str, dict[str, str]]:
    try:
        return _rewrite(SourceTree(root))
    except Drift as exc:
        return DRIFTED, str(exc), {}


def _install(module: ModuleType, old_source: str, new_source: str) -> Result:
    """Make ``module`` run ``new_source``'s version of what the rewrite changed; all-or-nothing."""
    name, file = module.__name__, module.__file__
    changed, added = _top_level_changes(old_source, new_source)
    if any(is_patched(module.__dict__.get(n), PATCH_ID) for n in changed + _function_names(added)):
        return Result(APPLIED, "already applied in this process")
    patched_name = f"{file} (patched by sglang-pcie {PATCH_ID})"
    old_code = compile(old_source, file, "exec", dont_inherit=True)
    new_code = compile(new_source, patched_name, "exec", dont_inherit=True)
    functions = {}
    for func_name in changed:
        func = module.__dict__.get(func_name)
        if not isinstance(func, FunctionType):
            raise Drift(f"{name}.{func_name} is not a function in this process")
        if func.__code__ != _code_of(old_code, func_name):
            raise Drift(f"{name}.{func_name} in memory is not the one in {file} (changed by someone else?)")
        functions[func] = _code_of(new_code, func_name)
    # New functions take their code from the whole new module too: the compiler's output depends on the module
    # around a function (e.g. `logging.getLogger` compiles differently where `logging` is imported at top level),
    # and the code must be the very code the diffed file compiles to.
    new_functions = {}
    for node in added:
        if isinstance(node, ast.FunctionDef):
            if node.decorator_list or node.args.defaults or node.args.kw_defaults:
                raise Drift(f"{node.name}: the runtime patch defines plain functions only")
            new_functions[node.name] = _code_of(new_code, node.name)
        elif isinstance(node, ast.ImportFrom) and not hasattr(sys.modules.get(node.module), HELPER):
            raise Drift(f"{node.module} does not define {HELPER} (its patch did not apply)")
    statements = [node for node in added if not isinstance(node, ast.FunctionDef)]
    statements_code = compile(ast.Module(body=statements, type_ignores=[]), patched_name, "exec", dont_inherit=True)
    # Nothing fails from here on: define the helper (or import it), then swap the code.
    exec(statements_code, module.__dict__)
    for func_name, code in new_functions.items():
        module.__dict__[func_name] = mark(FunctionType(code, module.__dict__, func_name), PATCH_ID)
    for func, code in functions.items():
        func.__code__ = code
        mark(func, PATCH_ID)
    # Tracebacks and inspect.getsource() of the swapped code show the patched text.
    linecache.cache[patched_name] = (len(new_source), None, new_source.splitlines(keepends=True), patched_name)
    return Result(APPLIED, f"patched {', '.join(changed) or 'nothing'}; defined {', '.join(_names(added))}")


def _top_level_changes(old_source: str, new_source: str) -> tuple[list[str], list[ast.stmt]]:
    """(names of top-level functions whose body differs, top-level statements only in the new source)."""
    old_nodes = ast.parse(old_source).body
    old_dumps = [ast.dump(n) for n in old_nodes]
    old_functions = {n.name for n in old_nodes if isinstance(n, ast.FunctionDef)}
    changed, added = [], []
    for node in ast.parse(new_source).body:
        dump = ast.dump(node)
        if dump in old_dumps:
            old_dumps.remove(dump)
        elif isinstance(node, ast.FunctionDef) and node.name in old_functions:
            changed.append(node.name)
        else:
            added.append(node)
    if len(old_dumps) != len(changed):
        raise Drift("the rewrite removed top-level statements, which the runtime patch cannot do")
    return changed, added


def _code_of(module_code: CodeType, name: str) -> CodeType:
    found = [c for c in module_code.co_consts if isinstance(c, CodeType) and c.co_name == name]
    if len(found) != 1:
        raise Drift(f"{name} is compiled {len(found)} times in {module_code.co_filename}")
    return found[0]


def _defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.ImportFrom):
        return [a.asname or a.name for a in node.names]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    return []


def _names(nodes: list[ast.stmt]) -> list[str]:
    return [n for node in nodes for n in _defined_names(node)]


def _function_names(nodes: list[ast.stmt]) -> list[str]:
    """Functions the added statements define or import (the helper), which the patch marks."""
    return [n for node in nodes if isinstance(node, (ast.FunctionDef, ast.ImportFrom)) for n in _defined_names(node)]
