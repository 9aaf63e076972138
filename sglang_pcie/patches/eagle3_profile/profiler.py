"""The Profiler: collects the cycles of one process's EAGLE worker (through the wrappers of ``wrap``) and reports
every ``interval`` decode cycles.  How it stays cheap and honest is in the package docstring."""
from __future__ import annotations

import logging
import math
import os
import random
import time
from collections import deque
from enum import Enum

from sglang_pcie.patches.eagle3_profile.clocks import default_clock
from sglang_pcie.patches.eagle3_profile.process import install_exit_flush, run_identity
from sglang_pcie.patches.eagle3_profile.prometheus import PrometheusExport
from sglang_pcie.patches.eagle3_profile.ranks import spec_settings
from sglang_pcie.runtime.server_facts import worker_ranks
from sglang_pcie.runtime.server_facts import metrics_enabled, model_name
from sglang_pcie.patches.eagle3_profile.readback import ReadBack
from sglang_pcie.patches.eagle3_profile.records import (DECODE, IDLE, LOG_PREFIX, PREFILL, IntervalStats,
                                                        format_line, to_json)
from sglang_pcie.patches.eagle3_profile.slots import CYCLE_END, CYCLE_START, MARKS_PER_SLOT, NEXT_MARK, Slot
from sglang_pcie.patches.eagle3_profile.tokens import TOKEN_BATCH, TokenCounter

# The logger's name from before the patch had its own folder: log filters and handlers keep working.
LOGGER = "sglang_pcie.runtime.eagle_profiler.profiler"

DEFAULT_INTERVAL = 1000  # decode cycles per report (EAGLE3_PROFILE_INTERVAL's default in runtime/settings.py, which
# cannot import this module at start-up: a test keeps them equal).  With the floor below, 1 decode cycle in 41 is timed where the host budget has no room: inside a real
# server on an H200's host a timed cycle cost ~260 us of host time (9 CUDA events recorded, queried and read), an
# untimed one ~45 (benchmarks/results/2026-12-02-h200/profiler-breakdown/), so 1 in 8 (interval 200) cost ~77 us.
DRAIN_BATCH = 64  # timed cycles read at once, waiting for the GPU if need be, when this many + DRAIN_LAG are unread
DRAIN_LAG = 4  # cycles a timed cycle is left unread, so that the GPU has finished it
READ_PER_CALL = 2  # timed cycles read after each cycle at most: > 1 so a backlog drains, small so no call is slow
SAMPLE_START = 64  # one decode cycle in this many is timed in the first interval (within the floor below): the
# least sampling; the adaptation times more cycles only where the host budget has room
SAMPLE_MAX = 64
TIMED_PER_INTERVAL = 24  # the floor: sampling never leaves fewer timed decode cycles per full interval (QUANTILE_MIN
# of them give its percentiles; the margin covers timed cycles a prefill follows, which are dropped)
HOST_BUDGET = 0.002  # sampling aims at profiler host time <= this share of the wall-clock decode cycle

_now = time.perf_counter_ns


class Profiler(ReadBack):
    """Collects the cycles of one process's EAGLE worker and reports every ``interval`` decode cycles.

    ``sample_every``: None (default) adapts to the host budget; an int fixes it (1: every decode cycle is timed).
    ``exit_flush``: flush the partial interval at exit and on SIGTERM (the process's profiler does).
    """

    def __init__(self, interval=DEFAULT_INTERVAL, baseline_ms=None, path=None, clock=None, drain_batch=DRAIN_BATCH,
                 drain_lag=DRAIN_LAG, read_per_call=READ_PER_CALL, sample_every=None, seed=None, exit_flush=False):
        self.interval = interval
        self.baseline_ms = baseline_ms
        self.path = path
        self.active = True  # False on ranks other than TP 0, and once something went wrong
        self.drain_batch = max(1, min(drain_batch, interval))
        self.drain_lag = drain_lag
        self.read_per_call = read_per_call  # 0: read only in batches of drain_batch
        self.fixed_sample_every = sample_every
        self.sample_every = sample_every or min(SAMPLE_START, self._sample_floor())
        self.exit_flush = exit_flush
        self._rng = random.Random(os.getpid() if seed is None else seed)
        self._countdown = self._gap()  # prefill cycles until the next timed one
        self._block = -1  # decode cycles are timed one per block of sample_every, at a random offset in the block
        self._block_timed = False
        self._due = 0  # the first decode cycle index of the interval that may be timed (see _decode_turn)
        self._clock = clock
        self._bound = False
        self._slots = []
        self._free = []
        self._pending = deque()  # timed cycles not read yet
        self._current = None  # the timed cycle being run by the worker, if any
        self._awaiting_next = None  # the timed decode cycle waiting for the next cycle's start (its wall time's end)
        self._in_cycle = False
        self._cycle_no = 0
        self._wall_owner = None  # the interval whose last decode cycle ran last: its wall time ends at the next start
        self._last_decode_start = None  # perf_counter_ns at the start of the previous cycle, if it was a decode cycle
        self.tokens = TokenCounter()
        self._host_ns = self._host_timed_ns = 0  # the profiler's own host time in the open interval (see _close)
        self._host_ns_closed = 0  # ... in the intervals closed so far
        self.phase_calls = 0  # calls of the phase wrappers in the open interval (they count themselves)
        # what the wrappers and the hooks cost outside the hooks' timed spans, per call (measured by calibrate)
        self.cycle_glue_ns = self.phase_glue_ns = self.hook_glue_ns = 0.0
        self._probe_ns = 0
        self.setup_ns = None  # the host time of binding to the worker (its first cycle), kept apart
        self.stats = IntervalStats()
        self._closing = deque()  # intervals complete in count, waiting for their timed cycles / tokens
        self.records = deque(maxlen=16)  # the last intervals' records, for inspection
        self.logger = logging.getLogger(LOGGER)
        self.meta = {}
        self.metrics = None

    def _gap(self):
        """Prefill cycles until the next timed one: 1 when every cycle is timed, else uniform with mean
        sample_every."""
        every = self.sample_every
        return 1 if every <= 1 else self._rng.randint(1, 2 * every - 1)

    def _sample_floor(self):
        """The largest sample_every that still times TIMED_PER_INTERVAL decode cycles per interval."""
        return max(1, self.interval // TIMED_PER_INTERVAL)

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
        self._slots = [Slot(i, self._clock.new_marks(MARKS_PER_SLOT)) for i in range(capacity)]
        self._free = list(reversed(self._slots))
        run_id, started = run_identity()
        self.meta = {"run_id": run_id, "run_started": started, "pid": os.getpid(),
                     "tp_rank": ranks["tp_rank"] or 0, "pp_rank": ranks["pp_rank"], "dp_rank": ranks["dp_rank"],
                     "worker": type(worker).__name__, "timer": self._clock.name, "interval": self.interval,
                     **spec_settings(worker)}
        if metrics_enabled(worker):
            self.metrics = PrometheusExport.create(model_name(worker), self.logger)
            if self.metrics:
                self.tokens.observe = self._observe_accept
        if self.exit_flush:
            install_exit_flush(self)

    def _set_up(self, worker, function, start):
        """Bind at the first cycle; its cost is set-up time, logged once. Returns where the cycle's own host time
        starts: after the set-up."""
        self._bind(worker, function)
        self.setup_ns = _now() - start
        if self.active:
            self.logger.info(f"{LOG_PREFIX}: set up in {self.setup_ns / 1e6:.1f} ms at the first cycle (timers for"
                             f" {len(self._slots)} timed cycles in flight); not counted in the host time per cycle")
        return start + self.setup_ns

    # -- the hot path: called by the wrappers.  A profiler error stops profiling, never the worker.

    def begin_cycle(self, function, args, kwargs):
        """None (run the worker's method untouched), the cycle's kind (counted, not timed), or a slot when the cycle
        is timed.  ``args``: the wrapped method's, the worker first.  Runs every cycle: an untimed decode cycle takes
        the first way out (a compare against ``_due``), with no method call beyond its kind and its tokens."""
        start = _now()
        timed = False
        try:
            if self._in_cycle:
                return None  # nested call: a subclass calling super()
            if not self._bound:  # once: its cost (CUDA events, pinned memory) is set-up, not a cycle's (logged)
                start = self._set_up(args[0], function, start)
                if not self.active:
                    return None
            owner = self._wall_owner
            if owner is not None:  # an interval's wall time runs to the start of the cycle after its last decode
                owner.wall_end = start
                self._wall_owner = None
                if self._closing and self._closing[0].outstanding <= 0:
                    self._report_closed()
            kind = cycle_kind(args[1] if len(args) > 1 else kwargs.get("batch", kwargs.get("model_worker_batch")))
            self._cycle_no += 1
            if self.tokens.stash is not None:  # before this cycle allocates: the previous result is not kept alive
                self.tokens.collect_stash()
            if self._awaiting_next is not None:
                timed = self._end_timed_wall(kind)
            self._in_cycle = True  # until end_cycle: a nested call (a subclass calling super()) is not a cycle
            stats = self.stats
            if kind == DECODE:  # the wall time between decode cycles (pauses between requests do not count)
                last = self._last_decode_start
                if last is not None:
                    stats.wall_cycle_ns += start - last
                    stats.wall_cycles += 1
                if stats.wall_start is None:
                    stats.wall_start = start
                self._last_decode_start = start
                if stats.decode_cycles < self._due or not self._decode_turn(stats.decode_cycles):
                    return DECODE
            elif kind == IDLE:
                stats.idle_cycles += 1
                self._last_decode_start = None
                return IDLE
            else:
                self._last_decode_start = None
                self._countdown -= 1
                if self._countdown > 0:
                    return kind
            if not self._free or self._clock.capturing():
                return kind  # counted, not timed (and nothing recorded while a CUDA graph is being captured)
            timed = True
            return self._open_slot(kind)
        except Exception as exc:
            self._fail(exc)
            return None
        finally:
            spent = _now() - start + self.hook_glue_ns
            self._host_ns += spent + self.cycle_glue_ns
            if timed:
                self._host_timed_ns += spent

    def _decode_turn(self, index) -> bool:
        """Whether decode cycle ``index`` of the interval is timed: one in each block of sample_every, at a random
        offset (so no period of the workload aliases with the sample), taken by a later cycle of the block if that
        one could not be.  ``_due`` is the first index that may be: begin_cycle asks only from there on.  (Prefill
        cycles: random gaps with mean sample_every, counted down in begin_cycle.)"""
        every = self.sample_every
        block = index // every
        if block != self._block:
            self._block, self._block_timed = block, False
            self._due = block * every + self._rng.randrange(every)
        return not self._block_timed and index >= self._due

    def _open_slot(self, kind):
        stats = self.stats
        if kind == DECODE:
            self._block_timed = True
            self._due = (self._block + 1) * self.sample_every  # the next block's first cycle
        else:
            self._countdown = self._gap()
        slot = self._free.pop()
        slot.reset(kind, stats, self._cycle_no, self._block)
        stats.outstanding += 1
        self._clock.record(slot.marks, CYCLE_START)
        self._current = slot
        return slot

    def _end_timed_wall(self, kind) -> bool:
        """The last timed decode cycle's wall time ends where this cycle starts, if this is a decode cycle (marked
        on the stream, so that on the GPU the mark follows that cycle's end).  Otherwise it has no wall time of its
        own and is dropped from the GPU figures; the block it was timed for times another cycle if it can.  True
        when a mark was recorded."""
        slot, self._awaiting_next = self._awaiting_next, None
        if kind == DECODE and not self._clock.capturing():
            self._clock.record(slot.marks, NEXT_MARK)
            slot.has_next = True
            return True
        slot.has_next = False
        if slot.stats is self.stats and slot.block == self._block:
            self._block_timed = False
            self._due = self.stats.decode_cycles
        return False

    def end_cycle(self, token, result):
        start = _now()
        timed_ns = 0
        try:
            self._in_cycle = False
            slot = token if isinstance(token, Slot) else None
            kind = slot.kind if slot is not None else token
            stats = self.stats
            if slot is not None:
                self._clock.record(slot.marks, CYCLE_END)
                self._current = None
            if kind == DECODE:
                stats.decode_cycles += 1
                stats.wall_end = start  # until the next cycle starts
                self._wall_owner = stats
                self.tokens.count(result, slot, stats, self._clock)
            elif kind == PREFILL:
                stats.prefill_cycles += 1
            if slot is not None:
                self._pending.append(slot)
                if kind == DECODE:
                    self._awaiting_next = slot
                timed_ns = _now() - start
            tokens = self.tokens
            if tokens.copies and (len(tokens.copies) >= TOKEN_BATCH or self._closing):
                tokens.sum_copies(None, self._clock)
            pending = self._pending
            if pending and (self._cycle_no - pending[0].cycle_no >= self.drain_lag
                            or len(pending) >= self.drain_batch + self.drain_lag):
                read_start = _now()
                read = self._read_finished(self.read_per_call)
                if len(pending) >= self.drain_batch + self.drain_lag and not self._clock.capturing():
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
            self._host_ns += _now() - start + self.hook_glue_ns
            self._host_timed_ns += timed_ns

    def abort_cycle(self, token):
        self._in_cycle = False
        if isinstance(token, Slot):
            self._current = None
            token.stats.outstanding -= 1
            self._free.append(token)

    def begin_phase(self, phase):
        start = _now()
        slot = self._current
        try:
            marks = slot.open_span(phase) if slot.kind == DECODE else None
            if marks is None:
                return None
            self._clock.record(slot.marks, marks[0])
            return slot, phase, marks[1]
        except Exception as exc:
            self._fail(exc)
            return None
        finally:
            spent = _now() - start + self.hook_glue_ns
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
            spent = _now() - start + self.hook_glue_ns
            self._host_ns += spent
            self._host_timed_ns += spent

    def _hook_probe(self, first, second):
        """A hook's shape with nothing in it: ``calibrate`` times its calls to learn what entering and leaving a
        hook costs beyond what the hook's own clock reads see."""
        start = _now()
        try:
            return None
        finally:
            self._probe_ns += _now() - start

    def _fail(self, exc):
        self.active = False
        self._current = None
        self._in_cycle = False
        self.logger.warning(f"{LOG_PREFIX}: profiling stopped: {type(exc).__name__}: {exc}")

    # -- intervals

    def _close(self, stats, partial=False):
        stats.partial = partial
        stats.sample_every = self.sample_every
        # the profiler's host time from the interval's opening to its close (its late reads fall in the next one)
        stats.host_ns, stats.host_timed_ns = self.open_host_ns(), self._host_timed_ns
        self._host_ns_closed += stats.host_ns
        self._host_ns = self._host_timed_ns = self.phase_calls = 0
        self._closing.append(stats)
        if stats is self.stats:
            self.stats = IntervalStats()
            self._block, self._due = -1, 0
        self._adapt(stats)

    def _adapt(self, stats):
        """Set sample_every so that the profiler's host time per cycle stays near HOST_BUDGET of the wall cycle,
        within the floor of TIMED_PER_INTERVAL timed decode cycles per interval."""
        if self.fixed_sample_every or not stats.wall_cycles:
            return
        cycles = stats.decode_cycles + stats.prefill_cycles + stats.idle_cycles
        timed = stats.timed + stats.prefill.count
        if not cycles or not timed:
            return
        per_cycle = (stats.host_ns - stats.host_timed_ns) / cycles
        per_timed = stats.host_timed_ns / timed
        spare = HOST_BUDGET * stats.wall_cycle_ns / stats.wall_cycles - per_cycle
        every = SAMPLE_MAX if spare <= 0 else math.ceil(per_timed / spare)
        self.sample_every = max(1, min(SAMPLE_MAX, self._sample_floor(), every))

    def open_host_ns(self) -> float:
        """The profiler's host time in the open interval: its timed spans and the wrappers' calibrated cost."""
        return self._host_ns + self.phase_calls * self.phase_glue_ns

    def host_ns_so_far(self) -> float:
        """The profiler's host time since it was made (tests, benchmarks)."""
        return self._host_ns_closed + self.open_host_ns()

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
        if self._awaiting_next is not None:  # no next cycle: no wall time
            self._awaiting_next.has_next = False
            self._awaiting_next = None
        self._in_cycle = False
        self._wall_owner = None  # no next cycle: the wall time ends with the last decode cycle
        if self.tokens.stash is not None:
            self.tokens.collect_stash()
        if self.tokens.copies:
            self.tokens.sum_copies(wait, self._clock)
        self._drain(len(self._pending), wait=wait)
        if self.stats.decode_cycles:
            self._close(self.stats, partial=self.stats.decode_cycles < self.interval)
        before = len(self.records)
        for stats in self._closing:
            stats.outstanding = 0
        self._report_closed()
        return self.records[-1] if len(self.records) > before else None


_KIND_OF_MODE = {}  # SGLang's ForwardMode members -> their kind: one dict look-up per cycle instead of the mode's tests


def cycle_kind(batch) -> str:
    """"prefill", "idle" or "decode", by the same test SGLang's workers branch on."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None:
        return DECODE
    kind = _KIND_OF_MODE.get(mode) if isinstance(mode, Enum) else None
    if kind is None:
        kind = PREFILL if mode.is_extend() else IDLE if mode.is_idle() else DECODE
        if isinstance(mode, Enum):  # a member's tests cannot change; anything else is asked every time
            _KIND_OF_MODE[mode] = kind
    if kind != PREFILL and getattr(batch, "is_extend_in_batch", False):
        return PREFILL
    return kind
