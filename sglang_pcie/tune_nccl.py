"""``sglang-pcie tune-nccl``: measure candidate NCCL profiles on the local GPUs and keep the best one.

Each candidate runs in fresh processes (NCCL reads its variables once per process), one per rank. Every rank
all-reduces tokens x hidden tensors captured in a CUDA graph, as SGLang's decode / verify graphs do
(2 x layers all-reduces per graph, one verify pass), checks the sums exactly, and reports microseconds per
all-reduce (median of the timed replays). A profile whose capture, sums or processes fail, or that runs past
its time bound (its process groups are killed), is dropped from the table with the reason.

The parent imports neither torch nor CUDA: it only probes the GPUs through NVML and starts workers, so the
sweep can always kill them and go on. ``--backend gloo`` runs the same workers on CPU tensors (no graphs);
it checks the machinery, not NCCL.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pcie import nccl, tuning

# The candidates, kept to what fits the time goal (the whole sweep under 3 minutes on 2 GPUs: about 8 s per
# profile, mostly process start, torch import and NCCL init). NCCL_NVLS_ENABLE is never among them.
CANDIDATES = {
    "default": {},
    "pcie": dict(nccl.PCIE_PROFILE),
    "proto-LL": {"NCCL_PROTO": "LL"},
    "proto-LL128": {"NCCL_PROTO": "LL128"},
    "proto-Simple": {"NCCL_PROTO": "Simple"},
    "algo-Ring": {"NCCL_ALGO": "Ring"},
    # Crashed CUDA-graph capture at server start on one machine: a failure here just drops it.
    "algo-Tree": {"NCCL_ALGO": "Tree"},
    "ring-LL": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"},
    "channels-2": {"NCCL_MIN_NCHANNELS": "2", "NCCL_MAX_NCHANNELS": "2"},
    "channels-4": {"NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "4"},
    "LL-channels-2": {"NCCL_PROTO": "LL", "NCCL_MIN_NCHANNELS": "2", "NCCL_MAX_NCHANNELS": "2"},
    "buffsize-128k": {"NCCL_BUFFSIZE": "131072"},
    "p2p-level-sys": {"NCCL_P2P_LEVEL": "SYS"},
}
# Removed from the workers' environment so that "default" means NCCL's defaults and each candidate gets
# exactly its own values.
TUNABLE_VARS = sorted({name for values in CANDIDATES.values() for name in values})
DTYPES = ("bf16", "fp16", "fp32")
TIMED_REPLAYS = 20
WARMUP_REPLAYS = 3
MAX_CONFIRMATIONS = 2
# After the first run (which pays for a cold start) a profile may take this many times the defaults' run
# time, at least LATER_TIMEOUT_FLOOR seconds: a hanging profile then costs seconds, not the whole --timeout.
LATER_TIMEOUT_FACTOR = 4
LATER_TIMEOUT_FLOOR = 30.0


def progress(message: str) -> None:
    print(f"tune-nccl: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Worker: one rank of one profile. Runs in a fresh process with the profile's variables in its environment.


def _pattern(torch, rank: int, index: int, numel: int, device):
    # Small integers: every partial sum stays exactly representable (bf16 holds integers up to 256, and the
    # largest sum is 7 x world size), so the check can demand equality. Varying with the element, the buffer
    # and the rank catches misplaced chunks, not just wrong totals.
    return (torch.arange(numel, device=device, dtype=torch.int64) + index + rank) % 7 + 1


def _measure(torch, dist, spec: dict, rank: int, world: int, device) -> dict:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec["dtype"]]
    count = spec["allreduces"]
    use_graph = spec["backend"] == "nccl"
    results = {}
    for tokens in spec["tokens"]:
        numel = tokens * spec["hidden"]
        pristine = [_pattern(torch, rank, i, numel, device).to(dtype) for i in range(count)]
        expected = [sum(_pattern(torch, r, i, numel, device) for r in range(world)).to(dtype) for i in range(count)]
        buffers = [p.clone() for p in pristine]

        def reset():
            for buffer, source in zip(buffers, pristine):
                buffer.copy_(source)

        def check(stage):
            if use_graph:
                torch.cuda.synchronize()
            wrong = sum(not torch.equal(b, e) for b, e in zip(buffers, expected))
            if wrong:
                raise RuntimeError(f"wrong sums after {stage} at {tokens} tokens ({wrong} of {count} buffers)")

        def all_reduce_all():
            for buffer in buffers:
                dist.all_reduce(buffer)

        if use_graph:
            # Eager warm-up on a side stream, as CUDA graph capture of NCCL calls requires.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                all_reduce_all()
            torch.cuda.current_stream().wait_stream(side)
            check("eager all-reduce")
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    all_reduce_all()
            except Exception as exc:
                raise RuntimeError(f"CUDA graph capture failed at {tokens} tokens: {type(exc).__name__}: {exc}")
            reset()
            graph.replay()
            check("graph replay")
            for _ in range(WARMUP_REPLAYS):
                graph.replay()
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(TIMED_REPLAYS)]
            for start, end in events:  # back to back, as a server replays; the all-reduces keep ranks in step
                start.record()
                graph.replay()
                end.record()
            torch.cuda.synchronize()
            milliseconds = [start.elapsed_time(end) for start, end in events]
            reset()
            graph.replay()
            check("timed replays")  # the graph still sums right after being replayed many times
        else:
            all_reduce_all()
            check("all-reduce")
            milliseconds = []
            for _ in range(WARMUP_REPLAYS + TIMED_REPLAYS):
                began = time.perf_counter()
                all_reduce_all()
                milliseconds.append((time.perf_counter() - began) * 1e3)
            milliseconds = milliseconds[WARMUP_REPLAYS:]
        results[str(tokens)] = statistics.median(milliseconds) * 1e3 / count
    return results


def _torch_nccl_version(torch) -> str | None:
    """The NCCL torch links (asks the library, does not initialise CUDA); None for a build without NCCL."""
    try:
        version = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def run_worker(spec: dict) -> int:
    """One rank; prints one JSON line: {"ok": true, "us": {tokens: microseconds}, ...} or {"ok": false, "error"}."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    report = {"rank": rank, "ok": False}
    try:
        import torch
        import torch.distributed as dist

        report["nccl"] = _torch_nccl_version(torch)
        if spec["backend"] == "nccl":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
            report["device"] = torch.cuda.get_device_name(device)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo", rank=rank, world_size=world)
        report["us"] = _measure(torch, dist, spec, rank, world, device)
        report["ok"] = True
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"[:400]
    print(json.dumps(report), flush=True)
    sys.stderr.flush()
    # Skip interpreter teardown: destroying a communicator whose peer has died can block.
    os._exit(0 if report["ok"] else 1)


# ---------------------------------------------------------------------------------------------------------------
# Orchestration: start the ranks of one profile, bound them in time, collect the result.


@dataclass
class Outcome:
    us: dict | None  # tokens (int) -> microseconds, worst rank; None when the profile failed
    error: str | None
    wall_s: float
    info: dict = field(default_factory=dict)  # nccl version and device name reported by rank 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def worker_environment(values: dict) -> dict:
    """The parent's environment without any tunable NCCL variable, plus ``values``. NCCL_NVLS_ENABLE and the
    other transport switches stay as they are."""
    env = {k: v for k, v in os.environ.items() if k not in TUNABLE_VARS}
    env.update(values)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")]))
    return env


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"died of {signal.Signals(-code).name}"
        except ValueError:
            return f"died of signal {-code}"
    return f"exited with {code}"


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _kill(processes) -> None:
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # its own session: takes any children with it
            except ProcessLookupError:
                pass
    for process in processes:
        process.wait()


def run_profile(values: dict, spec: dict, world: int, timeout: float, worker_command: list[str]) -> Outcome:
    env = worker_environment(values)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world))
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sglang-pcie-tune-") as tmp:
        # Files, not pipes: a chatty NCCL_DEBUG must never block a worker on a full pipe.
        outputs = [(Path(tmp) / f"rank{r}.out", Path(tmp) / f"rank{r}.err") for r in range(world)]
        processes = []
        try:
            for rank, (out, err) in enumerate(outputs):
                with open(out, "w") as stdout, open(err, "w") as stderr:
                    processes.append(subprocess.Popen(
                        [*worker_command, "--worker", json.dumps(spec)],
                        env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                        stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True))
            error, failed_rank = None, None
            while True:
                codes = [p.poll() for p in processes]
                failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
                if failed:  # the other ranks would wait for it in NCCL forever
                    failed_rank = failed[0]
                    error = f"rank {failed_rank} {_describe_exit(codes[failed_rank])}"
                    break
                if all(code == 0 for code in codes):
                    break
                if time.monotonic() - began > timeout:
                    error = f"timed out after {timeout:.0f} s (killed)"
                    break
                time.sleep(0.05)
        finally:
            _kill(processes)
        wall = time.monotonic() - began
        reports = []
        for out, _ in outputs:
            try:
                reports.append(json.loads(_last_line(out)))
            except ValueError:
                reports.append(None)
        failed_stderr = _last_line(outputs[failed_rank][1]) if failed_rank is not None else ""
    # A worker's own message (capture failed, wrong sums) says more than its exit code.
    own = next((f"rank {r['rank']}: {r.get('error')}" for r in reports if r and not r.get("ok")), None)
    if own or error:
        return Outcome(None, own or error + (f": {failed_stderr}" if failed_stderr else ""), wall)
    if None in reports:
        return Outcome(None, f"rank {reports.index(None)} exited without a report", wall)
    us = {int(tokens): max(r["us"][tokens] for r in reports) for tokens in reports[0]["us"]}
    info = {k: reports[0][k] for k in ("nccl", "device") if k in reports[0]}
    return Outcome(us, None, wall, info)


# ---------------------------------------------------------------------------------------------------------------
# The sweep


@dataclass
class Sweep:
    measured: dict = field(default_factory=dict)  # name -> list of runs ({tokens: us} or None)
    errors: dict = field(default_factory=dict)  # name -> first failure
    info: dict = field(default_factory=dict)
    verdict: tuning.Verdict | None = None
    wall_s: float = 0.0


def _format_run(outcome: Outcome) -> str:
    if outcome.us is None:
        return f"{outcome.wall_s:5.1f} s  dropped: {outcome.error}"
    return f"{outcome.wall_s:5.1f} s  " + "  ".join(f"{t}:{v:.1f}" for t, v in outcome.us.items()) + " us"


def run_sweep(profiles: dict, spec: dict, world: int, timeout: float, worker_command: list[str]) -> Sweep:
    """Defaults first and last (their spread is the noise margin), every candidate once, then repeat runs of the
    best qualifier until one is confirmed (tuning.choose)."""
    sweep = Sweep()
    began = time.monotonic()
    later_timeout = timeout
    plan = ["default", *[n for n in profiles if n != "default"], "default"]
    total = len(plan)
    step = 0

    def run(name):
        nonlocal step
        step += 1
        progress(f"[{step}/{total}] {name:<14} {' '.join(f'{k}={v}' for k, v in profiles[name].items()) or '(none)'}")
        outcome = run_profile(profiles[name], spec, world, timeout if step == 1 else later_timeout, worker_command)
        progress(f"[{step}/{total}] {name:<14} {_format_run(outcome)}")
        sweep.measured.setdefault(name, []).append(outcome.us)
        if outcome.error:
            sweep.errors.setdefault(name, outcome.error)
        sweep.info.update(outcome.info)
        return outcome

    first = run(plan[0])
    if first.us is None:  # nothing to compare against; the candidates would only burn time
        sweep.wall_s = time.monotonic() - began
        return sweep
    later_timeout = min(timeout, max(LATER_TIMEOUT_FLOOR, LATER_TIMEOUT_FACTOR * first.wall_s))
    for name in plan[1:]:
        run(name)
    for confirmations in range(MAX_CONFIRMATIONS + 1):
        sweep.verdict = tuning.choose(sweep.measured, profiles)
        if sweep.verdict.pending is None or confirmations == MAX_CONFIRMATIONS:
            break
        total += 1
        progress(f"confirming {sweep.verdict.pending} with a repeat run")
        run(sweep.verdict.pending)
    sweep.wall_s = time.monotonic() - began
    return sweep


# ---------------------------------------------------------------------------------------------------------------
# Output


def _markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def verdict_note(sweep: Sweep, name: str) -> str:
    verdict = sweep.verdict
    if name == verdict.winner:
        return "winner" + (" (NCCL defaults: nothing set)" if name == "default" else "")
    if name == "default":
        return "baseline"
    if name in sweep.errors:  # a failure in any run drops the profile; its first error says why
        return f"dropped: {sweep.errors[name]}"
    return verdict.rejected.get(name) or "qualified"


def render_table(sweep: Sweep, profiles: dict, tokens: list[int], layers: int) -> str:
    verdict = sweep.verdict
    header = ["profile", "variables", *[f"{t} tok" for t in tokens], "verdict"]
    latency, per_pass = [header], [["profile", *[f"{t} tok" for t in tokens]]]
    for name in profiles:
        runs = sweep.measured.get(name, [])
        if not runs:
            continue
        variables = " ".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in profiles[name].items()) or "(none)"
        values = verdict.worst.get(name)
        note = verdict_note(sweep, name) + (f" ({len(runs)} runs)" if len(runs) > 1 else "")
        cells = [f"{values[t]:.1f}" if values else "-" for t in tokens]
        latency.append([name, variables, *cells, note])
        if values:
            per_pass.append([name, *[f"{2 * layers * values[t] / 1e3:.2f}" for t in tokens]])
    return (f"All-reduce latency, microseconds (defaults: best run; others: worst run)\n\n{_markdown(latency)}\n\n"
            f"Predicted communication per verify pass (2 x {layers} layers x latency), milliseconds\n\n"
            f"{_markdown(per_pass)}\n")


# ---------------------------------------------------------------------------------------------------------------
# Command line


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers")
    return sorted(set(values))


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang-pcie tune-nccl", description=(
        "Measure NCCL profiles for verify-size all-reduces on the local GPUs and write the fastest one (never "
        "slower than NCCL's defaults at any size) to the tuned file that SGLANG_PCIE_NCCL_PROFILE=auto|tuned uses."))
    p.add_argument("--tp", type=_positive_int, help="ranks (GPUs) to all-reduce over (default: every visible GPU)")
    p.add_argument("--hidden", type=_positive_int, default=7168, help="hidden size (default 7168)")
    p.add_argument("--tokens", type=_positive_ints, default=[1, 2, 3, 4, 8],
                   help="tokens per all-reduce, comma-separated (default 1,2,3,4,8)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--layers", type=_positive_int, default=61,
                   help="model layers; each graph holds 2 x layers all-reduces, one verify pass (default 61)")
    p.add_argument("--timeout", type=_positive_float, default=120.0,
                   help=f"seconds one profile may take (default 120; after the first profile: at most "
                        f"{LATER_TIMEOUT_FACTOR}x the defaults' run time, at least {LATER_TIMEOUT_FLOOR:.0f} s)")
    p.add_argument("--profiles",
                   help=f"comma-separated subset of: {', '.join(CANDIDATES)} (default always runs)")
    p.add_argument("--out", type=Path, help=f"tuned file to write (default: ${tuning.TUNED_FILE_VAR} or "
                                            "${XDG_CONFIG_HOME:-~/.config}/sglang-pcie/nccl-tuned.json)")
    p.add_argument("--dry-run", action="store_true", help="show what would run and where it would be written")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                   help="gloo: CPU tensors, no CUDA graphs - checks the sweep itself, measures nothing NCCL uses")
    return p


def _visible_gpu_count(topology) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    return topology.gpu_count


def _stop(signum, frame):
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None, worker_command: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:
        return run_worker(json.loads(argv[1]))
    args = build_parser().parse_args(argv)

    def fail(message):
        print(f"sglang-pcie tune-nccl: error: {message}", file=sys.stderr)
        return 2

    profiles = dict(CANDIDATES)
    if args.profiles:
        wanted = [n.strip() for n in args.profiles.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in CANDIDATES]
        if unknown:
            return fail(f"--profiles: unknown profile {unknown[0]!r} (known: {', '.join(CANDIDATES)})")
        profiles = {n: CANDIDATES[n] for n in CANDIDATES if n == "default" or n in wanted}
    gloo = args.backend == "gloo"
    if gloo and not args.out and not args.dry_run:
        return fail("--backend gloo measures nothing NCCL would use: give --out, so the real tuned file is kept")
    topology = nccl.probe_topology()
    available = _visible_gpu_count(topology)
    world = args.tp or (2 if gloo else available)
    if world < 2:
        given = f"--tp {world}" if args.tp else f"{available} GPU(s) visible ({topology.detail or topology.source})"
        return fail(f"{given}: an all-reduce needs at least 2 ranks")
    if not gloo and world > available:
        return fail(f"--tp {world}: only {available} GPU(s) visible ({topology.detail or topology.source})")

    out = args.out or tuning.config_path()
    fingerprint = tuning.fingerprint(topology)
    spec = {"backend": args.backend, "tokens": args.tokens, "hidden": args.hidden, "dtype": args.dtype,
            "allreduces": 2 * args.layers}
    stripped = sorted(name for name in TUNABLE_VARS if name in os.environ)
    progress(f"{world} ranks on {tuning.describe_machine(fingerprint)}; {len(profiles)} profiles; "
             f"{args.dtype} {'/'.join(map(str, args.tokens))} x {args.hidden}, {2 * args.layers} all-reduces "
             f"per {'CUDA graph' if not gloo else 'timed loop'}; writing {out}")
    if stripped:
        progress(f"measuring without your {', '.join(stripped)} (each profile sets its own); at server start "
                 "your values still win over the tuned ones")
    if args.dry_run:
        for name, values in profiles.items():
            print(f"{name:<14} {' '.join(f'{k}={v}' for k, v in values.items()) or '(NCCL defaults)'}")
        return 0

    command = worker_command or [sys.executable, "-m", "sglang_pcie.tune_nccl"]
    # Stopped by `timeout`, a scheduler or kill: unwind, so that run_profile kills the workers (they run in
    # their own sessions and would otherwise hold the GPUs after we are gone). Ctrl-C unwinds the same way.
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        sweep = run_sweep(profiles, spec, world, args.timeout, command)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if sweep.verdict is None:
        progress(f"NCCL defaults could not be measured ({sweep.errors.get('default')}); nothing written")
        return 1
    print(render_table(sweep, profiles, args.tokens, args.layers))
    verdict = sweep.verdict
    values = profiles[verdict.winner]
    measured_nccl = sweep.info.get("nccl")
    installed = (fingerprint["nccl"] or "").split(",")
    if measured_nccl and not any(d.endswith(f"=={measured_nccl}") for d in installed):
        # The fingerprint still uses the distribution: it is what the launcher can read without loading NCCL.
        progress(f"note: torch runs NCCL {measured_nccl}; installed NCCL distribution: {fingerprint['nccl']}")
    config = {
        "format": tuning.FORMAT,
        "fingerprint": fingerprint,
        "winner": verdict.winner,
        "values": values,
        "rule": (f"never slower than NCCL's defaults (best of their runs) at any size, on the candidate's worst "
                 f"run, and at least {verdict.margin:.1%} faster in total; confirmed by "
                 f"{tuning.CONFIRM_RUNS} runs"),
        "measured": {"backend": args.backend, "tp": world, "hidden": args.hidden, "dtype": args.dtype,
                     "layers": args.layers, "tokens": args.tokens, "torch_nccl": measured_nccl,
                     "device": sweep.info.get("device"), "wall_s": round(sweep.wall_s, 1),
                     "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "table": {name: {"values": profiles[name],
                         "runs": [{str(t): round(us, 2) for t, us in run.items()} if run else None
                                  for run in sweep.measured[name]],
                         "verdict": verdict_note(sweep, name)}
                  for name in sweep.measured},
    }
    tuning.write_config(out, config)
    chosen = " ".join(f"{k}={v}" for k, v in values.items()) or "nothing (NCCL defaults are fastest here)"
    print(f"winner: {verdict.winner}: {chosen}\nwritten to {out}; sweep took {sweep.wall_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
