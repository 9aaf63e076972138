"""profile-report's figures for one run (from its checked interval records) and the report's text. How the
intervals' means and percentiles are pooled is in the package docstring."""
from __future__ import annotations

from sglang_pcie.patches.eagle3_profile.payload import (PHASES, QUANTILE_MIN, REPORTED, SPEC_SETTINGS,
                                                       accept_at_least, bound, finite, projection)
from sglang_pcie.tools.common import summed_counts


def _weighted(pairs):
    pairs = [(v, n) for v, n in pairs if v is not None and n]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None


def phase_table(records: list[dict]) -> dict:
    """Per phase: the mean over every timed cycle of the run (``n`` of them), and p50/p90 as the weighted means of
    the percentiles of the intervals with at least QUANTILE_MIN timed cycles (``percentile_n`` cycles behind them;
    None where no interval has that many)."""
    phases = {}
    for name in REPORTED:
        entries = [r["phases_ms"][name] for r in records if name in r["phases_ms"]]
        timed = [(e["mean"], e["n"]) for e in entries if e["mean"] is not None and e["n"]]
        ranked = [e for e in entries if e["n"] and e["n"] >= QUANTILE_MIN
                  and e["p50"] is not None and e["p90"] is not None]
        phases[name] = {"n": sum(n for _, n in timed), "mean": _weighted(timed),
                        "p50": _weighted((e["p50"], e["n"]) for e in ranked),
                        "p90": _weighted((e["p90"], e["n"]) for e in ranked),
                        "percentile_n": sum(e["n"] for e in ranked)}
    cycle_ms = phases["cycle"]["mean"]
    for entry in phases.values():
        mean = entry["mean"]
        entry["share"] = mean / cycle_ms if mean is not None and cycle_ms else None
    return phases


def gpu_busy(records: list[dict], cycle_ms, wall_cycle_ms) -> dict:
    """GPU busy of a run: the timed cycles' GPU time over the same cycles' wall time (schema 3), so it cannot pass
    100% by sampling; records without those wall times (older schemas) divide the timed cycles' mean by the mean
    wall time of every decode cycle, as they did."""
    timed = [r for r in records if r["phases_ms"].get("cycle", {}).get("mean") is not None
             and r["phases_ms"]["cycle"]["n"]]
    if timed and all(r["timed_wall_cycle_ms"] is not None for r in timed):
        gpu = sum(r["phases_ms"]["cycle"]["mean"] * r["phases_ms"]["cycle"]["n"] for r in timed)
        wall = sum(r["timed_wall_cycle_ms"] * r["phases_ms"]["cycle"]["n"] for r in timed)
        busy = gpu / wall if wall else None
        return {"timed_wall_cycle_ms": wall / sum(r["phases_ms"]["cycle"]["n"] for r in timed),
                "gpu_busy": busy, "gpu_busy_over": "timed cycles"}
    busy = cycle_ms / wall_cycle_ms if cycle_ms is not None and wall_cycle_ms else None
    return {"timed_wall_cycle_ms": None, "gpu_busy": busy, "gpu_busy_over": "every cycle" if busy else None}


def _emitted(r):
    """The tokens all decode cycles of an interval emitted: counted where exact, else its accept length over the
    cycles whose tokens are known times the requests of every decode cycle."""
    if r["accept_length_exact"]:
        return r["tokens"]
    return r["tokens"] / r["decode_requests"] * r["requests_all"] if r["decode_requests"] else None


def throughput(records: list[dict]) -> dict:
    """Served tokens/s (wall time) next to the tokens/s the GPU time implies, over the intervals that give each."""
    with_wall = [r for r in records if r["wall_s"] and _emitted(r) is not None]
    wall_s = sum(r["wall_s"] for r in with_wall)
    with_gpu = [r for r in records if r["phases_ms"].get("cycle", {}).get("mean") and _emitted(r) is not None]
    gpu_s = sum(r["phases_ms"]["cycle"]["mean"] * r["decode_cycles"] for r in with_gpu) / 1e3
    return {"wall_s": wall_s or None,
            "tokens_per_s_served": sum(_emitted(r) for r in with_wall) / wall_s if wall_s else None,
            "tokens_per_s_gpu": sum(_emitted(r) for r in with_gpu) / gpu_s if gpu_s else None}


def pooled_hist(records: list[dict]) -> list | None:
    """The run's histogram of tokens per request-verify: the sum of its records' counts (those that give one); None
    where none does."""
    return summed_counts([r["accept_hist"] for r in records if r["accept_hist"] is not None])


def spec_of(records: list[dict]) -> dict:
    """The run's speculative settings: each where its records agree (None where they do not or none says)."""
    settings = {}
    for key, _, _ in SPEC_SETTINGS:
        values = {r[key] for r in records if r[key] is not None}
        settings[key] = values.pop() if len(values) == 1 else None
    return settings


def draft_step(records: list[dict]) -> float | None:
    """The draft phase's mean over the timed cycles divided by the steps, weighted as the phase means are."""
    return _weighted((r["phases_ms"]["draft"]["mean"] / r["spec_steps"], r["phases_ms"]["draft"]["n"])
                     for r in records if r["spec_steps"] and r["phases_ms"].get("draft", {}).get("mean") is not None)


def summarise(records: list[dict], baseline_ms: float | None = None) -> dict:
    """One run's figures from its (normalised) interval records (the package docstring: how percentiles pool)."""
    phases = phase_table(records)
    cycle_ms = phases["cycle"]["mean"]
    tokens = sum(r["tokens"] for r in records)
    requests = sum(r["decode_requests"] for r in records)
    accept = tokens / requests if requests else None
    wall_cycle_ms = _weighted((r["wall_cycle_ms"], r["wall_cycles"]) for r in records)
    busy = gpu_busy(records, cycle_ms, wall_cycle_ms)
    hist = pooled_hist(records)
    if baseline_ms is None:
        baseline_ms = next((r["baseline_ms"] for r in reversed(records) if r["baseline_ms"]), None)
    first = records[0]
    summary = {
        "run_id": first["run_id"], "run_started": first["run_started"], "pid": first["pid"],
        "worker": first["worker"],
        "ranks": {key: sorted({r["ranks"][key] for r in records if r["ranks"][key] is not None})
                  for key in ("tp_rank", "pp_rank", "dp_rank")},
        "intervals": len(records), "partial_intervals": sum(r["partial"] for r in records),
        "decode_cycles": sum(r["decode_cycles"] for r in records),
        "prefill_cycles": sum(r["prefill_cycles"] for r in records),
        "idle_cycles": sum(r["idle_cycles"] for r in records),
        "timed_cycles": sum(r["timed_cycles"] for r in records),
        "decode_requests": requests, "requests_all": sum(r["requests_all"] for r in records), "tokens": tokens,
        "accept_length": accept,
        "accept_length_exact": accept is not None and all(r["accept_length_exact"] for r in records),
        "timers": sorted({str(r["timer"]) for r in records}),
        "syncs": sum(r["syncs"] for r in records),
        "unfinished_at_exit": sum(r["unfinished_at_exit"] for r in records),
        "phases_ms": phases,
        "phases_sum_ms": (sum(phases[p]["mean"] for p in PHASES if phases[p]["mean"] is not None)
                          if cycle_ms is not None else None),
        "cycle_ms": cycle_ms, **busy, "bound": bound(busy["gpu_busy"]), "wall_cycle_ms": wall_cycle_ms,
        **throughput(records),
        "tokens_per_s_per_request": accept * 1e3 / wall_cycle_ms if accept and wall_cycle_ms else None,
        "profiler_host_us_per_cycle": _weighted(
            (r["profiler_host_us_per_cycle"], r["decode_cycles"] + r["prefill_cycles"] + r["idle_cycles"])
            for r in records),
        **spec_of(records), "draft_step_ms": draft_step(records),
        "accept_hist": hist, "accept_at_least": accept_at_least(hist),
    }
    summary.update(projection(wall_cycle_ms or cycle_ms, accept, baseline_ms))
    return finite(summary)


def _ms(value):
    return f"{value:9.3f}" if value is not None else f"{'n/a':>9}"


def _ranks_text(ranks):
    return " ".join(f"{key.split('_')[0]}={','.join(map(str, values)) or '-'}" for key, values in ranks.items())


def _phase_lines(summary: dict) -> list[str]:
    lines = [f"{'phase':<14}{'n':>7}{'mean ms':>9}{'p50 ms':>9}{'p90 ms':>9}{'share':>9}"]
    for name in REPORTED:
        p = summary["phases_ms"][name]
        share = f"{p['share'] * 100:8.1f}%" if p["share"] is not None else f"{'n/a':>9}"
        lines.append(f"{name:<14}{p['n']:7d}{_ms(p['mean'])}{_ms(p['p50'])}{_ms(p['p90'])}{share}")
    with_percentiles = summary["phases_ms"]["cycle"]["percentile_n"]
    lines.append(f"(n: timed cycles behind each mean; p50/p90: weighted means of the percentiles of the intervals"
                 f" with at least {QUANTILE_MIN} timed cycles, {with_percentiles} cycles"
                 f"{'' if with_percentiles else ': none, so n/a'})")
    return lines


def _busy_line(summary: dict) -> str | None:
    if summary["gpu_busy"] is None:
        return None
    if summary["gpu_busy_over"] == "timed cycles":
        return (f"GPU cycle {summary['cycle_ms']:.3f} ms in a wall-clock cycle of {summary['timed_wall_cycle_ms']:.3f}"
                f" ms (the same timed cycles): GPU busy {summary['gpu_busy'] * 100:.0f}%: {summary['bound']}")
    return (f"wall-clock decode cycle {summary['wall_cycle_ms']:.3f} ms, GPU cycle {summary['cycle_ms']:.3f} ms:"
            f" GPU busy {summary['gpu_busy'] * 100:.0f}%: {summary['bound']} (schema < 3: the timed cycles' GPU"
            " time over every cycle's wall time, not the same cycles; may exceed 100%)")


def _spec_lines(summary: dict) -> list[str]:
    lines = []
    settings = [summary.get(key) for key, _, _ in SPEC_SETTINGS]
    if any(value is not None for value in settings):
        steps, topk, draft_tokens = ("?" if value is None else value for value in settings)
        step = summary.get("draft_step_ms")
        lines.append(f"speculative settings: {steps} steps, topk {topk}, {draft_tokens} draft tokens"
                     + ("" if step is None else f"; draft step {step:.3f} ms (the draft phase / its steps)"))
    shares, hist = summary.get("accept_at_least"), summary.get("accept_hist")
    if shares:
        lines.append("accept at least j drafts: " + "  ".join(f"{j}: {share * 100:.1f}%"
                                                             for j, share in enumerate(shares, 1))
                     + f" (n={sum(hist)} request-verifies)")
    return lines


def format_summary(summary: dict, source: str, note: str = "") -> str:
    lines = [f"EAGLE3 profile of {source}, run {summary['run_id']} ({_ranks_text(summary['ranks'])}"
             f"{', ' + summary['worker'] if summary['worker'] else ''}){note}",
             f"{summary['intervals']} intervals ({summary['partial_intervals']} partial), {summary['decode_cycles']}"
             f" decode cycles ({summary['timed_cycles']} timed), {summary['prefill_cycles']} prefill,"
             f" {summary['idle_cycles']} idle (timer: {', '.join(summary['timers'])};"
             f" forced GPU waits: {summary['syncs']})"]
    lines += _phase_lines(summary)
    if summary["accept_length"] is not None:
        lines.append(f"accept length: {summary['accept_length']:.2f} tokens per request per cycle"
                     f" ({summary['tokens']} tokens over {summary['decode_requests']} request-cycles,"
                     f" {'every decode cycle' if summary['accept_length_exact'] else 'timed cycles only'})")
    else:
        lines.append("accept length: unknown (no accepted-token counts in the input)")
    lines += _spec_lines(summary)
    served, gpu = summary["tokens_per_s_served"], summary["tokens_per_s_gpu"]
    lines.append(f"tokens/s served (wall time): {'-' if served is None else f'{served:.1f}'};"
                 f" implied by the GPU time: {'-' if gpu is None else f'{gpu:.1f}'}")
    if summary["wall_cycle_ms"] is not None:
        lines.append(f"wall-clock decode cycle (every decode cycle, host clock): {summary['wall_cycle_ms']:.3f} ms")
    busy = _busy_line(summary)
    if busy:
        lines.append(busy)
    if summary["profiler_host_us_per_cycle"] is not None:
        share = (f" ({summary['profiler_host_us_per_cycle'] / 1e3 / summary['wall_cycle_ms'] * 100:.2f}% of the"
                 " wall-clock cycle)" if summary["wall_cycle_ms"] else "")
        lines.append(f"profiler host time: {summary['profiler_host_us_per_cycle']:.1f} us per cycle{share}")
    if summary["baseline_ms"]:
        lines.append(f"baseline (non-speculative decode step) {summary['baseline_ms']:.3f} ms:"
                     f" break-even accept length {summary['break_even_accept_length']:.2f}")
        if summary["projected_speedup"] is not None:
            lines.append(f"projected speedup over the baseline: {summary['projected_speedup']:.2f}x")
    else:
        lines.append("no baseline: give --baseline-ms (or EAGLE3_PROFILE_BASELINE_MS in the run) for the break-even"
                     " accept length and the projected speedup")
    return "\n".join(lines)
