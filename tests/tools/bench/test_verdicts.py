"""When bench calls a ratio higher or lower: the t interval of the counterbalanced pairs, clear of the baseline
servers' own spread. The statistics are tested on constructed numbers (many seeds, no clock); one end-to-end A/A
run against the fake server checks the plumbing only."""
from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import pytest

from support import fake_sglang_server
from support.simulated_bench import LATENCY, TOK_S, VARIANTS, server, simulated_run

from sglang_pcie.tools.bench.analysis import METRICS, compute_ratios
from sglang_pcie.tools.bench.plan import Resolve
from sglang_pcie.tools.bench.verdicts import CANNOT_RESOLVE, auto_stop, noise_margin, ratio_summary, t_quantile


def test_t_quantiles_are_students():
    # two-sided 95% points of Student's t, from the printed tables
    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042), (120, 1.980)):
        assert t_quantile(0.95, df) == pytest.approx(t, abs=1e-3)
    assert t_quantile(0.95, 10_000) == pytest.approx(1.960, abs=1e-3)


def test_ratio_summary_and_verdicts():
    noisy = ratio_summary([0.97, 1.02, 0.99], higher_is_better=True)
    assert noisy["median"] == 0.99 and (noisy["min"], noisy["max"]) == (0.97, 1.02)
    assert noisy["verdict"] == "within noise"
    assert ratio_summary([0.82, 0.86, 0.88], True)["verdict"] == "lower (worse)"
    assert ratio_summary([0.82, 0.86, 0.88], False)["verdict"] == "lower (better)"
    # two pairs: a t interval 12.7 standard errors wide (the min-max rule called this "higher (worse)")
    assert ratio_summary([1.1, 1.2], False)["verdict"] == "within noise"
    assert ratio_summary([1.1, 1.2, 1.15, 1.12], False)["verdict"] == "higher (worse)"
    assert ratio_summary([1.0, 1.3], True)["verdict"] == "within noise"  # touching 1.0 is crossing it
    assert ratio_summary([1.05], True)["verdict"] == "one pair: no interval"
    assert ratio_summary([], True)["verdict"] == "no pairs"
    assert ratio_summary([1.0, 1.0, 1.0], True)["verdict"] == "equal in every pair"


def test_the_interval_is_students_t_over_the_pairs_log_ratios():
    ratios = [1.04, 1.05, 1.07]
    logs = [math.log(r) for r in ratios]
    half = 4.3027 * statistics.stdev(logs) / math.sqrt(3)
    row = ratio_summary(ratios, True, spread=[0.99, 1.005])
    assert row["interval"] == pytest.approx([math.exp(statistics.fmean(logs) - half),
                                             math.exp(statistics.fmean(logs) + half)], rel=1e-4)
    # the smallest resolvable effect: the interval's half-width plus the noise band (here 1 / 0.99)
    assert row["noise_margin"] == pytest.approx(1 / 0.99 - 1)
    assert row["resolvable"] == pytest.approx(math.exp(half) / 0.99 - 1, rel=1e-4)
    assert (row["n"], row["confidence"], row["verdict"]) == (3, 0.95, "higher (better)")


def test_the_issues_overlay_and_profile_ratios_are_within_noise():
    # A GPU-bound server whose own baselines spread [1.000-1.013]: bench called the overlay (which changes nothing)
    # 1.010 [1.002-1.029] "higher (better)" and the profiler (which can only cost) 1.026 [1.001-1.031] "higher".
    overlay = ratio_summary([1.002, 1.010, 1.029], True, spread=[1.000, 1.013])
    profile = ratio_summary([1.001, 1.026, 1.031], True, spread=[1.000, 1.013])
    assert min(overlay["ratios"]) > 1 and min(profile["ratios"]) > 1  # all on one side: the old rule's "higher"
    assert overlay["verdict"] == profile["verdict"] == "within noise"
    assert overlay["interval"][0] < 1 < overlay["interval"][1]
    assert 0.04 < overlay["resolvable"] < 0.06 and 0.04 < profile["resolvable"] < 0.06


@pytest.mark.parametrize("shape", ["normal", "heavy tails", "drift"])
@pytest.mark.parametrize("pairs", [2, 3, 5, 10])
def test_an_a_a_run_is_within_noise_across_seeds(pairs, shape):
    """Two identical variants, 2% server-to-server noise, 1000 seeds: a difference is called in at most 5% of them
    (the interval's nominal 5%; measured 0-3.7%), where the former min-max rule called one in four at 3 pairs."""
    called = min_max_called = 0
    seeds = 1000
    for seed in range(seeds):
        records = simulated_run(seed, pairs, noise=0.02, heavy=shape == "heavy tails",
                                drift=0.01 if shape == "drift" else 0.0)
        row = compute_ratios(records, VARIANTS)["x"][TOK_S]
        called += row["verdict"].startswith(("higher", "lower"))  # "cannot resolve" calls nothing either
        min_max_called += not row["min"] <= 1.0 <= row["max"]
        assert row["n"] == pairs and row["resolvable"] > 0
    assert called <= 0.05 * seeds
    if pairs == 3 and shape == "normal":
        assert min_max_called >= 0.2 * seeds  # the same runs, the former rule: this test tells the two apart


@pytest.mark.parametrize("pairs, effect", [(3, 1.10), (10, 1.05)])
def test_a_real_effect_beyond_the_noise_is_resolved(pairs, effect):
    """1% noise: +10% with 3 pairs and +5% with 10 are called, in the right direction for each metric."""
    verdicts = {TOK_S: [], LATENCY: []}
    for seed in range(300):
        rows = compute_ratios(simulated_run(seed, pairs, noise=0.01, effect=effect), VARIANTS)["x"]
        for label in verdicts:
            verdicts[label].append(rows[label]["verdict"])
    assert verdicts[TOK_S].count("higher (better)") >= 0.95 * 300
    assert verdicts[LATENCY].count("lower (better)") >= 0.95 * 300
    assert not {"lower (worse)", "higher (worse)"} & set(verdicts[TOK_S] + verdicts[LATENCY])


def test_the_resolvable_effect_is_where_the_verdict_turns():
    # The same scatter moved so that its mean sits just beyond, then just inside, 1 + resolvable: the first is
    # called, the second is not.
    ratios = [0.99, 1.02, 1.01, 0.995, 1.015]
    row = ratio_summary(ratios, True, spread=[0.99, 1.01])
    centre = math.exp(statistics.fmean(math.log(r) for r in ratios))
    for factor, verdict in ((1.001, "higher (better)"), (0.999, "within noise")):
        moved = [r / centre * (1 + row["resolvable"]) * factor for r in ratios]
        assert ratio_summary(moved, True, spread=[0.99, 1.01])["verdict"] == verdict


def test_the_baseline_servers_spread_is_the_band_a_verdict_must_clear():
    # the same three pairs (+4%, +5%, +6%) against baselines that agree within 1%, then within 6%
    def ratios_with(baselines):
        records = []
        for repeat, (base, ratio) in enumerate(zip(baselines, (1.04, 1.05, 1.06)), start=1):
            records += [server(2 * repeat - 1, repeat, "baseline", base), server(2 * repeat, repeat, "x", base * ratio)]
        return compute_ratios(records, VARIANTS)

    tight, wide = ratios_with([99.0, 100.0, 101.0]), ratios_with([95.0, 100.0, 106.0])
    assert tight["baseline"][TOK_S]["spread"] == pytest.approx([0.99, 1.01])
    assert tight["baseline"][TOK_S]["noise_margin"] == pytest.approx(1 / 0.99 - 1)
    assert wide["baseline"][TOK_S]["spread"] == pytest.approx([0.95, 1.06])
    assert wide["baseline"][TOK_S]["noise_margin"] == pytest.approx(0.06)  # the wider side: 1.06, not 1 / 0.95
    assert tight["x"][TOK_S]["interval"] == pytest.approx(wide["x"][TOK_S]["interval"])
    assert tight["x"][TOK_S]["verdict"] == "higher (better)" and wide["x"][TOK_S]["verdict"] == "within noise"
    assert (1 + wide["x"][TOK_S]["resolvable"]) / (1 + tight["x"][TOK_S]["resolvable"]) == pytest.approx(1.06 * 0.99)
    assert noise_margin(None) == 0.0 and noise_margin([1.0, 1.0]) == 0.0


def test_repeats_auto_stops_on_width_failure_noise_floor_cap_and_budget():
    resolve = Resolve(target=0.02, metric=TOK_S, budget_s=600.0)

    def ratios(resolvable, floor=0.005):
        return {"baseline": {TOK_S: {"noise_margin": floor}}, "x": {TOK_S: {"resolvable": resolvable}},
                "y": {TOK_S: {"resolvable": 0.01}}}

    assert auto_stop(ratios(0.019), resolve, 3, 100.0, failed=False)["stopped"] == "resolved"
    assert auto_stop(ratios(0.021), resolve, 3, 100.0, failed=False) is None  # another repeat fits the budget
    assert auto_stop(ratios(None), resolve, 3, 100.0, failed=False) is None  # x has fewer than two pairs yet
    assert auto_stop(ratios(0.019), resolve, 3, 100.0, failed=True)["stopped"] == "failure"
    floor = auto_stop(ratios(0.05, floor=0.03), resolve, 3, 100.0, failed=False)
    assert floor["stopped"] == "noise floor" and floor["noise_margin"] == 0.03
    assert auto_stop(ratios(0.05), resolve, 50, 100.0, failed=False)["stopped"] == "max repeats"
    # 3 repeats in 450 s: a fourth would end near 600 s, past the budget; in 449 s it fits
    budget = auto_stop(ratios(0.05), resolve, 3, 450.01, failed=False)
    assert budget["stopped"] == "budget" and budget["resolvable"] == {"x": 0.05, "y": 0.01}
    assert auto_stop(ratios(0.05), resolve, 3, 449.0, failed=False) is None


@pytest.mark.parametrize("jitter, cycle_ms", [("0.2", "2"), ("3", "0.5")], ids=["servers-alike", "servers-wild"])
def test_an_a_a_run_end_to_end(run_bench, table_row, jitter, cycle_ms):
    """Plumbing only (the verdicts above are tested on constructed numbers): two identical variants, each server
    with its own seeded cycle time, give rows whose interval, count and resolvable effect the table prints, each
    the function of that run's pairs and baseline spread. Servers as wild as a loaded machine's (cycle times apart
    by e^3 and more) print their rows alike."""
    code, out, _, results = run_bench("--repeats", "3", "--variant", "overlay", "--variant", "aa:base=overlay",
                                      "--env", f"FAKE_CYCLE_JITTER={jitter}", "--env", "FAKE_SEED=7",
                                      "--env", f"FAKE_CYCLE_MS={cycle_ms}")
    assert code == 0, out
    runs = results["runs"]
    assert [r["variant"] for r in runs] == "baseline overlay aa aa overlay baseline baseline overlay aa".split()
    drawn = [r["model_info"]["cycle_ms"] for r in runs]
    assert drawn == pytest.approx([float(cycle_ms) * fake_sglang_server.cycle_factor("7", float(jitter),
                                                                                     Path(r["log"]).parent.name)
                                   for r in runs])
    assert len(set(drawn)) == len(runs)  # each server its own draw
    for name in ("overlay", "aa"):
        for phase, key, label, higher in METRICS:
            row, base = results["ratios"][name][label], results["ratios"]["baseline"][label]
            pairs = [[r for r in runs if r["repeat"] == repeat] for repeat in (1, 2, 3)]
            metric = [({r["variant"]: (r["metrics"][phase] if phase else r["metrics"]).get(key) for r in pair})
                      for pair in pairs]
            expected = [m[name] / m["baseline"] for m in metric if m[name] is not None and m["baseline"]]
            assert row.get("ratios", []) == pytest.approx(expected)
            assert {k: v for k, v in row.items() if k != "value_median"} == ratio_summary(
                row.get("ratios", []), higher, base.get("spread"))
    # the table prints each row's own figures (cells spelled from the row, whatever figures this machine produced)
    for name in ("baseline", "overlay", "aa"):
        assert table_row(name, TOK_S, results["ratios"][name][TOK_S]).search(out), (name, out)


def test_an_interval_too_wide_to_tell_a_tenfold_effect_reads_cannot_resolve():
    """c=1 TTFT over two pairs can give an interval like [0.01-100]: no figure a reader could use. An interval that
    cannot tell a 10x effect from none (resolvable over 999%, the table's "±>999%") and clears no side reads
    "cannot resolve"; one that does clear a side keeps its verdict, however wide."""
    wide = ratio_summary([0.1, 10.0], higher_is_better=False)
    assert wide["interval"][0] < 0.01 and wide["interval"][1] > 100 and wide["resolvable"] > 9.99
    assert wide["verdict"] == "cannot resolve: this interval cannot tell a 10x effect from none"
    two = ratio_summary([1.0, 1.3], higher_is_better=True)  # wide ([0.2-5.3]), not that wide
    assert 1 < two["resolvable"] < 9.99 and two["verdict"] == "within noise"
    clear = ratio_summary([math.exp(4), math.exp(5), math.exp(6)], higher_is_better=True)  # wide, wholly above 1
    assert clear["resolvable"] > 9.99 and clear["verdict"] == "higher (better)"


def test_repeats_auto_stops_at_its_edges_as_docs_bench_md_says():
    resolve = Resolve(target=0.02, metric=TOK_S, budget_s=600.0)

    def ratios(resolvable, floor=0.005):
        return {"baseline": {TOK_S: {"noise_margin": floor}}, "x": {TOK_S: {"resolvable": resolvable}}}

    # "its resolvable effect is at most the target": equal to it resolves
    assert auto_stop(ratios(0.02), resolve, 3, 100.0, failed=False)["stopped"] == "resolved"
    # "the baseline servers' own spread ... already wider than the target": as wide goes on
    assert auto_stop(ratios(0.05, floor=0.02), resolve, 3, 100.0, failed=False) is None
    # one baseline server so far (no spread, no floor): nothing to stop on yet
    assert auto_stop({"baseline": {TOK_S: {"n": 1}}, "x": {TOK_S: {"resolvable": 0.05}}}, resolve, 3, 100.0,
                     failed=False) is None
    # "after 50 repeats": the 49th goes on
    assert auto_stop(ratios(0.05), resolve, 49, 100.0, failed=False) is None
    # "when another repeat would end past --budget-minutes": 3 repeats in 450 s, a fourth ends at 600 s, not past
    assert auto_stop(ratios(0.05), resolve, 3, 450.0, failed=False) is None
    # the warm-up's 200 s count in the elapsed time, not in the mean repeat: 500 + 300 / 3 = 600, not past; had it
    # counted in the mean repeat, 500 + 500 / 3 would be
    assert auto_stop(ratios(0.05), resolve, 3, 500.0, failed=False, fixed_s=200.0) is None
    assert auto_stop(ratios(0.05), resolve, 3, 500.0, failed=False)["stopped"] == "budget"
    # a warm-up longer than everything since (a clock step): the mean repeat is never below 0
    assert auto_stop(ratios(0.05), resolve, 3, 599.0, failed=False, fixed_s=900.0) is None
    assert auto_stop(ratios(0.05), resolve, 3, 600.5, failed=False, fixed_s=900.0)["stopped"] == "budget"


def test_a_ratio_of_zero_gives_no_interval():
    # a variant that served nothing (0 tok/s) in one pair: no log ratio, so no interval and no verdict either way
    row = ratio_summary([0.0, 1.02, 1.03], higher_is_better=True)
    assert row["verdict"] == "a ratio <= 0: no interval" and row["interval"] is None and row["min"] == 0.0


def test_a_zero_mean_gain_is_never_called_whatever_the_noise_floor():
    # log ratios symmetric about 0: a mean gain of exactly zero, from tight pairs (narrow interval) with no band,
    # a band, and with a baseline spread only on its low side
    ratios = [0.999, 1.001, 1 / 0.999, 1 / 1.001]
    for spread in (None, [0.99, 1.01], [0.98, 1.0]):
        row = ratio_summary(ratios, higher_is_better=True, spread=spread)
        assert row["verdict"] == "within noise"
        assert row["interval"][0] < 1 < row["interval"][1]
    assert noise_margin([0.98, 1.0]) == pytest.approx(-math.log(0.98))  # the low side alone sets the band
    assert noise_margin([1.0, 1.03]) == pytest.approx(math.log(1.03))
    assert noise_margin([]) == 0.0  # no spread: no band


def test_a_tight_gain_inside_the_noise_floor_is_within_noise_and_beyond_it_is_called():
    # four pairs within 0.1% of +1%: an interval well clear of 1.0, but inside a baseline spread of 2%
    ratios = [1.0095, 1.0105, 1.0098, 1.0102]
    assert ratio_summary(ratios, True, spread=[0.98, 1.02])["verdict"] == "within noise"
    assert ratio_summary(ratios, True, spread=[0.995, 1.005])["verdict"] == "higher (better)"
    lower = [1 / r for r in ratios]
    assert ratio_summary(lower, True, spread=[0.98, 1.02])["verdict"] == "within noise"
    assert ratio_summary(lower, True, spread=[0.995, 1.005])["verdict"] == "lower (worse)"


def test_cannot_resolve_starts_just_past_a_smallest_resolvable_effect_of_999_percent():
    # two pairs 45% apart resolve at best +960%: within noise; 50% apart, +1214%: past what the table prints (±>999%)
    assert ratio_summary([1.0, 1.45], True)["resolvable"] < 9.99
    assert ratio_summary([1.0, 1.45], True)["verdict"] == "within noise"
    assert 9.99 < ratio_summary([1.0, 1.5], True)["resolvable"] < 20
    assert ratio_summary([1.0, 1.5], True)["verdict"] == CANNOT_RESOLVE
