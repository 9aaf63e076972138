#!/usr/bin/env python3
"""How often bench's verdict rule calls a difference, on the constructed runs that tests/tools/bench/test_verdicts.py
bounds (tests/support/simulated_bench.py: a counterbalanced baseline / x run, each server's throughput 100 tok/s x
exp(noise x z)), with the figures the test only bounds printed: A/A runs at 2% noise (normal, heavy-tailed, with a
linear drift) at 2, 3, 5 and 10 pairs, the t-interval rule against the former min-max rule; real effects at 1% noise
(+10% at 3 pairs, +5% at 10) resolved in the right direction; and the issue's overlay and profiler pairs as the rule
reads them.

usage: python3 -m benchmarks.bench_verdict_rates [--seeds 1000]   (from a checkout; no torch needed)
"""
from __future__ import annotations

import argparse

from sglang_pcie.tools.bench.analysis import compute_ratios
from sglang_pcie.tools.bench.verdicts import ratio_summary
from support.simulated_bench import LATENCY, TOK_S, VARIANTS, simulated_run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000, help="runs per row (the A/A test's 1000)")
    args = parser.parse_args()
    seeds = args.seeds
    print(f"# python3 -m benchmarks.bench_verdict_rates --seeds {seeds}")
    print(f"A/A, 2% noise: runs (of {seeds}) where a difference is called in batch output tok/s")
    print(f"{'shape':<12} {'pairs':>5} {'t rule':>8} {'min-max':>8}")
    for shape in ("normal", "heavy tails", "drift"):
        for pairs in (2, 3, 5, 10):
            called = min_max = 0
            for seed in range(seeds):
                row = compute_ratios(simulated_run(seed, pairs, noise=0.02, heavy=shape == "heavy tails",
                                                   drift=0.01 if shape == "drift" else 0.0), VARIANTS)["x"][TOK_S]
                called += row["verdict"].startswith(("higher", "lower"))
                min_max += not row["min"] <= 1.0 <= row["max"]
            print(f"{shape:<12} {pairs:>5} {100 * called / seeds:>7.1f}% {100 * min_max / seeds:>7.1f}%")
    print(f"real effects, 1% noise: runs (of {seeds}) called in the right direction (tok/s higher, latency lower)")
    for pairs, effect in ((3, 1.10), (10, 1.05)):
        right = {TOK_S: 0, LATENCY: 0}
        for seed in range(seeds):
            rows = compute_ratios(simulated_run(seed, pairs, noise=0.01, effect=effect), VARIANTS)["x"]
            right[TOK_S] += rows[TOK_S]["verdict"] == "higher (better)"
            right[LATENCY] += rows[LATENCY]["verdict"] == "lower (better)"
        print(f"+{round(100 * (effect - 1))}% at {pairs} pairs: tok/s {100 * right[TOK_S] / seeds:.1f}%, "
              f"latency {100 * right[LATENCY] / seeds:.1f}%")
    print("the issue's pairs (test_the_issues_overlay_and_profile_ratios_are_within_noise), baselines [1.000-1.013]")
    for name, ratios in (("overlay", [1.002, 1.010, 1.029]), ("profile", [1.001, 1.026, 1.031])):
        row = ratio_summary(ratios, True, spread=[1.000, 1.013])
        low, high = row["interval"]
        print(f"{name} {ratios}: interval [{low:.3f}-{high:.3f}], resolvable +-{100 * row['resolvable']:.1f}%, "
              f"{row['verdict']}")


if __name__ == "__main__":
    main()
