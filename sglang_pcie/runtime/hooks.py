"""Hook points as data, and the one way a patch is applied in a process.

A wrap patch's row in ``patch_table`` lists its ``Hook``s: the module, the member (``"function"`` or
``"Class.method"``), the parameters it must take, what it says while in effect. From that list alone this module
installs the patch (``install``: every hook's shape checked before any is wrapped, then ``wrapping.wrap_member``
with the row's payload) and answers whether it is in effect (``check``: one answer for drift). The static side
(``patching/``) derives the baked diff's lines and the ``marked`` candidates from the same list.

``apply`` is the template every patch passes when one of its target modules is imported, hooks or not: a module
whose source carries the patch's baked diff is left alone, a release older than the patch covers is not touched,
and only then does the install run. A patch without hooks (a code swap, a profiler with per-release method lists)
names its install in its row (``install``: a module of its folder that runs in SGLang), imported here only then.

This module and what it imports run in every SGLang process with the overlay on: nothing of ``patching/``.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from types import ModuleType
from typing import Mapping

from sglang_pcie.runtime import patch_table, wrapping
from sglang_pcie.runtime.baked import guard_name, payload_of
from sglang_pcie.runtime.results import (APPLIED, DIFF_MARKER, DISABLED, DRIFTED, NOT_APPLICABLE, Drift, Result,
                                         is_patched)

BAKED = "source carries the sglang-pcie diff"


def apply(row: patch_table.Row, module: ModuleType, settings) -> Result:
    """Patch ``module`` (one of the row's targets, just imported): the same three steps for every patch."""
    if carries_diff(row.id, module):
        return Result(APPLIED, BAKED)
    outside = release_gate(row, getattr(sys.modules.get("sglang"), "__version__", None))
    if outside is not None:
        return outside
    return run_install(row, module, settings)


def run_install(row: patch_table.Row, module: ModuleType, settings) -> Result:
    """The row's install on ``module``: from its hooks, or the function its ``install`` names."""
    if row.hooks:
        return install(row, module, settings)
    return _call(row.install, module, settings)


def carries_diff(patch_id: str, module: ModuleType) -> bool:
    """Whether ``module``'s source holds the patch's baked diff: its ``# sglang-pcie: <id>`` lines, the one marker
    every diff carries (the static checks look for the same)."""
    try:
        return f"{DIFF_MARKER} {patch_id}" in inspect.getsource(module)
    except (OSError, TypeError):  # no source file (a frozen or compiled-only module): nothing baked in
        return False


def release_bounds(row) -> tuple[str, str]:
    """The first and last release a patch covers, from its ``releases`` specifier (``>=FIRST,<=LAST``)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    specifiers = SpecifierSet(row.releases)
    lows = [s.version for s in specifiers if s.operator in (">=", "==")]
    highs = [s.version for s in specifiers if s.operator in ("<=", "==")]
    if not lows or not highs:
        raise ValueError(f"{row.id}: releases {row.releases!r} does not name its first and last release")
    return max(lows, key=Version), min(highs, key=Version)


def release_gate(row, version: str | None) -> Result | None:
    """``not-applicable`` naming the range where ``version`` is older than the first release the patch covers (it
    was never written for it); None otherwise, also for a version that cannot be read. Statically and at runtime
    alike."""
    from packaging.version import InvalidVersion, Version

    first, last = release_bounds(row)
    try:
        older = version is not None and Version(version) < Version(first)
    except InvalidVersion:
        return None
    if older:
        return Result(NOT_APPLICABLE, f"sglang {version} is older than the releases this patch covers "
                                      f"({first} to {last})")
    return None


def _call(reference: str, *args):
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)(*args)


def _located(hook: patch_table.Hook, module: ModuleType):
    """(owner, name, label): where the hook's member is to be wrapped in ``module`` (a class, or the module for a
    function), the member's name and how details name it. Raises ``Drift`` where the owner is missing."""
    if not hook.cls:
        return module, hook.name, hook.member
    cls = getattr(module, hook.cls, None)
    if not inspect.isclass(cls):
        raise Drift(f"{module.__name__}.{hook.cls} is missing")
    owner = _call(hook.owner, module, cls) if hook.owner else cls
    label = hook.cls if owner is cls else f"{owner.__module__}.{owner.__qualname__}"
    return owner, hook.name, f"{label}.{hook.name}"


def install(row: patch_table.Row, module: ModuleType, settings) -> Result:
    """Wrap every hook of ``row`` in ``module`` with the row's payload, all or nothing: each shape is checked
    before anything is wrapped. A member already carrying the patch's mark is left as it is."""
    hooks = [hook for hook in row.hooks if hook.module == module.__name__]
    found = []
    for hook in hooks:
        owner, name, label = _located(hook, module)
        function = vars(owner).get(name) if hook.own else wrapping.member(owner, name)
        if not inspect.isfunction(function):
            raise Drift(f"{module.__name__}.{hook.member} is missing" if hook.own or not hook.cls
                        else f"{label} is missing or not a plain function")
        if not is_patched(function, row.id) and hook.parameters:
            taken = tuple(inspect.signature(inspect.unwrap(function)).parameters)[:len(hook.parameters)]
            if taken != hook.parameters:
                raise Drift(f"{label} takes ({', '.join(taken)}), not ({', '.join(hook.parameters)})")
        problem = _call(hook.problem, module) if hook.problem else None
        if problem:
            raise Drift(problem)
        found.append((hook, owner, name, label))
    for hook, owner, name, _ in found:
        wrapping.wrap_member(owner, name, wrapper(row, hook.args, settings), row.id)
    return Result(APPLIED, "; ".join(hook.says.format(member=label) for hook, _, _, label in found))


def wrapper(row: patch_table.Row, args: tuple, settings):
    """``original -> payload(original, *args, settings=settings)``: the very call a baked diff's guard makes."""
    payload = payload_of(row)

    def wrap(original):
        return payload(original, *args, settings=settings)
    return wrap


def check(row: patch_table.Row, modules: Mapping[str, ModuleType], settings) -> Result:
    """With the row's target modules imported (absent ones missing from ``modules``), is the patch in effect?

    ``disabled`` where the gate keeps it off; ``drifted`` naming every hook not in effect (a module that did not
    import, a member not wrapped, a hook's problem); ``not-applicable`` where every hook is optional and no module
    of them is here; ``applied`` saying what each hook does. ``settings`` None: the gate is not asked."""
    reason = patch_table.disabled_reason(row, settings) if settings is not None else None
    if reason:
        return Result(DISABLED, reason)
    says, missing = [], []
    for hook in row.hooks:
        module = modules.get(hook.module)
        if module is None:
            if not hook.optional:
                missing.append(f"{hook.module} did not import")
            continue
        try:
            owner, name, label = _located(hook, module)
        except Drift as exc:
            missing.append(str(exc))
            continue
        problem = _call(hook.problem, module) if hook.problem else None
        if problem:
            missing.append(problem)
        elif is_patched(getattr(owner, name, None), row.id):
            says.append(hook.says.format(member=label))
        else:  # where a baked diff's guard met an error, it left SGLang's own (and said so once)
            guard_left = " (its baked guard left it as SGLang ships it)" if hasattr(module, guard_name(row.id)) else ""
            missing.append(f"{label} is not wrapped{guard_left}")
    if missing:
        return Result(DRIFTED, "not in effect in this process: " + "; ".join(missing))
    if not says:
        return Result(NOT_APPLICABLE, "none of " + ", ".join(dict.fromkeys(h.module for h in row.hooks))
                      + " in this release")
    return Result(APPLIED, "; ".join(says))
