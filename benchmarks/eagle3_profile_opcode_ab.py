#!/usr/bin/env python3
"""The figures of the opcode-clock A/B in tests/patches/eagle3_profile/test_profiler_host_time.py: the host time the
profiler reports as a share of the host time it adds, counted in bytecode instructions.  Deterministic on any machine,
but the count depends on the Python version's bytecode, so each figure belongs to the Python that printed it.

The test asserts 92-105% and prints nothing; this runs that test itself under pytest (whose assertion rewriting
changes the instruction count of the test's fakes, so running its code outside pytest gives other figures) and
prints both samplings' shares, twice, each in a fresh process (a second session in one process counts a little
differently): with the CUDA-event stand-ins at the test's 2,000 instructions per mark, and at 0 (the marks' own
Python only).

usage: python3 -m benchmarks.eagle3_profile_opcode_ab   (from a checkout, with pytest; no torch needed)
"""
from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEST = "tests/patches/eagle3_profile/test_profiler_host_time.py::test_the_host_time_it_reports_is_the_host_time_it_adds"


class Figures:
    """A pytest plugin: sets the test module's MARK_TICKS and keeps what each of its A/B loops returns."""

    def __init__(self, mark_ticks):
        self.mark_ticks = mark_ticks
        self.rows = []

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        module = item.module
        module.MARK_TICKS = self.mark_ticks
        ticks = getattr(module._ticks, "__wrapped__", module._ticks)
        runs = []

        def recorded(clock, worker, profiler):  # outside the clock: the clock runs inside ticks only
            spent = ticks(clock, worker, profiler)
            runs.append((spent, profiler))
            if profiler is not None:
                (without, _), (with_profiler, _) = runs
                self.rows.append((item.callspec.id, profiler.host_ns_so_far(), with_profiler - without))
            return spent

        recorded.__wrapped__ = ticks
        module._ticks = recorded


def run(mark_ticks):
    """One pytest session at ``mark_ticks`` per mark, in this process; prints its rows."""
    plugin = Figures(mark_ticks)
    code = pytest.main(["-qq", "-p", "no:cacheprovider", "--rootdir", str(REPO), str(REPO / TEST)], plugins=[plugin])
    for case, reported, added in plugin.rows:
        print(f"marks {mark_ticks:>4} instructions, {case:<17}: reported {reported:>11.1f} / added {added:>9} = "
              f"{100 * reported / added:.1f}% (missing {100 - 100 * reported / added:.1f}%)"
              f"{'' if 0.92 * added <= reported <= 1.05 * added else '  (outside the test bounds 92-105%)'}")
    print(f"pytest exit {int(code)} (the test asserts 92-105%; at 2000 instructions per mark that is its own setting)",
          flush=True)


if len(sys.argv) == 3 and sys.argv[1] == "--mark-ticks":
    run(int(sys.argv[2]))
    sys.exit(0)
print(f"# python3 -m benchmarks.eagle3_profile_opcode_ab (runs {TEST} under pytest {pytest.__version__}, each setting "
      f"in a fresh process, as the test runs alone); Python {platform.python_version()}; reported / added host time "
      "in bytecode instructions", flush=True)
for ticks in (2000, 0):
    subprocess.run([sys.executable, __file__, "--mark-ticks", str(ticks)], check=True, cwd=REPO)
