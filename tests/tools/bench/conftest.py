"""What the bench tests share: the fake server's command (tests/support/fake_sglang_server.py, started exactly as a
real launch_server would be), a small workload, and a bench run against the fake."""
from __future__ import annotations

import json
import math
import re
import sys

import pytest

from support import SUPPORT, first_port

from sglang_pcie.tools.bench.report import percent
from sglang_pcie.tools.bench.verdicts import noise_margin
from sglang_pcie.tools.cli import main as cli_main

FAKE = f"{sys.executable} {SUPPORT / 'fake_sglang_server.py'}"
# Each pytest process its own block of ports (support.first_port): bench checks a port is free, then the fake binds
# it, and another process (another xdist worker that drew the same block, or another checkout's suite) took one in
# between ("Address already in use", a failed start).
FIRST_PORT = first_port(0)
# --no-warmup: the tests count and order the measured servers; test_runs_warmup.py runs bench with its warm-up server
# (the default) and checks it.
SMALL = ["--concurrency", "4", "--batch-requests", "8", "--stream-requests", "2", "--input-len", "8",
         "--output-len", "12", "--stop-timeout", "3", "--start-timeout", "60", "--port", FIRST_PORT, "--no-warmup"]


@pytest.fixture
def fake_server_cmd() -> str:
    return FAKE


@pytest.fixture
def small_options() -> list:
    return list(SMALL)


@pytest.fixture
def run_bench(capsys, tmp_path):
    """``run_bench(*options, launch=..., warmup=False)``: bench against the fake server with the small workload,
    results in tmp_path/out; (exit code, stdout, stderr, results.json or None). ``warmup=True``: with bench's
    warm-up server (its default)."""
    def run(*argv, launch=("--model-path", "/models/none"), warmup=False):
        out = tmp_path / "out"
        small = [o for o in SMALL if o != "--no-warmup"] if warmup else SMALL
        code = cli_main(["bench", *small, "--server-cmd", FAKE, "--out", str(out), *argv, "--", *launch])
        stdout, stderr = capsys.readouterr()
        results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else None
        return code, stdout, stderr, results
    return run


@pytest.fixture(name="table_row")
def table_row_fixture():
    return table_row


def table_row(name: str, label: str, row: dict) -> re.Pattern:
    """The table's line for one variant's metric, every cell spelled from results.json's row (whatever figures the
    run produced: a loaded machine's may be far from an idle one's, and each cell is still the row's). The baseline's
    line shows its servers' spread and noise floor instead of a ratio."""
    value = "-" if row.get("value_median") is None else f"{row['value_median']:.2f}"
    head = rf"^{re.escape(name)} +{re.escape(label)} +{re.escape(value)} +"
    if name == "baseline":
        spread = row.get("spread")
        if not spread:
            return re.compile(rf"{head}1 +{row['n']}$", re.M)
        floor = percent(math.exp(noise_margin(spread)) - 1)
        return re.compile(rf"{head}1 {re.escape(f'[{spread[0]:.3f}-{spread[1]:.3f}]')} +{row['n']} +its own "
                          rf"servers' spread: noise floor {re.escape(floor)}$", re.M)
    ratio = "-" if row.get("median") is None else f"{row['median']:.3f}"
    interval = row.get("interval")
    cell = f"[{interval[0]:.3f}-{interval[1]:.3f}]" if interval else "-"
    if row["verdict"].startswith("cannot resolve"):
        cell = "too wide"
    return re.compile(rf"{head}{re.escape(ratio)} {re.escape(cell)} +{row['n']} +"
                      rf"{re.escape(percent(row.get('resolvable')))}  {re.escape(row['verdict'])}$", re.M)
