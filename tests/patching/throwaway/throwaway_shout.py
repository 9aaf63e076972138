"""A throw-away patch for tests/patching/test_throwaway_patch.py, written as a wrap patch of the package is (it would
be ``sglang_pcie/patching/throwaway_shout.py``): the fake release's ``sglang.srt.toy.greet`` shouts.

All it writes is its own: the static check. Its hook (``throwaway_register.ROW``) gives the rest: the runtime install
and check (``runtime/hooks.py``), the baked diff's lines (``patching/baked.hook_diffs``) and ``marked``.
"""
from __future__ import annotations

from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DIFF_MARKER, DRIFTED, Patch, Result

PATCH_ID = "throwaway-shout"
MODULE = "sglang.srt.toy"
FUNCTION = "greet"


class ThrowawayShout(Patch):
    id = PATCH_ID

    def check_source(self, tree) -> Result:
        if tree.function(MODULE, FUNCTION) is None:
            return Result(DRIFTED, f"{MODULE}.{FUNCTION} is missing")
        if f"{DIFF_MARKER} {self.id}" in tree.source(MODULE):
            return Result(APPLIED, "source carries the sglang-pcie diff")
        return Result(APPLICABLE, f"{FUNCTION} shouts")


PATCH = ThrowawayShout()
