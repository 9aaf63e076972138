"""``sglang-pcie tune-nccl``: measure candidate NCCL profiles, and FlashInfer's PCIe-IPC all-reduce, on the local
GPUs and keep what is measurably faster than NCCL's defaults.

Each candidate runs in fresh processes (NCCL reads its variables once per process), one per rank. Every rank
all-reduces tokens x hidden tensors captured in a CUDA graph, at decode/verify sizes (2 x layers all-reduces per
graph, one verify pass, as SGLang's decode graphs hold) and at prefill sizes (fewer per graph, bounded in memory),
checks the sums exactly, and reports microseconds per all-reduce (median of the timed replays; the slowest rank
counts). A profile whose capture, sums or processes fail, or that runs past its time bound (its process groups are
killed), is dropped from the table with the reason.

Where the installed FlashInfer has the PCIe-IPC all-reduce (>= 0.7.0), the same workers measure it at the
decode sizes (never prefill sizes: SGLang's adapter bounds it to a decode-sized workspace), after running
FlashInfer's own ``tune()`` into the cache file SGLang's adapter reads, and the result records per size whether
it beats the NCCL the server would run, and up to which size.

The parent imports neither torch nor CUDA nor FlashInfer: it probes the GPUs through NVML and starts workers, so
the sweep can always kill them and go on. ``--backend gloo`` runs the same workers on CPU tensors (no graphs);
it checks the machinery, not NCCL.

This module is the command (its arguments and ``run``); the parts: ``measure`` / ``measure_ipc`` / ``worker`` (one
rank, in a worker process: ``python -m sglang_pcie.tools.tune_nccl --worker SPEC``), ``launch`` (one run's ranks),
``sweep``, ``ipc``, ``verdict`` (the winner rule), ``report`` (tables and the tuned file's content).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

from sglang_pcie.runtime import gpus, tuned_file
from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.tune_nccl.ipc import ipc_unavailable, run_ipc
from sglang_pcie.tools.tune_nccl.launch import TUNABLE_VARS, progress
from sglang_pcie.tools.tune_nccl.measure import DTYPES, IPC_NAME, allreduces_per_graph
from sglang_pcie.tools.tune_nccl.report import render_table, tuned_config
from sglang_pcie.tools.tune_nccl.sweep import LATER_TIMEOUT_FACTOR, LATER_TIMEOUT_FLOOR, run_sweep

CANDIDATES = tuned_file.CANDIDATES
__all__ = ["CANDIDATES", "COMMAND", "TUNABLE_VARS", "WORKER_COMMAND"]
DECODE_TOKENS = [1, 2, 4, 8]
PREFILL_TOKENS = [512, 2048, 8192]
# The worker processes each profile's ranks run: this package with --worker SPEC (tests put a fake here).
REAL_WORKER = [sys.executable, "-m", "sglang_pcie.tools.tune_nccl"]
WORKER_COMMAND = list(REAL_WORKER)
INSTALL_TORCH = "pip install torch, or pip install 'sglang-pcie[serve]' for SGLang and FlashInfer too"


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers")
    return sorted(set(values))


def _token_list(text: str) -> list[int]:
    return [] if text.strip().lower() in ("", "none") else _positive_ints(text)


def _positive_int(text: str) -> int:
    values = _positive_ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return values[0]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


DESCRIPTION = (
    "Measure NCCL profiles (and FlashInfer's PCIe-IPC all-reduce) at decode and prefill all-reduce sizes on "
    "the GPUs this process sees, and write what is faster than NCCL's defaults beyond the measured noise (and "
    "never more than 3% slower at any measured size) to the tuned file that SGLANG_PCIE_NCCL_PROFILE=auto|tuned "
    "uses; where the defaults' own runs are too noisy to tell, NCCL's defaults are kept. A real run needs torch "
    f"({INSTALL_TORCH}) and 2 or more NVIDIA GPUs; --dry-run previews what would run without either.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=_positive_int,
                   help="ranks (GPUs) to all-reduce over (default: every GPU CUDA_VISIBLE_DEVICES shows); the file "
                        "applies to a server that sees exactly these GPUs")
    p.add_argument("--hidden", type=_positive_int, default=7168, help="hidden size of the model (default 7168)")
    p.add_argument("--tokens", type=_positive_ints, default=DECODE_TOKENS,
                   help="decode/verify tokens per all-reduce, comma-separated (default 1,2,4,8); the PCIe-IPC "
                        "all-reduce is measured at these")
    p.add_argument("--prefill-tokens", type=_token_list, default=PREFILL_TOKENS,
                   help="prefill tokens per all-reduce, comma-separated, or none (default 512,2048,8192)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16", help="element type of the all-reduces (default bf16)")
    p.add_argument("--layers", type=_positive_int, default=61,
                   help="model layers; a decode-size graph holds 2 x layers all-reduces, one forward pass "
                        "(default 61)")
    p.add_argument("--timeout", type=_positive_float, default=120.0,
                   help=f"seconds one profile may take (default 120; after the first profile: at most "
                        f"{LATER_TIMEOUT_FACTOR}x the defaults' run time, at least {LATER_TIMEOUT_FLOOR:.0f} s)")
    p.add_argument("--ipc", choices=("auto", "on", "off"), default="auto",
                   help="measure FlashInfer's PCIe-IPC all-reduce: auto (where the installed FlashInfer has it), "
                        "on (try regardless), off")
    p.add_argument("--ipc-timeout", type=_positive_float, default=300.0,
                   help="seconds one PCIe-IPC run may take, including the first JIT build of its kernels "
                        "(default 300)")
    p.add_argument("--profiles",
                   help=f"comma-separated subset of: {', '.join(CANDIDATES)} (default always runs)")
    p.add_argument("--out", type=Path, help=f"tuned file to write (default: ${tuned_file.TUNED_FILE_VAR} or "
                                            "${XDG_CONFIG_HOME:-~/.config}/sglang-pcie/nccl-tuned.json)")
    p.add_argument("--dry-run", action="store_true", help="show what would run and where it would be written")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                   help="gloo: CPU tensors, no CUDA graphs - checks the sweep itself, measures nothing NCCL uses")


def _stop(signum, frame):
    raise SystemExit(128 + signum)


def unwritable(out: Path) -> str | None:
    """Why the tuned file could not be written at ``out`` (None when it can): checked before the sweep."""
    if out.is_dir():
        return "is a folder; give the file's path"
    folder = out.parent
    while not folder.exists() and folder != folder.parent:  # write_config creates the missing folders
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable"
    return None


def _profiles(args) -> dict:
    """The defaults and the candidates --profiles names (all of CANDIDATES without it), in CANDIDATES' order."""
    if not args.profiles:
        return dict(CANDIDATES)
    wanted = [n.strip() for n in args.profiles.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in CANDIDATES]
    if unknown:
        raise UsageError(f"--profiles: unknown profile {unknown[0]!r} (known: {', '.join(CANDIDATES)})")
    return {n: CANDIDATES[n] for n in CANDIDATES if n == "default" or n in wanted}


def _torch_missing() -> str | None:
    """Why the real workers cannot run here (None when they can): torch is not installed for this Python. Found
    without importing it."""
    if WORKER_COMMAND != REAL_WORKER or importlib.util.find_spec("torch") is not None:
        return None
    return f"needs torch, which is not installed for {sys.executable}: {INSTALL_TORCH}"


def _ranks(args, gloo: bool):
    """(ranks, the topology of the GPUs they use): --tp, else every visible GPU (2 CPU ranks with gloo; a --dry-run
    where fewer than 2 GPUs are visible previews 2 ranks, and says so)."""
    topology = gpus.probe_topology()
    available = topology.gpu_count
    seen = f"{available} GPU(s) visible ({topology.detail or topology.source})"
    preview = args.dry_run and not gloo and available < (args.tp or 2)
    world = args.tp or (2 if gloo or preview else available)
    if world < 2:  # (a --tp below 2 is refused before)
        raise UsageError(f"{seen}: an all-reduce needs at least 2 ranks; --dry-run previews without them")
    if preview:
        progress(f"note: a preview: {seen}; showing what would run over {world} ranks"
                 + ("" if args.tp else " (without --tp: 2 where fewer than 2 GPUs are visible)")
                 + f"; a real run needs {world} GPUs")
        return world, topology
    if not gloo and world > available:
        raise UsageError(f"--tp {world}: only {seen}; --dry-run previews without them")
    if not gloo and world < available:
        progress(f"note: measuring {world} of the {available} visible GPUs; the result applies to a server that "
                 f"sees exactly those (set CUDA_VISIBLE_DEVICES to them for the server)")
        topology = gpus.probe_topology(dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(
            (os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(available)))).split(",")[:world])))
    return world, topology


def _announce(args, world: int, fingerprint: dict, profiles: dict, spec: dict, skip_ipc: str | None, out: Path):
    sizes = spec["tokens"]
    counts = "/".join(str(allreduces_per_graph(spec, t)) for t in sizes)
    ipc = (f"measured at {'/'.join(map(str, args.tokens))} tokens" if not skip_ipc
           else f"not measured ({skip_ipc})")
    progress(f"{world} ranks on {tuned_file.describe_machine(fingerprint)}; {len(profiles)} profiles; {args.dtype} "
             f"{'/'.join(map(str, sizes))} tokens x {args.hidden}, {counts} all-reduces per "
             f"{'CUDA graph' if args.backend != 'gloo' else 'timed loop'}; PCIe-IPC all-reduce: {ipc}; "
             f"{'would write' if args.dry_run else 'writing'} {out}")
    stripped = sorted(name for name in TUNABLE_VARS if name in os.environ)
    if stripped:
        progress(f"measuring without your {', '.join(stripped)} (each profile sets its own); at server start "
                 "your values still win over the tuned ones")


def _dry_run(profiles: dict, args, skip_ipc: str | None) -> int:
    for name, values in profiles.items():
        print(f"{name:<14} {' '.join(f'{k}={v}' for k, v in values.items()) or '(NCCL defaults)'}")
    print(f"{IPC_NAME:<14} " + (f"FlashInfer PCIe-IPC all-reduce at {'/'.join(map(str, args.tokens))} tokens"
                                if not skip_ipc else f"not measured: {skip_ipc}"))
    return 0


def _measure(profiles: dict, spec: dict, world: int, args, skip_ipc: str | None):
    """(sweep, ipc section); the sweep has no verdict when the defaults could not be measured."""
    command = list(WORKER_COMMAND)
    # Stopped by `timeout`, a scheduler or kill: unwind, so that run_profile kills the workers (they run in
    # their own sessions and would otherwise hold the GPUs after we are gone). Ctrl-C unwinds the same way.
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        sweep = run_sweep(profiles, spec, world, args.timeout, command)
        ipc = {"verdict": f"not measured: {skip_ipc}"}
        if sweep.verdict is not None and not skip_ipc:
            verdict = sweep.verdict
            ipc = run_ipc(spec, world, args.tokens, verdict.fastest[verdict.winner], verdict.noise,
                          args.ipc_timeout, command)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return sweep, ipc


def _write(out: Path, config: dict) -> bool:
    try:
        tuned_file.write_config(out, config)
    except (OSError, ValueError) as exc:
        # The measurements took minutes: keep them on stderr rather than lose them.
        print(f"sglang-pcie tune-nccl: could not write {out}: {exc}; the tuned config follows on stderr",
              file=sys.stderr)
        print(json.dumps(config, indent=1, sort_keys=True, default=str), file=sys.stderr)
        return False
    return True


def run(args: argparse.Namespace) -> int:
    profiles = _profiles(args)
    if args.tp is not None and args.tp < 2:
        raise UsageError(f"--tp {args.tp}: an all-reduce needs at least 2 ranks")
    gloo = args.backend == "gloo"
    if gloo and not args.out and not args.dry_run:
        raise UsageError("--backend gloo measures nothing NCCL would use: give --out, so the real tuned file is kept")
    no_torch = _torch_missing()
    if no_torch and not args.dry_run:  # said before the GPUs are probed: on a machine without torch, that is the news
        print(f"{COMMAND.prefix}: error: {no_torch}", file=sys.stderr)
        return 1
    world, topology = _ranks(args, gloo)
    out = args.out or tuned_file.config_path()
    fingerprint = tuned_file.fingerprint(topology)
    sizes = sorted(set(args.tokens) | set(args.prefill_tokens))
    spec = {"backend": args.backend, "tokens": sizes, "hidden": args.hidden, "dtype": args.dtype,
            "allreduces": 2 * args.layers}
    skip_ipc = ipc_unavailable(world, args)
    _announce(args, world, fingerprint, profiles, spec, skip_ipc, out)
    if args.dry_run:
        if no_torch:
            progress(f"note: a real run {no_torch}")
        return _dry_run(profiles, args, skip_ipc)
    problem = unwritable(out)
    if problem:  # found now, not after a sweep of many minutes
        raise UsageError(f"--out {out}: {problem}")

    began = time.monotonic()
    sweep, ipc = _measure(profiles, spec, world, args, skip_ipc)
    if sweep.verdict is None:
        progress(f"NCCL defaults could not be measured ({sweep.errors.get('default')}); nothing written")
        return 1
    wall = time.monotonic() - began
    print(render_table(sweep, profiles, sizes, args.layers, ipc))
    measured_nccl = sweep.info.get("nccl")
    installed = (fingerprint["nccl"] or "").split(",")
    if measured_nccl and not any(d.endswith(f"=={measured_nccl}") for d in installed):
        # The fingerprint still uses the distribution: it is what the launcher can read without loading NCCL.
        progress(f"note: torch runs NCCL {measured_nccl}; installed NCCL distribution: {fingerprint['nccl']}")
    config = tuned_config(sweep, profiles, spec, args, world, fingerprint, ipc, wall)
    if not _write(out, config):
        return 1
    chosen = " ".join(f"{k}={v}" for k, v in config["values"].items()) or "nothing (NCCL's defaults)"
    print(f"NCCL winner: {sweep.verdict.winner}: {chosen}")
    print(f"NCCL verdict: {sweep.verdict.reason}")
    print(f"PCIe-IPC all-reduce: {ipc['verdict']}"
          + (f"; SGLANG_PCIE_IPC_MAX_NUMEL={ipc['max_numel']} where auto switches it on" if ipc.get("max_numel")
             else ""))
    print(f"written to {out}; took {wall:.0f} s")
    return 0


COMMAND = Command("tune-nccl", "measure NCCL profiles on the local GPUs and keep the best", add_arguments, run,
                  description=DESCRIPTION)
