"""The adaptive table tune-spec writes for this box: per measured concurrency, the chain that served it fastest
(measured medians only; never step 0, which is not "no speculation": see ``STEP_0_MEASURED``), as SGLang's
``--speculative-adaptive-config`` file: ``{"<batch size>": {"candidate_steps": [k]}, ...}``.

One step per bucket: SGLang's EMA then has nothing to move between (a bucket with one candidate never switches),
so each bucket runs what was measured at its concurrency, not an untested mix. SGLang pads a batch to a CUDA-graph
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


def tuned_buckets(candidates: list, medians: dict) -> tuple[dict, list[str]]:
    """(bucket -> [steps], notes): at each level, the steps of its best measured fixed candidate. Where no
    speculation is best, the best measured chain instead (noted): a table cannot switch speculation off."""
    steps_of = {c.name: c.fixed_steps for c in candidates if c.fixed_steps is not None}
    buckets, notes = {}, []
    for level, row in sorted(fixed_medians(candidates, medians).items()):
        ranked = sorted(row, key=lambda n: -row[n])
        if not ranked:
            continue
        best = ranked[0]
        if steps_of[best] == 0:
            chains = [n for n in ranked if steps_of[n] > 0]
            if not chains:
                notes.append(f"c={level}: no speculation is best and no chain was measured; a table cannot switch "
                             f"speculation off ({STEP_0_MEASURED})")
                continue
            notes.append(f"c={level}: no speculation is best, and a table cannot give it ({STEP_0_MEASURED}):"
                         f" {chains[0]} ({row[chains[0]] / row[best]:.3f}x of none) instead")
            best = chains[0]
        buckets[level] = [steps_of[best]]
    return buckets, notes


def uniform(buckets: dict) -> int | None:
    """The one step every bucket runs (the table is then that fixed setting), or None."""
    steps = {tuple(v) for v in buckets.values()}
    return next(iter(steps))[0] if len(steps) == 1 else None


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


def config_json(buckets: dict) -> dict:
    return {str(level): {"candidate_steps": list(steps)} for level, steps in sorted(buckets.items())}


def write_table(buckets: dict, folder: Path) -> Path:
    path = Path(folder) / TABLE_FILE
    path.write_text(json.dumps(config_json(buckets), indent=1) + "\n")
    return path


def bucket_ranges(buckets: dict) -> list[str]:
    """Which running batch sizes each bucket serves (before SGLang pads a batch to a CUDA-graph batch size)."""
    keys = sorted(buckets)
    out = []
    for i, key in enumerate(keys):
        low = 1 if i == 0 else key
        high = f"{keys[i + 1] - 1}" if i + 1 < len(keys) else "up"
        steps = buckets[key][0]
        said = "no speculation" if steps == 0 else "1 step" if steps == 1 else f"{steps} steps"
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
