"""profile-report's reading: the interval records among the lines of a JSON-lines file or a server log, checked
(a malformed record, a newer schema major or impossible times are skipped, with the reason), and grouped by run."""
from __future__ import annotations

import json
import math
import re

from sglang_pcie.patches.eagle3_profile.payload import (LOG_PREFIX, PHASES, REPORTED, SCHEMA_FAMILY, SCHEMA_MAJOR,
                                                SPEC_SETTINGS)

LEGACY_RUN = "log"  # schema 1 log lines carry no pid or run id


class Malformed(ValueError):
    """A record the report cannot use; the message says why."""


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
