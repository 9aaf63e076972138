"""The record of an interval (sglang_pcie.patches.eagle3_profile.records): means, percentiles and their sample
counts, shares, GPU busy over the timed cycles' own wall time, the served and GPU-time figures, strict JSON, bounded
samples."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.patches.eagle3_profile import payload as ep

from support.eagle_records import META, PHASE_KEYS, RECORD_KEYS, interval_stats


def test_interval_statistics_means_shares_busy_and_projection():
    # three timed cycles whose wall times (start to the next decode cycle's start) are 24, 25 and 26 ms, in an
    # interval whose 30 decode cycles are 30 ms apart on the host clock
    stats = interval_stats([(1.0, 18.0, 0.5, 20.0, 24.0), (1.0, 19.0, 0.5, 21.0, 25.0), (2.0, 20.0, 0.0, 22.5, 26.0)],
                           decode_cycles=30, wall_cycle_ms=30.0)
    stats.add_prefill(50.0)
    stats.prefill_cycles = 1
    stats.host_ns = 31 * 5_000  # 5 us per cycle
    record = stats.record(baseline_ms=12.0, **META)
    phases = record["phases_ms"]
    assert phases["cycle"]["mean"] == pytest.approx(21.1666666) == record["cycle_ms"]
    assert phases["verify"]["mean"] == 19.0 and phases["verify"]["share"] == pytest.approx(19.0 / 21.1666666)
    assert phases["other"]["mean"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)  # the cycle minus its phases
    assert sum(phases[p]["share"] for p in ("draft", "verify", "draft_extend", "other")) == pytest.approx(1.0)
    assert record["phases_sum_ms"] == pytest.approx(1.3333333 + 19.0 + 0.3333333)
    # three samples: the count next to the figures, no percentile from so few
    assert all(set(p) == PHASE_KEYS and p["n"] == 3 and p["p50"] is None and p["p90"] is None
               for p in phases.values())
    # counts over every decode cycle, times over the timed ones
    assert (record["decode_cycles"], record["timed_cycles"]) == (30, 3)
    assert record["accept_length"] == 2.0 and record["accept_length_exact"]  # 120 tokens, 60 request-cycles
    # GPU busy: the timed cycles' GPU time over the same cycles' wall time (not the host's 30 ms of every cycle)
    assert record["timed_wall_cycle_ms"] == pytest.approx(25.0) and record["wall_cycle_ms"] == pytest.approx(30.0)
    assert record["gpu_busy"] == pytest.approx(21.1666666 / 25.0) and record["bound"] == "host-bound"
    # served throughput from the wall time, next to what the GPU time implies
    assert record["wall_s"] == pytest.approx(0.9)
    assert record["tokens_per_s_served"] == pytest.approx(120 / 0.9)
    assert record["tokens_per_s_gpu"] == pytest.approx(120 / (30 * 21.1666666 / 1e3))
    assert record["tokens_per_s_per_request"] == pytest.approx(2.0 * 1e3 / 30.0)
    assert record["profiler_host_us_per_cycle"] == pytest.approx(5.0)
    assert record["profiler_host_share"] == pytest.approx(31 * 5_000 / 0.9e9)
    # break-even and speedup against the wall-clock cycle of every decode cycle
    assert record["break_even_accept_length"] == pytest.approx(30.0 / 12.0)
    assert record["projected_speedup"] == pytest.approx(2.0 * 12.0 / 30.0)
    assert record["prefill_ms"] == {"mean": 50.0, "p50": None, "p90": None, "timed": 1}
    assert set(record) == RECORD_KEYS and record["schema"] == "sglang-pcie.eagle3-profile/4"
    assert record["accept_hist"] == [0, 0, 60] and record["accept_at_least"] == [1.0]  # 1 draft + the bonus, each
    assert json.loads(ep.to_json(record)) == record


@pytest.mark.parametrize("samples, given", [(ep.QUANTILE_MIN - 1, False), (ep.QUANTILE_MIN, True)])
def test_percentiles_only_from_enough_samples_with_the_count_beside_them(samples, given):
    cycles = [10.0 + i for i in range(samples)]
    stats = interval_stats([(1.0, 5.0, 1.0, c, c + 1) for c in cycles], decode_cycles=200)
    for c in cycles:
        stats.add_prefill(c)
    record = stats.record(**META)
    cycle = record["phases_ms"]["cycle"]
    assert cycle["n"] == samples and cycle["mean"] == pytest.approx(sum(cycles) / samples)
    if given:  # numpy's default interpolation over the 20 values 10..29
        assert cycle["p50"] == pytest.approx(19.5) and cycle["p90"] == pytest.approx(27.1)
        assert record["prefill_ms"]["p50"] == pytest.approx(19.5)
    else:
        assert cycle["p50"] is cycle["p90"] is record["prefill_ms"]["p90"] is None
    line = ep.format_line(record)
    assert f"cycle n={samples} mean=" in line
    assert ("p50=19.500 p90=27.100" in line) if given else ("p50=n/a p90=n/a" in line)


def test_unknown_accept_counts_and_missing_baseline_give_nulls_not_errors():
    stats = ep.IntervalStats()
    stats.add_timed({"verify": 5.0}, 6.0, 8.0)
    stats.decode_cycles = 1
    stats.add_tokens(None, None)
    record = stats.record()
    assert record["accept_length"] is None and not record["accept_length_exact"]
    assert record["tokens_per_s_served"] is None and record["tokens_per_s_gpu"] is None
    assert record["wall_cycle_ms"] is None and record["gpu_busy"] == pytest.approx(0.75)  # the timed cycle's own
    assert record["break_even_accept_length"] is None and record["projected_speedup"] is None
    line = ep.format_line({**record, **META})
    assert "accept_len=n/a" in line and "baseline" not in line and "wall_cycle=n/a ms" in line
    empty = ep.IntervalStats().record()
    assert empty["gpu_busy"] is None and empty["bound"] is None and empty["timed_wall_cycle_ms"] is None
    assert "GPU busy n/a" in ep.format_line({**empty, **META})


def test_json_is_strict_non_finite_numbers_become_null():
    stats = interval_stats([(1.0, 2.0, 0.5, 4.0)], decode_cycles=2)
    record = stats.record(baseline_ms=float("inf"), **META)
    text = ep.to_json({**record, "odd": [float("nan"), {"x": float("-inf")}]})
    assert "Infinity" not in text and "NaN" not in text
    parsed = json.loads(text)
    assert parsed["baseline_ms"] is None and parsed["odd"] == [None, {"x": None}]


def test_percentiles_stay_bounded_over_long_intervals():
    series = ep.Series(__import__("random").Random(1))
    for value in range(100_000):
        series.add(float(value % 1000))
    assert len(series.samples) == ep.RESERVOIR and series.count == 100_000
    assert series.mean == pytest.approx(499.5)
    assert 400 < series.quantile(0.5) < 600  # a uniform sample's median


# -- the figures at their documented edges (issue #34 item 10; docs/eagle3-profile.md)

from sglang_pcie.patches.eagle3_profile import records as records  # noqa: E402


def test_quantiles_are_given_from_twenty_samples_and_interpolate_like_numpy():
    import random

    series = records.Series(random.Random(0))
    for v in range(19):
        series.add(float(v))
    assert series.quantile(0.5) is None and series.summary()["p50"] is None
    series.add(19.0)
    assert series.quantile(0.5) == 9.5 and series.summary() == {"n": 20, "mean": 9.5, "p50": 9.5, "p90": 17.1}
    assert records.quantile([1.0, 2.0, 4.0], 1.0) == 4.0 and records.quantile([1.0, 2.0, 4.0], 0.75) == 3.0
    assert records.quantile([5.0], 0.9) == 5.0 and records.quantile([], 0.5) is None


def test_gpu_busy_below_ninety_percent_is_host_bound():
    assert records.bound(0.9) == "GPU-bound" and records.bound(0.8999) == "host-bound" and records.bound(None) is None


@pytest.mark.parametrize("hist, draft_tokens, expected", [
    ([3, 1], 3, [3, 1, 0, 0]),  # spec_draft_tokens + 1 entries
    ([3, 1, 0, 0], 3, [3, 1, 0, 0]),
    ([3, 1, 0, 0, 2], 3, [3, 1, 0, 0, 2]),  # a larger value seen: kept
    ([3], 0, [3]),
    ([], 0, [0]),
    ([3, 1], None, [3, 1]),  # draft tokens unknown: as counted
])
def test_a_histogram_is_padded_to_the_draft_tokens(hist, draft_tokens, expected):
    assert records.padded(hist, draft_tokens) == expected


def test_tokens_count_only_for_a_batch_with_a_token_count():
    stats = ep.IntervalStats()
    stats.add_tokens(0, 5, [1, 1])
    stats.add_tokens(4, None, [1, 1])
    assert (stats.requests, stats.tokens, stats.token_cycles) == (0, 0, 0)
    stats.add_tokens(4, 9, [1, 2, 1])
    stats.add_tokens(2, 3, [0, 1, 0, 0, 1])
    assert (stats.requests, stats.tokens, stats.token_cycles) == (6, 12, 2)
    assert stats.accept_hist == [1, 3, 1, 0, 1]


def test_a_record_is_strict_json_and_an_empty_histogram_reads_as_a_dash():
    assert records.to_json({"x": float("nan"), "y": [float("inf"), 1.0]}) == '{"x": null, "y": [null, 1.0]}'
    assert records._hist_text([]) == "-" and records._hist_text(None) == "-" and records._hist_text([2, 1]) == "2,1"


def test_tokens_known_for_some_decode_cycles_only_are_not_exact_and_served_tokens_are_estimated():
    stats = ep.IntervalStats()
    stats.decode_cycles, stats.requests_all = 3, 12  # three decode cycles of 4 requests; tokens known for two
    stats.add_tokens(4, 10)
    stats.add_tokens(4, 6)
    stats.wall_start, stats.wall_end = 0, 2_000_000_000  # 2 s
    record = stats.record()
    assert record["accept_length"] == 2.0 and record["accept_length_exact"] is False
    assert record["tokens_per_s_served"] == 2.0 * 12 / 2  # the accept length x every decode cycle's requests
    stats.add_tokens(4, 8)
    record = stats.record()
    assert record["accept_length_exact"] is True and record["tokens_per_s_served"] == 24 / 2  # counted
