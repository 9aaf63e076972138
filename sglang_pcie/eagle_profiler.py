"""EAGLE3_PROFILE=1: per-phase timers for SGLang's EAGLE speculative decoding cycle.

One decode cycle of an EAGLE worker is: draft (the draft model proposes tokens), verify (the target model scores
them and the acceptance rule keeps a prefix), draft re-extend (the draft model catches up on the accepted tokens).
``wrap(function, phase)`` times a worker method as one of those phases ("cycle" for the whole
``forward_batch_generation``); the runtime patch (``sglang_pcie.patches.eagle3_profile``) and the versioned diffs
both install exactly these wrappers.

Why the timers do not change what they measure:

* On CUDA every phase boundary is a ``torch.cuda.Event`` recorded on the current stream, the stream the worker
  launches that phase on (SGLang's forward stream under the overlap scheduler).  Events sit outside any CUDA graph:
  they bracket the graph replay on the stream, so they time it.  Recording costs a few microseconds of host time and
  no GPU time; nothing waits for the GPU while a cycle runs.
* Events live in a fixed ring of slots, one slot per cycle.  After each cycle the reader takes at most
  ``READ_PER_CALL`` of the oldest cycles that are ``DRAIN_LAG`` cycles old and that the GPU has passed (it asks with
  ``cudaEventQuery``, which never waits; by then the GPU has finished them, SGLang never runs more than a cycle or
  two ahead).  So reading is spread over the cycles: no call reads a whole batch.  Only if ``DRAIN_BATCH +
  DRAIN_LAG`` cycles pile up unread (a GPU that far behind) does the reader wait, once, and read ``DRAIN_BATCH`` of
  them (counted as ``syncs`` in the report).  So: at most one synchronisation per batch, none in practice, none
  per phase.
* Under the overlap scheduler the next cycle is launched before the previous one has finished on the GPU.  Each
  cycle has its own slot and its events are recorded in stream order, so its GPU timings are its own; the accepted
  token count of a v2 cycle (a GPU tensor) is summed on the stream and copied into pinned host memory on the
  stream, and read with the cycle's events - never with ``.item()``, which would wait.
* Memory is bounded: the ring has ``DRAIN_BATCH + DRAIN_LAG + 1`` slots whatever the interval; per interval at most
  ``RESERVOIR`` samples per phase are kept for the percentiles (the means are exact).
* Without CUDA, the same code uses ``time.perf_counter`` marks (the host's view of the phases).

Every ``EAGLE3_PROFILE_INTERVAL`` decode cycles TP rank 0 logs one line through the worker module's logger,
appends one JSON object to ``EAGLE3_PROFILE_FILE`` (schema below) and, when SGLang's metrics are enabled, feeds
the Prometheus metrics ``sglang_pcie_eagle_phase_seconds{phase=...}`` and ``sglang_pcie_eagle_accept_length``.
Other ranks do nothing beyond one attribute check per call.

JSON-lines record (``"schema": "sglang-pcie.eagle3-profile/1"``), one per interval::

    schema, time (unix s), pid, tp_rank, worker (class name), timer ("cuda" | "host"), interval (configured),
    decode_cycles, prefill_cycles, idle_cycles, decode_requests (sum of batch sizes over decode cycles),
    tokens (tokens emitted by decode cycles: accepted drafts + the bonus token, per request),
    accept_length (tokens / decode_requests, as SGLang's "accept len"; null if unknown),
    phases_ms: {draft, verify, draft_extend, other, cycle: {mean, p50, p90, share}}   (share: of the mean cycle),
    prefill_ms: {mean, p50, p90} | null,
    tokens_per_s (tokens / summed cycle time), tokens_per_s_per_request (accept_length / mean cycle),
    wall_s (host time from the first to the last decode cycle of the interval),
    baseline_ms, break_even_accept_length (cycle / baseline), projected_speedup (accept x baseline / cycle)
    (the last three null without EAGLE3_PROFILE_BASELINE_MS), syncs (forced waits for the GPU while reading).

This module imports neither sglang nor torch at import time.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import random
import time
from collections import deque

from sglang_pcie.base import mark

PATCH_ID = "eagle3-profile"
SCHEMA = "sglang-pcie.eagle3-profile/1"
LOG_PREFIX = "sglang-pcie eagle3-profile"
CYCLE = "cycle"
PHASES = ("draft", "verify", "draft_extend")  # a decode cycle's phases, in cycle order
REPORTED = PHASES + ("other", CYCLE)  # "other": the cycle minus its phases (host gaps, bookkeeping kernels)

DRAIN_BATCH = 64  # cycles read at once, waiting for the GPU if need be, when this many + DRAIN_LAG are unread
DRAIN_LAG = 4  # cycles left unread behind the newest, so the ones read are finished on the GPU
READ_PER_CALL = 2  # finished cycles read after each cycle at most: > 1 so a backlog drains, small so no call is slow
MAX_SPANS = 6  # phase calls timed per cycle (pipeline-parallel tail drafting calls draft twice)
RESERVOIR = 4096  # samples kept per series per interval for p50/p90

# Prometheus histogram buckets (seconds) spanning a sub-millisecond draft step to a slow prefill.
PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.010, 0.0125, 0.015, 0.0175,
                 0.020, 0.025, 0.030, 0.040, 0.050, 0.075, 0.100, 0.250, 0.500, 1.0, 2.5)
ACCEPT_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)


def disabled_reason(settings) -> str | None:
    """Why profiling is off under ``settings`` (a ``sglang_pcie.settings.Settings``), or None when it is on."""
    if settings.disabled:
        return "SGLANG_PCIE_DISABLE is set"
    if PATCH_ID in settings.disabled_patches:
        return "listed in SGLANG_PCIE_DISABLE_PATCHES"
    if not settings.eagle3_profile:
        return "EAGLE3_PROFILE is not set to 1"
    return None


def profile_phase(phase: str):
    """Decorator the versioned diffs put on the worker methods: ``wrap`` when profiling is on, else identity."""
    from sglang_pcie.settings import load_settings

    if disabled_reason(load_settings()) is not None:
        return _identity
    return functools.partial(wrap, phase=phase)


def _identity(function):
    return function


# --------------------------------------------------------------------------------------------- the wrappers


def wrap(function, phase: str):
    """``function`` (a worker method) timed as ``phase`` ("cycle" or one of ``PHASES``)."""
    if phase == CYCLE:
        @functools.wraps(function)
        def timed_cycle(self, *args, **kwargs):
            profiler = _PROFILER or get_profiler()
            slot = profiler.begin_cycle(self, function, args, kwargs) if profiler.active else None
            if slot is None:
                return function(self, *args, **kwargs)
            try:
                result = function(self, *args, **kwargs)
            except BaseException:
                profiler.abort_cycle(slot)
                raise
            profiler.end_cycle(slot, result)
            return result
        wrapper = timed_cycle
    elif phase in PHASES:
        @functools.wraps(function)
        def timed_phase(self, *args, **kwargs):
            profiler = _PROFILER
            span = profiler.begin_phase(phase) if profiler is not None and profiler.active else None
            if span is None:
                return function(self, *args, **kwargs)
            try:
                return function(self, *args, **kwargs)
            finally:
                profiler.end_phase(span)
        wrapper = timed_phase
    else:
        raise ValueError(f"unknown EAGLE phase {phase!r}; expected {CYCLE!r} or one of {', '.join(PHASES)}")
    wrapper.sglang_pcie_phase = phase
    return mark(wrapper, PATCH_ID)


_PROFILER: "Profiler | None" = None  # one per process: SGLang runs one EAGLE worker per scheduler process


def get_profiler() -> "Profiler":
    """The process's profiler, made from the environment at the first cycle."""
    global _PROFILER
    if _PROFILER is None:
        from sglang_pcie.settings import load_settings

        settings = load_settings()
        _PROFILER = Profiler(interval=settings.eagle3_profile_interval,
                             baseline_ms=settings.eagle3_profile_baseline_ms,
                             path=settings.eagle3_profile_file)
    return _PROFILER


def set_profiler(profiler: "Profiler | None") -> None:
    """Replace the process's profiler (tests, benchmarks); None: made again from the environment when next needed."""
    global _PROFILER
    _PROFILER = profiler


# ------------------------------------------------------------------------------------------------- clocks


class HostClock:
    """``time.perf_counter`` marks: the host's view of the phases, where there is no CUDA."""

    name = "host"

    def new_marks(self, count):
        return [0.0] * count

    def capturing(self):
        return False

    def record(self, marks, index):
        marks[index] = time.perf_counter()

    def is_done(self, marks, index):
        return True

    def wait(self, marks, index):
        pass

    def elapsed_ms(self, marks, start, end):
        return (marks[end] - marks[start]) * 1e3

    def stage_tokens(self, slot_index, accept_lens):
        return int(accept_lens.sum())

    def read_tokens(self, slot_index, staged):
        return staged


class CudaClock:
    """CUDA events on the current stream; read only once the GPU has passed them (see the module docstring)."""

    name = "cuda"

    def __init__(self, torch, slots):
        self.torch = torch
        # accepted-token sums of v2 cycles, copied here on the stream: readable once the cycle's events are.
        # One 0-d view per slot, made once: indexing would build a tensor per cycle.
        self.pinned_tokens = torch.zeros(slots, dtype=torch.int64, pin_memory=True)
        self.pinned_slots = self.pinned_tokens.unbind()
        # torch.cuda.current_stream() (what Event.record() calls) runs ~15 Python calls to build a Stream; the current
        # (device, stream) from torch's C API is two calls.  The Stream is rebuilt only when that key changes, so
        # every mark is still recorded on the stream current at that moment.  Without those C functions: Event.record().
        get_device = getattr(torch._C, "_cuda_getDevice", None)
        get_stream = getattr(torch._C, "_cuda_getCurrentStream", None)
        self._stream_key_now = (lambda: get_stream(get_device())) if get_device and get_stream else None
        self._stream_key = self._stream = None

    def new_marks(self, count):
        return [self.torch.cuda.Event(enable_timing=True) for _ in range(count)]

    def capturing(self):
        return self.torch.cuda.is_current_stream_capturing()

    def record(self, marks, index):
        if self._stream_key_now is None:
            marks[index].record()
            return
        key = self._stream_key_now()
        if key != self._stream_key:
            self._stream = self.torch.cuda.current_stream()
            self._stream_key = key
        marks[index].record(self._stream)

    def is_done(self, marks, index):
        return marks[index].query()

    def wait(self, marks, index):
        marks[index].synchronize()

    def elapsed_ms(self, marks, start, end):
        return marks[start].elapsed_time(marks[end])

    def stage_tokens(self, slot_index, accept_lens):
        if not accept_lens.is_cuda:
            return int(accept_lens.sum())
        total = accept_lens.sum(dtype=self.torch.int64)
        self.pinned_slots[slot_index].copy_(total, non_blocking=True)
        return None  # read from pinned memory once the cycle's end event has completed

    def read_tokens(self, slot_index, staged):
        return int(self.pinned_slots[slot_index]) if staged is None else staged


def default_clock(slots):
    try:
        import torch
    except ImportError:
        return HostClock()
    if torch.cuda.is_available():
        return CudaClock(torch, slots)
    return HostClock()


# ----------------------------------------------------------------------------------------- per-cycle data


_STAGED = object()  # a slot's token count, still on its way from the GPU


class _Slot:
    """One cycle's marks: 0/1 bracket the cycle, then one pair per phase call."""

    __slots__ = ("index", "marks", "spans", "kind", "host_start", "host_end", "batch_size", "tokens",
                 "staged_tokens", "open_phases", "idle_before")

    def __init__(self, index, marks):
        self.index = index
        self.marks = marks
        self.spans = []  # (phase, start mark, end mark)
        self.open_phases = set()

    def reset(self, kind, idle_before):
        self.kind = kind
        self.idle_before = idle_before  # idle cycles since the previous slot: counted in order, when read
        self.spans.clear()
        self.open_phases.clear()
        self.batch_size = self.tokens = self.staged_tokens = None


class Series:
    """Exact count and mean; percentiles from a bounded reservoir sample (exact up to ``RESERVOIR`` values)."""

    def __init__(self, rng):
        self.count = 0
        self.total = 0.0
        self.samples = []
        self._rng = rng

    def add(self, value):
        self.count += 1
        self.total += value
        if len(self.samples) < RESERVOIR:
            self.samples.append(value)
        else:
            keep = self._rng.randrange(self.count)
            if keep < RESERVOIR:
                self.samples[keep] = value

    @property
    def mean(self):
        return self.total / self.count if self.count else None

    def quantile(self, q):
        return quantile(sorted(self.samples), q)


def quantile(ordered, q):
    """Linear interpolation between the closest ranks (numpy's default); None for no data."""
    if not ordered:
        return None
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class IntervalStats:
    """What one interval accumulates; ``record()`` turns it into the JSON-lines object."""

    def __init__(self):
        rng = random.Random(0)
        self.series = {name: Series(rng) for name in REPORTED}
        self.prefill = Series(rng)
        self.decode_cycles = self.prefill_cycles = self.idle_cycles = 0
        self.requests = 0  # sum of batch sizes over decode cycles whose accepted tokens are known
        self.tokens = 0
        self.wall_start = self.wall_end = None
        self.syncs = 0

    def add_decode(self, phase_ms: dict, cycle_ms: float, batch_size, tokens, host_start=None, host_end=None):
        for phase in PHASES:
            self.series[phase].add(phase_ms.get(phase, 0.0))
        self.series["other"].add(max(0.0, cycle_ms - sum(phase_ms.values())))
        self.series[CYCLE].add(cycle_ms)
        if batch_size and tokens is not None:
            self.requests += batch_size
            self.tokens += tokens
        self.decode_cycles += 1
        if host_start is not None:
            self.wall_start = host_start if self.wall_start is None else self.wall_start
            self.wall_end = host_end

    def add_prefill(self, cycle_ms: float):
        self.prefill.add(cycle_ms)
        self.prefill_cycles += 1

    def record(self, baseline_ms=None, **meta) -> dict:
        cycle_mean = self.series[CYCLE].mean
        phases = {}
        for name, series in self.series.items():
            mean = series.mean
            phases[name] = {"mean": mean, "p50": series.quantile(0.5), "p90": series.quantile(0.9),
                            "share": (mean / cycle_mean) if mean is not None and cycle_mean else None}
        accept = self.tokens / self.requests if self.requests else None
        cycle_total_s = self.series[CYCLE].total / 1e3
        record = {"schema": SCHEMA, "time": time.time(), "pid": os.getpid(), **meta,
                  "decode_cycles": self.decode_cycles, "prefill_cycles": self.prefill_cycles,
                  "idle_cycles": self.idle_cycles, "decode_requests": self.requests, "tokens": self.tokens,
                  "accept_length": accept, "phases_ms": phases,
                  "prefill_ms": ({"mean": self.prefill.mean, "p50": self.prefill.quantile(0.5),
                                  "p90": self.prefill.quantile(0.9)} if self.prefill.count else None),
                  "tokens_per_s": (self.tokens / cycle_total_s) if accept is not None and cycle_total_s else None,
                  "tokens_per_s_per_request": (accept * 1e3 / cycle_mean) if accept and cycle_mean else None,
                  "wall_s": (self.wall_end - self.wall_start) if self.wall_start is not None else None}
        record.update(projection(cycle_mean, accept, baseline_ms))
        record["syncs"] = self.syncs
        return record


def projection(cycle_ms, accept_length, baseline_ms) -> dict:
    """Break-even accept length (cycle / baseline) and projected speedup (accept x baseline / cycle)."""
    if not baseline_ms or not cycle_ms:
        return {"baseline_ms": baseline_ms, "break_even_accept_length": None, "projected_speedup": None}
    return {"baseline_ms": baseline_ms, "break_even_accept_length": cycle_ms / baseline_ms,
            "projected_speedup": (accept_length * baseline_ms / cycle_ms) if accept_length else None}


def _num(value, digits=3):
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_line(record: dict) -> str:
    """The one log line of an interval; ``profile_report`` parses it back."""
    parts = [f"{LOG_PREFIX} [timer={record.get('timer')} syncs={record['syncs']}]:"
             f" decode_cycles={record['decode_cycles']} prefill_cycles={record['prefill_cycles']}"
             f" idle_cycles={record['idle_cycles']}"]
    for name in REPORTED:
        p = record["phases_ms"][name]
        share = "n/a" if p["share"] is None else f"{p['share'] * 100:.1f}%"
        parts.append(f"{name} mean={_num(p['mean'])} p50={_num(p['p50'])} p90={_num(p['p90'])} ms share={share}")
    parts.append(f"accept_len={_num(record['accept_length'], 2)} tokens={record['tokens']}")
    parts.append(f"tokens/s={_num(record['tokens_per_s'], 1)}"
                 f" per_request={_num(record['tokens_per_s_per_request'], 1)}")
    if record.get("baseline_ms"):
        speedup = record["projected_speedup"]
        parts.append(f"baseline={_num(record['baseline_ms'])} ms"
                     f" break_even_accept_len={_num(record['break_even_accept_length'], 2)}"
                     f" projected_speedup={'n/a' if speedup is None else f'{speedup:.2f}x'}")
    return " | ".join(parts)


# ----------------------------------------------------------------------------------------------- profiler


class Profiler:
    """Collects the cycles of one process's EAGLE worker and reports every ``interval`` decode cycles."""

    def __init__(self, interval=200, baseline_ms=None, path=None, clock=None, drain_batch=DRAIN_BATCH,
                 drain_lag=DRAIN_LAG, read_per_call=READ_PER_CALL):
        self.interval = interval
        self.baseline_ms = baseline_ms
        self.path = path
        self.active = True  # False on ranks other than TP 0, and once something went wrong
        self.drain_batch = max(1, min(drain_batch, interval))
        self.drain_lag = drain_lag
        self.read_per_call = read_per_call  # 0: read only in batches of drain_batch
        self._clock = clock
        self._bound = False
        self._slots = []
        self._free = []
        self._pending = deque()
        self._current = None  # the cycle being run by the worker, if any
        self._idle = 0  # idle cycles (DP attention ranks with nothing to do) not yet attached to a slot
        self.stats = IntervalStats()
        self.records = deque(maxlen=16)  # the last intervals' records, for inspection
        self.logger = logging.getLogger(__name__)
        self.meta = {}
        self.metrics = None

    # -- binding to the worker, at its first cycle

    def _bind(self, worker, function):
        self._bound = True
        rank = tp_rank(worker)
        if rank != 0:
            self.active = False
            return
        self.logger = logging.getLogger(function.__module__)
        capacity = self.drain_batch + self.drain_lag + 1
        if self._clock is None:
            self._clock = default_clock(capacity)
        marks_per_cycle = 2 + 2 * MAX_SPANS
        self._slots = [_Slot(i, self._clock.new_marks(marks_per_cycle)) for i in range(capacity)]
        self._free = list(reversed(self._slots))
        self.meta = {"tp_rank": rank, "worker": type(worker).__name__, "timer": self._clock.name,
                     "interval": self.interval}
        if metrics_enabled(worker):
            self.metrics = PrometheusExport.create(model_name(worker), self.logger)

    # -- the hot path: called by the wrappers.  A profiler error stops profiling, never the worker.

    def begin_cycle(self, worker, function, args, kwargs):
        try:
            if not self._bound:
                self._bind(worker, function)
                if not self.active:
                    return None
            if self._current is not None or self._clock.capturing():
                return None  # nested call (a subclass calling super()), or a CUDA graph being captured
            kind = cycle_kind(args[0] if args else kwargs.get("batch", kwargs.get("model_worker_batch")))
            if kind == "idle":
                self._idle += 1
                return None
            slot = self._free.pop()
            slot.reset(kind, self._idle)
            self._idle = 0
            slot.host_start = time.perf_counter()
            self._clock.record(slot.marks, 0)
            self._current = slot
            return slot
        except Exception as exc:
            self._fail(exc)
            return None

    def end_cycle(self, slot, result):
        try:
            if slot.kind == "decode":
                self._count_tokens(slot, result)
            self._clock.record(slot.marks, 1)
            slot.host_end = time.perf_counter()
            self._current = None
            self._pending.append(slot)
            self._read_finished(self.read_per_call)
            if len(self._pending) >= self.drain_batch + self.drain_lag:
                self._drain(self.drain_batch)
        except Exception as exc:
            self._fail(exc)

    def abort_cycle(self, slot):
        self._current = None
        self._idle += slot.idle_before
        self._free.append(slot)

    def begin_phase(self, phase):
        slot = self._current
        if slot is None or slot.kind != "decode" or phase in slot.open_phases or len(slot.spans) >= MAX_SPANS:
            return None
        try:
            start = 2 + 2 * len(slot.spans)
            slot.spans.append((phase, start, start + 1))
            slot.open_phases.add(phase)
            self._clock.record(slot.marks, start)
            return slot, phase, start + 1
        except Exception as exc:
            self._fail(exc)
            return None

    def end_phase(self, span):
        slot, phase, end = span
        try:
            self._clock.record(slot.marks, end)
            slot.open_phases.discard(phase)
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc):
        self.active = False
        self._current = None
        self.logger.warning(f"{LOG_PREFIX}: profiling stopped: {type(exc).__name__}: {exc}")

    def _count_tokens(self, slot, result):
        """Tokens this decode cycle emitted (accepted drafts + one bonus token per request), without waiting."""
        accept_lens = getattr(result, "accept_lens", None)  # v2: per request, bonus included, on the GPU
        if accept_lens is not None and hasattr(accept_lens, "shape"):
            slot.batch_size = int(accept_lens.shape[0])
            slot.staged_tokens = self._clock.stage_tokens(slot.index, accept_lens)
            slot.tokens = _STAGED
            return
        for name in ("accept_length_per_req_cpu", "num_accepted_drafts_per_req_cpu"):  # v1: drafts only
            per_request = getattr(result, name, None)
            if per_request is not None:
                slot.batch_size = len(per_request)
                slot.tokens = sum(per_request) + len(per_request)
                return

    # -- reading finished cycles

    def _read_finished(self, limit):
        """Read up to ``limit`` of the oldest cycles ``drain_lag`` cycles old that the GPU has passed; never waits."""
        pending, clock = self._pending, self._clock
        while limit > 0 and len(pending) > self.drain_lag:
            slot = pending[0]
            for mark_index in _end_marks(slot):
                if not clock.is_done(slot.marks, mark_index):
                    return  # the GPU is behind: read it after a later cycle, or in a batch
            pending.popleft()
            try:
                self._take(slot)
            finally:
                self._free.append(slot)
            limit -= 1

    def _drain(self, count):
        """Read the ``count`` oldest cycles, waiting for the GPU (once) if it has not passed them."""
        batch = [self._pending.popleft() for _ in range(min(count, len(self._pending)))]
        for slot in reversed(batch):  # newest first: once it is done, the older ones on its stream are too
            for mark_index in _end_marks(slot):
                if not self._clock.is_done(slot.marks, mark_index):
                    self._clock.wait(slot.marks, mark_index)
                    self.stats.syncs += 1
        for slot in batch:
            try:
                self._take(slot)
            finally:
                self._free.append(slot)

    def _take(self, slot):
        clock = self._clock
        self.stats.idle_cycles += slot.idle_before
        cycle_ms = clock.elapsed_ms(slot.marks, 0, 1)
        if slot.kind == "prefill":
            self.stats.add_prefill(cycle_ms)
            if self.metrics:
                self._export(self.metrics.observe_phase, "prefill", cycle_ms)
            return
        phase_ms = {}
        for phase, start, end in slot.spans:
            phase_ms[phase] = phase_ms.get(phase, 0.0) + clock.elapsed_ms(slot.marks, start, end)
        tokens = slot.tokens
        if tokens is _STAGED:
            tokens = clock.read_tokens(slot.index, slot.staged_tokens)
        self.stats.add_decode(phase_ms, cycle_ms, slot.batch_size, tokens, slot.host_start, slot.host_end)
        if self.metrics:
            accept = tokens / slot.batch_size if slot.batch_size and tokens is not None else None
            self._export(self.metrics.observe_cycle, phase_ms, cycle_ms, accept)
        if self.stats.decode_cycles >= self.interval:
            self._report()

    def _export(self, observe, *args):
        try:
            observe(*args)
        except Exception as exc:  # a broken metrics directory must not stop the profile
            self.metrics = None
            self.logger.warning(f"{LOG_PREFIX}: Prometheus export off: {type(exc).__name__}: {exc}")

    def _report(self):
        record = self.stats.record(self.baseline_ms, **self.meta)
        self.stats = IntervalStats()
        self.records.append(record)
        self.logger.info(format_line(record))
        if self.path:
            try:
                with open(self.path, "a", encoding="utf-8") as out:
                    out.write(json.dumps(record) + "\n")
            except OSError as exc:
                self.logger.warning(f"{LOG_PREFIX}: cannot append to EAGLE3_PROFILE_FILE={self.path!r}: {exc};"
                                    " file output off")
                self.path = None
        return record

    def flush(self) -> dict | None:
        """Read every finished cycle (waiting for the GPU) and report the partial interval, if any."""
        self._drain(len(self._pending))
        self.stats.idle_cycles += self._idle
        self._idle = 0
        return self._report() if self.stats.decode_cycles else None


def _end_marks(slot):
    """The marks recorded last in a slot: the cycle's end, then each phase's (a phase may run on another stream)."""
    return [1] + [end for _, _, end in slot.spans]


def cycle_kind(batch) -> str:
    """"prefill", "idle" or "decode", by the same test SGLang's workers branch on."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None:
        return "decode"
    if mode.is_extend() or getattr(batch, "is_extend_in_batch", False):
        return "prefill"
    if mode.is_idle():
        return "idle"
    return "decode"


def tp_rank(worker) -> int:
    """The worker's tensor-parallel rank: its ``tp_rank`` (v1, v2 up to 0.5.15), else SGLang's TP group."""
    rank = getattr(worker, "tp_rank", None)
    if isinstance(rank, int):
        return rank
    try:
        from sglang.srt.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except Exception:  # no TP group: a single process
        pass
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    return 0


def metrics_enabled(worker) -> bool:
    """SGLang's own switch: ``--enable-metrics`` (``server_args.enable_metrics``)."""
    return bool(getattr(getattr(worker, "server_args", None), "enable_metrics", False))


def model_name(worker) -> str:
    args = getattr(worker, "server_args", None)
    return str(getattr(args, "served_model_name", None) or getattr(args, "model_path", None) or "")


# --------------------------------------------------------------------------------------------- Prometheus


_METRICS_BY_NAME: dict = {}  # prometheus_client refuses to register one name twice per process


class PrometheusExport:
    """The figures as Prometheus metrics, in the registry SGLang serves (its multiprocess directory).

    SGLang sets ``PROMETHEUS_MULTIPROC_DIR`` before starting the scheduler processes when metrics are enabled and
    creates its collectors in those processes with plain ``prometheus_client`` constructors; these do the same.
    """

    def __init__(self, phase_seconds, accept_length, model, logger):
        self.phase_seconds = phase_seconds
        self.accept_length = accept_length
        self.model = model
        self.logger = logger

    @classmethod
    def create(cls, model, logger):
        try:
            from prometheus_client import Histogram

            if "phase" not in _METRICS_BY_NAME:
                _METRICS_BY_NAME["phase"] = Histogram(
                    "sglang_pcie_eagle_phase_seconds",
                    "Time of one EAGLE speculative decoding phase per cycle (sglang-pcie EAGLE3_PROFILE)",
                    labelnames=["model_name", "phase"], buckets=PHASE_BUCKETS)
                _METRICS_BY_NAME["accept"] = Histogram(
                    "sglang_pcie_eagle_accept_length",
                    "Tokens emitted per request per EAGLE decode cycle (sglang-pcie EAGLE3_PROFILE)",
                    labelnames=["model_name"], buckets=ACCEPT_BUCKETS)
            return cls(_METRICS_BY_NAME["phase"], _METRICS_BY_NAME["accept"], model, logger)
        except Exception as exc:  # no prometheus_client, or an incompatible one: metrics off, serving on
            logger.warning(f"{LOG_PREFIX}: Prometheus export off: {type(exc).__name__}: {exc}")
            return None

    def observe_phase(self, phase, ms):
        self.phase_seconds.labels(self.model, phase).observe(ms / 1e3)

    def observe_cycle(self, phase_ms, cycle_ms, accept_length):
        for phase in PHASES:
            self.observe_phase(phase, phase_ms.get(phase, 0.0))
        self.observe_phase(CYCLE, cycle_ms)
        if accept_length is not None:
            self.accept_length.labels(self.model).observe(accept_length)
