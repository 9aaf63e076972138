"""``sglang-pcie tune-spec [options] -- <launch_server arguments>``: the speculative setting that serves this box
fastest at each concurrency, in few server starts, and one setting to launch.

From the user's own launch (model, drafter, TP, current speculative options) it weighs no speculation, EAGLE /
EAGLE-3 chains of 1 to ``--max-steps`` draft steps, the user's setting, SGLang's adaptive steps with the release's
own table, and a table written for this box. Every server measures every concurrency level (``levels``). The cost
model (``model``) chooses which chain to measure next (``search``); every answer is a measured candidate's. Where the
release runs adaptive steps from a table by batch size, the table (``table``) is proven against SGLang's own and the
best fixed setting in counterbalanced repeats (``answer``). Servers run through bench's machinery (``servers``);
``driver`` keeps the state after each, ``report`` says what was found and the launch to paste.
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
from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.tune_spec import driver, levels as level_workload, report, servers
from sglang_pcie.tools.tune_spec.candidates import candidates, current_name
from sglang_pcie.tools.tune_spec.release import NO_TREE, AdaptiveFacts, adaptive_facts
from sglang_pcie.tools.tune_spec.search import Settings, model_targets
from sglang_pcie.tools.tune_spec.table import read_table

PROG = "sglang-pcie tune-spec"
DEFAULT_MAX_STEPS = 7
DEFAULT_LEVELS = "1,8,32,64"
DESCRIPTION = ("Find the speculative setting (none, EAGLE chains of 1..N steps, yours, SGLang's adaptive steps, a"
               " table for this box) that serves each concurrency fastest on this box, and the one to launch: a cost"
               " model fed by a few real servers chooses what to measure, every answer is a measured candidate, and"
               " where the release runs adaptive steps from a table by batch size, the table written for this box is"
               " proven against SGLang's own and the best fixed chain in counterbalanced repeats.")
EPILOG = ("Levels: c=1 is one request's decode speed (1000 / mean TPOT of a streamed request at a time); c>1 is the"
          " output tok/s of a batch phase with c in flight. Verdicts: 'X is best by Y%' only when the 99% interval"
          " of the pairs clears the servers' own spread; 'A and B are within Z%: either'; or 'cannot tell within"
          " the budget' with the figures so far. Results: DIR/state.json (after every server; --resume DIR continues"
          " a stopped run with its own workload and settings), DIR/result.json, DIR/adaptive-config.json (the table"
          " for this box, where one was made), DIR/tune-spec.png where matplotlib is installed. Exit 0 when it ran"
          " (whatever the verdict); 1 when no candidate could be measured; 2 for bad usage; 130 when interrupted"
          " (the state is kept: --resume).")
# What --resume may change: the limits. Every other option must match the run's or be left out.
RESUME_MAY_CHANGE = ("budget_minutes", "max_servers", "prove", "json", "dry_run", "resume", "out", "host", "port",
                     "start_timeout", "stop_timeout", "request_timeout")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", default=DEFAULT_LEVELS, metavar="LEVELS",
                   help=f"the concurrency levels every server measures, comma-separated (default {DEFAULT_LEVELS});"
                        " 1 is one request at a time, streamed")
    p.add_argument("--workload", choices=("batch", "latency", "both"), default="both",
                   help="which levels: batch (those above 1), latency (1 only) or both (default)")
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
    p.add_argument("--candidates", metavar="NAME,...",
                   help="with --sweep: only these candidates (names as --dry-run lists them), e.g."
                        " chain-3,chain-5,adaptive,table")
    p.add_argument("--prove", type=int, default=2, metavar="N",
                   help="repeats of the proof of the table for this box (default 2; 0: none)")
    p.add_argument("--no-edges", action="store_true",
                   help="proof servers measure only the levels, not also just below each bucket's edge")
    p.add_argument("--table", metavar="FILE",
                   help="also weigh this adaptive table (SGLang's --speculative-adaptive-config format) as"
                        " candidate 'table', e.g. an earlier run's adaptive-config.json")
    p.add_argument("--profile", action="store_true",
                   help="EAGLE3_PROFILE=1 in the model's two chain servers: their draft / verify / re-extend costs in"
                        " the report (off by default: on the H200 run the profiled servers' batch throughput read 6-12%%"
                        " below unprofiled servers of the same setting, unresolved;"
                        " https://github.com/sglang-pcie/sglang-pcie/blob/main/docs/tune-spec.md)")
    p.add_argument("--no-adaptive", action="store_true",
                   help="leave SGLang's adaptive steps (--speculative-adaptive) and the proof out")
    p.add_argument("--batch-waves", type=int, metavar="W",
                   help="at each level c > 1, W x c batch requests (default 4); --batch-requests N sends N at every"
                        " level instead (the two exclude each other)")
    p.add_argument("--resume", metavar="DIR",
                   help="continue a stopped run from DIR/state.json: its launch, workload and settings (only"
                        " --budget-minutes, --max-servers and --prove may change)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument("--dry-run", action="store_true", help="print the candidates and the first servers; start nothing")
    bench_command.add_server_arguments(p, out_prefix="tune-spec", concurrency=False)


def _resolve(text: str) -> float:
    m = re.match(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*%?\s*$", text)
    if not m or not 0 < float(m.group(1)) <= 100:
        raise UsageError(f"--resolve {text!r}: give a percentage above 0 and at most 100, e.g. 2%")
    return float(m.group(1)) / 100


def _steps(text: str | None) -> list[int] | None:
    if text is None:
        return None
    if not re.match(r"^\d+(,\d+)*$", text) or not all(1 <= int(k) <= 16 for k in text.split(",")):
        raise UsageError(f"--steps {text!r}: give chain depths 1 to 16, comma-separated, e.g. 1,2,3,5,7")
    return [int(k) for k in text.split(",")]


def _levels(args) -> tuple:
    try:
        levels = level_workload.parse_levels(args.concurrency)
    except ValueError as exc:
        raise UsageError(f"--concurrency {exc}") from None
    chosen = {"both": levels, "latency": (1,), "batch": tuple(c for c in levels if c > 1)}[args.workload]
    if not chosen:
        raise UsageError(f"--workload batch: --concurrency {args.concurrency} has no level above 1")
    if 1 in chosen and args.stream_requests < 1:
        raise UsageError("--stream-requests 0: the level c=1 is measured with streamed requests; give 1 or more,"
                         " or leave c=1 out (--workload batch)")
    return chosen


def _check_limits(args) -> None:
    if not 0 < args.budget_minutes < float("inf"):
        raise UsageError(f"--budget-minutes {args.budget_minutes}: must be a positive number of minutes")
    if args.max_servers is not None and args.max_servers < 1:
        raise UsageError(f"--max-servers {args.max_servers}: must be a positive integer")
    if not 1 <= args.max_steps <= 16:
        raise UsageError(f"--max-steps {args.max_steps}: give 1 to 16")
    for flag, value in (("--sweep", args.sweep), ("--prove", args.prove)):
        if value < 0:
            raise UsageError(f"{flag} {value}: must be 0 (off) or a positive integer")
    waves = args.batch_waves
    if waves is not None and waves < 1:
        raise UsageError(f"--batch-waves {waves}: must be a positive integer")
    if waves is not None and args.batch_requests is not None:
        raise UsageError(f"--batch-waves {waves} and --batch-requests {args.batch_requests} exclude each other:"
                         " W x c requests at each level c, or N at every level")


def _settings(args, launch_args: list) -> tuple[Settings, list, AdaptiveFacts]:
    resolve, steps, levels = _resolve(args.resolve), _steps(args.steps), _levels(args)
    _check_limits(args)
    max_steps = max(steps) if steps else args.max_steps
    facts = NO_TREE if args.no_adaptive else adaptive_facts(bench_command.sglang_root_of(args))
    table = None
    if args.table is not None:
        if facts.available and not facts.per_batch:
            raise UsageError(f"--table {args.table}: {facts.describe()}")
        try:
            table = (str(Path(args.table).resolve()), read_table(args.table))
        except ValueError as exc:
            raise UsageError(f"--table {exc}") from None
    found = _only(candidates(launch_args, max_steps, facts, steps, table), args.candidates, args.sweep)
    settings = Settings(levels=levels, resolve=resolve, budget_s=args.budget_minutes * 60, max_steps=max_steps,
                        current=current_name(launch_args, found), max_servers=args.max_servers, sweep=args.sweep,
                        profile=args.profile, prove=args.prove, edges=not args.no_edges, per_batch=facts.per_batch,
                        zero_steps=facts.zero_steps, default_config=facts.default_config)
    return settings, found, facts


def _only(found: list, text: str | None, sweep: int) -> list:
    """The candidates ``--candidates`` names, in their listed order (all where it is not given)."""
    if text is None:
        return found
    if not sweep:
        raise UsageError("--candidates: only with --sweep (the search needs none and the chains its model fits;"
                         " narrow it with --steps or --no-adaptive)")
    names, known = [n for n in text.split(",") if n], [c.name for c in found]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--candidates {text!r}: {', '.join(unknown) or 'no name given'}: this launch's"
                         f" candidates are {', '.join(known)}")
    return [c for c in found if c.name in names]


def given_options(argv: list[str]) -> set[str]:
    """The dests of the options typed before ``--`` (``--batch-requests 4`` -> ``batch_requests``)."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    return {w[2:].partition("=")[0].replace("-", "_") for w in words if w.startswith("--")}


def resumed_args(args: argparse.Namespace, state: dict) -> argparse.Namespace:
    """The run's own options, with the limits given now; UsageError (one line) where another option given now
    differs from the run's."""
    stored = state.get("options") or {}
    for dest in sorted(given_options(getattr(args, "argv", None) or [])):
        if dest in RESUME_MAY_CHANGE or dest not in stored:
            continue
        if getattr(args, dest) != stored[dest]:
            flag = "--" + dest.replace("_", "-")
            raise UsageError(f"--resume: {flag} {getattr(args, dest)} differs from the run's ({stored[dest]}); leave"
                             " it out or give the same (only --budget-minutes, --max-servers and --prove may change)")
    merged = dict(vars(args))
    merged.update({k: v for k, v in stored.items() if k not in RESUME_MAY_CHANGE})
    for dest in ("budget_minutes", "max_servers", "prove"):
        if dest not in given_options(getattr(args, "argv", None) or []) and dest in stored:
            merged[dest] = stored[dest]
    return argparse.Namespace(**merged)


def stored_options(args: argparse.Namespace) -> dict:
    """The options a resume must keep (every option but the passthrough and the raw argv), as parsed."""
    return {k: v for k, v in vars(args).items() if k not in ("passthrough", "argv", "resume", "func", "command")
            and isinstance(v, (str, int, float, bool, list, type(None)))}


def dry_run(found, settings, facts, args) -> str:
    sent = {c: level_workload.requests_at(c, args, args.batch_requests, args.batch_waves) for c in settings.levels}
    lines = [f"release: {facts.describe()}", f"levels: {', '.join(f'c={c}' for c in settings.levels)}",
             "requests per level: " + ", ".join(f"c={c}: {n}" + " streamed" * (c == 1) for c, n in sent.items()),
             "candidates:"]
    for c in found:
        lines.append(f"  {c.name:<10} {c.kind:<8} python -m sglang.launch_server {' '.join(c.args)}")
    lines.append(f"the user's setting: {settings.current}")
    proof = ("then, the table for this box proven against SGLang's own and the best fixed setting"
             f" ({settings.prove} repeat(s))" if settings.per_batch and settings.prove and not settings.sweep
             else "no proof: " + ("--prove 0" if not settings.prove else "--sweep" if settings.sweep
                                  else "the release has no adaptive table by batch size"))
    lines.append("first servers (the model): " + ", ".join(model_targets(found, [], settings))
                 + f"; then each level's predicted leader until it is measured; {proof}; then the two best"
                   " measured at each level, until resolved or the budget ends")
    return "\n".join(lines)


def _prepare(args: argparse.Namespace):
    """(args, launch, state, folder): the run's own options where it resumes; UsageError for anything wrong."""
    launch_args = list(args.passthrough or [])
    folder = Path(args.resume).resolve() if args.resume else None
    state = None
    if folder is not None:
        state = driver.load_state(folder)
        if launch_args and launch_args != state["launch_args"]:
            raise UsageError(f"--resume {args.resume}: the launch arguments differ from the run's"
                             f" ({' '.join(state['launch_args'])}); give none or the same")
        launch_args = state["launch_args"]
        args = resumed_args(args, state)
    if not launch_args:
        raise UsageError("no launch_server arguments after '--' (your launch, with --speculative-algorithm and the"
                         " drafter, e.g. -- --model-path /m/target --speculative-algorithm EAGLE3"
                         " --speculative-draft-model-path /m/draft ...)")
    for flag in ("--port", "--host"):
        if any(a == flag or a.startswith(flag + "=") for a in launch_args):
            raise UsageError(f"launch argument {flag}: give it to tune-spec ({PROG} {flag} ...), it sets it per"
                             " server")
    return args, launch_args, state, folder


def run(args: argparse.Namespace) -> int:
    args, launch_args, state, folder = _prepare(args)
    settings, found, facts = _settings(args, launch_args)
    if state is not None:
        settings = Settings.from_dict(dict(state["settings"], budget_s=settings.budget_s,
                                           max_servers=settings.max_servers, prove=settings.prove))
        found = driver.restore_candidates(state)
        facts = AdaptiveFacts.from_dict(state.get("release"))
    folder = folder or Path(args.out or time.strftime("tune-spec-%Y%m%d-%H%M%S")).resolve()
    if args.dry_run:
        print(dry_run(found, settings, facts, args))
        return 0
    plan = bench_command.server_plan(argparse.Namespace(**dict(vars(args), concurrency=max(settings.levels))),
                                     folder, launch_args=[])
    bench_command.check_sglang_imports(plan, variant=servers.variant(found[-1]))
    if state is None:
        state = driver.new_state(launch_args, settings, plan.workload.as_dict(), found, facts.as_dict(),
                                 stored_options(args))
    state["settings"] = settings.as_dict()  # the limits a resume may have raised
    return _tune(args, plan, found, settings, state, folder, facts)


def _tune(args, plan, found, settings, state, folder, facts) -> int:
    # prompts are a function of (seed, level) alone: each server gets those of its levels (a proof's edge levels
    # are known only once the search's servers have logged their CUDA-graph sizes)
    def sent(levels):
        return level_workload.prompts(plan.workload, levels, args.batch_requests, args.batch_waves)
    from sglang_pcie.tools.bench.runs import Progress

    progress = Progress(folder / "progress.log")
    folder.mkdir(parents=True, exist_ok=True)
    first = next(c for c in found if c.name == (model_targets(found, [], settings) or [found[0].name])[0])
    warm = (lambda: servers.warm(plan, first, settings.levels, sent(settings.levels), progress)) if plan.warmup else None
    measure = (lambda c, index, step: servers.measure(plan, c, index, step, sent(step.levels), args.batch_requests,
                                                      progress))
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, bench_command.interrupt)
    try:
        state = driver.tune(found, settings, state, folder, measure, warm, progress)
    except KeyboardInterrupt:
        driver.save_state(state, folder)
        print(f"{PROG}: interrupted; {len(state['servers'])} server(s) kept in {folder / driver.STATE};"
              f" continue with: {PROG} --resume {folder}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    analysis = report.analyse(found, state["servers"], settings, driver.mean_server_s(state))
    result = {"schema": driver.SCHEMA, "state": state, "analysis": analysis,
              "chart": report.write_chart(analysis, folder / "tune-spec.png")}
    (folder / "result.json").write_text(json.dumps(result, indent=1, default=str))
    text = (json.dumps(result, indent=1, default=str) if args.json else
            report.format_report(found, state["servers"], settings, analysis, state["stopped"], facts.describe(),
                                 state.get("warmup"))
            + f"\nchart: {result['chart']}; state: {folder}")
    bench_command.print_text(text)
    return 0 if any(s.get("ok") for s in state["servers"]) else 1


COMMAND = Command("tune-spec", "the speculative setting that serves this box fastest at each concurrency, measured",
                  add_arguments, run, description=DESCRIPTION, epilog=EPILOG,
                  usage=f"{PROG} [--concurrency LEVELS] [--budget-minutes M] [--resolve PCT] [options]"
                        " -- <launch_server arguments>", passthrough=True)
