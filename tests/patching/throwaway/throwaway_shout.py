"""A throw-away patch for tests/patching/test_throwaway_patch.py, written as a patch of the package is (it would be
``sglang_pcie/patching/throwaway_shout.py``): the fake release's ``sglang.srt.toy.greet`` shouts.

The Patch template (``patching/engine.py``), SourceTree to read, SourceEdits to write, the guard lines
``patching/baked.py`` generates, ``wrapping.wrap_member`` with the register's payload (``Patch.wrapper``).
"""
from __future__ import annotations

from sglang_pcie.patching import baked
from sglang_pcie.runtime import wrapping
from sglang_pcie.patching.edits import SourceEdits
from sglang_pcie.patching.engine import (APPLICABLE, APPLIED, DIFF_MARKER, DISABLED, DRIFTED, Drift, Patch, Result,
                                         is_patched)

PATCH_ID = "throwaway-shout"
MODULE = "sglang.srt.toy"
FUNCTION = "greet"
DETAIL = f"{FUNCTION} shouts"


class ThrowawayShout(Patch):
    id = PATCH_ID

    # -- static

    def check_source(self, tree) -> Result:
        if tree.function(MODULE, FUNCTION) is None:
            return Result(DRIFTED, f"{MODULE}.{FUNCTION} is missing")
        if f"{DIFF_MARKER} {self.id}" in tree.source(MODULE):
            return Result(APPLIED, "source carries the sglang-pcie diff")
        return Result(APPLICABLE, DETAIL)

    def rewrite(self, tree) -> dict[str, str]:
        if self.check_source(tree).status != APPLICABLE:
            return {}
        function = tree.function(MODULE, FUNCTION)
        first = min([function.lineno] + [d.lineno for d in function.decorator_list])
        edits = SourceEdits(tree.source(MODULE))
        edits.insert_lines(first, baked.guard_block(self.id) + "\n\n" + baked.decorator(self.id), indent="")
        return {MODULE: edits.text()}

    # -- runtime

    def install(self, module, settings) -> Result:
        if not callable(vars(module).get(FUNCTION)):
            raise Drift(f"{MODULE}.{FUNCTION} is missing")
        wrapping.wrap_member(module, FUNCTION, self.wrapper(settings), self.id)
        return Result(APPLIED, DETAIL)

    def check_runtime(self, modules, settings) -> Result:
        reason = self.disabled_reason(settings)
        if reason:
            return Result(DISABLED, reason)
        module = modules.get(MODULE)
        if module is None:
            return Result(DRIFTED, f"{MODULE} did not import")
        if not is_patched(getattr(module, FUNCTION, None), self.id):
            return Result(DRIFTED, f"{FUNCTION} is not wrapped")
        return Result(APPLIED, DETAIL)


PATCH = ThrowawayShout()
