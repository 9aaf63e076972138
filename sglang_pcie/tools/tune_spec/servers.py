"""One candidate's server, measured through bench's own machinery (start, /health, the workload, stop the tree),
and the figures tune-spec keeps of it."""
from __future__ import annotations

import time

from sglang_pcie.tools.bench.plan import MAY_DIFFER, Plan, Variant
from sglang_pcie.tools.bench.runs import execute_run, warm_up

PROFILE_KEYS = ("accept_at_least", "accept_hist", "spec_steps", "spec_draft_tokens", "draft_step_ms", "phases_ms",
                "cycle_ms", "wall_cycle_ms", "accept_length", "gpu_busy", "bound")


def phase_figures(phase: dict | None, workload: str, profile: dict | None) -> dict:
    """What the model reads of one phase of bench's metrics: the workload's figure (batch: output tok/s; one
    request: 1000 / mean TPOT, its decode speed), the token counts, the accept length, each speculative request's
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
    if workload == "batch":
        figures["value"] = phase.get("output_tok_s")
    else:
        figures.update(tpot_ms_mean=phase.get("tpot_ms_mean"), tpot_ms_p50=phase.get("tpot_ms_p50"),
                       output_tok_s=phase.get("output_tok_s"))
        figures["value"] = 1e3 / figures["tpot_ms_mean"] if figures["tpot_ms_mean"] else None
    return figures


def summarise(record: dict, candidate, profiled: bool, duration_s: float) -> dict:
    """The server's entry in tune-spec's state: bench's record reduced to what the search and report read."""
    metrics = record.get("metrics") or {}
    profile = record.get("profile") or None
    failure = record.get("failure")
    return {"candidate": candidate.name, "kind": candidate.kind, "steps": candidate.steps, "index": record["index"],
            "profiled": profiled, "ok": bool(record.get("ok")), "duration_s": round(duration_s, 1),
            "ready_s": record.get("ready_s"), "log": record.get("log"),
            "failure": None if not failure else f"{failure.get('stage')}: {failure.get('message')}",
            "batch": phase_figures(metrics.get("batch"), "batch", profile),
            "latency": phase_figures(metrics.get("stream"), "latency", profile),
            "profile": None if not profile else {k: profile.get(k) for k in PROFILE_KEYS}}


def variant(candidate, profiled: bool = False) -> Variant:
    """The candidate as one of bench's variants: the overlay as installed, its own whole launch (the plan's common
    arguments are empty), profiled with EAGLE3_PROFILE=1 (bench puts the profile file in the run's folder)."""
    return Variant(candidate.name + ("-profiled" if profiled else ""), env={"EAGLE3_PROFILE": "1"} if profiled else {},
                   args=tuple(candidate.args), base="profile" if profiled else "overlay", tokens=MAY_DIFFER)


def measure(plan: Plan, candidate, index: int, profiled: bool, prompts: dict, progress) -> dict:
    """Start the candidate's server, drive bench's workload, stop it. Ctrl-C propagates (bench has stopped the
    server by then)."""
    run = plan.make_run(index, 1, variant(candidate, profiled), label=f"server {index} {candidate.name}")
    began = time.monotonic()
    record = execute_run(plan, run, prompts, progress)
    return summarise(record, candidate, profiled, time.monotonic() - began)


def warm(plan: Plan, candidate, prompts: dict, progress) -> dict:
    """bench's unmeasured warm-up server, of the candidate the run measures first."""
    summary = warm_up(plan, prompts, progress, variant=variant(candidate))
    return {"candidate": candidate.name, "ok": summary.get("ok"), "ready_s": summary.get("ready_s"),
            "duration_s": summary.get("wall_s"), "failure": summary.get("failure"), "log": summary.get("log")}
