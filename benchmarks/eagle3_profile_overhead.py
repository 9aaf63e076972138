#!/usr/bin/env python3
"""What EAGLE3_PROFILE's timers cost: a synthetic speculative decoding loop on one GPU, run three ways.

The loop has the shape of SGLang's EAGLE v2 worker under the overlap scheduler: each cycle replays three CUDA
graphs (draft 0.89 ms, verify 18.67 ms, draft re-extend 0.28 ms of GPU time - the seed measurement), the verify
graph also writes the accepted lengths of the batch; then the host waits for the previous cycle's result (as
SGLang's copy_done does) and spends ~1.5 ms on host work while the GPU runs the current cycle.

Modes, interleaved, best of ``--repeats`` each:
  off                no timers: the worker's own methods
  eagle3-profile     the methods wrapped by sglang_pcie.eagle_profiler.wrap (the real code: CUDA events on the
                     stream, finished cycles read a few per call, interval statistics, JSON-lines file, log line)
  host-synchronised  the naive timer: torch.cuda.synchronize() + time.perf_counter() around every phase

Prints throughput and overhead against "off" for each, the host time of each forward_batch_generation call (mean,
median, p99, max: a mean far above the median means a few slow calls), the garbage collections that ran inside
those calls, the phase times each timer measured, and writes them as JSON to --out.

--host-profile then runs eagle3-profile once more per variant - the profiler as it is, and its old hot path
(Event.record() looking up torch.cuda.current_stream() per mark, cycles read only in batches of 64) - with the
profiler's methods timed one by one (perf_counter around each: calls per cycle, us per cycle, worst call), and
once under cProfile (the functions taking the most host time per cycle, C calls such as Event.record included).

Needs only torch and a CUDA GPU (about 2 minutes on an H200, 30 s more with --host-profile).  --dry-run checks the
script's logic without a GPU (host spins instead of kernels; figures meaningless).

usage: python3 benchmarks/eagle3_profile_overhead.py [--cycles 300] [--repeats 3] [--out FILE] [--host-profile]
                                                     [--dry-run]
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import json
import logging
import os
import pstats
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, nothing installed

from sglang_pcie import eagle_profiler as ep  # noqa: E402

TARGET_MS = {"draft": 0.89, "verify": 18.67, "draft_extend": 0.28}
KERNELS = {"draft": 5, "verify": 61, "draft_extend": 2}  # a graph is several kernels, as a model's layers
METHODS = (("forward_batch_generation", "cycle"), ("draft", "draft"), ("verify", "verify"),
           ("draft_extend", "draft_extend"))
MODES = ("off", "eagle3-profile", "host-synchronised")
BATCH_SIZE = 4
ACCEPT_LENS = [2, 1, 2, 2]  # tokens per request per cycle (accept length 1.75)


def spin(seconds: float) -> None:
    """Busy host work (holds the GIL, as SGLang's scheduler does)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class DecodeMode:
    def is_extend(self):
        return False

    def is_idle(self):
        return False


class SyntheticWorker:
    """forward_batch_generation -> draft, verify, draft_extend, each one graph replay (or host spin, dry run)."""

    tp_rank = 0

    def __init__(self, phases, accept_lens):
        self.phases = phases  # phase -> callable that launches its GPU work
        self.accept_lens = accept_lens

    def forward_batch_generation(self, batch):
        self.draft(batch)
        result = self.verify(batch)
        self.draft_extend(batch, result)
        return result

    def draft(self, batch):
        self.phases["draft"]()

    def verify(self, batch):
        self.phases["verify"]()
        return types.SimpleNamespace(accept_lens=self.accept_lens)

    def draft_extend(self, batch, result):
        self.phases["draft_extend"]()


def host_synchronised(function, phase, sink, synchronize):
    def timed(self, *args, **kwargs):
        synchronize()
        start = time.perf_counter()
        result = function(self, *args, **kwargs)
        synchronize()
        sink.setdefault(phase, []).append((time.perf_counter() - start) * 1e3)
        return result
    return timed


def worker_class(mode, sink, synchronize):
    attrs = {}
    for name, phase in METHODS:
        function = SyntheticWorker.__dict__[name]
        if mode == "eagle3-profile":
            attrs[name] = ep.wrap(function, phase)
        elif mode == "host-synchronised":
            attrs[name] = host_synchronised(function, phase, sink, synchronize)
    return type(f"Worker_{mode.replace('-', '_')}", (SyntheticWorker,), attrs)


class Gpu:
    """The GPU side: spin kernels of calibrated length, captured in one CUDA graph per phase."""

    def __init__(self, torch):
        self.torch = torch
        self.cycles_per_ms = self._calibrate()
        self.accept_lens = torch.zeros(BATCH_SIZE, dtype=torch.int32, device="cuda")
        self.pattern = torch.tensor(ACCEPT_LENS, dtype=torch.int32, device="cuda")
        self.graphs = {}
        self.measured_ms = {}
        for phase, target in TARGET_MS.items():
            cycles = int(target * self.cycles_per_ms / KERNELS[phase])
            measured = self._capture(phase, cycles)
            # clocks drift from the calibration run: correct once so the graphs match the seed durations
            self.measured_ms[phase] = self._capture(phase, int(cycles * target / measured))

    def _calibrate(self):
        torch = self.torch
        for _ in range(3):
            torch.cuda._sleep(1_000_000)
        samples = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            end.synchronize()
            samples.append(2_000_000 / start.elapsed_time(end))
        return statistics.median(samples)

    def _capture(self, phase, cycles_per_kernel):
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(KERNELS[phase]):
                    torch.cuda._sleep(cycles_per_kernel)
                if phase == "verify":  # the acceptance writes the batch's accepted lengths
                    self.accept_lens.copy_(self.pattern)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.graphs[phase] = graph
        for _ in range(3):
            graph.replay()
        samples = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples)

    def phases(self):
        return {phase: graph.replay for phase, graph in self.graphs.items()}

    def old_hot_path_clock(self):
        """The profiler's clock as first written: Event.record() looks the current stream up at every mark."""
        class OldClock(ep.CudaClock):
            def record(self, marks, index):
                marks[index].record()
        return OldClock(self.torch, ep.DRAIN_BATCH + ep.DRAIN_LAG + 1)

    def done_marker(self):
        event = self.torch.cuda.Event()
        event.record()
        return event

    def synchronize(self):
        self.torch.cuda.synchronize()


class HostOnly:
    """--dry-run: host spins stand in for the kernels (scaled down), so the script's logic runs without a GPU."""

    scale = 0.05

    def __init__(self):
        self.accept_lens = types.SimpleNamespace(shape=(BATCH_SIZE,), sum=lambda: sum(ACCEPT_LENS))
        self.measured_ms = {phase: ms * self.scale for phase, ms in TARGET_MS.items()}

    def phases(self):
        return {phase: (lambda ms=ms: spin(ms / 1e3)) for phase, ms in self.measured_ms.items()}

    def old_hot_path_clock(self):
        return ep.HostClock()

    def done_marker(self):
        return types.SimpleNamespace(synchronize=lambda: None)

    def synchronize(self):
        pass


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())
        if record.levelno >= logging.WARNING:  # the profiler stopping itself, say
            print(record.getMessage(), file=sys.stderr)


class GcInCalls:
    """A gc.callbacks entry: the collections that run inside the timed calls (allocations there trigger them)."""

    def __init__(self):
        self.in_call = False
        self.collections = [0, 0, 0]  # per generation
        self.seconds = 0.0
        self._start = None

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter() if self.in_call else None
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1
            self._start = None


def run_once(mode, device, cycles, warmup, host_ms, profile_file, profiler=None, call_profile=None,
             method_us=None):
    """One run of ``cycles`` timed cycles.  ``profiler``: the one eagle3-profile uses (default: as configured);
    ``call_profile``: a cProfile.Profile enabled around each timed forward_batch_generation call only;
    ``method_us``: ``time_methods``'s lists, emptied when the timed cycles start."""
    sink = {}
    cls = worker_class(mode, sink, device.synchronize)
    worker = cls(device.phases(), device.accept_lens)
    batch = types.SimpleNamespace(forward_mode=DecodeMode(), is_extend_in_batch=False)
    if mode == "eagle3-profile" and profiler is None:
        profiler = ep.Profiler(interval=200, path=profile_file)
    ep.set_profiler(profiler)
    call_us = []
    gc_in_calls = GcInCalls()
    gc.callbacks.append(gc_in_calls)
    previous = None
    for index in range(warmup + cycles):
        timed = index >= warmup
        if index == warmup:
            device.synchronize()
            sink.clear()
            for durations in (method_us or {}).values():
                durations.clear()
            started = time.perf_counter()
        if timed and call_profile is not None:
            call_profile.enable()
        gc_in_calls.in_call = timed
        call_start = time.perf_counter()
        result = worker.forward_batch_generation(batch)
        call_end = time.perf_counter()
        gc_in_calls.in_call = False
        if timed and call_profile is not None:
            call_profile.disable()
        if timed:
            call_us.append((call_end - call_start) * 1e6)
        result.done = device.done_marker()
        if previous is not None:
            previous.done.synchronize()  # the scheduler processes the previous cycle's output
        spin(host_ms / 1e3)
        previous = result
    device.synchronize()
    elapsed = time.perf_counter() - started
    gc.callbacks.remove(gc_in_calls)
    run = {"seconds": elapsed, "host_call_us": statistics.fmean(call_us), "call_us": call_us,
           "gc_in_calls": {"collections_by_generation": gc_in_calls.collections,
                           "us_per_cycle": gc_in_calls.seconds / cycles * 1e6}}
    if method_us is not None:  # before flush(), which reads outside the timed cycles
        run["method_us"] = {name: list(durations) for name, durations in method_us.items()}
    if profiler is not None:
        if not profiler.active:
            raise SystemExit("eagle3_profile_overhead: the profiler stopped itself (see its warning above)")
        profiler.flush()
        records = [r for r in profiler.records if r["decode_cycles"]]
        total = sum(r["decode_cycles"] for r in records)
        run["measured_phase_ms"] = {name: sum(r["phases_ms"][name]["mean"] * r["decode_cycles"] for r in records)
                                    / total for name in ep.REPORTED}
        run["syncs"] = sum(r["syncs"] for r in records)
        run["accept_length"] = records[-1]["accept_length"]
    elif sink:
        run["measured_phase_ms"] = {phase: statistics.fmean(values) for phase, values in sink.items()}
    ep.set_profiler(None)
    return run


def distribution(values) -> dict:
    ordered = sorted(values)
    return {"mean": statistics.fmean(ordered), "median": ep.quantile(ordered, 0.5),
            "p90": ep.quantile(ordered, 0.9), "p99": ep.quantile(ordered, 0.99), "max": ordered[-1],
            "calls_over_1ms": sum(1 for v in ordered if v > 1000.0)}


# The profiler's methods timed one by one; inclusive (end_cycle includes _read_finished and _drain, which include
# _take, which includes _report).
TIMED_METHODS = ("begin_cycle", "begin_phase", "end_phase", "end_cycle", "_count_tokens", "_read_finished",
                 "_drain", "_take", "_report")


def time_methods(profiler) -> dict:
    """Wrap ``profiler``'s methods (instance attributes shadow the class's) to record each call's host time."""
    durations = {name: [] for name in TIMED_METHODS}

    def timed(method, sink):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                sink.append((time.perf_counter() - start) * 1e6)
        return call

    for name in TIMED_METHODS:
        setattr(profiler, name, timed(getattr(profiler, name), durations[name]))
    return durations


def top_functions(profile, cycles, count=20) -> list:
    """cProfile's functions with the most own time, per cycle."""
    rows = []
    for (filename, line, function), (_, calls, own_s, cumulative_s, _) in pstats.Stats(profile).stats.items():
        where = function if filename == "~" else f"{Path(filename).name}:{line}({function})"
        rows.append({"function": where, "calls_per_cycle": calls / cycles, "own_us_per_cycle": own_s / cycles * 1e6,
                     "cumulative_us_per_cycle": cumulative_s / cycles * 1e6})
    return sorted(rows, key=lambda row: row["own_us_per_cycle"], reverse=True)[:count]


def host_profile(device, cycles, warmup, host_ms, profile_file) -> dict:
    variants = {
        "current": lambda: ep.Profiler(interval=200, path=profile_file),
        "old hot path": lambda: ep.Profiler(interval=200, path=profile_file, clock=device.old_hot_path_clock(),
                                            read_per_call=0),
    }
    results = {}
    for variant, make in variants.items():
        profiler = make()
        run = run_once("eagle3-profile", device, cycles, warmup, host_ms, profile_file, profiler=profiler,
                       method_us=time_methods(profiler))
        methods = {name: {"calls_per_cycle": len(values) / cycles, "us_per_cycle": sum(values) / cycles,
                          "max_us": max(values, default=0.0)} for name, values in run["method_us"].items()}
        call_profile = cProfile.Profile()
        run_once("eagle3-profile", device, cycles, warmup, host_ms, profile_file, profiler=make(),
                 call_profile=call_profile)
        results[variant] = {"call_us": distribution(run["call_us"]), "gc_in_calls": run["gc_in_calls"],
                            "methods": methods, "cprofile_top": top_functions(call_profile, cycles)}
    return results


def print_host_profile(results) -> None:
    for variant, result in results.items():
        d = result["call_us"]
        print(f"\nhost profile, eagle3-profile, {variant}: us per forward_batch_generation call: mean {d['mean']:.1f}"
              f"  median {d['median']:.1f}  p90 {d['p90']:.1f}  p99 {d['p99']:.1f}  max {d['max']:.1f}"
              f"  calls > 1 ms: {d['calls_over_1ms']}")
        print(f"  garbage collections inside the calls (gen 0/1/2): "
              f"{'/'.join(map(str, result['gc_in_calls']['collections_by_generation']))},"
              f" {result['gc_in_calls']['us_per_cycle']:.1f} us per cycle")
        print(f"  {'profiler method (inclusive)':<30}{'calls/cycle':>12}{'us/cycle':>10}{'worst call us':>15}")
        for name, m in result["methods"].items():
            print(f"  {name:<30}{m['calls_per_cycle']:12.2f}{m['us_per_cycle']:10.1f}{m['max_us']:15.1f}")
        print("  cProfile (its own overhead inflates Python calls), top own time per cycle:")
        print(f"  {'calls/cycle':>11}{'own us':>9}{'cum us':>9}  function")
        for row in result["cprofile_top"]:
            print(f"  {row['calls_per_cycle']:11.2f}{row['own_us_per_cycle']:9.1f}{row['cumulative_us_per_cycle']:9.1f}"
                  f"  {row['function']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300, help="timed cycles per run (default 300)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode; the best counts (default 3)")
    parser.add_argument("--host-ms", type=float, default=1.5, help="host work per cycle in ms (default 1.5)")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--host-profile", action="store_true",
                        help="then break eagle3-profile's host time down by profiler method and under cProfile")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: check the script's logic only")
    args = parser.parse_args(argv)
    for name in ("cycles", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be at least 1")

    meta = {"dry_run": args.dry_run, "cycles": args.cycles, "repeats": args.repeats, "host_ms": args.host_ms,
            "target_ms": TARGET_MS, "batch_size": BATCH_SIZE, "accept_lens": ACCEPT_LENS}
    if args.dry_run:
        device = HostOnly()
        meta["host_ms"] = args.host_ms * HostOnly.scale
        meta["device"] = "none (dry run: host spins at 1/20 scale)"
    else:
        import torch

        if not torch.cuda.is_available():
            print("eagle3_profile_overhead: no CUDA GPU here; use --dry-run to check the script", file=sys.stderr)
            return 2
        device = Gpu(torch)
        meta["device"] = torch.cuda.get_device_name()
        meta["torch"] = torch.__version__
        meta["spin_cycles_per_ms"] = device.cycles_per_ms
    meta["graph_ms_measured"] = device.measured_ms
    print(f"device: {meta['device']}; phase graphs (ms): "
          + ", ".join(f"{p} {ms:.3f}" for p, ms in device.measured_ms.items()), flush=True)

    log = Collect()
    logging.getLogger(__name__).addHandler(log)  # the profiler logs through the worker module's logger
    logging.getLogger(__name__).setLevel(logging.INFO)
    logging.getLogger(__name__).propagate = False
    runs = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        profile_file = os.path.join(scratch, "eagle3-profile.jsonl")
        for repeat in range(args.repeats):
            for mode in MODES:
                run = run_once(mode, device, args.cycles, args.warmup, meta["host_ms"], profile_file)
                runs[mode].append(run)
                print(f"  run {repeat + 1}/{args.repeats} {mode:<18} {args.cycles / run['seconds']:8.2f} cycles/s",
                      flush=True)
        json_lines = sum(1 for _ in open(profile_file)) if os.path.exists(profile_file) else 0

    tokens_per_cycle = sum(ACCEPT_LENS)
    results = {}
    best_off = min(r["seconds"] for r in runs["off"])
    for mode in MODES:
        best = min(runs[mode], key=lambda r: r["seconds"])
        results[mode] = {
            "runs_s": [r["seconds"] for r in runs[mode]], "best_s": best["seconds"],
            "cycles_per_s": args.cycles / best["seconds"],
            "tokens_per_s": args.cycles * tokens_per_cycle / best["seconds"],
            "cycle_ms": best["seconds"] / args.cycles * 1e3,
            "overhead_pct": (best["seconds"] / best_off - 1) * 100,
            "host_call_us": statistics.fmean(r["host_call_us"] for r in runs[mode]),
            "host_call_us_distribution": distribution([us for r in runs[mode] for us in r["call_us"]]),
            "gc_in_calls": [r["gc_in_calls"] for r in runs[mode]]}
        for key in ("measured_phase_ms", "syncs", "accept_length"):
            if key in best:
                results[mode][key] = best[key]
    report = {**meta, "modes": results, "profile_json_lines": json_lines, "profile_log_lines": len(log.lines),
              "last_profile_log_line": log.lines[-1] if log.lines else None,
              "goal_overhead_pct": 1.0, "goal_met": results["eagle3-profile"]["overhead_pct"] <= 1.0}

    print(f"\n{'mode':<18}{'cycles/s':>10}{'tokens/s':>10}{'cycle ms':>10}{'overhead':>10}"
          f"{'host us/call: mean':>20}{'median':>8}{'p99':>8}{'max':>8}"
          "   measured draft / verify / re-extend / cycle ms")
    for mode, r in results.items():
        measured = r.get("measured_phase_ms")
        figures = (" / ".join(f"{measured[p]:.3f}" for p in ("draft", "verify", "draft_extend", "cycle")
                              if p in measured) if measured else "-")
        d = r["host_call_us_distribution"]
        print(f"{mode:<18}{r['cycles_per_s']:10.2f}{r['tokens_per_s']:10.1f}{r['cycle_ms']:10.3f}"
              f"{r['overhead_pct']:9.2f}%{r['host_call_us']:20.1f}{d['median']:8.1f}{d['p99']:8.1f}{d['max']:8.0f}"
              f"   {figures}")
    for mode, r in results.items():
        collections = [sum(run["collections_by_generation"][g] for run in r["gc_in_calls"]) for g in range(3)]
        print(f"{mode}: garbage collections inside the calls over {args.repeats} runs (gen 0/1/2):"
              f" {'/'.join(map(str, collections))},"
              f" {statistics.fmean(run['us_per_cycle'] for run in r['gc_in_calls']):.1f} us per cycle")
    print(f"eagle3-profile: forced GPU waits {results['eagle3-profile'].get('syncs')}, "
          f"{report['profile_log_lines']} log lines, {json_lines} JSON lines; goal <= 1% overhead: "
          f"{'met' if report['goal_met'] else 'NOT met'}", flush=True)
    if args.host_profile:
        with tempfile.TemporaryDirectory() as scratch:
            report["host_profile"] = host_profile(device, args.cycles, args.warmup, meta["host_ms"],
                                                  os.path.join(scratch, "host-profile.jsonl"))
        print_host_profile(report["host_profile"])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
