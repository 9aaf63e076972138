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
from types import ModuleType
from typing import Mapping

from sglang_pcie.patching import baked, register
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.runtime import hooks
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

    def wrapper(self, settings, *args):
        """The patch's payload as ``wrapping.wrap_member`` takes it, for an install of the patch's own:
        ``original -> payload(original, *args, settings=settings)``, the very call a baked diff's guard makes."""
        return hooks.wrapper(self.entry.row, args, settings)

    def check_source(self, tree: SourceTree) -> Result:
        raise NotImplementedError

    def apply(self, module: ModuleType, settings) -> Result:
        """Patch ``module`` (one of ``targets``, just imported): the template of ``runtime/hooks.py`` (a baked module
        left alone, the release gate, then the install)."""
        return hooks.apply(self.entry.row, module, settings)

    def install(self, module: ModuleType, settings) -> Result:
        """The patch's own change to ``module``; raises ``Drift`` if it has the wrong shape. A wrap patch's comes
        from its hooks (``runtime/hooks.py``); a patch without hooks names its own in its row (``install``, in its
        folder's server half). Idempotent and all-or-nothing: everything is checked before anything changes.
        """
        return hooks.run_install(self.entry.row, module, settings)

    def rewrite(self, tree: SourceTree) -> dict[str, str]:
        """The source-level equivalent of ``apply``: {module name: new source}; {} where none is needed. A wrap
        patch's comes from its hooks (``baked.hook_diffs``) where its static check finds it applicable.

        ``ci/generate-diffs`` turns it into ``diffs/<release>/<id>.diff``.
        """
        if self.entry.row.hooks:
            return baked.hook_diffs(self.entry.row, tree) if self.check_source(tree).status == APPLICABLE else {}
        raise NotImplementedError

    def check_runtime(self, modules: Mapping[str, ModuleType], settings) -> Result:
        """With the targets imported (absent ones missing from ``modules``), is the patch in effect? A wrap patch's
        answer comes from its hooks."""
        if self.entry.row.hooks:
            return hooks.check(self.entry.row, modules, settings)
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
    return hooks.release_bounds(patch)


def release_gate(patch: Patch, version: str | None) -> Result | None:
    """``not-applicable`` where ``version`` is older than the first release the patch covers (``runtime/hooks.py``:
    statically, ``verify.check_source``, and at runtime alike)."""
    return hooks.release_gate(patch, version)
