"""The runtime wing: what runs inside every SGLang process (activation, settings, the NCCL and all-reduce decision,
the EAGLE profiler). It imports nothing from ``sglang_pcie.tools`` or ``sglang_pcie.patching``: it reads the
runtime half of the patch register (``patch_table``, data), and a patch's module is loaded by name when its target
module is imported."""
