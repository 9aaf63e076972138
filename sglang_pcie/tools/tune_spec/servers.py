"""One candidate's server, measured through bench's own machinery (start, /health, the levels' workload, stop the
tree), and the figures tune-spec keeps of it."""
from __future__ import annotations

import re
import time

from sglang_pcie.tools.bench.plan import MAY_DIFFER, Plan, Variant
from sglang_pcie.tools.bench.runs import execute_run
from sglang_pcie.tools.tune_spec import levels as level_workload

PROFILE_KEYS = ("accept_at_least", "accept_hist", "spec_steps", "spec_draft_tokens", "draft_step_ms", "phases_ms",
                "cycle_ms", "wall_cycle_ms", "accept_length", "gpu_busy", "bound")


def phase_figures(phase: dict | None, level: int, profile: dict | None) -> dict:
    """What the model reads of one level's phase of a server: the figure (c > 1: output tok/s; c = 1: one
    request's decode speed, 1000 / mean TPOT), the token counts, the accept length, each speculative request's
    [completion tokens, verifies, histogram] and the pooled per-depth acceptance (SGLang's meta info; where it has
    no histograms, the profile's, over all traffic)."""
    phase = phase or {}
    figures = {"output_tokens": phase.get("output_tokens"), "requests": phase.get("requests"),
               "accept_length": phase.get("accept_length"), "accept_at_least": phase.get("accept_at_least"),
               "requests_spec": phase.get("requests_spec"),
               "accept_source": "sglang meta info" if phase.get("accept_at_least") else None}
    if not figures["accept_at_least"] and profile and profile.get("accept_at_least"):
        figures["accept_at_least"] = profile["accept_at_least"]
        figures["accept_source"] = "eagle3 profile (all traffic)"
    if level > 1:
        figures["value"] = phase.get("output_tok_s")
    else:
        figures.update(tpot_ms_mean=phase.get("tpot_ms_mean"), tpot_ms_p50=phase.get("tpot_ms_p50"),
                       output_tok_s=phase.get("output_tok_s"))
        figures["value"] = 1e3 / figures["tpot_ms_mean"] if figures["tpot_ms_mean"] else None
    return figures


def summarise(record: dict, candidate, profiled: bool, duration_s: float, role: str = "search") -> dict:
    """The server's entry in tune-spec's state: bench's record reduced to what the search and report read.
    ``role``: "search", "proof" or "sweep" (which question the server answered)."""
    phases = (record.get("metrics") or {}).get("levels") or {}
    profile = record.get("profile") or None
    failure = record.get("failure")
    return {"candidate": candidate.name, "kind": candidate.kind, "steps": candidate.steps, "index": record["index"],
            "role": role, "profiled": profiled, "ok": bool(record.get("ok")), "duration_s": round(duration_s, 1),
            "ready_s": record.get("ready_s"), "log": record.get("log"),
            "graph_bs": level_workload.read_graph_batch_sizes(record.get("log")),
            "failure": None if not failure else failure_line(failure),
            "levels": {key: phase_figures(phase, int(key), profile) for key, phase in phases.items()},
            "profile": None if not profile else {k: profile.get(k) for k in PROFILE_KEYS}}


_ERROR_LINE = re.compile(r"^\s*[A-Za-z_.]*(Error|Exception)\b.*")


def failure_line(failure: dict) -> str:
    """bench's failure as one line, with the server log's last error line where it has one (why SGLang stopped)."""
    line = f"{failure.get('stage')}: {failure.get('message')}"
    errors = [m.group(0).strip() for m in map(_ERROR_LINE.match, (failure.get("log_tail") or "").splitlines()) if m]
    return f"{line} ({errors[-1][:300]})" if errors else line


def variant(candidate, profiled: bool = False) -> Variant:
    """The candidate as one of bench's variants: the overlay as installed, its own whole launch (the plan's common
    arguments are empty), profiled with EAGLE3_PROFILE=1 (bench puts the profile file in the run's folder)."""
    return Variant(candidate.name + ("-profiled" if profiled else ""), env={"EAGLE3_PROFILE": "1"} if profiled else {},
                   args=tuple(candidate.args), base="profile" if profiled else "overlay", tokens=MAY_DIFFER)


def measure(plan: Plan, candidate, index: int, step, sent: dict, batch_requests: int | None, progress) -> dict:
    """Start the candidate's server, drive each level of ``step.levels``, stop it. Ctrl-C propagates (bench has
    stopped the server by then). ``step``: search.Step (levels, profiled, role)."""
    run = plan.make_run(index, 1, variant(candidate, step.profiled), label=f"server {index} {candidate.name}")
    began = time.monotonic()
    record = execute_run(plan, run, sent, progress, drive=level_workload.drive(step.levels, batch_requests))
    return summarise(record, candidate, step.profiled, time.monotonic() - began, step.role)


def warm(plan: Plan, candidate, levels, sent: dict, progress) -> dict:
    """An unmeasured warm-up server of the candidate the run measures first, in ``runs/00-warmup``."""
    run = plan.warmup_run(variant(candidate))
    began = time.monotonic()
    record = execute_run(plan, run, sent, progress, drive=level_workload.warm_drive(levels))
    failure = record.get("failure")
    if failure:
        progress(f"warm-up {candidate.name} FAILED at {failure['stage']}: {failure['message']}; the measured"
                 " servers go on")
    return {"candidate": candidate.name, "ok": record.get("ok"), "ready_s": record.get("ready_s"),
            "duration_s": round(time.monotonic() - began, 1),
            "failure": None if not failure else f"{failure.get('stage')}: {failure.get('message')}",
            "log": record.get("log")}
