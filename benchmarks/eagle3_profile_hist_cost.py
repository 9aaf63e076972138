#!/usr/bin/env python3
"""What schema 4's histogram costs per batch of host copies, on the CPU: the profiler's ``host_counts`` (the sum and
the histogram, one ``bytes`` conversion and a ``count`` per value) against the sum alone as schema 3 took it and
against counting with a ``Counter`` (the first version of the histogram), on a batch of TOKEN_BATCH copies of
accept_lens as benchmarks/eagle3_profile_host_time.py's worker returns them (Python lists of 4: 2, 1, 2, 2).

usage: python3 -m benchmarks.eagle3_profile_hist_cost [--repeats 2000] [--runs 5]
Prints, per run, the fastest batch of each (microseconds), and the fastest and median over the runs.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections import Counter

from sglang_pcie.patches.eagle3_profile.tokens import TOKEN_BATCH, histogram, host_counts


class HostAcceptLens(list):
    """accept_lens as the scheduler's host copy holds it (the benchmark's, with tolist)."""

    def tolist(self):
        return list(self)


def schema3_sum(tensors):
    """The sum alone, as schema 3's _host_sum took it for host copies."""
    return sum(sum(t.tolist()) for t in tensors)


def counter_counts(tensors):
    """The sum and the histogram from a Counter of every value."""
    counts = Counter(itertools.chain.from_iterable(t.tolist() for t in tensors))
    return sum(value * count for value, count in counts.items()), histogram(counts)


def fastest_us(function, batch, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        function(batch)
        best = min(best, time.perf_counter_ns() - start)
    return best / 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000, help="batches timed per function and run")
    parser.add_argument("--runs", type=int, default=5, help="runs, the functions interleaved")
    args = parser.parse_args()
    batch = [HostAcceptLens((2, 1, 2, 2)) for _ in range(TOKEN_BATCH)]
    assert host_counts(batch) == counter_counts(batch) and host_counts(batch)[0] == schema3_sum(batch)
    functions = {"host_counts (shipped)": host_counts, "sum alone (schema 3)": schema3_sum,
                 "Counter": counter_counts}
    results = {name: [] for name in functions}
    for run in range(args.runs):
        row = []
        for name, function in functions.items():
            results[name].append(fastest_us(function, batch, args.repeats))
            row.append(f"{name} {results[name][-1]:.1f}")
        print(f"run {run + 1}: fastest us per batch of {TOKEN_BATCH}: " + ", ".join(row), flush=True)
    for name, values in results.items():
        print(f"{name}: fastest {min(values):.1f} us, median {statistics.median(values):.1f} us per batch "
              f"(runs {min(values):.1f}-{max(values):.1f})")


if __name__ == "__main__":
    main()
