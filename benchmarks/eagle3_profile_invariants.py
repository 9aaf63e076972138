#!/usr/bin/env python3
"""Check the invariants of a real server's EAGLE3_PROFILE_FILE, record by record, with no slack beyond float
rounding (docs/eagle3-profile.md, "Invariants a GPU run can assert"):

  * phases_sum_ms <= cycle_ms <= timed_wall_cycle_ms, and gpu_busy <= 1 (the same timed cycles);
  * a full interval has at least QUANTILE_MIN timed cycles with a wall time, and its p50/p90;
  * syncs == 0.

Prints one line per record of the newest run (--all: every run) and a verdict; exit 0 when every record holds them,
1 when one does not, 2 for an unreadable file or no schema-3 records.

usage: python3 benchmarks/eagle3_profile_invariants.py FILE [--all]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, nothing installed

from sglang_pcie.runtime import eagle_profiler as ep  # noqa: E402

EPSILON = 1e-9


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
    records = [json.loads(line) for line in lines if line.startswith("{") and ep.SCHEMA in line]
    if not records:
        print(f"eagle3_profile_invariants: no {ep.SCHEMA} records in {args.file!r}", file=sys.stderr)
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
