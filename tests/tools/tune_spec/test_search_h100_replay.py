"""The search replayed on what one H100 measured (2026-12-06, SGLang 0.5.16, the 8B-shaped pair with mixed
acceptance; benchmarks/results/2026-12-06-h100/tune-spec/): its state after the model's three servers, and the
sweep's servers as the measurements of what it starts next."""
from __future__ import annotations

import gzip
import json
import tarfile
from dataclasses import replace

from sglang_pcie.tools.tune_spec import report
from sglang_pcie.tools.tune_spec.candidates import Candidate
from sglang_pcie.tools.tune_spec.answer import paired
from sglang_pcie.tools.tune_spec.search import Settings, plan_next, plan_table, sweep_order
from sglang_pcie.tools.tune_spec.table import config_json

from support import REPO

RUN = REPO / "benchmarks/results/2026-12-06-h100/tune-spec/8b-mixed"


def load(name: str) -> dict:
    with gzip.open(RUN / name / "state.json.gz", "rt") as state:
        return json.load(state)


def test_the_fourth_server_is_sglangs_table_and_the_answers_are_the_sweeps():
    search, sweep = load("tune"), load("sweep")
    candidates = [Candidate.from_dict(c) for c in search["candidates"]]
    settings = Settings.from_dict(search["settings"])
    servers = [s for s in search["servers"] if s["role"] == "model"]
    assert [s["candidate"] for s in servers] == ["chain-7", "chain-3", "none"]
    # the measured run went to chain-5 here (predicted 0.3% and 2.7% below the chain-7 already measured)
    step = plan_next(candidates, servers, settings, 205.0, 68.4)
    assert (step.candidate, step.why) == ("adaptive", "the model cannot predict it")
    adaptive = next(s for s in sweep["servers"] if s["candidate"] == "adaptive")  # the sweep's first one
    servers.append(dict(adaptive, index=4, role="model"))
    answers = report.analyse(candidates, servers, settings)["levels"]
    best = {level: max(["chain-3", "chain-5", "chain-7", "adaptive"], key=lambda name: sum(
        s["levels"][level]["value"] for s in sweep["servers"] if s["candidate"] == name)) for level in ("1", "32")}
    assert best == {"1": "adaptive", "32": "chain-7"}
    assert {level: answers[level]["answer"] for level in ("1", "32")} == best
    assert answers["1"]["unmeasured_unpredicted"] == {} and answers["32"]["unmeasured_unpredicted"] == {}


LEASE_2026_12_07 = REPO / "benchmarks/results/2026-12-07-h100/tune-spec-8b"


def lease_state(member: str) -> dict:
    with tarfile.open(LEASE_2026_12_07 / "lease1-tunespec.tgz") as pack:
        return json.loads(pack.extractfile(member).read())


def test_the_search_of_2026_12_07_wrote_sglangs_bucket_below_32_and_7_steps_from_32_with_the_edge_at_2():
    """The same pair on another H100 lease (2026-12-07, the overlay of f8c23cc): the search's four servers, replayed:
    the same order; the table it wrote is SGLang's bucket 1 whole below batch 32 (SGLang's table led at c=1) and
    7 steps from 32; the graph sizes its servers logged (1 and 32) put a proof's edge at c=2."""
    state = lease_state("tunespec/8b-search/state.json")
    candidates = [Candidate.from_dict(c) for c in state["candidates"]]
    settings = Settings.from_dict(state["settings"])
    servers = state["servers"]
    for i in range(len(servers)):  # each server is the one the search asks for after the ones before it
        assert plan_next(candidates, servers[:i], settings, 60.0 * i, 60.0).candidate == servers[i]["candidate"]
    assert all(s["graph_bs"] == [1, 32] for s in servers)
    table = plan_table(candidates, servers, replace(settings, prove=2))
    assert table.buckets == {1: [1, 3, 7], 32: [7]} and table.members == ["tuned", "adaptive", "chain-7"]
    assert table.levels == (1, 2, 32)
    written = json.loads((LEASE_2026_12_07 / "search-adaptive-config.json").read_text())
    assert written == config_json(table.buckets, settings.default_config)
    assert written["1"] == {"candidate_steps": [1, 3, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25,
                            "ceiling_coeff": 0}


PROOF_2026_12_07 = REPO / "benchmarks/results/2026-12-07-h100/tune-spec-8b-proof"


def test_the_table_of_2026_12_07_proven_on_one_h100_is_slower_than_neither_and_beats_each_somewhere():
    """That table (above) against SGLang's own table and chain-7, three servers each in the sweep's counterbalanced
    order, at c=1, the edge c=2 and c=32 (lease 2 of 2026-12-07, the overlay of c8fbf65), by the proof's own rule
    (answer.paired: 95% over the i-th servers, an effect only beyond the noise band)."""
    with tarfile.open(PROOF_2026_12_07 / "lease2-tunespec.tgz") as pack:
        state = json.loads(pack.extractfile("tunespec/8b-sweep/state.json").read())
    servers = [s for s in state["servers"] if s["ok"]]
    assert [s["candidate"] for s in servers] == sweep_order(["chain-7", "adaptive", "table"], 3)
    verdicts = {(level, other): paired(servers, level, "table", other, 0.02)["verdict"]
                for level in (1, 2, 32) for other in ("adaptive", "chain-7")}
    assert verdicts == {(1, "adaptive"): "cannot tell", (1, "chain-7"): "higher",
                        (2, "adaptive"): "higher", (2, "chain-7"): "cannot tell",
                        (32, "adaptive"): "higher", (32, "chain-7"): "cannot tell"}
    assert paired(servers, 1, "table", "chain-7", 0.02)["interval"][0] > 1.05  # +7.7% [+5.6, +10.1]
    candidates = [Candidate.from_dict(c) for c in state["candidates"]]
    levels = report.analyse(candidates, servers, Settings.from_dict(state["settings"]))["levels"]
    assert {level: row["answer"] for level, row in levels.items()} == {"1": "table", "2": "table", "32": "table"}


def test_drift_is_named_in_the_h200_lease_that_drifted_and_in_no_other_sweep():
    """One H200, 2026-12-07 (benchmarks/results/2026-12-07-h200/tune-spec-tokenwise/NOTE.txt): the sweep's second
    half ran slower at one request for every candidate (9-32%), not at c=32. The H100 sweeps of 2026-12-06 and the
    8B proof did not drift."""
    from sglang_pcie.tools.tune_spec.search import drift

    with tarfile.open(REPO / "benchmarks/results/2026-12-07-h200/tune-spec-tokenwise/lease-tunespec.tgz") as pack:
        h200 = json.loads(pack.extractfile("tunespec/e2e-tokenwise-sweep/state.json").read())["servers"]
    at_one = drift(h200, 1, 0.02, levels=2)  # the run's two levels: 97.5% each
    assert at_one["resolved"] and at_one["candidates"] == 5 and at_one["confidence"] == 0.975
    assert [round(v * 100, 1) for v in (at_one["change"], *at_one["interval"])] == [-21.4, -35.9, -3.5]
    assert not drift(h200, 32, 0.02, levels=2)["resolved"]
    with gzip.open(REPO / "benchmarks/results/2026-12-06-h100/tune-spec-lease4/e2e-tokenwise-sweep/state.json.gz",
                   "rt") as state:
        lease4 = json.load(state)["servers"]
    with tarfile.open(PROOF_2026_12_07 / "lease2-tunespec.tgz") as pack:
        proof = json.loads(pack.extractfile("tunespec/8b-sweep/state.json").read())["servers"]
    for servers, levels in ((lease4, (1, 32)), (load("sweep")["servers"], (1, 32)), (proof, (1, 2, 32))):
        assert not any(drift(servers, level, 0.02, len(levels))["resolved"] for level in levels)
        assert not any(drift(servers, level, 0.02)["resolved"] for level in levels)  # not even at 95% each
