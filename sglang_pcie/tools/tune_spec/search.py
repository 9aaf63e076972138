"""Which server to start next, and what the servers so far say: a pure function of the servers measured, so that a
stopped run resumes where it was (``--resume``) and the tests drive it with a fake measurement.

1. Model: the deepest chain and a second chain (the user's own where it is a chain, else about half as deep)
   (profiled with ``--profile``), and no speculation; the user's setting where it is not a chain. A server that fails takes its
   candidate out (named); the model then takes the next chain.
2. Per workload, the leader and the runner-up (measured medians where measured, else the model's prediction) are
   measured, then repeated in counterbalanced order (A B B A ...) until the leader's lead is resolved at
   ``resolve``, or the candidates are resolved equal within it, or the budget ends, or the spread measured so far
   says the budget cannot resolve it.

Verdicts compare the two on pairs (the i-th server of each), as bench does: a Student-t interval of the pairs' log
ratios, widened by the noise band (how far servers of one candidate landed from their median in this run). A
winner is called only when that interval clears the band; "within" only when it lies inside +-resolve. The interval
is 99%, not bench's 95%: the search looks again after every pair and stops at the first answer. Against the known
cost model (benchmarks/tune_spec_false_calls.py, 1000 comparisons a row) two equal candidates got a winner called
in 4 (1% server noise) and 7 (3%) of 1000; a 10% lead was called in 999 and 297, a 5% lead in 750 and 57, within
a 20-minute budget of 60 s servers (benchmarks/results/2026-12-03-cpu/tune_spec_false_calls.txt).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from sglang_pcie.tools.bench.verdicts import t_quantile
from sglang_pcie.tools.tune_spec.candidates import NONE
from sglang_pcie.tools.tune_spec.model import LABELS, Model

CONFIDENCE = 0.99  # see the module docstring: repeated looks
MAX_PAIRS = 50


@dataclass
class Settings:
    workloads: tuple  # ("batch",), ("latency",) or both
    resolve: float  # 0.02
    budget_s: float
    max_steps: int
    current: str  # the candidate that is the user's setting
    max_servers: int | None = None  # measured servers at most (the warm-up not counted)
    sweep: int = 0  # > 0: no model, every candidate this many times in counterbalanced order (a reference)
    profile: bool = False  # EAGLE3_PROFILE=1 in the model's two chain servers (their phase costs, for the report)


def ok_servers(servers: list[dict], name: str) -> list[dict]:
    return [s for s in servers if s["candidate"] == name and s.get("ok")]


def failed(servers: list[dict]) -> set:
    return {s["candidate"] for s in servers if not s.get("ok") and not s.get("warmup")}


def measured(servers: list[dict]) -> list[dict]:
    return [s for s in servers if not s.get("warmup")]


def values(servers: list[dict], name: str, workload: str) -> list[float]:
    return [s[workload]["value"] for s in ok_servers(servers, name) if s[workload].get("value")]


def models(candidates: list, servers: list[dict], workloads) -> dict:
    chains = [s for s in servers if s.get("ok") and s.get("steps") is not None and s.get("kind") == "chain"]
    nones = ok_servers(servers, NONE)
    return {w: Model(w, chains, nones) for w in workloads}


def model_targets(candidates: list, servers: list[dict], settings: Settings) -> list[str]:
    """The candidates the model needs measured, in order: deepest chain (profiled), a second chain, none, the user's
    own where it is no chain; failed candidates skipped (the next chain stands in)."""
    out = failed(servers)
    chains = [c for c in candidates if c.kind == "chain" and c.name not in out]
    targets = []
    if chains:
        deepest = chains[-1]
        targets.append(deepest.name)
        rest = [c for c in chains if c is not deepest]
        mine = [c for c in rest if c.name == settings.current]
        half = sorted(rest, key=lambda c: (abs(c.steps - (deepest.steps + 1) // 2), c.steps))
        if mine or half:
            targets.append((mine or half)[0].name)
    names = {c.name for c in candidates}
    for name in (NONE, settings.current):
        if name in names and name not in out and name not in targets:
            targets.append(name)
    return targets


def estimates(candidates: list, servers: list[dict], workload: str, model: Model) -> dict:
    """candidate -> (figure, 'measured' | 'predicted'), for the candidates that have one."""
    out = failed(servers)
    found = {}
    for c in candidates:
        if c.name in out:
            continue
        got = values(servers, c.name, workload)
        if got:
            found[c.name] = (statistics.median(got), "measured")
        elif c.modelled and model.predict(c.steps) is not None:
            found[c.name] = (model.predict(c.steps), "predicted")
    return found


def leaders(candidates, servers, workload, model) -> list[str]:
    ranked = sorted(estimates(candidates, servers, workload, model).items(), key=lambda kv: -kv[1][0])
    return [name for name, _ in ranked[:2]]


def noise_margin(servers: list[dict], workload: str) -> float:
    """The widest log distance of a server from its candidate's median, over candidates with two or more."""
    margin = 0.0
    for name in {s["candidate"] for s in servers}:
        got = values(servers, name, workload)
        if len(got) >= 2:
            middle = statistics.median(got)
            margin = max(margin, max(abs(math.log(v / middle)) for v in got))
    return margin


def compare(servers: list[dict], workload: str, leader: str, runner: str, resolve: float) -> dict:
    """The leader over the runner-up on their pairs: ratio, interval, the noise band and the verdict
    ('best', 'within', or 'open')."""
    a, b = values(servers, leader, workload), values(servers, runner, workload)
    ratios = [x / y for x, y in zip(a, b)]
    margin = noise_margin(servers, workload)
    row = {"leader": leader, "runner_up": runner, "pairs": len(ratios), "ratios": ratios,
           "median": statistics.median(ratios) if ratios else None, "interval": None,
           "noise_margin": math.exp(margin) - 1, "verdict": "open", "pairs_needed": None}
    if len(ratios) < 2:
        return row
    logs = [math.log(r) for r in ratios]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = t_quantile(CONFIDENCE, len(logs) - 1) * sd / math.sqrt(len(logs))
    row["interval"] = [math.exp(mean - half), math.exp(mean + half)]
    target = math.log1p(resolve)
    if mean - half > margin:
        row["verdict"] = "best"
    elif abs(mean) + half + margin <= target:
        row["verdict"] = "within"
    else:
        # the half-width that would settle it: a lead clearing the band, or equality within the target
        room = max(mean - margin, target - margin - abs(mean))
        if room <= 0:
            row["verdict"] = "noise floor" if margin >= target else "at the band"
        else:
            row["pairs_needed"] = pairs_needed(sd, room)
    return row


def pairs_needed(sd: float, room: float) -> int | None:
    """The pairs whose interval's half-width would fit in ``room`` at this spread (None: more than MAX_PAIRS)."""
    if sd == 0:
        return 2
    for n in range(2, MAX_PAIRS + 1):
        if t_quantile(CONFIDENCE, n - 1) * sd / math.sqrt(n) <= room:
            return n
    return None


def next_of_pair(servers: list[dict], leader: str, runner: str) -> str:
    """Counterbalanced: the one with fewer servers; at a tie the one that ran last (A B, B A, A B, ...)."""
    na, nb = len(ok_servers(servers, leader)), len(ok_servers(servers, runner))
    if na != nb:
        return leader if na < nb else runner
    order = [s["candidate"] for s in servers if s["candidate"] in (leader, runner) and s.get("ok")]
    return order[-1] if order else leader


def sweep_order(names: list[str], repeats: int) -> list[str]:
    """Every candidate ``repeats`` times: A B C, C B A, A B C, ... (a drift hits every candidate alike)."""
    order = []
    for repeat in range(repeats):
        order.extend(names if repeat % 2 == 0 else list(reversed(names)))
    return order


@dataclass
class Step:
    candidate: str | None  # the next server's candidate, or None to stop
    profiled: bool = False
    why: str = ""


def plan_next(candidates: list, servers: list[dict], settings: Settings, elapsed_s: float,
              mean_server_s: float | None) -> Step:
    """The next server, or why the run stops."""
    run = measured(servers)
    if settings.max_servers is not None and len(run) >= settings.max_servers:
        return Step(None, why=f"the server limit ({settings.max_servers}) is reached")
    if mean_server_s is not None and elapsed_s + mean_server_s > settings.budget_s:
        return Step(None, why=f"another server (about {mean_server_s / 60:.1f} min) would pass the budget"
                              f" of {settings.budget_s / 60:.0f} min")
    if settings.sweep:
        order = sweep_order([c.name for c in candidates], settings.sweep)
        if len(run) < len(order):
            return Step(order[len(run)], why=f"sweep, {len(run) + 1} of {len(order)}")
        return Step(None, why=f"the sweep is complete ({len(order)} servers)")
    targets = model_targets(candidates, run, settings)
    for position, name in enumerate(targets):
        if not ok_servers(run, name):
            return Step(name, profiled=settings.profile and position < 2 and name.startswith("chain-"),
                        why="the model needs it")
    fitted = models(candidates, run, settings.workloads)
    tops = {w: leaders(candidates, run, w, fitted[w]) for w in settings.workloads}
    for workload, top in tops.items():  # every workload's two leaders measured before any pair is repeated
        for name in top:
            if not ok_servers(run, name):
                return Step(name, why=f"a leading candidate for {LABELS[workload]} (predicted)")
    for workload, top in tops.items():
        if len(top) < 2:
            continue
        row = compare(run, workload, top[0], top[1], settings.resolve)
        if row["verdict"] != "open":
            continue
        if row["pairs_needed"] is None and row["pairs"] >= 2:
            continue  # beyond MAX_PAIRS at this spread: the report says so
        if row["pairs_needed"] is not None and mean_server_s is not None:
            more = 2 * (row["pairs_needed"] - row["pairs"])
            if elapsed_s + more * mean_server_s > settings.budget_s:
                continue  # the budget cannot resolve it: stop asking, say so
        return Step(next_of_pair(run, top[0], top[1]),
                    why=f"{top[0]} against {top[1]} on {LABELS[workload]}: not resolved yet")
    return Step(None, why="every workload's question is answered, or cannot be within the budget")
