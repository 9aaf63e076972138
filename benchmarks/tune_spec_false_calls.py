"""How often tune-spec calls a winner between two candidates that are equal (its A/A false-call rate), and how often
it resolves a real lead, against the known cost model of tests/support/spec_cost_model.py (no server, no clock).

    python3 -m benchmarks.tune_spec_false_calls [--seeds 500] > benchmarks/results/2026-12-05-cpu/tune_spec_false_calls.txt

A/A: no speculation and the user's chain (chain-3: both always measured) equal and far ahead of every other
candidate; servers spread log-normally by --noise; a 20-minute budget of 60 s servers. Each run is two comparisons
(the levels c=1 and c=32). 'is best' there is a false call. Then the same with chain-3 ahead by 5% and 10%.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from sglang_pcie.tools.tune_spec import report, search
from support.spec_cost_model import CostModelServer, tune_with

NAMES = ["none"] + [f"chain-{k}" for k in range(1, 8)]


def overrides(lead: float) -> dict:
    figures = {n: {32: 400.0, 1: 40.0} for n in NAMES}
    figures["none"] = {32: 1000.0, 1: 100.0}
    figures["chain-3"] = {32: 1000.0 * (1 + lead), 1: 100.0 * (1 + lead)}
    return figures


def rates(seeds: int, noise: float, lead: float, folder: Path) -> dict:
    counts = {"best": 0, "right best": 0, "within": 0, "cannot tell": 0, "comparisons": 0, "servers": 0}
    for seed in range(seeds):
        server = CostModelServer(noise=noise, seed=seed, overrides=overrides(lead))
        found, settings, state = tune_with(server, folder / f"{noise}-{lead}-{seed}", budget_min=20)
        counts["servers"] += len(state["servers"])
        for result in report.analyse(found, state["servers"], settings)["levels"].values():
            line = result["verdict"]
            counts["comparisons"] += 1
            counts["best"] += " is best by " in line
            counts["right best"] += line.startswith("chain-3 is best by ")
            counts["within"] += " are within " in line
            counts["cannot tell"] += line.startswith("cannot tell")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=500)
    args = parser.parse_args()
    print(f"tune-spec verdicts over {args.seeds} seeds per row, confidence {search.CONFIDENCE}, resolve 2%,"
          " budget 20 min of 60 s servers")
    print(f"{'noise':>6} {'lead':>6} {'comparisons':>11} {'is best':>8} {'chain-3 best':>12} {'within':>7}"
          f" {'cannot tell':>11} {'servers/run':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for noise in (0.01, 0.03):
            for lead in (0.0, 0.05, 0.10):
                c = rates(args.seeds, noise, lead, Path(tmp))
                print(f"{noise:>6.2f} {lead:>6.2f} {c['comparisons']:>11} {c['best']:>8} {c['right best']:>12}"
                      f" {c['within']:>7} {c['cannot tell']:>11} {c['servers'] / args.seeds:>11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
