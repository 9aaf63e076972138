"""The throw-away patch's row in the register's runtime half and its entry in the register (they would be one
``Row`` in ``sglang_pcie/runtime/patch_table.py`` and one ``Entry`` in ``sglang_pcie/patching/register.py``), and
``install()``, which makes a temporary register holding it alone."""
from __future__ import annotations

from sglang_pcie.patching import register
from sglang_pcie.runtime import patch_table

ROW = patch_table.Row(id="throwaway-shout", module="throwaway_shout", payload="throwaway_shout_payload:wrap",
                      hooks=(patch_table.Hook("sglang.srt.toy", "greet", says="greet shouts"),))
ENTRY = register.Entry(
    id="throwaway-shout",
    summary="a test's throw-away patch: the fake release's greet shouts",
    why="tests/patching/test_throwaway_patch.py runs the generic machinery over a patch that is no part of it",
    upstream=(),
    upstream_note="none: a test's",
    checked="2026-12-03",
    remove_when="never: it lives in a test",
    upstream_check="none: the fake release never has it",
    runtime_method="post-import hook on sglang.srt.toy wraps greet with throwaway_shout_payload.wrap",
    static_method="ast: sglang.srt.toy.greet defined at module level",
)


def install() -> None:
    """Both halves of the register hold the throw-away patch alone (a child interpreter's ``sitecustomize``)."""
    patch_table.TABLE = (ROW,)
    register.REGISTER = (ENTRY,)
