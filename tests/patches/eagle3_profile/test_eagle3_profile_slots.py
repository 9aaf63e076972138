"""A timed cycle's marks (patches/eagle3_profile/slots.py): each phase call gets its own pair of marks, never the
cycle's start, end or the next cycle's start; MAX_SPANS calls at most; the times read back from them."""
from __future__ import annotations

from sglang_pcie.patches.eagle3_profile import slots as slots
from sglang_pcie.patches.eagle3_profile.slots import CYCLE_END, CYCLE_START, MARKS_PER_SLOT, NEXT_MARK, Slot


class Clock:
    """Marks are times in ms; elapsed is their difference."""

    def elapsed_ms(self, marks, start, end):
        return marks[end] - marks[start]


def fresh(marks=None) -> Slot:
    slot = Slot(0, marks if marks is not None else [0.0] * MARKS_PER_SLOT)
    slot.reset("decode", None, 1, None)
    return slot


def test_six_phase_calls_a_cycle_each_with_marks_of_its_own():
    """Six calls (pipeline-parallel tail drafting calls draft twice): twelve marks, distinct, none of them the
    cycle's start, end or the next cycle's start, all inside the slot; a seventh call is not timed."""
    assert slots.MAX_SPANS == 6
    slot = fresh()
    pairs = [slot.open_span(f"phase{k}") for k in range(6)]
    marks = [m for pair in pairs for m in pair]
    assert len(set(marks)) == 12 and all(end == start + 1 for start, end in pairs)
    assert not set(marks) & {CYCLE_START, CYCLE_END, NEXT_MARK}
    assert set(marks) | {CYCLE_START, CYCLE_END, NEXT_MARK} == set(range(MARKS_PER_SLOT))  # no spare mark
    assert slot.open_span("phase6") is None and len(slot.spans) == 6


def test_an_open_phase_is_not_timed_twice_and_reset_empties_the_slot():
    slot = fresh()
    assert slot.open_span("draft") == (CYCLE_END + 1, CYCLE_END + 2)
    assert slot.open_span("draft") is None
    assert slot.open_span("verify") == (CYCLE_END + 3, CYCLE_END + 4)
    slot.reset("decode", None, 2, None)
    assert slot.spans == [] and slot.open_span("draft") == (CYCLE_END + 1, CYCLE_END + 2)


def test_the_times_of_a_cycle_its_phases_and_its_wall():
    marks = [0.0] * MARKS_PER_SLOT
    slot = fresh(marks)
    draft, verify = slot.open_span("draft"), slot.open_span("verify")
    slot.open_phases.discard("draft")
    again = slot.open_span("draft")  # a second draft call, once the first closed: its time adds up
    marks[CYCLE_START], marks[CYCLE_END] = 10.0, 20.0
    for (start, end), (a, b) in zip((draft, verify, again), ((10.0, 13.0), (13.0, 18.0), (18.0, 19.5))):
        marks[start], marks[end] = a, b
    assert slot.times(Clock()) == (10.0, {"draft": 4.5, "verify": 5.0}, None)
    assert slot.end_marks() == [CYCLE_END, draft[1], verify[1], again[1]]
    slot.has_next, marks[NEXT_MARK] = True, 25.0
    assert slot.times(Clock()) == (10.0, {"draft": 4.5, "verify": 5.0}, 15.0)
    assert slot.end_marks()[:2] == [NEXT_MARK, CYCLE_END]
