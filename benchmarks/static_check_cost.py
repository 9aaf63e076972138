"""What drafter-delegation's static check (it reads every srt/models file) and check-drafter's SGLang facts cost,
for two checkouts side by side (e.g. before and after a change to the source reader).

    git worktree add /tmp/before <commit before the change>
    python -m benchmarks.static_check_cost --checkout /tmp/before --checkout . [--runs 7] [--release 0.5.23 ...]

Each run is a fresh process (PYTHONPATH=checkout) on a release source in the test cache (SGLANG_PCIE_CACHE or
~/.cache/sglang-pcie/src/X, fetched by verify-patches --sglang-version X first). Checkouts alternate run by run,
so a machine that gets busier part-way affects both. Printed per checkout and release: CPU seconds of the check in
a fresh SourceTree (the best of 3 in that process: what the check costs once files are in the page cache) and the
wall seconds of the whole `python -m sglang_pcie verify-patches --sglang-version X` process; min and median over
the runs. The machine's load average is printed first: on a shared machine, compare medians of the same run only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROBE = r"""
import sys, time
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patches.drafter_delegation.check import PATCH
times = []
for _ in range(3):
    tree = SourceTree(sys.argv[1])
    started = time.process_time()
    PATCH.check_source(tree)
    times.append(time.process_time() - started)
print(min(times))
"""


def cache_src(release: str) -> Path:
    base = Path(os.environ.get("SGLANG_PCIE_CACHE", Path.home() / ".cache" / "sglang-pcie"))
    return base / "src" / release


def one_run(checkout: str, release: str) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": checkout}
    check = subprocess.run([sys.executable, "-c", PROBE, str(cache_src(release))], env=env, capture_output=True,
                           text=True, check=True, cwd=checkout)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sglang_pcie", "verify-patches", "--sglang-version", release], env=env,
                   capture_output=True, check=True, cwd=checkout)
    return float(check.stdout.strip()), time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", required=True, help="a folder holding sglang_pcie/")
    parser.add_argument("--release", action="append", help="default: 0.5.9 and 0.5.23")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    releases = args.release or ["0.5.9", "0.5.23"]
    print(f"load average before: {os.getloadavg()}; python {sys.version.split()[0]}; {os.cpu_count()} CPUs")
    results: dict = {}
    for run in range(args.runs):
        for release in releases:
            for checkout in args.checkout:
                cpu, wall = one_run(checkout, release)
                results.setdefault((checkout, release), []).append((cpu, wall))
                print(f"run {run + 1} {release} {checkout}: drafter-delegation check {cpu:.3f} s CPU;"
                      f" verify-patches {wall:.2f} s wall", flush=True)
    print(f"load average after: {os.getloadavg()}")
    for (checkout, release), rows in results.items():
        cpus, walls = [r[0] for r in rows], [r[1] for r in rows]
        print(f"{release} {checkout}: check CPU min {min(cpus):.3f} median {statistics.median(cpus):.3f} s;"
              f" verify-patches wall min {min(walls):.2f} median {statistics.median(walls):.2f} s ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
