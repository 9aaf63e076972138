"""eagle3-profile: EAGLE3_PROFILE=1 times each phase of SGLang's EAGLE speculative decoding cycle.

The timers, statistics and outputs live in ``sglang_pcie.eagle_profiler``; this module says which worker methods
are which phase in each release, wraps them at import (runtime) or writes the decorator lines that do the same
(versioned diffs), and checks both.
"""
from __future__ import annotations

import ast
import inspect
from types import ModuleType
from typing import Mapping

from sglang_pcie import eagle_profiler
from sglang_pcie.base import (APPLICABLE, APPLIED, DIFF_MARKER, DISABLED, DRIFTED, NOT_APPLICABLE, Drift, Patch,
                              Result, SourceTree, is_patched)

V1 = "sglang.srt.speculative.eagle_worker"
V2 = "sglang.srt.speculative.eagle_worker_v2"
# module -> class -> method -> phase.  The same methods in every release 0.5.8-0.5.23 (v1 up to 0.5.12.post1).
TARGETS = {
    V1: {"EAGLEWorker": {"forward_batch_generation": "cycle", "draft": "draft", "verify": "verify",
                         "forward_draft_extend_after_decode": "draft_extend"}},
    V2: {"EAGLEWorkerV2": {"forward_batch_generation": "cycle", "verify": "verify"},
         "EagleDraftWorker": {"draft": "draft", "_draft_extend_for_decode": "draft_extend"}},
}
# The name the diff defines at module level; its presence means the source carries the diff.
DIFF_DECORATOR = "_sglang_pcie_profile_phase"
COMMENT = f"# {DIFF_MARKER} eagle3-profile"
LOGGER_LINE = "logger = logging.getLogger(__name__)"


def _methods(module_name):
    for cls_name, methods in TARGETS[module_name].items():
        for method, phase in methods.items():
            yield cls_name, method, phase


class Eagle3Profile(Patch):
    id = "eagle3-profile"
    summary = "EAGLE3_PROFILE=1: per-phase timers (draft, verify, re-extend, cycle) for SGLang's EAGLE workers"
    why = ("A per-phase breakdown of one speculative cycle (draft 0.89 ms, verify 18.67 ms, re-extend 0.28 ms) "
           "showed that verify communication, not drafter quality, was the bottleneck. SGLang has no such "
           "breakdown (its speculative spans are missing on the spec-v2 paths) and hand-added timers are lost at "
           "each upgrade.")
    upstream = "none: SGLang's speculative tracing spans do not time the spec-v2 phases on the GPU"
    remove_when = "SGLang reports GPU-timed per-phase figures for its EAGLE workers itself"
    releases = ">=0.5.8,<=0.5.23"
    upstream_check = ("never upstream so far; statically: the worker modules exist with the phase methods and the "
                      "cycle method calls each phase method")
    runtime_method = ("post-import hook on eagle_worker / eagle_worker_v2 replaces the phase methods of "
                      "EAGLEWorker, EAGLEWorkerV2 and EagleDraftWorker by sglang_pcie.eagle_profiler.wrap(...) "
                      "wrappers; only when EAGLE3_PROFILE=1")
    static_method = "ast: classes and methods present, the cycle method calls every phase method"
    targets = (V1, V2)

    def disabled_reason(self, settings) -> str | None:
        return super().disabled_reason(settings) or eagle_profiler.disabled_reason(settings)

    # -- static

    def _inspect(self, tree: SourceTree):
        """(module name -> source) of the worker modules present, and a list of shape problems."""
        present, problems = {}, []
        for module in TARGETS:
            source = tree.source(module)
            if source is None:
                continue
            present[module] = source
            problems.extend(f"{module}: {p}" for p in _shape_problems(tree.tree(module), module))
        return present, problems

    def check_source(self, tree: SourceTree) -> Result:
        present, problems = self._inspect(tree)
        if not present:
            return Result(NOT_APPLICABLE, "no EAGLE worker module (srt/speculative/eagle_worker*.py)")
        if problems:
            return Result(DRIFTED, "; ".join(problems))
        if all(f"{DIFF_MARKER} {self.id}" in source for source in present.values()):
            return Result(APPLIED, "source carries the sglang-pcie diff")
        return Result(APPLICABLE, "times " + "; ".join(_describe(m) for m in present))

    def rewrite(self, tree: SourceTree) -> dict[str, str]:
        if self.check_source(tree).status != APPLICABLE:
            return {}
        present, _ = self._inspect(tree)
        return {module: _add_decorators(source, tree.tree(module), module) for module, source in present.items()
                if f"{DIFF_MARKER} {self.id}" not in source}

    # -- runtime

    def apply(self, module: ModuleType) -> Result:
        if module.__name__ not in TARGETS:
            return Result(NOT_APPLICABLE, f"{module.__name__} is not an EAGLE worker module")
        if hasattr(module, DIFF_DECORATOR):
            return Result(APPLIED, "source carries the sglang-pcie diff")
        found = []
        for cls_name, method, phase in _methods(module.__name__):  # check everything before changing anything
            cls = getattr(module, cls_name, None)
            if not inspect.isclass(cls):
                raise Drift(f"{module.__name__}.{cls_name} is missing")
            function = cls.__dict__.get(method)
            if not inspect.isfunction(function):
                raise Drift(f"{cls_name}.{method} is missing or not a plain function")
            found.append((cls, method, phase, function))
        for cls, method, phase, function in found:
            if not is_patched(function, self.id):
                setattr(cls, method, eagle_profiler.wrap(function, phase))
        return Result(APPLIED, _describe(module.__name__))

    def check_runtime(self, modules: Mapping[str, ModuleType]) -> Result:
        from sglang_pcie.settings import load_settings

        reason = self.disabled_reason(load_settings())
        if reason:
            return Result(DISABLED, reason)
        present = [name for name in TARGETS if name in modules]
        if not present:
            return Result(NOT_APPLICABLE, "no EAGLE worker module in this release")
        missing = [f"{cls_name}.{method}" for name in present for cls_name, method, _ in _methods(name)
                   if not is_patched(getattr(getattr(modules[name], cls_name, None), method, None), self.id)]
        if missing:
            return Result(DRIFTED, "not timed: " + ", ".join(missing))
        return Result(APPLIED, "timing " + "; ".join(_describe(name) for name in present))


def _describe(module_name) -> str:
    kind = "v2" if module_name == V2 else "v1"
    return f"{kind} " + ", ".join(f"{c}.{m} ({p})" for c, m, p in _methods(module_name))


def _class_functions(tree: ast.Module, cls_name):
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    if cls is None:
        return None
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _shape_problems(tree: ast.Module, module_name) -> list[str]:
    problems = []
    functions = {}
    for cls_name, method, _ in _methods(module_name):
        members = _class_functions(tree, cls_name)
        if members is None:
            problems.append(f"class {cls_name} missing")
        elif method not in members:
            problems.append(f"{cls_name}.{method} missing")
        else:
            functions[method] = members[method]
    if not any(isinstance(n, ast.Assign) and ast.unparse(n) == LOGGER_LINE for n in tree.body):
        problems.append(f"no module-level `{LOGGER_LINE}`")
    cycle = next((m for _, m, p in _methods(module_name) if p == "cycle"), None)
    if cycle in functions:  # a phase the cycle never calls would silently read zero
        called = {n.func.attr for n in ast.walk(functions[cycle])
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        problems.extend(f"{cycle} no longer calls {m}()" for _, m, p in _methods(module_name)
                        if p != "cycle" and m not in called)
    return problems


def _add_decorators(source: str, tree: ast.Module, module_name: str) -> str:
    """The module's source with the import guard after its logger and a decorator above each timed method."""
    lines = source.splitlines(keepends=True)
    inserts = []  # (index of the line to insert before, text)
    logger = next(n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n) == LOGGER_LINE)
    inserts.append((logger.end_lineno, (
        f"{COMMENT}: per-phase timers when EAGLE3_PROFILE=1; identity otherwise, or without sglang-pcie\n"
        f"try:  {COMMENT}\n"
        f"    from sglang_pcie.eagle_profiler import profile_phase as {DIFF_DECORATOR}\n"
        f"except ImportError:  {COMMENT}\n"
        f"    def {DIFF_DECORATOR}(phase):  {COMMENT}\n"
        f"        return lambda function: function\n")))
    for cls_name, method, phase in _methods(module_name):
        node = _class_functions(tree, cls_name)[method]
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        indent = lines[node.lineno - 1][:node.col_offset]
        inserts.append((first - 1, f'{indent}@{DIFF_DECORATOR}("{phase}")  {COMMENT}\n'))
    for index, text in sorted(inserts, reverse=True):
        lines.insert(index, text)
    return "".join(lines)


PATCH = Eagle3Profile()
