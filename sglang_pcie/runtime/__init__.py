"""The runtime wing: what runs inside every SGLang process (activation, settings, the NCCL and all-reduce decision,
the EAGLE profiler). It imports nothing from ``sglang_pcie.tools``, and from ``sglang_pcie.patching`` only the
register, which is data; a patch's module is loaded by name when its target module is imported."""
