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

from sglang_pcie.nccl import IPC_VARS

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

    def as_dict(self) -> dict:
        return {"values": self.values, "user_set": self.user_set, "reason": self.reason, "on": self.on}


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
               sglang: SglangInstall | None = None, flashinfer: FlashinferInstall | None = None) -> IpcDecision:
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
    missing = adapter_missing(sglang)
    if missing is None:
        missing = kernels_missing(sglang, flashinfer or flashinfer_install())
    if missing:
        return IpcDecision({}, {}, f"measured faster than NCCL, but {missing}: left off")
    values = {ENABLE_VAR: "1", MAX_NUMEL_VAR: str(max_numel)}
    return IpcDecision(values, {}, (f"tune-nccl measured it faster than NCCL up to {ipc.get('max_tokens')} tokens"
                                    f" x {ipc.get('hidden')} ({max_numel} elements); larger reductions stay on"
                                    " NCCL"), True)


# ---------------------------------------------------------------------------------------------------------------
# The report for `sglang-pcie env` and `verify-patches`


def report(decision, sglang_root: str | os.PathLike | None = None) -> dict:
    """The all-reduce paths this install offers, and which one a server started now would use, with reasons.
    ``decision`` is an ``nccl.NcclDecision`` (its topology may be None: the profile did not probe);
    ``sglang_root``: a folder holding the sglang package to report on instead of the installed one."""
    from sglang_pcie import nccl

    topology = decision.topology if decision.topology is not None else nccl.probe_topology()
    sglang = sglang_install(sglang_root)
    flashinfer = flashinfer_install()
    world = topology.gpu_count
    ipc = decision.ipc or decide_ipc(decision.requested, decision.config, topology, os.environ, sglang, flashinfer)
    out = {"gpus": world, "nvlink": topology.nvlink, "p2p": topology.p2p,
           "sglang": sglang.version, "flashinfer": flashinfer.version, "paths": []}

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

    if world == 0:
        uses, why = "no all-reduce", f"no GPU visible: {topology.detail or topology.source}"
    elif world == 1:
        uses, why = "no all-reduce", "one GPU visible"
    elif eligible:
        uses = f"custom all-reduce up to {CUSTOM_AR_MAX_BYTES >> 20} MiB, NCCL above"
        why = f"{ca_why}; unless the server runs with --disable-custom-all-reduce"
    elif ipc_on:
        numel = ipc.values.get(MAX_NUMEL_VAR) or ipc.user_set.get(MAX_NUMEL_VAR) or "SGLang's decode width x hidden"
        uses = f"PCIe-IPC all-reduce for bf16 reductions up to {numel} elements, NCCL above"
        why = f"custom all-reduce: {ca_why}; PCIe-IPC: {ipc.reason}"
    else:
        uses = "NCCL for every reduction"
        ipc_why = ipc.reason if adapter is None and not kernels else (adapter or kernels)
        why = f"custom all-reduce: {ca_why}; PCIe-IPC off: {ipc_why}"
    out["server_uses"], out["why"] = uses, why
    if world >= 2:
        out["assumes"] = f"tensor parallelism over all {world} visible GPUs"
    return out


def format_report(rep: dict) -> list[str]:
    gpus = rep["gpus"]
    head = (f"All-reduce paths ({gpus} GPU(s); NVLink {rep['nvlink']}; peer-to-peer {rep['p2p']};"
            f" SGLang {rep['sglang'] or 'not installed'}; FlashInfer {rep['flashinfer'] or 'not installed'}):")
    lines = [head]
    for path in rep["paths"]:
        lines.append(f"  {path['path']}: {path['detail']}")
    assumes = f"; assumes {rep['assumes']}" if rep.get("assumes") else ""
    lines.append(f"  a server started now uses: {rep['server_uses']}. Why: {rep['why']}{assumes}")
    return lines
