"""One folder per patch, named after its id (``draft-token-watch`` -> ``draft_token_watch/``).

In each folder, ``check.py`` (and any ``check_*.py``) is the build-and-verify half: the patch's static source
check and the diff it writes, run by ``verify-patches``, ``ci/generate-diffs`` and the tools, never in a server.
``payload.py`` and every other module there is what runs inside SGLang: it imports only ``sglang_pcie.runtime`` and
its own folder (tests/test_layout.py). Importing a folder's package imports nothing: a server with a patch on loads
its payload alone. The patch's row (``runtime/patch_table.py``) and register entry (``patching/register.py``) say
which is which.
"""
