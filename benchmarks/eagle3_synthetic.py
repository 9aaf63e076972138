"""The synthetic EAGLE decode loop of benchmarks/eagle3_profile_overhead.py: a worker shaped like SGLang's EAGLE v2
worker, its phases as CUDA graphs of calibrated length on one GPU (``Gpu``) or as host spins without one
(``HostOnly``, for --dry-run), and the scheduler's host copy of accept_lens."""
from __future__ import annotations

import contextlib
import statistics
import time
import types

from sglang_pcie.patches.eagle3_profile import payload as ep

TARGET_MS = {"draft": 0.89, "verify": 18.67, "draft_extend": 0.28}  # the seed measurement, times --phase-scale
KERNELS = {"draft": 5, "verify": 61, "draft_extend": 2}  # a graph is several kernels, as a model's layers
METHODS = (("forward_batch_generation", "cycle"), ("draft", "draft"), ("verify", "verify"),
           ("draft_extend", "draft_extend"))
PROFILED = ("eagle3-profile", "eagle3-profile-every-cycle")
BATCH_SIZE = 4
ACCEPT_LENS = [2, 1, 2, 2]  # tokens per request per cycle (accept length 1.75)


def spin(seconds: float) -> None:
    """Busy host work (holds the GIL, as SGLang's scheduler does)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class DecodeMode:
    def is_extend(self):
        return False

    def is_idle(self):
        return False


class SyntheticWorker:
    """forward_batch_generation -> draft, verify, draft_extend, each one graph replay (or host spin, dry run)."""

    tp_rank = 0

    def __init__(self, phases, accept_lens):
        self.phases = phases  # phase -> callable that launches its GPU work
        self.accept_lens = accept_lens

    def forward_batch_generation(self, batch):
        self.draft(batch)
        result = self.verify(batch)
        self.draft_extend(batch, result)
        return result

    def draft(self, batch):
        self.phases["draft"]()

    def verify(self, batch):
        self.phases["verify"]()
        return types.SimpleNamespace(accept_lens=self.accept_lens)

    def draft_extend(self, batch, result):
        self.phases["draft_extend"]()


def host_synchronised(function, phase, sink, synchronize):
    def timed(self, *args, **kwargs):
        synchronize()
        start = time.perf_counter()
        result = function(self, *args, **kwargs)
        synchronize()
        sink.setdefault(phase, []).append((time.perf_counter() - start) * 1e3)
        return result
    return timed


def worker_class(mode, sink, synchronize):
    attrs = {}
    for name, phase in METHODS:
        function = SyntheticWorker.__dict__[name]
        if mode in PROFILED:
            attrs[name] = ep.wrap(function, phase)
        elif mode == "host-synchronised":
            attrs[name] = host_synchronised(function, phase, sink, synchronize)
    return type(f"Worker_{mode.replace('-', '_')}", (SyntheticWorker,), attrs)




class Gpu:
    """The GPU side: spin kernels of calibrated length, captured in one CUDA graph per phase."""

    def __init__(self, torch, scale=1.0):
        self.torch = torch
        self.forward_stream = torch.cuda.Stream()  # SGLang launches its cycles on a stream of its own
        self.copy_stream = torch.cuda.Stream()
        self.cycles_per_ms = self._calibrate()
        self.accept_lens = torch.zeros(BATCH_SIZE, dtype=torch.int32, device="cuda")
        self.pattern = torch.tensor(ACCEPT_LENS, dtype=torch.int32, device="cuda")
        self.graphs = {}
        self.measured_ms = {}
        for phase, target in TARGET_MS.items():
            target *= scale
            cycles = int(target * self.cycles_per_ms / KERNELS[phase])
            measured = self._capture(phase, cycles)
            # clocks drift from the calibration run: correct once so the graphs match the seed durations
            self.measured_ms[phase] = self._capture(phase, int(cycles * target / measured))

    def _calibrate(self):
        torch = self.torch
        for _ in range(3):
            torch.cuda._sleep(1_000_000)
        samples = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            end.synchronize()
            samples.append(2_000_000 / start.elapsed_time(end))
        return statistics.median(samples)

    def _capture(self, phase, cycles_per_kernel):
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(KERNELS[phase]):
                    torch.cuda._sleep(cycles_per_kernel)
                if phase == "verify":  # the acceptance writes the batch's accepted lengths
                    self.accept_lens.copy_(self.pattern)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.graphs[phase] = graph
        for _ in range(3):
            graph.replay()
        samples = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples)

    def phases(self):
        return {phase: graph.replay for phase, graph in self.graphs.items()}

    def forward_context(self):
        return self.torch.cuda.stream(self.forward_stream)

    def copy_to_host(self, result):
        """SGLang's GenerationBatchResult.copy_to_cpu under the overlap scheduler: accept_lens to pinned memory on
        the copy stream, after the forward stream's work; copy_done marks it."""
        torch = self.torch
        self.copy_stream.wait_stream(self.forward_stream)
        with torch.cuda.stream(self.copy_stream):
            host = torch.empty(result.accept_lens.shape, dtype=result.accept_lens.dtype, pin_memory=True)
            host.copy_(result.accept_lens, non_blocking=True)
            result.accept_lens = host
            result.copy_done = torch.cuda.Event()
            result.copy_done.record()

    def done_marker(self):
        event = self.torch.cuda.Event()
        event.record()
        return event

    def capture_check(self):
        """A profiled cycle run while a CUDA graph is being captured: it must record nothing (an event with timing
        on a capturing stream would break the capture) and leave the profiler on."""
        torch = self.torch
        x = torch.zeros(16, device="cuda")
        lens = torch.ones(2, dtype=torch.int32, device="cuda")

        def bump():
            x.add_(1)
        worker = worker_class("eagle3-profile", {}, self.synchronize)(
            {"draft": bump, "verify": bump, "draft_extend": bump}, lens)
        profiler = ep.Profiler(interval=1000, sample_every=1)
        ep.set_profiler(profiler)
        batch = types.SimpleNamespace(forward_mode=DecodeMode(), is_extend_in_batch=False)
        try:
            worker.forward_batch_generation(batch)  # bind, outside the capture
            recorded_before = profiler.stats.host_timed_ns
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            error = None
            try:
                with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                    worker.forward_batch_generation(batch)
                graph.replay()
                torch.cuda.synchronize()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            timed_in_capture = profiler.stats.timed + len(profiler._pending) - 1  # the first cycle's is there
            return {"capture_ok": error is None, "error": error, "profiler_active": profiler.active,
                    "timed_during_capture": max(0, timed_in_capture), "host_timed_ns_before": recorded_before}
        finally:
            ep.set_profiler(None)

    def synchronize(self):
        self.torch.cuda.synchronize()


class DryAcceptLens(list):
    """--dry-run: accept_lens 'on the device' (is_cuda True): the profiler may only stage it, never read it."""

    is_cuda = True
    shape = property(lambda self: (len(self),))

    def sum(self, dtype=None):
        return sum(self)


class DryHostCopy(list):
    is_cuda = False

    def tolist(self):
        return list(self)


class HostOnly:
    """--dry-run: host spins stand in for the kernels (scaled down), so the script's logic runs without a GPU."""

    scale = 0.05

    def __init__(self, scale=1.0):
        self.accept_lens = DryAcceptLens(ACCEPT_LENS)
        self.measured_ms = {phase: ms * self.scale * scale for phase, ms in TARGET_MS.items()}

    def phases(self):
        return {phase: (lambda ms=ms: spin(ms / 1e3)) for phase, ms in self.measured_ms.items()}

    def forward_context(self):
        return contextlib.nullcontext()

    def copy_to_host(self, result):
        result.accept_lens = DryHostCopy(result.accept_lens)
        result.copy_done = types.SimpleNamespace(query=lambda: True, synchronize=lambda: None)

    def done_marker(self):
        return types.SimpleNamespace(synchronize=lambda: None)

    def capture_check(self):
        return None

    def synchronize(self):
        pass

