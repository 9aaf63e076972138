"""One rank's measurement of NCCL all-reduces: tokens x hidden tensors captured in a CUDA graph (a timed loop on CPU
tensors with gloo), sums checked exactly; and what the PCIe-IPC measurement shares with it (progress lines, the sum
pattern, the timed replays). Runs in a worker process, never in the parent."""
from __future__ import annotations

import os
import statistics
import sys
import time

DTYPES = ("bf16", "fp16", "fp32")
# A graph holds 2 x layers all-reduces while their buffers fit in this many bytes per rank, else fewer (at least
# MIN_ALLREDUCES): a prefill-sized graph of 122 buffers would need tens of GB for nothing the timing needs.
GRAPH_BUFFER_BYTES = 256 << 20
MIN_ALLREDUCES = 4
IPC_NAME = "pcie-ipc"
TIMED_REPLAYS = 20
WARMUP_REPLAYS = 3
# Starts a worker's progress lines on its stderr (a file the parent reads when a run fails or hangs).
PHASE_MARK = "phase:"

_WORKER_STARTED = time.monotonic()


def phase(message: str) -> None:
    """A worker's progress line on its stderr (a file the parent reads when a run fails or hangs): the last one
    says where a hung rank stopped."""
    print(f"tune-nccl worker rank {os.environ.get('RANK', '?')} +{time.monotonic() - _WORKER_STARTED:.1f}s "
          f"{PHASE_MARK} {message}", file=sys.stderr, flush=True)


def pattern(torch, rank: int, index: int, numel: int, device):
    # Small integers: every partial sum stays exactly representable (bf16 holds integers up to 256, and the
    # largest sum is 7 x world size), so the check can demand equality. Varying with the element, the buffer
    # and the rank catches misplaced chunks, not just wrong totals.
    return (torch.arange(numel, device=device, dtype=torch.int64) + index + rank) % 7 + 1


def element_size(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def allreduces_per_graph(spec: dict, tokens: int) -> int:
    """2 x layers (one forward pass) while the buffers fit GRAPH_BUFFER_BYTES, else fewer, at least MIN_ALLREDUCES."""
    size = tokens * spec["hidden"] * element_size(spec["dtype"])
    return min(spec["allreduces"], max(MIN_ALLREDUCES, GRAPH_BUFFER_BYTES // size))


def timed_replays(torch, graph) -> list[float]:
    """WARMUP_REPLAYS replays, then TIMED_REPLAYS timed ones: milliseconds each."""
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(TIMED_REPLAYS)]
    for start, end in events:  # back to back, as a server replays; the all-reduces keep ranks in step
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


class Reductions:
    """The in-place all-reduces of one graph at one size: buffers holding this rank's pattern, their exact sums."""

    def __init__(self, torch, dist, spec: dict, tokens: int, rank: int, world: int, device):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec["dtype"]]
        numel = tokens * spec["hidden"]
        self.torch, self.dist, self.tokens = torch, dist, tokens
        self.on_gpu = spec["backend"] == "nccl"
        self.count = allreduces_per_graph(spec, tokens)
        self.pristine = [pattern(torch, rank, i, numel, device).to(dtype) for i in range(self.count)]
        self.expected = [sum(pattern(torch, r, i, numel, device) for r in range(world)).to(dtype)
                         for i in range(self.count)]
        self.buffers = [p.clone() for p in self.pristine]

    def reset(self) -> None:
        for buffer, source in zip(self.buffers, self.pristine):
            buffer.copy_(source)

    def check(self, stage: str) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()
        wrong = sum(not self.torch.equal(b, e) for b, e in zip(self.buffers, self.expected))
        if wrong:
            raise RuntimeError(f"wrong sums after {stage} at {self.tokens} tokens ({wrong} of {self.count} buffers)")

    def run(self) -> None:
        for buffer in self.buffers:
            self.dist.all_reduce(buffer)


def _graph_timings(torch, reductions: Reductions) -> list[float]:
    # Eager warm-up on a side stream, as CUDA graph capture of NCCL calls requires.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        reductions.run()
    torch.cuda.current_stream().wait_stream(side)
    reductions.check("eager all-reduce")
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            reductions.run()
    except Exception as exc:
        raise RuntimeError(f"CUDA graph capture failed at {reductions.tokens} tokens: {type(exc).__name__}: {exc}")
    reductions.reset()
    graph.replay()
    reductions.check("graph replay")
    milliseconds = timed_replays(torch, graph)
    reductions.reset()
    graph.replay()
    reductions.check("timed replays")  # the graph still sums right after being replayed many times
    return milliseconds


def _loop_timings(reductions: Reductions) -> list[float]:
    reductions.run()
    reductions.check("all-reduce")
    milliseconds = []
    for _ in range(WARMUP_REPLAYS + TIMED_REPLAYS):
        began = time.perf_counter()
        reductions.run()
        milliseconds.append((time.perf_counter() - began) * 1e3)
    return milliseconds[WARMUP_REPLAYS:]


def measure_nccl(torch, dist, spec: dict, rank: int, world: int, device) -> dict:
    """Microseconds per all-reduce at each size of ``spec["tokens"]`` (keys are strings): the median timed replay
    of a CUDA graph of all-reduces (a timed loop on CPU tensors), divided by the all-reduces it holds."""
    results = {}
    for tokens in spec["tokens"]:
        reductions = Reductions(torch, dist, spec, tokens, rank, world, device)
        if reductions.on_gpu:
            milliseconds = _graph_timings(torch, reductions)
        else:
            milliseconds = _loop_timings(reductions)
        results[str(tokens)] = statistics.median(milliseconds) * 1e3 / reductions.count
    return results
