"""A stopped run keeps every finished server and --resume continues it to the same end as an uninterrupted one."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.tools.command import UsageError
from sglang_pcie.tools.tune_spec import driver
from support.spec_cost_model import LAUNCH, CostModelServer, make_settings


def run(server, folder, state=None, stop_at=None):
    found, settings = make_settings(budget_min=12)
    state = state or driver.new_state(LAUNCH, settings, {}, found)

    def measure(candidate, index, profiled):
        if index == stop_at:
            raise KeyboardInterrupt
        return server.measure(candidate, index, profiled)
    return driver.tune(found, settings, state, folder, measure, lambda: {"ok": True, "duration_s": 90.0},
                       lambda line: None)


def test_interrupted_run_resumes_to_the_same_end(tmp_path):
    whole = run(CostModelServer(noise=0.01, seed=5), tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run(CostModelServer(noise=0.01, seed=5), tmp_path / "cut", stop_at=4)
    kept = driver.load_state(tmp_path / "cut")
    assert [s["candidate"] for s in kept["servers"]] == [s["candidate"] for s in whole["servers"][:3]]
    assert not kept["complete"]
    resumed = run(CostModelServer(noise=0.01, seed=5), tmp_path / "cut", state=kept)
    assert [s["candidate"] for s in resumed["servers"]] == [s["candidate"] for s in whole["servers"]]
    assert [s["batch"]["value"] for s in resumed["servers"]] == [s["batch"]["value"] for s in whole["servers"]]
    assert resumed["warmup"] == whole["warmup"]  # the warm-up is not run again


def test_budget_counts_the_warm_up_and_every_server(tmp_path):
    state = run(CostModelServer(noise=0.01, seed=1), tmp_path)
    assert driver.elapsed(state) <= 12 * 60
    assert "budget" in state["stopped"] or "answered" in state["stopped"]


def test_resume_refuses_a_folder_that_is_not_a_tune_spec_state(tmp_path):
    (tmp_path / driver.STATE).write_text(json.dumps({"schema": "other"}))
    with pytest.raises(UsageError, match="is not a tune-spec state"):
        driver.load_state(tmp_path)
    with pytest.raises(UsageError, match="cannot read"):
        driver.load_state(tmp_path / "missing")
