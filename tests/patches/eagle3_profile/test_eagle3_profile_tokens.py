"""What each decode cycle emitted (patches/eagle3_profile/tokens.py), on host lists shaped like SGLang's host copies
of accept_lens: summed in runs per interval once the newest copy has landed, never queried inside a CUDA graph
capture, and each timed cycle's accept length observed on its own (Prometheus)."""
from __future__ import annotations

import types
from collections import Counter

from sglang_pcie.patches.eagle3_profile.records import IntervalStats
from sglang_pcie.patches.eagle3_profile.tokens import TokenCounter, histogram, host_counts

from support.eagle_records import HostCopy


class Clock:
    def __init__(self, capturing=False):
        self.is_capturing = capturing

    def capturing(self):
        return self.is_capturing


class CopyDone:
    """SGLang's copy_done event; a query while a CUDA graph is being captured is an error."""

    def __init__(self, clock, done=True):
        self.clock, self.done, self.queries = clock, done, 0

    def query(self):
        assert not self.clock.is_capturing, "an event query while a CUDA graph is being captured"
        self.queries += 1
        return self.done


def counter_with(copies, clock):
    """A TokenCounter holding SGLang's host copies: (stats, accept_lens, timed) each; the newest one's copy_done."""
    counter, observed = TokenCounter(), []
    counter.observe = observed.append
    done = CopyDone(clock)
    for stats, lens, timed in copies:
        counter.copies.append(HostCopy(lens))
        counter.copy_meta.append((stats, len(lens), timed, done))
        stats.outstanding += 1
    return counter, observed, done


def test_only_timed_cycles_are_observed_and_every_copy_is_counted_into_its_own_interval():
    first, second = IntervalStats(), IntervalStats()
    clock = Clock()
    counter, observed, _ = counter_with([(first, [2, 3], True), (first, [1, 1], False), (second, [4, 2, 3], True),
                                         (second, [3], False)], clock)
    counter.sum_copies(None, clock)
    assert observed == [2.5, 3.0]  # the timed cycles' accept lengths, each its own observation
    assert (first.tokens, first.requests, first.token_cycles, first.outstanding) == (7, 4, 2, 0)
    assert (second.tokens, second.requests, second.token_cycles, second.outstanding) == (12, 4, 2, 0)
    assert first.accept_hist == [0, 2, 1, 1] and second.accept_hist == [0, 0, 1, 2, 1]
    assert counter.copies == [] and counter.copy_meta == []


def test_inside_a_cuda_graph_capture_nothing_is_queried_or_summed_until_it_ends():
    stats, clock = IntervalStats(), Clock(capturing=True)
    counter, observed, done = counter_with([(stats, [2, 2], True)], clock)
    counter.sum_copies(None, clock)
    assert done.queries == 0 and stats.tokens == 0 and len(counter.copies) == 1
    clock.is_capturing = False
    counter.sum_copies(None, clock)
    assert done.queries == 1 and stats.tokens == 4 and observed == [2.0]


def test_a_histogram_of_zero_and_integral_floats_and_none_for_anything_else():
    assert histogram(Counter({0: 2, 3: 1})) == [2, 0, 0, 1]
    assert histogram(Counter({0.0: 1, 2.0: 2}), shift=1) == [0, 1, 0, 2]
    assert histogram(Counter({-1: 1})) is None and histogram(Counter({1.5: 1})) is None
    assert histogram(Counter()) == []
    assert host_counts([[0, 2], [2]]) == (4, [1, 0, 2])
