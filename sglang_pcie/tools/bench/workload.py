"""What a ready server is sent and what is measured of it: warm-up requests, a batch at ``--concurrency``
(throughput, latency) and a concurrency-1 stream (TTFT, TPOT, ITL), SGLang's own decode figures from its log; the
unmeasured warm-up server's lighter workload; the check that every request returned the tokens asked."""
from __future__ import annotations

import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_pcie.tools.bench.acceptance import accept_length, acceptance
from sglang_pcie.tools.bench.client import generate, generate_stream
from sglang_pcie.tools.bench.plan import Plan
from sglang_pcie.tools.bench.report import fmt

# SGLang's scheduler log line every 40 decode steps (0.5.16 / 0.5.23 metrics_reporter), e.g. "Decode batch,
# #running-req: 32, ... accept len: 1.02, ... gen throughput (token/s): 5123.45, #queue-req: 0".
_DECODE_LINE = re.compile(r"Decode batch.*?#running-req: (\d+),(?:.*?accept len: ([\d.]+),)?"
                          r".*?gen throughput \(token/s\): ([\d.]+)")


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    index = (len(ordered) - 1) * q
    low = int(index)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def run_batch(host, port, prompts, max_new_tokens, concurrency, timeout) -> tuple[dict, list]:
    """All prompts with at most ``concurrency`` in flight (submitted in order); wall-clock output throughput."""
    start = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=concurrency)
    try:
        futures = [pool.submit(generate, host, port, p, max_new_tokens, timeout) for p in prompts]
        results = [f.result() for f in futures]
    finally:
        # On a failure or Ctrl-C, do not wait for requests in flight: stopping the server ends them.
        pool.shutdown(wait=False, cancel_futures=True)
    wall = time.perf_counter() - start
    tokens = sum(len(r["output_ids"]) for r in results)
    latencies = [r["latency_s"] * 1e3 for r in results]
    metrics = {"requests": len(results), "output_tokens": tokens, "wall_s": wall,
               "output_tok_s": tokens / wall if wall > 0 else None,
               "latency_ms_p50": percentile(latencies, 0.5), "latency_ms_mean": statistics.fmean(latencies),
               **acceptance(results),
               "short_outputs": sum(1 for r in results if len(r["output_ids"]) != max_new_tokens)}
    return metrics, results


def run_stream(host, port, prompts, max_new_tokens, timeout) -> tuple[dict, list]:
    """One streaming request at a time: TTFT, TPOT (per request, after the first token) and ITL (chunk gaps)."""
    start = time.perf_counter()
    results = [generate_stream(host, port, p, max_new_tokens, timeout) for p in prompts]
    wall = time.perf_counter() - start
    ttft, tpot, itl = [], [], []
    for r in results:
        arrivals = r["arrivals"]
        if not arrivals:
            continue
        ttft.append(arrivals[0][0] * 1e3)
        n = len(r["output_ids"])
        if n > 1:
            tpot.append((r["latency_s"] - arrivals[0][0]) * 1e3 / (n - 1))
        itl.extend((b[0] - a[0]) * 1e3 for a, b in zip(arrivals, arrivals[1:]))
    tokens = sum(len(r["output_ids"]) for r in results)
    metrics = {"requests": len(results), "output_tokens": tokens, "wall_s": wall,
               "output_tok_s": tokens / wall if wall > 0 else None,
               "ttft_ms_p50": percentile(ttft, 0.5), "ttft_ms_mean": statistics.fmean(ttft) if ttft else None,
               "tpot_ms_p50": percentile(tpot, 0.5), "tpot_ms_mean": statistics.fmean(tpot) if tpot else None,
               "itl_ms_p50": percentile(itl, 0.5), "itl_ms_p90": percentile(itl, 0.9),
               "tokens_per_chunk": (tokens / sum(len(r["arrivals"]) for r in results)
                                    if any(r["arrivals"] for r in results) else None),
               **acceptance(results),
               "short_outputs": sum(1 for r in results if len(r["output_ids"]) != max_new_tokens)}
    for r in results:
        del r["arrivals"]
    return metrics, results


def server_decode_stats(log: Path, start: int, end: int, running: int) -> dict:
    """SGLang's own decode figures logged between two offsets of the server log, from the lines with ``running``
    requests in the batch: the issue's first measurement used their gen throughput median."""
    try:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read(max(0, end - start)).decode("utf-8", "replace")
    except OSError:
        return {"lines": 0, "gen_tok_s_p50": None, "accept_len_mean": None}
    found = [m for m in _DECODE_LINE.finditer(text) if int(m.group(1)) == running]
    accepts = [float(m.group(2)) for m in found if m.group(2)]
    return {"lines": len(found), "gen_tok_s_p50": percentile([float(m.group(3)) for m in found], 0.5),
            "accept_len_mean": statistics.fmean(accepts) if accepts else None}


def drive_workload(plan: Plan, port: int, prompts: dict, log: Path, progress, label: str) -> tuple[dict, dict]:
    """Warm-up, batch and stream against a ready server: (its metrics, every measured request's output ids)."""
    w = plan.workload
    _, warmup_results = run_batch(plan.host, port, prompts["warmup"], w.warmup_output_len, w.concurrency,
                                  plan.request_timeout)
    log_start = log.stat().st_size
    batch, batch_results = run_batch(plan.host, port, prompts["batch"], w.output_len, w.concurrency,
                                     plan.request_timeout)
    server = server_decode_stats(log, log_start, log.stat().st_size, w.concurrency)
    batch["server_gen_tok_s_p50"], batch["server_log_lines"] = server["gen_tok_s_p50"], server["lines"]
    progress(f"{label}: batch {batch['requests']} x {w.output_len} tokens at concurrency {w.concurrency}:"
             f" {batch['output_tok_s']:.1f} tok/s" + _accept_note(batch))
    stream, stream_results = run_stream(plan.host, port, prompts["stream"], w.output_len, plan.request_timeout)
    progress(f"{label}: stream {stream['requests']} x {w.output_len} tokens at concurrency 1:"
             f" {stream['output_tok_s']:.1f} tok/s, TTFT p50 {fmt(stream['ttft_ms_p50'])} ms,"
             f" TPOT p50 {fmt(stream['tpot_ms_p50'], 3)} ms" + _accept_note(stream))
    metrics = {"batch": batch, "stream": stream,
               "accept_length": accept_length(batch_results + stream_results),
               # what an EAGLE3 profile of this server saw: the warm-up too, decode tokens only
               "accept_length_served": accept_length(warmup_results + batch_results + stream_results,
                                                     decode_only=True)}
    outputs = {"batch": [r["output_ids"] for r in batch_results],
               "stream": [r["output_ids"] for r in stream_results]}
    return metrics, outputs


def short_outputs(outputs: dict, asked: int) -> str | None:
    """One line when a measured request returned fewer tokens than asked, None when none did. With ignore_eos
    every request must return them all: a short one hit a context limit or a server that stopped early, and its
    run did not measure the workload the others did."""
    lengths = [len(ids) for phase in ("batch", "stream") for ids in outputs.get(phase, [])]
    short = [n for n in lengths if n < asked]
    if not short:
        return None
    return (f"{len(short)} of {len(lengths)} requests returned fewer than the {asked} tokens asked"
            f" ({short.count(0)} empty, shortest {min(short)}); the ratios leave this run out")


def _accept_note(metrics):
    note = f", accept length {metrics['accept_length']:.2f}" if metrics.get("accept_length") else ""
    if metrics.get("short_outputs"):
        note += f"; {metrics['short_outputs']} request(s) returned fewer tokens than asked (context limit?)"
    return note



def warmup_workload(plan: Plan, port: int, prompts: dict, log: Path, progress, label: str) -> tuple[dict, None]:
    """What a warm-up server is sent: the workload's warm-up requests, then one batch of the measured batch phase
    (its first ``concurrency`` prompts, full output length) and one streamed request, so that the kernels of the
    measured shapes are built (JIT) before any measured server. Nothing of it is measured: (figures, None)."""
    w = plan.workload
    start = time.perf_counter()
    run_batch(plan.host, port, prompts["warmup"], w.warmup_output_len, w.concurrency, plan.request_timeout)
    batch, _ = run_batch(plan.host, port, prompts["batch"][:w.concurrency], w.output_len, w.concurrency,
                         plan.request_timeout)
    if prompts["stream"]:
        run_stream(plan.host, port, prompts["stream"][:1], w.output_len, plan.request_timeout)
    progress(f"{label}: warm-up requests, one batch of {batch['requests']} x {w.output_len} tokens"
             f"{' and one streamed request' if prompts['stream'] else ''} in {time.perf_counter() - start:.1f} s"
             f" (not measured)")
    return {"batch_output_tok_s": batch["output_tok_s"], "wall_s": time.perf_counter() - start}, None
