"""The all-reduce report of ``sglang-pcie env`` and ``verify-patches``: the paths this install offers, and which one a
server started now would use, with reasons."""
from __future__ import annotations

import os

from sglang_pcie.runtime import allreduce
from sglang_pcie.runtime.allreduce import (CUSTOM_AR_MAX_BYTES, FLASHINFER_MIN, IPC_WORLD_SIZES, MAX_NUMEL_VAR,
                                           adapter_missing, custom_allreduce, decide_ipc, kernels_missing)
from sglang_pcie.runtime import gpus


def report(decision, sglang_root: str | os.PathLike | None = None, elsewhere: bool = False) -> dict:
    """The all-reduce paths this install offers, and which one a server started now would use, with reasons.
    ``decision`` is an ``nccl.NcclDecision`` (its topology may be None: the profile did not probe);
    ``sglang_root``: a folder holding the sglang package to report on instead of the installed one; ``elsewhere``:
    that folder is not this machine's install (a fetched release, a source tree), which the report then says
    (``sglang_from``), the GPUs and FlashInfer being this machine's."""
    topology = decision.topology if decision.topology is not None else gpus.probe_topology()
    sglang = allreduce.sglang_install(sglang_root)
    flashinfer = allreduce.flashinfer_install()
    world = topology.gpu_count
    ipc = decision.ipc or decide_ipc(decision.requested, decision.config, topology, os.environ, sglang, flashinfer)
    out = {"gpus": world, "nvlink": topology.nvlink, "p2p": topology.p2p,
           "sglang": sglang.version, "flashinfer": flashinfer.version, "paths": []}
    if elsewhere and sglang_root is not None:
        out["sglang_from"] = str(sglang_root)

    eligible, ca_why = custom_allreduce(topology)
    if world >= 2:
        state = {True: "eligible", False: "not eligible", None: "cannot tell"}[eligible]
        out["paths"].append({"path": "custom all-reduce (SGLang)", "available": eligible,
                             "detail": f"{state}: {ca_why}"})
    adapter = adapter_missing(sglang)
    kernels = kernels_missing(sglang, flashinfer) if adapter is None else None
    if adapter:
        ipc_detail = f"not available: {adapter}"
        if sglang.root is not None:
            ipc_detail += f", and FlashInfer >= {FLASHINFER_MIN} for its kernels"
    elif kernels:
        ipc_detail = f"adapter present (SGLang {sglang.version}); {kernels}"
    else:
        ipc_detail = (f"adapter present (SGLang {sglang.version}), kernels present (FlashInfer {flashinfer.version});"
                      f" {'on' if ipc.on else 'off'}: {ipc.reason}")
        if world >= 2 and world not in IPC_WORLD_SIZES:
            ipc_detail += f"; its kernels do not support {world} ranks ({', '.join(map(str, IPC_WORLD_SIZES))})"
    ipc_on = bool(ipc.on and adapter is None and not kernels and world in IPC_WORLD_SIZES)
    out["paths"].append({"path": "PCIe-IPC all-reduce (FlashInfer)", "available": adapter is None and not kernels,
                         "on": ipc_on, "detail": ipc_detail})
    values = " ".join(f"{k}={v}" for k, v in {**decision.values, **decision.user_set}.items())
    profile = f"profile {decision.profile}" if decision.profile != "none" else "its defaults"
    out["paths"].append({"path": "NCCL", "available": True,
                         "detail": f"{profile}{': ' + values if values else ''} (every reduction the others leave)"})

    out["server_uses"], out["why"] = server_uses(topology, (eligible, ca_why), ipc, ipc_on, adapter or kernels)
    if world >= 2:
        out["assumes"] = f"tensor parallelism over all {world} visible GPUs"
    return out


def server_uses(topology, custom: tuple, ipc, ipc_on: bool, ipc_missing: str | None) -> tuple[str, str]:
    """(the all-reduce a server started now would use, why): custom all-reduce where it is eligible, else the
    PCIe-IPC all-reduce where it is on, else NCCL. ``custom``: (eligible, why); ``ipc_missing``: what the PCIe-IPC
    path lacks here (its adapter or kernels), None where it has both."""
    world = topology.gpu_count
    eligible, ca_why = custom
    if world == 0:
        return "no all-reduce", f"no GPU visible: {topology.detail or topology.source}"
    if world == 1:
        return "no all-reduce", "one GPU visible"
    if eligible:
        return (f"custom all-reduce up to {CUSTOM_AR_MAX_BYTES >> 20} MiB, NCCL above",
                f"{ca_why}; unless the server runs with --disable-custom-all-reduce")
    if ipc_on:
        numel = ipc.values.get(MAX_NUMEL_VAR) or ipc.user_set.get(MAX_NUMEL_VAR) or "SGLang's decode width x hidden"
        return (f"PCIe-IPC all-reduce for bf16 reductions up to {numel} elements, NCCL above",
                f"custom all-reduce: {ca_why}; PCIe-IPC: {ipc.reason}")
    return "NCCL for every reduction", f"custom all-reduce: {ca_why}; PCIe-IPC off: {ipc_missing or ipc.reason}"


def format_report(rep: dict) -> list[str]:
    count = rep["gpus"]
    links = gpus.Topology(["?"] * count)  # says yes / no / why unknown for this many GPUs
    machine = (f"{count} GPU(s); NVLink {links.state(rep['nvlink'])}; peer-to-peer {links.state(rep['p2p'])}")
    flashinfer = f"FlashInfer {rep['flashinfer'] or 'not installed'}"
    if rep.get("sglang_from"):  # two sources: say which figure comes from where
        head = (f"All-reduce paths (this machine: {machine}; {flashinfer}. SGLang {rep['sglang'] or 'unknown'} from"
                f" {rep['sglang_from']}, the release checked, not this machine's install):")
    else:
        head = f"All-reduce paths ({machine}; SGLang {rep['sglang'] or 'not installed'}; {flashinfer}):"
    lines = [head]
    for path in rep["paths"]:
        lines.append(f"  {path['path']}: {path['detail']}")
    assumes = f"; assumes {rep['assumes']}" if rep.get("assumes") else ""
    lines.append(f"  a server started now uses: {rep['server_uses']}. Why: {rep['why']}{assumes}")
    return lines
