"""Running the plan: each server started in its own process tree, waited for, driven through the workload
(``workload``: warm-up, batch at ``--concurrency``, concurrency-1 stream) and stopped whole, one at a time, results
saved after each."""
from __future__ import annotations

import http.client
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from sglang_pcie.tools.bench.analysis import (assemble, compute_ratios, expected_nccl, nccl_check, nccl_debug_env,
                                              nccl_env_lines, read_profile)
from sglang_pcie.tools.bench.client import RequestError, http_get
from sglang_pcie.tools.bench.plan import PROFILE_FILE_NAME, Plan
from sglang_pcie.tools.bench.report import auto_text, format_schedule, percent, save, write_chart
from sglang_pcie.tools.bench.verdicts import auto_stop, resolvable_widths
from sglang_pcie.tools.bench.workload import drive_workload, short_outputs, warmup_workload
from sglang_pcie.tools.common import tail_lines
from sglang_pcie.tools.processes import free_port, stop_tree, tree_members

LOG_TAIL_LINES = 40


# ----------------------------------------------------------------------------------------------------- servers

def gpu_processes() -> list | None:
    """PIDs holding a GPU context (nvidia-smi), or None where nvidia-smi is not available."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(tail_lines(path)[-lines:])


class Progress:
    def __init__(self, log_path: Path | None):
        self.log_path = log_path
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        line = f"[bench {time.monotonic() - self.started:7.1f}s] {message}"
        print(line, file=sys.stderr, flush=True)
        if self.log_path is not None:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")


def wait_ready(plan: Plan, proc, port: int, log: Path) -> tuple[float, dict]:
    """Seconds until /health answered 200, and /model_info; RuntimeError if the server exits or times out."""
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before /health answered")
        if time.monotonic() - start > plan.start_timeout:
            raise RuntimeError(f"/health did not answer 200 within {plan.start_timeout:.0f} s")
        try:
            status, _ = http_get(plan.host, port, "/health")
            if status == 200:
                break
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    ready_s = time.monotonic() - start
    info = {}
    for path in ("/model_info", "/get_model_info"):
        try:
            status, body = http_get(plan.host, port, path)
        except (OSError, http.client.HTTPException):
            continue
        if status == 200:
            try:
                info = json.loads(body)
            except json.JSONDecodeError:
                info = {}
            break
    return ready_s, info


def execute_run(plan: Plan, run: dict, prompts: dict, progress, drive=None) -> dict:
    """Start the variant's server, drive the workload, stop the tree. Never raises for a server's failure (Ctrl-C
    and SIGTERM, as KeyboardInterrupt, stop the server and propagate).

    ``run``: a dict as ``Plan.make_run`` (or ``Plan.schedule``) makes it, any index and folder. ``progress``: a
    callable taking one line (``Progress``). ``drive(plan, port, prompts, log, progress, label)`` replaces the
    measured workload (``drive_workload``) and returns (metrics, outputs or None); ``warm_up`` passes its own."""
    folder: Path = run["folder"]
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "server.log"
    port = free_port(plan.host, plan.port)
    cmd = plan.command(run, port)
    record = {"index": run["index"], "repeat": run["repeat"], "variant": run["variant"], "port": port,
              "command": cmd, "env": run["env"], "log": str(log), "ok": False}
    label = run.get("label") or f"{run['index']}/{len(plan.schedule())} {run['variant']} (repeat {run['repeat']})"
    progress(f"{label}: starting on port {port}: {shlex.join(cmd)}")
    server_env = plan.environment(run)
    try:
        record["nccl_expected"] = expected_nccl(server_env)
    except Exception as exc:  # the check is a by-product: it must not cost the measurement
        record["nccl_expected"] = {}
        record["nccl_expected_error"] = f"{type(exc).__name__}: {exc}"
    handle = open(log, "wb")
    try:
        proc = subprocess.Popen(cmd, env=server_env, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        handle.close()
        record["failure"] = {"stage": "start", "message": f"cannot start {cmd[0]!r}: {exc}", "log_tail": ""}
        progress(f"{label}: FAILED to start: {exc}")
        return record
    known: dict = {}  # the server's processes once it answered, so that a member that leaves is still stopped
    try:
        outputs = _serve(plan, run, proc, port, prompts, progress, label, record, known, drive or drive_workload)
    finally:
        _stop(plan, proc, known, handle, record, progress, label)
    _read_logs(record, run, server_env)
    if record["ok"]:
        record["outputs"] = outputs
    return record


def _serve(plan, run, proc, port, prompts, progress, label, record, known, drive) -> dict | None:
    """Wait for the server, drive the workload; a failure is recorded in ``record``, not raised (Ctrl-C is).
    The outputs, or None."""
    folder, log = run["folder"], Path(record["log"])
    stage = "start"
    try:
        record["ready_s"], record["model_info"] = wait_ready(plan, proc, port, log)
        known.update(tree_members(proc.pid))
        progress(f"{label}: ready in {record['ready_s']:.1f} s ({len(known)} processes); warm-up")
        stage = "workload"
        record["metrics"], outputs = drive(plan, port, prompts, log, progress, label)
        if outputs is None:  # a warm-up: nothing to compare
            record["ok"] = True
            return None
        (folder / "outputs.json").write_text(json.dumps(outputs))
        record["outputs_file"] = str(folder / "outputs.json")
        stage = "outputs"
        short = short_outputs(outputs, plan.workload.output_len)
        if short:
            raise RuntimeError(short)
        record["ok"] = True
        return outputs
    except (RuntimeError, OSError, http.client.HTTPException, RequestError, ValueError) as exc:
        record["failure"] = {"stage": stage, "message": str(exc)}
        progress(f"{label}: FAILED ({stage}): {exc}")
        return None


def _stop(plan, proc, known, handle, record, progress, label) -> None:
    stop = stop_tree(proc, known, plan.stop_timeout)
    handle.close()
    gpu = gpu_processes()
    if gpu is not None:
        stop["gpu_processes_after"] = gpu
    record["stop"] = stop
    survivors = f", {len(stop['survivors'])} SURVIVED: {stop['survivors']}" if stop["survivors"] else ""
    since = f" ({stop['started_after_ready']} started after ready)" if known and stop["started_after_ready"] else ""
    progress(f"{label}: stopped {stop['processes']} processes{since} in {stop['stop_s']} s"
             f"{' (SIGKILL needed)' if stop['sigkilled'] else ''}{survivors}")


def _read_logs(record: dict, run: dict, server_env: dict) -> None:
    """What the stopped server left: its log tail on a failure, the NCCL variables it read, its EAGLE3 profile."""
    log = Path(record["log"])
    if "failure" in record and record["failure"]["stage"] != "outputs":  # the server ran: its outputs tell
        record["failure"]["log_tail"] = log_tail(log)
    record["nccl_env"], processes = nccl_env_lines(log)
    if nccl_debug_env(server_env):
        record["nccl_check"] = nccl_check(record["nccl_expected"], record["nccl_env"], processes)
    profile_path = Path(run["env"].get("EAGLE3_PROFILE_FILE", run["folder"] / PROFILE_FILE_NAME))
    if run["env"].get("EAGLE3_PROFILE") == "1":
        record["profile"] = read_profile(profile_path) or read_profile(log)


# ------------------------------------------------------------------------------------------------------ warm-up

def warm_up(plan: Plan, prompts: dict, progress, variant=None) -> dict:
    """One unmeasured server before the measured ones: the first scheduled run's variant (or ``variant``, a
    Variant or the name of one of the plan's), same command and environment, in ``out/runs/00-warmup``; it waits
    for /health, is sent ``warmup_workload`` and stopped. The first server on a fresh machine is cold (JIT builds:
    ready in 141 s against 49-68 s, about 5% slower on an H200), which would bias every ratio to it.

    Returns what results.json keeps under ``warmup``: variant, folder, log, ready_s, ok, failure (None, or stage
    message and the log's tail), wall_s (start to stopped), figures (the warm-up batch's
    output tok/s: not a measurement), stop. Never raises for the server's failure (Ctrl-C does)."""
    run = plan.warmup_run(variant)
    name = run["variant"]
    start = time.monotonic()
    record = execute_run(plan, run, prompts, progress, drive=warmup_workload)
    failure = record.get("failure")
    summary = {"variant": name, "folder": str(run["folder"]), "log": record.get("log"),
               "ready_s": record.get("ready_s"), "ok": record["ok"],
               "failure": failure,
               "wall_s": round(time.monotonic() - start, 3), "figures": record.get("metrics"),
               "stop": record.get("stop")}
    if failure:
        progress(f"warm-up {name} FAILED at {failure['stage']}: {failure['message']}; log {record.get('log')};"
                 " the measured servers go on")
    return summary


# -------------------------------------------------------------------------------------------------------- plan

clock = time.monotonic  # the budget's clock (tests replace it)


class Session:
    """One bench run: the servers run so far, results.json rewritten after each (a background run can be read)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        plan.out.mkdir(parents=True, exist_ok=True)
        self.progress = Progress(plan.out / "progress.log")
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.began = clock()
        self.prompts = plan.workload.prompts()
        self.records: list[dict] = []
        self.auto: dict | None = None
        self.warmup: dict | None = None  # warm_up's summary, once it ran
        self.warmup_s = 0.0  # its time on the budget's clock

    def execute(self, runs: list[dict]) -> None:
        for run in runs:
            try:
                self.records.append(execute_run(self.plan, run, self.prompts, self.progress))
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: execute_run stopped the server; keep what was measured
                self.records.append({"index": run["index"], "repeat": run["repeat"], "variant": run["variant"],
                                     "env": run["env"], "ok": False,
                                     "failure": {"stage": "interrupted",
                                                 "message": "bench was interrupted (Ctrl-C or SIGTERM)",
                                                 "log_tail": ""}})
                save(self.results(complete=False), self.plan.out)
                raise
            save(self.results(complete=False), self.plan.out)

    def warm_up(self) -> None:
        """The unmeasured warm-up server (``warm_up``), kept in results.json under ``warmup``. Its time counts in
        the session's elapsed time (``--repeats auto``'s budget), not in the mean repeat."""
        start = clock()
        try:
            self.warmup = warm_up(self.plan, self.prompts, self.progress)
            self.warmup_s = clock() - start
        except KeyboardInterrupt:
            self.warmup = {"variant": self.plan.schedule()[0]["variant"], "ok": False, "ready_s": None,
                           "failure": {"stage": "interrupted", "message": "bench was interrupted (Ctrl-C or SIGTERM)"}}
            save(self.results(complete=False), self.plan.out)
            raise
        save(self.results(complete=False), self.plan.out)

    def results(self, complete: bool) -> dict:
        return assemble(self.plan, self.records, self.started, complete, auto=self.auto, warmup=self.warmup)


def run_plan(plan: Plan) -> dict:
    session = Session(plan)
    (plan.out / "schedule.txt").write_text(format_schedule(plan) + "\n")
    runs = plan.schedule()
    session.progress(f"{len(runs)} servers{' after a warm-up server' if plan.warmup else ''}, order"
                     f" {' '.join(r['variant'] for r in runs)}; results in {plan.out}")
    if plan.warmup:
        session.warm_up()
    session.execute(runs)
    if plan.resolve is not None:
        more_repeats(session)
    results = session.results(complete=True)
    results["chart"] = write_chart(results, plan.out / "ratios.png")
    save(results, plan.out)
    session.progress(f"done: {plan.out}/results.json; chart {results['chart']}")
    return results


def more_repeats(session: Session) -> None:
    """``--repeats auto``: one more counterbalanced repeat of every variant at a time, until auto_stop says why not
    (recorded in the session, so results.json and the table carry it)."""
    plan = session.plan
    while True:
        failed = any(not r.get("ok") or (r.get("stop") or {}).get("survivors") for r in session.records)
        ratios = compute_ratios(session.records, plan.variants)
        stop = auto_stop(ratios, plan.resolve, plan.repeats, clock() - session.began, failed,
                         fixed_s=session.warmup_s)
        if stop is not None:
            session.auto = dict(stop, repeats=plan.repeats, elapsed_s=round(clock() - session.began, 1))
            session.progress(auto_text(session.auto))
            return
        done = len(plan.schedule())
        plan.repeats += 1
        widths = ", ".join(f"{name} {percent(width)}"
                           for name, width in resolvable_widths(ratios, plan.resolve.metric).items())
        session.progress(f"repeats auto: {plan.resolve.metric} resolves {widths}; target"
                         f" {percent(plan.resolve.target)}: repeat {plan.repeats}")
        session.execute(plan.schedule()[done:])

