#!/usr/bin/env python3
"""Every pair of the given candidates compared at every level of a tune-spec run's servers, by the proof's own rule
(``tune_spec.answer.paired``: the i-th server of each, a Student-t interval of the log ratios at 95%, an effect
called only where it clears the servers' noise band). For a ``--sweep`` run, whose servers run in counterbalanced
order (A..Z Z..A), this is the proof's comparison of the tuned table, SGLang's table and a fixed chain.

usage: python3 -m benchmarks.tune_spec_pairs STATE_JSON[.gz] CANDIDATE CANDIDATE [...] [--resolve 0.02]
"""
from __future__ import annotations

import argparse
import gzip
import json
from itertools import combinations

from sglang_pcie.tools.tune_spec.answer import paired
from sglang_pcie.tools.tune_spec.search import values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state")
    parser.add_argument("candidates", nargs="+")
    parser.add_argument("--resolve", type=float, default=0.02)
    args = parser.parse_args()
    opener = gzip.open if args.state.endswith(".gz") else open
    with opener(args.state, "rt") as f:
        state = json.load(f)
    servers = [s for s in state["servers"] if s.get("ok")]
    levels = sorted({int(level) for s in servers for level in s.get("levels", {})})
    print(f"{args.state}: {len(servers)} servers measured; levels {levels}; 95% intervals over pairs (i-th server "
          "of each), an effect called only beyond the servers' noise band")
    for level in levels:
        print(f"c={level}")
        for name in args.candidates:
            figures = values(servers, name, level)
            print(f"  {name:10s} " + ", ".join(f"{v:,.1f}" for v in figures))
        for a, b in combinations(args.candidates, 2):
            row = paired(servers, level, a, b, args.resolve)
            interval = (f"[{(row['interval'][0] - 1) * 100:+.1f}% to {(row['interval'][1] - 1) * 100:+.1f}%]"
                        if row["interval"] else "[no interval: fewer than 2 pairs]")
            median = f"{(row['median'] - 1) * 100:+.1f}%" if row["median"] is not None else "-"
            print(f"  {a}/{b}: {median} {interval} over {row['pairs']} pairs, noise band "
                  f"+-{row['noise_margin'] * 100:.1f}%: {row['verdict']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
