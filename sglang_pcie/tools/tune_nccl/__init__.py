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

Across nodes (``--nnodes N --node-rank R --master-addr HOST``) every node runs this command; each run's ranks are
started by torch's launcher on every node and all-reduce over the network, the nodes step through the same runs
together, and node 0's result is handed to every node, which writes the same file (``nodes``, ``rendezvous``).

This module is the command (its arguments and ``run``); the parts: ``measure`` / ``measure_ipc`` / ``worker`` (one
rank, in a worker process: ``python -m sglang_pcie.tools.tune_nccl --worker SPEC``), ``launch`` (one run's ranks),
``sweep``, ``ipc``, ``verdict`` (the winner rule), ``report`` (tables and the tuned file's content), ``nodes`` and
``rendezvous`` (across nodes: the parent's and the ranks' side).
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
from sglang_pcie.tools.tune_nccl.nodes import HOST, Nodes, NodeSteps, NodesApart, share
from sglang_pcie.tools.tune_nccl.report import CONTENT_DIGEST, render_table, tuned_config
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


def _node_rank(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a node rank (0, 1, ...)")
    return int(text)


def _host(text: str) -> str:
    if not HOST.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a host name or address")
    return text


def _port(text: str) -> int:
    if not (text.isdigit() and 1 <= int(text) <= 65534):
        raise argparse.ArgumentTypeError(f"{text!r} is not a port from 1 to 65534 (the next one is used too)")
    return int(text)


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
    f"({INSTALL_TORCH}) and 2 or more NVIDIA GPUs; --dry-run previews what would run without either. For a server "
    "spanning several boxes, run it on every node with --nnodes N --node-rank R --master-addr NODE0: the all-reduce "
    "is then measured across the network, and every node writes the same result.")


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
    nodes = p.add_argument_group(
        "across nodes", "measure the all-reduce a server spanning several boxes runs, over the network: run the same "
                        "command on every node, each with its own --node-rank; each run's ranks are started by "
                        "torch's launcher (torchrun) there, and every node writes the same result")
    nodes.add_argument("--nnodes", type=_positive_int, default=1,
                       help="nodes the server's tensor parallelism spans (default 1); --tp is then the ranks of all "
                            "nodes together")
    nodes.add_argument("--node-rank", type=_node_rank, help="this node's rank, 0 to nnodes - 1; node 0 serves the "
                                                            "rendezvous and builds the result")
    nodes.add_argument("--master-addr", type=_host, help="node 0's address, as every node reaches it")
    nodes.add_argument("--master-port", type=_port, default=29500,
                       help="torch's rendezvous port on node 0 (default 29500); alternate runs use the next port")
    nodes.add_argument("--join-timeout", type=_positive_float, default=300.0,
                       help="seconds the nodes may take to meet at each run (default 300); a node that does not "
                            "come ends the sweep, in one line")


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


def _torch_missing(across_nodes: bool) -> str | None:
    """Why the real workers (across nodes: torch's launcher) cannot run here (None when they can): torch is not
    installed for this Python. Found without importing it."""
    if (WORKER_COMMAND != REAL_WORKER and not across_nodes) or importlib.util.find_spec("torch") is not None:
        return None
    return f"needs torch, which is not installed for {sys.executable}: {INSTALL_TORCH}"


def _check_nodes(args) -> None:
    if args.nnodes == 1:
        if args.node_rank not in (None, 0) or args.master_addr:
            raise UsageError("--node-rank and --master-addr need --nnodes above 1")
        return
    if args.node_rank is None or args.master_addr is None:
        raise UsageError(f"--nnodes {args.nnodes}: give --node-rank (0 to {args.nnodes - 1}) and --master-addr "
                         "(node 0's address)")
    if args.node_rank >= args.nnodes:
        raise UsageError(f"--node-rank {args.node_rank}: not below --nnodes {args.nnodes}")
    if args.tp is not None and args.tp % args.nnodes:
        raise UsageError(f"--tp {args.tp}: not a multiple of --nnodes {args.nnodes} (every node runs as many ranks)")


def _ranks(args, gloo: bool):
    """(ranks on this node, the topology of the GPUs they use): --tp (divided among --nnodes), else every visible GPU
    (2 CPU ranks with gloo, 1 per node across nodes; a --dry-run where too few GPUs are visible previews that many
    ranks, and says so)."""
    topology = gpus.probe_topology()
    available, nodes = topology.gpu_count, args.nnodes
    seen = f"{available} GPU(s) visible ({topology.detail or topology.source})"
    fewest = 2 if nodes == 1 else 1  # ranks per node that make an all-reduce
    wanted = args.tp // nodes if args.tp else None
    preview = args.dry_run and not gloo and available < (wanted or fewest)
    local = wanted or (fewest if gloo or preview else available)
    if local * nodes < 2:  # (a --tp below 2 is refused before)
        raise UsageError(f"{seen}: an all-reduce needs at least 2 ranks; --dry-run previews without them")
    each = "" if nodes == 1 else " on each node"
    if preview:
        progress(f"note: a preview: {seen}; showing what would run over {local * nodes} ranks"
                 + ("" if args.tp else " (without --tp: 2 where fewer than 2 GPUs are visible)" if nodes == 1
                    else " (without --tp: 1 on each node where none is visible)")
                 + f"; a real run needs {local} GPUs{each}")
        return local, topology
    if not gloo and local > available:
        raise UsageError(f"--tp {args.tp}: " + (f"{local} GPUs on each of {nodes} nodes: " if nodes > 1 else "")
                         + f"only {seen}; --dry-run previews without them")
    if not gloo and local < available:
        progress(f"note: measuring {local} of the {available} visible GPUs; the result applies to a server that "
                 f"sees exactly those (set CUDA_VISIBLE_DEVICES to them for the server)")
        topology = gpus.probe_topology(dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(
            (os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(available)))).split(",")[:local])))
    return local, topology


def _announce(args, world: int, fingerprint: dict, profiles: dict, spec: dict, skip_ipc: str | None, out: Path,
              nodes: Nodes | None):
    sizes = spec["tokens"]
    counts = "/".join(str(allreduces_per_graph(spec, t)) for t in sizes)
    ipc = (f"measured at {'/'.join(map(str, args.tokens))} tokens" if not skip_ipc
           else f"not measured ({skip_ipc})")
    where = (f"{world} ranks on {tuned_file.describe_machine(fingerprint)}" if nodes is None else
             f"{nodes.describe()}; this node: {tuned_file.describe_machine(fingerprint)}")
    progress(f"{where}; {len(profiles)} profiles; {args.dtype} "
             f"{'/'.join(map(str, sizes))} tokens x {args.hidden}, {counts} all-reduces per "
             f"{'CUDA graph' if args.backend != 'gloo' else 'timed loop'}; PCIe-IPC all-reduce: {ipc}; "
             f"{'would write' if args.dry_run else 'writing'} {out}")
    stripped = sorted(name for name in TUNABLE_VARS if name in os.environ)
    if stripped:
        progress(f"measuring without your {', '.join(stripped)} (each profile sets its own); at server start "
                 "your values still win over the tuned ones")


def _dry_run(profiles: dict, args, skip_ipc: str | None, nodes: Nodes | None) -> int:
    for name, values in profiles.items():
        print(f"{name:<14} {' '.join(f'{k}={v}' for k, v in values.items()) or '(NCCL defaults)'}")
    print(f"{IPC_NAME:<14} " + (f"FlashInfer PCIe-IPC all-reduce at {'/'.join(map(str, args.tokens))} tokens"
                                if not skip_ipc else f"not measured: {skip_ipc}"))
    if nodes is not None:
        print(f"each run here: {' '.join(nodes.launcher(1, [*WORKER_COMMAND, '--worker', 'SPEC']))}")
    return 0


def _measure(profiles: dict, spec: dict, world: int, args, skip_ipc: str | None, steps: NodeSteps | None):
    """(sweep, ipc section); the sweep has no verdict when the defaults could not be measured."""
    command = list(WORKER_COMMAND)
    # Stopped by `timeout`, a scheduler or kill: unwind, so that run_profile kills the workers (they run in
    # their own sessions and would otherwise hold the GPUs after we are gone). Ctrl-C unwinds the same way.
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        sweep = run_sweep(profiles, spec, world, args.timeout, command, steps)
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


def _nodes(args, local: int, topology) -> Nodes | None:
    if args.nnodes == 1:
        return None
    return Nodes(args.nnodes, args.node_rank, args.master_addr, args.master_port, args.join_timeout, local,
                 tuned_file.node_fingerprint(topology))


def run(args: argparse.Namespace) -> int:
    profiles = _profiles(args)
    if args.tp is not None and args.tp < 2:
        raise UsageError(f"--tp {args.tp}: an all-reduce needs at least 2 ranks")
    _check_nodes(args)
    gloo = args.backend == "gloo"
    if gloo and not args.out and not args.dry_run:
        raise UsageError("--backend gloo measures nothing NCCL would use: give --out, so the real tuned file is kept")
    no_torch = _torch_missing(args.nnodes > 1)
    if no_torch and not args.dry_run:  # said before the GPUs are probed: on a machine without torch, that is the news
        print(f"{COMMAND.prefix}: error: {no_torch}", file=sys.stderr)
        return 1
    local, topology = _ranks(args, gloo)
    world, nodes = local * args.nnodes, _nodes(args, local, topology)
    out = args.out or tuned_file.config_path()
    fingerprint = tuned_file.fingerprint(topology) if nodes is None else nodes.fingerprint
    sizes = sorted(set(args.tokens) | set(args.prefill_tokens))
    spec = {"backend": args.backend, "tokens": sizes, "hidden": args.hidden, "dtype": args.dtype,
            "allreduces": 2 * args.layers}
    skip_ipc = ipc_unavailable(world, args)
    _announce(args, world, fingerprint, profiles, spec, skip_ipc, out, nodes)
    if args.dry_run:
        if no_torch:
            progress(f"note: a real run {no_torch}")
        return _dry_run(profiles, args, skip_ipc, nodes)
    problem = unwritable(out)
    if problem:  # found now, not after a sweep of many minutes
        raise UsageError(f"--out {out}: {problem}")

    began = time.monotonic()
    steps = None if nodes is None else NodeSteps(nodes, list(WORKER_COMMAND))
    try:
        sweep, ipc = _measure(profiles, spec, world, args, skip_ipc, steps)
        if sweep.verdict is None:
            progress(f"NCCL defaults could not be measured ({sweep.errors.get('default')}); nothing written")
            return 1
        return _finish(args, sweep, ipc, profiles, spec, world, fingerprint, time.monotonic() - began, out, steps)
    except NodesApart as exc:
        progress(f"error: {exc}; nothing written")
        return 1


def _finish(args, sweep, ipc: dict, profiles: dict, spec: dict, world: int, fingerprint: dict, wall: float,
            out: Path, steps: NodeSteps | None) -> int:
    """The table, the tuned file (across nodes: node 0's, handed to every node) and the verdict lines."""
    print(render_table(sweep, profiles, spec["tokens"], args.layers, ipc))
    measured_nccl = sweep.info.get("nccl")
    installed = (fingerprint["nccl"] or "").split(",")
    if measured_nccl and not any(d.endswith(f"=={measured_nccl}") for d in installed):
        # The fingerprint still uses the distribution: it is what the launcher can read without loading NCCL.
        progress(f"note: torch runs NCCL {measured_nccl}; installed NCCL distribution: {fingerprint['nccl']}")
    if steps is None:
        config = tuned_config(sweep, profiles, spec, args, world, fingerprint, ipc, wall)
    else:  # node 0 builds the result from what every node measured alike; every node writes the same
        config = None
        if steps.nodes.rank == 0:
            config = tuned_config(sweep, profiles, spec, args, world,
                                  tuned_file.multi_node_fingerprint(steps.seen["nodes"]), ipc, wall, steps)
        config = share(steps, config, args.timeout)
    if not _write(out, config):
        return 1
    chosen = " ".join(f"{k}={v}" for k, v in config["values"].items()) or "nothing (NCCL's defaults)"
    print(f"NCCL winner: {config['winner']}: {chosen}")
    print(f"NCCL verdict: {config['verdict']}")
    ipc = config["ipc"]
    print(f"PCIe-IPC all-reduce: {ipc['verdict']}"
          + (f"; SGLANG_PCIE_IPC_MAX_NUMEL={ipc['max_numel']} where auto switches it on" if ipc.get("max_numel")
             else ""))
    shared = "" if steps is None else f"; the same file on all {steps.nodes.count} nodes"
    print(f"written to {out} (content sha256 {config[CONTENT_DIGEST]}{shared}); took {wall:.0f} s")
    return 0


EPILOG = ("Exit status: 0 when the tuned file was written (or, with --dry-run, the preview printed); 1 when it "
          "was not: no torch, NCCL's defaults could not be measured, the nodes did not meet, or the file could not be "
          "written; 2 for bad usage.")

COMMAND = Command("tune-nccl", "measure NCCL profiles on the local GPUs and keep the best", add_arguments, run,
                  description=DESCRIPTION, epilog=EPILOG)
