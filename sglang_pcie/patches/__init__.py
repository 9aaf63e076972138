"""One module per code patch; each defines ``PATCH``, an instance of ``sglang_pcie.base.Patch``."""
