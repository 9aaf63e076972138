"""Reading the timed cycles back: the marks the GPU recorded for each timed cycle turned into its times once the GPU
has passed them, and taken into the cycle's interval and the Prometheus export.

``Profiler`` inherits these methods; the state they use (the timed cycles not read yet, the free slots, the clock,
the cycle count, the metrics) is the profiler's own, set up in ``Profiler.__init__``."""
from __future__ import annotations

from sglang_pcie.patches.eagle3_profile.records import LOG_PREFIX, PREFILL
from sglang_pcie.patches.eagle3_profile.tokens import NO_TOKENS


class ReadBack:
    """How the Profiler reads its timed cycles: ``_read_finished`` after a cycle (never waits), ``_drain`` in
    batches and at the end (waits for the GPU once, or at exit drops what it has not finished), ``_take`` one
    cycle's times into its interval."""

    def _read_finished(self, limit):
        """Read up to ``limit`` of the oldest timed cycles ``drain_lag`` cycles old that the GPU has passed; never
        waits.  Returns how many it read."""
        pending, clock = self._pending, self._clock
        read = 0
        if pending and self._cycle_no - pending[0].cycle_no >= self.drain_lag and clock.capturing():
            return read  # an event query is not allowed while a CUDA graph is being captured
        while read < limit and pending and self._cycle_no - pending[0].cycle_no >= self.drain_lag:
            slot = pending[0]
            if slot is self._awaiting_next:
                return read  # its wall time ends with the next cycle's start
            for mark_index in slot.end_marks():
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
        pending, batch = self._pending, []
        while len(batch) < count and pending and pending[0] is not self._awaiting_next:
            batch.append(pending.popleft())
        finished = []
        for slot in reversed(batch):  # newest first: once it is done, the older ones on its stream are too
            done = all(self._clock.is_done(slot.marks, i) for i in slot.end_marks())
            if not done and wait:
                for mark_index in slot.end_marks():
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
        cycle_ms, phase_ms, wall_ms = slot.times(clock)
        if slot.kind == PREFILL:
            stats.add_prefill(cycle_ms)
            if self.metrics:
                self._export(self.metrics.observe_phase, "prefill", cycle_ms)
            return
        if wall_ms is not None:
            stats.add_timed(phase_ms, cycle_ms, wall_ms)
        else:  # a prefill, an idle cycle or the end followed it: no wall time of its own
            stats.add_timed_without_wall()
        if self.metrics:
            self._export(self.metrics.observe_cycle, phase_ms, cycle_ms)
        if slot.staged is not NO_TOKENS:
            tokens = clock.read_tokens(slot.index, slot.staged)
            stats.add_tokens(slot.batch_size, tokens)
            if slot.batch_size:
                self._observe_accept(tokens / slot.batch_size)

    def _observe_accept(self, accept_length):
        if self.metrics:
            self._export(self.metrics.observe_accept, accept_length)

    def _export(self, observe, *args):
        try:
            observe(*args)
        except Exception as exc:  # a broken metrics directory must not stop the profile
            self.metrics = None
            self.tokens.observe = None
            self.logger.warning(f"{LOG_PREFIX}: Prometheus export off: {type(exc).__name__}: {exc}")
