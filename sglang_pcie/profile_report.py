"""``sglang-pcie profile-report FILE``: summarise an EAGLE3_PROFILE run from its log or its JSON-lines file.

Reads every interval the run reported - JSON objects with ``"schema": "sglang-pcie.eagle3-profile/1"`` (from
EAGLE3_PROFILE_FILE) or the ``sglang-pcie eagle3-profile`` log lines (from the server's log) - and prints the
per-phase table over the whole run, the mean accept length, the tokens/s the cycle time implies and, with a
baseline (from the run or ``--baseline-ms``), the break-even accept length and the projected speedup.

Means are exact over all decode cycles (each interval weighted by its cycle count).  The percentiles of single
cycles are not kept across intervals, so the table's p50/p90 are the cycle-weighted means of the intervals'
percentiles.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from sglang_pcie.eagle_profiler import LOG_PREFIX, REPORTED, SCHEMA, projection

SCHEMA_FAMILY = SCHEMA.rsplit("/", 1)[0] + "/"
_NUMBER = r"(n/a|-?[0-9.]+(?:e[-+]?[0-9]+)?)"
_PHASE = re.compile(rf"(\w+) mean={_NUMBER} p50={_NUMBER} p90={_NUMBER} ms share=(n/a|[0-9.]+%)")
_FIELD = re.compile(rf"\b(timer|syncs|decode_cycles|prefill_cycles|idle_cycles|accept_len|tokens|baseline)"
                    rf"=([A-Za-z]+|{_NUMBER})")


def _value(text):
    if text in (None, "n/a"):
        return None
    return float(text.rstrip("%"))


def parse_log_line(line: str) -> dict | None:
    """The interval record a profiler log line carries (the fields the report needs), or None."""
    start = line.find(LOG_PREFIX + " [")
    if start < 0:
        return None
    text = line[start:]
    fields = {m.group(1): m.group(2) for m in _FIELD.finditer(text)}
    phases = {}
    for m in _PHASE.finditer(text):
        share = m.group(5)
        phases[m.group(1)] = {"mean": _value(m.group(2)), "p50": _value(m.group(3)), "p90": _value(m.group(4)),
                              "share": None if share == "n/a" else float(share.rstrip("%")) / 100}
    if "decode_cycles" not in fields or "cycle" not in phases:
        return None
    accept = _value(fields.get("accept_len"))
    tokens = int(_value(fields.get("tokens")) or 0)
    return {"schema": SCHEMA, "timer": fields.get("timer"), "syncs": int(_value(fields.get("syncs")) or 0),
            "decode_cycles": int(_value(fields["decode_cycles"])),
            "prefill_cycles": int(_value(fields.get("prefill_cycles")) or 0),
            "idle_cycles": int(_value(fields.get("idle_cycles")) or 0),
            # the line gives tokens and their mean per request: the request count follows
            "decode_requests": round(tokens / accept) if accept else 0, "tokens": tokens,
            "accept_length": accept, "phases_ms": phases, "baseline_ms": _value(fields.get("baseline"))}


def read_records(lines) -> list[dict]:
    records = []
    for line in lines:
        text = line.strip()
        if text.startswith("{"):
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and str(record.get("schema", "")).startswith(SCHEMA_FAMILY):
                records.append(record)
        else:
            record = parse_log_line(text)
            if record is not None:
                records.append(record)
    return records


def summarise(records: list[dict], baseline_ms: float | None = None) -> dict:
    """The whole run's figures from its interval records (see the module docstring for the percentiles)."""
    cycles = sum(r["decode_cycles"] for r in records)
    phases = {}
    for name in REPORTED:
        weighted = {key: [(r["phases_ms"][name][key], r["decode_cycles"]) for r in records
                          if name in r.get("phases_ms", {}) and r["phases_ms"][name].get(key) is not None]
                    for key in ("mean", "p50", "p90")}
        phases[name] = {key: (sum(v * n for v, n in pairs) / sum(n for _, n in pairs)
                              if pairs and sum(n for _, n in pairs) else None)
                        for key, pairs in weighted.items()}
    cycle_ms = phases["cycle"]["mean"]
    for name in REPORTED:
        mean = phases[name]["mean"]
        phases[name]["share"] = mean / cycle_ms if mean is not None and cycle_ms else None
    tokens = sum(r.get("tokens") or 0 for r in records)
    requests = sum(r.get("decode_requests") or 0 for r in records)
    accept = tokens / requests if requests else None
    cycle_total_s = sum((r["phases_ms"]["cycle"]["mean"] or 0) * r["decode_cycles"] for r in records) / 1e3
    if baseline_ms is None:
        baseline_ms = next((r["baseline_ms"] for r in reversed(records) if r.get("baseline_ms")), None)
    summary = {"schema": SCHEMA, "intervals": len(records), "decode_cycles": cycles,
               "prefill_cycles": sum(r.get("prefill_cycles") or 0 for r in records),
               "idle_cycles": sum(r.get("idle_cycles") or 0 for r in records),
               "decode_requests": requests, "tokens": tokens, "accept_length": accept,
               "timers": sorted({str(r.get("timer")) for r in records}),
               "syncs": sum(r.get("syncs") or 0 for r in records), "phases_ms": phases,
               "tokens_per_s": tokens / cycle_total_s if accept is not None and cycle_total_s else None,
               "tokens_per_s_per_request": accept * 1e3 / cycle_ms if accept and cycle_ms else None}
    summary.update(projection(cycle_ms, accept, baseline_ms))
    return summary


def _ms(value):
    return f"{value:9.3f}" if value is not None else f"{'-':>9}"


def format_summary(summary: dict, source: str) -> str:
    lines = [f"EAGLE3 profile of {source}: {summary['intervals']} intervals, {summary['decode_cycles']} decode"
             f" cycles, {summary['prefill_cycles']} prefill cycles, {summary['idle_cycles']} idle"
             f" (timer: {', '.join(summary['timers'])}; forced GPU waits: {summary['syncs']})",
             f"{'phase':<14}{'mean ms':>9}{'p50 ms':>9}{'p90 ms':>9}{'share':>9}"]
    for name in REPORTED:
        p = summary["phases_ms"][name]
        share = f"{p['share'] * 100:8.1f}%" if p["share"] is not None else f"{'-':>9}"
        lines.append(f"{name:<14}{_ms(p['mean'])}{_ms(p['p50'])}{_ms(p['p90'])}{share}")
    if summary["accept_length"] is not None:
        lines.append(f"mean accept length: {summary['accept_length']:.2f} tokens per request per cycle"
                     f" ({summary['tokens']} tokens over {summary['decode_requests']} request-cycles)")
        lines.append(f"tokens/s implied by the cycle time: {summary['tokens_per_s']:.1f}"
                     f" ({summary['tokens_per_s_per_request']:.1f} per request)")
    else:
        lines.append("mean accept length: unknown (no accepted-token counts in the input)")
    if summary["baseline_ms"]:
        lines.append(f"baseline (non-speculative decode step) {summary['baseline_ms']:.3f} ms:"
                     f" break-even accept length {summary['break_even_accept_length']:.2f}")
        if summary["projected_speedup"] is not None:
            lines.append(f"projected speedup over the baseline: {summary['projected_speedup']:.2f}x")
    else:
        lines.append("no baseline: give --baseline-ms (or EAGLE3_PROFILE_BASELINE_MS in the run) for the break-even"
                     " accept length and the projected speedup")
    lines.append("(p50/p90: cycle-weighted means of the intervals' percentiles)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-pcie profile-report", description=__doc__.splitlines()[0])
    parser.add_argument("file", metavar="FILE", help="a server log or an EAGLE3_PROFILE_FILE (JSON lines); - for stdin")
    parser.add_argument("--baseline-ms", type=float, metavar="MS",
                        help="non-speculative decode step time in ms (overrides the run's)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.baseline_ms is not None and not args.baseline_ms > 0:
        print(f"sglang-pcie profile-report: error: --baseline-ms {args.baseline_ms!r} is not a positive number",
              file=sys.stderr)
        return 2
    try:
        if args.file == "-":
            records = read_records(sys.stdin)
        else:
            with open(args.file, encoding="utf-8", errors="replace") as handle:
                records = read_records(handle)
    except OSError as exc:
        print(f"sglang-pcie profile-report: error: cannot read {args.file!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if not records:
        print(f"sglang-pcie profile-report: no EAGLE3_PROFILE intervals in {args.file!r}"
              " (run the server with EAGLE3_PROFILE=1)", file=sys.stderr)
        return 1
    summary = summarise(records, args.baseline_ms)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary, args.file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
