"""A timed cycle's marks (``Slot``): where each is, which were recorded last, and the times they give.  The profiler
keeps a fixed ring of slots; the clock records into a slot's ``marks`` and reads them once the GPU has passed."""
from __future__ import annotations

from sglang_pcie.patches.eagle3_profile.tokens import NO_TOKENS

MAX_SPANS = 6  # phase calls timed per cycle (pipeline-parallel tail drafting calls draft twice)
CYCLE_START, CYCLE_END = 0, 1  # then one pair per phase call
NEXT_MARK = 2 + 2 * MAX_SPANS  # a timed decode cycle's last mark: the next decode cycle's start (its wall time)
MARKS_PER_SLOT = NEXT_MARK + 1


class Slot:
    """One timed cycle's marks: the cycle's start and end, one pair per phase call, and NEXT_MARK at the next decode
    cycle's start."""

    __slots__ = ("index", "marks", "spans", "kind", "open_phases", "stats", "cycle_no", "block", "has_next",
                 "batch_size", "staged")

    def __init__(self, index, marks):
        self.index = index
        self.marks = marks
        self.spans = []  # (phase, start mark, end mark)
        self.open_phases = set()

    def reset(self, kind, stats, cycle_no, block):
        self.kind = kind
        self.stats = stats  # the interval the cycle began in: its figures go there, whenever they are read
        self.cycle_no = cycle_no
        self.block = block
        self.has_next = False
        self.spans.clear()
        self.open_phases.clear()
        self.batch_size = None
        self.staged = NO_TOKENS

    def open_span(self, phase):
        """The marks of a new phase span (start, end), or None when this phase is open already or the slot full."""
        if phase in self.open_phases or len(self.spans) >= MAX_SPANS:
            return None
        start = CYCLE_END + 1 + 2 * len(self.spans)
        self.spans.append((phase, start, start + 1))
        self.open_phases.add(phase)
        return start, start + 1

    def end_marks(self):
        """The marks recorded last, newest first (on one stream, once the first is done so are the others): the
        next cycle's start, the cycle's end, then each phase's (a phase may run on another stream)."""
        return ([NEXT_MARK] if self.has_next else []) + [CYCLE_END] + [end for _, _, end in self.spans]

    def times(self, clock):
        """(cycle ms, {phase: ms}, wall ms or None) from the marks, which the GPU has passed."""
        marks = self.marks
        phase_ms = {}
        for phase, start, end in self.spans:
            phase_ms[phase] = phase_ms.get(phase, 0.0) + clock.elapsed_ms(marks, start, end)
        wall_ms = clock.elapsed_ms(marks, CYCLE_START, NEXT_MARK) if self.has_next else None
        return clock.elapsed_ms(marks, CYCLE_START, CYCLE_END), phase_ms, wall_ms
