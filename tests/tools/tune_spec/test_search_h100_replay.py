"""The search replayed on what one H100 measured (2026-12-06, SGLang 0.5.16, the 8B-shaped pair with mixed
acceptance; benchmarks/results/2026-12-06-h100/tune-spec/): its state after the model's three servers, and the
sweep's servers as the measurements of what it starts next."""
from __future__ import annotations

import json

from sglang_pcie.tools.tune_spec import report
from sglang_pcie.tools.tune_spec.candidates import Candidate
from sglang_pcie.tools.tune_spec.search import Settings, plan_next

from support import REPO

RUN = REPO / "benchmarks/results/2026-12-06-h100/tune-spec/8b-mixed"


def load(name: str) -> dict:
    return json.loads((RUN / name / "state.json").read_text())


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
