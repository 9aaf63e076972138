"""The ``bench`` command: its options, the plan they make (every value checked before anything starts), and the
run or report it prints."""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from sglang_pcie.tools.bench.analysis import SCHEMA, exit_code, metric_names
from sglang_pcie.tools.bench.plan import (AUTO_START_REPEATS, CONTROLLED_VARS, Plan, Resolve, Workload, parse_env_pairs,
                                          resolve_variants)
from sglang_pcie.tools.bench.report import format_schedule, format_table, write_chart
from sglang_pcie.tools.bench.runs import run_plan
from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.common import USAGE_ERROR

PROG = "sglang-pcie bench"


class ReportOnly(Exception):
    """``--report DIR``: re-read a finished (or partial) run instead of starting one."""


DESCRIPTION = ("Start one real SGLang server per variant (fresh process tree each), drive a fixed greedy"
               " workload, compare throughput, latency, accept length and outputs against baseline.")
EPILOG = ("Variants: baseline (SGLANG_PCIE_DISABLE=1), overlay, profile (EAGLE3_PROFILE=1), or"
          " NAME:FIELD=VALUE[;FIELD=VALUE...] with FIELD env ('K=V K2=V2'), args (launch arguments added"
          " after the common ones), base (baseline|overlay|profile, default overlay), tokens"
          " (must-match|may-differ), repeats (K: only in the last K repeats). Example: --variant"
          " 'steps2:args=--speculative-num-steps 2 --speculative-num-draft-tokens 3'"
          " --variant nccl-pcie:env=SGLANG_PCIE_NCCL_PROFILE=pcie. A ratio is called higher or lower only when the"
          " 95% t interval of its counterbalanced pairs clears the baseline servers' own spread; otherwise within"
          " noise, with the smallest effect the run could have resolved. Exit 0 when every server ran and"
          " stopped, returned every token asked, no must-match variant changed tokens and every profile"
          " invariant held; 1 otherwise; 2 for bad usage; 130 when interrupted.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", action="append", default=[], metavar="SPEC",
                   help="a variant to run (repeatable; default: baseline and overlay; baseline is always run)")
    p.add_argument("--repeats", default="3", metavar="N|auto",
                   help="counterbalanced repeats of every variant (default 3); auto: from 3, one more at a time"
                        " until --resolve or --budget-minutes")
    p.add_argument("--resolve", metavar="PCT",
                   help="with --repeats auto: stop once every variant could resolve an effect this size on"
                        " --resolve-metric (default 2%%)")
    p.add_argument("--resolve-metric", metavar="METRIC",
                   help=f"with --repeats auto: the metric --resolve is about, one of {', '.join(metric_names())}"
                        " (default batch.output_tok_s)")
    p.add_argument("--budget-minutes", type=float, metavar="M",
                   help="with --repeats auto: start no repeat that would end past M minutes (default 60)")
    add_server_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="print the schedule and commands; start nothing")
    p.add_argument("--report", metavar="DIR",
                   help="print the table of an earlier run's DIR/results.json (and draw its chart); start nothing")


def add_server_arguments(p: argparse.ArgumentParser, out_prefix: str = "bench", concurrency: bool = True) -> None:
    """The workload and the servers' options, shared with tune-spec (which runs its servers through bench and
    declares its own ``--concurrency``, a list: ``concurrency=False``)."""
    if concurrency:
        p.add_argument("--concurrency", type=int, default=32, help="batch phase concurrency (default 32)")
    p.add_argument("--batch-requests", type=int, default=None,
                   help="requests in the batch phase (default 4 x concurrency)")
    p.add_argument("--stream-requests", type=int, default=8, help="requests in the concurrency-1 stream (default 8)")
    p.add_argument("--input-len", type=int, default=128, help="prompt length in tokens (default 128)")
    p.add_argument("--output-len", type=int, default=256, help="max_new_tokens, with ignore_eos (default 256)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
    p.add_argument("--token-range", default="10:30000", metavar="LO:HI",
                   help="prompt token ids are drawn from [LO, HI) (default 10:30000; HI at most the vocabulary)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="a variable for every server (repeatable), e.g. NCCL_DEBUG=INFO")
    p.add_argument("--out", metavar="DIR", help=f"results folder (default ./{out_prefix}-YYYYmmdd-HHMMSS)")
    p.add_argument("--host", default="127.0.0.1", help="address the servers listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="first port to try (default 30000)")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds for /health (default 900)")
    p.add_argument("--stop-timeout", type=float, default=30.0,
                   help="seconds between SIGTERM and SIGKILL of the server's tree (default 30)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--server-cmd", metavar="CMD",
                   help="the server command before the launch arguments (default: this python -m"
                        " sglang.launch_server); for tests or another interpreter")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the unmeasured warm-up server (by default one server is started, warmed up and"
                        " stopped before the first measured one: a cold first server, JIT builds, biases every"
                        " ratio to it)")


def make_plan(args: argparse.Namespace) -> Plan:
    launch_args = list(args.passthrough or [])
    if args.report:
        raise ReportOnly(Path(args.report))
    for flag in ("--port", "--host"):
        if any(a == flag or a.startswith(flag + "=") for a in launch_args):
            raise UsageError(f"launch argument {flag}: give it to bench ({PROG} {flag} ...), it sets it per server")
    if not launch_args and not args.server_cmd:
        raise UsageError("no launch_server arguments after '--' (e.g. -- --model-path /models/target --tp-size 2)")
    repeats, resolve = _repeats(args)
    variants = resolve_variants(args.variant)
    for v in variants:
        if v.repeats is not None and resolve is not None:
            raise UsageError(f"--variant {v.spec!r}: repeats= needs a fixed --repeats, not auto")
        if v.repeats is not None and v.repeats > repeats:
            raise UsageError(f"--variant {v.spec!r}: repeats={v.repeats} is more than --repeats {repeats}")
    return server_plan(args, Path(args.out or time.strftime("bench-%Y%m%d-%H%M%S")), launch_args=launch_args,
                       variants=variants, repeats=repeats, resolve=resolve)


def server_plan(args: argparse.Namespace, out: Path, launch_args: list, variants: list | None = None,
                repeats: int = 1, resolve: Resolve | None = None) -> Plan:
    """The plan of ``add_server_arguments``' options (each value checked; UsageError names a bad one): the
    workload, the server command, the environment, ports and timeouts. tune-spec builds its plan here too."""
    _check_numbers(args)
    if args.batch_requests is not None and args.batch_requests < 1:
        raise UsageError(f"--batch-requests {args.batch_requests}: must be a positive integer")
    m = re.match(r"^(\d+):(\d+)$", args.token_range)
    if not m or int(m.group(1)) >= int(m.group(2)):
        raise UsageError(f"--token-range {args.token_range!r}: give LO:HI with 0 <= LO < HI")
    extra_env = _extra_env(args.env)
    server_cmd = _server_command(args.server_cmd)
    workload = Workload(seed=args.seed, concurrency=args.concurrency,
                        batch_requests=args.batch_requests or 4 * args.concurrency,
                        stream_requests=args.stream_requests, input_len=args.input_len, output_len=args.output_len,
                        warmup_requests=args.concurrency, token_low=int(m.group(1)), token_high=int(m.group(2)))
    plan = Plan(variants=variants or [], workload=workload, launch_args=launch_args,
                server_cmd=server_cmd, extra_env=extra_env, host=args.host, port=args.port, repeats=repeats,
                out=out.resolve(), start_timeout=args.start_timeout, stop_timeout=args.stop_timeout,
                request_timeout=args.request_timeout, dry_run=args.dry_run, argv=args.argv, resolve=resolve,
                warmup=not args.no_warmup)
    return plan


def _repeats(args: argparse.Namespace) -> tuple[int, Resolve | None]:
    """--repeats N, or auto with its target, metric and budget (which mean nothing without auto)."""
    auto_options = {"--resolve": args.resolve, "--resolve-metric": args.resolve_metric,
                    "--budget-minutes": args.budget_minutes}
    if args.repeats != "auto":
        for flag, value in auto_options.items():
            if value is not None:
                raise UsageError(f"{flag}: only with --repeats auto")
        if not re.match(r"^-?\d+$", args.repeats.strip()):
            raise UsageError(f"--repeats {args.repeats!r}: give a positive integer or auto")
        if int(args.repeats) < 1:
            raise UsageError(f"--repeats {int(args.repeats)}: must be a positive integer")
        return int(args.repeats), None
    return AUTO_START_REPEATS, Resolve(target=_percentage(args.resolve or "2%"),
                                       metric=_metric_label(args.resolve_metric or "batch.output_tok_s"),
                                       budget_s=_minutes(args.budget_minutes) * 60)


def _percentage(text: str) -> float:
    m = re.match(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*%?\s*$", text)
    if not m or not 0 < float(m.group(1)) <= 1000:
        raise UsageError(f"--resolve {text!r}: give a percentage above 0 and at most 1000, e.g. 2%")
    return float(m.group(1)) / 100


def _metric_label(name: str) -> str:
    names = metric_names()
    if name not in names:
        raise UsageError(f"--resolve-metric {name!r}: choose one of {', '.join(names)}")
    return names[name]


def _minutes(value: float | None) -> float:
    if value is None:
        return 60.0
    if not 0 < value < float("inf"):
        raise UsageError(f"--budget-minutes {value}: must be a positive number of minutes")
    return value


def _check_numbers(args: argparse.Namespace) -> None:
    for name in ("concurrency", "stream_requests", "input_len", "output_len"):
        if name == "stream_requests" and args.stream_requests < 0:
            raise UsageError(f"--stream-requests {args.stream_requests}: must be an integer >= 0")
        if name != "stream_requests" and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be a positive integer")
    # free_port tries port..port+199; past 65535 socket.bind raises OverflowError, not OSError.
    if not 1 <= args.port <= 65535 - 199:
        raise UsageError(f"--port {args.port}: must be between 1 and {65535 - 199}")
    for name in ("start_timeout", "stop_timeout", "request_timeout"):
        value = getattr(args, name)
        if not value > 0 or value == float("inf"):
            raise UsageError(f"--{name.replace('_', '-')} {value}: must be a positive number of seconds")


def _extra_env(pairs: list[str]) -> dict:
    extra_env = {}
    for pair in pairs:
        extra_env.update(parse_env_pairs(shlex.quote(pair), f"--env {pair!r}"))
    for key in extra_env:
        if key in CONTROLLED_VARS:
            raise UsageError(f"--env {key}: set by the variants themselves (use a variant's env= field)")
    return extra_env


def _server_command(text: str | None) -> list[str]:
    try:
        server_cmd = shlex.split(text) if text else [sys.executable, "-m", "sglang.launch_server"]
    except ValueError as exc:
        raise UsageError(f"--server-cmd {text!r}: does not parse ({exc})") from None
    if not server_cmd:
        raise UsageError("--server-cmd '': empty command")
    return server_cmd


IMPORT_CHECK_TIMEOUT_S = 300.0
_CHECKED = "sglang-pcie bench: "  # marks the probe's own line among whatever importing SGLang prints
_IMPORT_PROBE = f"""import importlib.util, sys
try:
    found = importlib.util.find_spec("sglang.launch_server")  # imports the sglang package, not launch_server
except BaseException as exc:
    print("{_CHECKED}" + type(exc).__name__ + (": " + str(exc).splitlines()[0] if str(exc).strip() else ""))
    sys.exit(3)
if found is None:
    print("{_CHECKED}sglang imports but has no sglang.launch_server")
    sys.exit(3)
"""


def check_sglang_imports(plan: Plan, variant=None) -> None:
    """Before any server starts: where the server command is ``<python> -m sglang.launch_server`` (the default),
    SGLang must import with that python, in the first server's environment. Otherwise every server would fail the
    same way and the table would be empty. UsageError names the python and the import error. Any other server
    command (a wrapper, the tests' fake) is not checked. ``variant``: the environment of that variant's run
    instead of the first scheduled one (tune-spec schedules its own)."""
    python, *rest = plan.server_cmd
    if rest != ["-m", "sglang.launch_server"]:
        return
    try:
        run = plan.make_run(1, 1, variant) if variant is not None else plan.schedule()[0]
        probe = subprocess.run([python, "-c", _IMPORT_PROBE], env=plan.environment(run),
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                               timeout=IMPORT_CHECK_TIMEOUT_S)
    except OSError as exc:
        raise UsageError(f"cannot run the server command's python {python!r}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{python} did not finish importing sglang in {IMPORT_CHECK_TIMEOUT_S:.0f} s") from None
    if probe.returncode == 0:
        return
    said = [line[len(_CHECKED):] for line in probe.stdout.splitlines() if line.startswith(_CHECKED)]
    error = said[-1] if said else (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
    raise UsageError(f"{python} cannot import SGLang ({error}): every server would fail; install SGLang for that"
                     " python, or name another with --server-cmd")


def sglang_root_of(args: argparse.Namespace):
    """The SGLang source tree the servers will run: this python's where the server command is the default one,
    else None (another interpreter's tree is not read)."""
    if args.server_cmd:
        return None
    from sglang_pcie.patching.source import installed_sglang_root

    return installed_sglang_root()


def interrupt(signum, frame):
    # A SIGTERM to bench (the kill of a background run) unwinds like Ctrl-C: the server tree is stopped.
    raise KeyboardInterrupt


def show_report(folder: Path) -> int:
    """The table (and chart, where matplotlib is importable here) of a run collected from another machine."""
    path = folder / "results.json"
    try:
        results = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"{PROG}: error: --report {str(folder)!r}: cannot read {path.name} ({exc})", file=sys.stderr)
        return USAGE_ERROR
    if results.get("schema") != SCHEMA:
        print(f"{PROG}: error: --report {str(folder)!r}: {path.name} is not a bench result ({SCHEMA})",
              file=sys.stderr)
        return USAGE_ERROR
    if not (folder / "ratios.png").is_file():
        chart = write_chart(results, folder / "ratios.png")
        if not chart.startswith("skipped"):
            results["chart"] = chart
    partial = "" if results.get("complete") else f"(partial: {len(results['runs'])} run(s) so far)\n"
    return _print(partial + format_table(results), exit_code(results))


def run(args: argparse.Namespace) -> int:
    try:
        plan = make_plan(args)
    except ReportOnly as report:
        return show_report(report.args[0])
    if plan.dry_run:
        try:
            check_sglang_imports(plan)  # what the real run checks first: the preview says where it would refuse
        except UsageError as exc:
            print(f"{PROG}: note: the real run would refuse: {exc}", file=sys.stderr)
        return _print(format_schedule(plan), 0)
    check_sglang_imports(plan)
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        results = run_plan(plan)
    except KeyboardInterrupt:
        saved = plan.out / "results.json"
        print(f"{PROG}: interrupted; " + (f"partial results in {saved}" if saved.is_file() else "no results written"),
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _print(format_table(results), exit_code(results))


def print_text(text: str) -> None:
    """Print, and where the reader left (``... | head``) end quietly: no traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _print(text: str, code: int) -> int:
    print_text(text)
    return code

COMMAND = Command("bench", "one real server per variant (baseline, overlay, profile, yours), side by side",
                  add_arguments, run, description=DESCRIPTION, epilog=EPILOG,
                  usage=f"{PROG} [options] -- <launch_server arguments>", passthrough=True)
