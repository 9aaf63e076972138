"""The patch engine: the one shape every code patch has, and the one way it is gated and applied.

A patch is one module beside this one, named in the register (``register.py``: its id, targets, releases,
opt-in, why and upstream state), defining one ``Patch`` subclass instance named ``PATCH``. The same object
answers three questions:

* ``check_source(tree)``: does this patch fit the SGLang source in ``tree``?  (static, reads files only)
* ``apply(module, settings)``: called right after each of its targets is imported. A template: a module whose
  source carries the patch's versioned diff is left alone (one test for every patch: its ``# sglang-pcie: <id>``
  lines), a release older than the patch covers is not touched, and only then does the patch's own ``install``
  run, with the settings activation gated the patch with: it hands them to the payload (``wrapper``).
* ``check_runtime(modules, settings)``: in a process where the targets are imported, is the patch in effect?

``rewrite(tree)`` is the source-level twin of ``install``: the versioned diffs are generated from it.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from types import ModuleType
from typing import Callable, Mapping

from sglang_pcie.patching import register
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.runtime import baked
from sglang_pcie.runtime.results import (  # noqa: F401  (the patches' vocabulary, re-exported)
    APPLICABLE, APPLIED, DIFF_MARKER, DISABLED, DRIFTED, ERROR, FAILING_STATUSES, MARKER_ATTR, NOT_APPLICABLE,
    STATUSES, UPSTREAM, Drift, Result, StrictModeError, is_patched, mark)

class Patch:
    """Base of every code patch; a subclass sets ``id`` (its register entry holds the rest) and implements
    ``check_source``, ``rewrite``, ``install`` and ``check_runtime``."""

    id: str = ""

    def __init__(self):
        self.entry = register.entry(self.id)

    @property
    def targets(self) -> tuple[str, ...]:
        return self.entry.targets

    @property
    def releases(self) -> str:
        return self.entry.releases

    @property
    def targets_may_fail_to_import(self) -> bool:
        return self.entry.targets_may_fail_to_import

    def disabled_reason(self, settings) -> str | None:
        """Why the patch is not wanted under ``settings`` (the register's one gate), or None when it is."""
        return register.disabled_reason(self.entry, settings)

    def wrapper(self, settings, *args) -> Callable:
        """The patch's payload (``payload`` in the register) as ``wrapping.wrap_member`` takes it:
        ``original -> payload(original, *args, settings=settings)``, the very call a baked diff's guard makes, with
        the settings ``install`` was handed."""
        payload = baked.payload_of(self.entry)

        def wrap(original):
            return payload(original, *args, settings=settings)
        return wrap

    def check_source(self, tree: SourceTree) -> Result:
        raise NotImplementedError

    def apply(self, module: ModuleType, settings) -> Result:
        """Patch ``module`` (one of ``targets``, just imported): the same three steps for every patch."""
        if self.carries_diff(module):
            return Result(APPLIED, "source carries the sglang-pcie diff")
        outside = release_gate(self, getattr(sys.modules.get("sglang"), "__version__", None))
        if outside is not None:
            return outside
        return self.install(module, settings)

    def carries_diff(self, module: ModuleType) -> bool:
        """Whether ``module``'s source holds this patch's versioned diff: its ``# sglang-pcie: <id>`` lines, the one
        marker every diff carries (the static checks look for the same)."""
        try:
            return f"{DIFF_MARKER} {self.id}" in inspect.getsource(module)
        except (OSError, TypeError):  # no source file (a frozen or compiled-only module): nothing baked in
            return False

    def install(self, module: ModuleType, settings) -> Result:
        """The patch's own change to ``module``; raise ``Drift`` if it has the wrong shape.

        Must be idempotent and all-or-nothing: check everything before changing anything.
        """
        raise NotImplementedError

    def rewrite(self, tree: SourceTree) -> dict[str, str]:
        """The source-level equivalent of ``apply``: {module name: new source}; {} where none is needed.

        ``ci/generate-diffs`` turns it into ``diffs/<release>/<id>.diff``.
        """
        raise NotImplementedError

    def check_runtime(self, modules: Mapping[str, ModuleType], settings) -> Result:
        """With the targets imported (absent ones missing from ``modules``), is the patch in effect?"""
        raise NotImplementedError

    def metadata(self) -> dict:
        """The register entry as ``verify-patches --metadata`` prints it."""
        e = self.entry
        return {"id": e.id, "summary": e.summary, "why": e.why, "upstream": e.upstream_text(),
                "upstream_refs": [{"name": r.name, "url": r.url, "state": r.state, "note": r.note}
                                  for r in e.upstream],
                "upstream_checked": e.checked, "remove_when": e.remove_when, "releases": e.releases,
                "opt_in": e.opt_in.variable if e.opt_in else None, "upstream_check": e.upstream_check,
                "runtime_method": e.runtime_method, "static_method": e.static_method, "targets": list(e.targets)}


def load(entry: register.Entry) -> Patch:
    """The patch object of a register entry (its module is imported here, not before)."""
    return importlib.import_module(entry.module).PATCH


def all_patches() -> list[Patch]:
    return [load(entry) for entry in register.REGISTER]


def get_patch(patch_id: str) -> Patch:
    return load(register.entry(patch_id))


def release_bounds(patch: Patch) -> tuple[str, str]:
    """The first and last release a patch covers, from its ``releases`` specifier (``>=FIRST,<=LAST``)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    specifiers = SpecifierSet(patch.releases)
    lows = [s.version for s in specifiers if s.operator in (">=", "==")]
    highs = [s.version for s in specifiers if s.operator in ("<=", "==")]
    if not lows or not highs:
        raise ValueError(f"{patch.id}: releases {patch.releases!r} does not name its first and last release")
    return max(lows, key=Version), min(highs, key=Version)


def release_gate(patch: Patch, version: str | None) -> Result | None:
    """``not-applicable`` naming the range where ``version`` is older than the first release the patch covers (it
    was never written for it); None otherwise, also for a version that cannot be read. Statically
    (``verify.check_source``) and at runtime (``Patch.apply``) alike."""
    from packaging.version import InvalidVersion, Version

    first, last = release_bounds(patch)
    try:
        older = version is not None and Version(version) < Version(first)
    except InvalidVersion:
        return None
    if older:
        return Result(NOT_APPLICABLE, f"sglang {version} is older than the releases this patch covers "
                                      f"({first} to {last})")
    return None
