"""A stopped run keeps every finished server and --resume continues it to the same end as an uninterrupted one; the
budget counts the warm-up; the tuned table is written once and becomes a candidate."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.tools.command import UsageError
from sglang_pcie.tools.tune_spec import driver
from support.spec_cost_model import FACTS_0_5_16, LAUNCH, CostModelServer, make_settings

WARM = {"ok": True, "duration_s": 90.0}


def run(server, folder, state=None, stop_at=None, warm_up=None, **kw):
    found, settings = make_settings(budget_min=kw.pop("budget_min", 12), **kw)
    state = state or driver.new_state(LAUNCH, settings, {}, found)
    warmed = []

    def warm():
        warmed.append(1)
        return dict(WARM)

    def measure(candidate, index, step):
        if index == stop_at:
            raise KeyboardInterrupt
        return server.measure(candidate, index, step)
    state = driver.tune(found, settings, state, folder, measure, warm_up or warm, lambda line: None)
    return state, warmed, found


def test_interrupted_run_resumes_to_the_same_end_without_a_second_warm_up(tmp_path):
    whole, _, _ = run(CostModelServer(noise=0.01, seed=5), tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run(CostModelServer(noise=0.01, seed=5), tmp_path / "cut", stop_at=4)
    kept = driver.load_state(tmp_path / "cut")
    assert [s["candidate"] for s in kept["servers"]] == [s["candidate"] for s in whole["servers"][:3]]
    assert not kept["complete"] and kept["warmup"] == WARM
    resumed, warmed, _ = run(CostModelServer(noise=0.01, seed=5), tmp_path / "cut", state=kept)
    assert warmed == []  # the warm-up is not run again
    assert [s["candidate"] for s in resumed["servers"]] == [s["candidate"] for s in whole["servers"]]
    assert [s["levels"] for s in resumed["servers"]] == [s["levels"] for s in whole["servers"]]


def test_budget_counts_the_warm_up_and_every_server(tmp_path):
    state, warmed, _ = run(CostModelServer(noise=0.01, seed=1), tmp_path)
    assert warmed == [1]
    assert driver.elapsed(state) == 90.0 + 60.0 * len(state["servers"])
    assert driver.elapsed(state) <= 12 * 60
    # 12 minutes: the 90 s warm-up leaves room for 10 servers of 60 s, not 11
    assert len(state["servers"]) <= 10 and ("budget" in state["stopped"] or "answered" in state["stopped"])
    state, _, _ = run(CostModelServer(noise=0.01, seed=1, fail={"chain-7"}), tmp_path / "failed")
    assert driver.elapsed(state) == 90.0 + 60.0 * len(state["servers"])  # a failed server's time counts too
    slow = {"ok": True, "duration_s": 12 * 60 - 60.0}  # a warm-up that leaves one server's time
    state, _, _ = run(CostModelServer(noise=0.01, seed=1), tmp_path / "slow", warm_up=lambda: dict(slow))
    assert len(state["servers"]) == 1 and "budget" in state["stopped"]


def test_the_tuned_table_is_written_once_and_measured_as_a_candidate(tmp_path):
    state, _, found = run(CostModelServer(noise=0.003, seed=7), tmp_path, budget_min=60, facts=FACTS_0_5_16)
    path = tmp_path / "adaptive-config.json"
    written = json.loads(path.read_text())
    assert {k: v["candidate_steps"] for k, v in written.items()} == state["table"]["buckets"]
    tuned = [c for c in found if c.name == "tuned"]
    assert len(tuned) == 1 and [c["name"] for c in state["candidates"]].count("tuned") == 1
    assert f"--speculative-adaptive-config {path}" in " ".join(tuned[0].args)
    assert sum(1 for s in state["servers"] if s["candidate"] == "tuned") == 2  # the proof's two repeats


def test_without_a_proof_the_table_is_still_written(tmp_path):
    state, _, found = run(CostModelServer(noise=0.003, seed=7), tmp_path, budget_min=60, facts=FACTS_0_5_16,
                          prove=0)
    assert (tmp_path / "adaptive-config.json").is_file() and state["table"]["buckets"]
    assert not any(s["candidate"] == "tuned" for s in state["servers"])


def test_resume_refuses_a_folder_that_is_not_a_tune_spec_state(tmp_path):
    (tmp_path / driver.STATE).write_text(json.dumps({"schema": "sglang-pcie.tune-spec/1"}))
    with pytest.raises(UsageError, match="is not a tune-spec state"):
        driver.load_state(tmp_path)
    with pytest.raises(UsageError, match="cannot read"):
        driver.load_state(tmp_path / "missing")
    (tmp_path / driver.STATE).write_bytes(b"\xff\xfe")
    with pytest.raises(UsageError, match="cannot read"):
        driver.load_state(tmp_path)


def test_a_state_over_the_size_bound_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "STATE_LIMIT", 100)
    (tmp_path / driver.STATE).write_text(json.dumps({"schema": driver.SCHEMA, "pad": "x" * 200}))
    with pytest.raises(UsageError, match="over 100 bytes, not a tune-spec state"):
        driver.load_state(tmp_path)
