"""The search against a known cost model: the optimum, 'cannot tell', no winner from noise, failed servers."""
from __future__ import annotations

from sglang_pcie.tools.tune_spec import report
from sglang_pcie.tools.tune_spec.search import compare, model_targets, next_of_pair, pairs_needed
from support.spec_cost_model import LAUNCH, CostModelServer, make_settings, tune_with


def flat(figures, low=(400.0, 40.0)):
    """Overrides: every candidate at ``low`` but those named in ``figures`` (name -> (batch, latency))."""
    names = ["none"] + [f"chain-{k}" for k in range(1, 8)]
    return {n: dict(zip(("batch", "latency"), figures.get(n, low))) for n in names}


def truths(server, found, workload):
    return {c.name: server.truth(c.name, c.steps if c.kind == "chain" else None, workload) for c in found
            if c.kind in ("none", "chain")}


def test_model_servers_first_deepest_and_users_chain_profiled_only_when_asked(tmp_path):
    server = CostModelServer(noise=0.0)
    tune_with(server, tmp_path / "profiled", profile=True)
    assert server.started[:3] == [("chain-7", 1, True), ("chain-3", 2, True), ("none", 3, False)]
    server = CostModelServer(noise=0.0)
    tune_with(server, tmp_path / "plain")
    assert server.started[:3] == [("chain-7", 1, False), ("chain-3", 2, False), ("none", 3, False)]


def test_finds_the_known_optimum_of_each_workload_in_few_servers(tmp_path):
    server = CostModelServer(noise=0.005, seed=3)
    found, settings, state = tune_with(server, tmp_path, budget_min=12)
    analysis = report.analyse(found, state["servers"], settings)
    for workload in ("batch", "latency"):
        true = truths(server, found, workload)
        pick = analysis[workload]["recommended"]
        assert true[pick] >= max(true.values()) / 1.02, (workload, pick, true)
    assert len(state["servers"]) <= (12 * 60 - 90) // 60  # 12 minutes: a 90 s warm-up, then 60 s servers


def predictions_after_the_model_servers(server, tmp_path) -> dict:
    """The analysis after the model's three servers; every chain's prediction checked against the truth."""
    found, settings, state = tune_with(server, tmp_path, max_servers=3)
    analysis = report.analyse(found, state["servers"], settings)
    for workload in ("batch", "latency"):
        true = truths(server, found, workload)
        predicted = [row for row in analysis[workload]["rows"] if row["predicted"] is not None]
        assert len(predicted) == 7
        for row in predicted:
            assert abs(row["predicted"] / true[row["candidate"]] - 1) < 1e-9, (workload, row)
    return analysis


def test_predictions_match_the_true_model_without_noise(tmp_path):
    predictions_after_the_model_servers(CostModelServer(noise=0.0), tmp_path)


def test_cannot_tell_when_the_noise_hides_the_difference(tmp_path):
    # chain-3 and chain-4 1% apart and far above the rest; 5% server noise; 10 minutes of 60 s servers
    server = CostModelServer(noise=0.05, seed=1, overrides=flat(
        {"chain-3": (1000.0, 100.0), "chain-4": (1010.0, 101.0)}))
    found, settings, state = tune_with(server, tmp_path, budget_min=10)
    analysis = report.analyse(found, state["servers"], settings)
    for workload in ("batch", "latency"):
        line = analysis[workload]["verdict"]
        assert line.startswith("cannot tell"), line


def test_never_a_winner_from_noise_a_a_over_many_seeds(tmp_path):
    """No speculation and the user's chain identical and far ahead of the rest (both always measured), 3% server
    noise: 'is best' would be a false call."""
    calls = runs = 0
    for seed in range(300):
        server = CostModelServer(noise=0.03, seed=seed, overrides=flat(
            {"chain-3": (1000.0, 100.0), "none": (1000.0, 100.0)}))
        found, settings, state = tune_with(server, tmp_path / str(seed), budget_min=20)
        analysis = report.analyse(found, state["servers"], settings)
        for workload in ("batch", "latency"):
            runs += 1
            calls += " is best by " in analysis[workload]["verdict"]
    assert calls / runs <= 0.01, (calls, runs)


def test_resolves_a_clear_lead_and_says_by_how_much(tmp_path):
    server = CostModelServer(noise=0.01, seed=2, overrides=flat(
        {"chain-3": (1000.0, 100.0), "chain-5": (1150.0, 115.0)}))
    found, settings, state = tune_with(server, tmp_path, budget_min=30)
    analysis = report.analyse(found, state["servers"], settings)
    assert analysis["batch"]["verdict"].startswith("chain-5 is best by +1"), analysis["batch"]["verdict"]
    assert analysis["batch"]["recommended"] == "chain-5"


def test_within_the_target_keeps_the_users_setting(tmp_path):
    server = CostModelServer(noise=0.002, seed=4, overrides=flat(
        {"chain-3": (1000.0, 100.0), "chain-5": (1001.0, 100.1)}))
    found, settings, state = tune_with(server, tmp_path, budget_min=30, resolve=0.02)
    analysis = report.analyse(found, state["servers"], settings)
    assert "are within 2%: either" in analysis["batch"]["verdict"], analysis["batch"]["verdict"]
    assert analysis["batch"]["recommended"] == "chain-3"  # the launch as it is


def test_says_when_speculation_does_not_pay_with_the_break_even(tmp_path):
    server = CostModelServer(noise=0.0, accept=(0.2, 0.05, 0.01, 0, 0, 0, 0), batch_tau=(0.35e-3, 0.05e-3),
                             none_batch_tau=0.28e-3)
    found, settings, state = tune_with(server, tmp_path, budget_min=10, workloads=("batch",))
    analysis = report.analyse(found, state["servers"], settings)
    assert analysis["batch"]["no_speculation_best"]
    text = report.format_report(found, state["servers"], settings, analysis, state["stopped"], 32)
    assert "speculation does not pay here" in text and "tokens per verify at this box's costs" in text
    be = analysis["batch"]["break_even"]
    assert be["needed_tokens_per_verify"] > be["measured_tokens_per_verify"]


def test_a_server_that_fails_is_named_and_the_rest_go_on(tmp_path):
    server = CostModelServer(noise=0.0, fail={"chain-7"})
    found, settings, state = tune_with(server, tmp_path, budget_min=10)
    names = [name for name, _, _ in server.started]
    assert names.count("chain-7") == 1 and names[1] == "chain-6"  # the next chain stands in for the model
    text = report.format_report(found, state["servers"], settings, report.analyse(found, state["servers"], settings),
                                state["stopped"], 32)
    assert "(chain-7) FAILED: start: server exited with code 1" in text
    assert "launch (" in text


def test_counterbalanced_order_of_a_pair():
    servers = [{"candidate": "a", "ok": True}, {"candidate": "b", "ok": True}]
    assert next_of_pair(servers, "a", "b") == "b"
    servers.append({"candidate": "b", "ok": True})
    assert next_of_pair(servers, "a", "b") == "a"
    servers.append({"candidate": "a", "ok": True})
    assert next_of_pair(servers, "a", "b") == "a"


def test_pairs_needed_grows_with_the_spread():
    assert pairs_needed(0.0, 0.02) == 2
    assert pairs_needed(0.01, 0.02) < pairs_needed(0.02, 0.02)
    assert pairs_needed(0.2, 0.001) is None


def test_compare_needs_two_pairs_and_clears_the_noise_band():
    def entry(name, v):
        return {"candidate": name, "ok": True, "batch": {"value": v}}
    one = [entry("a", 110), entry("b", 100)]
    assert compare(one, "batch", "a", "b", 0.02)["verdict"] == "open"
    two = one + [entry("b", 100), entry("a", 110)]
    assert compare(two, "batch", "a", "b", 0.02)["verdict"] == "best"
    noisy = two + [entry("a", 70), entry("b", 100)]  # a's own servers spread widely: no call
    assert compare(noisy, "batch", "a", "b", 0.02)["verdict"] != "best"


def test_model_targets_skip_failed_and_add_the_users_tree():
    launch = [a if a != "1" else "4" for a in LAUNCH]  # topk 4: a tree, not a chain
    found, settings = make_settings(launch)
    assert settings.current == "current"
    assert model_targets(found, [], settings) == ["chain-7", "chain-4", "none", "current"]
    failed = [{"candidate": "chain-7", "ok": False}]
    assert model_targets(found, failed, settings)[0] == "chain-6"


def test_requests_that_differ_are_modelled_per_request(tmp_path):
    """Half the requests accept every draft, half one (the GPU pair's mixed drafter): a histogram pooled over the
    deepest chain's verifies would under-predict the shorter chains; per request the predictions are exact."""
    everything, one = [1.0] * 7, [1.0] + [0.0] * 6
    analysis = predictions_after_the_model_servers(
        CostModelServer(noise=0.0, classes=[(0.5, everything), (0.5, one)]), tmp_path)
    tokens = analysis["batch"]["model"]["tokens_per_verify"]
    assert abs(tokens["chain-3"] - 1 / (0.5 / 4 + 0.5 / 2)) < 1e-9  # 2.67, where pooling gives 2.38


def test_every_workloads_leaders_are_measured_before_a_pair_is_repeated(tmp_path):
    """As on the GPU run: batch's two leaders (none, chain-7) are measured by the model's servers, one request's
    predicted runner-up is not: it comes before a repeat of the batch pair."""
    server = CostModelServer(noise=0.0, overrides=flat({"none": (1000.0, 10.0), "chain-3": (500.0, 60.0),
                                                         "chain-7": (950.0, 100.0)}))
    found, settings, state = tune_with(server, tmp_path, max_servers=4)
    names = [s["candidate"] for s in state["servers"]]
    assert names[:3] == ["chain-7", "chain-3", "none"]
    assert names[3] not in ("none", "chain-7", "chain-3"), names
