"""NCCL (and PCIe-IPC all-reduce) settings chosen for this machine and written into the process environment when
SGLang is imported.

Spawned scheduler / TP worker processes inherit the environment, so the launcher's decision reaches them
before NCCL reads its variables. A variable the user set is never overwritten.

Nothing is applied unmeasured: ``auto`` applies values only from a ``tune-nccl`` result whose fingerprint
matches the GPUs this process will use; without one it keeps NCCL's defaults. The GPUs are read through NVML
(or ``nvidia-smi``), never through CUDA, so the launching process does not initialise a CUDA context. NVML
ignores ``CUDA_VISIBLE_DEVICES``, so the visible set is mapped onto NVML's devices here (indices or UUIDs).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, MutableMapping

# Measured on 8 x RTX PRO 6000 Blackwell over PCIe (62.9 -> 88.8 tok/s decode). On 2 x H200 the same values made
# prefill-sized all-reduces 5-29x slower than NCCL's defaults, so only an explicit SGLANG_PCIE_NCCL_PROFILE=pcie
# applies them.
PCIE_PROFILE = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MIN_NCHANNELS": "2",
    "NCCL_MAX_NCHANNELS": "2",
    "NCCL_BUFFSIZE": "131072",
}
# Set in the process that decided, so that spawned workers inherit the decision instead of probing again (and
# the advice line is printed once per process tree, not once per worker).
DECIDED_VAR = "SGLANG_PCIE_NCCL_DECIDED"
TUNE_ADVICE = ("{count} GPUs without NVLink and no tune-nccl result for them: NCCL defaults kept. "
               "Run `sglang-pcie tune-nccl` once to measure NCCL settings and the PCIe-IPC all-reduce here.")

# SGLang's switch and bound for FlashInfer's PCIe-IPC all-reduce (allreduce_paths decides them).
IPC_VARS = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "SGLANG_PCIE_IPC_MAX_NUMEL")

# nvml.h: nvmlGpuP2PCapsIndex_t and nvmlGpuP2PStatus_t
_P2P_CAPS_READ = 0
_P2P_CAPS_NVLINK = 2
_P2P_STATUS_OK = 0
_NVML_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE
_MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS on current parts


@dataclass
class Topology:
    gpu_names: list = field(default_factory=list)  # the GPUs this process will use, in CUDA's order
    nvlink: bool | None = None  # NVLink joins every pair of them (what SGLang's custom all-reduce asks); None: unknown
    p2p: bool | None = None  # every pair reports peer-to-peer access (NVML); None: unknown or a single GPU
    source: str = "none"  # nvml | nvidia-smi | none
    detail: str = ""
    uuids: list = field(default_factory=list)  # same order as gpu_names; empty where the source gives none

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
    advice: str | None = None  # one line worth printing once per process tree (e.g. run tune-nccl)
    config: dict | None = None  # the tuned file, when it matched this machine
    ipc: object | None = None  # allreduce_paths.IpcDecision where there was one to take (else SGLang's default: off)

    def as_dict(self) -> dict:
        out = {"requested": self.requested, "profile": self.profile, "values": self.values,
               "user_set": self.user_set, "reason": self.reason}
        if self.advice:
            out["advice"] = self.advice
        if self.topology is not None:
            t = self.topology
            out["topology"] = {"gpus": t.gpu_names, "nvlink": t.nvlink, "p2p": t.p2p,
                               "source": t.source, "detail": t.detail}
        if self.ipc is not None:
            out["ipc"] = self.ipc.as_dict()
        return out


# ---------------------------------------------------------------------------------------------------------------
# Which GPUs this process will use


def visible_selection(environ=None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset (every GPU), else its entries up to the first empty
    one ("" and "-1" hide every GPU)."""
    env = os.environ if environ is None else environ
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    entries = []
    for part in raw.split(","):
        part = part.strip()
        if not part or part.startswith("-"):
            break  # CUDA ignores the rest of the list after an invalid entry
        entries.append(part)
    return entries


def select_visible(uuids: list[str], selection: list[str] | None) -> tuple[list[int] | None, str]:
    """NVML indices of the GPUs CUDA will show, in CUDA's order; (None, why) when the selection cannot be mapped.

    Entries are NVML/PCI-order indices (as SGLang itself maps them) or UUID prefixes ("GPU-3f2a..."). Like CUDA,
    an entry that matches nothing ends the list. MIG entries name a slice, not a GPU: not mapped.
    """
    if selection is None:
        return list(range(len(uuids))), ""
    chosen = []
    for entry in selection:
        if entry.isdigit():
            index = int(entry)
            if index >= len(uuids):
                break
        elif entry.upper().startswith("MIG-"):
            return None, f"CUDA_VISIBLE_DEVICES names a MIG slice ({entry}); links not read"
        else:
            wanted = entry if entry.upper().startswith("GPU-") else f"GPU-{entry}"
            matches = [i for i, uuid in enumerate(uuids) if uuid.lower().startswith(wanted.lower())]
            if len(matches) != 1:
                break
            index = matches[0]
        if index in chosen:  # CUDA rejects a repeated device; treat as the end of the list
            break
        chosen.append(index)
    return chosen, ""


# ---------------------------------------------------------------------------------------------------------------
# NVML, through ctypes (no pynvml dependency, no CUDA)


def _load_nvml():
    try:
        return ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None


def _probe_nvml(lib=None, environ=None) -> Topology | None:
    """The visible GPUs, their names, UUIDs, NVLink and peer-to-peer state; None without a usable NVML."""
    nvml = lib if lib is not None else _load_nvml()
    if nvml is None or nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        handles, names, uuids = [], [], []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                return None
            name = ctypes.create_string_buffer(_NVML_BUFFER)
            uuid = ctypes.create_string_buffer(_NVML_BUFFER)
            nvml.nvmlDeviceGetName(handle, name, _NVML_BUFFER)
            nvml.nvmlDeviceGetUUID(handle, uuid, _NVML_BUFFER)
            handles.append(handle)
            names.append(name.value.decode(errors="replace"))
            uuids.append(uuid.value.decode(errors="replace"))
        chosen, problem = select_visible(uuids, visible_selection(environ))
        if chosen is None:
            return Topology(list(visible_selection(environ)), None, None, "nvml", problem)
        handles = [handles[i] for i in chosen]

        def pairs_ok(caps):
            for a in handles:
                for b in handles:
                    status = ctypes.c_int(-1)
                    if a.value != b.value and (nvml.nvmlDeviceGetP2PStatus(a, b, caps, ctypes.byref(status)) != 0
                                               or status.value != _P2P_STATUS_OK):
                        return False
            return True

        nvlink = p2p = None
        if len(handles) > 1:
            nvlink, p2p = pairs_ok(_P2P_CAPS_NVLINK), pairs_ok(_P2P_CAPS_READ)
        active = 0
        for handle in handles:
            for link in range(_MAX_NVLINKS):
                state = ctypes.c_uint(0)
                if nvml.nvmlDeviceGetNvLinkState(handle, link, ctypes.byref(state)) == 0 and state.value:
                    active += 1
        shown = "" if visible_selection(environ) is None else f" of {count.value} (CUDA_VISIBLE_DEVICES)"
        detail = f"{len(handles)} GPU(s){shown}, {active} active NVLink links"
        return Topology([names[i] for i in chosen], nvlink, p2p, "nvml", detail, [uuids[i] for i in chosen])
    finally:
        nvml.nvmlShutdown()


def _probe_nvidia_smi(environ=None) -> Topology | None:
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
    names, uuids = [], []
    for line in listing.stdout.splitlines():
        if line.startswith("GPU "):
            rest = line.split(":", 1)[1]
            names.append(rest.split("(UUID")[0].strip())
            uuids.append(rest.split("UUID:", 1)[1].strip(" )") if "UUID:" in rest else "")
    chosen, problem = select_visible(uuids, visible_selection(environ))
    if chosen is None:
        return Topology(list(visible_selection(environ)), None, None, "nvidia-smi", problem)
    # One row per GPU ("GPU0  X  NV18 ..."; the header line starts with a tab): cells 1..n link it to GPU 0..n-1.
    rows = [line.split() for line in topo.stdout.splitlines() if line.startswith("GPU")]
    matrix = [row[1:len(names) + 1] for row in rows[:len(names)]]
    nvlink = None
    if len(chosen) > 1 and len(matrix) == len(names) and all(len(r) == len(names) for r in matrix):
        nvlink = all(matrix[a][b].startswith("NV") for a in chosen for b in chosen if a != b)
    detail = "topo -m matrix" if matrix else "no topology matrix"
    return Topology([names[i] for i in chosen], nvlink, None, "nvidia-smi", detail, [uuids[i] for i in chosen])


def probe_topology(environ=None) -> Topology:
    """The GPUs this process will use and the links between them, without initialising CUDA."""
    return (_probe_nvml(environ=environ) or _probe_nvidia_smi(environ)
            or Topology(detail="no NVIDIA driver or GPU visible"))


# ---------------------------------------------------------------------------------------------------------------
# The decision


def _exists(path) -> bool:
    """Path.exists() that answers False where the folder cannot be entered (HOME of another user in a container)
    instead of raising in the middle of activation."""
    try:
        return path.exists()
    except OSError:
        return False


def decide(requested: str | None, environ: MutableMapping[str, str] | None = None,
           probe: Callable[[], Topology] | None = None) -> NcclDecision:
    """What ``requested`` (an SGLANG_PCIE_NCCL_PROFILE value) means on this machine. Touches nothing."""
    from sglang_pcie import tuning

    env = os.environ if environ is None else environ
    probe = probe or (lambda: probe_topology(env))
    topology, config, advice = None, None, None
    if requested is None:
        chosen, reason = None, "SGLANG_PCIE_NCCL_PROFILE is invalid: nothing applied"
    elif requested == "off":
        chosen, reason = None, "SGLANG_PCIE_NCCL_PROFILE=off"
    elif requested == "pcie":
        chosen, reason = ("pcie", PCIE_PROFILE), "SGLANG_PCIE_NCCL_PROFILE=pcie (explicit; not measured here)"
    else:  # auto / tuned: measured values or nothing
        topology = probe()
        config, tuned_reason = tuning.matching_config(topology, explicit=requested == "tuned", environ=env)
        if config is not None:
            chosen, reason = ("tuned", dict(config["values"])), tuned_reason
        elif requested == "tuned":
            chosen, reason = None, tuned_reason
        else:
            chosen, reason = None, f"auto: {_untuned_reason(topology)}: NCCL defaults kept"
            if _exists(tuning.config_path(env)):  # a file measured elsewhere, or unusable: say why it was passed over
                reason = f"{reason}; {tuned_reason}"
            if topology.gpu_count > 1 and topology.nvlink is False:
                advice = TUNE_ADVICE.format(count=topology.gpu_count)
    ipc = None
    # The IPC decision (and its module) only where there is something to decide: a measured win, or the user's
    # own setting to report. Everywhere else activation stays as cheap as before.
    if any(name in env for name in IPC_VARS) or (config is not None and (config.get("ipc") or {}).get("max_numel")):
        from sglang_pcie import allreduce_paths

        ipc = allreduce_paths.decide_ipc(requested, config, topology, env)
    if chosen is None:
        return NcclDecision(requested, "none", {}, {}, reason, topology, advice, config, ipc)
    name, profile = chosen
    values = {k: v for k, v in profile.items() if k not in env}
    user_set = {k: env[k] for k in profile if k in env}
    return NcclDecision(requested, name, values, user_set, reason, topology, advice, config, ipc)


def _untuned_reason(topology: Topology) -> str:
    if topology.gpu_count == 0:
        return f"no GPU visible ({topology.detail})"
    if topology.gpu_count == 1:
        return "a single GPU, no all-reduce"
    links = {True: "NVLink between them", False: "no NVLink between them", None: "NVLink unknown"}[topology.nvlink]
    return f"no tune-nccl result for these {topology.gpu_count} GPUs ({links}, peer-to-peer {topology.p2p})"


def apply_for_process(settings, environ: MutableMapping[str, str] | None = None) -> NcclDecision | None:
    """Decide once per process tree and write the chosen variables into the environment."""
    env = os.environ if environ is None else environ
    if DECIDED_VAR in env:  # a parent process already decided; its variables were inherited
        return None
    decision = decide(settings.nccl_profile, env)
    env.update(decision.values)
    if decision.ipc is not None:
        env.update(decision.ipc.values)
    env[DECIDED_VAR] = decision.profile
    if decision.advice:
        sys.stderr.write(f"sglang-pcie: {decision.advice}\n")
    return decision
