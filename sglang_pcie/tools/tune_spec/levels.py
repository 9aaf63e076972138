"""What a tune-spec server is sent: its concurrency levels, each a phase of its own, the same prompts in every
server (a function of the seed and the level only).

* level 1: one request at a time, streamed (``--stream-requests``); its figure is one request's decode speed,
  1000 / mean TPOT (ms): the mean, not the median, because with a drafter accepted on some requests and not on
  others the median lands between the two kinds, while the mean is the time per token over all of them.
* level c > 1: a batch of ``--batch-waves`` x c (default 4 x c) greedy requests, or ``--batch-requests`` at every
  level, c in flight; its figure is the phase's output tok/s.

Each level has its own prompts, so no phase finds another's prefixes in SGLang's radix cache.
"""
from __future__ import annotations

import random
import re
import time

from sglang_pcie.tools.bench.workload import run_batch, run_stream

WAVES = 4  # batch requests per level: 4 x its concurrency unless --batch-waves or --batch-requests says


def parse_levels(text: str) -> tuple[int, ...]:
    """``1,8,32,64`` -> (1, 8, 32, 64); ValueError naming the fault."""
    words = [w.strip() for w in text.split(",")]
    if not text.strip() or not all(w.isdigit() for w in words):
        raise ValueError(f"{text!r}: give concurrencies as positive integers, comma-separated, e.g. 1,8,32,64")
    levels = tuple(sorted({int(w) for w in words}))
    if levels[0] < 1 or levels[-1] > 4096:
        raise ValueError(f"{text!r}: each concurrency must be 1 to 4096")
    return levels


def padded(batch: int, graph_bs) -> int:
    """The CUDA-graph batch size SGLang runs a batch of ``batch`` as (the smallest captured size not below it),
    which picks its adaptive bucket; the batch itself above every captured size or with no graphs."""
    return min([g for g in graph_bs or () if g >= batch] or [batch])


def edge_levels(levels, graph_bs=None) -> tuple[int, ...]:
    """Where a tuned table switches between the buckets it starts at the measured levels: for each measured level
    ``key`` above another, ``low``, the smallest batch above ``low`` that SGLang already serves with bucket ``key``
    because it pads it to a CUDA-graph size at or above ``key`` (``graph_bs``: the decode graph sizes the servers
    captured; with graphs at 1 and 32, batch 2 is served by bucket 32), else ``key - 1``, the largest batch the
    bucket below serves. Not 1 (one streamed request, no batch), not a measured level."""
    ordered = sorted(set(levels))
    found = set()
    for low, key in zip(ordered, ordered[1:]):
        switch = next((b for b in range(low + 1, key) if padded(b, graph_bs) >= key), None)
        found.add(switch if switch is not None else key - 1)
    return tuple(sorted(b for b in found if b >= 2 and b not in ordered))


_DECODE_GRAPHS = re.compile(r"decode=PhaseConfig\(backend='(\w+)'[^)]*?\bbs=\[([\d, ]*)\]")  # 0.5.14+
_GRAPH_BS = re.compile(r"\bcuda_graph_bs=\[([\d, ]*)\]")  # up to 0.5.13: the resolved list
LOG_HEAD = 256 * 1024  # SGLang logs its server_args in the first lines


def graph_batch_sizes(log_head: str) -> list[int] | None:
    """The decode CUDA-graph batch sizes a server captured, from the ``server_args=`` line SGLang logs at start
    ([] where decode graphs are off), or None where the log does not say."""
    found = _DECODE_GRAPHS.search(log_head)
    if found:
        return [] if found.group(1) == "disabled" else [int(w) for w in found.group(2).split(",") if w.strip()]
    if "disable_cuda_graph=True" in log_head:
        return []
    found = _GRAPH_BS.search(log_head)
    return [int(w) for w in found.group(1).split(",") if w.strip()] if found else None


def read_graph_batch_sizes(log_path) -> list[int] | None:
    """graph_batch_sizes of a server's log file, reading its first LOG_HEAD bytes only; None where unreadable."""
    try:
        with open(log_path, "rb") as log:
            return graph_batch_sizes(log.read(LOG_HEAD).decode("utf-8", "replace"))
    except (OSError, TypeError):
        return None


def requests_at(level: int, workload, batch_requests: int | None, waves: int | None = None) -> int:
    """Level 1: the streamed requests; a level c > 1: ``batch_requests`` where given, else ``waves`` (default
    WAVES) x c, so that a longer window at the top level does not make the low levels crawl."""
    return workload.stream_requests if level == 1 else batch_requests or (waves or WAVES) * level


def prompts(workload, levels, batch_requests: int | None, waves: int | None = None) -> dict:
    """{"warmup": [...], "levels": {level: [...]}}: token-id prompts of bench's workload (length, token range),
    drawn from (seed, level)."""
    def make(name, count):
        rng = random.Random(f"{workload.seed}-{name}")
        return [[rng.randrange(workload.token_low, workload.token_high) for _ in range(workload.input_len)]
                for _ in range(count)]
    return {"warmup": make("warmup", max(levels)),
            "levels": {c: make(f"level-{c}", requests_at(c, workload, batch_requests, waves)) for c in levels}}


def drive(levels, batch_requests: int | None):
    """bench's ``drive`` for one tune-spec server: warm-up requests, then each level in ascending order.
    Returns (metrics {"levels": {level: phase metrics}}, outputs {"batch": [...], "stream": [...]})."""
    def run(plan, port, sent, log, progress, label):
        w = plan.workload
        run_batch(plan.host, port, sent["warmup"], w.warmup_output_len, max(levels), plan.request_timeout)
        metrics, outputs = {"levels": {}}, {"batch": [], "stream": []}
        for c in levels:
            if c == 1:
                phase, results = run_stream(plan.host, port, sent["levels"][c], w.output_len, plan.request_timeout)
                outputs["stream"] += [r["output_ids"] for r in results]
                figure = f"1000 / mean TPOT {1e3 / phase['tpot_ms_mean']:.1f}" if phase.get("tpot_ms_mean") else "-"
            else:
                phase, results = run_batch(plan.host, port, sent["levels"][c], w.output_len, c, plan.request_timeout)
                outputs["batch"] += [r["output_ids"] for r in results]
                figure = f"{phase['output_tok_s']:.1f} tok/s"
            metrics["levels"][str(c)] = phase
            accept = f", accept length {phase['accept_length']:.2f}" if phase.get("accept_length") else ""
            progress(f"{label}: c={c}: {phase['requests']} x {w.output_len} tokens: {figure}{accept}")
        return metrics, outputs
    return run


def warm_drive(levels):
    """The unmeasured warm-up server's: warm-up requests, one wave at each level (full output length) and one
    streamed request, so that the kernels of the measured shapes are built before any measured server."""
    def run(plan, port, sent, log, progress, label):
        w = plan.workload
        start = time.perf_counter()
        run_batch(plan.host, port, sent["warmup"], w.warmup_output_len, max(levels), plan.request_timeout)
        for c in levels:
            if c == 1:
                run_stream(plan.host, port, sent["levels"][c][:1], w.output_len, plan.request_timeout)
            else:
                run_batch(plan.host, port, sent["levels"][c][:c], w.output_len, c, plan.request_timeout)
        progress(f"{label}: warm-up requests and one wave at each of c={','.join(map(str, levels))} in"
                 f" {time.perf_counter() - start:.1f} s (not measured)")
        return {"wall_s": time.perf_counter() - start}, None
    return run
