"""eagle3_profile_overhead.py --host-profile: the profiler's host time in the synthetic loop, broken down by profiler
method (each call timed with perf_counter, inclusive: end_cycle includes the reads, _take, _report) and under
cProfile (the functions with the most own time per cycle, C calls such as Event.record included)."""
from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from pathlib import Path

# The profiler's methods timed one by one ("tokens." ones on its TokenCounter).
TIMED_METHODS = ("begin_cycle", "begin_phase", "end_phase", "end_cycle", "tokens.count", "tokens.collect_stash",
                 "tokens.sum_copies", "_read_finished", "_drain", "_take", "_report")


def quantile_summary(values) -> dict:
    ordered = sorted(values)
    if not ordered:
        return {"mean": None, "median": None, "p90": None, "p99": None, "max": None}

    def at(q):
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
    return {"mean": statistics.fmean(ordered), "median": at(0.5), "p90": at(0.9), "p99": at(0.99),
            "max": ordered[-1]}


class MethodTimers:
    """Instance attributes that shadow the profiler's methods and record each call's host time (us); the lists
    start over at the first measured cycle (the loop's hooks(True))."""

    def __init__(self, profiler):
        self.durations = {name: [] for name in TIMED_METHODS}
        self.started = False
        for name in TIMED_METHODS:
            owner, _, method = name.rpartition(".")
            holder = getattr(profiler, owner) if owner else profiler
            setattr(holder, method, self._timed(getattr(holder, method), self.durations[name]))

    @staticmethod
    def _timed(method, sink):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                sink.append((time.perf_counter() - start) * 1e6)
        return call

    def __call__(self, measuring):
        if measuring and not self.started:
            self.started = True
            for values in self.durations.values():
                values.clear()


def top_functions(profile, cycles, count=20) -> list:
    """cProfile's functions with the most own time, per cycle."""
    rows = []
    for (filename, line, function), (_, calls, own_s, cumulative_s, _) in pstats.Stats(profile).stats.items():
        where = function if filename == "~" else f"{Path(filename).name}:{line}({function})"
        rows.append({"function": where, "calls_per_cycle": calls / cycles, "own_us_per_cycle": own_s / cycles * 1e6,
                     "cumulative_us_per_cycle": cumulative_s / cycles * 1e6})
    return sorted(rows, key=lambda row: row["own_us_per_cycle"], reverse=True)[:count]


def host_profile(device, cycles, warmup, host_ms, profile_file, run_profiled, make_profiler) -> dict:
    """eagle3-profile as shipped, once with its methods timed and once under cProfile."""
    profiler = make_profiler("eagle3-profile", profile_file)
    timers = MethodTimers(profiler)
    run = run_profiled(device, cycles, warmup, host_ms, profile_file, profiler=profiler, hooks=timers)
    methods = {name: {"calls_per_cycle": len(values) / cycles, "us_per_cycle": sum(values) / cycles,
                      "max_us": max(values, default=0.0)} for name, values in timers.durations.items()}
    call_profile = cProfile.Profile()
    run_profiled(device, cycles, warmup, host_ms, profile_file, profiler=make_profiler("eagle3-profile", profile_file),
                 hooks=lambda measuring: call_profile.enable() if measuring else call_profile.disable())
    return {"call_us": quantile_summary(run["call_us"]), "methods": methods,
            "cprofile_top": top_functions(call_profile, cycles)}


def print_host_profile(result) -> None:
    d = result["call_us"]
    print(f"\nhost profile, eagle3-profile: us per forward_batch_generation call: mean {d['mean']:.1f}"
          f"  median {d['median']:.1f}  p90 {d['p90']:.1f}  p99 {d['p99']:.1f}  max {d['max']:.1f}")
    print(f"  {'profiler method (inclusive)':<30}{'calls/cycle':>12}{'us/cycle':>10}{'worst call us':>15}")
    for name, m in result["methods"].items():
        print(f"  {name:<30}{m['calls_per_cycle']:12.2f}{m['us_per_cycle']:10.1f}{m['max_us']:15.1f}")
    print("  cProfile (its own overhead inflates Python calls), top own time per cycle:")
    print(f"  {'calls/cycle':>11}{'own us':>9}{'cum us':>9}  function")
    for row in result["cprofile_top"]:
        print(f"  {row['calls_per_cycle']:11.2f}{row['own_us_per_cycle']:9.1f}{row['cumulative_us_per_cycle']:9.1f}"
              f"  {row['function']}")
