"""The run: a warm-up server, then one server at a time as ``search.plan_next`` says, the state saved after each
(``state.json``: a stopped run keeps every finished server, and ``--resume DIR`` continues it with the workload and
settings stored there). Where the search asks for the tuned table, it is written here, once
(``DIR/adaptive-config.json``), and becomes the candidate ``tuned``."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from sglang_pcie.tools.command import UsageError
from sglang_pcie.tools.tune_spec import table as tables
from sglang_pcie.tools.tune_spec.candidates import Candidate, tuned_candidate
from sglang_pcie.tools.tune_spec.search import measured, model_targets, ok_servers, plan_next, plan_table

SCHEMA = "sglang-pcie.tune-spec/2"
STATE = "state.json"
STATE_LIMIT = 64 * 1024 * 1024  # a state file larger than this is not one tune-spec wrote


def new_state(launch_args: list, settings, workload: dict, candidates: list, release: dict | None = None,
              options: dict | None = None) -> dict:
    return {"schema": SCHEMA, "launch_args": list(launch_args), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "settings": settings.as_dict(), "options": dict(options or {}), "workload": workload,
            "release": release or {}, "candidates": [c.as_dict() for c in candidates], "table": None,
            "warmup": None, "servers": [], "complete": False, "stopped": None}


def load_state(folder: Path) -> dict:
    path = folder / STATE
    try:
        if path.stat().st_size > STATE_LIMIT:
            raise UsageError(f"--resume {str(folder)!r}: {STATE} is over {STATE_LIMIT} bytes, not a"
                             " tune-spec state")
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
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
    """Seconds of the budget spent: every server's and the warm-up's."""
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


def make_tuned(candidates: list, settings, state: dict, folder: Path, progress) -> Candidate | None:
    """Write the table for this box and add it as the candidate ``tuned`` (once; None where the release takes no
    table or nothing was measured to make one)."""
    if any(c.kind == "tuned" for c in candidates):
        return next(c for c in candidates if c.kind == "tuned")
    proof = plan_table(candidates, state["servers"], settings)
    if proof is None or "tuned" not in proof.members:  # none, or the best fixed setting at every level
        return None
    path = tables.write_table(proof.buckets, folder, settings.default_config)
    tuned = tuned_candidate(state["launch_args"], str(path), proof.buckets)
    candidates.append(tuned)
    state["candidates"].append(tuned.as_dict())
    state["table"] = {"path": str(path), "buckets": {str(k): v for k, v in proof.buckets.items()},
                      "notes": proof.notes, "fixed": proof.fixed, "fixed_share": proof.fixed_share}
    progress(f"tuned table written to {path}: " + "; ".join(tables.bucket_ranges(proof.buckets)))
    return tuned


def tune(candidates: list, settings, state: dict, folder: Path, measure, warm_up, progress) -> dict:
    """Run until plan_next stops. ``measure(candidate, index, step) -> server entry``; ``warm_up() -> dict`` or
    None to skip. KeyboardInterrupt propagates after the state is saved (the interrupted server is not kept).
    ``candidates`` grows by ``tuned`` where the proof asks for it."""
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
        if step.candidate not in by_name:
            tuned = make_tuned(candidates, settings, state, folder, progress)
            if tuned is None or tuned.name != step.candidate:
                raise RuntimeError(f"the search asked for {step.candidate!r}, which no candidate is")
            by_name[tuned.name] = tuned
            save_state(state, folder)
        index = len(state["servers"]) + 1
        progress(f"server {index}: {step.candidate}{' (profiled)' if step.profiled else ''} [{step.role}]:"
                 f" {step.why}; {time_left(candidates, state, settings)}")
        entry = measure(by_name[step.candidate], index, step)
        state["servers"].append(entry)
        save_state(state, folder)
        if not entry.get("ok"):
            progress(f"server {index}: {step.candidate} FAILED ({entry.get('failure')}); it is left out, the rest go on")
    if not settings.sweep:
        make_tuned(candidates, settings, state, folder, progress)  # written even where no proof measured it
    state["complete"] = True
    save_state(state, folder)
    return state


def restore_candidates(state: dict) -> list[Candidate]:
    return [Candidate.from_dict(d) for d in state["candidates"]]
