"""Imported by activation_state.py in a spawned worker, as SGLang starts its scheduler / TP workers."""
import os, sys

def overlay_state():
    import sglang
    import sglang_pcie.runtime.activate as act
    return {"activated": act._activated, "decided": os.environ.get("SGLANG_PCIE_NCCL_DECIDED"),
            "proto": os.environ.get("NCCL_PROTO")}
