#!/usr/bin/env python3
"""Seconds to each sglang-pcie warning, and draft-token-watch's own measured cost, from a bench run's server logs.

For every server (bench's RUNS/*/server.log, or server.log.gz as committed): when it was ready ("The server is fired up"), how long it served (its
last request), for draft-token-watch and accept-length-alarm the seconds from ready to their first warning in
traffic (or none), and draft-token-watch's map check at load: its verdict (right, WRONG, cannot-tell, not-checked),
when it spoke relative to ready (before ready: negative) and its own time as it measured it.  Then the watch's INFO lines at looks 1, 2, 4, ... (tokens tested, never accepted, and its own host time per
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

LOAD_COST = re.compile(r"checked at load in (\d+) ms")
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] ")
SOURCES = ("draft-token-watch", "accept-length-alarm")


def stamped(line: str):
    match = STAMP.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S") if match else None


def read_log(path: Path) -> dict:
    ready = last_request = None
    warned: dict[str, float] = {}
    looks = []
    at_load = None  # (when, verdict, ms): the map check's line at load (before ready: negative seconds)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    for line in raw.decode(errors="replace").splitlines():
        when = stamped(line)
        if when and at_load is None and "sglang-pcie draft-token-watch:" in line and "at load" in line:
            at_load = (when, map_verdict(line), None)
        if at_load and at_load[2] is None and (cost := LOAD_COST.search(line)):  # a warning's last line: no stamp
            at_load = (at_load[0], at_load[1], int(cost.group(1)))
        if when is None:
            continue
        if ready is None and "The server is fired up" in line:
            ready = when
        if "POST /generate" in line:
            last_request = when
        for source in SOURCES:
            if f"sglang-pcie {source}:" in line and source not in warned and ": look " not in line and ready \
                    and "at load" not in line:
                warned[source] = (when - ready).total_seconds()
        if "sglang-pcie draft-token-watch: look " in line and ready:
            looks.append(f"+{(when - ready).total_seconds():.0f} s {line.split('draft-token-watch: ', 1)[1]}")
    served = (last_request - ready).total_seconds() if ready and last_request else None
    load = None
    if at_load:
        offset = f"{(at_load[0] - ready).total_seconds():+.0f} s" if ready else "-"
        load = f"{at_load[1]} {offset}" + (f", {at_load[2]} ms" if at_load[2] is not None else "")
    return {"ready": ready, "served": served, "warned": warned, "looks": looks, "at_load": load}


def map_verdict(line: str) -> str:
    for words, verdict in (("looks right", "right"), ("cannot be checked", "cannot-tell"),
                           ("is not checked", "not-checked"), ("is off", "off")):
        if f"the map {words} at load" in line or f"the map check at load {words}" in line:
            return verdict
    return "WRONG"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_out", type=Path, help="a bench --out folder (with runs/*/server.log or .log.gz)")
    args = parser.parse_args()
    if not (args.bench_out / "runs").is_dir():
        parser.error(f"{args.bench_out}: no runs/ folder")
    runs = sorted(p for p in (args.bench_out / "runs").glob("*/server.log*") if p.suffix in (".log", ".gz"))
    print(f"{'server':<16} {'served s':>8}  " + "  ".join(f"{s + ' after s':>26}" for s in SOURCES)
          + "  map check at load (from ready, its time)")
    details = []
    for log in runs:
        info = read_log(log)
        served = f"{info['served']:.0f}" if info["served"] is not None else "-"
        cells = [f"{info['warned'][s]:.0f}" if s in info["warned"] else "none" for s in SOURCES]
        print(f"{log.parent.name:<16} {served:>8}  " + "  ".join(f"{c:>26}" for c in cells)
              + f"  {info['at_load'] or 'none'}")
        details += [f"{log.parent.name}: {look}" for look in info["looks"]]
    print("draft-token-watch's looks (INFO; looks 1, 2, 4, ... of servers it did not warn in):")
    print("\n".join(f"  {d}" for d in details) or "  none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
