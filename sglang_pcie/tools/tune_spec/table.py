"""The adaptive table tune-spec writes for this box: per measured concurrency, the chain that served it fastest
(measured medians only; never step 0, which is not "no speculation": see ``STEP_0_MEASURED``), or, where SGLang's
own table measured faster than every chain there, that table's bucket for the concurrency, copied whole (its
candidate steps and hysteresis, step 0 included where SGLang's bucket holds it: the copy runs what was measured);
as SGLang's ``--speculative-adaptive-config`` file:
``{"<batch size>": {"candidate_steps": [k]}, ...}``.

One step per bucket where a chain won: SGLang's EMA then has nothing to move between (a bucket with one candidate
never switches); a copied bucket runs as SGLang's own did in the measured server. So each bucket runs what was
measured at its concurrency, not an untested mix. SGLang pads a batch to a CUDA-graph
batch size and serves it with the bucket whose key is the largest not above that; so the bucket ``c`` holds the
batches from its concurrency up to the next measured one, and the batches below the lowest measured concurrency go
to the lowest bucket.

The best fixed setting is the one server setting without a table: the fixed candidate (no speculation or a chain)
whose figures, each as a share of the best measured figure at its concurrency, have the highest geometric mean.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from sglang_pcie.tools.tune_spec.levels import padded

TABLE_FILE = "adaptive-config.json"


def fixed_medians(candidates: list, medians: dict) -> dict:
    """level -> {fixed candidate name: median}, over the fixed candidates (none, chains) measured at each level.
    ``medians``: level -> candidate name -> median figure."""
    fixed = {c.name for c in candidates if c.fixed_steps is not None}
    return {level: {n: v for n, v in row.items() if n in fixed} for level, row in medians.items()}


# Why a bucket never holds step 0: in SGLang's adaptive mode step 0 keeps the speculative path (a verify of one
# token, the draft extend), it does not switch speculation off. Measured on one H100, SGLang 0.5.16, the e2e-tokenwise
# pair at c=32 (two servers each, A B B A): a table of step 0 at batch 32 served 11,669 tok/s (accept length 1.00),
# no speculation 25,543, SGLang's own table 14,205, a fixed 7-step chain 19,170
# (benchmarks/results/2026-12-06-h100/tune-spec-lease4/).
STEP_0_MEASURED = "step 0 keeps the speculative path: 0.46x of no speculation at c=32 on an H100, SGLang 0.5.16"


def default_entry(level: int, default_config: dict, graph_bs=None) -> tuple[int, dict] | None:
    """(key, entry) of the bucket of SGLang's own table that serves a batch of ``level``: SGLang pads the batch to a
    CUDA-graph size (``graph_bs``, levels.padded), then takes the largest key not above it (the lowest below every
    key); None where the release has no table."""
    keys = sorted(default_config)
    if not keys:
        return None
    batch = padded(level, graph_bs)
    key = max([k for k in keys if k <= batch] or keys[:1])
    return key, default_config[key]


def tuned_buckets(candidates: list, medians: dict, default_config: dict | None = None,
                  graph_bs=None) -> tuple[dict, list[str]]:
    """(bucket -> [steps], notes): at each level, the steps of its best measured fixed candidate, or, where
    SGLang's own table (``adaptive``) measured faster than every chain there, the candidate steps of its bucket
    that served that level (written with that bucket's hysteresis: ``entry``). Where no speculation is best, the
    faster of the best measured chain and SGLang's bucket instead (noted): a table cannot switch speculation off."""
    steps_of = {c.name: c.fixed_steps for c in candidates if c.fixed_steps is not None}
    buckets, notes = {}, []
    for level, row in sorted(fixed_medians(candidates, medians).items()):
        ranked = sorted(row, key=lambda n: -row[n])
        chains = [n for n in ranked if steps_of[n] > 0]
        own = default_entry(level, default_config or {}, graph_bs)
        adaptive = medians.get(level, {}).get("adaptive") if own is not None else None
        if adaptive is not None and (not chains or adaptive > row[chains[0]]):
            key, copied = own
            beat = f"ahead of {chains[0]} by {adaptive / row[chains[0]] - 1:.1%}" if chains else "no chain measured"
            if ranked and steps_of[ranked[0]] == 0:
                beat += f"; no speculation is best, and a table cannot give it: {adaptive / row[ranked[0]]:.3f}x of none"
            buckets[level] = list(copied["candidate_steps"])
            notes.append(f"c={level}: SGLang's own table measured fastest of the speculative settings ({beat}): its"
                         f" bucket {key} (steps {', '.join(map(str, copied['candidate_steps']))}) copied")
            continue
        if not ranked:
            continue
        best = ranked[0]
        if steps_of[best] == 0:
            if not chains:
                notes.append(f"c={level}: no speculation is best and no chain was measured; a table cannot switch "
                             f"speculation off ({STEP_0_MEASURED})")
                continue
            notes.append(f"c={level}: no speculation is best, and a table cannot give it ({STEP_0_MEASURED}):"
                         f" {chains[0]} ({row[chains[0]] / row[best]:.3f}x of none) instead")
            best = chains[0]
        buckets[level] = [steps_of[best]]
    return buckets, notes


def copies_default(buckets: dict, default_config: dict | None, graph_bs=None) -> bool:
    """Whether every bucket holds the steps of SGLang's own bucket for its level (the table then runs SGLang's own
    at every measured level)."""
    own = {level: default_entry(level, default_config or {}, graph_bs) for level in buckets}
    return bool(buckets) and all(own[level] is not None and list(own[level][1]["candidate_steps"]) == list(steps)
                                 and len(steps) > 1 for level, steps in buckets.items())


def uniform(buckets: dict) -> int | None:
    """The one fixed step every bucket runs (the table is then that fixed setting), or None."""
    steps = {tuple(v) for v in buckets.values()}
    only = next(iter(steps)) if len(steps) == 1 else ()
    return only[0] if len(only) == 1 else None


def best_fixed(candidates: list, medians: dict) -> tuple[str | None, float | None]:
    """(name, geometric mean of its share of each level's best measured figure), over fixed candidates measured at
    every level; (None, None) where none is."""
    rows = fixed_medians(candidates, medians)
    levels = [level for level, row in rows.items() if row]
    if not levels:
        return None, None
    common = set.intersection(*(set(rows[level]) for level in levels))
    scores = {}
    for name in common:
        shares = [rows[level][name] / max(rows[level].values()) for level in levels]
        scores[name] = math.exp(sum(math.log(s) for s in shares) / len(shares))
    if not scores:
        return None, None
    best = max(sorted(scores), key=lambda n: scores[n])
    return best, scores[best]


def entry(steps, default_config: dict | None = None) -> dict:
    """One bucket of the file: its steps, with the hysteresis of SGLang's own bucket of the same candidate steps
    where a bucket was copied from it (copied whole, so that it runs as it was measured)."""
    own = [e for _, e in sorted((default_config or {}).items()) if list(e["candidate_steps"]) == list(steps)]
    return dict(own[0]) if own and len(steps) > 1 else {"candidate_steps": list(steps)}


def config_json(buckets: dict, default_config: dict | None = None) -> dict:
    return {str(level): entry(steps, default_config) for level, steps in sorted(buckets.items())}


def write_table(buckets: dict, folder: Path, default_config: dict | None = None) -> Path:
    path = Path(folder) / TABLE_FILE
    path.write_text(json.dumps(config_json(buckets, default_config), indent=1) + "\n")
    return path


def bucket_ranges(buckets: dict) -> list[str]:
    """Which running batch sizes each bucket serves (before SGLang pads a batch to a CUDA-graph batch size)."""
    keys = sorted(buckets)
    out = []
    for i, key in enumerate(keys):
        low = 1 if i == 0 else key
        high = f"{keys[i + 1] - 1}" if i + 1 < len(keys) else "up"
        steps = buckets[key]
        said = (f"adaptive over steps {', '.join(map(str, steps))}" if len(steps) > 1 else "no speculation"
                if steps[0] == 0 else "1 step" if steps[0] == 1 else f"{steps[0]} steps")
        out.append(f"batch {low}-{high}: {said}")
    return out


def read_table(path: str) -> dict:
    """A table file the user gives (``--table``): bucket -> candidate steps, each checked; ValueError naming the
    fault. Bounded: a regular file of at most 64 KiB."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{path}: not a file")
    if file.stat().st_size > 64 * 1024:
        raise ValueError(f"{path}: over 64 KiB, not an adaptive table")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    buckets = {}
    for key, entry in data.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (not isinstance(steps, list) or not steps
                or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= 16 for s in steps)):
            raise ValueError(f"{path}: bucket {key}: candidate_steps must be a list of steps 0 to 16")
        buckets[int(key)] = steps
    if not buckets:
        raise ValueError(f"{path}: no batch-size bucket (keys such as \"1\", \"32\")")
    return buckets
