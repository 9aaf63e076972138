"""Constructed bench runs: the records of a counterbalanced baseline / x run whose servers' throughput you set,
with noise you set (no server, no clock). What bench's verdict rule is tested against (tests/tools/bench/
test_verdicts.py bounds its rates) and what benchmarks/bench_verdict_rates.py prints the rates of."""
from __future__ import annotations

import math
import random

from sglang_pcie.tools.bench.plan import counterbalanced, resolve_variants

VARIANTS = resolve_variants(["x:base=overlay"])  # baseline, x
TOK_S, LATENCY = "batch output tok/s", "batch latency p50 ms"


def server(index, repeat, variant, tok_s):
    """A run's record with a constructed throughput (and the latency it implies)."""
    return {"index": index, "repeat": repeat, "variant": variant, "ok": True, "env": {},
            "metrics": {"batch": {"output_tok_s": tok_s, "latency_ms_p50": 1e3 / tok_s}, "stream": {}}}


def simulated_run(seed, pairs, noise, effect=1.0, drift=0.0, heavy=False) -> list[dict]:
    """The records of a counterbalanced baseline / x run of ``pairs`` repeats: each server's throughput is 100
    tok/s times exp(noise * z) (z normal, or with ``heavy`` Student-t with 3 degrees of freedom: rare large
    outliers), times exp(drift * its position in the run), times ``effect`` for x."""
    rng = random.Random(seed)
    records = []
    for repeat, name in counterbalanced(["baseline", "x"], pairs):
        z = rng.gauss(0, 1)
        if heavy:
            z /= math.sqrt(rng.gammavariate(1.5, 1 / 1.5))  # chi-squared(3) / 3
        value = 100 * math.exp(noise * z + drift * len(records)) * (effect if name == "x" else 1.0)
        records.append(server(len(records) + 1, repeat + 1, name, value))
    return records
