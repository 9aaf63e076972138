"""The fake servers' port blocks (``support.first_port``): distinct for every xdist worker and suite of one run."""
from __future__ import annotations

from support import PORT_LOW, PORT_SLOT, PORT_SLOTS, first_port


def test_every_worker_and_suite_of_one_run_has_its_own_block(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "ffffffff0123")
    blocks = []
    for worker in range(8):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        blocks += [int(first_port(suite)) for suite in (0, 1)]
    assert len(set(blocks)) == len(blocks) == 16
    assert all(PORT_LOW <= b <= PORT_LOW + (PORT_SLOTS - 1) * PORT_SLOT and (b - PORT_LOW) % PORT_SLOT == 0
               for b in blocks)
