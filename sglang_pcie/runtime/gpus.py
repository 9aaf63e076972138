"""The GPUs this process will use and the links between them, read through NVML (or ``nvidia-smi``), never
through CUDA, so the launching process does not initialise a CUDA context. NVML ignores ``CUDA_VISIBLE_DEVICES``,
so the visible set is mapped onto NVML's devices here (indices or UUIDs).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass, field

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

    def state(self, value: bool | None) -> str:
        """``nvlink`` / ``p2p`` for people: yes, no, or why it is not known (never "None")."""
        if value is not None:
            return "yes" if value else "no"
        if self.gpu_count == 0:
            return "unknown (no GPU visible)"
        if self.gpu_count == 1:
            return "n/a (one GPU)"
        return "unknown (nvidia-smi does not report it)" if self.source == "nvidia-smi" else "unknown"

    def links(self) -> str:
        return f"NVLink: {self.state(self.nvlink)}; peer-to-peer: {self.state(self.p2p)}"


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


NO_GPU_DETAIL = "no NVIDIA driver, or it lists none"  # beside "no GPU visible": the cause, not the finding again


def probe_topology(environ=None) -> Topology:
    """The GPUs this process will use and the links between them, without initialising CUDA."""
    return (_probe_nvml(environ=environ) or _probe_nvidia_smi(environ)
            or Topology(detail=NO_GPU_DETAIL))
