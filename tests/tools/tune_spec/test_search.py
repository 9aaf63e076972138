"""The search against a known cost model: the measured answer, the leaders, the proof, 'cannot tell', no winner
from noise, failed servers, the counterbalanced orders."""
from __future__ import annotations

from dataclasses import replace

import pytest

from sglang_pcie.tools.tune_spec import report
from sglang_pcie.tools.tune_spec.model import Model
from sglang_pcie.tools.tune_spec.search import (Settings, Step, compare, model_targets, next_of_pair, pairs_needed,
                                                plan_next, plan_proof, sweep_order, unmeasured_leader)
from support.spec_cost_model import FACTS_0_5_16, LAUNCH, CostModelServer, make_settings, tune_with

LEVELS = (1, 32)


def flat(figures, low=(40.0, 400.0), names=None):
    """Overrides: every candidate at ``low`` (c=1, c=32) but those named in ``figures`` (name -> (c=1, c=32))."""
    names = names or ["none"] + [f"chain-{k}" for k in range(1, 8)]
    return {n: dict(zip(LEVELS, figures.get(n, low))) for n in names}


def truths(server, found, level):
    return {c.name: server.truth(c, level) for c in found if c.kind in ("none", "chain")}


def answers(found, settings, state):
    return report.analyse(found, state["servers"], settings)["levels"]


def test_model_servers_first_deepest_and_users_chain_profiled_only_when_asked(tmp_path):
    server = CostModelServer(noise=0.0)
    tune_with(server, tmp_path / "profiled", profile=True)
    assert server.started[:3] == [("chain-7", 1, True, "model"), ("chain-3", 2, True, "model"),
                                  ("none", 3, False, "model")]
    server = CostModelServer(noise=0.0)
    tune_with(server, tmp_path / "plain")
    assert [s[:3] for s in server.started[:3]] == [("chain-7", 1, False), ("chain-3", 2, False), ("none", 3, False)]


def test_finds_the_known_optimum_of_each_level_in_few_servers(tmp_path):
    server = CostModelServer(noise=0.005, seed=3)
    found, settings, state = tune_with(server, tmp_path, budget_min=12, levels=(1, 8, 32, 64))
    levels = answers(found, settings, state)
    for level in (1, 8, 32, 64):
        true = truths(server, found, level)
        pick = levels[str(level)]["answer"]
        assert true[pick] >= max(true.values()) / 1.02, (level, pick, true)
    assert len(state["servers"]) <= (12 * 60 - 90) // 60  # 12 minutes: a 90 s warm-up, then 60 s servers


def test_the_answer_is_always_measured_even_where_the_model_rates_another_higher(tmp_path):
    """chain-4 is slow on the server (as chain-5 is on SGLang 0.5.16 in batch), which the line through the chains
    cannot see: the model predicts it first, the search measures it, and the answer is the best measured."""
    server = CostModelServer(noise=0.0)
    server.overrides = {"chain-4": {32: 0.9 * server.fixed_truth(4, 32)}}
    found, settings, state = tune_with(server, tmp_path, max_servers=4, levels=(32,))
    names = [(s["candidate"], s["role"]) for s in state["servers"]]
    assert names == [("chain-7", "model"), ("chain-3", "model"), ("none", "model"), ("chain-4", "leader")]
    result = answers(found, settings, state)["32"]
    measured = {s["candidate"]: s["levels"]["32"]["value"] for s in state["servers"]}
    assert result["answer"] == max(measured, key=measured.get) == "chain-3"
    pick = report.analyse(found, state["servers"], settings)["recommendation"]
    assert pick["candidate"] == "chain-3" and "--speculative-num-steps 3" in pick["launch"]


def test_an_unmeasured_leader_is_named_with_what_it_would_take(tmp_path):
    server = CostModelServer(noise=0.0, overrides=flat({"chain-3": (100.0, 1000.0), "chain-7": (90.0, 900.0),
                                                         "none": (40.0, 950.0)}))
    found, settings, state = tune_with(server, tmp_path, max_servers=3)
    levels = report.analyse(found, state["servers"], settings, mean_server_s=90.0)["levels"]
    # the flat overrides make the line through chain-3 and chain-7 predict the chains between them above both
    for level in LEVELS:
        result = levels[str(level)]
        assert result["answer"] in ("chain-3", "chain-7", "none")
        for name, more in result["unmeasured_higher"].items():
            assert more["servers"] == 1 and more["minutes"] == 1.5 and more["predicted"] > 0
    text = report.format_report(found, state["servers"], settings,
                                report.analyse(found, state["servers"], settings, 90.0), state["stopped"])
    if any(levels[str(c)]["unmeasured_higher"] for c in LEVELS):
        assert "not measured: " in text and "one server, about 1.5 min would tell" in text


def test_unmeasured_leader_takes_a_prediction_above_or_within_resolve_of_the_best_measured():
    class Fixed:
        def __init__(self, figures):
            self.figures = figures

        def predict(self, k):
            return self.figures.get(k)
    found, settings = make_settings()
    servers = [{"candidate": "chain-7", "ok": True, "levels": {"32": {"value": 100.0}}}]
    assert unmeasured_leader(found, servers, 32, Fixed({3: 99.0}), 0.02) == "chain-3"  # within 2% of 100
    assert unmeasured_leader(found, servers, 32, Fixed({3: 97.0}), 0.02) is None
    assert unmeasured_leader(found, servers, 32, Fixed({3: 97.0, 4: 130.0}), 0.02) == "chain-4"
    failed = servers + [{"candidate": "chain-4", "ok": False}]  # a failed candidate is left out, however predicted
    assert unmeasured_leader(found, failed, 32, Fixed({3: 97.0, 4: 130.0}), 0.02) is None


def predictions_after_the_model_servers(server, tmp_path) -> dict:
    """The analysis after the model's three servers; every chain's prediction checked against the truth."""
    found, settings, state = tune_with(server, tmp_path, max_servers=3)
    analysis = report.analyse(found, state["servers"], settings)
    for level in LEVELS:
        true = truths(server, found, level)
        predicted = [row for row in analysis["levels"][str(level)]["rows"] if row["predicted"] is not None]
        assert len(predicted) == 7
        for row in predicted:
            assert abs(row["predicted"] / true[row["candidate"]] - 1) < 1e-9, (level, row)
    return analysis


def test_predictions_match_the_true_model_without_noise(tmp_path):
    predictions_after_the_model_servers(CostModelServer(noise=0.0), tmp_path)


def test_without_histograms_the_model_says_it_cannot_predict(tmp_path):
    server = CostModelServer(noise=0.0)
    measure = server.measure

    def bare(candidate, index, step):
        entry = measure(candidate, index, step)
        for figures in entry["levels"].values():
            figures["requests_spec"] = None
        return entry
    found, settings = make_settings()
    from sglang_pcie.tools.tune_spec import driver
    state = driver.tune(found, settings, driver.new_state(LAUNCH, settings, {}, found), tmp_path, bare, None,
                        lambda line: None)
    analysis = report.analyse(found, state["servers"], settings)
    for level in LEVELS:
        assert "no acceptance histograms" in analysis["levels"][str(level)]["model"]["cannot_predict"]
        assert all(row["predicted"] is None for row in analysis["levels"][str(level)]["rows"])
    text = report.format_report(found, state["servers"], settings, analysis, state["stopped"])
    assert text.count("the model cannot predict: no acceptance histograms") == 2


def test_cannot_tell_when_the_noise_hides_the_difference(tmp_path):
    # chain-3 and chain-4 1% apart and far above the rest; 5% server noise; 10 minutes of 60 s servers
    server = CostModelServer(noise=0.05, seed=1, overrides=flat(
        {"chain-3": (100.0, 1000.0), "chain-4": (101.0, 1010.0)}))
    found, settings, state = tune_with(server, tmp_path, budget_min=10)
    for level, result in answers(found, settings, state).items():
        assert result["verdict"].startswith("cannot tell"), result["verdict"]


def test_never_a_winner_from_noise_a_a_over_many_seeds(tmp_path):
    """No speculation and the user's chain identical and far ahead of the rest (both always measured), 3% server
    noise: 'is best' would be a false call."""
    calls = runs = 0
    for seed in range(150):
        server = CostModelServer(noise=0.03, seed=seed, overrides=flat(
            {"chain-3": (100.0, 1000.0), "none": (100.0, 1000.0)}))
        found, settings, state = tune_with(server, tmp_path / str(seed), budget_min=20)
        for result in answers(found, settings, state).values():
            runs += 1
            calls += " is best by " in result["verdict"]
    assert calls / runs <= 0.01, (calls, runs)


LAUNCH_5 = [a if a not in ("3", "4") else {"3": "5", "4": "6"}[a] for a in LAUNCH]  # the user runs chain-5


def test_resolves_a_clear_lead_and_says_by_how_much(tmp_path):
    server = CostModelServer(noise=0.01, seed=2, overrides=flat(
        {"chain-7": (100.0, 1000.0), "chain-5": (115.0, 1150.0)}))
    found, settings, state = tune_with(server, tmp_path, launch=LAUNCH_5, budget_min=30)
    result = answers(found, settings, state)["32"]
    assert result["verdict"].startswith("chain-5 is best by +1"), result["verdict"]
    assert result["answer"] == "chain-5"


def test_within_the_target_keeps_the_users_setting(tmp_path):
    server = CostModelServer(noise=0.002, seed=4, overrides=flat(
        {"chain-5": (100.0, 1000.0), "chain-7": (100.1, 1001.0)}))
    found, settings, state = tune_with(server, tmp_path, launch=LAUNCH_5, budget_min=30, resolve=0.02)
    result = answers(found, settings, state)["32"]
    assert "are within 2%: either" in result["verdict"], result["verdict"]
    assert result["answer"] == "chain-5"  # the launch as it is


def test_says_when_speculation_does_not_pay_with_the_break_even(tmp_path):
    server = CostModelServer(noise=0.0, accept=(0.2, 0.05, 0.01, 0, 0, 0, 0), tau={32: (0.35e-3, 0.05e-3)},
                             none_tau={32: 0.28e-3})
    found, settings, state = tune_with(server, tmp_path, budget_min=10, levels=(32,))
    analysis = report.analyse(found, state["servers"], settings)
    assert analysis["levels"]["32"]["no_speculation_best"]
    text = report.format_report(found, state["servers"], settings, analysis, state["stopped"])
    assert "speculation does not pay here" in text and "tokens per verify at this box's costs" in text
    # the chain the model rates best (chain-1) would need tau(1) / tau_none = 0.40 / 0.28 ms per request-verify; its
    # drafter gives 1 + a_1 tokens per verify
    be = analysis["levels"]["32"]["break_even"]
    assert be == {"candidate": "chain-1", "needed_tokens_per_verify": pytest.approx(0.40 / 0.28, abs=1e-9),
                  "measured_tokens_per_verify": pytest.approx(1.2, abs=1e-9)}
    assert "chain-1 would need 1.43 tokens per verify at this box's costs, its drafter gives 1.20" in text


def test_the_break_even_reads_the_median_step_time_of_no_speculations_servers():
    """Three servers of no speculation, at 1x, 0.5x and 1.1x the true figure: the median's step time, 0.28 ms."""
    server = CostModelServer(noise=0.0, tau={32: (0.35e-3, 0.05e-3)}, none_tau={32: 0.28e-3})
    found = {c.name: c for c in make_settings(levels=(32,))[0]}
    chains = [server.measure(found[n], i, Step(n, levels=(32,))) for i, n in enumerate(("chain-7", "chain-3"))]
    nones = [server.measure(found["none"], i, Step("none", levels=(32,))) for i in range(3)]
    for none_entry, factor in zip(nones, (1.0, 0.5, 1.1)):
        none_entry["levels"]["32"]["value"] *= factor
    model = Model(32, chains, nones)
    assert model.none_tau == pytest.approx(0.28e-3, rel=1e-9)
    assert model.break_even(1) == pytest.approx(0.40 / 0.28, rel=1e-9)


def test_a_server_that_fails_is_named_and_the_rest_go_on(tmp_path):
    server = CostModelServer(noise=0.0, fail={"chain-7"})
    found, settings, state = tune_with(server, tmp_path, budget_min=10)
    names = [s[0] for s in server.started]
    assert names.count("chain-7") == 1 and names[1] == "chain-6"  # the next chain stands in for the model
    text = report.format_report(found, state["servers"], settings, report.analyse(found, state["servers"], settings),
                                state["stopped"])
    assert "(chain-7) FAILED: start: server exited with code 1" in text
    assert "launch: python -m sglang.launch_server" in text
    # a candidate that is no chain is left out too: not started again
    server = CostModelServer(noise=0.0, fail={"none"})
    tune_with(server, tmp_path / "none", budget_min=10)
    assert [s[0] for s in server.started].count("none") == 1


def test_counterbalanced_order_of_a_pair():
    servers = [{"candidate": "a", "ok": True}, {"candidate": "b", "ok": True}]
    assert next_of_pair(servers, "a", "b") == "b"
    servers.append({"candidate": "b", "ok": True})
    assert next_of_pair(servers, "a", "b") == "a"
    servers.append({"candidate": "a", "ok": True})
    assert next_of_pair(servers, "a", "b") == "a"


def test_the_sweep_runs_every_candidate_forwards_then_backwards():
    assert sweep_order(["a", "b", "c"], 3) == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    found, settings = make_settings(sweep=2, steps=[1, 3])
    order = []
    servers = []
    while (step := plan_next(found, servers, settings, 0.0, None)).candidate is not None:
        assert step.role == "sweep" and step.levels == LEVELS
        order.append(step.candidate)
        servers.append({"candidate": step.candidate, "ok": True, "levels": {}})
    assert order == ["none", "chain-1", "chain-3", "chain-3", "chain-1", "none"]


def test_pairs_needed_grows_with_the_spread():
    assert pairs_needed(0.0, 0.02) == 2
    assert pairs_needed(0.01, 0.02) < pairs_needed(0.02, 0.02)
    assert pairs_needed(0.2, 0.001) is None


def entry(name, value, level=32):
    return {"candidate": name, "ok": True, "levels": {str(level): {"value": value}}}


def test_compare_needs_two_pairs_and_clears_the_noise_band():
    one = [entry("a", 110), entry("b", 100)]
    assert compare(one, 32, "a", "b", 0.02)["verdict"] == "open"
    two = one + [entry("b", 100), entry("a", 110)]
    assert compare(two, 32, "a", "b", 0.02)["verdict"] == "best"
    noisy = two + [entry("a", 70), entry("b", 100)]  # a's own servers spread widely: no call
    assert compare(noisy, 32, "a", "b", 0.02)["verdict"] != "best"


def test_within_needs_the_noise_band_inside_the_target_too():
    """Two candidates equal on every pair: 'within' while the servers of one candidate agree, not once a third
    candidate's servers spread wider than the target (the band is part of the test, not only the interval)."""
    equal = [entry("a", 100), entry("b", 100), entry("b", 100.1), entry("a", 100.1)]
    assert compare(equal, 32, "a", "b", 0.02)["verdict"] == "within"
    spread = equal + [entry("c", 100), entry("c", 106)]  # c's servers 3% from their median
    assert compare(spread, 32, "a", "b", 0.02)["verdict"] == "noise floor"


def test_model_targets_skip_failed_and_add_the_users_tree():
    launch = [a if a != "1" else "4" for a in LAUNCH]  # topk 4: a tree, not a chain
    found, settings = make_settings(launch)
    assert settings.current == "current"
    assert model_targets(found, [], settings) == ["chain-7", "chain-4", "none", "current"]
    failed = [{"candidate": "chain-7", "ok": False}]
    assert model_targets(found, failed, settings)[0] == "chain-6"


def test_a_tight_server_limit_goes_to_what_the_model_cannot_predict_before_a_leader_within_resolve(tmp_path):
    """SGLang's adaptive steps (no proof: --prove 0) cannot be predicted, so their lead is unbounded; chain-4 (slow
    on the server) is predicted less than --resolve above the chain-3 measured, a lead about the model's own error:
    --max-servers 4 measures adaptive, 5 then chain-4. A chain predicted clearly above still comes first
    (test_what_the_model_cannot_predict_goes_before_a_chain_predicted_within_resolve_of_the_best_measured)."""
    server = CostModelServer(noise=0.0)
    server.overrides = {"chain-4": {32: 0.9 * server.fixed_truth(4, 32)}}
    found, settings, state = tune_with(server, tmp_path / "four", max_servers=4, levels=(32,), facts=FACTS_0_5_16,
                                       prove=0)
    assert [(s["candidate"], s["role"]) for s in state["servers"]] == [
        ("chain-7", "model"), ("chain-3", "model"), ("none", "model"), ("adaptive", "model")]
    result = report.analyse(found, state["servers"], settings)["levels"]["32"]
    assert 0 < result["unmeasured_higher"]["chain-4"]["predicted"] / max(
        s["levels"]["32"]["value"] for s in state["servers"]) - 1 < settings.resolve
    found, settings, state = tune_with(CostModelServer(noise=0.0), tmp_path / "five", max_servers=5, levels=(32,),
                                       facts=FACTS_0_5_16, prove=0)
    assert [(s["candidate"], s["role"]) for s in state["servers"]][3:] == [("adaptive", "model"),
                                                                           ("chain-4", "leader")]


def test_a_table_the_user_gives_is_measured_as_what_the_model_cannot_predict():
    found, settings = make_settings(facts=FACTS_0_5_16, table=("/t/a.json", {1: [5], 32: [0, 3]}))
    assert model_targets(found, [], settings) == ["chain-7", "chain-3", "none", "table"]


def test_sglangs_adaptive_steps_are_a_model_target_only_where_no_proof_measures_them():
    found, settings = make_settings(facts=FACTS_0_5_16, prove=0)
    assert "adaptive" in model_targets(found, [], settings)
    found, settings = make_settings(facts=FACTS_0_5_16, prove=2)
    assert "adaptive" not in model_targets(found, [], settings)


def test_requests_that_differ_are_modelled_per_request(tmp_path):
    """Half the requests accept every draft, half one (the GPU pair's mixed drafter): a histogram pooled over the
    deepest chain's verifies would under-predict the shorter chains; per request the predictions are exact."""
    everything, one = [1.0] * 7, [1.0] + [0.0] * 6
    analysis = predictions_after_the_model_servers(
        CostModelServer(noise=0.0, classes=[(0.5, everything), (0.5, one)]), tmp_path)
    tokens = analysis["levels"]["32"]["model"]["tokens_per_verify"]
    assert abs(tokens["chain-3"] - 1 / (0.5 / 4 + 0.5 / 2)) < 1e-9  # 2.67, where pooling gives 2.38
    # the shares the report prints are pooled over the deepest chain's verifies: a request that accepts every draft
    # takes D / 8 of them, the other D / 2, so a fifth of the verifies accept beyond the first draft
    assert analysis["levels"]["32"]["model"]["accept_at_least"] == pytest.approx([1.0] + [0.2] * 6, abs=1e-9)


def test_every_levels_predicted_leader_is_measured_before_a_pair_is_repeated(tmp_path):
    server = CostModelServer(noise=0.01, seed=5)
    found, settings, state = tune_with(server, tmp_path, budget_min=30, levels=(1, 8, 32, 64))
    roles = [s["role"] for s in state["servers"]]
    assert roles[:3] == ["model"] * 3 and "leader" in roles and "confirm" in roles
    assert max(i for i, r in enumerate(roles) if r == "leader") < roles.index("confirm")


# ------------------------------------------------------------------------------------------------------ proof

def test_the_proof_runs_the_tuned_table_against_sglangs_and_the_best_fixed_setting(tmp_path):
    server = CostModelServer(noise=0.003, seed=7)
    found, settings, state = tune_with(server, tmp_path, facts=FACTS_0_5_16, levels=(1, 8, 32, 64), budget_min=60)
    proof = [s for s in state["servers"] if s["role"] == "proof"]
    table = state["table"]
    assert table is not None and set(table["buckets"]) == {"1", "8", "32", "64"}
    fixed = table["fixed"]
    assert [s["candidate"] for s in proof] == ["tuned", "adaptive", fixed, fixed, "adaptive", "tuned"]
    assert all(set(s["levels"]) == {"1", "7", "8", "31", "32", "63", "64"} for s in proof)  # the edges too
    # the table's steps are each level's best fixed setting, from the search's servers
    for level, steps in table["buckets"].items():
        true = {k: server.fixed_truth(k, int(level)) for k in range(8)}
        assert true[steps[0]] >= max(true.values()) / 1.02, (level, steps, true)
    analysis = report.analyse(found, state["servers"], settings)
    rows = {(r["a"], r["b"]): r for r in analysis["proof"]["rows"]["64"]}
    assert rows[("tuned", "adaptive")]["verdict"] == "higher"  # SGLang's table runs no speculation from 64


def model_servers(figures=(("chain-7", 100), ("chain-3", 120), ("none", 90)), role="model"):
    """One server each, of 60 s, with the same figure at c=1 and c=32."""
    out = []
    for name, value in figures:
        steps = None if name == "none" else int(name.split("-")[1])
        out.append(dict(entry(name, value), role=role, kind="none" if steps is None else "chain", steps=steps,
                        duration_s=60.0))
        out[-1]["levels"]["1"] = {"value": value}
    return out


def test_a_proof_repeat_starts_only_where_all_of_it_fits():
    found, settings = make_settings(facts=FACTS_0_5_16, budget_min=10, levels=(1, 32))
    search = model_servers()
    proof = plan_proof(found, search, settings)
    assert proof.members == ["tuned", "adaptive", "chain-3"] or proof.members == ["adaptive", "chain-3"]
    # 3 servers of 60 s in: a repeat of the proof (up to 3 more) fits 10 minutes ...
    assert plan_next(found, search, settings, 180.0, 60.0).role == "proof"
    # ... but not 9 minutes spent
    assert plan_next(found, search, settings, 540.0, 60.0).role != "proof"
    # ... nor a --max-servers with room for less than all of it
    room = len(search) + len(proof.members)
    assert plan_next(found, search, replace(settings, max_servers=room), 180.0, 60.0).role == "proof"
    assert plan_next(found, search, replace(settings, max_servers=room - 1), 180.0, 60.0).role != "proof"


def test_proof_servers_measure_just_below_each_bucket_unless_no_edges():
    found, settings = make_settings(facts=FACTS_0_5_16, levels=(1, 32))
    assert plan_proof(found, model_servers(), settings).levels == (1, 31, 32)
    assert plan_proof(found, model_servers(), replace(settings, edges=False)).levels == (1, 32)
    # the CUDA-graph sizes a search server logged: batch 2 is padded to 32, where bucket 32 starts
    logged = [dict(s, graph_bs=[1, 32]) for s in model_servers()]
    assert plan_proof(found, logged, settings).levels == (1, 2, 32)


def test_the_table_is_made_from_the_search_servers_only():
    """The proof's and the confirmation's servers do not change the table being proven (chain-7 far ahead there)."""
    found, settings = make_settings(facts=FACTS_0_5_16, levels=(1, 32))
    later = model_servers((("chain-7", 500),), role="proof") + model_servers((("chain-7", 500),), role="confirm")
    proof = plan_proof(found, model_servers() + later, settings)
    assert proof.buckets == {1: [3], 32: [3]} and proof.fixed == "chain-3"


def test_a_table_that_runs_the_best_fixed_setting_everywhere_is_not_proven_or_written(tmp_path):
    server = CostModelServer(noise=0.0, overrides=flat({"chain-3": (100.0, 1000.0)},
                                                       names=["none"] + [f"chain-{k}" for k in range(1, 8)]))
    found, settings, state = tune_with(server, tmp_path, facts=FACTS_0_5_16, budget_min=30)
    assert state["table"] is None and not (tmp_path / "adaptive-config.json").exists()
    proof = [s["candidate"] for s in state["servers"] if s["role"] == "proof"]
    assert set(proof) == {"adaptive", "chain-3"}


@pytest.mark.parametrize("zero_steps", [True, False])
def test_where_no_speculation_is_best_the_bucket_holds_the_best_chain_never_step_0(tmp_path, zero_steps):
    """Whether or not the release takes step 0 in a table: step 0 keeps the speculative path (measured 0.46x of no
    speculation on 0.5.16), so it is never written."""
    from dataclasses import replace
    facts = replace(FACTS_0_5_16, zero_steps=zero_steps, default_table={1: [1, 3, 7], 8: [1, 3], 32: [1]})
    server = CostModelServer(noise=0.0, overrides=flat({"none": (10.0, 2000.0), "chain-7": (100.0, 900.0),
                                                         "chain-3": (60.0, 1000.0)}))
    found, settings, state = tune_with(server, tmp_path, facts=facts, budget_min=30)
    table = state["table"]
    assert 0 not in {step for steps in table["buckets"].values() for step in steps}
    assert table["buckets"]["1"] == [7]
    assert any("a table cannot give it" in note for note in table["notes"])


@pytest.mark.parametrize("prove", [0, 2])
def test_settings_round_trip_through_the_state(prove):
    settings = Settings(levels=(1, 32), resolve=0.02, budget_s=600.0, max_steps=7, current="chain-3", prove=prove)
    assert Settings.from_dict(settings.as_dict()) == settings
    assert Step("x").levels == ()


def test_a_server_that_would_end_exactly_at_the_budget_starts_and_one_past_it_does_not():
    found, settings = make_settings(budget_min=10, max_servers=3)
    assert plan_next(found, [], settings, 540.0, 60.0).candidate == "chain-7"
    stop = plan_next(found, [], settings, 540.5, 60.0)
    assert (stop.candidate, stop.why) == (None, "another server (about 1.0 min) would pass the budget of 10 min")
    three = [{"candidate": n, "ok": True, "levels": {}} for n in ("chain-7", "chain-3", "none")]
    assert plan_next(found, three[:2], settings, 0.0, 60.0).candidate == "none"
    assert plan_next(found, three, settings, 0.0, 60.0).why == "the server limit (3) is reached"


def test_a_confirming_pair_that_would_end_exactly_at_the_budget_is_started_and_one_past_it_is_not():
    found, settings = make_settings(levels=(32,), budget_min=10)
    run = [entry("chain-7", 100.0), entry("chain-3", 103.0), entry("chain-3", 105.0), entry("chain-7", 100.0),
           entry("none", 50.0)]
    row = compare(run, 32, "chain-3", "chain-7", settings.resolve)
    assert row["verdict"] == "open" and row["pairs_needed"] > row["pairs"] == 2
    at = settings.budget_s - 2 * (row["pairs_needed"] - row["pairs"]) * 60.0  # the pairs left, 60 s a server
    confirm = plan_next(found, run, settings, at, 60.0)
    assert (confirm.candidate, confirm.role) == ("chain-7", "confirm")
    assert plan_next(found, run, settings, at + 0.5, 60.0).candidate is None


def test_what_the_model_cannot_predict_goes_before_a_chain_predicted_within_resolve_of_the_best_measured(
        monkeypatch):
    """The H100 run of 2026-12-06: the fourth server went to chain-5, predicted 0.7% above the chain-7 already
    measured (measured 2.9% below it), and SGLang's adaptive table, which then led c=1 by 7.3%, was never measured.
    A chain predicted more than --resolve above the best measured still comes first (it changes the answer if the
    prediction holds)."""
    class Fixed:
        def __init__(self, figures):
            self.figures = figures

        def predict(self, k):
            return self.figures.get(k)
    found, _ = make_settings(facts=FACTS_0_5_16, prove=0)
    servers = [{"candidate": "chain-7", "ok": True, "levels": {"32": {"value": 100.0}}}]
    assert unmeasured_leader(found, servers, 32, Fixed({5: 101.9}), 0.02, clear=True) is None
    assert unmeasured_leader(found, servers, 32, Fixed({5: 99.7}), 0.02) == "chain-5"
    assert unmeasured_leader(found, servers, 32, Fixed({5: 102.1}), 0.02, clear=True) == "chain-5"

    # the next server after the model's three: adaptive where no chain is predicted above the measured best
    from sglang_pcie.tools.tune_spec import search

    found, settings = make_settings(facts=FACTS_0_5_16, prove=0, levels=(32,))
    servers = [{"candidate": name, "ok": True, "levels": {"32": {"value": value}}}
               for name, value in (("chain-7", 100.0), ("chain-3", 95.0), ("none", 80.0))]
    for figures, expected in (({5: 101.9}, ("adaptive", "model")), ({5: 102.1}, ("chain-5", "leader"))):
        monkeypatch.setattr(search, "models", lambda run, levels, figures=figures: {32: Fixed(figures)})
        step = plan_next(found, servers, settings, 0.0, 60.0)
        assert (step.candidate, step.role) == expected, figures
    servers.append({"candidate": "adaptive", "ok": True, "levels": {"32": {"value": 90.0}}})
    monkeypatch.setattr(search, "models", lambda run, levels: {32: Fixed({5: 101.9})})
    step = plan_next(found, servers, settings, 0.0, 60.0)  # then the chain within --resolve
    assert (step.candidate, step.role) == ("chain-5", "leader") and "within 2% of the best measured" in step.why


def test_an_unmeasured_candidate_the_model_cannot_predict_is_named_beside_the_answer(tmp_path):
    server = CostModelServer(noise=0.0)
    found, settings, state = tune_with(server, tmp_path, max_servers=3, prove=0, facts=FACTS_0_5_16)
    assert [s["candidate"] for s in state["servers"]] == ["chain-7", "chain-3", "none"]
    analysis = report.analyse(found, state["servers"], settings, mean_server_s=90.0)
    for level in LEVELS:
        assert analysis["levels"][str(level)]["unmeasured_unpredicted"] == {"adaptive": {"servers": 1,
                                                                                         "minutes": 1.5}}
    text = report.format_report(found, state["servers"], settings, analysis, state["stopped"])
    assert "  adaptive            -          -" in text and "NOT measured: the model cannot predict it" in text
    assert "(measured, among those measured; adaptive not measured)" in text
    assert ("  not measured: adaptive, which the model cannot predict: it may lead by any amount; one server, about"
            " 1.5 min would tell") in text
