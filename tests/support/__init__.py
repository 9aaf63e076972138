"""What the tests share, and the benchmarks reuse: the fakes that stand in for a server, an NCCL worker and the CUDA
driver, throw-away environments, constructed runs, and the paths of this checkout.

The one package of tests/ the benchmark scripts import (as ``support``: benchmarks/__init__.py puts tests/ on their
path as pytest's ``pythonpath`` does here); the tests, in turn, never import a benchmark script: they run it, through
``run_benchmark`` (tests/test_benchmarks.py checks both ways)."""
import subprocess
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent


def _register_ids() -> list[str]:
    from sglang_pcie.patching import register  # data: imports nothing

    return register.ids()


# the register's patches in order, from the register: a sixth patch needs no edit here
PATCH_IDS = _register_ids()


def run_benchmark(name: str, *args, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """``python -m benchmarks.<name> args...`` from the checkout root, as benchmarks/README.md runs it (this
    checkout's sglang_pcie, uninstalled), with this interpreter; output captured as text."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


PORT_LOW, PORT_SLOTS, PORT_SLOT = 20000, 50, 200  # 20000-29999 in blocks of 200 ports


def first_port(suite: int) -> str:
    """The first port of a block of 200 for the fake servers of one suite (0: bench's tests, 1: tune-spec's) in this
    pytest process. Within one run every xdist worker and suite gets its own block (workers that drew the same
    random block raced for its ports: a failed start); across runs (another checkout's on a shared machine) the
    run's id picks where the blocks start."""
    import os
    import random

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    start = int(run[:8], 16) if run else random.SystemRandom().randrange(PORT_SLOTS)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    slot = (start + 2 * (int(worker) if worker.isdigit() else 0) + suite) % PORT_SLOTS
    return str(PORT_LOW + slot * PORT_SLOT)
