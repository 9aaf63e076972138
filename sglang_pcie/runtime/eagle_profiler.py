"""EAGLE3_PROFILE=1: per-phase timers for SGLang's EAGLE speculative decoding cycle.

One decode cycle of an EAGLE worker is: draft (the draft model proposes tokens), verify (the target model scores
them and the acceptance rule keeps a prefix), draft re-extend (the draft model catches up on the accepted tokens).
``wrap(function, phase)`` times a worker method as one of those phases ("cycle" for the whole
``forward_batch_generation``); the runtime patch (``sglang_pcie.patching.eagle3_profile``) and the versioned diffs
both install exactly these wrappers.

What it costs, and why the figures stay honest:

* **Counted every cycle, timed on a sample.**  Every cycle is classified (decode / prefill / idle) and counted, and
  the wall-clock time between consecutive decode cycles is taken from the host clock: a few attribute reads and one
  ``perf_counter_ns``.  Only about one decode cycle in ``sample_every`` (random gaps, so no period of the workload
  aliases with it) gets GPU timers.  ``sample_every`` starts at ``SAMPLE_START`` and, after each interval, is set so
  that the profiler's own host time stays near ``HOST_BUDGET`` of the wall-clock cycle (at most ``SAMPLE_MAX``).
  Phase means and percentiles are therefore over the timed cycles (the record says how many); the counts, the
  tokens, the accept length and the wall-clock figures are over every cycle.
* **Accept length exact, without a kernel.**  SGLang itself copies each v2 cycle's ``accept_lens`` into pinned host
  memory right after the cycle (``copy_to_cpu``, on its copy stream, with a ``copy_done`` event).  The profiler picks
  up that host copy at the start of the next cycle and sums ``TOKEN_BATCH`` of them at once (one concatenation, one
  sum), once the newest one's ``copy_done`` has passed: no kernel, no copy and no wait of its own.  Only where SGLang
  does not copy (the synthetic benchmark, a future scheduler) does it fall back to summing on the stream and copying
  into its own pinned slot, on the timed cycles only; the record then says ``accept_length_exact: false``.  v1
  cycles report per-request host lists.
* **GPU time on the current stream.**  On a timed cycle every phase boundary is a ``torch.cuda.Event`` recorded on
  the stream current at that moment, the stream the worker launches that phase on (SGLang's forward stream under
  the overlap scheduler).  Events sit outside any CUDA graph: they bracket the replay on the stream.  Nothing is
  recorded while a graph is being captured.
* **Reading without synchronising.**  Timed cycles live in a fixed ring of slots.  After each cycle the reader
  takes at most ``READ_PER_CALL`` timed cycles that are ``DRAIN_LAG`` cycles old and that the GPU has passed (an
  event query, which never waits).  Only if ``DRAIN_BATCH + DRAIN_LAG`` timed cycles pile up unread does it wait,
  once, for a batch (counted as ``syncs``).
* **Bounded memory.**  The ring has ``DRAIN_BATCH + DRAIN_LAG + 1`` slots; per interval at most ``RESERVOIR``
  samples per phase; the last 16 records.
* **Own host time measured.**  ``time.perf_counter_ns`` around every hook; each record gives the profiler's host
  time per cycle and its share of the wall time.
* **Nothing lost at exit.**  The process's profiler flushes its last partial interval at interpreter exit
  (``atexit``: normal exit, ``sys.exit``, Ctrl-C) and on SIGTERM (a handler that flushes, then lets the signal do
  what it did before).  At exit it reads only what the GPU has finished; it never waits for it.  SIGKILL (SGLang's
  ``kill_process_tree``, the parent-death signal, the OOM killer) and ``os._exit`` cannot be handled.

Every ``EAGLE3_PROFILE_INTERVAL`` decode cycles TP rank 0 logs one line through the worker module's logger,
appends one JSON object to ``EAGLE3_PROFILE_FILE`` (strict JSON, the fields are documented in
docs/eagle3-profile.md) and, when SGLang's metrics are enabled, feeds the Prometheus histograms
``sglang_pcie_eagle_phase_seconds{phase=...}`` and ``sglang_pcie_eagle_accept_length`` (timed cycles).
Other ranks do nothing beyond one attribute check per call.

This module imports neither sglang nor torch at import time.
"""
from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from collections import deque

from sglang_pcie.runtime.results import is_patched, mark

# The v1 worker's per-request accepted-draft counts (host lists), by release: 0.5.8-0.5.10, 0.5.11, 0.5.12-0.5.12.post1.
V1_ACCEPT_FIELDS = ("accept_length_per_req_cpu", "num_accepted_drafts_per_req_cpu", "num_correct_drafts_per_req_cpu")

PATCH_ID = "eagle3-profile"
SCHEMA_FAMILY = "sglang-pcie.eagle3-profile/"
SCHEMA_MAJOR = 2  # 2: sampled timers, run id and ranks, wall-clock and served figures, profiler host time
SCHEMA = f"{SCHEMA_FAMILY}{SCHEMA_MAJOR}"
LOG_PREFIX = "sglang-pcie eagle3-profile"
CYCLE = "cycle"
PHASES = ("draft", "verify", "draft_extend")  # a decode cycle's phases, in cycle order
REPORTED = PHASES + ("other", CYCLE)  # "other": the cycle minus its phases (host gaps, bookkeeping kernels)
DECODE, PREFILL, IDLE = "decode", "prefill", "idle"

DRAIN_BATCH = 64  # timed cycles read at once, waiting for the GPU if need be, when this many + DRAIN_LAG are unread
DRAIN_LAG = 4  # cycles a timed cycle is left unread, so that the GPU has finished it
READ_PER_CALL = 2  # timed cycles read after each cycle at most: > 1 so a backlog drains, small so no call is slow
MAX_SPANS = 6  # phase calls timed per cycle (pipeline-parallel tail drafting calls draft twice)
RESERVOIR = 4096  # samples kept per series per interval for p50/p90
TOKEN_BATCH = 32  # SGLang's host copies of accept_lens summed together, once the newest one's copy_done has passed
SAMPLE_START = 16  # about one decode cycle in this many is timed in the first interval
SAMPLE_MAX = 64
HOST_BUDGET = 0.002  # sampling aims at profiler host time <= this share of the wall-clock decode cycle
HOST_BOUND_BELOW = 0.9  # GPU busy for less than this share of the wall-clock cycle: host-bound

# Prometheus histogram buckets (seconds) spanning a sub-millisecond draft step to a slow prefill.
PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.010, 0.0125, 0.015, 0.0175,
                 0.020, 0.025, 0.030, 0.040, 0.050, 0.075, 0.100, 0.250, 0.500, 1.0, 2.5)
ACCEPT_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)

_now = time.perf_counter_ns
_IMPORT_TIME = time.time()


def disabled_reason(settings) -> str | None:
    """Why profiling is off under ``settings`` (a ``sglang_pcie.runtime.settings.Settings``), or None when it is on:
    the register's gate of the eagle3-profile patch, which the diffs' decorator asks too."""
    from sglang_pcie.patching import register

    return register.disabled_reason(register.entry(PATCH_ID), settings)


def profile_phase(phase: str):
    """Decorator the versioned diffs put on the worker methods: ``wrap`` when profiling is on, else identity."""
    from sglang_pcie.runtime.settings import for_process

    if disabled_reason(for_process()) is not None:
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
            token = profiler.begin_cycle(self, function, args, kwargs) if profiler.active else None
            if token is None:
                return function(self, *args, **kwargs)
            try:
                result = function(self, *args, **kwargs)
            except BaseException:
                profiler.abort_cycle(token)
                raise
            profiler.end_cycle(token, result)
            return result
        wrapper = timed_cycle
    elif phase in PHASES:
        @functools.wraps(function)
        def timed_phase(self, *args, **kwargs):
            profiler = _PROFILER
            if profiler is None or profiler._current is None:  # not a timed cycle: nothing to do
                return function(self, *args, **kwargs)
            span = profiler.begin_phase(phase)
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
    """The process's profiler, made from the environment at the first cycle; it flushes at exit."""
    global _PROFILER
    if _PROFILER is None:
        from sglang_pcie.runtime.settings import for_process

        settings = for_process()
        _PROFILER = Profiler(interval=settings.eagle3_profile_interval,
                             baseline_ms=settings.eagle3_profile_baseline_ms,
                             path=settings.eagle3_profile_file, exit_flush=True)
    return _PROFILER


def set_profiler(profiler: "Profiler | None") -> None:
    """Replace the process's profiler (tests, benchmarks); None: made again from the environment when next needed."""
    global _PROFILER
    _PROFILER = profiler


# ---------------------------------------------------------------------- EAGLE-family workers that are not timed

UNTIMED_FLAG = "sglang_pcie_untimed_warning"


def flag_untimed_workers(create_worker):
    """Wrap ``SpeculativeAlgorithm.create_worker``: an EAGLE-family worker class whose cycle is not timed (multi-layer
    EAGLE, frozen-KV MTP: they override ``forward_batch_generation``) warns once, naming it, at its first cycle."""
    @functools.wraps(create_worker)
    def create_worker_flagging_untimed(self, *args, **kwargs):
        cls = create_worker(self, *args, **kwargs)
        try:
            if isinstance(cls, type) and _eagle_family(self) and not is_patched(
                    getattr(cls, "forward_batch_generation", None), PATCH_ID):
                _warn_at_first_cycle(cls)
        except Exception:  # a flag is a courtesy: never in SGLang's way
            pass
        return cls
    return mark(create_worker_flagging_untimed, PATCH_ID)


def _eagle_family(algorithm) -> bool:
    return any(callable(getattr(algorithm, test, None)) and getattr(algorithm, test)()
               for test in ("is_eagle", "is_eagle3", "is_standalone", "is_frozen_kv_mtp"))


def _warn_at_first_cycle(cls):
    name = "forward_batch_generation"
    own = cls.__dict__.get(name)
    if getattr(own, UNTIMED_FLAG, False):
        return
    cycle = getattr(cls, name)

    @functools.wraps(cycle)
    def first_cycle(self, *args, **kwargs):
        if cls.__dict__.get(name) is first_cycle:  # put the class back first: this runs once
            if own is None:
                delattr(cls, name)
            else:
                setattr(cls, name, own)
            try:
                if worker_ranks(self)["tp_rank"] in (0, None):
                    logging.getLogger(cls.__module__).warning(
                        f"{LOG_PREFIX}: {cls.__name__} ({cls.__module__}) is not timed: EAGLE3_PROFILE times the"
                        " cycle of EAGLEWorker / EAGLEWorkerV2 and of the workers that run it (standalone); this"
                        " worker runs its own, so this server reports no EAGLE profile")
            except Exception:
                pass
        return cycle(self, *args, **kwargs)

    setattr(first_cycle, UNTIMED_FLAG, True)
    setattr(cls, name, first_cycle)


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
        # Accepted-token sums of timed cycles where SGLang makes no host copy, copied here on the stream: readable
        # once the cycle's events are.  One 0-d view per slot, made once: indexing would build a tensor per cycle.
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


_NO_TOKENS = object()  # a timed slot that carries no token count of its own


class _Slot:
    """One timed cycle's marks: 0/1 bracket the cycle, then one pair per phase call."""

    __slots__ = ("index", "marks", "spans", "kind", "open_phases", "stats", "cycle_no", "batch_size", "staged")

    def __init__(self, index, marks):
        self.index = index
        self.marks = marks
        self.spans = []  # (phase, start mark, end mark)
        self.open_phases = set()

    def reset(self, kind, stats, cycle_no):
        self.kind = kind
        self.stats = stats  # the interval the cycle began in: its figures go there, whenever they are read
        self.cycle_no = cycle_no
        self.spans.clear()
        self.open_phases.clear()
        self.batch_size = None
        self.staged = _NO_TOKENS


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
    """What one interval accumulates; ``record()`` turns it into the JSON-lines object.

    Counts are taken when a cycle runs; GPU times and token counts arrive a few cycles later and go to the
    interval their cycle began in (``outstanding`` counts what is still on its way; the interval is reported once
    it is closed and nothing is outstanding)."""

    def __init__(self):
        rng = random.Random(0)
        self.series = {name: Series(rng) for name in REPORTED}
        self.prefill = Series(rng)
        self.decode_cycles = self.prefill_cycles = self.idle_cycles = 0
        self.requests_all = 0  # sum of batch sizes over all decode cycles (where the worker gives them)
        self.requests = 0  # ... over the decode cycles whose tokens are known
        self.tokens = 0
        self.token_cycles = 0  # decode cycles whose tokens are known
        self.wall_start = self.wall_end = None  # perf_counter_ns: first decode cycle's start, the next cycle's start
        # after the last decode cycle (that cycle's end until then)
        self.wall_cycle_ns = 0  # summed host time from one decode cycle's start to the next's (decode -> decode)
        self.wall_cycles = 0
        self.host_ns = 0  # profiler hooks, all of them
        self.host_timed_ns = 0  # ... the part spent on timed cycles (marks, reading them)
        self.syncs = 0
        self.outstanding = 0
        self.unfinished = 0  # timed cycles / token counts the GPU had not finished when the process exited
        self.sample_every = None
        self.partial = False

    def add_timed(self, phase_ms: dict, cycle_ms: float):
        for phase in PHASES:
            self.series[phase].add(phase_ms.get(phase, 0.0))
        self.series["other"].add(max(0.0, cycle_ms - sum(phase_ms.values())))
        self.series[CYCLE].add(cycle_ms)

    def add_tokens(self, batch_size, tokens):
        if batch_size and tokens is not None:
            self.requests += batch_size
            self.tokens += tokens
            self.token_cycles += 1

    def add_prefill(self, cycle_ms: float):
        self.prefill.add(cycle_ms)

    def record(self, baseline_ms=None, **meta) -> dict:
        cycle_mean = self.series[CYCLE].mean
        phases = {}
        for name, series in self.series.items():
            mean = series.mean
            phases[name] = {"mean": mean, "p50": series.quantile(0.5), "p90": series.quantile(0.9),
                            "share": (mean / cycle_mean) if mean is not None and cycle_mean else None}
        timed = self.series[CYCLE].count
        accept = self.tokens / self.requests if self.requests else None
        exact = accept is not None and self.token_cycles == self.decode_cycles
        # tokens emitted by all decode cycles: counted where exact, else the accept length x their requests
        emitted = self.tokens if exact else (accept * self.requests_all if accept is not None else None)
        wall_s = (self.wall_end - self.wall_start) / 1e9 if self.wall_start is not None else None
        wall_cycle_ms = self.wall_cycle_ns / self.wall_cycles / 1e6 if self.wall_cycles else None
        gpu_busy = cycle_mean / wall_cycle_ms if cycle_mean is not None and wall_cycle_ms else None
        all_cycles = self.decode_cycles + self.prefill_cycles + self.idle_cycles
        gpu_s = cycle_mean * self.decode_cycles / 1e3 if cycle_mean else None
        record = {
            "schema": SCHEMA, "time": time.time(), **meta, "partial": self.partial,
            "decode_cycles": self.decode_cycles, "prefill_cycles": self.prefill_cycles,
            "idle_cycles": self.idle_cycles, "timed_cycles": timed, "sample_every": self.sample_every,
            "decode_requests": self.requests, "requests_all": self.requests_all, "tokens": self.tokens,
            "accept_length": accept, "accept_length_exact": exact,
            "phases_ms": phases,
            "phases_sum_ms": (sum(phases[p]["mean"] for p in PHASES) if timed else None),
            "cycle_ms": cycle_mean, "wall_cycle_ms": wall_cycle_ms, "wall_cycles": self.wall_cycles,
            "gpu_busy": gpu_busy, "bound": bound(gpu_busy),
            "prefill_ms": ({"mean": self.prefill.mean, "p50": self.prefill.quantile(0.5),
                            "p90": self.prefill.quantile(0.9), "timed": self.prefill.count}
                           if self.prefill.count else None),
            "wall_s": wall_s,
            "tokens_per_s_served": emitted / wall_s if emitted is not None and wall_s else None,
            "tokens_per_s_gpu": emitted / gpu_s if emitted is not None and gpu_s else None,
            "tokens_per_s_per_request": accept * 1e3 / wall_cycle_ms if accept and wall_cycle_ms else None,
            "profiler_host_us_per_cycle": self.host_ns / 1e3 / all_cycles if all_cycles else None,
            "profiler_host_share": (self.host_ns / (self.wall_end - self.wall_start)
                                    if self.wall_start is not None and self.wall_end > self.wall_start else None),
        }
        record.update(projection(wall_cycle_ms or cycle_mean, accept, baseline_ms))
        record["syncs"] = self.syncs
        record["unfinished_at_exit"] = self.unfinished
        return finite(record)


def bound(gpu_busy) -> str | None:
    if gpu_busy is None:
        return None
    return "host-bound" if gpu_busy < HOST_BOUND_BELOW else "GPU-bound"


def projection(cycle_ms, accept_length, baseline_ms) -> dict:
    """Break-even accept length (cycle / baseline) and projected speedup (accept x baseline / cycle)."""
    if not baseline_ms or not cycle_ms:
        return {"baseline_ms": baseline_ms, "break_even_accept_length": None, "projected_speedup": None}
    return {"baseline_ms": baseline_ms, "break_even_accept_length": cycle_ms / baseline_ms,
            "projected_speedup": (accept_length * baseline_ms / cycle_ms) if accept_length else None}


def finite(value):
    """``value`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def to_json(record: dict) -> str:
    """Strict JSON: non-finite numbers become null."""
    return json.dumps(finite(record), allow_nan=False)


def _num(value, digits=3):
    return "n/a" if value is None else f"{value:.{digits}f}"


def _rank_text(value):
    return "-" if value is None else str(value)


def format_line(record: dict) -> str:
    """The one log line of an interval; ``profile_report`` parses it back."""
    parts = [f"{LOG_PREFIX} [run={record.get('run_id')} tp={_rank_text(record.get('tp_rank'))}"
             f" pp={_rank_text(record.get('pp_rank'))} dp={_rank_text(record.get('dp_rank'))}"
             f" timer={record.get('timer')} timed={record['timed_cycles']}/{record['decode_cycles']}"
             f" sample=1/{record.get('sample_every') or '-'} syncs={record['syncs']}"
             f"{' partial' if record.get('partial') else ''}]:"
             f" decode_cycles={record['decode_cycles']} prefill_cycles={record['prefill_cycles']}"
             f" idle_cycles={record['idle_cycles']}"]
    for name in REPORTED:
        p = record["phases_ms"][name]
        share = "n/a" if p["share"] is None else f"{p['share'] * 100:.1f}%"
        parts.append(f"{name} mean={_num(p['mean'])} p50={_num(p['p50'])} p90={_num(p['p90'])} ms share={share}")
    parts.append(f"accept_len={_num(record['accept_length'], 2)}"
                 f" {'exact' if record['accept_length_exact'] else 'sampled'}"
                 f" tokens={record['tokens']} requests={record['decode_requests']}"
                 f" requests_all={record['requests_all']}")
    busy = record.get("gpu_busy")
    parts.append(f"served_tokens/s={_num(record['tokens_per_s_served'], 1)}"
                 f" gpu_tokens/s={_num(record['tokens_per_s_gpu'], 1)}"
                 f" per_request={_num(record['tokens_per_s_per_request'], 1)} wall={_num(record['wall_s'])} s")
    parts.append(f"wall_cycle={_num(record['wall_cycle_ms'])} ms GPU busy "
                 + ("n/a" if busy is None else f"{busy * 100:.0f}%: {record['bound']}"))
    host, share = record.get("profiler_host_us_per_cycle"), record.get("profiler_host_share")
    parts.append(f"profiler host={_num(host, 1)} us/cycle"
                 f" ({'n/a' if share is None else f'{share * 100:.2f}%'} of wall)")
    if record.get("baseline_ms"):
        speedup = record["projected_speedup"]
        parts.append(f"baseline={_num(record['baseline_ms'])} ms"
                     f" break_even_accept_len={_num(record['break_even_accept_length'], 2)}"
                     f" projected_speedup={'n/a' if speedup is None else f'{speedup:.2f}x'}")
    return " | ".join(parts)


# ----------------------------------------------------------------------------------------------- profiler


class Profiler:
    """Collects the cycles of one process's EAGLE worker and reports every ``interval`` decode cycles.

    ``sample_every``: None (default) adapts to the host budget; an int fixes it (1: every decode cycle is timed).
    ``exit_flush``: flush the partial interval at exit and on SIGTERM (the process's profiler does).
    """

    def __init__(self, interval=200, baseline_ms=None, path=None, clock=None, drain_batch=DRAIN_BATCH,
                 drain_lag=DRAIN_LAG, read_per_call=READ_PER_CALL, sample_every=None, seed=None, exit_flush=False):
        self.interval = interval
        self.baseline_ms = baseline_ms
        self.path = path
        self.active = True  # False on ranks other than TP 0, and once something went wrong
        self.drain_batch = max(1, min(drain_batch, interval))
        self.drain_lag = drain_lag
        self.read_per_call = read_per_call  # 0: read only in batches of drain_batch
        self.fixed_sample_every = sample_every
        self.sample_every = sample_every or SAMPLE_START
        self.exit_flush = exit_flush
        self._rng = random.Random(os.getpid() if seed is None else seed)
        self._countdown = self._gap()
        self._clock = clock
        self._bound = False
        self._slots = []
        self._free = []
        self._pending = deque()  # timed cycles not read yet
        self._current = None  # the timed cycle being run by the worker, if any
        self._in_cycle = False
        self._cycle_no = 0
        self._wall_owner = None  # the interval whose last decode cycle ran last: its wall time ends at the next start
        self._last_decode_start = None  # perf_counter_ns at the start of the previous cycle, if it was a decode cycle
        self._stash = None  # the last decode cycle's result, until SGLang has made its host copy of accept_lens
        self._token_mode = None  # "sglang": SGLang's host copy is read; "own": timed cycles stage their own
        self._copies = []  # SGLang's host copies of accept_lens, not summed yet
        self._copy_meta = []  # (stats, batch size, timed, copy_done event) of each
        self._host_ns = self._host_timed_ns = 0  # the profiler's own host time in the open interval (see _close)
        self.stats = IntervalStats()
        self._closing = deque()  # intervals complete in count, waiting for their timed cycles / tokens
        self.records = deque(maxlen=16)  # the last intervals' records, for inspection
        self.logger = logging.getLogger(__name__)
        self.meta = {}
        self.metrics = None

    def _gap(self):
        """Cycles until the next timed one: 1 when every cycle is timed, else uniform with mean sample_every."""
        every = self.sample_every
        return 1 if every <= 1 else self._rng.randint(1, 2 * every - 1)

    # -- binding to the worker, at its first cycle

    def _bind(self, worker, function):
        self._bound = True
        ranks = worker_ranks(worker)
        if ranks["tp_rank"] not in (0, None):
            self.active = False
            return
        self.logger = logging.getLogger(function.__module__)
        capacity = self.drain_batch + self.drain_lag + 1
        if self._clock is None:
            self._clock = default_clock(capacity)
        marks_per_cycle = 2 + 2 * MAX_SPANS
        self._slots = [_Slot(i, self._clock.new_marks(marks_per_cycle)) for i in range(capacity)]
        self._free = list(reversed(self._slots))
        run_id, started = run_identity()
        self.meta = {"run_id": run_id, "run_started": started, "pid": os.getpid(),
                     "tp_rank": ranks["tp_rank"] or 0, "pp_rank": ranks["pp_rank"], "dp_rank": ranks["dp_rank"],
                     "worker": type(worker).__name__, "timer": self._clock.name, "interval": self.interval}
        if metrics_enabled(worker):
            self.metrics = PrometheusExport.create(model_name(worker), self.logger)
        if self.exit_flush:
            install_exit_flush()

    # -- the hot path: called by the wrappers.  A profiler error stops profiling, never the worker.

    def begin_cycle(self, worker, function, args, kwargs):
        """None (run the worker's method untouched), the cycle's kind, or a slot when the cycle is timed."""
        start = _now()
        timed = False
        try:
            if self._in_cycle:
                return None  # nested call: a subclass calling super()
            if not self._bound:
                self._bind(worker, function)
                if not self.active:
                    return None
            owner = self._wall_owner
            if owner is not None:  # an interval's wall time runs to the start of the cycle after its last decode
                owner.wall_end = start
                self._wall_owner = None
                if self._closing and self._closing[0].outstanding <= 0:
                    self._report_closed()
            kind = cycle_kind(args[0] if args else kwargs.get("batch", kwargs.get("model_worker_batch")))
            self._cycle_no += 1
            if self._stash is not None:  # before this cycle allocates: the previous result is not kept alive by us
                self._collect_stash()
            stats = self.stats
            if kind == IDLE:
                stats.idle_cycles += 1
                self._last_decode_start = None
                return None
            if kind == DECODE:
                if self._last_decode_start is not None:
                    stats.wall_cycle_ns += start - self._last_decode_start
                    stats.wall_cycles += 1
                self._last_decode_start = start
                if stats.wall_start is None:
                    stats.wall_start = start
            else:
                self._last_decode_start = None
            self._countdown -= 1
            self._in_cycle = True
            if self._countdown > 0 or not self._free or self._clock.capturing():
                return kind  # counted, not timed (and nothing recorded while a CUDA graph is being captured)
            self._countdown = self._gap()
            timed = True
            slot = self._free.pop()
            slot.reset(kind, stats, self._cycle_no)
            stats.outstanding += 1
            self._clock.record(slot.marks, 0)
            self._current = slot
            return slot
        except Exception as exc:
            self._fail(exc)
            return None
        finally:
            spent = _now() - start
            self._host_ns += spent
            if timed:
                self._host_timed_ns += spent

    def end_cycle(self, token, result):
        start = _now()
        timed_ns = 0
        try:
            self._in_cycle = False
            slot = token if isinstance(token, _Slot) else None
            kind = slot.kind if slot is not None else token
            stats = self.stats
            if slot is not None:
                self._clock.record(slot.marks, 1)
                self._current = None
            if kind == DECODE:
                stats.decode_cycles += 1
                stats.wall_end = start  # until the next cycle starts
                self._wall_owner = stats
                self._count_tokens(result, slot, stats)
            else:
                stats.prefill_cycles += 1
            if slot is not None:
                self._pending.append(slot)
                timed_ns = _now() - start
            if len(self._copies) >= TOKEN_BATCH or (self._closing and self._copies):
                self._sum_copies(wait=None)
            if self._pending:
                read_start = _now()
                read = self._read_finished(self.read_per_call)
                if len(self._pending) >= self.drain_batch + self.drain_lag and not self._clock.capturing():
                    self._drain(self.drain_batch)
                    read = True
                if read:  # reading timed cycles is their cost: it counts towards sample_every
                    timed_ns += _now() - read_start
            if stats.decode_cycles >= self.interval:
                self._close(stats)
            if self._closing and self._closing[0].outstanding <= 0 and self._wall_owner is not self._closing[0]:
                self._report_closed()
        except Exception as exc:
            self._fail(exc)
        finally:
            self._host_ns += _now() - start
            self._host_timed_ns += timed_ns

    def abort_cycle(self, token):
        self._in_cycle = False
        if isinstance(token, _Slot):
            self._current = None
            token.stats.outstanding -= 1
            self._free.append(token)

    def begin_phase(self, phase):
        start = _now()
        slot = self._current
        try:
            if slot.kind != DECODE or phase in slot.open_phases or len(slot.spans) >= MAX_SPANS:
                return None
            index = 2 + 2 * len(slot.spans)
            slot.spans.append((phase, index, index + 1))
            slot.open_phases.add(phase)
            self._clock.record(slot.marks, index)
            return slot, phase, index + 1
        except Exception as exc:
            self._fail(exc)
            return None
        finally:
            spent = _now() - start
            self._host_ns += spent
            self._host_timed_ns += spent

    def end_phase(self, span):
        start = _now()
        slot, phase, index = span
        try:
            self._clock.record(slot.marks, index)
            slot.open_phases.discard(phase)
        except Exception as exc:
            self._fail(exc)
        finally:
            spent = _now() - start
            self._host_ns += spent
            self._host_timed_ns += spent

    def _fail(self, exc):
        self.active = False
        self._current = None
        self._in_cycle = False
        self.logger.warning(f"{LOG_PREFIX}: profiling stopped: {type(exc).__name__}: {exc}")

    # -- tokens: what each decode cycle emitted (accepted drafts + one bonus token per request)

    def _count_tokens(self, result, slot, stats):
        accept_lens = getattr(result, "accept_lens", None)  # v2: per request, bonus included, on the GPU
        if accept_lens is not None and hasattr(accept_lens, "shape"):
            batch_size = int(accept_lens.shape[0])
            stats.requests_all += batch_size
            if not getattr(accept_lens, "is_cuda", False):  # host memory already (no CUDA): read it now
                tokens = int(accept_lens.sum())
                stats.add_tokens(batch_size, tokens)
                if slot is not None and self.metrics and batch_size:
                    self._export(self.metrics.observe_accept, tokens / batch_size)
                return
            if self._token_mode == "own":
                if slot is not None:  # a timed cycle: sum on the stream, copy to pinned memory, read with the slot
                    slot.batch_size = batch_size
                    slot.staged = self._clock.stage_tokens(slot.index, accept_lens)
                return
            # SGLang replaces result.accept_lens by its host copy right after this call returns (copy_to_cpu, in
            # overlap and non-overlap scheduling alike): take that at the start of the next cycle.
            self._stash = (result, accept_lens, stats, batch_size, slot is not None)
            stats.outstanding += 1
            return
        for name in V1_ACCEPT_FIELDS:  # v1: drafts only
            per_request = getattr(result, name, None)
            if per_request is not None:
                tokens = sum(per_request) + len(per_request)
                stats.requests_all += len(per_request)
                stats.add_tokens(len(per_request), tokens)
                if slot is not None and self.metrics and per_request:
                    self._export(self.metrics.observe_accept, tokens / len(per_request))
                return

    def _collect_stash(self):
        """The previous decode cycle's host copy of accept_lens, made by SGLang after that cycle returned."""
        result, device_lens, stats, batch_size, timed = self._stash
        self._stash = None
        copied = getattr(result, "accept_lens", None)
        if copied is not device_lens and copied is not None and getattr(copied, "is_cuda", True) is False:
            self._token_mode = "sglang"
            self._copies.append(copied)
            self._copy_meta.append((stats, batch_size, timed, getattr(result, "copy_done", None)))
            return
        # No host copy: this cycle's tokens stay unknown (its interval reports an estimated accept length). Where
        # SGLang has never copied, timed cycles stage their own from now on; where it has, one cycle that went
        # another way must not make every later interval inexact.
        if self._token_mode is None:
            self._token_mode = "own"
        stats.outstanding -= 1

    def _sum_copies(self, wait):
        """Sum the collected host copies, all at once, once SGLang's copies have landed: they run in order on one
        stream, so the newest one's copy_done stands for all.  ``wait``: None (normal: try again after a later
        cycle if it has not passed), True (wait for it), False (at exit: drop the copies not finished)."""
        copies, meta = self._copies, self._copy_meta
        newest = meta[-1][3]
        if wait is None and newest is not None and self._clock.capturing():
            return  # an event query is not allowed while a CUDA graph is being captured
        if newest is not None and not newest.query():
            if wait is None:
                return
            if wait:
                newest.synchronize()
            else:
                finished = [i for i, m in enumerate(meta) if m[3] is None or m[3].query()]
                for i, (stats, _, _, _) in enumerate(meta):
                    if i not in finished:
                        stats.unfinished += 1
                        stats.outstanding -= 1
                copies[:] = [copies[i] for i in finished]
                meta[:] = [meta[i] for i in finished]
                if not copies:
                    return
        start = 0
        while start < len(copies):  # runs of copies of one interval (all of them, but at an interval's end)
            stats = meta[start][0]
            end = start
            while end < len(copies) and meta[end][0] is stats:
                end += 1
            stats.tokens += _host_sum(copies[start:end])
            stats.requests += sum(m[1] for m in meta[start:end])
            stats.token_cycles += end - start
            stats.outstanding -= end - start
            start = end
        if self.metrics:  # the accept length of each timed cycle, as its own observation
            for lens, (_, batch_size, timed, _) in zip(copies, meta):
                if timed and batch_size:
                    self._export(self.metrics.observe_accept, sum(lens.tolist()) / batch_size)
        copies.clear()
        meta.clear()

    # -- reading timed cycles

    def _read_finished(self, limit):
        """Read up to ``limit`` of the oldest timed cycles ``drain_lag`` cycles old that the GPU has passed; never
        waits.  Returns how many it read."""
        pending, clock = self._pending, self._clock
        read = 0
        if pending and self._cycle_no - pending[0].cycle_no >= self.drain_lag and clock.capturing():
            return read  # an event query is not allowed while a CUDA graph is being captured
        while read < limit and pending and self._cycle_no - pending[0].cycle_no >= self.drain_lag:
            slot = pending[0]
            for mark_index in _end_marks(slot):
                if not clock.is_done(slot.marks, mark_index):
                    return read  # the GPU is behind: read it after a later cycle, or in a batch
            pending.popleft()
            try:
                self._take(slot)
            finally:
                self._free.append(slot)
            read += 1
        return read

    def _drain(self, count, wait=True):
        """Read the ``count`` oldest timed cycles, waiting for the GPU (once) if it has not passed them; with
        ``wait`` False (at exit) the ones it has not passed are dropped instead."""
        batch = [self._pending.popleft() for _ in range(min(count, len(self._pending)))]
        finished = []
        for slot in reversed(batch):  # newest first: once it is done, the older ones on its stream are too
            done = all(self._clock.is_done(slot.marks, i) for i in _end_marks(slot))
            if not done and wait:
                for mark_index in _end_marks(slot):
                    if not self._clock.is_done(slot.marks, mark_index):
                        self._clock.wait(slot.marks, mark_index)
                        slot.stats.syncs += 1
                done = True
            if done or wait:
                finished.append(slot)
            else:
                slot.stats.unfinished += 1
                slot.stats.outstanding -= 1
                self._free.append(slot)
        for slot in reversed(finished):
            try:
                self._take(slot)
            finally:
                self._free.append(slot)

    def _take(self, slot):
        clock, stats = self._clock, slot.stats
        stats.outstanding -= 1
        cycle_ms = clock.elapsed_ms(slot.marks, 0, 1)
        if slot.kind == PREFILL:
            stats.add_prefill(cycle_ms)
            if self.metrics:
                self._export(self.metrics.observe_phase, "prefill", cycle_ms)
            return
        phase_ms = {}
        for phase, start, end in slot.spans:
            phase_ms[phase] = phase_ms.get(phase, 0.0) + clock.elapsed_ms(slot.marks, start, end)
        stats.add_timed(phase_ms, cycle_ms)
        if self.metrics:
            self._export(self.metrics.observe_cycle, phase_ms, cycle_ms)
        if slot.staged is not _NO_TOKENS:
            tokens = clock.read_tokens(slot.index, slot.staged)
            stats.add_tokens(slot.batch_size, tokens)
            if self.metrics and slot.batch_size:
                self._export(self.metrics.observe_accept, tokens / slot.batch_size)

    def _export(self, observe, *args):
        try:
            observe(*args)
        except Exception as exc:  # a broken metrics directory must not stop the profile
            self.metrics = None
            self.logger.warning(f"{LOG_PREFIX}: Prometheus export off: {type(exc).__name__}: {exc}")

    # -- intervals

    def _close(self, stats, partial=False):
        stats.partial = partial
        stats.sample_every = self.sample_every
        # the profiler's host time from the interval's opening to its close (its late reads fall in the next one)
        stats.host_ns, stats.host_timed_ns = self._host_ns, self._host_timed_ns
        self._host_ns = self._host_timed_ns = 0
        self._closing.append(stats)
        if stats is self.stats:
            self.stats = IntervalStats()
        self._adapt(stats)

    def _adapt(self, stats):
        """Set sample_every so that the profiler's host time per cycle stays near HOST_BUDGET of the wall cycle."""
        if self.fixed_sample_every or not stats.wall_cycles:
            return
        cycles = stats.decode_cycles + stats.prefill_cycles + stats.idle_cycles
        timed = stats.series[CYCLE].count + stats.prefill.count
        if not cycles or not timed:
            return
        per_cycle = (stats.host_ns - stats.host_timed_ns) / cycles
        per_timed = stats.host_timed_ns / timed
        spare = HOST_BUDGET * stats.wall_cycle_ns / stats.wall_cycles - per_cycle
        every = SAMPLE_MAX if spare <= 0 else math.ceil(per_timed / spare)
        self.sample_every = max(1, min(SAMPLE_MAX, every))

    def _report_closed(self):
        while self._closing and self._closing[0].outstanding <= 0:
            self._report(self._closing.popleft())

    def _report(self, stats):
        record = stats.record(self.baseline_ms, **self.meta)
        self.records.append(record)
        self.logger.info(format_line(record))
        if self.path:
            try:
                with open(self.path, "a", encoding="utf-8") as out:
                    out.write(to_json(record) + "\n")
            except OSError as exc:
                self.logger.warning(f"{LOG_PREFIX}: cannot append to EAGLE3_PROFILE_FILE={self.path!r}: {exc};"
                                    " file output off")
                self.path = None
        return record

    def flush(self, wait=True) -> dict | None:
        """Read every timed cycle and token count and report what is left, the partial interval included.

        ``wait`` True waits for the GPU where needed (tests, benchmarks); False (at exit) reads only what the GPU
        has finished and counts the rest as ``unfinished_at_exit``.  Returns the last record reported, if any."""
        if not self._bound or not self.active:
            return None
        if self._current is not None:  # interrupted in the middle of a timed cycle (a signal): drop it
            self.abort_cycle(self._current)
        self._in_cycle = False
        self._wall_owner = None  # no next cycle: the wall time ends with the last decode cycle
        if self._stash is not None:
            self._collect_stash()
        if self._copies:
            self._sum_copies(wait=wait)
        if wait:
            self._drain(len(self._pending))
        else:
            self._drain(len(self._pending), wait=False)
        if self.stats.decode_cycles:
            self._close(self.stats, partial=self.stats.decode_cycles < self.interval)
        before = len(self.records)
        for stats in self._closing:
            stats.outstanding = 0
        self._report_closed()
        return self.records[-1] if len(self.records) > before else None


def _host_sum(tensors) -> int:
    """The sum of every element of host tensors: one concatenation and one sum for a batch of torch tensors."""
    if len(tensors) > 1:
        torch = sys.modules.get("torch")
        if torch is not None and all(isinstance(t, torch.Tensor) for t in tensors):
            return int(torch.cat([t.reshape(-1) for t in tensors]).sum())
    return sum(sum(t.tolist()) for t in tensors)


def _end_marks(slot):
    """The marks recorded last in a slot: the cycle's end, then each phase's (a phase may run on another stream)."""
    return [1] + [end for _, _, end in slot.spans]


def cycle_kind(batch) -> str:
    """"prefill", "idle" or "decode", by the same test SGLang's workers branch on."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None:
        return DECODE
    if mode.is_extend() or getattr(batch, "is_extend_in_batch", False):
        return PREFILL
    if mode.is_idle():
        return IDLE
    return DECODE


# ----------------------------------------------------------------------------------------- exit flush

_exit_hooks_installed = False


def install_exit_flush() -> None:
    """Flush the process's profiler at interpreter exit and on SIGTERM (once per process).

    The SIGTERM handler flushes, then does what was there before: a Python handler is called; the default action
    (terminate) is restored and the signal raised again, so the exit status is unchanged.  An ignored SIGTERM stays
    ignored.  Signal handlers can only be set from the main thread; elsewhere only the atexit flush is installed."""
    global _exit_hooks_installed
    if _exit_hooks_installed:
        return
    _exit_hooks_installed = True
    atexit.register(flush_at_exit)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return

    def flush_on_sigterm(signum, frame):
        flush_at_exit()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, flush_on_sigterm)


def flush_at_exit() -> None:
    profiler = _PROFILER
    if profiler is None or not profiler.exit_flush:
        return
    try:
        profiler.flush(wait=False)
    except Exception:  # at exit nothing may get in the way
        pass


# ---------------------------------------------------------------------------------------- run id and ranks


def process_start_time() -> float:
    """Unix time this process started (Linux: /proc), else the time this module was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks
        with open("/proc/stat", encoding="ascii") as stat:
            boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except Exception:
        return _IMPORT_TIME


def run_identity() -> tuple[str, float]:
    """(run id, process start time): the id is the start time (UTC, to the second) and the pid."""
    started = process_start_time()
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(started))}-{os.getpid()}", round(started, 2)


def _int_attr(holder, name):
    try:
        value = getattr(holder, name, None)
    except Exception:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _from_sglang(name, getter=None):
    try:  # 0.5.16+: SGLang's runtime context (0.5.23: the ranks its launcher published)
        from sglang.srt.runtime_context import get_parallel

        value = getattr(get_parallel(), name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    except Exception:
        pass
    if getter is None:
        return None
    try:  # SGLang's process groups
        from sglang.srt.distributed import parallel_state

        value = getattr(parallel_state, getter)()
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    except Exception:
        pass
    return None


def worker_ranks(worker) -> dict:
    """The worker's tensor-, pipeline- and data-parallel ranks (None where unknown).

    Read from the worker (v1, v2 up to 0.5.15: ``tp_rank``), its ``ps`` ParallelState (0.5.16), its target worker,
    then SGLang's runtime context (0.5.16+: 0.5.23 workers have neither ``tp_rank`` nor ``ps``) and process groups;
    for the TP rank, last, the torch.distributed rank."""
    holders = [worker]
    for name in ("ps", "_target_worker"):
        try:
            holder = getattr(worker, name, None)
        except Exception:
            holder = None
        if holder is not None:
            holders.append(holder)
    ranks = {}
    for key, getter in (("tp_rank", "get_tensor_model_parallel_rank"),
                        ("pp_rank", "get_pipeline_model_parallel_rank"), ("dp_rank", None)):
        value = next((v for v in (_int_attr(h, key) for h in holders) if v is not None), None)
        ranks[key] = value if value is not None else _from_sglang(key, getter)
    if ranks["tp_rank"] is None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                ranks["tp_rank"] = dist.get_rank()
        except Exception:
            pass
    return ranks


def tp_rank(worker) -> int:
    """The worker's tensor-parallel rank (0 where nothing says otherwise: a single process)."""
    return worker_ranks(worker)["tp_rank"] or 0


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
    Observations come from the timed cycles only.
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
                    "Time of one EAGLE speculative decoding phase per timed cycle (sglang-pcie EAGLE3_PROFILE)",
                    labelnames=["model_name", "phase"], buckets=PHASE_BUCKETS)
                _METRICS_BY_NAME["accept"] = Histogram(
                    "sglang_pcie_eagle_accept_length",
                    "Tokens emitted per request per timed EAGLE decode cycle (sglang-pcie EAGLE3_PROFILE)",
                    labelnames=["model_name"], buckets=ACCEPT_BUCKETS)
            return cls(_METRICS_BY_NAME["phase"], _METRICS_BY_NAME["accept"], model, logger)
        except Exception as exc:  # no prometheus_client, or an incompatible one: metrics off, serving on
            logger.warning(f"{LOG_PREFIX}: Prometheus export off: {type(exc).__name__}: {exc}")
            return None

    def observe_phase(self, phase, ms):
        self.phase_seconds.labels(self.model, phase).observe(ms / 1e3)

    def observe_cycle(self, phase_ms, cycle_ms):
        for phase in PHASES:
            self.observe_phase(phase, phase_ms.get(phase, 0.0))
        self.observe_phase(CYCLE, cycle_ms)

    def observe_accept(self, accept_length):
        self.accept_length.labels(self.model).observe(accept_length)
