"""NCCL profile chosen for this machine and written into the process environment when SGLang is imported.

Spawned scheduler / TP worker processes inherit the environment, so the launcher's decision reaches them
before NCCL reads its variables. A variable the user set is never overwritten.

The ``auto`` rule looks at the GPU links through NVML (or ``nvidia-smi topo -m``), never through CUDA, so the
launching process does not initialise a CUDA context.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable, MutableMapping

# Measured on 8 x RTX PRO 6000 Blackwell over PCIe (62.9 -> 88.8 tok/s). On 2 x H200 with NVLink the same
# values made small all-reduces 1.2-2.9x slower, so ``auto`` never applies them where NVLink is present.
PCIE_PROFILE = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MIN_NCHANNELS": "2",
    "NCCL_MAX_NCHANNELS": "2",
    "NCCL_BUFFSIZE": "131072",
}
# Set in the process that decided, so that spawned workers inherit the decision instead of probing again.
DECIDED_VAR = "SGLANG_PCIE_NCCL_DECIDED"


@dataclass
class Topology:
    gpu_names: list = field(default_factory=list)
    nvlink: bool | None = None  # None: could not tell
    p2p: bool | None = None  # every pair of GPUs reports peer-to-peer read access (NVML); None: unknown
    source: str = "none"  # nvml | nvidia-smi | none
    detail: str = ""

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)


@dataclass
class NcclDecision:
    requested: str | None  # the SGLANG_PCIE_NCCL_PROFILE value (None: invalid)
    profile: str  # what was chosen: pcie | tuned | none
    values: dict  # variables this decision sets
    user_set: dict  # profile variables the user already set (kept)
    reason: str
    topology: Topology | None = None

    def as_dict(self) -> dict:
        out = {"requested": self.requested, "profile": self.profile, "values": self.values,
               "user_set": self.user_set, "reason": self.reason}
        if self.topology is not None:
            t = self.topology
            out["topology"] = {"gpus": t.gpu_names, "nvlink": t.nvlink, "p2p": t.p2p,
                               "source": t.source, "detail": t.detail}
        return out


def _probe_nvml() -> Topology | None:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        handles, names = [], []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                return None
            name = ctypes.create_string_buffer(96)
            nvml.nvmlDeviceGetName(handle, name, 96)
            handles.append(handle)
            names.append(name.value.decode(errors="replace"))
        active_links = 0
        for handle in handles:
            for link in range(32):  # NVML_NVLINK_MAX_LINKS is 18 on current parts; extra indices just fail
                state = ctypes.c_uint(0)
                if nvml.nvmlDeviceGetNvLinkState(handle, link, ctypes.byref(state)) == 0 and state.value:
                    active_links += 1
        p2p = None
        if len(handles) > 1:
            p2p = True
            for a in handles:
                for b in handles:
                    status = ctypes.c_int(-1)
                    # NVML_P2P_CAPS_INDEX_READ = 0; status 0 = NVML_P2P_STATUS_OK
                    if a.value != b.value and (nvml.nvmlDeviceGetP2PStatus(a, b, 0, ctypes.byref(status)) != 0
                                               or status.value != 0):
                        p2p = False
        return Topology(names, active_links > 0, p2p, "nvml", f"{active_links} active NVLink links")
    finally:
        nvml.nvmlShutdown()


def _probe_nvidia_smi() -> Topology | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        listing = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
        topo = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listing.returncode != 0:
        return None
    names = [line.split(":", 1)[1].split("(UUID")[0].strip()
             for line in listing.stdout.splitlines() if line.startswith("GPU ")]
    rows = [line.split() for line in topo.stdout.splitlines() if line.startswith("GPU")]
    cells = [cell for row in rows[1:] for cell in row[1:len(names) + 1]] if rows else []
    if not cells:
        return Topology(names, None, None, "nvidia-smi", "no topology matrix")
    nvlink = any(cell.startswith("NV") for cell in cells)
    return Topology(names, nvlink, None, "nvidia-smi", "topo -m matrix")


def probe_topology() -> Topology:
    """GPU names and whether NVLink joins them, without initialising CUDA."""
    return _probe_nvml() or _probe_nvidia_smi() or Topology(detail="no NVIDIA driver or GPU visible")


def decide(requested: str | None, environ: MutableMapping[str, str] | None = None,
           probe: Callable[[], Topology] = probe_topology) -> NcclDecision:
    """What ``requested`` (an SGLANG_PCIE_NCCL_PROFILE value) means on this machine. Touches nothing."""
    from sglang_pcie import tuning

    env = os.environ if environ is None else environ
    topology = None
    if requested is None:
        chosen, reason = None, "SGLANG_PCIE_NCCL_PROFILE is invalid: nothing applied"
    elif requested == "off":
        chosen, reason = None, "SGLANG_PCIE_NCCL_PROFILE=off"
    elif requested == "pcie":
        chosen, reason = ("pcie", PCIE_PROFILE), "SGLANG_PCIE_NCCL_PROFILE=pcie"
    elif requested == "tuned":
        topology = probe()
        tuned, reason = tuning.tuned_profile(topology, explicit=True, environ=env)
        chosen = ("tuned", tuned) if tuned is not None else None
    else:  # auto
        topology = probe()
        tuned, tuned_reason = tuning.tuned_profile(topology, explicit=False, environ=env)
        if tuned is not None:
            chosen, reason = ("tuned", tuned), tuned_reason
        elif topology.gpu_count == 0:
            chosen, reason = None, f"auto: no GPU visible ({topology.detail})"
        elif topology.gpu_count < 2:
            chosen, reason = None, "auto: a single GPU, no all-reduce to tune"
        elif topology.nvlink is None:
            chosen, reason = None, f"auto: could not tell whether NVLink is present ({topology.source})"
        elif topology.nvlink:
            chosen, reason = None, (f"auto: NVLink between the {topology.gpu_count} GPUs ({topology.detail}):"
                                    " NCCL defaults kept")
        else:
            chosen, reason = ("pcie", PCIE_PROFILE), (f"auto: {topology.gpu_count} GPUs without NVLink"
                                                     f" ({topology.source}): PCIe profile")
        if tuned is None and tuning.config_path(env).exists():  # a tuned file measured on another machine
            reason = f"{reason}; {tuned_reason}"
    if chosen is None:
        return NcclDecision(requested, "none", {}, {}, reason, topology)
    name, profile = chosen
    values = {k: v for k, v in profile.items() if k not in env}
    user_set = {k: env[k] for k in profile if k in env}
    return NcclDecision(requested, name, values, user_set, reason, topology)


def apply_for_process(settings, environ: MutableMapping[str, str] | None = None) -> NcclDecision | None:
    """Decide once per process tree and write the chosen variables into the environment."""
    env = os.environ if environ is None else environ
    if DECIDED_VAR in env:  # a parent process already decided; its variables were inherited
        return None
    decision = decide(settings.nccl_profile, env)
    env.update(decision.values)
    env[DECIDED_VAR] = decision.profile
    return decision
