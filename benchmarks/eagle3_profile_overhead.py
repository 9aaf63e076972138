#!/usr/bin/env python3
"""What EAGLE3_PROFILE's timers cost: a synthetic speculative decoding loop on one GPU, run three ways.

The loop has the shape of SGLang's EAGLE v2 worker under the overlap scheduler: each cycle replays three CUDA
graphs (draft 0.89 ms, verify 18.67 ms, draft re-extend 0.28 ms of GPU time - the seed measurement), the verify
graph also writes the accepted lengths of the batch; then the host waits for the previous cycle's result (as
SGLang's copy_done does) and spends ~1.5 ms on host work while the GPU runs the current cycle.

Modes, interleaved, best of ``--repeats`` each:
  off                no timers: the worker's own methods
  eagle3-profile     the methods wrapped by sglang_pcie.eagle_profiler.wrap (the real code: CUDA events on the
                     stream, drained in batches, interval statistics, JSON-lines file, log line)
  host-synchronised  the naive timer: torch.cuda.synchronize() + time.perf_counter() around every phase

Prints throughput and overhead against "off" for each, the phase times each timer measured, and writes them as
JSON to --out.  Needs only torch and a CUDA GPU (about 2 minutes on an H200).  --dry-run checks the script's
logic without a GPU (host spins instead of kernels; figures meaningless).

usage: python3 benchmarks/eagle3_profile_overhead.py [--cycles 300] [--repeats 3] [--out FILE] [--dry-run]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
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


def run_once(mode, device, cycles, warmup, host_ms, profile_file):
    sink = {}
    cls = worker_class(mode, sink, device.synchronize)
    worker = cls(device.phases(), device.accept_lens)
    batch = types.SimpleNamespace(forward_mode=DecodeMode(), is_extend_in_batch=False)
    profiler = ep.Profiler(interval=200, path=profile_file) if mode == "eagle3-profile" else None
    ep.set_profiler(profiler)
    call_s = 0.0
    previous = None
    for index in range(warmup + cycles):
        if index == warmup:
            device.synchronize()
            sink.clear()
            call_s = 0.0
            started = time.perf_counter()
        call_start = time.perf_counter()
        result = worker.forward_batch_generation(batch)
        call_s += time.perf_counter() - call_start
        result.done = device.done_marker()
        if previous is not None:
            previous.done.synchronize()  # the scheduler processes the previous cycle's output
        spin(host_ms / 1e3)
        previous = result
    device.synchronize()
    elapsed = time.perf_counter() - started
    run = {"seconds": elapsed, "host_call_us": call_s / cycles * 1e6}
    if profiler is not None:
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300, help="timed cycles per run (default 300)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode; the best counts (default 3)")
    parser.add_argument("--host-ms", type=float, default=1.5, help="host work per cycle in ms (default 1.5)")
    parser.add_argument("--out", help="write the results as JSON here")
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
            "cycles_per_s": args.cycles / best["seconds"], "tokens_per_s": args.cycles * tokens_per_cycle / best["seconds"],
            "cycle_ms": best["seconds"] / args.cycles * 1e3,
            "overhead_pct": (best["seconds"] / best_off - 1) * 100,
            "host_call_us": statistics.fmean(r["host_call_us"] for r in runs[mode])}
        for key in ("measured_phase_ms", "syncs", "accept_length"):
            if key in best:
                results[mode][key] = best[key]
    report = {**meta, "modes": results, "profile_json_lines": json_lines, "profile_log_lines": len(log.lines),
              "last_profile_log_line": log.lines[-1] if log.lines else None,
              "goal_overhead_pct": 1.0, "goal_met": results["eagle3-profile"]["overhead_pct"] <= 1.0}

    print(f"\n{'mode':<18}{'cycles/s':>10}{'tokens/s':>10}{'cycle ms':>10}{'overhead':>10}{'host us/call':>14}"
          "   measured draft / verify / re-extend / cycle ms")
    for mode, r in results.items():
        measured = r.get("measured_phase_ms")
        figures = (" / ".join(f"{measured[p]:.3f}" for p in ("draft", "verify", "draft_extend", "cycle")
                              if p in measured) if measured else "-")
        print(f"{mode:<18}{r['cycles_per_s']:10.2f}{r['tokens_per_s']:10.1f}{r['cycle_ms']:10.3f}"
              f"{r['overhead_pct']:9.2f}%{r['host_call_us']:14.1f}   {figures}")
    print(f"eagle3-profile: forced GPU waits {results['eagle3-profile'].get('syncs')}, "
          f"{report['profile_log_lines']} log lines, {json_lines} JSON lines; goal <= 1% overhead: "
          f"{'met' if report['goal_met'] else 'NOT met'}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
