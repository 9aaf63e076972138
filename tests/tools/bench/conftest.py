"""What the bench tests share: the fake server's command (tests/support/fake_sglang_server.py, started exactly as a
real launch_server would be), a small workload, and a bench run against the fake."""
from __future__ import annotations

import json
import random
import sys

import pytest

from support import SUPPORT

from sglang_pcie.tools.cli import main as cli_main

FAKE = f"{sys.executable} {SUPPORT / 'fake_sglang_server.py'}"
# Each test session its own first port: bench checks a port is free, then the fake binds it, and another suite on
# a shared machine (another checkout's bench tests, from the same first port) took one in between ("Address already
# in use", a failed start).
FIRST_PORT = str(random.SystemRandom().randrange(20000, 29800, 200))
# --no-warmup: the tests count and order the measured servers; test_warmup.py runs bench with its warm-up server
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
