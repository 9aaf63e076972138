"""sglang-pcie profile-report FILE: summarise an EAGLE3_PROFILE run from its JSON-lines file or its server log.

Reads every interval record - JSON objects with a "sglang-pcie.eagle3-profile/N" schema (from EAGLE3_PROFILE_FILE)
or the "sglang-pcie eagle3-profile [...]" log lines (from the server's log) - and groups them by run (process start
time + pid).  It summarises the newest run unless told otherwise (--run ID, --all): the per-phase table over the
timed cycles, the accept length, the served throughput (wall time) next to what the GPU time implies, how busy the
GPU was, the profiler's own host time, the speculative settings with the draft step's time and the acceptance per
depth (schema 4: the share of request-verifies that accepted at least j drafts, from the run's pooled histogram) and,
with a baseline (from the run or --baseline-ms), the break-even accept length and the projected speedup.

Means are exact over the timed cycles (each interval weighted by its timed cycles); the percentiles of single
cycles are not kept across intervals, so the table's p50/p90 are the weighted means of the percentiles of the
intervals that give them (those with enough timed cycles), with the count of cycles behind them.  GPU busy is the
timed cycles' GPU time over the same cycles' wall time (schema 3; older records: over every cycle's wall time).  A
record that is malformed, has a newer schema major or holds impossible times (``impossible``) is skipped with one
line naming it.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys

from sglang_pcie.runtime.eagle_profiler import (LOG_PREFIX, PHASES, QUANTILE_MIN, REPORTED, SCHEMA_FAMILY,
                                                SCHEMA_MAJOR, SPEC_SETTINGS, accept_at_least, bound, finite,
                                                projection)
from sglang_pcie.tools.command import Command, UsageError

PROG = "sglang-pcie profile-report"
MAX_SKIP_LINES = 10  # skipped records named one by one; beyond that, one line with the count
LEGACY_RUN = "log"  # schema 1 log lines carry no pid or run id


class Malformed(ValueError):
    """A record the report cannot use; the message says why."""


# -------------------------------------------------------------------------------------------- reading


_NUMBER = r"(n/a|-?[0-9.]+(?:e[-+]?[0-9]+)?)"
_PHASE = re.compile(rf"\b(draft|verify|draft_extend|other|cycle) (?:n=([0-9]+) )?mean={_NUMBER} p50={_NUMBER}"
                    rf" p90={_NUMBER} ms share=(n/a|[0-9.]+%)")
_FIELD = re.compile(r"([A-Za-z_][\w/]*)=(\S+)")
_BUSY = re.compile(r"GPU busy (n/a|[0-9.]+)%")
_ACCEPT_KIND = re.compile(r"accept_len=\S+ (exact|sampled)\b")


def _value(text):
    if text in (None, "n/a", "-"):
        return None
    number = float(text.rstrip("%sx"))
    if not math.isfinite(number):
        raise Malformed(f"non-finite number {text!r}")
    return number


def _int(text):
    value = _value(text)
    return None if value is None else int(value)


def parse_log_line(line: str) -> dict | None:
    """The interval record a profiler log line carries, or None if the line is not one (warnings, other lines).

    Raises Malformed for a profiler line that cannot be read."""
    start = line.find(LOG_PREFIX + " [")
    if start < 0:
        return None
    text = line[start:]
    head, _, body = text.partition("]:")
    fields = {}
    for key, value in _FIELD.findall(head + " " + body):
        fields.setdefault(key, value)
    phases = {}
    for m in _PHASE.finditer(body):
        share = m.group(6)
        phases[m.group(1)] = {"n": _int(m.group(2)), "mean": _value(m.group(3)), "p50": _value(m.group(4)),
                              "p90": _value(m.group(5)),
                              "share": None if share == "n/a" else float(share.rstrip("%")) / 100}
    if "decode_cycles" not in fields or "cycle" not in phases:
        raise Malformed("a profiler log line without decode_cycles or the cycle phase")
    accept = _value(fields.get("accept_len"))
    tokens = _int(fields.get("tokens")) or 0
    requests = _int(fields.get("requests"))
    if requests is None:  # schema 1 lines give tokens and their mean per request: the request count follows
        requests = round(tokens / accept) if accept else 0
    decode = _int(fields["decode_cycles"])
    timed = fields.get("timed", "").split("/")[0]
    kind = _ACCEPT_KIND.search(body)
    busy = _BUSY.search(body)
    legacy = "run" not in fields
    spec = (fields.get("spec") or "").split("/")
    major = 1 if legacy else 4 if "accept_hist" in fields else 3 if "timed_wall_cycle" in fields else 2
    record = {
        "schema": f"{SCHEMA_FAMILY}{major}",
        "run_id": fields.get("run", LEGACY_RUN), "run_started": None,
        "tp_rank": _int(fields.get("tp")), "pp_rank": _int(fields.get("pp")), "dp_rank": _int(fields.get("dp")),
        "timer": fields.get("timer"), "syncs": _int(fields.get("syncs")) or 0,
        "decode_cycles": decode, "prefill_cycles": _int(fields.get("prefill_cycles")) or 0,
        "idle_cycles": _int(fields.get("idle_cycles")) or 0,
        "timed_cycles": decode if legacy else _int(timed), "sample_every": _int(fields.get("sample", "").split("/")[-1]
                                                                                 or None),
        "decode_requests": requests, "requests_all": _int(fields.get("requests_all")) or requests, "tokens": tokens,
        "accept_length": accept, "accept_length_exact": kind.group(1) == "exact" if kind else None,
        "phases_ms": phases, "wall_s": _value(fields.get("wall")),
        "wall_cycle_ms": _value(fields.get("wall_cycle")),
        "timed_wall_cycle_ms": _value(fields.get("timed_wall_cycle")),
        "gpu_busy": None if not busy or busy.group(1) == "n/a" else float(busy.group(1)) / 100,
        "profiler_host_us_per_cycle": _value(fields.get("host")),
        "baseline_ms": _value(fields.get("baseline")),
        "partial": " partial]" in head + "]",
        "accept_hist": _hist_field(fields.get("accept_hist")),
        **{key: _int(spec[i]) if len(spec) == len(SPEC_SETTINGS) else None
           for i, (key, _, _) in enumerate(SPEC_SETTINGS)},
    }
    return record


def _hist_field(text):
    if text in (None, "-"):
        return None
    try:
        return [int(count) for count in text.split(",")]
    except ValueError:
        raise Malformed(f"accept_hist={text!r} is not a list of counts") from None


def schema_major(record) -> int:
    schema = record.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_FAMILY):
        raise Malformed(f"schema {schema!r} is not {SCHEMA_FAMILY}N")
    try:
        return int(schema[len(SCHEMA_FAMILY):].split(".")[0])
    except ValueError:
        raise Malformed(f"schema {schema!r} has no major number") from None


def _number(record, key, required=False, integer=False):
    value = record.get(key)
    if value is None:
        if required:
            raise Malformed(f"no {key}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Malformed(f"{key}={value!r} is not a number")
    if integer and (value != int(value) or value < 0):
        raise Malformed(f"{key}={value!r} is not a count")
    return int(value) if integer else float(value)


def normalise(record: dict) -> dict:
    """The fields the summary reads, checked; raises Malformed naming what is wrong."""
    if not isinstance(record, dict):
        raise Malformed("not a JSON object")
    major = schema_major(record)
    if major > SCHEMA_MAJOR:
        raise Malformed(f"schema {record['schema']} is newer than this sglang-pcie reads (up to"
                        f" {SCHEMA_FAMILY}{SCHEMA_MAJOR}); upgrade sglang-pcie to read it")
    phases_in = record.get("phases_ms")
    if not isinstance(phases_in, dict) or not isinstance(phases_in.get("cycle"), dict):
        raise Malformed("no phases_ms.cycle")
    phases = {}
    for name in REPORTED:
        entry = phases_in.get(name)
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise Malformed(f"phases_ms.{name} is not an object")
        phases[name] = {key: _number(entry, key) for key in ("mean", "p50", "p90")}
        phases[name]["n"] = _number(entry, "n", integer=True)
    decode = _number(record, "decode_cycles", required=True, integer=True)
    requests = _number(record, "decode_requests", integer=True) or 0
    out = {
        "major": major,
        "run_id": str(record.get("run_id") or (f"pid-{record['pid']}" if record.get("pid") is not None
                                               else LEGACY_RUN)),
        "run_started": _number(record, "run_started"), "time": _number(record, "time"),
        "pid": record.get("pid"), "worker": record.get("worker"), "timer": record.get("timer"),
        "ranks": {key: record.get(key) for key in ("tp_rank", "pp_rank", "dp_rank")},
        "decode_cycles": decode,
        "prefill_cycles": _number(record, "prefill_cycles", integer=True) or 0,
        "idle_cycles": _number(record, "idle_cycles", integer=True) or 0,
        "timed_cycles": decode if major < 2 else (_number(record, "timed_cycles", integer=True) or 0),
        "decode_requests": requests,
        "requests_all": _number(record, "requests_all", integer=True) or requests,
        "tokens": _number(record, "tokens", integer=True) or 0,
        "accept_length_exact": (record.get("accept_length_exact") if major >= 2 else True),
        "phases_ms": phases,
        "wall_s": _number(record, "wall_s"),
        "wall_cycle_ms": _number(record, "wall_cycle_ms"),
        "timed_wall_cycle_ms": _number(record, "timed_wall_cycle_ms") if major >= 3 else None,
        "wall_cycles": _number(record, "wall_cycles", integer=True),
        "profiler_host_us_per_cycle": _number(record, "profiler_host_us_per_cycle"),
        "baseline_ms": _number(record, "baseline_ms"),
        "syncs": _number(record, "syncs", integer=True) or 0,
        "unfinished_at_exit": _number(record, "unfinished_at_exit", integer=True) or 0,
        "partial": bool(record.get("partial")),
        "sample_every": _number(record, "sample_every"),
        "accept_hist": _accept_hist(record) if major >= 4 else None,
        **{key: (_number(record, key, integer=True) if major >= 4 else None) for key, _, _ in SPEC_SETTINGS},
    }
    if out["wall_cycles"] is None and out["wall_cycle_ms"] is not None:
        out["wall_cycles"] = max(decode - 1, 1)
    for entry in phases.values():  # before schema 3, every phase's figures are over the interval's timed cycles
        if entry["n"] is None:
            entry["n"] = out["timed_cycles"]
    reason = impossible(out)
    if reason:
        raise Malformed(f"impossible: {reason}")
    return out


def _accept_hist(record):
    hist = record.get("accept_hist")
    if hist is None:
        return None
    if not isinstance(hist, list) or any(isinstance(c, bool) or not isinstance(c, (int, float)) or c != int(c)
                                         or c < 0 for c in hist):
        raise Malformed(f"accept_hist={hist!r} is not a list of counts")
    return [int(c) for c in hist]


# A record's times are rounded (log lines: to the microsecond): an inequality the profiler keeps exactly is broken
# only beyond this slack.
SLACK_MS = 0.002
SLACK_SHARE = 0.02


def _above(value, bound):
    return value > bound * (1 + SLACK_SHARE) + SLACK_MS


def impossible(record: dict) -> str | None:
    """Why a (normalised) record cannot be a measurement, or None: a negative time, percentiles out of order, phases
    summing above the cycle, a cycle above its own wall time (schema 3), more timed cycles than cycles, fewer tokens
    than requests (each request emits at least one token per cycle), a histogram of tokens per request-verify
    (schema 4) that does not add up to the record's requests and tokens (it counts the same request-verifies)."""
    for name, entry in record["phases_ms"].items():
        for key in ("mean", "p50", "p90"):
            if entry[key] is not None and entry[key] < 0:
                return f"phases_ms.{name}.{key} = {entry[key]} ms is negative"
        if entry["p50"] is not None and entry["p90"] is not None and _above(entry["p50"], entry["p90"]):
            return f"phases_ms.{name}: p50 {entry['p50']} ms above p90 {entry['p90']} ms"
    for key in ("wall_s", "wall_cycle_ms", "timed_wall_cycle_ms", "profiler_host_us_per_cycle", "baseline_ms"):
        if record[key] is not None and record[key] < 0:
            return f"{key} = {record[key]} is negative"
    cycle = record["phases_ms"]["cycle"]["mean"]
    parts = [record["phases_ms"][p]["mean"] for p in PHASES if record["phases_ms"].get(p, {}).get("mean") is not None]
    if cycle is not None and parts and _above(sum(parts), cycle):
        return f"phases sum to {sum(parts):.3f} ms, above the {cycle:.3f} ms cycle they ran in"
    wall = record["timed_wall_cycle_ms"]
    if cycle is not None and wall is not None and _above(cycle, wall):
        return f"the {cycle:.3f} ms cycle is longer than its own {wall:.3f} ms wall time"
    if record["timed_cycles"] > record["decode_cycles"]:
        return f"{record['timed_cycles']} timed cycles of {record['decode_cycles']}"
    if record["tokens"] < record["decode_requests"]:
        return f"{record['tokens']} tokens for {record['decode_requests']} request-cycles (at least one each)"
    hist = record["accept_hist"]
    if hist is not None and (sum(hist), sum(n * c for n, c in enumerate(hist))) != (record["decode_requests"],
                                                                                 record["tokens"]):
        return (f"accept_hist counts {sum(hist)} request-verifies and {sum(n * c for n, c in enumerate(hist))}"
                f" tokens, not the record's {record['decode_requests']} and {record['tokens']}")
    return None


def read_records(lines, skipped: list | None = None) -> list[dict]:
    """The normalised interval records among ``lines``; each skipped one adds (line number, reason) to
    ``skipped``."""
    records = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        try:
            if text.startswith("{"):
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    if SCHEMA_FAMILY in text:
                        raise Malformed(f"not valid JSON ({exc.msg})") from None
                    continue
                if not isinstance(record, dict) or not str(record.get("schema", "")).startswith(SCHEMA_FAMILY):
                    continue  # someone else's JSON
            else:
                record = parse_log_line(text)
                if record is None:
                    continue
            records.append(normalise(record))
        except Malformed as exc:
            if skipped is not None:
                skipped.append((number, str(exc)))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # whatever else a damaged line holds
            if skipped is not None:
                skipped.append((number, f"unreadable: {type(exc).__name__}: {exc}"))
    return records


def runs_of(records: list[dict]) -> dict[str, list[dict]]:
    """Records by run id, oldest run first (by process start time, else by first appearance)."""
    runs: dict[str, list[dict]] = {}
    for record in records:
        runs.setdefault(record["run_id"], []).append(record)
    order = {run_id: index for index, run_id in enumerate(runs)}

    def started(run_id):
        values = [r["run_started"] for r in runs[run_id] if r["run_started"] is not None]
        return (min(values) if values else float("-inf"), order[run_id])
    return {run_id: runs[run_id] for run_id in sorted(runs, key=started)}


# -------------------------------------------------------------------------------------------- summary


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
    hists = [r["accept_hist"] for r in records if r["accept_hist"] is not None]
    if not hists:
        return None
    pooled = [0] * max(len(h) for h in hists)
    for hist in hists:
        for n, count in enumerate(hist):
            pooled[n] += count
    return pooled


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
    """One run's figures from its (normalised) interval records (see the module docstring for the percentiles)."""
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


# ------------------------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help="a server log or an EAGLE3_PROFILE_FILE (JSON lines); - reads standard input")
    parser.add_argument("--baseline-ms", type=float, metavar="MS",
                        help="non-speculative decode step time in ms (overrides the run's)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--run", metavar="ID",
                       help="summarise this run (its id is the process start time and pid, as the report prints)"
                            " instead of the newest")
    which.add_argument("--all", action="store_true", help="summarise every run in the input, oldest first")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON (with --all: {\"runs\": [...]})")


def run(args: argparse.Namespace) -> int:
    if args.baseline_ms is not None and not (args.baseline_ms > 0 and math.isfinite(args.baseline_ms)):
        raise UsageError(f"--baseline-ms {args.baseline_ms!r} is not a positive number")
    skipped: list = []
    try:
        if args.file == "-":
            records = read_records(sys.stdin, skipped)
        else:
            with open(args.file, encoding="utf-8", errors="replace") as handle:
                records = read_records(handle, skipped)
    except OSError as exc:
        raise UsageError(f"cannot read {args.file!r}: {exc.strerror or exc}") from None
    for number, reason in skipped[:MAX_SKIP_LINES]:
        print(f"{PROG}: skipped {args.file}:{number}: {reason}", file=sys.stderr)
    if len(skipped) > MAX_SKIP_LINES:
        print(f"{PROG}: skipped {len(skipped) - MAX_SKIP_LINES} more records of {args.file}", file=sys.stderr)
    if not records:
        print(f"{PROG}: no EAGLE3_PROFILE intervals in {args.file!r} (run the server with EAGLE3_PROFILE=1)",
              file=sys.stderr)
        return 1
    runs = runs_of(records)
    if args.run is not None and args.run not in runs:
        raise UsageError(f"no run {args.run!r} in {args.file!r}; runs: {', '.join(runs)}")
    chosen = list(runs) if args.all else [args.run if args.run is not None else list(runs)[-1]]
    summaries = [summarise(runs[run_id], args.baseline_ms) for run_id in chosen]
    if args.json:
        payload = {"runs": summaries} if args.all else summaries[0]
        print(json.dumps(payload, indent=2, allow_nan=False))
        return 0
    others = len(runs) - 1
    note = (f"; newest of {len(runs)} runs in the input (--run ID or --all for the others:"
            f" {', '.join(r for r in runs if r != chosen[0])})" if others and not args.all and args.run is None else "")
    print("\n\n".join(format_summary(s, args.file, note) for s in summaries))
    return 0



COMMAND = Command("profile-report", "summarise an EAGLE3_PROFILE log or JSON-lines file", add_arguments, run,
                  description=__doc__.splitlines()[0].split(": ", 1)[1],
                  epilog="Exit status: 0 with a report, 1 when the input holds no intervals, 2 for an unreadable"
                         " file, an unknown run or a bad option.")
