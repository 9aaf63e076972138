"""EAGLE profiler fakes for the profiler's and profile-report's tests: intervals built with the profiler's own
statistics, a GPU timeline the test advances, and a worker / scheduler shaped like SGLang's."""
from __future__ import annotations

import functools
import sys
import types

from sglang_pcie.patches.eagle3_profile import payload as ep

META = {"run_id": "20261130T100000Z-42", "run_started": 1796032800.0, "pid": 42, "tp_rank": 0, "pp_rank": 0,
        "dp_rank": None, "worker": "EAGLEWorkerV2", "timer": "cuda", "interval": 200}
# The keys of a record of the current schema (docs/eagle3-profile.md); each phases_ms entry has PHASE_KEYS.
RECORD_KEYS = {"schema", "time", "run_id", "run_started", "pid", "tp_rank", "pp_rank", "dp_rank", "worker", "timer",
               "interval", "partial", "decode_cycles", "prefill_cycles", "idle_cycles", "timed_cycles",
               "sample_every", "decode_requests", "requests_all", "tokens", "accept_length", "accept_length_exact",
               "phases_ms", "phases_sum_ms", "cycle_ms", "timed_wall_cycle_ms", "wall_cycle_ms", "wall_cycles",
               "gpu_busy", "bound", "prefill_ms", "wall_s", "tokens_per_s_served", "tokens_per_s_gpu",
               "tokens_per_s_per_request", "profiler_host_us_per_cycle", "profiler_host_share", "baseline_ms",
               "break_even_accept_length", "projected_speedup", "syncs", "unfinished_at_exit",
               # schema 4
               "spec_steps", "spec_topk", "spec_draft_tokens", "accept_hist", "accept_at_least", "draft_step_ms"}
PHASE_KEYS = {"n", "mean", "p50", "p90", "share"}


def spread(batch_size, tokens):
    """The histogram of ``tokens`` over ``batch_size`` requests, as even as it goes (index: tokens per request)."""
    low, extra = divmod(tokens, batch_size)
    hist = [0] * (low + 1 + bool(extra))
    hist[low] += batch_size - extra
    if extra:
        hist[low + 1] += extra
    return hist


def interval_stats(timed, decode_cycles, batch_size=2, tokens=4, wall_cycle_ms=25.0, hist=True):
    """An interval with ``decode_cycles`` counted (tokens known for each, with their histogram unless ``hist`` is
    false), each ``wall_cycle_ms`` apart, and the ``timed`` (draft, verify, draft_extend, cycle[, wall]) ms samples
    (wall: ``wall_cycle_ms`` unless given)."""
    stats = ep.IntervalStats()
    for draft, verify, extend, cycle, *wall in timed:
        stats.add_timed({"draft": draft, "verify": verify, "draft_extend": extend}, cycle,
                        wall[0] if wall else wall_cycle_ms)
    for _ in range(decode_cycles):
        stats.decode_cycles += 1
        stats.requests_all += batch_size
        stats.add_tokens(batch_size, tokens, spread(batch_size, tokens) if hist else None)
    stats.wall_start, stats.wall_end = 0, int(decode_cycles * wall_cycle_ms * 1e6)
    stats.wall_cycle_ns, stats.wall_cycles = int((decode_cycles - 1) * wall_cycle_ms * 1e6), decode_cycles - 1
    return stats


# ------------------------------------------------------------------ the profiler, driven through wrap()


class Mode:
    """The slice of SGLang's ForwardMode the profiler reads (the patch's tests use the real enum)."""

    def __init__(self, name):
        self.name = name

    def is_extend(self):
        return self.name == "extend"

    def is_idle(self):
        return self.name == "idle"


class GpuTimeline:
    """A clock whose marks complete only when the test says the 'GPU' got there: shows when the profiler reads.
    Each mark is 1 ms after the one recorded before it."""

    name = "test"

    def __init__(self, capturing=False):
        self.now = 0.0
        self.completed = 0  # marks [0, completed) are done
        self.recorded = 0
        self.waits = 0
        self.is_capturing = capturing

    def new_marks(self, count):
        return [None] * count

    def capturing(self):
        return self.is_capturing

    def record(self, marks, index):
        assert not self.is_capturing, "an event recorded while a CUDA graph is being captured"
        self.now += 1.0
        marks[index] = (self.recorded, self.now)
        self.recorded += 1

    def is_done(self, marks, index):
        assert not self.is_capturing, "an event query while a CUDA graph is being captured"
        return marks[index][0] < self.completed

    def wait(self, marks, index):
        assert not self.is_capturing, "an event wait while a CUDA graph is being captured"
        self.waits += 1
        self.completed = max(self.completed, marks[index][0] + 1)

    def elapsed_ms(self, marks, start, end):
        assert self.is_done(marks, start) and self.is_done(marks, end), "read before the GPU got there"
        return marks[end][1] - marks[start][1]

    def stage_tokens(self, slot_index, accept_lens):
        return sum(accept_lens)

    def read_tokens(self, slot_index, staged):
        return staged


class AcceptLens(list):
    """accept_lens in host memory (as on a machine without CUDA): counted at once."""

    shape = property(lambda self: (len(self),))
    is_cuda = False

    def sum(self):
        return sum(self)


class DeviceAcceptLens(AcceptLens):
    """accept_lens 'on the GPU': the profiler must not read it on the host."""

    is_cuda = True

    def tolist(self):
        raise AssertionError("a device tensor read on the host")

    def sum(self):
        raise AssertionError("a device tensor read on the host")


class HostCopy(list):
    """What SGLang's copy_to_cpu puts in result.accept_lens: a host tensor."""

    is_cuda = False

    def tolist(self):
        return list(self)


class Worker:
    """A worker shaped like SGLang's (cycle calls draft, verify, re-extend); its methods wrapped by ep.wrap."""

    tp_rank = 0
    accept = (2, 1, 3)
    result_lens = AcceptLens
    # SGLang's settings for a chain of 2 steps: at most 2 drafts accepted + the bonus token
    server_args = types.SimpleNamespace(speculative_num_steps=2, speculative_eagle_topk=1,
                                        speculative_num_draft_tokens=3)

    def __init__(self):
        self.calls = 0

    def forward_batch_generation(self, batch):
        self.calls += 1
        if batch.forward_mode.is_extend():
            return types.SimpleNamespace()
        self.draft(batch)
        self.verify(batch)
        self.draft_extend(batch)
        return types.SimpleNamespace(accept_lens=self.result_lens(self.accept))

    def draft(self, batch):
        return "drafted"

    def verify(self, batch):
        return "verified"

    def draft_extend(self, batch):
        return "extended"


for _name, _phase in (("forward_batch_generation", "cycle"), ("draft", "draft"), ("verify", "verify"),
                      ("draft_extend", "draft_extend")):
    setattr(Worker, _name, ep.wrap(getattr(Worker, _name), _phase))


class Scheduler:
    """What SGLang's scheduler does with each result, in order: copy accept_lens to the host right after the
    forward (copy_to_cpu, with a copy_done event), and read it after the next forward."""

    def __init__(self, worker, copies=True):
        self.worker = worker
        self.copies = copies

    def step(self, mode="decode"):
        result = self.worker.forward_batch_generation(batch(mode))
        if self.copies and getattr(result, "accept_lens", None) is not None:
            result.accept_lens = HostCopy(result.accept_lens)
            result.copy_done = types.SimpleNamespace(query=lambda: True)
        return result


def batch(mode="decode"):
    return types.SimpleNamespace(forward_mode=Mode(mode), is_extend_in_batch=False)


# ------------------------------------------------ a simulated GPU stream under SGLang's overlap scheduler


class SimulatedStream:
    """A clock over one simulated CUDA stream: the host's time (``host_ms``, what the profiler's perf_counter reads)
    and the stream's (work runs in launch order; an event completes when the stream reaches it).  ``launch(ms)``
    enqueues GPU work; the host only waits where the scheduler would (``wait_until``)."""

    name = "simulated"

    def __init__(self):
        self.host_ms = 0.0
        self.tail_ms = 0.0  # when the stream finishes what was launched so far

    def host_ns(self):
        return int(self.host_ms * 1e6)

    def launch(self, ms, host_cost_ms=0.01):
        self.tail_ms = max(self.host_ms, self.tail_ms) + ms
        self.host_ms += host_cost_ms

    def wait_until(self, gpu_ms):
        self.host_ms = max(self.host_ms, gpu_ms)

    def new_marks(self, count):
        return [None] * count

    def capturing(self):
        return False

    def record(self, marks, index):
        marks[index] = max(self.host_ms, self.tail_ms)

    def is_done(self, marks, index):
        return marks[index] <= self.host_ms

    def wait(self, marks, index):
        self.wait_until(marks[index])

    def elapsed_ms(self, marks, start, end):
        return marks[end] - marks[start]

    def stage_tokens(self, slot_index, accept_lens):
        return sum(accept_lens)

    def read_tokens(self, slot_index, staged):
        return staged


class SimulatedWorker:
    """A worker whose phases launch GPU work of the lengths ``durations()`` gives for each cycle."""

    tp_rank = 0

    def __init__(self, stream, durations):
        self.stream = stream
        self.durations = durations
        self.current = None

    def forward_batch_generation(self, batch):
        self.current = self.durations()
        self.draft(batch)
        self.verify(batch)
        self.draft_extend(batch)
        return types.SimpleNamespace(accept_lens=AcceptLens([2, 3]))

    def draft(self, batch):
        self.stream.launch(self.current[0])

    def verify(self, batch):
        self.stream.launch(self.current[1])

    def draft_extend(self, batch):
        self.stream.launch(self.current[2])


for _name, _phase in (("forward_batch_generation", "cycle"), ("draft", "draft"), ("verify", "verify"),
                      ("draft_extend", "draft_extend")):
    setattr(SimulatedWorker, _name, ep.wrap(getattr(SimulatedWorker, _name), _phase))


def run_overlap_scheduler(stream, worker, cycles, host_ms):
    """SGLang's overlap scheduler: launch cycle N, then process cycle N-1's result (wait for the GPU to finish it,
    then ``host_ms`` of host work), then launch N+1.  GPU-bound when a cycle's GPU time exceeds the host's."""
    previous_done = None
    for _ in range(cycles):
        worker.forward_batch_generation(batch())
        done = stream.tail_ms
        if previous_done is not None:
            stream.wait_until(previous_done)
        stream.host_ms += host_ms
        previous_done = done


# ------------------------------------------------------------------------- a deterministic host clock


class OpcodeClock:
    """A host clock that advances one tick per bytecode instruction executed (``sys.settrace`` with opcode events)
    while it runs (``with clock:``): an A/B of the same loop with and without the profiler then measures what the
    profiler adds, instruction for instruction, on any machine, however loaded.  ``now`` stands in for the
    profiler's ``perf_counter_ns``."""

    def __init__(self):
        self.ticks = 0
        self.now = functools.partial(getattr, self, "ticks")  # a C call, as perf_counter_ns is: one instruction

    def charge(self, ticks):
        """Make the current instruction cost ``ticks`` more (an expensive C call, such as recording a CUDA event)."""
        self.ticks += ticks

    def _trace(self, frame, event, arg):
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode":
            self.ticks += 1
        return self._trace

    def __enter__(self):
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)
