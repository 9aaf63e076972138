"""The parent's side of one run: start a profile's ranks (one fresh process each), bound them in time, kill them
(and anything they started) when one fails or the bound passes, and collect their reports; a failed or hung run
brings back each rank's stderr tail, with the Python stacks of ranks that hung."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import sglang_pcie
from sglang_pcie.runtime import tuned_file
from sglang_pcie.tools.common import tail_lines
from sglang_pcie.tools.processes import free_port, kill_groups
from sglang_pcie.tools.tune_nccl.measure import PHASE_MARK

# Removed from the workers' environment so that "default" means NCCL's defaults and each candidate gets
# exactly its own values.
TUNABLE_VARS = sorted({name for values in tuned_file.CANDIDATES.values() for name in values})
# What a failed or hung run brings back from each rank's stderr: enough for a traceback, or for the phase lines and
# the Python stacks a hung worker dumps when the parent gives up on it (SIGUSR1, faulthandler).
STDERR_TAIL_LINES = 40


def progress(message: str) -> None:
    print(f"tune-nccl: {message}", file=sys.stderr, flush=True)


@dataclass
class Outcome:
    us: dict | None  # tokens (int) -> microseconds, worst rank; None when the profile failed
    error: str | None
    wall_s: float
    info: dict = field(default_factory=dict)  # nccl version and device name reported by rank 0
    # rank -> the last STDERR_TAIL_LINES lines of its stderr, for a run that failed, hung or left no report
    stderr_tails: dict = field(default_factory=dict)


def format_us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_run(outcome: Outcome) -> str:
    if outcome.us is None:
        return f"{outcome.wall_s:5.1f} s  dropped: {outcome.error}"
    return f"{outcome.wall_s:5.1f} s  " + "  ".join(f"{t}:{format_us(v)}" for t, v in outcome.us.items()) + " us"


def worker_environment(values: dict) -> dict:
    """The parent's environment without any tunable NCCL variable, plus ``values``. NCCL_NVLS_ENABLE and the
    other transport switches stay as they are."""
    env = {k: v for k, v in os.environ.items() if k not in TUNABLE_VARS}
    env.update(values)
    package_root = str(Path(sglang_pcie.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"died of {signal.Signals(-code).name}"
        except ValueError:
            return f"died of signal {-code}"
    return f"exited with {code}"


def read_report(path: Path) -> dict | None:
    """A worker's report: the last line holding a JSON object that starts with "rank", read whole (it can be long)
    and from where it starts (a library may have written to stdout without a newline before it). None also where
    the rank never started (no file)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    for line in reversed(text.splitlines()):
        start = line.find('{"rank"')
        if start >= 0:
            try:
                report = json.loads(line[start:])
            except ValueError:
                continue
            if isinstance(report, dict):
                return report
    return None


def tail(path: Path, lines: int = STDERR_TAIL_LINES) -> list[str]:
    return [line.rstrip() for line in tail_lines(path) if line.strip()][-lines:]


def last_phase(lines: list[str]) -> str:
    """The last progress line a worker wrote (where a hung rank stopped), without its prefix."""
    for line in reversed(lines):
        if PHASE_MARK in line:
            return line.split(PHASE_MARK, 1)[1].strip()
    return ""


def format_tails(tails: dict, indent: str = "  ") -> str:
    """The ranks' stderr tails, one line per stderr line, prefixed by the rank."""
    return "\n".join(f"{indent}rank {rank} | {line}" for rank, lines in sorted(tails.items()) for line in lines)


def dump_stacks(processes) -> None:
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


def _wait(processes, began: float, timeout: float) -> tuple[str | None, int | None]:
    """Until every rank exits 0, one fails (the others would wait for it in NCCL forever) or ``timeout`` passes:
    (error, the failed rank), (None, None) when all succeeded."""
    while True:
        codes = [p.poll() for p in processes]
        failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            return f"rank {failed[0]} {describe_exit(codes[failed[0]])}", failed[0]
        if all(code == 0 for code in codes):
            return None, None
        if time.monotonic() - began > timeout:
            dump_stacks(processes)
            return f"timed out after {timeout:.0f} s (killed)", None
        time.sleep(0.05)


def _failure(own: str | None, error: str | None, failed_rank: int | None, reports: list, tails: dict) -> str:
    """One line for a failed run: the worker's own message, else the exit and the end of its stderr, else (a
    timeout) where each rank stopped, else the rank that left no report."""
    if own:  # a worker's own message (capture failed, wrong sums) says more than its exit code
        return own
    if error and failed_rank is not None:
        last = tails[failed_rank][-1].strip()[:300] if tails[failed_rank] else ""
        return error + (f": {last}" if last else "")
    if error:  # timed out: where each rank stopped, if they said
        phases = {rank: last_phase(lines) for rank, lines in sorted(tails.items())}
        return error + ("; last phase: " + ", ".join(f"rank {rank}: {text or '(none written)'}"
                                                     for rank, text in phases.items())
                        if any(phases.values()) else "")
    missing = reports.index(None)
    last = tails[missing][-1].strip()[:300] if tails[missing] else ""
    return f"rank {missing} exited without a report" + (f"; its stderr ends: {last}" if last else
                                                        "; its stderr is empty")


def _slowest_rank(reports: list) -> dict:
    """tokens (int) -> the slowest rank's microseconds; None at a size some rank's path refused."""
    us = {}
    for tokens in reports[0]["us"]:
        values = [r["us"].get(tokens) for r in reports]
        us[int(tokens)] = None if None in values else max(values)
    return us


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
            error, failed_rank = _wait(processes, began, timeout)
        finally:
            kill_groups(processes)
        wall = time.monotonic() - began
        reports = [read_report(out) for out, _ in outputs]
        own = next((f"rank {r['rank']}: {r.get('error')}" for r in reports if r and not r.get("ok")), None)
        failed = bool(own or error or None in reports)
        tails = {rank: tail(err) for rank, (_, err) in enumerate(outputs)} if failed or keep_stderr else {}
    if failed:
        return Outcome(None, _failure(own, error, failed_rank, reports, tails), wall, stderr_tails=tails)
    info = {k: v for k, v in reports[0].items() if k not in ("rank", "ok", "us", "error")}
    return Outcome(_slowest_rank(reports), None, wall, info, stderr_tails=tails)
