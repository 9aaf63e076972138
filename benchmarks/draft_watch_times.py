#!/usr/bin/env python3
"""Seconds to each sglang-pcie warning, and draft-token-watch's own measured cost, from a bench run's server logs.

For every server (bench's RUNS/*/server.log, or server.log.gz as committed): when it was ready ("The server is fired up"), how long it served (its
last request), and for draft-token-watch and accept-length-alarm the seconds from ready to their first warning (or
none).  Then the watch's INFO lines at looks 1, 2, 4, ... (tokens tested, never accepted, and its own host time per
counted verify and as a share of the time between verifies, as it measured them).  SGLang's log stamps have a
resolution of one second.

usage: python -m benchmarks.draft_watch_times BENCH_OUT_DIR   (standard library only)
"""
from __future__ import annotations

import argparse
import gzip
import re
import sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] ")
SOURCES = ("draft-token-watch", "accept-length-alarm")


def stamped(line: str):
    match = STAMP.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S") if match else None


def read_log(path: Path) -> dict:
    ready = last_request = None
    warned: dict[str, float] = {}
    looks = []
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    for line in raw.decode(errors="replace").splitlines():
        when = stamped(line)
        if when is None:
            continue
        if ready is None and "The server is fired up" in line:
            ready = when
        if "POST /generate" in line:
            last_request = when
        for source in SOURCES:
            if f"sglang-pcie {source}:" in line and source not in warned and ": look " not in line and ready:
                warned[source] = (when - ready).total_seconds()
        if "sglang-pcie draft-token-watch: look " in line and ready:
            looks.append(f"+{(when - ready).total_seconds():.0f} s {line.split('draft-token-watch: ', 1)[1]}")
    served = (last_request - ready).total_seconds() if ready and last_request else None
    return {"ready": ready, "served": served, "warned": warned, "looks": looks}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_out", type=Path, help="a bench --out folder (with runs/*/server.log or .log.gz)")
    args = parser.parse_args()
    if not (args.bench_out / "runs").is_dir():
        parser.error(f"{args.bench_out}: no runs/ folder")
    runs = sorted(p for p in (args.bench_out / "runs").glob("*/server.log*") if p.suffix in (".log", ".gz"))
    print(f"{'server':<16} {'served s':>8}  " + "  ".join(f"{s + ' after s':>26}" for s in SOURCES))
    details = []
    for log in runs:
        info = read_log(log)
        served = f"{info['served']:.0f}" if info["served"] is not None else "-"
        cells = [f"{info['warned'][s]:.0f}" if s in info["warned"] else "none" for s in SOURCES]
        print(f"{log.parent.name:<16} {served:>8}  " + "  ".join(f"{c:>26}" for c in cells))
        details += [f"{log.parent.name}: {look}" for look in info["looks"]]
    print("draft-token-watch's looks (INFO; looks 1, 2, 4, ... of servers it did not warn in):")
    print("\n".join(f"  {d}" for d in details) or "  none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
