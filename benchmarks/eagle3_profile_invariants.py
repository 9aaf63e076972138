#!/usr/bin/env python3
"""Check the invariants of a real server's EAGLE3_PROFILE_FILE, record by record, with no slack beyond float
rounding (docs/eagle3-profile.md, "Invariants a GPU run can assert"):

  * phases_sum_ms <= cycle_ms <= timed_wall_cycle_ms, and gpu_busy <= 1 (the same timed cycles);
  * a full interval has at least QUANTILE_MIN timed cycles with a wall time, and its p50/p90;
  * syncs == 0;
  * schema 4: accept_hist counts the same request-verifies as tokens and decode_requests (sum(hist) ==
    decode_requests, sum(n * hist[n]) == tokens), its index 0 is 0 (each request-verify emits the bonus token) and
    it has spec_draft_tokens + 1 entries where the draft tokens are known (null only where the profiler staged its
    own sums: accept_length_exact false).

Prints one line per record of the newest run (--all: every run) and a verdict; exit 0 when every record holds them,
1 when one does not, 2 for an unreadable file or no schema 3 or 4 records.

usage: python3 -m benchmarks.eagle3_profile_invariants FILE [--all]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_pcie.patches.eagle3_profile import payload as ep

EPSILON = 1e-9
MAJORS = (3, 4)  # the schemas with the timed cycles' own wall time


def _major(line):
    try:
        return int(json.loads(line).get("schema", "").rpartition("/")[2])
    except (ValueError, AttributeError):
        return None


def failures(record) -> list[str]:
    cycle = record["phases_ms"]["cycle"]
    found = []
    if record["cycle_ms"] is not None:
        if record["phases_sum_ms"] > record["cycle_ms"] * (1 + EPSILON):
            found.append(f"phases {record['phases_sum_ms']:.4f} > cycle {record['cycle_ms']:.4f} ms")
        if record["cycle_ms"] > record["timed_wall_cycle_ms"] * (1 + EPSILON):
            found.append(f"cycle {record['cycle_ms']:.4f} > timed wall cycle {record['timed_wall_cycle_ms']:.4f} ms")
        if record["gpu_busy"] > 1 + EPSILON:
            found.append(f"GPU busy {record['gpu_busy'] * 100:.2f}%")
    if not record["partial"] and (cycle["n"] < ep.QUANTILE_MIN or cycle["p90"] is None):
        found.append(f"{cycle['n']} timed cycles with a wall time, under {ep.QUANTILE_MIN}")
    if record["syncs"]:
        found.append(f"{record['syncs']} forced GPU waits")
    if "accept_hist" in record:  # schema 4
        found += hist_failures(record)
    return found


def hist_failures(record) -> list[str]:
    hist = record["accept_hist"]
    if hist is None:
        return [] if not record["accept_length_exact"] else ["no accept_hist where every decode cycle was counted"]
    found = []
    tokens = sum(n * count for n, count in enumerate(hist))
    if (sum(hist), tokens) != (record["decode_requests"], record["tokens"]):
        found.append(f"accept_hist: {sum(hist)} request-verifies, {tokens} tokens against"
                     f" {record['decode_requests']}, {record['tokens']}")
    if hist and hist[0]:
        found.append(f"accept_hist: {hist[0]} request-verifies emitted no token")
    draft_tokens = record.get("spec_draft_tokens")
    if draft_tokens is not None and len(hist) != draft_tokens + 1:
        found.append(f"accept_hist: {len(hist)} entries for {draft_tokens} draft tokens")
    return found


def _fmt(value, digits=3, width=9):
    return f"{'n/a':>{width}}" if value is None else f"{value:{width}.{digits}f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="an EAGLE3_PROFILE_FILE (JSON lines)")
    parser.add_argument("--all", action="store_true", help="every run in the file, not only the newest")
    args = parser.parse_args(argv)
    try:
        lines = Path(args.file).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        print(f"eagle3_profile_invariants: cannot read {args.file!r}: {exc}", file=sys.stderr)
        return 2
    records = [json.loads(line) for line in lines if line.startswith("{") and ep.SCHEMA_FAMILY in line
               and _major(line) in MAJORS]
    if not records:
        print(f"eagle3_profile_invariants: no {ep.SCHEMA_FAMILY}{{3,4}} records in {args.file!r}", file=sys.stderr)
        return 2
    newest = max(records, key=lambda r: r["run_started"])["run_id"]
    chosen = records if args.all else [r for r in records if r["run_id"] == newest]
    bad = 0
    print(f"{'run':<28}{'cycles':>7}{'n':>4}{'phases':>9}{'cycle':>9}{'t.wall':>9}{'busy':>8}{'wall':>9}"
          f"{'host us':>9}  verdict")
    for r in chosen:
        found = failures(r)
        bad += bool(found)
        busy = None if r["gpu_busy"] is None else r["gpu_busy"] * 100
        print(f"{r['run_id']:<28}{r['decode_cycles']:7d}{r['phases_ms']['cycle']['n']:4d}"
              f"{_fmt(r['phases_sum_ms'])}{_fmt(r['cycle_ms'])}{_fmt(r['timed_wall_cycle_ms'])}{_fmt(busy, 1, 8)}"
              f"{_fmt(r['wall_cycle_ms'])}{_fmt(r['profiler_host_us_per_cycle'], 1)}  {'; '.join(found) or 'ok'}")
    print(f"{len(chosen) - bad} of {len(chosen)} records hold every invariant")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
