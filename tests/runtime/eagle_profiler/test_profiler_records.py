"""The record of an interval (sglang_pcie.runtime.eagle_profiler.records): means, percentiles, shares, the served
and GPU-time figures, strict JSON, bounded samples."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.runtime import eagle_profiler as ep

from support.eagle_records import META, RECORD_KEYS, interval_stats


def test_interval_statistics_means_percentiles_shares_and_projection():
    stats = interval_stats([(1.0, 18.0, 0.5, 20.0), (1.0, 19.0, 0.5, 21.0), (2.0, 20.0, 0.0, 22.5)], decode_cycles=30)
    stats.add_prefill(50.0)
    stats.prefill_cycles = 1
    stats.host_ns = 31 * 5_000  # 5 us per cycle
    record = stats.record(baseline_ms=12.0, **META)
    phases = record["phases_ms"]
    assert phases["cycle"]["mean"] == pytest.approx(21.1666666) == record["cycle_ms"]
    assert phases["cycle"]["p50"] == 21.0 and phases["cycle"]["p90"] == pytest.approx(22.2)
    assert phases["verify"]["mean"] == 19.0 and phases["verify"]["share"] == pytest.approx(19.0 / 21.1666666)
    assert phases["other"]["mean"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)  # the cycle minus its phases
    assert sum(phases[p]["share"] for p in ("draft", "verify", "draft_extend", "other")) == pytest.approx(1.0)
    assert record["phases_sum_ms"] == pytest.approx(1.3333333 + 19.0 + 0.3333333)
    # counts over every decode cycle, times over the timed ones
    assert (record["decode_cycles"], record["timed_cycles"]) == (30, 3)
    assert record["accept_length"] == 2.0 and record["accept_length_exact"]  # 120 tokens, 60 request-cycles
    # served throughput from the wall time, next to what the GPU time implies
    assert record["wall_s"] == pytest.approx(0.75) and record["wall_cycle_ms"] == pytest.approx(25.0)
    assert record["tokens_per_s_served"] == pytest.approx(120 / 0.75)
    assert record["tokens_per_s_gpu"] == pytest.approx(120 / (30 * 21.1666666 / 1e3))
    assert record["gpu_busy"] == pytest.approx(21.1666666 / 25.0) and record["bound"] == "host-bound"
    assert record["tokens_per_s_per_request"] == pytest.approx(2.0 * 1e3 / 25.0)
    assert record["profiler_host_us_per_cycle"] == pytest.approx(5.0)
    assert record["profiler_host_share"] == pytest.approx(31 * 5_000 / 0.75e9)
    # break-even and speedup against the wall-clock cycle
    assert record["break_even_accept_length"] == pytest.approx(25.0 / 12.0)
    assert record["projected_speedup"] == pytest.approx(2.0 * 12.0 / 25.0)
    assert record["prefill_ms"] == {"mean": 50.0, "p50": 50.0, "p90": 50.0, "timed": 1}
    assert set(record) == RECORD_KEYS and record["schema"] == "sglang-pcie.eagle3-profile/2"
    assert json.loads(ep.to_json(record)) == record


def test_unknown_accept_counts_and_missing_baseline_give_nulls_not_errors():
    stats = ep.IntervalStats()
    stats.add_timed({"verify": 5.0}, 6.0)
    stats.decode_cycles = 1
    stats.add_tokens(None, None)
    record = stats.record()
    assert record["accept_length"] is None and not record["accept_length_exact"]
    assert record["tokens_per_s_served"] is None and record["tokens_per_s_gpu"] is None
    assert record["gpu_busy"] is None and record["bound"] is None
    assert record["break_even_accept_length"] is None and record["projected_speedup"] is None
    line = ep.format_line({**record, **META})
    assert "accept_len=n/a" in line and "baseline" not in line and "GPU busy n/a" in line


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

