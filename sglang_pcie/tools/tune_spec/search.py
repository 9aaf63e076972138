"""Which server to start next, and what the servers so far say: a pure function of the servers measured, so that a
stopped run resumes where it was (``--resume``) and the tests drive it with a fake measurement.

Every server measures every concurrency level. In order:

1. Model: the deepest chain and a second chain (the user's own where it is a chain, else about half as deep)
   (profiled with ``--profile``) and no speculation. A server that fails takes its candidate out (named); the
   model then takes the next chain.
2. Leaders: at each level, the candidate ranked first (measured median where measured, else the model's
   prediction) is measured while it is predicted more than ``resolve`` above the best measured figure. Then what
   the model cannot predict: the user's setting where it is no chain, a table the user gave, and SGLang's adaptive steps where no
   proof will measure them. Then a chain predicted within ``resolve`` of the best measured figure. The model
   only chooses what to measure: the answer is always a measured candidate, and a candidate left unmeasured is
   named beside it.
3. Proof, where the release runs adaptive steps from a table by batch size: the table for this box (table.py,
   from the servers of steps 1-2 only, so it stays the same while it is proven), SGLang's own table and the best
   fixed setting, in counterbalanced repeats (T D F, F D T, ...), each repeat started only where all of it fits
   the budget; these servers also measure where the table switches buckets (levels.edge_levels: with the CUDA-graph
   sizes the search's servers logged, the smallest batch each bucket serves after SGLang pads it).
4. Confirm: at each level, the two best measured candidates are repeated in counterbalanced order (A B B A ...)
   until the leader's lead is resolved at ``resolve``, or they are resolved equal within it, or the budget ends,
   or the spread measured so far says the budget cannot resolve it.

Verdicts compare two candidates on their pairs (the i-th server of each), as bench does: a Student-t interval of
the pairs' log ratios, widened by the noise band (how far servers of one candidate landed from their median in
this run). A winner is called only when that interval clears the band; "within" only when it lies inside
+-resolve. Step 4's interval is 99%, not bench's 95%: the search looks again after every pair and stops at the
first answer (benchmarks/results/2026-12-03-cpu/tune_spec_false_calls.txt). The proof is a fixed design (its
repeats are set before it starts): 95%.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from sglang_pcie.tools.bench.verdicts import t_quantile
from sglang_pcie.tools.tune_spec import table as tables
from sglang_pcie.tools.tune_spec.candidates import NONE
from sglang_pcie.tools.tune_spec.levels import edge_levels
from sglang_pcie.tools.tune_spec.model import Model, log_interval

CONFIDENCE = 0.99  # step 4: repeated looks
PROOF_CONFIDENCE = 0.95  # step 3: a fixed design
MAX_PAIRS = 50
SEARCH_ROLES = ("model", "leader")  # the servers the tuned table is made from


@dataclass
class Settings:
    levels: tuple  # concurrencies, ascending; 1 is one streamed request at a time
    resolve: float  # 0.02
    budget_s: float
    max_steps: int
    current: str  # the candidate that is the user's setting
    max_servers: int | None = None  # measured servers at most (the warm-up not counted)
    sweep: int = 0  # > 0: no model, every candidate this many times in counterbalanced order (a reference)
    profile: bool = False  # EAGLE3_PROFILE=1 in the model's two chain servers (their phase costs, for the report)
    prove: int = 2  # repeats of the proof (0: none)
    edges: bool = True  # proof servers also measure just below each bucket's edge
    per_batch: bool = False  # the release runs adaptive steps from a table by batch size
    zero_steps: bool = False  # ... and a bucket may hold step 0
    default_config: dict = field(default_factory=dict)  # ... and its own table: bucket -> entry (release.py)

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        data = {k: tuple(v) if k == "levels" else v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["default_config"] = {int(k): dict(v) for k, v in (data.get("default_config") or {}).items()}
        return cls(**data)


@dataclass
class Step:
    candidate: str | None  # the next server's candidate, or None to stop
    profiled: bool = False
    why: str = ""
    role: str = "model"  # model | leader | proof | confirm | sweep
    levels: tuple = field(default_factory=tuple)


def ok_servers(servers: list[dict], name: str) -> list[dict]:
    return [s for s in servers if s["candidate"] == name and s.get("ok")]


def failed(servers: list[dict]) -> set:
    return {s["candidate"] for s in servers if not s.get("ok") and not s.get("warmup")}


def measured(servers: list[dict]) -> list[dict]:
    return [s for s in servers if not s.get("warmup")]


def values(servers: list[dict], name: str, level: int) -> list[float]:
    found = ((s.get("levels") or {}).get(str(level)) or {} for s in ok_servers(servers, name))
    return [f["value"] for f in found if f.get("value")]


def medians(servers: list[dict], levels) -> dict:
    """level -> candidate -> median figure, over the candidates measured at that level."""
    names = dict.fromkeys(s["candidate"] for s in servers)
    return {c: {n: statistics.median(v) for n in names if (v := values(servers, n, c))} for c in levels}


def models(servers: list[dict], levels) -> dict:
    chains = [s for s in servers if s.get("ok") and s.get("steps") is not None and s.get("kind") == "chain"]
    nones = ok_servers(servers, NONE)
    return {c: Model(c, chains, nones) for c in levels}


def model_targets(candidates: list, servers: list[dict], settings: Settings) -> list[str]:
    """The candidates the model needs measured, in order: deepest chain (profiled), a second chain, none, then
    what it cannot predict (the user's own where it is no chain, a given table, SGLang's adaptive steps where no
    proof measures them); failed candidates skipped (the next chain stands in)."""
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
    for name in [NONE, settings.current, *unpredicted_targets(candidates, settings)]:
        if any(c.name == name for c in candidates) and name not in out and name not in targets:
            targets.append(name)
    return targets


def unpredicted_targets(candidates: list, settings: Settings) -> list[str]:
    """The model's targets it cannot predict (the user's setting where it is no chain, a given table, SGLang's
    adaptive steps where no proof measures them): measured after the chains predicted above the best measured
    figure and before those predicted just below it (``plan_next``)."""
    return [c.name for c in candidates if c.kind in ("current", "table")
            or c.kind == "adaptive" and not proof_possible(settings)]


def estimates(candidates: list, servers: list[dict], level: int, model: Model) -> dict:
    """candidate -> (figure, 'measured' | 'predicted') at a level, for the candidates that have one."""
    out = failed(servers)
    found = {}
    for c in candidates:
        if c.name in out:
            continue
        got = values(servers, c.name, level)
        if got:
            found[c.name] = (statistics.median(got), "measured")
        elif c.modelled and model.predict(c.steps) is not None:
            found[c.name] = (model.predict(c.steps), "predicted")
    return found


def best_measured(servers: list[dict], names, level: int) -> list[str]:
    """The measured candidates at a level, best median first."""
    got = {n: statistics.median(v) for n in names if (v := values(servers, n, level))}
    return sorted(got, key=lambda n: -got[n])


def unmeasured_leader(candidates, servers, level, model, resolve, clear: bool = False) -> str | None:
    """The candidate predicted first at a level while it is unmeasured, or one predicted within ``resolve`` of
    the best measured figure; None where the level's leader is measured. ``clear``: only a prediction more than
    ``resolve`` above the best measured figure (a lead the model's own error does not cover)."""
    ranked = sorted(estimates(candidates, servers, level, model).items(), key=lambda kv: -kv[1][0])
    best = next((v for _, (v, how) in ranked if how == "measured"), None)
    for name, (value, how) in ranked:
        if how != "predicted":
            continue
        if best is None or (value > best * (1 + resolve) if clear else value >= best / (1 + resolve)):
            return name
    return None


def noise_margin(servers: list[dict], level: int) -> float:
    """The widest log distance of a server from its candidate's median, over candidates with two or more."""
    margin = 0.0
    for name in {s["candidate"] for s in servers}:
        got = values(servers, name, level)
        if len(got) >= 2:
            middle = statistics.median(got)
            margin = max(margin, max(abs(math.log(v / middle)) for v in got))
    return margin


def drift(servers: list[dict], level: int, resolve: float, levels: int = 1) -> dict | None:
    """Whether servers ran faster or slower as the run went on, whatever their candidate: for each candidate with
    two servers or more at ``level``, its last server's figure over its first (servers in the order they ran), and
    the t interval of the mean log change over the candidates (three at least; None under three). Pairs in
    counterbalanced order cancel a steady drift out of a comparison, not a step in the middle of the run; the
    drift is ``resolved`` where the interval excludes no change and the mean change is ``resolve`` or more (one
    H200, 2026-12-07: every candidate's later server ran 9-32% below its first at one request). The interval is at
    1 - 5% / ``levels`` (the levels one run judges), so that on a host that does not drift a run names a drift at
    any of its levels at most 5% of the time (benchmarks/results/2026-12-07-cpu/tune_spec_drift_rates.txt)."""
    changes = {}
    for name in dict.fromkeys(s["candidate"] for s in servers):
        got = values(servers, name, level)
        if len(got) >= 2:
            changes[name] = got[-1] / got[0]
    if len(changes) < 3:
        return None
    mean = statistics.fmean(math.log(c) for c in changes.values())
    confidence = 1 - (1 - PROOF_CONFIDENCE) / max(1, levels)
    low, high = log_interval(list(changes.values()), t_quantile, confidence)
    resolved = (low > 1 or high < 1) and abs(mean) >= math.log1p(resolve)
    return {"candidates": len(changes), "change": math.exp(mean) - 1, "confidence": confidence,
            "interval": [low - 1, high - 1],
            "smallest": min(changes.values()) - 1, "largest": max(changes.values()) - 1, "resolved": resolved}


def compare(servers: list[dict], level: int, leader: str, runner: str, resolve: float,
            confidence: float = CONFIDENCE) -> dict:
    """The leader over the runner-up on their pairs: ratio, interval, the noise band and the verdict
    ('best', 'within', 'open', 'noise floor', 'at the band')."""
    a, b = values(servers, leader, level), values(servers, runner, level)
    ratios = [x / y for x, y in zip(a, b)]
    margin = noise_margin(servers, level)
    row = {"leader": leader, "runner_up": runner, "pairs": len(ratios), "ratios": ratios,
           "median": statistics.median(ratios) if ratios else None, "interval": None,
           "noise_margin": math.exp(margin) - 1, "verdict": "open", "pairs_needed": None,
           "confidence": confidence}
    if len(ratios) < 2:
        return row
    logs = [math.log(r) for r in ratios]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = t_quantile(confidence, len(logs) - 1) * sd / math.sqrt(len(logs))
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
            row["pairs_needed"] = pairs_needed(sd, room, confidence)
    return row


def pairs_needed(sd: float, room: float, confidence: float = CONFIDENCE) -> int | None:
    """The pairs whose interval's half-width would fit in ``room`` at this spread (None: more than MAX_PAIRS)."""
    if sd == 0:
        return 2
    for n in range(2, MAX_PAIRS + 1):
        if t_quantile(confidence, n - 1) * sd / math.sqrt(n) <= room:
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


# ------------------------------------------------------------------------------------------------------ proof

def proof_possible(settings: Settings) -> bool:
    return bool(settings.prove and settings.per_batch and not settings.sweep)


@dataclass
class Proof:
    buckets: dict  # the tuned table: level -> [steps]
    notes: list
    fixed: str | None  # the best fixed setting
    fixed_share: float | None  # its geometric mean share of each level's best
    members: list  # the proof's candidates, in the first repeat's order: tuned (where it differs), adaptive, fixed
    levels: tuple  # what proof servers measure


def graph_sizes(servers: list[dict]) -> list[int] | None:
    """The decode CUDA-graph sizes the first server that logged them captured (the launch is the same in all)."""
    return next((s["graph_bs"] for s in servers if s.get("graph_bs") is not None), None)


def plan_table(candidates: list, servers: list[dict], settings: Settings) -> Proof | None:
    """The table for this box from the search's servers (steps 1-2), with the best fixed setting and who a proof
    would compare; None where the release has no tables by batch size, in a sweep, or where no fixed setting was
    measured at every level."""
    if not settings.per_batch or settings.sweep:
        return None
    search = [s for s in measured(servers) if s.get("role") in SEARCH_ROLES]
    figures = medians(search, settings.levels)
    graph_bs = graph_sizes(search)
    buckets, notes = tables.tuned_buckets(candidates, figures, settings.default_config, graph_bs)
    fixed, share = tables.best_fixed(candidates, figures)
    if fixed is None or not buckets:
        return None
    steps_of_fixed = next(c.fixed_steps for c in candidates if c.name == fixed)
    # the table would run the best fixed setting everywhere, or SGLang's own table at every measured level
    same = (tables.uniform(buckets) == steps_of_fixed
            or tables.copies_default(buckets, settings.default_config, graph_bs))
    members = ["adaptive", fixed] if same else ["tuned", "adaptive", fixed]
    edges = edge_levels(settings.levels, graph_bs) if settings.edges else ()
    levels = tuple(sorted(set(settings.levels) | set(edges)))
    return Proof(buckets, notes, fixed, share, members, levels)


def plan_proof(candidates: list, servers: list[dict], settings: Settings) -> Proof | None:
    """The proof the search servers call for (None where none can run: the release, --prove 0, no fixed setting
    measured at every level, SGLang's own table missing)."""
    if not proof_possible(settings) or not any(c.kind == "adaptive" for c in candidates):
        return None
    return plan_table(candidates, servers, settings)


def _proof_step(proof: Proof, run: list[dict], settings: Settings, elapsed_s: float,
                mean_server_s: float | None) -> Step | None:
    done = [s for s in run if s.get("role") == "proof"]
    if any(not s.get("ok") for s in done):
        return None  # a member failed: the proof is abandoned (the report names it)
    order = sweep_order(proof.members, settings.prove)
    if len(done) >= len(order):
        return None
    if len(done) % len(proof.members) == 0:  # a new repeat: only where all of it fits
        more = len(proof.members)
        if settings.max_servers is not None and len(run) + more > settings.max_servers:
            return None
        if mean_server_s is not None and elapsed_s + more * mean_server_s > settings.budget_s:
            return None
    return Step(order[len(done)], role="proof", levels=proof.levels,
                why=f"the proof, repeat {len(done) // len(proof.members) + 1} of {settings.prove}")


# ------------------------------------------------------------------------------------------------ next server

def _limits(run: list[dict], settings: Settings, elapsed_s: float, mean_server_s: float | None) -> str | None:
    if settings.max_servers is not None and len(run) >= settings.max_servers:
        return f"the server limit ({settings.max_servers}) is reached"
    if mean_server_s is not None and elapsed_s + mean_server_s > settings.budget_s:
        return (f"another server (about {mean_server_s / 60:.1f} min) would pass the budget of"
                f" {settings.budget_s / 60:g} min")
    return None


def plan_next(candidates: list, servers: list[dict], settings: Settings, elapsed_s: float,
              mean_server_s: float | None) -> Step:
    """The next server, or why the run stops."""
    run = measured(servers)
    stop = _limits(run, settings, elapsed_s, mean_server_s)
    if stop:
        return Step(None, why=stop)
    if settings.sweep:
        order = sweep_order([c.name for c in candidates], settings.sweep)
        if len(run) < len(order):
            return Step(order[len(run)], role="sweep", levels=settings.levels,
                        why=f"sweep, {len(run) + 1} of {len(order)}")
        return Step(None, why=f"the sweep is complete ({len(order)} servers)")
    targets = model_targets(candidates, run, settings)
    later = set(unpredicted_targets(candidates, settings))
    for position, name in enumerate(targets):
        if name not in later and not ok_servers(run, name):
            return Step(name, profiled=settings.profile and position < 2 and name.startswith("chain-"),
                        why="the model needs it", role="model", levels=settings.levels)
    # A chain predicted more than --resolve above the best measured figure comes first: if the prediction holds, it
    # is the answer. Then what the model cannot predict (its lead is not bounded by the model's error), then chains
    # predicted within --resolve of the best measured (they change the answer by about the model's own error:
    # measured/predicted 0.974-1.007 on one H100). There the search measured chain-5, predicted 0.7% above the
    # measured chain-7 (and then measured 2.9% below it), instead of SGLang's adaptive table, which then led c=1 by
    # 7.3% (benchmarks/results/2026-12-06-h100/tune-spec/NOTE.txt).
    fitted = models(run, settings.levels)
    for level in settings.levels:
        name = unmeasured_leader(candidates, run, level, fitted[level], settings.resolve, clear=True)
        if name is not None:
            return Step(name, role="leader", levels=settings.levels,
                        why=f"predicted to lead {level_name(level)}; the answer must be measured")
    for name in targets:
        if name in later and not ok_servers(run, name):
            return Step(name, why="the model cannot predict it", role="model", levels=settings.levels)
    for level in settings.levels:
        name = unmeasured_leader(candidates, run, level, fitted[level], settings.resolve)
        if name is not None:
            return Step(name, role="leader", levels=settings.levels,
                        why=f"predicted within {settings.resolve * 100:g}% of the best measured at "
                            f"{level_name(level)}; measured to tell")
    proof = plan_proof(candidates, run, settings)
    step = _proof_step(proof, run, settings, elapsed_s, mean_server_s) if proof else None
    if step is not None:
        return step
    return _confirm_step(candidates, run, settings, elapsed_s, mean_server_s)


def level_name(level: int) -> str:
    return "one request (c=1)" if level == 1 else f"c={level}"


def _confirm_step(candidates, run, settings, elapsed_s, mean_server_s) -> Step:
    names = [c.name for c in candidates if c.kind != "tuned"]
    for level in settings.levels:
        top = best_measured(run, names, level)[:2]
        if len(top) < 2:
            continue
        row = compare(run, level, top[0], top[1], settings.resolve)
        if row["verdict"] != "open":
            continue
        if row["pairs_needed"] is None and row["pairs"] >= 2:
            continue  # beyond MAX_PAIRS at this spread: the report says so
        if row["pairs_needed"] is not None and mean_server_s is not None:
            more = 2 * (row["pairs_needed"] - row["pairs"])
            if elapsed_s + more * mean_server_s > settings.budget_s:
                continue  # the budget cannot resolve it: stop asking, say so
        return Step(next_of_pair(run, top[0], top[1]), role="confirm", levels=settings.levels,
                    why=f"{top[0]} against {top[1]} at {level_name(level)}: not resolved yet")
    return Step(None, why="every level's question is answered, or cannot be within the budget")
