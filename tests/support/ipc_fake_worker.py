"""One rank of tune_nccl's PCIe-IPC worker (``tune_nccl.measure_ipc.measure_ipc``, the real code) on CPU: gloo
instead of NCCL, and stand-ins for what needs a GPU - torch.cuda's streams, events and graphs, and FlashInfer's
workspace.

The workspace stand-in keeps FlashInfer 0.7.2's signatures and enforces the collective contract of
``PcieIpcAllReduceWorkspace`` as its docstring states it: tune() before prepare() (tune clears resolved
configurations), every shape resolved by prepare() before it is captured, one stream per workspace unless
rebind_stream() moved it, out-of-place results, destroy() once. Its all-reduce is gloo's, so the worker's sum
checks are real. FAKE_IPC_BROKEN=1 makes it return each rank's own input (the checks must say so);
FAKE_IPC_HANG=tune makes tune() never return (as a collective whose peer never arrives); FAKE_IPC_STDOUT_JUNK=1
writes to stdout without a newline before the report (as a chatty library can).

FlashInfer's JIT loaders (get_pcie_ipc_comm_module, get_trtllm_utils_module) are stand-ins too: each load takes
0.2 s and appends "RANK NAME start" and "RANK NAME end" to FAKE_IPC_JIT_LOG (if set), so a test sees whether the
ranks loaded one at a time; FAKE_IPC_JIT_FAIL=NAME makes that module's load fail as a ninja build with a missing
source does. FLASHINFER_AUTOTUNE_DIR set: tune() on rank 0 writes a cache file there as FlashInfer's does, with one
configuration per shape, or none with FAKE_IPC_TUNE_SAVES_NOTHING=1 (every candidate failed).

usage (as tune_nccl's worker command): python ipc_fake_worker.py --worker SPEC_JSON
"""
import contextlib
import faulthandler
import json
import os
import signal
import sys
import time
import types

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ.get("SGLANG_PCIE_REPO", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from sglang_pcie.tools.tune_nccl import measure_ipc  # noqa: E402

CALLS = []  # what the worker asked of the workspace, in order


class _Stream:
    def wait_stream(self, other):
        pass


_DEFAULT = _Stream()
_state = {"stream": _DEFAULT, "capturing": None}


class _Graph:
    def __init__(self):
        self.thunks = []

    def replay(self):
        for thunk in self.thunks:
            thunk()


@contextlib.contextmanager
def _stream(stream):
    previous, _state["stream"] = _state["stream"], stream
    try:
        yield
    finally:
        _state["stream"] = previous


@contextlib.contextmanager
def _graph(graph, pool=None, stream=None, capture_error_mode="global"):
    assert stream is not None and stream is not _DEFAULT, "capture needs a side stream"
    previous = _state["stream"]
    _state["stream"], _state["capturing"] = stream, graph
    try:
        yield
    finally:
        _state["stream"], _state["capturing"] = previous, None


class _Event:
    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = time.perf_counter()

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


def install_cuda_stand_ins():
    cuda = torch.cuda
    cuda.Stream = _Stream
    cuda.current_stream = lambda device=None: _state["stream"]
    cuda.stream = _stream
    cuda.graph = _graph
    cuda.CUDAGraph = _Graph
    cuda.Event = _Event
    cuda.synchronize = lambda device=None: None


class PcieIpcAllReduceWorkspace:
    def __init__(self, group, max_numel, dtype=torch.bfloat16, max_blocks=64, profile=None, tune_batches=None,
                 tune_cache=None):
        assert dtype in (torch.bfloat16, torch.float16)
        self.group, self.max_numel, self.tune_batches = group, max_numel, tuple(tune_batches or ())
        self.profile, self.profile_reason = "rootcplx-noswitch", "stand-in"
        assert "pcie_ipc_comm" in LOADED, "workspace built with its kernels not loaded"
        self.prepared, self.tuned, self.bound, self.destroyed = set(), False, None, False
        self.tune_cache = tune_cache
        CALLS.append(("init", max_numel, self.tune_batches, tune_cache))

    def tune(self, hiddens, *, dtype=torch.bfloat16, cache=None, tune_group=None, warmup=10, repeat=50):
        assert not _state["capturing"]
        assert "trtllm_utils" in LOADED, "tune() reached with the autotuner's delay kernel not loaded"
        if os.environ.get("FAKE_IPC_HANG") == "tune":
            time.sleep(300)
        self.prepared.clear()  # as FlashInfer's tune(): resolved configurations are dropped
        self.tuned = True
        CALLS.append(("tune", tuple(hiddens)))
        if os.environ.get("FLASHINFER_AUTOTUNE_DIR") and dist.get_rank() == 0:
            configs = {} if os.environ.get("FAKE_IPC_TUNE_SAVES_NOTHING") else {
                f"pcie_ipc_all_reduce|{h}|{b}": ["PcieIpcRunner", 1] for h in hiddens for b in self.tune_batches}
            os.makedirs(os.path.dirname(self.tune_cache), exist_ok=True)
            with open(self.tune_cache, "w") as f:
                json.dump({"_metadata": {"flashinfer_version": "stand-in"}, **configs, "_generation": "x"}, f)
        dist.barrier()  # as FlashInfer's: nobody leaves before the file is on disk
        return {(h, b): "config" for h in hiddens for b in self.tune_batches}

    def prepare(self, shapes, *, dtype=torch.bfloat16):
        assert not _state["capturing"]
        self.prepared.update((int(b), int(h)) for b, h in shapes)
        CALLS.append(("prepare", tuple(sorted(self.prepared))))
        return {shape: "config" for shape in shapes}

    def supports(self, inp):
        return inp.numel() <= self.max_numel and inp.dtype in (torch.bfloat16, torch.float16)

    def rebind_stream(self):
        self.bound = None

    def all_reduce(self, inp, *, out=None, config=None, enable_pdl=False):
        assert not self.destroyed and out is not None and out.data_ptr() != inp.data_ptr()
        stream = _state["stream"]
        if _state["capturing"] is not None:
            assert tuple(inp.shape) in self.prepared, f"shape {tuple(inp.shape)} captured before prepare()"
            _state["capturing"].thunks.append(lambda: self._reduce(inp, out))
            return out
        assert self.bound in (None, stream), "a second stream without rebind_stream()"
        self.bound = stream
        self._reduce(inp, out)
        return out

    @staticmethod
    def _reduce(inp, out):
        if os.environ.get("FAKE_IPC_BROKEN"):
            out.copy_(inp)
            return
        total = inp.float().clone()
        dist.all_reduce(total)
        out.copy_(total.to(inp.dtype))

    def destroy(self):
        assert not self.destroyed
        self.destroyed = True
        CALLS.append(("destroy",))


LOADED = []  # the JIT modules this rank has loaded


def _jit_loader(name):
    def load():
        log = os.environ.get("FAKE_IPC_JIT_LOG")
        rank = os.environ["RANK"]

        def note(what):
            if log:
                with open(log, "a") as f:
                    f.write(f"{rank} {name} {what}\n")

        note("start")
        time.sleep(0.2)  # long enough that two ranks loading at once would interleave in the log
        if os.environ.get("FAKE_IPC_JIT_FAIL") == name:
            note("failed")
            raise RuntimeError(  # as FlashInfer's run_ninja reports a source the trimmed wheel left out
                "Ninja build failed. Ninja output:\nninja: Entering directory `/cache/cached_ops/trtllm_utils'\n"
                f"ninja: error: '/tmp/fi/flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/delayStream.cu', "
                f"needed by '{name}/delayStream.cuda.o', missing and no known rule to make it")
        note("end")
        LOADED.append(name)
        CALLS.append(("jit", name))

    return load


def install_flashinfer_stand_in():
    flashinfer = types.ModuleType("flashinfer")
    flashinfer.__version__ = "0.7.2-stand-in"
    comm = types.ModuleType("flashinfer.comm")
    comm.PcieIpcAllReduceWorkspace = PcieIpcAllReduceWorkspace
    tuning = types.ModuleType("flashinfer.comm.pcie_ipc_tuning")
    base = os.environ.get("FLASHINFER_AUTOTUNE_DIR") or "/stand-in/autotune"
    tuning.default_cache_path = lambda world_size: f"{base}/pcie_ipc_all_reduce_ws{world_size}.json"
    ar = types.ModuleType("flashinfer.comm.pcie_ipc_ar")
    ar.get_pcie_ipc_comm_module = _jit_loader("pcie_ipc_comm")
    tllm = types.ModuleType("flashinfer.tllm_utils")
    tllm.get_trtllm_utils_module = _jit_loader("trtllm_utils")
    flashinfer.comm, comm.pcie_ipc_tuning, comm.pcie_ipc_ar, flashinfer.tllm_utils = comm, tuning, ar, tllm
    sys.modules.update({"flashinfer": flashinfer, "flashinfer.comm": comm, "flashinfer.comm.pcie_ipc_tuning": tuning,
                        "flashinfer.comm.pcie_ipc_ar": ar, "flashinfer.tllm_utils": tllm})


def main():
    spec = json.loads(sys.argv[sys.argv.index("--worker") + 1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # as tune_nccl's run_worker
    install_cuda_stand_ins()
    install_flashinfer_stand_in()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    report = {"rank": rank, "ok": False}
    try:
        report["us"] = measure_ipc.measure_ipc(torch, dist, spec, rank, world, torch.device("cpu"), report)
        report["ok"] = True
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"[:400]
    report["calls"] = CALLS
    if os.environ.get("FAKE_IPC_STDOUT_JUNK"):
        print("[flashinfer] a line without its newline", end="")
    print(json.dumps(report), flush=True)
    os._exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
