#!/usr/bin/env python3
"""The profiler's host time as it reports it, against what it adds: an A/B of one synthetic cycle loop on the CPU.

The loop has the shape of SGLang's EAGLE v2 worker and scheduler (a cycle calls draft, verify and draft re-extend; the
scheduler copies the result's accept_lens to the host, as copy_to_cpu does) with no work in the phases, so that
what the profiler adds is as large a share as it gets.  A runs it with the worker's methods wrapped by
sglang_pcie.patches.eagle3_profile.payload.wrap and a Profiler installed (host clock: no CUDA here); B runs the same
methods
unwrapped.  Rounds of --cycles cycles alternate A B B A ..., garbage collection off; each round gives A's and B's
time per cycle and the host time A's profiler reported for that round.  On a shared machine a round can only be
slowed down, so the figures are the fastest rounds (minimum; medians beside them): added = min A - min B, against
the reported host time of A's fastest round.

Two samplings: as shipped (the host budget asks for the least sampling; the floor of timed cycles per interval sets
1 in 41 at the default interval of 1000) and every cycle timed.

usage: python3 -m benchmarks.eagle3_profile_host_time [--cycles 2000] [--rounds 41] [--out FILE]
Prints one line per sampling and writes the rounds as JSON to --out.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import types
from pathlib import Path

from sglang_pcie.patches.eagle3_profile import payload as ep
from sglang_pcie.patches.eagle3_profile.clocks import HostClock

SAMPLINGS = {"as shipped": None, "every cycle timed": 1}
INTERVAL = ep.DEFAULT_INTERVAL  # EAGLE3_PROFILE_INTERVAL as shipped


class HostAcceptLens(list):
    """accept_lens as the scheduler's host copy holds it (is_cuda False)."""

    is_cuda = False
    shape = property(lambda self: (len(self),))

    def sum(self):
        return sum(self)

    def tolist(self):
        return list(self)


class DeviceAcceptLens(HostAcceptLens):
    """accept_lens as the worker returns it, 'on the GPU': the profiler takes SGLang's host copy at the next cycle."""

    is_cuda = True


class CopyDone:
    """The copy_done event of the scheduler's host copy: passed at once (no GPU here)."""

    @staticmethod
    def query():
        return True


class DecodeMode:
    def is_extend(self):
        return False

    def is_idle(self):
        return False


class Worker:
    """forward_batch_generation -> draft, verify, draft_extend; nothing else."""

    tp_rank = 0

    def forward_batch_generation(self, batch):
        self.draft(batch)
        result = self.verify(batch)
        self.draft_extend(batch)
        return result

    def draft(self, batch):
        return None

    def verify(self, batch):
        return types.SimpleNamespace(accept_lens=DeviceAcceptLens((2, 1, 2, 2)), copy_done=None)

    def draft_extend(self, batch):
        return None


METHODS = (("forward_batch_generation", "cycle"), ("draft", "draft"), ("verify", "verify"),
           ("draft_extend", "draft_extend"))
ProfiledWorker = type("ProfiledWorker", (Worker,), {name: ep.wrap(Worker.__dict__[name], phase)
                                                     for name, phase in METHODS})


def run_round(worker, cycles) -> int:
    """Nanoseconds for ``cycles`` cycles of the scheduler's loop: the cycle, then reading its host copy."""
    batch = types.SimpleNamespace(forward_mode=DecodeMode(), is_extend_in_batch=False)
    start = time.perf_counter_ns()
    for _ in range(cycles):
        result = worker.forward_batch_generation(batch)
        result.accept_lens = HostAcceptLens(result.accept_lens)  # the scheduler's copy_to_cpu
        result.copy_done = CopyDone
        result.accept_lens.tolist()
    return time.perf_counter_ns() - start


def measure(sample_every, cycles, rounds) -> dict:
    profiler = ep.Profiler(interval=INTERVAL, clock=HostClock(), sample_every=sample_every, seed=1)
    ep.set_profiler(profiler)  # calibrates the wrappers' own cost
    plain, profiled = Worker(), ProfiledWorker()
    run_round(profiled, INTERVAL)  # bind, and the first interval
    a_ns, b_ns, reported_ns = [], [], []
    gc.disable()
    try:
        for index in range(rounds):
            for name in ("ab" if index % 2 == 0 else "ba"):
                if name == "a":
                    before = profiler.host_ns_so_far()
                    a_ns.append(run_round(profiled, cycles))
                    reported_ns.append(profiler.host_ns_so_far() - before)
                else:
                    b_ns.append(run_round(plain, cycles))
    finally:
        gc.enable()
        ep.set_profiler(None)
    per_cycle = {key: [v / cycles / 1e3 for v in values]
                 for key, values in (("a_us", a_ns), ("b_us", b_ns), ("reported_us", reported_ns))}
    fastest = min(range(rounds), key=lambda i: per_cycle["a_us"][i])
    added = min(per_cycle["a_us"]) - min(per_cycle["b_us"])
    added_median = statistics.median(per_cycle["a_us"]) - statistics.median(per_cycle["b_us"])
    return {"sample_every": profiler.sample_every, "cycle_glue_ns": profiler.cycle_glue_ns,
            "phase_glue_ns": profiler.phase_glue_ns, "hook_glue_ns": profiler.hook_glue_ns, "added_us": added,
            "reported_us": per_cycle["reported_us"][fastest], "ratio": per_cycle["reported_us"][fastest] / added,
            "added_us_median": added_median, "reported_us_median": statistics.median(per_cycle["reported_us"]),
            "ratio_median": statistics.median(per_cycle["reported_us"]) / added_median, "rounds": per_cycle}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000, help="cycles per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=41, help="rounds of A and of B (default 41)")
    parser.add_argument("--out", help="write the figures and every round as JSON here")
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.rounds < 1:
        parser.error("--cycles and --rounds must be at least 1")
    results = {"python": sys.version.split()[0], "cycles": args.cycles, "rounds": args.rounds, "samplings": {}}
    for label, sample_every in SAMPLINGS.items():
        r = measure(sample_every, args.cycles, args.rounds)
        results["samplings"][label] = r
        print(f"{label} (1 in {r['sample_every']} timed): B {min(r['rounds']['b_us']):.2f} us/cycle,"
              f" A {min(r['rounds']['a_us']):.2f}: added {r['added_us']:.2f} us/cycle, reported"
              f" {r['reported_us']:.2f} ({r['ratio'] * 100:.0f}%; medians: added {r['added_us_median']:.2f},"
              f" reported {r['reported_us_median']:.2f}, {r['ratio_median'] * 100:.0f}%); calibrated: wrapper frames"
              f" {r['cycle_glue_ns']:.0f} ns per cycle and {r['phase_glue_ns']:.0f} per phase call, hook entry and"
              f" exit {r['hook_glue_ns']:.0f} ns per call")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
