"""The run: a warm-up server, then one server at a time as ``search.plan_next`` says, the state saved after each
(``state.json``: a stopped run keeps every finished server, and ``--resume DIR`` continues it)."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from sglang_pcie.tools.command import UsageError
from sglang_pcie.tools.tune_spec.search import measured, model_targets, ok_servers, plan_next

SCHEMA = "sglang-pcie.tune-spec/1"
STATE = "state.json"


def new_state(launch_args: list, settings, workload: dict, candidates: list) -> dict:
    return {"schema": SCHEMA, "launch_args": list(launch_args), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "settings": {"workloads": list(settings.workloads), "resolve": settings.resolve,
                         "budget_s": settings.budget_s, "max_steps": settings.max_steps,
                         "current": settings.current, "max_servers": settings.max_servers,
                         "sweep": settings.sweep, "profile": settings.profile},
            "workload": workload, "candidates": [c.as_dict() for c in candidates], "warmup": None,
            "servers": [], "complete": False, "stopped": None}


def load_state(folder: Path) -> dict:
    path = folder / STATE
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--resume {str(folder)!r}: cannot read {STATE} ({exc})") from None
    if not isinstance(state, dict) or state.get("schema") != SCHEMA:
        raise UsageError(f"--resume {str(folder)!r}: {STATE} is not a tune-spec state ({SCHEMA})")
    return state


def save_state(state: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    tmp.replace(folder / STATE)


def elapsed(state: dict) -> float:
    spent = sum(s.get("duration_s") or 0 for s in state["servers"])
    return spent + ((state.get("warmup") or {}).get("duration_s") or 0)


def mean_server_s(state: dict) -> float | None:
    durations = [s["duration_s"] for s in measured(state["servers"]) if s.get("duration_s")]
    return statistics.fmean(durations) if durations else None


def time_left(candidates, state, settings) -> str:
    """An estimate for the progress line: the model's servers still to run plus one more pair, at the mean server
    so far, within what is left of the budget."""
    mean = mean_server_s(state)
    if mean is None:
        return "time left: unknown until a server has run"
    run = measured(state["servers"])
    if settings.sweep:
        todo = len(candidates) * settings.sweep - len(run)
    else:
        todo = sum(1 for n in model_targets(candidates, run, settings) if not ok_servers(run, n)) + 2
    left = min(todo * mean, max(0.0, settings.budget_s - elapsed(state)))
    return f"about {left / 60:.0f} min left (at most {max(0.0, settings.budget_s - elapsed(state)) / 60:.0f})"


def tune(candidates: list, settings, state: dict, folder: Path, measure, warm_up, progress) -> dict:
    """Run until plan_next stops. ``measure(candidate, index, profiled) -> server entry``; ``warm_up() -> dict``
    or None to skip. KeyboardInterrupt propagates after the state is saved (the interrupted server is not kept)."""
    by_name = {c.name: c for c in candidates}
    if warm_up is not None and state.get("warmup") is None:
        progress("warm-up server (not measured): the first server on a fresh machine builds kernels and is slower")
        state["warmup"] = warm_up()
        save_state(state, folder)
    while True:
        step = plan_next(candidates, state["servers"], settings, elapsed(state), mean_server_s(state))
        if step.candidate is None:
            state["stopped"] = step.why
            break
        index = len(state["servers"]) + 1
        progress(f"server {index}: {step.candidate}{' (profiled)' if step.profiled else ''}: {step.why};"
                 f" {time_left(candidates, state, settings)}")
        entry = measure(by_name[step.candidate], index, step.profiled)
        state["servers"].append(entry)
        save_state(state, folder)
        if not entry.get("ok"):
            progress(f"server {index}: {step.candidate} FAILED ({entry.get('failure')}); it is left out, the rest go on")
    state["complete"] = True
    save_state(state, folder)
    return state
