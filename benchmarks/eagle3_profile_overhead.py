#!/usr/bin/env python3
"""What EAGLE3_PROFILE costs, and whether its figures hold, in a GPU-bound and a host-bound synthetic loop on one GPU.

The loop (benchmarks/eagle3_synthetic.py) has the shape of SGLang's EAGLE v2 worker under the overlap scheduler: on
a side stream (SGLang's forward stream), each cycle replays three CUDA graphs (draft 0.89 ms, verify 18.67 ms, draft
re-extend 0.28 ms of GPU time - the seed measurement - times the phase scale), the verify graph also writes the
accepted lengths of the batch; then, as SGLang's scheduler does, the result's accept_lens is copied to pinned host
memory on a copy stream (copy_to_cpu, with a copy_done event), the host waits for the previous cycle's copy and reads
it, and spends the host time of the regime while the GPU runs the current cycle.  Regimes:
  gpu-bound    phase scale 0.6, host 1.5 ms: verify ~11.2 ms of a ~11.9 ms GPU cycle, the GPU never waits
               (the shape of the Llama-8B-shaped H200 server where schema 2's GPU busy read 98-108%)
  host-bound   phase scale 0.12, host 4 ms: a ~2.4 ms GPU cycle in a ~4.1 ms wall cycle, GPU busy ~60%
               (the shape of the tiny-model TP=2 server of issue 12)
--phase-scale and --host-ms give one regime of your own instead.

Modes, interleaved, best of --repeats each:
  off                          no timers: the worker's own methods
  eagle3-profile               as shipped: every cycle counted, 1 decode cycle in each block of sample_every timed
                               (at least 24 per interval, default 1000), accept length from the scheduler's host copy
  eagle3-profile-every-cycle   every cycle timed, no scheduler host copy (the profiler's own pinned copy instead)
  host-synchronised            the naive timer: torch.cuda.synchronize() + time.perf_counter() around every phase

Per regime it prints each mode's throughput and overhead against "off" (goal: eagle3-profile <= 1%), the host time
of each forward_batch_generation call, the profiler's own host time per cycle as it reports it and its share of the
wall cycle, GPU busy, and the invariants (exit status 1 if one fails):
  * phases_sum_ms <= cycle_ms <= timed_wall_cycle_ms and gpu_busy <= 1 in every record (the same timed cycles);
  * every full interval has at least QUANTILE_MIN timed cycles with a wall time, so its p50/p90 are given;
  * phases on the right stream: each measured phase within 3% (or 0.03 ms) of the graph's own time;
  * accept length exactly 1.75, through the scheduler's host copy (exact) and through the profiler's own copy;
  * no forced GPU wait (syncs 0); a cycle run while a CUDA graph is being captured records nothing.
--host-profile then breaks eagle3-profile's host time down by profiler method and under cProfile.

Needs only torch and a CUDA GPU (about 2 minutes per regime on an H200).  --dry-run checks the script's logic without
a GPU (host spins instead of kernels; timing figures meaningless, timing checks skipped).  The profiler's host time
against an A/B on a CPU: benchmarks/eagle3_profile_host_time.py.

usage: python3 -m benchmarks.eagle3_profile_overhead [--regime gpu-bound|host-bound|both] [--cycles 2000]
           [--interval 1000] [--repeats 3] [--phase-scale S --host-ms MS] [--out FILE] [--host-profile] [--dry-run]
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import os
import sys
import tempfile
import types
from pathlib import Path
from time import perf_counter_ns as time_ns

from benchmarks.eagle3_profile_breakdown import host_profile, print_host_profile, quantile_summary
from benchmarks.eagle3_synthetic import (ACCEPT_LENS, BATCH_SIZE, PROFILED, TARGET_MS, DecodeMode, Gpu, HostOnly,
                                         spin, worker_class)
from sglang_pcie.patches.eagle3_profile import payload as ep
from sglang_pcie.tools import profile_report

REGIMES = {"gpu-bound": (0.6, 1.5), "host-bound": (0.12, 4.0)}  # (phase scale, host ms per cycle)
MODES = ("off", "eagle3-profile", "eagle3-profile-every-cycle", "host-synchronised")
SCHEDULER_HOST_COPY = {"off": True, "eagle3-profile": True, "eagle3-profile-every-cycle": False,
                       "host-synchronised": True}
GOAL_PCT = 1.0  # the profiler may cost at most this share of the wall time


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())
        if record.levelno >= logging.WARNING:  # the profiler stopping itself, say
            print(record.getMessage(), file=sys.stderr)


PROFILE_INTERVAL = ep.DEFAULT_INTERVAL  # --interval


def make_profiler(mode, profile_file):
    if mode == "eagle3-profile":
        return ep.Profiler(interval=PROFILE_INTERVAL, path=profile_file)  # as shipped: sample_every adapts, within
    return ep.Profiler(interval=PROFILE_INTERVAL, path=profile_file, sample_every=1)  # the floor


def drive(worker, device, cycles, warmup, host_ms, host_copy, hooks=None) -> tuple[float, list]:
    """The scheduler's loop: ``warmup`` + ``cycles`` cycles; returns the seconds of the last ``cycles`` and each of
    their forward_batch_generation calls' host time (us).  ``hooks``: called with True/False around each measured
    call (a cProfile, the method timers)."""
    batch = types.SimpleNamespace(forward_mode=DecodeMode(), is_extend_in_batch=False)
    call_us, previous = [], None
    with device.forward_context():
        for index in range(warmup + cycles):
            if index == warmup:
                device.synchronize()
                started = time_ns()
            measured = index >= warmup
            if hooks and measured:
                hooks(True)
            call_start = time_ns()
            result = worker.forward_batch_generation(batch)
            call_end = time_ns()
            if hooks and measured:
                hooks(False)
            if measured:
                call_us.append((call_end - call_start) / 1e3)
            result.done = device.done_marker()
            if host_copy:
                device.copy_to_host(result)
            if previous is not None:  # the scheduler processes the previous cycle's output
                previous.done.synchronize()
                if host_copy:
                    previous.copy_done.synchronize()
                    previous.accept_lens.tolist()
            spin(host_ms / 1e3)
            previous = result
        device.synchronize()
    return (time_ns() - started) / 1e9, call_us


def profile_figures(profiler) -> dict:
    """What a profiled run reported, over its records (warm-up cycles included)."""
    if not profiler.active:
        raise SystemExit("eagle3_profile_overhead: the profiler stopped itself (see its warning above)")
    profiler.flush()
    records = [r for r in profiler.records if r["decode_cycles"]]
    summary = profile_report.summarise([profile_report.normalise(r) for r in records])
    all_cycles = sum(r["decode_cycles"] + r["prefill_cycles"] + r["idle_cycles"] for r in records)
    return {"records": records, "timed_cycles": summary["timed_cycles"], "decode_cycles": summary["decode_cycles"],
            "measured_phase_ms": {name: summary["phases_ms"][name]["mean"] for name in ep.REPORTED},
            "syncs": summary["syncs"], "accept_length": summary["accept_length"],
            "accept_length_exact": summary["accept_length_exact"], "gpu_busy": summary["gpu_busy"],
            "timed_wall_cycle_ms": summary["timed_wall_cycle_ms"],
            "profiler_host_us_per_cycle": profiler.host_ns_so_far() / 1e3 / all_cycles,
            "profiler_setup_ms": profiler.setup_ns / 1e6 if profiler.setup_ns is not None else None,
            "sample_every": [r["sample_every"] for r in records]}


def run_once(mode, device, cycles, warmup, host_ms, profile_file, profiler=None, hooks=None) -> dict:
    """One run of a mode: its seconds and per-call host times, and what the profiler reported (profiled modes)."""
    sink = {}
    worker = worker_class(mode, sink, device.synchronize)(device.phases(), device.accept_lens)
    if mode in PROFILED and profiler is None:
        profiler = make_profiler(mode, profile_file)
    ep.set_profiler(profiler)
    gc.collect()
    try:
        seconds, call_us = drive(worker, device, cycles, warmup, host_ms, SCHEDULER_HOST_COPY[mode], hooks)
        run = {"seconds": seconds, "call_us": call_us}
        if profiler is not None:
            run.update(profile_figures(profiler))
        elif sink:
            run["measured_phase_ms"] = {p: sum(v[-cycles:]) / len(v[-cycles:]) for p, v in sink.items()}
        return run
    finally:
        ep.set_profiler(None)


def record_checks(mode, records) -> list:
    """The invariants of the records of a profiled mode, each (name, ok or None when skipped, detail)."""
    bad = [r for r in records if r["cycle_ms"] is not None and not (
        r["phases_sum_ms"] <= r["cycle_ms"] * (1 + 1e-9) <= r["timed_wall_cycle_ms"] * (1 + 2e-9)
        and r["gpu_busy"] <= 1 + 1e-9)]
    thin = [r for r in records if not r["partial"] and r["phases_ms"]["cycle"]["n"] < ep.QUANTILE_MIN]
    return [(f"{mode}: phases <= cycle <= wall cycle of the same timed cycles, GPU busy <= 100%, every record",
             not bad,
             f"{len(bad)} of {len(records)} records break it" if bad else f"{len(records)} records"),
            (f"{mode}: every full interval has {ep.QUANTILE_MIN} timed cycles with a wall time (p50/p90 given)",
             not thin, f"{len(thin)} intervals short: {[r['phases_ms']['cycle']['n'] for r in thin]}" if thin
             else "ok"),
            (f"{mode}: no forced GPU wait", all(r["syncs"] == 0 for r in records),
             f"syncs {[r['syncs'] for r in records]}")]


def check_invariants(results, runs, device_ms, dry_run) -> list:
    """(name, ok or None when skipped, detail) for each invariant of one regime's runs."""
    checks = []
    for mode in PROFILED:
        best = results[mode]
        checks.append((f"{mode}: accept length 1.75", best["accept_length"] == sum(ACCEPT_LENS) / BATCH_SIZE,
                       f"{best['accept_length']}"))
        expect_exact = SCHEDULER_HOST_COPY[mode]
        path = "exact (scheduler host copy)" if expect_exact else "sampled (own pinned copy)"
        checks.append((f"{mode}: accept length {path}", best["accept_length_exact"] == expect_exact,
                       f"accept_length_exact={best['accept_length_exact']}"))
        checks += record_checks(mode, [record for run in runs[mode] for record in run["records"]])
        measured = best.get("measured_phase_ms") or {}
        off = {p: (measured.get(p), ms) for p, ms in device_ms.items()
               if measured.get(p) is None or abs(measured[p] - ms) > max(0.03 * ms, 0.03)}
        checks.append((f"{mode}: phases on the right stream (within 3% / 0.03 ms of the graphs)",
                       None if dry_run else not off,
                       "; ".join(f"{p} measured {m} vs graph {g:.3f}" for p, (m, g) in off.items()) or "ok"))
    overhead = results["eagle3-profile"]["overhead_pct"]
    checks.append((f"eagle3-profile: costs <= {GOAL_PCT}% of the wall time", None if dry_run else overhead <= GOAL_PCT,
                   f"{overhead:.2f}% (best of the runs against off's best)"))
    return checks


def summarise_modes(runs, cycles) -> dict:
    best_off = min(r["seconds"] for r in runs["off"])
    results = {}
    for mode, mode_runs in runs.items():
        best = min(mode_runs, key=lambda r: r["seconds"])
        results[mode] = {"runs_s": [r["seconds"] for r in mode_runs], "best_s": best["seconds"],
                         "cycle_ms": best["seconds"] / cycles * 1e3,
                         "tokens_per_s": cycles * sum(ACCEPT_LENS) / best["seconds"],
                         "overhead_pct": (best["seconds"] / best_off - 1) * 100,
                         "host_call_us": quantile_summary([us for r in mode_runs for us in r["call_us"]])}
        results[mode].update({k: v for k, v in best.items() if k not in ("seconds", "call_us", "records")})
        if "profiler_host_us_per_cycle" in best:
            results[mode]["profiler_host_share"] = best["profiler_host_us_per_cycle"] / 1e3 / results[mode][
                "cycle_ms"]
    return results


def run_regime(device, args, host_ms, profile_file) -> dict:
    runs = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for mode in (MODES if repeat % 2 == 0 else MODES[::-1]):
            runs[mode].append(run_once(mode, device, args.cycles, args.warmup, host_ms, profile_file))
            print(f"  run {repeat + 1}/{args.repeats} {mode:<27} {args.cycles / runs[mode][-1]['seconds']:8.2f}"
                  " cycles/s", flush=True)
    results = summarise_modes(runs, args.cycles)
    checks = check_invariants(results, runs, device.measured_ms, args.dry_run)
    return {"host_ms": host_ms, "graph_ms_measured": device.measured_ms, "modes": results,
            "invariants": [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks]}


def print_regime(name, regime) -> None:
    print(f"\n{name}: {'mode':<27}{'cycle ms':>10}{'overhead':>10}{'host us/call: median':>22}{'p99':>8}"
          "   measured draft / verify / re-extend / cycle ms")
    for mode, r in regime["modes"].items():
        measured = r.get("measured_phase_ms") or {}
        figures = " / ".join(f"{measured[p]:.3f}" for p in ("draft", "verify", "draft_extend", "cycle")
                             if measured.get(p) is not None) or "-"
        print(f"{'':<{len(name) + 2}}{mode:<27}{r['cycle_ms']:10.3f}{r['overhead_pct']:9.2f}%"
              f"{r['host_call_us']['median']:22.1f}{r['host_call_us']['p99']:8.1f}   {figures}")
    for mode in PROFILED:
        r = regime["modes"][mode]
        busy = "n/a" if r["gpu_busy"] is None else (f"{r['gpu_busy'] * 100:.0f}% (timed wall cycle"
                                                    f" {r['timed_wall_cycle_ms']:.3f} ms)")
        print(f"  {mode}: {r['timed_cycles']} of {r['decode_cycles']} decode cycles timed (sample_every"
              f" {sorted(set(r['sample_every']))}); profiler host time {r['profiler_host_us_per_cycle']:.1f} us per"
              f" cycle as it reports it, {r['profiler_host_share'] * 100:.2f}% of the wall cycle (set-up at the first"
              f" cycle, apart: {r['profiler_setup_ms']:.1f} ms); GPU busy {busy}; accept length {r['accept_length']}")
    for check in regime["invariants"]:
        state = "skipped" if check["ok"] is None else "ok     " if check["ok"] else "FAILED "
        print(f"  {state} {check['name']}: {check['detail']}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", choices=[*REGIMES, "both"], default="both", help="default: both")
    parser.add_argument("--cycles", type=int, default=2000, help="measured cycles per run (default 2000)")
    parser.add_argument("--interval", type=int, default=ep.DEFAULT_INTERVAL,
                        help=f"EAGLE3_PROFILE_INTERVAL (default {ep.DEFAULT_INTERVAL}, as shipped)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured cycles before each run (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode; the best counts (default 3)")
    parser.add_argument("--phase-scale", type=float, help="one regime of your own: scale of the phases' GPU times")
    parser.add_argument("--host-ms", type=float, help="... and host time per cycle in ms")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--host-profile", action="store_true",
                        help="then break eagle3-profile's host time down by profiler method and under cProfile")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: check the script's logic only")
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.repeats < 1 or args.interval < 1:
        parser.error("--cycles, --interval and --repeats must be at least 1")
    if (args.phase_scale is None) != (args.host_ms is None):
        parser.error("--phase-scale and --host-ms go together")
    if args.phase_scale is not None and not (args.phase_scale > 0 and args.host_ms >= 0):
        parser.error("--phase-scale must be positive and --host-ms not negative")
    return args


def main(argv=None) -> int:
    global PROFILE_INTERVAL
    args = parse_args(argv)
    PROFILE_INTERVAL = args.interval
    if args.phase_scale is not None:
        regimes = {"custom": (args.phase_scale, args.host_ms)}
    else:
        regimes = REGIMES if args.regime == "both" else {args.regime: REGIMES[args.regime]}
    if args.dry_run:
        make_device, report = HostOnly, {"device": "none (dry run: host spins at 1/20 scale)"}
    else:
        import torch

        if not torch.cuda.is_available():
            print("eagle3_profile_overhead: no CUDA GPU here; use --dry-run to check the script", file=sys.stderr)
            return 2
        make_device = functools.partial(Gpu, torch)
        report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    report.update(dry_run=args.dry_run, cycles=args.cycles, interval=args.interval, repeats=args.repeats,
                  batch_size=BATCH_SIZE,
                  accept_lens=ACCEPT_LENS, goal_overhead_pct=GOAL_PCT, regimes={})
    log = Collect()
    logging.getLogger(__name__).addHandler(log)  # the profiler logs through the worker module's logger
    logging.getLogger(__name__).setLevel(logging.INFO)
    logging.getLogger(__name__).propagate = False
    with tempfile.TemporaryDirectory() as scratch:
        profile_file = os.path.join(scratch, "eagle3-profile.jsonl")
        for name, (scale, host_ms) in regimes.items():
            device = make_device(scale)
            host_ms = host_ms * (HostOnly.scale if args.dry_run else 1)
            print(f"{name}: device {report['device']}; phase graphs (ms): "
                  + ", ".join(f"{p} {ms:.3f}" for p, ms in device.measured_ms.items()) + f"; host {host_ms} ms",
                  flush=True)
            report["regimes"][name] = regime = run_regime(device, args, host_ms, profile_file)
            regime["phase_scale"], regime["target_ms"] = scale, {p: ms * scale for p, ms in TARGET_MS.items()}
            print_regime(name, regime)
            if args.host_profile:
                regime["host_profile"] = host_profile(device, args.cycles, args.warmup, host_ms, profile_file,
                                                      functools.partial(run_once, "eagle3-profile"), make_profiler)
                print_host_profile(regime["host_profile"])
        capture = device.capture_check()
    report["capture_check"] = capture
    ok = capture is None or (capture["capture_ok"] and capture["profiler_active"] and not capture[
        "timed_during_capture"])
    print(f"a cycle during CUDA-graph capture records nothing: {'skipped (no GPU)' if capture is None else ok}")
    report["profile_log_lines"] = len(log.lines)
    if args.out:
        Path(args.out).write_text(json.dumps(ep.finite(report), indent=2, allow_nan=False) + "\n")
        print(f"wrote {args.out}")
    failed = not ok or any(c["ok"] is False for r in report["regimes"].values() for c in r["invariants"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
