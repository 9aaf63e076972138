"""FlashInfer's PCIe-IPC all-reduce against NCCL (its defaults), latency per all-reduce in CUDA graphs, sums checked.

    python -m benchmarks.ipc_allreduce [--hidden 4096,7168] [--tokens 1,2,4,8,16,32,64] [--tp N] [--out DIR]
                                      [--paths nccl,pcie-ipc] [--no-tune] [--soak N] [--timeout S]

For each hidden size, one NCCL run and one IPC run, each in fresh processes (one per GPU), through the same workers
as `sglang-pcie tune-nccl`: 2 x --layers all-reduces of tokens x hidden bf16 captured in one graph, 20 timed
replays, median per all-reduce, slowest rank; every sum is checked exactly after the eager call, the first replay
and the timed replays. The IPC run first runs FlashInfer's own tune() for a workspace of max(tokens) x hidden into a
scratch cache (FLASHINFER_AUTOTUNE_DIR under --out, so the server's cache is left alone), then measures with the
tuned launch configurations (--no-tune: FlashInfer's seed configurations). The first IPC run builds the kernels
(nvcc, JIT): allow a minute or two.

Prints a markdown table (and writes results.json under --out). A failure (FlashInfer missing, JIT build failing,
wrong sums, a hang past --timeout) is a row saying why, never a crash: the NCCL figures still come out. A failed or
hung run also prints the last lines of each rank's stderr: the worker's progress lines (the last says where a hung
rank stopped), a traceback, or, for a hang, every thread's Python stack (dumped before the ranks are killed).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from sglang_pcie.runtime import gpus
from sglang_pcie.tools import tune_nccl
from sglang_pcie.tools.tune_nccl import launch
from sglang_pcie.tools.tune_nccl.ipc import sglang_tune_ladder
from sglang_pcie.tools.tune_nccl.measure import IPC_NAME


PATHS = ("nccl", IPC_NAME)


def _paths(text: str) -> list[str]:
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    if not wanted or any(w not in PATHS for w in wanted):
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more of {', '.join(PATHS)}, comma-separated")
    return [path for path in PATHS if path in wanted]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=tune_nccl._positive_ints, default=[4096, 7168],
                   help="hidden sizes, comma-separated (default 4096,7168)")
    p.add_argument("--tokens", type=tune_nccl._positive_ints, default=[1, 2, 4, 8, 16, 32, 64],
                   help="tokens per all-reduce, comma-separated (default 1,2,4,8,16,32,64)")
    p.add_argument("--layers", type=tune_nccl._positive_int, default=61,
                   help="a graph holds 2 x layers all-reduces (default 61)")
    p.add_argument("--tp", type=tune_nccl._positive_int, help="ranks (default: every visible GPU)")
    p.add_argument("--no-tune", action="store_true", help="measure FlashInfer's seed launch configurations")
    p.add_argument("--soak", type=int, default=0,
                   help="IPC only: replay each graph this many more times, then check the sums again (hang test)")
    p.add_argument("--timeout", type=tune_nccl._positive_float, default=300.0,
                   help="seconds one run may take, the first JIT build included (default 300)")
    p.add_argument("--out", type=Path, help="folder for results.json and the scratch tune cache")
    p.add_argument("--show-stderr", action="store_true",
                   help="print the last lines of each rank's stderr after every run, not only a failed one (the "
                        "workers' progress lines with their times: a smoke test)")
    p.add_argument("--paths", type=_paths, default=list(PATHS),
                   help=f"which paths to run, comma-separated (default {','.join(PATHS)})")
    p.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    p.add_argument("--worker-command", type=shlex.split, metavar="COMMAND",
                   help="the worker program each rank runs, shell-quoted (default: tune-nccl's own worker; the tests "
                        "pass a scripted fake)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    topology = gpus.probe_topology()
    world = args.tp or topology.gpu_count
    runs = [(hidden, path) for hidden in args.hidden for path in args.paths]
    print(f"# IPC vs NCCL: {world} ranks on {topology.gpu_count} x {', '.join(sorted(set(topology.gpu_names))) or '?'}"
          f" (NVLink {topology.nvlink}, peer-to-peer {topology.p2p}); tokens {args.tokens}; hidden {args.hidden};"
          f" {2 * args.layers} all-reduces per graph; NCCL_P2P_DISABLE={os.environ.get('NCCL_P2P_DISABLE', 'unset')}",
          flush=True)
    if args.dry_run:
        for hidden, path in runs:
            print(f"would run {path} at hidden {hidden}")
        return 0
    if world < 2:
        print(f"error: {world} rank(s): an all-reduce needs 2 or more GPUs", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="ipc-allreduce-"))
    out.mkdir(parents=True, exist_ok=True)
    # A scratch tune cache for the workers: the benchmark's workspace sizes must not land in the cache a server reads.
    scratch = {"FLASHINFER_AUTOTUNE_DIR": str(out / "flashinfer-autotune")}
    command = args.worker_command or list(tune_nccl.WORKER_COMMAND)
    results = {"world": world, "gpus": topology.gpu_names, "nvlink": topology.nvlink, "p2p": topology.p2p,
               "tokens": args.tokens, "layers": args.layers, "runs": []}
    top = max(args.tokens)
    began = time.monotonic()
    # Stopped by an outer `timeout`: unwind, so that run_profile kills the ranks (their own sessions would otherwise
    # keep spinning on the GPUs into whatever runs next).
    previous = signal.signal(signal.SIGTERM, tune_nccl._stop)
    try:
        for hidden, path in runs:
            spec = {"backend": "nccl", "tokens": args.tokens, "hidden": hidden, "dtype": "bf16",
                    "allreduces": 2 * args.layers}
            if path != "nccl":
                spec.update(path=path, tune=not args.no_tune, max_numel=top * hidden,
                            tune_batches=sglang_tune_ladder(top), soak=args.soak)
            outcome = launch.run_profile(scratch, spec, world, args.timeout, command, keep_stderr=args.show_stderr)
            row = {"hidden": hidden, "path": path, "wall_s": round(outcome.wall_s, 1), "error": outcome.error,
                   "us": {str(t): v for t, v in (outcome.us or {}).items()}, "info": outcome.info,
                   "stderr_tails": {str(r): lines for r, lines in outcome.stderr_tails.items()}}
            results["runs"].append(row)
            print(f"# {path} hidden {hidden}: {outcome.wall_s:.1f} s"
                  + (f", FAILED: {outcome.error}" if outcome.error else "")
                  + (f", tuned {outcome.info.get('tuned_shapes')} shapes in {outcome.info.get('tune_s')} s"
                     f" (the cache holds {outcome.info.get('tune_saved') if outcome.info.get('tune_saved') is not None else '?'}"
                     f" configurations)"
                     if outcome.info.get("tuned_shapes") is not None else ""), flush=True)
            if outcome.stderr_tails:  # a failure, or --show-stderr
                print(f"# the ranks' stderr ends (last {launch.STDERR_TAIL_LINES} lines each):\n"
                      + launch.format_tails(outcome.stderr_tails, indent="#   "), flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    results["wall_s"] = round(time.monotonic() - began, 1)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0


def render(results: dict) -> str:
    tokens = results["tokens"]
    rows = ["| hidden | path | " + " | ".join(f"{t} tok" for t in tokens) + " |",
            "|---|---|" + "---|" * len(tokens)]
    by = {(r["hidden"], r["path"]): r for r in results["runs"]}
    for (hidden, path), row in by.items():
        cells = [launch.format_us(row["us"].get(str(t))) for t in tokens]
        label = path if not row["error"] else f"{path} (failed: {row['error'][:120]})"
        rows.append(f"| {hidden} | {label} | " + " | ".join(cells) + " |")
        nccl_row = by.get((hidden, "nccl"))
        if path != "nccl" and nccl_row and not row["error"] and not nccl_row["error"]:
            ratios = []
            for t in tokens:
                a, b = nccl_row["us"].get(str(t)), row["us"].get(str(t))
                ratios.append(f"{a / b:.2f}x" if a and b else "-")
            rows.append(f"| {hidden} | NCCL / IPC | " + " | ".join(ratios) + " |")
    return ("Microseconds per all-reduce (bf16, CUDA graphs, median of 20 replays, slowest rank; sums checked)\n\n"
            + "\n".join(rows) + f"\n\ntotal {results['wall_s']} s\n")


if __name__ == "__main__":
    sys.exit(main())
