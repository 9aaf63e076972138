"""``sglang-pcie tune-spec [options] -- <launch_server arguments>``: the speculative setting that serves this
workload fastest on this box, in a few server starts.

From the user's own launch (model, drafter, TP, current speculative options) it weighs no speculation, EAGLE /
EAGLE-3 chains of 1 to ``--max-steps`` draft steps, the user's setting and SGLang's adaptive steps where the release
has them. Instead of a server per candidate, it measures what decides the answer (``search``): a profiled server at
the deepest chain (the per-depth acceptance: how often a verify accepts at least j drafts) and at a second chain
(how the step time grows with the steps), and no speculation; the cost model (``model``) predicts every chain from
those; only the leading candidates are then confirmed with real servers, in counterbalanced order, until the
leader's lead is resolved at ``--resolve`` or the budget ends. Servers run through bench's machinery
(``servers``); ``driver`` keeps the state after each, ``report`` says what was found and the launch to paste.
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from pathlib import Path

from sglang_pcie.tools.bench import command as bench_command
from sglang_pcie.tools.bench.plan import Plan
from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.tune_spec import driver, report, servers
from sglang_pcie.tools.tune_spec.candidates import Candidate, adaptive_in_release, candidates, current_name
from sglang_pcie.tools.tune_spec.search import Settings, model_targets

PROG = "sglang-pcie tune-spec"
DEFAULT_MAX_STEPS = 7
DESCRIPTION = ("Find the speculative setting (none, EAGLE chains of 1..N steps, yours, adaptive) that maximizes"
               " batch throughput and/or single-request decode speed for this launch on this box: a profiled"
               " server at the deepest chain and a second one feed a cost model, then the leading candidates are"
               " confirmed with real servers in counterbalanced order.")
EPILOG = ("Workloads: batch = output tok/s of bench's batch phase at --concurrency; latency = 1000 / mean TPOT of"
          " its concurrency-1 stream. Verdicts: 'X is best by Y%' only when the 99% interval of the pairs clears"
          " the servers' own spread; 'A and B are within Z%: either'; or 'cannot tell within the budget' with the"
          " figures so far. Results: DIR/state.json (after every server; --resume DIR continues a stopped run),"
          " DIR/result.json, DIR/tune-spec.png where matplotlib is installed. Exit 0 when it ran (whatever the"
          " verdict); 1 when no candidate could be measured; 2 for bad usage; 130 when interrupted (the state is"
          " kept: --resume).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=("batch", "latency", "both"), default="both",
                   help="what to maximize: batch output tok/s at --concurrency, single-request decode speed, or both"
                        " (default; the same servers measure both)")
    p.add_argument("--budget-minutes", type=float, default=60.0, metavar="M",
                   help="start no server that would end past M minutes, the warm-up included (default 60)")
    p.add_argument("--resolve", default="2%", metavar="PCT",
                   help="the lead to resolve between the two best candidates (default 2%%)")
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, metavar="K",
                   help=f"longest chain weighed (default {DEFAULT_MAX_STEPS})")
    p.add_argument("--steps", metavar="K,K,...",
                   help="only these chain depths (default 1 to --max-steps), e.g. 1,2,3,5,7")
    p.add_argument("--max-servers", type=int, metavar="N", help="measured servers at most (the warm-up not counted)")
    p.add_argument("--sweep", type=int, default=0, metavar="N",
                   help="no model: measure every candidate N times in counterbalanced order (the exhaustive"
                        " reference; costs candidates x N servers)")
    p.add_argument("--profile", action="store_true",
                   help="EAGLE3_PROFILE=1 in the model's two chain servers: their draft / verify / re-extend costs in"
                        " the report (off by default: on the H200 run the profiled servers' batch throughput read 6-12%%"
                        " below unprofiled servers of the same setting, unresolved;"
                        " https://github.com/sglang-pcie/sglang-pcie/blob/main/docs/tune-spec.md)")
    p.add_argument("--no-adaptive", action="store_true",
                   help="leave SGLang's adaptive steps (--speculative-adaptive) out of the candidates")
    p.add_argument("--resume", metavar="DIR", help="continue a stopped run from DIR/state.json (same launch)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument("--dry-run", action="store_true", help="print the candidates and the first servers; start nothing")
    bench_command.add_server_arguments(p, out_prefix="tune-spec")


def _settings(args, launch_args: list) -> tuple[Settings, list]:
    m = re.match(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*%?\s*$", args.resolve)
    if not m or not 0 < float(m.group(1)) <= 100:
        raise UsageError(f"--resolve {args.resolve!r}: give a percentage above 0 and at most 100, e.g. 2%")
    if not 0 < args.budget_minutes < float("inf"):
        raise UsageError(f"--budget-minutes {args.budget_minutes}: must be a positive number of minutes")
    if args.max_servers is not None and args.max_servers < 1:
        raise UsageError(f"--max-servers {args.max_servers}: must be a positive integer")
    if not 1 <= args.max_steps <= 16:
        raise UsageError(f"--max-steps {args.max_steps}: give 1 to 16")
    if args.sweep < 0:
        raise UsageError(f"--sweep {args.sweep}: must be 0 (off) or a positive integer")
    steps = None
    if args.steps:
        if not re.match(r"^\d+(,\d+)*$", args.steps) or not all(1 <= int(k) <= 16 for k in args.steps.split(",")):
            raise UsageError(f"--steps {args.steps!r}: give chain depths 1 to 16, comma-separated, e.g. 1,2,3,5,7")
        steps = [int(k) for k in args.steps.split(",")]
    max_steps = max(steps) if steps else args.max_steps
    adaptive = not args.no_adaptive and adaptive_in_release(bench_command.sglang_root_of(args))
    found = candidates(launch_args, max_steps, bool(adaptive), steps)
    workloads = ("batch", "latency") if args.workload == "both" else (args.workload,)
    settings = Settings(workloads=workloads, resolve=float(m.group(1)) / 100, budget_s=args.budget_minutes * 60,
                        max_steps=max_steps, current=current_name(launch_args, found),
                        max_servers=args.max_servers, sweep=args.sweep, profile=args.profile)
    return settings, found


def make_plan(args, out: Path) -> Plan:
    return bench_command.server_plan(args, out, launch_args=[])


def dry_run(found, settings) -> str:
    lines = ["candidates:"]
    for c in found:
        lines.append(f"  {c.name:<10} {c.kind:<8} python -m sglang.launch_server {' '.join(c.args)}")
    lines.append(f"the user's setting: {settings.current}")
    lines.append("first servers (the model): " + ", ".join(model_targets(found, [], settings))
                 + "; then the leaders per workload, until resolved or the budget ends")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    launch_args = list(args.passthrough or [])
    folder = Path(args.resume).resolve() if args.resume else None
    state = None
    if folder is not None:
        state = driver.load_state(folder)
        if launch_args and launch_args != state["launch_args"]:
            raise UsageError(f"--resume {args.resume}: the launch arguments differ from the run's"
                             f" ({' '.join(state['launch_args'])}); give none or the same")
        launch_args = state["launch_args"]
    if not launch_args:
        raise UsageError("no launch_server arguments after '--' (your launch, with --speculative-algorithm and the"
                         " drafter, e.g. -- --model-path /m/target --speculative-algorithm EAGLE3"
                         " --speculative-draft-model-path /m/draft ...)")
    for flag in ("--port", "--host"):
        if any(a == flag or a.startswith(flag + "=") for a in launch_args):
            raise UsageError(f"launch argument {flag}: give it to tune-spec ({PROG} {flag} ...), it sets it per"
                             " server")
    settings, found = _settings(args, launch_args)
    if state is not None:
        settings = Settings(**{k: tuple(v) if k == "workloads" else v for k, v in state["settings"].items()
                               if k in Settings.__dataclass_fields__})
        found = [Candidate(d["name"], tuple(d["args"]), d["steps"], d["kind"]) for d in state["candidates"]]
    folder = folder or Path(args.out or time.strftime("tune-spec-%Y%m%d-%H%M%S")).resolve()
    if args.dry_run:
        print(dry_run(found, settings))
        return 0
    plan = make_plan(args, folder)
    bench_command.check_sglang_imports(plan, variant=servers.variant(found[-1]))
    if state is None:
        state = driver.new_state(launch_args, settings, plan.workload.as_dict(), found)
    prompts = plan.workload.prompts()
    from sglang_pcie.tools.bench.runs import Progress

    progress = Progress(folder / "progress.log")
    folder.mkdir(parents=True, exist_ok=True)
    first = next(c for c in found if c.name == model_targets(found, [], settings)[0])
    warm = (lambda: servers.warm(plan, first, prompts, progress)) if plan.warmup else None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, bench_command.interrupt)
    try:
        state = driver.tune(found, settings, state, folder,
                            lambda c, i, p: servers.measure(plan, c, i, p, prompts, progress), warm, progress)
    except KeyboardInterrupt:
        driver.save_state(state, folder)
        print(f"{PROG}: interrupted; {len(state['servers'])} server(s) kept in {folder / driver.STATE};"
              f" continue with: {PROG} --resume {folder}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    analysis = report.analyse(found, state["servers"], settings)
    result = {"schema": driver.SCHEMA, "state": state, "analysis": analysis,
              "chart": report.write_chart(analysis, folder / "tune-spec.png")}
    (folder / "result.json").write_text(json.dumps(result, indent=1, default=str))
    text = (json.dumps(result, indent=1, default=str) if args.json else
            report.format_report(found, state["servers"], settings, analysis, state["stopped"],
                                 plan.workload.concurrency) + f"\nchart: {result['chart']}; state: {folder}")
    bench_command.print_text(text)
    return 0 if any(s.get("ok") for s in state["servers"]) else 1


COMMAND = Command("tune-spec", "the speculative setting that serves this workload fastest here, in a few servers",
                  add_arguments, run, description=DESCRIPTION, epilog=EPILOG,
                  usage=f"{PROG} [--workload batch|latency|both] [--budget-minutes M] [--resolve PCT] [options]"
                        " -- <launch_server arguments>", passthrough=True)
