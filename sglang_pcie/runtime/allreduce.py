"""Which all-reduce a server will run here, and the switch for SGLang's PCIe-IPC all-reduce.

SGLang (from 0.5.21) has an adapter, ``sglang/srt/distributed/device_communicators/pcie_ipc_ar.py``, for
FlashInfer's PCIe-IPC all-reduce (``flashinfer.comm.PcieIpcAllReduceWorkspace``, FlashInfer >= 0.7.0). It is off
unless ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1``, and ``SGLANG_PCIE_IPC_MAX_NUMEL`` bounds the reductions it takes.
SGLang picks, per reduction: its custom all-reduce first (where eligible), then the PCIe-IPC path, then NCCL.

``auto`` switches the IPC path on only where it was measured: the installed SGLang has the adapter, the
installed FlashInfer has the kernels, and this machine's ``tune-nccl`` result says IPC beats NCCL (up to a
decode-sized bound, never a prefill-sized one). Everything here reads files and directory listings only: no
``import sglang``, no ``import flashinfer``, no CUDA.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_pcie.runtime.settings import IPC_VARS

ENABLE_VAR, MAX_NUMEL_VAR = IPC_VARS
ADAPTER = "srt/distributed/device_communicators/pcie_ipc_ar.py"  # inside the sglang package
ADAPTER_RELEASE = "0.5.21"
FLASHINFER_MIN = "0.7.0"
# FlashInfer each adapter release pins (its wheel's Requires-Dist).
FLASHINFER_PINS = {"0.5.21": "0.6.18", "0.5.22": "0.7.1", "0.5.23": "0.7.2"}
IPC_WORLD_SIZES = (2, 4, 8)  # the kernels' channel layouts (FlashInfer and SGLang's adapter)
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)  # SGLang's CUDA custom all-reduce
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024  # its default buffer (_MAX_CAR_SIZE)


# ---------------------------------------------------------------------------------------------------------------
# What is installed, without importing it


def _version_tuple(text: str | None) -> tuple:
    return tuple(int(part) for part in re.findall(r"\d+", text or "")[:3])


@dataclass
class SglangInstall:
    root: Path | None  # folder holding the sglang package
    version: str | None
    has_adapter: bool


@dataclass
class FlashinferInstall:
    version: str | None
    has_kernels: bool
    where: str | None = None


def sglang_install(root: str | os.PathLike | None = None) -> SglangInstall:
    """The SGLang in ``root`` (a folder holding the ``sglang`` package), else the one this interpreter imports."""
    if root is None:
        module = sys.modules.get("sglang")
        origin = getattr(module, "__file__", None) if module is not None else None
        if origin is None:
            try:
                spec = importlib.util.find_spec("sglang")
            except (ImportError, ValueError):
                spec = None
            origin = spec.origin if spec is not None else None
        if not origin:
            return SglangInstall(None, None, False)
        root = Path(os.path.abspath(origin)).parent.parent
    package = Path(root) / "sglang"
    version = None
    for name in ("_version.py", "version.py"):
        try:
            match = re.search(r"""^__version__\s*=.*?['"]([^'"]+)['"]""", (package / name).read_text(), re.M)
        except OSError:
            continue
        if match:
            version = match.group(1)
            break
    return SglangInstall(Path(root), version, (package / ADAPTER).is_file())


def flashinfer_install() -> FlashinferInstall:
    """The FlashInfer this interpreter would import: its version (from the dist-info folder name beside the
    package) and whether it ships the PCIe-IPC all-reduce (``flashinfer/comm/pcie_ipc_ar.py``)."""
    try:
        spec = importlib.util.find_spec("flashinfer")  # a top-level package: located, not executed
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return FlashinferInstall(None, False)
    package = Path(spec.origin).parent
    version = None
    try:
        for name in sorted(os.listdir(package.parent)):
            if name.startswith("flashinfer_python-") and name.endswith(".dist-info"):
                version = name[len("flashinfer_python-"):-len(".dist-info")]
    except OSError:
        pass
    return FlashinferInstall(version, (package / "comm" / "pcie_ipc_ar.py").is_file(), str(package))


# ---------------------------------------------------------------------------------------------------------------
# SGLang's custom all-reduce, judged from the links (what its can_use_custom_all_reduce_with_nvlink checks)


def custom_allreduce(topology, world: int | None = None) -> tuple[bool | None, str]:
    """(eligible, why) for SGLang's CUDA custom all-reduce over ``world`` GPUs (default: every visible one).
    None: cannot tell (the links are unknown). It also needs --disable-custom-all-reduce not given."""
    world = topology.gpu_count if world is None else world
    if world < 2:
        return False, "no all-reduce with one GPU"
    if world not in CUSTOM_AR_WORLD_SIZES:
        return False, f"world size {world} is not one it supports ({', '.join(map(str, CUSTOM_AR_WORLD_SIZES))})"
    if world > 2 and topology.nvlink is not True:
        if topology.nvlink is None:
            return None, f"{world} GPUs and NVLink unknown (it needs NVLink between all of them above 2)"
        return False, f"{world} GPUs without NVLink between all of them (it needs NVLink above 2 GPUs)"
    if topology.p2p is False:
        return False, "no peer-to-peer access between the GPUs"
    if topology.p2p is None:
        return None, "peer-to-peer access unknown (it needs it)"
    link = "NVLink" if topology.nvlink else "peer-to-peer over PCIe (2 GPUs)"
    return True, f"{world} GPUs, {link}: SGLang runs it first for reductions up to {CUSTOM_AR_MAX_BYTES >> 20} MiB"


# ---------------------------------------------------------------------------------------------------------------
# The switch


@dataclass
class IpcDecision:
    values: dict  # variables to set
    user_set: dict  # IPC variables the user set (kept, and nothing else written)
    reason: str
    on: bool = False  # whether the server will have the IPC path switched on
    advice: str | None = None  # one line worth printing once per process tree (re-run tune-nccl)

    def as_dict(self) -> dict:
        out = {"values": self.values, "user_set": self.user_set, "reason": self.reason, "on": self.on}
        if self.advice:
            out["advice"] = self.advice
        return out


def adapter_missing(sglang: SglangInstall) -> str | None:
    if sglang.root is None:
        return "SGLang is not installed here"
    if not sglang.has_adapter:
        return (f"SGLang {sglang.version or '?'} has no PCIe-IPC all-reduce adapter"
                f" (SGLang {ADAPTER_RELEASE} adds it)")
    return None


def kernels_missing(sglang: SglangInstall, flashinfer: FlashinferInstall) -> str | None:
    if flashinfer.has_kernels:
        return None
    pin = FLASHINFER_PINS.get(sglang.version or "")
    pinned = ""
    if pin and _version_tuple(pin) < _version_tuple(FLASHINFER_MIN):
        pinned = f"; SGLang {sglang.version} pins {pin}, which lacks them"
    have = f"FlashInfer {flashinfer.version or '?'} lacks the kernels" if flashinfer.where else "FlashInfer is not installed"
    return (f"{have} (the PCIe-IPC kernels need flashinfer-python >= {FLASHINFER_MIN}{pinned}; switched on, "
            f"SGLang's adapter would log a warning and stay on NCCL)")


def decide_ipc(requested: str | None, config: dict | None, topology, environ,
               sglang: SglangInstall | None = None, flashinfer: FlashinferInstall | None = None,
               launch=None) -> IpcDecision:
    """Whether the launcher sets SGLANG_ENABLE_PCIE_IPC_ALLREDUCE / SGLANG_PCIE_IPC_MAX_NUMEL. Touches nothing.

    The install is only looked at when the measurement says yes, so the common case costs nothing."""
    user = {name: environ[name] for name in IPC_VARS if name in environ}
    if user:
        enabled = environ.get(ENABLE_VAR, "").strip().lower() in ("1", "true", "yes", "on")
        shown = " ".join(f"{k}={v}" for k, v in user.items())
        return IpcDecision({}, user, f"set by the user ({shown}): kept, nothing else written", enabled)
    if requested not in ("auto", "tuned"):
        what = "invalid" if requested is None else requested
        return IpcDecision({}, {}, f"SGLANG_PCIE_NCCL_PROFILE={what}: left as SGLang has it (off)")
    if config is None:
        return IpcDecision({}, {}, "no tune-nccl result for these GPUs: left as SGLang has it (off)")
    if launch is not None and launch.multi_node:
        return IpcDecision({}, {}, f"{launch.describe()}: FlashInfer's PCIe-IPC all-reduce is single-node: left off")
    ipc = config.get("ipc") or {}
    max_numel = ipc.get("max_numel")
    if not max_numel:
        why = ipc.get("verdict") or "the tune-nccl result has no PCIe-IPC measurement"
        return IpcDecision({}, {}, f"{why}: left off")
    eligible, why = custom_allreduce(topology)
    if eligible:
        return IpcDecision({}, {}, f"measured faster than NCCL, but SGLang's custom all-reduce takes these"
                                   f" reductions first ({why}): left off, it would never run")
    sglang = sglang or sglang_install()
    flashinfer = flashinfer or flashinfer_install()
    missing = adapter_missing(sglang)
    if missing is None:
        missing = kernels_missing(sglang, flashinfer)
    if missing:
        return IpcDecision({}, {}, f"measured faster than NCCL, but {missing}: left off")
    if ipc.get("flashinfer") != flashinfer.version:
        # The measurement was of other kernels (and FlashInfer's own tuning cache changes with them: 0.7.4 keys its
        # PCIe-IPC entries differently and bumped the cache format), so it says nothing about these.
        stale = (f"tune-nccl measured the PCIe-IPC all-reduce with FlashInfer {ipc.get('flashinfer')}, and"
                 f" FlashInfer {flashinfer.version} is installed now")
        return IpcDecision({}, {}, f"{stale}: left off", advice=f"{stale}: PCIe-IPC all-reduce left off; re-run "
                                                               "sglang-pcie tune-nccl to measure it again")
    values = {ENABLE_VAR: "1", MAX_NUMEL_VAR: str(max_numel)}
    return IpcDecision(values, {}, (f"tune-nccl measured it faster than NCCL up to {ipc.get('max_tokens')} tokens"
                                    f" x {ipc.get('hidden')} ({max_numel} elements); larger reductions stay on"
                                    " NCCL"), True)
