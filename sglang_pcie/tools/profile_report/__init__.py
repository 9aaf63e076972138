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
import sys

from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.profile_report.records import Malformed, normalise, parse_log_line, read_records, runs_of
from sglang_pcie.tools.profile_report.summary import format_summary, summarise

# What other code reads (bench's analysis, the profiler's tests and benchmarks): the records and their summary.
__all__ = ["COMMAND", "MAX_SKIP_LINES", "Malformed", "format_summary", "normalise", "parse_log_line", "read_records",
           "runs_of", "summarise"]

PROG = "sglang-pcie profile-report"
MAX_SKIP_LINES = 10  # skipped records named one by one; beyond that, one line with the count


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
