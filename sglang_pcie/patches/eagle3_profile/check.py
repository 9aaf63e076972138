"""eagle3-profile: EAGLE3_PROFILE=1 times each phase of SGLang's EAGLE speculative decoding cycle.

The timers, statistics and outputs live in ``payload.py``; which worker methods are which phase, and the install
that wraps them when a worker module is imported, in ``install.py`` (both run in SGLang). This module checks each
release's source against them, writes the decorator lines that do the same (versioned diffs) and checks the runtime.
"""
from __future__ import annotations

import ast
import re
from types import ModuleType
from typing import Mapping

from sglang_pcie.patching.engine import (APPLICABLE, APPLIED, DIFF_MARKER, DISABLED, DRIFTED, NOT_APPLICABLE, Patch,
                                         Result, is_patched)
from sglang_pcie.patching import baked, register
from sglang_pcie.patching.edits import SourceEdits
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patching.source_text import attribute_and_keyword_names, in_release_span
from sglang_pcie.patches.eagle3_profile import payload as eagle_profiler
from sglang_pcie.patches.eagle3_profile.install import TARGETS, V1, V2, describe as _describe, methods as _methods

# The covered releases that have each worker module (first, last; None: still there in the newest). Where a
# release in that span lacks the module, it moved or was renamed: drift, not a release without EAGLE.
MODULE_RELEASES = {V1: (register.COVERED_RELEASES[0], "0.5.12.post1"), V2: (register.COVERED_RELEASES[0], None)}
# What the profiler reads on the cycle's result to count accepted tokens (any one of them, per module); keep in
# step with sglang_pcie.patches.eagle3_profile.payload (Profiler._count_tokens).
RESULT_FIELDS = {V1: eagle_profiler.V1_ACCEPT_FIELDS, V2: ("accept_lens",)}
PATCH_ID = eagle_profiler.PATCH_ID
# The name the diff defines at module level; its presence means the source carries the diff.
DIFF_DECORATOR = baked.guard_name(PATCH_ID)
COMMENT = f"# {DIFF_MARKER} {PATCH_ID}"
HELPER_DEPTH = 4  # how deep the cycle's own helper methods are followed when looking for the phase calls


class Eagle3Profile(Patch):
    id = eagle_profiler.PATCH_ID

    # -- static

    def _inspect(self, tree: SourceTree):
        """(module name -> source) of the worker modules present, and a list of shape problems."""
        present, problems = {}, []
        for module in TARGETS:
            source = tree.source(module)
            if source is None:
                if _expected(module, tree.version):
                    problems.append(_missing_module(tree, module))
                continue
            present[module] = source
            problems.extend(f"{module}: {p}" for p in _shape_problems(tree, module))
        return present, problems

    def check_source(self, tree: SourceTree) -> Result:
        present, problems = self._inspect(tree)
        if problems:
            return Result(DRIFTED, "; ".join(problems))
        if not present:
            return Result(NOT_APPLICABLE, "no EAGLE worker module (srt/speculative/eagle_worker*.py)")
        if all(f"{DIFF_MARKER} {self.id}" in tree.source(m) for m in _edited_modules(tree, present)):
            return Result(APPLIED, "source carries the sglang-pcie diff")
        return Result(APPLICABLE, "times " + "; ".join(_describe(m, tree) for m in present)
                      + "".join(_token_note(tree, m) for m in present))

    def rewrite(self, tree: SourceTree) -> dict[str, str]:
        if self.check_source(tree).status != APPLICABLE:
            return {}
        present, _ = self._inspect(tree)
        edits = _edits(tree, present)
        return {module: _add_decorators(tree, module, items) for module, items in edits.items()
                if f"{DIFF_MARKER} {self.id}" not in tree.source(module)}

    # -- runtime

    def check_runtime(self, modules: Mapping[str, ModuleType], settings) -> Result:
        reason = self.disabled_reason(settings)
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


def _expected(module: str, version: str) -> bool:
    """Whether every covered release like ``version`` has ``module`` (False where the version is unknown)."""
    return in_release_span(version, *MODULE_RELEASES[module])


def _missing_module(tree: SourceTree, module: str) -> str:
    first, last = MODULE_RELEASES[module]
    span = f"{first} to {last}" if last else f"from {first} on"
    classes = "|".join(TARGETS[module])
    moved = sorted({f"{p.relative_to(tree.root).as_posix()}" for p in (tree.root / "sglang").rglob("*.py")
                    if re.search(rf"^class ({classes})\b", p.read_text(encoding="utf-8", errors="replace"), re.M)}
                   ) if (tree.root / "sglang" / "srt" / "speculative").is_dir() else []
    where = f"; its classes are now defined in {', '.join(moved)}" if moved else ""
    return f"{module} is missing (every covered release {span} has it: moved or renamed?){where}"


def _shape_problems(tree: SourceTree, module_name) -> list[str]:
    problems = []
    functions = {}
    for cls_name, method, _ in _methods(module_name):
        if tree.find_class(module_name, cls_name) is None:
            problems.append(f"class {cls_name} missing")
            continue
        found = tree.method(module_name, cls_name, method, concrete=True)
        if found is None:
            problems.append(f"{cls_name}.{method} missing")
        elif isinstance(found[2], ast.AsyncFunctionDef):
            problems.append(f"{cls_name}.{method} is a coroutine function now")
        else:
            functions[method] = (cls_name, found)
    cycle = next((m for _, m, p in _methods(module_name) if p == "cycle"), None)
    if cycle in functions:  # a phase the cycle never reaches would silently read zero
        called = _reached_calls(tree, module_name, functions[cycle][0], functions[cycle][1][2])
        problems.extend(f"{cycle} no longer calls {m}()" for _, m, p in _methods(module_name)
                        if p != "cycle" and m not in called)
    return problems


def _token_note(tree: SourceTree, module_name) -> str:
    """Where the cycle's result no longer carries the field the profiler counts accepted tokens from, the
    timers still run but the accept length reads null: said in the detail, not a failure."""
    names = attribute_and_keyword_names(tree.tree(module_name))
    fields = RESULT_FIELDS[module_name]
    if any(field in names for field in fields):
        return ""
    kind = "v2" if module_name == V2 else "v1"
    return (f"; {kind} accept length unknown: the worker's result carries none of {', '.join(fields)}, which "
            "the profiler counts accepted tokens from")


def _reached_calls(tree: SourceTree, module: str, cls_name: str, cycle: ast.FunctionDef) -> set[str]:
    """Names of the methods the cycle calls, directly or through helpers: its class's own methods, the other timed
    classes' methods (``self.draft_worker.run(batch)``) and the module's functions. A decode branch moved into
    ``self._forward_decode(batch)`` still reaches its phases. Phase methods themselves are not looked into: a phase
    reached only from inside another would be timed within it."""
    phases = {m for _, m, _ in _methods(module)}
    classes = list(TARGETS[module])
    called: set[str] = set()
    queue, seen = [(cycle, cls_name, 0)], set()
    while queue:
        function, owner, depth = queue.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute):
                name = node.func.attr
                called.add(name)
                on_self = isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
                for cls in [owner] if on_self else [c for c in classes if c != owner]:
                    found = tree.method(module, cls, name, concrete=True) if name not in phases else None
                    if found and depth < HELPER_DEPTH:
                        queue.append((found[2], cls, depth + 1))
            elif isinstance(node.func, ast.Name):
                called.add(node.func.id)
                helper = tree.function(module, node.func.id)
                if helper is not None and depth < HELPER_DEPTH:
                    queue.append((helper, owner, depth + 1))
    return called


def _guard_line(module_tree: ast.Module) -> int:
    """Index of the line after the last top-level statement before the module's first def/class (its logger,
    in every covered release): where the import guard goes, before any class body is evaluated."""
    body = module_tree.body
    first = next(i for i, n in enumerate(body) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    return body[first - 1].end_lineno if first else 0


def _edits(tree: SourceTree, present) -> dict[str, list[tuple[ast.ClassDef, str, str, ast.FunctionDef | None]]]:
    """Where the diff writes, per module: (class, method, phase, the method's own ast or None when inherited).
    A timed class is decorated where it is defined, which may be a module the worker module imports it from."""
    edits: dict[str, list] = {}
    for module in present:
        for cls_name, method, phase in _methods(module):
            cls_module, cls = tree.find_class(module, cls_name)
            own = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method), None)
            edits.setdefault(cls_module, []).append((cls, method, phase, own))
    return edits


def _edited_modules(tree: SourceTree, present) -> list[str]:
    return list(_edits(tree, present))


def _add_decorators(tree: SourceTree, module_name: str, items) -> str:
    """The module's source with the import guard before its first definition and a decorator above each timed
    method (or, for an inherited one, a decorated override in the class that calls the inherited method)."""
    edits = SourceEdits(tree.source(module_name))
    edits.insert_lines(_guard_line(tree.tree(module_name)) + 1, baked.guard_block(PATCH_ID), indent="")
    for cls, method, phase, own in items:
        if own is not None:
            first = min([own.lineno] + [d.lineno for d in own.decorator_list])
            edits.insert_lines(first, baked.decorator(PATCH_ID, phase))
        else:  # inherited: time this class's calls, as the runtime patch does by wrapping it on this class
            edits.insert_lines(cls.end_lineno + 1, (
                f"\n{baked.decorator(PATCH_ID, phase)}"
                f"def {method}(self, *args, **kwargs):  {COMMENT}: times the inherited method\n"
                f"    return super().{method}(*args, **kwargs)  {COMMENT}\n"), indent=" " * (cls.col_offset + 4))
    return edits.text()


PATCH = Eagle3Profile()
