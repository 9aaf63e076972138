#!/usr/bin/env python3
"""What importing wrapt and importlib.abc would add to every interpreter's start (README, "Dependencies").

Runs ``python -X importtime -c "import NAME"`` ROUNDS times per module in fresh interpreters and prints the
cumulative import time of NAME itself (microseconds, from -X importtime's last line for it): median, min, max.

usage: python -m benchmarks.import_cost [--rounds 15] [--python PY] NAME...
"""
import argparse
import statistics
import subprocess
import sys


def cumulative_us(python: str, name: str) -> int:
    proc = subprocess.run([python, "-X", "importtime", "-c", f"import {name}"], capture_output=True, text=True,
                          check=True)
    rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return next(int(r[1]) for r in reversed(rows) if r[2].strip() == name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True).stdout.strip()
    print(f"python {version} ({args.python}), {args.rounds} fresh interpreters per module; cumulative import time, ms")
    for name in args.names:
        times = [cumulative_us(args.python, name) / 1000 for _ in range(args.rounds)]
        print(f"  {name:<16} median {statistics.median(times):7.1f}  min {min(times):7.1f}  max {max(times):7.1f}")


if __name__ == "__main__":
    main()
