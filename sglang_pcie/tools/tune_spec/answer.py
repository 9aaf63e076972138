"""The one setting to launch, and why: from the proof where it ran, else from the measured figures.

* With a proof (the tuned table, SGLang's own table and the best fixed setting, in counterbalanced repeats): each
  pair of members is compared at every level the proof measured (bench's rule at 95%: an effect only where the
  interval of the pairs' ratios clears the noise band). The pick starts at the simplest member (the best fixed
  setting), then SGLang's own table, then the tuned table: a less simple member replaces the pick only where it
  was resolved higher than the pick at some level and lower than no member at any level. A table that resolves
  nothing over a fixed chain is not worth its file.
* Without a proof (a release without tables by batch size, ``--prove 0``, or a budget that left no room): the
  measured candidate whose figures, each as a share of the best measured at its level, have the highest geometric
  mean; on one level, that level's answer (which keeps the user's setting where it is within ``resolve`` of the best).
"""
from __future__ import annotations

import math
import shlex
from itertools import combinations

from sglang_pcie.tools.tune_spec.search import (PROOF_CONFIDENCE, compare, medians, plan_proof)

SIMPLEST_FIRST = {"none": 0, "chain": 0, "current": 1, "adaptive": 2, "table": 3, "tuned": 4}


def paired(servers: list[dict], level: int, a: str, b: str, resolve: float) -> dict:
    """a over b on the proof's pairs at one level: 'higher', 'lower', 'within +-resolve' or 'cannot tell', with
    the median ratio and its 95% interval (n pairs; an effect is called only where the interval clears the noise
    band of the proof's own servers)."""
    row = compare(servers, level, a, b, resolve, PROOF_CONFIDENCE)
    if row["verdict"] == "best":
        word = "higher"
    elif compare(servers, level, b, a, resolve, PROOF_CONFIDENCE)["verdict"] == "best":
        word = "lower"
    elif row["verdict"] == "within":
        word = f"within +-{resolve * 100:g}%"
    else:
        word = "cannot tell"
    return {"a": a, "b": b, "pairs": row["pairs"], "median": row["median"], "interval": row["interval"],
            "noise_margin": row["noise_margin"], "verdict": word}


def analyse_proof(candidates: list, run: list[dict], settings) -> dict | None:
    """Every pair of the proof's members compared at every level the proof measured (None: no proof planned)."""
    plan = plan_proof(candidates, run, settings)
    if plan is None:
        return None
    proof = [s for s in run if s.get("role") == "proof"]
    repeats = min(sum(1 for s in proof if s.get("ok") and s["candidate"] == m) for m in plan.members)
    rows = {str(level): [paired(proof, level, a, b, settings.resolve) for a, b in combinations(plan.members, 2)]
            for level in plan.levels}
    return {"members": plan.members, "buckets": {str(k): v for k, v in plan.buckets.items()}, "notes": plan.notes,
            "fixed": plan.fixed, "fixed_share": plan.fixed_share, "levels": list(plan.levels),
            "main_levels": list(settings.levels),
            "repeats_run": repeats, "repeats_planned": settings.prove,
            "failed": sorted({s["candidate"] for s in proof if not s.get("ok")}), "rows": rows}


def outcomes(proof: dict) -> dict:
    """member -> (levels where it was resolved lower than another member, levels where higher)."""
    lower = {m: [] for m in proof["members"]}
    higher = {m: [] for m in proof["members"]}
    for level, rows in proof["rows"].items():
        for row in rows:
            if row["verdict"] in ("higher", "lower"):
                up, down = (row["a"], row["b"]) if row["verdict"] == "higher" else (row["b"], row["a"])
                higher[up].append(level)
                lower[down].append(level)
    return {m: (lower[m], higher[m]) for m in proof["members"]}


def geometric_best(candidates: list, run: list[dict], levels) -> tuple[str | None, float | None]:
    """The candidate measured at every level with the highest geometric mean of its share of each level's best."""
    rows = medians(run, levels)
    present = [row for row in rows.values() if row]
    if not present:
        return None, None
    common = set.intersection(*(set(row) for row in present))
    kinds = {c.name: c.kind for c in candidates}
    scores = {n: math.exp(sum(math.log(row[n] / max(row.values())) for row in present) / len(present))
              for n in common}
    if not scores:
        return None, None
    best = max(sorted(scores, key=lambda n: SIMPLEST_FIRST.get(kinds.get(n), 9)), key=lambda n: scores[n])
    return best, scores[best]


def recommend(candidates: list, run: list[dict], settings, analysis: dict) -> dict:
    """{"candidate", "why", "launch"} (candidate None where nothing was measured)."""
    proof = analysis.get("proof")
    if proof and proof["repeats_run"] >= 1 and not proof["failed"]:
        return _launch(candidates, *proven_pick(candidates, proof))
    if len(settings.levels) == 1:
        answer = analysis["levels"][str(settings.levels[0])]["answer"]
        return _launch(candidates, answer, "the best measured candidate at the one level measured")
    pick, share = geometric_best(candidates, run, settings.levels)
    why = (f"no proof ran; the measured candidate closest to each level's best (geometric mean"
           f" {share:.3f} of the best per level)" if pick else "no candidate was measured at every level")
    return _launch(candidates, pick, why)


def proven_pick(candidates: list, proof: dict) -> tuple[str, str]:
    """The simplest member first (the best fixed setting); a less simple one replaces it only where the proof
    resolved it higher than the pick at some level and lower than no member at any level."""
    kinds = {c.name: c.kind for c in candidates}
    result = outcomes(proof)
    ordered = sorted(proof["members"], key=lambda m: SIMPLEST_FIRST.get(kinds.get(m), 9))
    pick, why = ordered[0], ""
    for member in ordered[1:]:
        over = [level for level, rows in proof["rows"].items() for row in rows
                if {row["a"], row["b"]} == {member, pick}
                and row["verdict"] == ("higher" if row["a"] == member else "lower")]
        if over and not result[member][0]:
            pick, why = member, f"resolved higher than {pick} at {', '.join(f'c={c}' for c in over)}"
    lower = result[pick][0]
    if not why:
        why = "no less simple member was resolved higher than it and lower nowhere"
    why = (f"the proof ({proof['repeats_run']} repeat(s)): {why}"
           + (f"; lower than another member at {', '.join(f'c={c}' for c in lower)}" if lower else
              "; resolved lower than no member"))
    return pick, why


def _launch(candidates: list, name: str | None, why: str) -> dict:
    line = next(("python -m sglang.launch_server " + shlex.join(c.args) for c in candidates if c.name == name), None)
    return {"candidate": name, "why": why, "launch": line}
