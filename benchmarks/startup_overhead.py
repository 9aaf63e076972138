#!/usr/bin/env python3
"""What the start-up hook costs every interpreter: ``python -c pass`` with and without sglang-pcie installed.

Two throw-away venvs (same interpreter, same pip), one with this checkout's wheel. Prints the median wall time
over interleaved runs and, where valgrind is installed, instructions counted by callgrind (stable on a busy
machine). Usage: python -m benchmarks.startup_overhead [--runs 200]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from support import REPO
from support.overlay_venv import make_venv


def build_wheel(out: Path) -> Path:
    """This checkout as a wheel, installed as users install it."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)],
                   check=True)
    return sorted(out.glob("sglang_pcie-*.whl"))[0]


def wall_times(pythons: dict, runs: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PCIE_", "PYTHON"))}
    times = {name: [] for name in pythons}
    for _ in range(runs):  # interleaved, so drift in machine load hits both alike
        for name, python in pythons.items():
            start = time.perf_counter()
            subprocess.run([str(python), "-c", "pass"], env=env, check=True)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


def instructions(python: Path) -> int | None:
    if not shutil.which("valgrind"):
        return None
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.out",
                               str(python), "-c", "pass"], capture_output=True, text=True)
        match = re.search(r"Collected : (\d+)", proc.stderr)
        return int(match.group(1)) if match else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sglang-pcie-startup-") as scratch:
        root = Path(scratch)
        wheel = build_wheel(root / "wheel")
        pythons = {"without": make_venv(root / "without"), "with": make_venv(root / "with", [str(wheel)])}
        ms = wall_times(pythons, args.runs)
        counts = {name: instructions(python) for name, python in pythons.items()}
    print(f"python -c pass, median of {args.runs} interleaved runs ({sys.version.split()[0]}):")
    print(f"  without sglang-pcie: {ms['without']:.2f} ms   with: {ms['with']:.2f} ms"
          f"   overhead: {100 * (ms['with'] / ms['without'] - 1):+.1f}%")
    if counts["without"] and counts["with"]:
        print(f"  instructions (callgrind): without {counts['without']:,}   with {counts['with']:,}"
              f"   overhead: {100 * (counts['with'] / counts['without'] - 1):+.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
