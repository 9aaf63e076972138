"""How often tune-spec's drift line (search.drift) shows on a host that does not drift, and how often it shows a
step that does: a sweep of K candidates, 2 servers each in A..Z Z..A order, each server's figure log-normal around
its candidate's by the server noise; a step of 0%, -5% or -20% in the second pass; judged as one level of a run of
1, 2 or 4 levels (the interval at 1 - 5% / levels). A rate at step 0% is a false line; at most 5% / levels each, so
at most 5% per run over its levels. No server, no clock.

    python3 -m benchmarks.tune_spec_drift_rates [--trials 20000] \
        > benchmarks/results/2026-12-07-cpu/tune_spec_drift_rates.txt
"""
from __future__ import annotations

import argparse
import math
import random

from sglang_pcie.tools.tune_spec.search import drift


def sweep(rng: random.Random, candidates: int, noise: float, step: float) -> list[dict]:
    names = [f"c{i}" for i in range(candidates)]
    order = names + names[::-1]
    servers = []
    for index, name in enumerate(order):
        second_pass = index >= candidates
        truth = 1000.0 * (1 + 0.1 * names.index(name)) * ((1 + step) if second_pass else 1)
        figure = truth * math.exp(rng.gauss(0, noise))
        servers.append({"candidate": name, "ok": True, "levels": {"1": {"value": figure}}})
    return servers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"the drift line (an interval at 1 - 5% / levels excluding no change, and a mean change of 2% or more) at one"
          f" level of a run of 1, 2 or 4 levels; {args.trials:,} sweeps each, seed {args.seed}")
    print(f"{'levels':>6} {'candidates':>10} {'server noise':>12} {'step':>6} {'lines':>8} {'rate':>7}")
    for levels in (1, 2, 4):
        for candidates in (3, 5, 8):
            for noise in (0.01, 0.03, 0.10, 0.24):
                for step in (0.0, -0.05, -0.20):
                    shown = sum(drift(sweep(rng, candidates, noise, step), 1, 0.02, levels)["resolved"]
                                for _ in range(args.trials))
                    print(f"{levels:>6} {candidates:>10} {noise:>12.0%} {step:>6.0%} {shown:>8,}"
                          f" {shown / args.trials:>7.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
