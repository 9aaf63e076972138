"""sglang-pcie: an installable overlay that makes SGLang fast and observable on PCIe multi-GPU boxes."""

__version__ = "0.1.0"
