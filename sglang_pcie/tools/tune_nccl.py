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
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pcie.runtime import allreduce, gpus, tuned_file
from sglang_pcie.tools import nccl_verdict
from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.common import tail_lines
from sglang_pcie.tools.processes import free_port, kill_groups

CANDIDATES = tuned_file.CANDIDATES
# Removed from the workers' environment so that "default" means NCCL's defaults and each candidate gets
# exactly its own values.
TUNABLE_VARS = sorted({name for values in CANDIDATES.values() for name in values})
DTYPES = ("bf16", "fp16", "fp32")
DECODE_TOKENS = [1, 2, 4, 8]
PREFILL_TOKENS = [512, 2048, 8192]
# A graph holds 2 x layers all-reduces while their buffers fit in this many bytes per rank, else fewer (at least
# MIN_ALLREDUCES): a prefill-sized graph of 122 buffers would need tens of GB for nothing the timing needs.
GRAPH_BUFFER_BYTES = 256 << 20
MIN_ALLREDUCES = 4
IPC_NAME = "pcie-ipc"
TIMED_REPLAYS = 20
WARMUP_REPLAYS = 3
MAX_CONFIRMATIONS = 2
# After the first run (which pays for a cold start) a profile may take this many times the defaults' run
# time, at least LATER_TIMEOUT_FLOOR seconds: a hanging profile then costs seconds, not the whole --timeout.
LATER_TIMEOUT_FACTOR = 4
LATER_TIMEOUT_FLOOR = 30.0
# What a failed or hung run brings back from each rank's stderr: enough for a traceback, or for the phase lines and
# the Python stacks a hung worker dumps when the parent gives up on it (SIGUSR1, faulthandler).
STDERR_TAIL_LINES = 40
PHASE_MARK = "phase:"


def progress(message: str) -> None:
    print(f"tune-nccl: {message}", file=sys.stderr, flush=True)


_WORKER_STARTED = time.monotonic()


def phase(message: str) -> None:
    """A worker's progress line on its stderr (a file the parent reads when a run fails or hangs): the last one
    says where a hung rank stopped."""
    print(f"tune-nccl worker rank {os.environ.get('RANK', '?')} +{time.monotonic() - _WORKER_STARTED:.1f}s "
          f"{PHASE_MARK} {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Worker: one rank of one profile. Runs in a fresh process with the profile's variables in its environment.


def _pattern(torch, rank: int, index: int, numel: int, device):
    # Small integers: every partial sum stays exactly representable (bf16 holds integers up to 256, and the
    # largest sum is 7 x world size), so the check can demand equality. Varying with the element, the buffer
    # and the rank catches misplaced chunks, not just wrong totals.
    return (torch.arange(numel, device=device, dtype=torch.int64) + index + rank) % 7 + 1


def element_size(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def allreduces_per_graph(spec: dict, tokens: int) -> int:
    """2 x layers (one forward pass) while the buffers fit GRAPH_BUFFER_BYTES, else fewer, at least MIN_ALLREDUCES."""
    size = tokens * spec["hidden"] * element_size(spec["dtype"])
    return min(spec["allreduces"], max(MIN_ALLREDUCES, GRAPH_BUFFER_BYTES // size))


def _measure(torch, dist, spec: dict, rank: int, world: int, device) -> dict:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec["dtype"]]
    use_graph = spec["backend"] == "nccl"
    results = {}
    for tokens in spec["tokens"]:
        numel = tokens * spec["hidden"]
        count = allreduces_per_graph(spec, tokens)
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


def sglang_tune_ladder(max_rows: int) -> list[int]:
    """The row counts SGLang's adapter (0.5.21-0.5.23) asks FlashInfer to tune for a workspace of ``max_rows``:
    powers of two up to 512 that fit, plus ``max_rows`` itself. The tuner uses the same ladder and workspace size
    so that the cache entries it writes are the ones the server looks up (FlashInfer keys them by max_numel)."""
    rows = [r for r in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if r <= max_rows]
    return rows + ([max_rows] if max_rows not in rows else [])


def _jit_failure(exc: Exception) -> str:
    """The telling line of a FlashInfer JIT failure (ninja's "missing and no known rule", nvcc's first error), not
    the whole ninja transcript."""
    text = f"{type(exc).__name__}: {exc}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if "error" in line.lower() and line != lines[0]]
    return (telling[0] if telling else lines[0] if lines else type(exc).__name__)[:300]


def _ipc_jit_modules(tune: bool) -> list:
    """(name, loader) of each FlashInfer JIT module the IPC worker needs: the PCIe-IPC kernels, and for tune() the
    autotuner's delay kernel (module trtllm_utils: FlashInfer 0.7.2's autotuner launches it before timing every
    candidate; a failed load there counts each candidate as failed, so tune() saves nothing)."""
    from flashinfer.comm.pcie_ipc_ar import get_pcie_ipc_comm_module

    modules = [("pcie_ipc_comm", get_pcie_ipc_comm_module)]
    if tune:
        try:
            from flashinfer.tllm_utils import get_trtllm_utils_module
        except ImportError:  # a FlashInfer whose autotuner does not use it
            pass
        else:
            modules.append(("trtllm_utils", get_trtllm_utils_module))
    return modules


def _load_jit_modules_in_turn(dist, modules: list, rank: int, world: int) -> None:
    """Build/load the JIT modules one rank at a time (rank 0 first, a barrier after each turn), before any FlashInfer
    collective. FlashInfer's build_and_load takes a file lock per module and runs ninja in every fresh process (only
    AOT artifacts skip it); done here, no rank waits on that lock inside a collective its peers already entered,
    and only rank 0 ever compiles. A rank that fails raises after its turn; the parent then stops its peers."""
    for turn in range(world):
        if turn == rank:
            for name, load in modules:
                phase(f"JIT module {name}: build/load (rank {rank} of {world}, one rank at a time)")
                began = time.monotonic()
                try:
                    load()
                except Exception as exc:
                    why = _jit_failure(exc)
                    if name == "trtllm_utils":
                        raise RuntimeError(
                            f"FlashInfer's autotuner cannot load its JIT module trtllm_utils (the delay kernel it "
                            f"launches before timing each candidate), so tune() would count every candidate as "
                            f"failed and save nothing: {why}") from exc
                    raise RuntimeError(f"FlashInfer's JIT module {name} failed to build/load: {why}") from exc
                phase(f"JIT module {name}: ready in {time.monotonic() - began:.1f} s")
        dist.barrier()


def _saved_configs(cache: str) -> int | None:
    """How many tuned configurations FlashInfer's cache file holds (its keys other than _metadata, _generation,
    _records); None when it cannot be read."""
    try:
        data = json.loads(Path(cache).read_text())
    except (OSError, ValueError):
        return None
    return sum(not key.startswith("_") for key in data) if isinstance(data, dict) else None


def _measure_ipc(torch, dist, spec: dict, rank: int, world: int, device, report: dict) -> dict:
    """FlashInfer's PCIe-IPC all-reduce at each size, in CUDA graphs, sums checked; None for a size it refuses.

    The collective contract (PcieIpcAllReduceWorkspace's docstring): every rank makes the same calls in the same
    order; one workspace serves one stream (rebind_stream() only after the previous stream's work is done);
    launch configurations are resolved (prepare) before any capture."""
    phase("importing flashinfer")
    import flashinfer
    from flashinfer.comm import PcieIpcAllReduceWorkspace
    from flashinfer.comm.pcie_ipc_tuning import default_cache_path

    hidden, count = spec["hidden"], spec["allreduces"]
    cache = str(default_cache_path(world))
    report.update(flashinfer=getattr(flashinfer, "__version__", None), tune_cache=cache)
    phase(f"flashinfer {report['flashinfer']} imported")
    _load_jit_modules_in_turn(dist, _ipc_jit_modules(bool(spec.get("tune"))), rank, world)
    phase(f"building the workspace (collective: max_numel "
          f"{spec['max_numel']}, tune_batches {spec['tune_batches']}, cache {cache})")
    workspace = PcieIpcAllReduceWorkspace(group=dist.group.WORLD, max_numel=spec["max_numel"],
                                          dtype=torch.bfloat16, tune_batches=spec["tune_batches"],
                                          tune_cache=cache)
    report["fabric"] = f"{workspace.profile} ({workspace.profile_reason})"[:200]
    phase(f"workspace built: {report['fabric']}")
    if spec.get("tune"):
        phase(f"tune() for hidden {hidden} (collective; FlashInfer builds its gloo group, rank 0 writes the cache)")
        began = time.monotonic()
        tuned = workspace.tune([hidden], dtype=torch.bfloat16)  # collective; rank 0 writes the cache file
        report["tuned_shapes"] = len(tuned)  # the shapes it measured, whether or not any candidate ran
        report["tune_s"] = round(time.monotonic() - began, 1)
        # tune() ends with a barrier after rank 0 wrote the file. It stores a winner per shape whenever one
        # candidate ran (a seed-equal winner too); none means every candidate failed, and the "tuned" figures below
        # would be the seed's.
        report["tune_saved"] = _saved_configs(cache)
        phase(f"tune() done: {len(tuned)} shapes in {report['tune_s']} s; the cache holds "
              f"{'?' if report['tune_saved'] is None else report['tune_saved']} configurations")
        if report["tune_saved"] == 0:
            raise RuntimeError(f"tune() saved no configuration to {cache}: every candidate failed at every shape "
                               f"(FlashInfer logs 'Skipped N unsupported tactic(s)'; its debug log says why)")
    sizes = [t for t in spec["tokens"] if t * hidden <= spec["max_numel"]]
    phase(f"prepare() for {sizes} x {hidden} (collective)")
    workspace.prepare([(t, hidden) for t in sizes], dtype=torch.bfloat16)
    phase("prepared")
    stream = torch.cuda.Stream()
    results = {}
    for tokens in spec["tokens"]:
        numel = tokens * hidden
        probe = torch.empty((tokens, hidden), dtype=torch.bfloat16, device=device)
        if tokens not in sizes or not workspace.supports(probe):
            results[str(tokens)] = None
            continue
        inputs = [_pattern(torch, rank, i, numel, device).to(torch.bfloat16).view(tokens, hidden)
                  for i in range(count)]
        expected = [sum(_pattern(torch, r, i, numel, device) for r in range(world)).to(torch.bfloat16)
                    .view(tokens, hidden) for i in range(count)]
        outputs = [torch.empty_like(x) for x in inputs]

        def check(stage):
            torch.cuda.synchronize()
            wrong = sum(not torch.equal(o, e) for o, e in zip(outputs, expected))
            if wrong:
                raise RuntimeError(f"wrong sums after {stage} at {tokens} tokens ({wrong} of {count} buffers)")

        def all_reduce_all():
            for x, out in zip(inputs, outputs):
                workspace.all_reduce(x, out=out)

        torch.cuda.synchronize()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            workspace.rebind_stream()  # earlier work is synchronised: moving the binding is safe
            all_reduce_all()
        check("eager all-reduce")
        phase(f"{tokens} tok: {count} eager all-reduces summed right; capturing them in a CUDA graph")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            all_reduce_all()
        phase(f"{tokens} tok: captured; first replay")
        for out in outputs:
            out.zero_()
        graph.replay()
        check("graph replay")
        phase(f"{tokens} tok: replay summed right; {WARMUP_REPLAYS} warm-up + {TIMED_REPLAYS} timed replays")
        for _ in range(WARMUP_REPLAYS):
            graph.replay()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(TIMED_REPLAYS)]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        milliseconds = [start.elapsed_time(end) for start, end in events]
        for _ in range(spec.get("soak", 0)):  # a long run of replays: no hang, and the sums still right after it
            graph.replay()
        for out in outputs:
            out.zero_()
        graph.replay()
        check("timed replays" + (f" and {spec['soak']} more" if spec.get("soak") else ""))
        results[str(tokens)] = statistics.median(milliseconds) * 1e3 / count
        phase(f"{tokens} tok: {results[str(tokens)]:.1f} us per all-reduce, sums right after the timed replays")
        del graph
    # destroy() is collective (barriers): reached only on success, by every rank in the same order. A rank that
    # fails raises before it, exits, and the parent kills the group rather than leave a peer in a barrier.
    torch.cuda.synchronize()
    phase("destroy() (collective)")
    workspace.destroy()
    phase("done")
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
    # A rank the parent gives up on gets SIGUSR1 first: every thread's Python stack goes to stderr, which the
    # parent then reports (where in FlashInfer or NCCL it hung), before it kills the process group.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        phase("importing torch")
        import torch
        import torch.distributed as dist

        report["nccl"] = _torch_nccl_version(torch)
        phase(f"torch {torch.__version__} imported; initialising the {spec['backend']} process group")
        if spec["backend"] == "nccl":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
            report["device"] = torch.cuda.get_device_name(device)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo", rank=rank, world_size=world)
        phase("process group up")
        if spec.get("path") == IPC_NAME:
            if spec["backend"] != "nccl":
                raise RuntimeError("the PCIe-IPC all-reduce needs CUDA (--backend nccl)")
            report["us"] = _measure_ipc(torch, dist, spec, rank, world, device, report)
        else:
            report["us"] = _measure(torch, dist, spec, rank, world, device)
        report["ok"] = True
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"[:400]
        traceback.print_exc()  # the whole story goes to stderr, whose tail the parent reports
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
    # rank -> the last STDERR_TAIL_LINES lines of its stderr, for a run that failed, hung or left no report
    stderr_tails: dict = field(default_factory=dict)


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


def _read_report(path: Path) -> dict | None:
    """A worker's report: the last line holding a JSON object that starts with "rank", read whole (it can be long)
    and from where it starts (a library may have written to stdout without a newline before it)."""
    for line in reversed(path.read_text(errors="replace").splitlines()):
        start = line.find('{"rank"')
        if start >= 0:
            try:
                report = json.loads(line[start:])
            except ValueError:
                continue
            if isinstance(report, dict):
                return report
    return None


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> list[str]:
    return [line.rstrip() for line in tail_lines(path) if line.strip()][-lines:]


def _last_phase(tail: list[str]) -> str:
    """The last progress line a worker wrote (where a hung rank stopped), without its prefix."""
    for line in reversed(tail):
        if PHASE_MARK in line:
            return line.split(PHASE_MARK, 1)[1].strip()
    return ""


def format_tails(tails: dict, indent: str = "  ") -> str:
    """The ranks' stderr tails, one line per stderr line, prefixed by the rank."""
    return "\n".join(f"{indent}rank {rank} | {line}" for rank, lines in sorted(tails.items()) for line in lines)


def _dump_stacks(processes) -> None:
    """Ask live workers for their Python stacks (SIGUSR1: faulthandler in run_worker) before they are killed."""
    asked = False
    for process in processes:
        if process.poll() is None:
            try:
                os.kill(process.pid, signal.SIGUSR1)
                asked = True
            except ProcessLookupError:
                pass
    if asked:
        time.sleep(1.0)  # faulthandler writes from its signal handler, GIL or not


def run_profile(values: dict, spec: dict, world: int, timeout: float, worker_command: list[str],
                keep_stderr: bool = False) -> Outcome:
    """Run one profile's ranks, bounded by ``timeout``. The ranks' stderr tails come back with a failure, or always
    with ``keep_stderr``."""
    env = worker_environment(values)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
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
                    _dump_stacks(processes)
                    break
                time.sleep(0.05)
        finally:
            kill_groups(processes)
        wall = time.monotonic() - began
        reports = [_read_report(out) for out, _ in outputs]
        own = next((f"rank {r['rank']}: {r.get('error')}" for r in reports if r and not r.get("ok")), None)
        tails = {}
        if own or error or None in reports or keep_stderr:
            tails = {rank: _tail(err) for rank, (_, err) in enumerate(outputs)}
    if own or error or None in reports:
        if own:  # a worker's own message (capture failed, wrong sums) says more than its exit code
            message = own
        elif error and failed_rank is not None:
            last = tails[failed_rank][-1].strip()[:300] if tails[failed_rank] else ""
            message = error + (f": {last}" if last else "")
        elif error:  # timed out: where each rank stopped, if they said
            phases = {rank: _last_phase(tail) for rank, tail in sorted(tails.items())}
            message = error + ("; last phase: " + ", ".join(f"rank {rank}: {text or '(none written)'}"
                                                             for rank, text in phases.items())
                               if any(phases.values()) else "")
        else:
            missing = reports.index(None)
            last = tails[missing][-1].strip()[:300] if tails[missing] else ""
            message = f"rank {missing} exited without a report" + (f"; its stderr ends: {last}" if last else
                                                                    "; its stderr is empty")
        return Outcome(None, message, wall, stderr_tails=tails)
    us = {}
    for tokens in reports[0]["us"]:
        values = [r["us"].get(tokens) for r in reports]
        us[int(tokens)] = None if None in values else max(values)  # None: a size the path refuses
    info = {k: v for k, v in reports[0].items() if k not in ("rank", "ok", "us", "error")}
    return Outcome(us, None, wall, info, stderr_tails=tails)


# ---------------------------------------------------------------------------------------------------------------
# The sweep


@dataclass
class Sweep:
    measured: dict = field(default_factory=dict)  # name -> list of runs ({tokens: us} or None)
    errors: dict = field(default_factory=dict)  # name -> first failure
    info: dict = field(default_factory=dict)
    verdict: nccl_verdict.Verdict | None = None
    wall_s: float = 0.0


def _format_us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _format_run(outcome: Outcome) -> str:
    if outcome.us is None:
        return f"{outcome.wall_s:5.1f} s  dropped: {outcome.error}"
    return f"{outcome.wall_s:5.1f} s  " + "  ".join(f"{t}:{_format_us(v)}" for t, v in outcome.us.items()) + " us"


def run_sweep(profiles: dict, spec: dict, world: int, timeout: float, worker_command: list[str]) -> Sweep:
    """Defaults first and last (their spread bounds the noise), every candidate once, then repeat runs of the
    best qualifier until one is confirmed (nccl_verdict.choose)."""
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
        sweep.info.update({k: v for k, v in outcome.info.items() if k in ("nccl", "device")})
        return outcome

    first = run(plan[0])
    if first.us is None:  # nothing to compare against; the candidates would only burn time
        sweep.wall_s = time.monotonic() - began
        return sweep
    later_timeout = min(timeout, max(LATER_TIMEOUT_FLOOR, LATER_TIMEOUT_FACTOR * first.wall_s))
    for name in plan[1:]:
        run(name)
    for confirmations in range(MAX_CONFIRMATIONS + 1):
        sweep.verdict = nccl_verdict.choose(sweep.measured, profiles)
        if sweep.verdict.pending is None or confirmations == MAX_CONFIRMATIONS:
            break
        total += 1
        progress(f"confirming {sweep.verdict.pending} with a repeat run")
        run(sweep.verdict.pending)
    sweep.wall_s = time.monotonic() - began
    return sweep


# ---------------------------------------------------------------------------------------------------------------
# The PCIe-IPC all-reduce (FlashInfer), measured against the NCCL the server would run


def ipc_unavailable(world: int, args, install=None) -> str | None:
    """Why the IPC path is not measured here; None when it is."""
    if args.ipc == "off":
        return "--ipc off"
    if args.dtype != "bf16":
        return f"SGLang's adapter serves bf16 only (--dtype {args.dtype})"
    if world not in allreduce.IPC_WORLD_SIZES:
        return f"its kernels support {allreduce.IPC_WORLD_SIZES} ranks, not {world}"
    if args.backend != "nccl" and args.ipc != "on":
        return "--backend gloo has no CUDA"
    install = install or allreduce.flashinfer_install()
    if not install.has_kernels and args.ipc != "on":
        return (f"FlashInfer {install.version} has no PCIe-IPC all-reduce (needs >= {allreduce.FLASHINFER_MIN})"
                if install.where else "FlashInfer is not installed here")
    return None


def run_ipc(spec: dict, world: int, decode: list[int], nccl_us: dict, noise: dict, timeout: float,
            worker_command: list[str]) -> dict:
    """Measure the IPC path twice (the first run JIT-builds the kernels and runs FlashInfer's tune(); the second
    reads the tuned cache), judge it per size against ``nccl_us``, and when it wins only up to a smaller size,
    tune once more for the workspace the server will build (FlashInfer keys its cache by workspace size)."""
    hidden = spec["hidden"]
    result = {"hidden": hidden, "dtype": "bf16", "tokens": decode, "runs": [], "max_tokens": None,
              "max_numel": None}
    top = max(decode)

    def run(tune, max_rows, tokens, label, bound):
        ipc_spec = dict(spec, path=IPC_NAME, tokens=tokens, dtype="bf16", tune=tune, max_numel=max_rows * hidden,
                        tune_batches=sglang_tune_ladder(max_rows))
        progress(f"[{IPC_NAME}] {label}")
        outcome = run_profile({}, ipc_spec, world, bound, worker_command)
        progress(f"[{IPC_NAME}] {label}: {_format_run(outcome)}")
        if outcome.stderr_tails:  # a failure or hang: what the ranks wrote last, here and in the tuned file
            progress(f"[{IPC_NAME}] the ranks' stderr ends:\n{format_tails(outcome.stderr_tails)}")
            result.setdefault("stderr_tails", {str(r): lines for r, lines in outcome.stderr_tails.items()})
        for key in ("flashinfer", "tune_cache", "fabric", "tuned_shapes", "tune_s", "tune_saved"):
            if key in outcome.info:
                result[key] = outcome.info[key]
        return outcome

    first = run(True, top, decode, f"run 1: JIT build + FlashInfer tune() for {top} x {hidden}, then measure", timeout)
    runs = [first.us]
    if first.us is not None:
        second = run(False, top, decode, "run 2: tuned launch configurations from the cache",
                     min(timeout, max(LATER_TIMEOUT_FLOOR, LATER_TIMEOUT_FACTOR * first.wall_s)))
        runs.append(second.us)
        if second.error:
            result.setdefault("error", second.error)
    else:
        result["error"] = first.error
    result["runs"] = [None if run is None else {str(t): (None if v is None else round(v, 2)) for t, v in run.items()}
                      for run in runs]
    judged = nccl_verdict.ipc_verdict({t: nccl_us[t] for t in decode}, noise, runs)
    result["wins"] = {str(t): won for t, won in judged["wins"].items()}
    result["worst"] = {str(t): (None if v is None else round(v, 2)) for t, v in judged["worst"].items()}
    best = judged["max_tokens"]
    if result.get("error"):
        result["verdict"] = f"the PCIe-IPC all-reduce failed here ({result['error']})"
    elif best is None:
        result["verdict"] = f"the PCIe-IPC all-reduce is not faster than NCCL beyond the noise at {min(decode)} tok"
    else:
        result["max_tokens"], result["max_numel"] = best, best * hidden
        result["verdict"] = (f"the PCIe-IPC all-reduce beats NCCL at every measured size up to {best} tok"
                             + ("" if best == top else f" (not at {min(t for t in decode if t > best)} tok)"))
        result["tuned_max_numel"] = top * hidden if first.us is not None else None
        if best != top:
            again = run(True, best, [best], f"tune() again for the server's workspace ({best} x {hidden})", timeout)
            result["tuned_max_numel"] = best * hidden if again.us is not None else result["tuned_max_numel"]
    return result


# ---------------------------------------------------------------------------------------------------------------
# Output


def _markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def verdict_note(sweep: Sweep, name: str) -> str:
    verdict = sweep.verdict
    if name == verdict.winner:
        if name == "default":
            return "winner (NCCL defaults: nothing set)"
        return f"winner: faster at {', '.join(map(str, verdict.faster.get(name, [])))} tok"
    if name == "default":
        return "baseline"
    if name in sweep.errors:  # a failure in any run drops the profile; its first error says why
        return f"dropped: {sweep.errors[name]}"
    return verdict.rejected.get(name) or "qualified"


def render_table(sweep: Sweep, profiles: dict, tokens: list[int], layers: int, ipc: dict | None = None) -> str:
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
    if ipc and ipc.get("runs"):
        worst = ipc.get("worst") or {}
        cells = [_format_us(worst.get(str(t))) for t in tokens]
        latency.append([IPC_NAME, f"FlashInfer {ipc.get('flashinfer') or '?'}", *cells,
                        f"{ipc['verdict']} ({len(ipc['runs'])} runs)"])
    noise = " ".join(f"{t}:{verdict.noise[t]:.0%}" for t in tokens)
    return (f"All-reduce latency, microseconds (defaults: best run; others: worst run). Noise bound per size "
            f"(spread of the defaults' first and last run, at least {nccl_verdict.MIN_NOISE:.0%}): {noise}\n\n"
            f"{_markdown(latency)}\n\n"
            f"Predicted communication per forward pass (2 x {layers} layers x latency), milliseconds\n\n"
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
    "the GPUs this process sees, and write what is faster than NCCL's defaults (never slower beyond the "
    "measured noise at any measured size) to the tuned file that SGLANG_PCIE_NCCL_PROFILE=auto|tuned uses.")


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


# The worker processes each profile's ranks run: this module with --worker SPEC (tests put a fake here).
WORKER_COMMAND = [sys.executable, "-m", "sglang_pcie.tools.tune_nccl"]


def run(args: argparse.Namespace) -> int:

    profiles = dict(CANDIDATES)
    if args.profiles:
        wanted = [n.strip() for n in args.profiles.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in CANDIDATES]
        if unknown:
            raise UsageError(f"--profiles: unknown profile {unknown[0]!r} (known: {', '.join(CANDIDATES)})")
        profiles = {n: CANDIDATES[n] for n in CANDIDATES if n == "default" or n in wanted}
    gloo = args.backend == "gloo"
    if gloo and not args.out and not args.dry_run:
        raise UsageError("--backend gloo measures nothing NCCL would use: give --out, so the real tuned file is kept")
    topology = gpus.probe_topology()
    available = topology.gpu_count
    world = args.tp or (2 if gloo else available)
    if world < 2:
        given = f"--tp {world}" if args.tp else f"{available} GPU(s) visible ({topology.detail or topology.source})"
        raise UsageError(f"{given}: an all-reduce needs at least 2 ranks")
    if not gloo and world > available:
        raise UsageError(f"--tp {world}: only {available} GPU(s) visible ({topology.detail or topology.source})")
    if not gloo and world < available:
        progress(f"note: measuring {world} of the {available} visible GPUs; the result applies to a server that "
                 f"sees exactly those (set CUDA_VISIBLE_DEVICES to them for the server)")
        topology = gpus.probe_topology(dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(
            (os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(available)))).split(",")[:world])))

    out = args.out or tuned_file.config_path()
    fingerprint = tuned_file.fingerprint(topology)
    sizes = sorted(set(args.tokens) | set(args.prefill_tokens))
    spec = {"backend": args.backend, "tokens": sizes, "hidden": args.hidden, "dtype": args.dtype,
            "allreduces": 2 * args.layers}
    counts = "/".join(str(allreduces_per_graph(spec, t)) for t in sizes)
    skip_ipc = ipc_unavailable(world, args)
    stripped = sorted(name for name in TUNABLE_VARS if name in os.environ)
    progress(f"{world} ranks on {tuned_file.describe_machine(fingerprint)}; {len(profiles)} profiles; {args.dtype} "
             f"{'/'.join(map(str, sizes))} tokens x {args.hidden}, {counts} all-reduces per "
             f"{'CUDA graph' if not gloo else 'timed loop'}; PCIe-IPC all-reduce: "
             f"{'measured at ' + '/'.join(map(str, args.tokens)) + ' tokens' if not skip_ipc else 'not measured (' + skip_ipc + ')'}; "
             f"writing {out}")
    if stripped:
        progress(f"measuring without your {', '.join(stripped)} (each profile sets its own); at server start "
                 "your values still win over the tuned ones")
    if args.dry_run:
        for name, values in profiles.items():
            print(f"{name:<14} {' '.join(f'{k}={v}' for k, v in values.items()) or '(NCCL defaults)'}")
        print(f"{IPC_NAME:<14} " + (f"FlashInfer PCIe-IPC all-reduce at {'/'.join(map(str, args.tokens))} tokens"
                                    if not skip_ipc else f"not measured: {skip_ipc}"))
        return 0

    problem = unwritable(out)
    if problem:  # found now, not after a sweep of many minutes
        raise UsageError(f"--out {out}: {problem}")

    command = list(WORKER_COMMAND)
    # Stopped by `timeout`, a scheduler or kill: unwind, so that run_profile kills the workers (they run in
    # their own sessions and would otherwise hold the GPUs after we are gone). Ctrl-C unwinds the same way.
    previous = signal.signal(signal.SIGTERM, _stop)
    began = time.monotonic()
    try:
        sweep = run_sweep(profiles, spec, world, args.timeout, command)
        if sweep.verdict is None:
            progress(f"NCCL defaults could not be measured ({sweep.errors.get('default')}); nothing written")
            return 1
        verdict = sweep.verdict
        ipc = {"verdict": f"not measured: {skip_ipc}"}
        if not skip_ipc:
            ipc = run_ipc(spec, world, args.tokens, verdict.worst[verdict.winner], verdict.noise, args.ipc_timeout,
                          command)
    finally:
        signal.signal(signal.SIGTERM, previous)
    wall = time.monotonic() - began
    print(render_table(sweep, profiles, sizes, args.layers, ipc))
    values = profiles[verdict.winner]
    measured_nccl = sweep.info.get("nccl")
    installed = (fingerprint["nccl"] or "").split(",")
    if measured_nccl and not any(d.endswith(f"=={measured_nccl}") for d in installed):
        # The fingerprint still uses the distribution: it is what the launcher can read without loading NCCL.
        progress(f"note: torch runs NCCL {measured_nccl}; installed NCCL distribution: {fingerprint['nccl']}")
    config = {
        "format": tuned_file.FORMAT,
        "fingerprint": fingerprint,
        "winner": verdict.winner,
        "values": values,
        "rule": (f"measured at {', '.join(map(str, sizes))} tokens x {args.hidden} {args.dtype} over {world} ranks "
                 f"in CUDA graphs; a candidate's slowest run is never slower than NCCL's defaults' fastest run "
                 f"beyond the noise (the spread of the defaults' first and last run at that size, at least "
                 f"{nccl_verdict.MIN_NOISE:.0%}) at any of these sizes, and faster beyond it at one or more; the winner "
                 f"has the largest mean relative gain and is confirmed by {nccl_verdict.CONFIRM_RUNS} runs"),
        "guarantee_sizes": sizes,
        "measured": {"backend": args.backend, "tp": world, "hidden": args.hidden, "dtype": args.dtype,
                     "layers": args.layers, "tokens": args.tokens, "prefill_tokens": args.prefill_tokens,
                     "allreduces_per_graph": {str(t): allreduces_per_graph(spec, t) for t in sizes},
                     "torch_nccl": measured_nccl, "device": sweep.info.get("device"),
                     "noise": {str(t): round(verdict.noise[t], 4) for t in sizes},
                     "sweep_s": round(sweep.wall_s, 1), "wall_s": round(wall, 1),
                     "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "table": {name: {"values": profiles[name],
                         "runs": [{str(t): round(us, 2) for t, us in run.items()} if run else None
                                  for run in sweep.measured[name]],
                         "verdict": verdict_note(sweep, name)}
                  for name in sweep.measured},
        "ipc": ipc,
    }
    try:
        tuned_file.write_config(out, config)
    except (OSError, ValueError) as exc:
        # The measurements took minutes: keep them on stderr rather than lose them.
        print(f"sglang-pcie tune-nccl: could not write {out}: {exc}; the tuned config follows on stderr",
              file=sys.stderr)
        print(json.dumps(config, indent=1, sort_keys=True, default=str), file=sys.stderr)
        return 1
    chosen = " ".join(f"{k}={v}" for k, v in values.items()) or "nothing (NCCL defaults are fastest here)"
    print(f"NCCL winner: {verdict.winner}: {chosen}")
    print(f"PCIe-IPC all-reduce: {ipc['verdict']}"
          + (f"; SGLANG_PCIE_IPC_MAX_NUMEL={ipc['max_numel']} where auto switches it on" if ipc.get("max_numel")
             else ""))
    print(f"written to {out}; took {wall:.0f} s")
    return 0



COMMAND = Command("tune-nccl", "measure NCCL profiles on the local GPUs and keep the best", add_arguments, run,
                  description=DESCRIPTION)

if __name__ == "__main__":  # a worker rank: python -m sglang_pcie.tools.tune_nccl --worker SPEC
    if sys.argv[1:2] != ["--worker"]:
        sys.exit("usage: python -m sglang_pcie.tools.tune_nccl --worker SPEC (run `sglang-pcie tune-nccl` instead)")
    sys.exit(run_worker(json.loads(sys.argv[2])))
