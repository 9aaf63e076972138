"""The peer-to-peer copy check that ``sglang-pcie doctor`` runs in a child process: the only doctor code that touches
CUDA, started by path (``python p2p_child.py SPEC``) so that it imports nothing of sglang-pcie, and killed whole by
the parent at its time bound. It prints one line per event, ``doctor-p2p {json}``, flushed, so that a run killed
in a hang still says which pair it was copying.

For each ordered pair of GPUs (source, destination) it moves 64 MiB three ways and compares every byte with what
was sent: the copy engine (``dst.copy_(src)``: what NCCL's P2P transport and cudaMemcpyPeer use), SM stores from
the source into the destination's memory and SM loads by the source from the destination's memory (what SGLang's
custom all-reduce and FlashInfer's one-shot kernels do; a patched P2P driver once returned wrong data on this path
while copies checked out, club-3090 #922). The SM paths run a 20-line PTX kernel that the driver compiles (no
nvcc). Bandwidth is timed over a few repeats; while a long copy runs, the GPUs' PCIe link speed and width are read
from sysfs (GPUs lower their link speed when idle). With one GPU the same checks run within it: they test the
check itself. Nothing here uses NVLink multicast.
"""
from __future__ import annotations

import ctypes
import json
import re
import sys
import threading
import time

PREFIX = "doctor-p2p "
WHERE = {}  # the pair and method being run: an error report names them
SENTINEL = -1  # the destination is filled with it first: a copy that does nothing cannot pass
PEER_ALREADY_ENABLED = 704  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
LINK_BURST_S = 0.25  # how long the copies run while the link is read
PTX = rb"""
.version 6.0
.target sm_52
.address_size 64

.visible .entry copy16(.param .u64 dst, .param .u64 src, .param .u64 count)
{
    .reg .pred %p;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u64 %rd3, [count];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
LOOP:
    setp.ge.u64 %p, %rd4, %rd3;
    @%p bra DONE;
    shl.b64 %rd7, %rd4, 4;
    add.u64 %rd8, %rd2, %rd7;
    ld.global.v4.u32 {%r0, %r5, %r6, %r7}, [%rd8];
    add.u64 %rd9, %rd1, %rd7;
    st.global.v4.u32 [%rd9], {%r0, %r5, %r6, %r7};
    add.u64 %rd4, %rd4, %rd6;
    bra LOOP;
DONE:
    ret;
}
"""


def say(event: str, **fields) -> None:
    print(PREFIX + json.dumps(dict(event=event, **fields)), flush=True)


class CudaError(Exception):
    pass


class Driver:
    """The four CUDA driver calls torch does not offer: load a PTX module, find its kernel, launch it, and let one
    GPU's context reach another's memory. Modules and contexts are per device (torch's primary contexts)."""

    def __init__(self, torch):
        self.torch = torch
        self.lib = ctypes.CDLL("libcuda.so.1")
        lib, p = self.lib, ctypes.POINTER
        lib.cuCtxGetCurrent.argtypes = [p(ctypes.c_void_p)]
        lib.cuModuleLoadData.argtypes = [p(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [p(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuCtxEnablePeerAccess.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, p(ctypes.c_void_p),
                                                                                  p(ctypes.c_void_p)]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, p(ctypes.c_char_p)]
        self.contexts, self.kernels = {}, {}

    def check(self, code: int, what: str) -> None:
        if code != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            raise CudaError(f"{what}: {(name.value or b'?').decode()} ({code})")

    def context(self, device: int):
        if device not in self.contexts:
            with self.torch.cuda.device(device):
                self.torch.empty(1, device=device)  # makes torch's primary context current on this thread
                ctx = ctypes.c_void_p()
                self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
                module, kernel = ctypes.c_void_p(), ctypes.c_void_p()
                self.check(self.lib.cuModuleLoadData(ctypes.byref(module), PTX), "cuModuleLoadData (PTX JIT)")
                self.check(self.lib.cuModuleGetFunction(ctypes.byref(kernel), module, b"copy16"), "cuModuleGetFunction")
            self.contexts[device], self.kernels[device] = ctx, kernel
        return self.contexts[device]

    def enable_peer(self, device: int, peer: int) -> None:
        """Let ``device``'s kernels reach ``peer``'s memory (torch may already have)."""
        peer_ctx = self.context(peer)
        self.context(device)
        with self.torch.cuda.device(device):
            self.torch.empty(1, device=device)
            code = self.lib.cuCtxEnablePeerAccess(peer_ctx, 0)
        if code != PEER_ALREADY_ENABLED:
            self.check(code, f"cuCtxEnablePeerAccess({device} -> {peer})")

    def launch_copy(self, device: int, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
        """SMs of ``device`` copy ``nbytes`` (a multiple of 16) from src to dst, on torch's current stream."""
        self.context(device)
        count = nbytes // 16
        values = [ctypes.c_uint64(dst_ptr), ctypes.c_uint64(src_ptr), ctypes.c_uint64(count)]
        params = (ctypes.c_void_p * 3)(*[ctypes.addressof(v) for v in values])
        stream = self.torch.cuda.current_stream(device).cuda_stream
        grid = max(1, min((count + 255) // 256, 1024))
        with self.torch.cuda.device(device):
            self.check(self.lib.cuLaunchKernel(self.kernels[device], grid, 1, 1, 256, 1, 1, 0,
                                               ctypes.c_void_p(stream), params, None), "cuLaunchKernel")


def pattern(torch, words: int, salt: int, device: int):
    """Words that differ at every position and for every pair and method, as int32."""
    i = torch.arange(words, dtype=torch.int64, device=device)
    v = (i * 2654435761 + salt) & 0xFFFFFFFF
    return (v - ((v >> 31) << 32)).to(torch.int32)


def compare(torch, dst, expected) -> dict:
    bad = dst != expected
    n_bad = int(bad.sum().item())
    out = {"bytes": dst.numel() * 4, "mismatched_words": n_bad, "ok": n_bad == 0}
    if n_bad:
        out["first_bad_offset"] = int(bad.nonzero()[0].item()) * 4
    return out


def synchronize(torch, *devices) -> None:
    for device in set(devices):
        torch.cuda.synchronize(device)


def run_method(torch, driver, method: str, src_dev: int, dst_dev: int, words: int, reps: int, salt: int) -> dict:
    """Move words from src_dev to dst_dev one way, compare, time ``reps`` repeats, compare again."""
    data_dev = src_dev if method != "sm-read" else dst_dev  # sm-read: the source GPU's SMs read the peer's data
    home_dev = dst_dev if method != "sm-read" else src_dev
    src = pattern(torch, words, salt, data_dev)
    dst = torch.full((words,), SENTINEL, dtype=torch.int32, device=home_dev)
    expected = pattern(torch, words, salt, home_dev)

    def once():
        if method == "copy-engine":
            dst.copy_(src)
        else:
            driver.launch_copy(src_dev, dst.data_ptr(), src.data_ptr(), words * 4)

    once()
    synchronize(torch, src_dev, dst_dev)
    first = compare(torch, dst, expected)
    began = time.perf_counter()
    for _ in range(reps):
        once()
    synchronize(torch, src_dev, dst_dev)
    seconds = time.perf_counter() - began
    again = compare(torch, dst, expected)
    result = first if not first["ok"] else again
    result["gbps"] = round(words * 4 * reps / seconds / 1e9, 2)
    return result


def read_link(sysfs: str, bus_id: str) -> dict:
    out = {}
    for name in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width"):
        try:
            with open(f"{sysfs}/{bus_id}/{name}") as f:
                out[name] = f.read(200).strip()
        except OSError as exc:
            out[name] = f"unreadable: {exc.strerror}"
    return out


def link_under_load(torch, src_dev: int, dst_dev: int, words: int, gbps: float, sysfs: str, bus_ids: dict) -> dict:
    """The PCIe link of both GPUs read from sysfs while copies between them run for about LINK_BURST_S."""
    src = torch.empty(words, dtype=torch.int32, device=src_dev)
    dst = torch.empty(words, dtype=torch.int32, device=dst_dev)
    copies = max(1, min(2000, int(LINK_BURST_S * gbps * 1e9 / (words * 4))))
    seen = {}

    def reader():
        time.sleep(LINK_BURST_S / 3)
        for device in {src_dev, dst_dev}:
            seen[device] = read_link(sysfs, bus_ids[device])

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    for _ in range(copies):
        dst.copy_(src)
    synchronize(torch, src_dev, dst_dev)
    thread.join(timeout=5)
    return seen


def find_devices(torch, wanted: list) -> list:
    """torch's index of each wanted GPU (by UUID, else PCI address, else position)."""
    def norm(text):  # "GPU-c951b351-...", "c951b351-..." or a repr around it: the 32 hex digits
        return re.sub(r"[^0-9a-f]", "", str(text).lower())[-32:]

    found = {}
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        if getattr(props, "uuid", None) is not None:
            found[norm(props.uuid)] = index
        if getattr(props, "pci_bus_id", None) is not None:
            bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            found[bus] = index
    out = []
    for position, gpu in enumerate(wanted):
        index = found.get(norm(gpu["uuid"]), found.get(gpu["bus_id"]))
        if index is None and not found and position < torch.cuda.device_count():
            index = position  # a torch without uuid / pci_bus_id: the parent set CUDA_DEVICE_ORDER=PCI_BUS_ID
        if index is None:
            raise LookupError(f"GPU {gpu['uuid']} ({gpu['bus_id']}) is not among the {torch.cuda.device_count()} CUDA"
                            " devices this process sees")
        out.append(index)
    return out


def start(spec: dict):
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure means the same: no check here
        say("error", kind="no-torch", message=f"torch not importable: {type(exc).__name__}: {exc}")
        return None
    if not torch.cuda.is_available():
        say("error", kind="no-cuda", message=f"torch {torch.__version__} sees no CUDA device")
        return None
    nccl = None
    try:
        version = torch.cuda.nccl.version()  # (2, 28, 3); an int in old releases
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception:  # noqa: BLE001 - a torch without NCCL
        pass
    devices = find_devices(torch, spec["gpus"])
    caps = [".".join(map(str, torch.cuda.get_device_capability(d))) for d in devices]
    say("start", torch=torch.__version__, cuda=torch.version.cuda, nccl=nccl, capabilities=caps)
    return torch, devices


def main(spec: dict) -> int:
    started = start(spec)
    if started is None:
        return 0
    torch, devices = started
    driver = Driver(torch)
    words, reps = spec["mib"] * (1 << 20) // 4, spec["reps"]
    n = len(devices)
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b] or [(0, 0)]
    bus_ids = {devices[i]: g["bus_id"] for i, g in enumerate(spec["gpus"])}
    linked = set()
    for a, b in pairs:
        src_dev, dst_dev = devices[a], devices[b]
        peer = a == b or torch.cuda.can_device_access_peer(src_dev, dst_dev)
        methods = {}
        for k, method in enumerate(("copy-engine", "sm-write", "sm-read")):
            WHERE.update(pair=[a, b], method=method)
            say("begin", **WHERE)
            if method != "copy-engine" and not peer:
                methods[method] = {"skipped": "no peer access: CUDA offers only copies staged through the host"}
                continue
            if method != "copy-engine" and a != b:
                driver.enable_peer(src_dev, dst_dev)
            salt = (a * 64 + b) * 8 + k + 1
            methods[method] = run_method(torch, driver, method, src_dev, dst_dev, words, reps, salt * 0x9E3779B1)
        say("result", pair=[a, b], peer=bool(peer), methods=methods)
        if not {src_dev, dst_dev} <= linked:
            WHERE.update(pair=[a, b], method="link under load")
            say("begin", **WHERE)
            seen = link_under_load(torch, src_dev, dst_dev, words, methods["copy-engine"]["gbps"],
                                   spec["sysfs"], bus_ids)
            say("link", links={str(devices.index(d)): v for d, v in seen.items()})
            linked |= {src_dev, dst_dev}
    say("done")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(json.loads(sys.argv[1])))
    except LookupError as exc:  # the GPUs doctor read are not the ones torch sees
        say("error", kind="mapping", message=str(exc))
        sys.exit(1)
    except (CudaError, RuntimeError) as exc:  # a CUDA error leaves the context unusable: report it and stop
        say("error", kind="cuda", message=f"{type(exc).__name__}: {str(exc).splitlines()[0][:400]}", **WHERE)
        sys.exit(1)
