"""The patching wing: how a patch is made and checked (the engine, the one reader of SGLang's source, the one edit
helper, the versioned diffs, the release matrix), with the patches and their register beside it. A patch's
``install`` runs inside SGLang processes; everything else here runs offline. Imports nothing from
``sglang_pcie.tools``."""
