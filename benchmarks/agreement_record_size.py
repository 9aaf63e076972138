"""Bytes of one node-agreement record (what each rank writes to torch's store), for the settings a node typically
has, as ``Record.to_json`` sends them. Run: python -m benchmarks.agreement_record_size (no torch needed)."""
from __future__ import annotations

from sglang_pcie.patches.node_agreement.payload import Record

VERSIONS = {"sglang-pcie version": ("0.1.0", None), "sglang version": ("0.5.23", None),
            "NCCL version (torch's)": ("2.27.3", None)}
CASES = {
    "untuned node (the decision only)": {"SGLANG_PCIE_NCCL_DECIDED": ("none", None)},
    "tuned node (profile pcie)": {"SGLANG_PCIE_NCCL_DECIDED": ("pcie", None), "NCCL_PROTO": ("LL,LL128,Simple", None),
                                  "NCCL_ALGO": ("Ring", None), "NCCL_P2P_LEVEL": ("SYS", None),
                                  "NCCL_MIN_NCHANNELS": ("4", None)},
    "multi-node, RoCE": {"SGLANG_PCIE_NCCL_DECIDED": ("none", None), "NCCL_SOCKET_IFNAME": ("ens1f0np0", None),
                         "NCCL_IB_HCA": ("mlx5_0:1,mlx5_1:1", None), "NCCL_IB_GID_INDEX": ("3", None),
                         "NCCL_NET_GDR_LEVEL": ("PHB", "/etc/nccl.conf"),
                         "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": ("0", None)},
}

for name, values in CASES.items():
    record = Record(3, "gpu-node-07.cluster.local", 1, {**values, **VERSIONS})
    print(f"{name}: {len(record.values)} values, {len(record.to_json())} bytes")
