"""What tune-spec says, line by line: each verdict, a level's table with 'not measured' and 'the model cannot
predict', the user's setting kept where within, the tuned table 'NOT measured' or 'no table needed', the proof's
rows, and the recommendation with its launch."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_pcie.tools.tune_spec import report
from sglang_pcie.tools.tune_spec.report import format_report, proof_lines, verdict_line
from support.spec_cost_model import FACTS_0_5_16, LAUNCH, make_settings

SETTINGS = SimpleNamespace(resolve=0.02)


def comparison(verdict, median=1.05, interval=(1.02, 1.08), pairs=3, margin=0.01, needed=None, confidence=0.99):
    return {"leader": "chain-5", "runner_up": "none", "pairs": pairs, "median": median,
            "interval": list(interval) if interval else None, "noise_margin": margin, "verdict": verdict,
            "pairs_needed": needed, "confidence": confidence}


def test_each_verdict_in_its_words():
    ranked = ["chain-5", "none"]
    assert verdict_line([], None, SETTINGS) == "no candidate has a measured figure: every server failed"
    assert verdict_line(["none"], None, SETTINGS) == "none is the only candidate measured"
    assert verdict_line(ranked, comparison("best"), SETTINGS) == (
        "chain-5 is best by +5.0% [99% interval: +2.0% to +8.0%] over none (3 pairs, noise band +-1.0%)")
    assert verdict_line(ranked, comparison("within", 1.001, (0.995, 1.007), margin=0.0), SETTINGS) == (
        "chain-5 and none are within 2%: either (+0.1% [99% interval: -0.5% to +0.7%], 3 pairs)")
    assert verdict_line(ranked, comparison("noise floor", margin=0.03), SETTINGS) == (
        "cannot tell: servers of one candidate spread +-3.0% here, wider than 2%, and the lead does not clear that"
        " spread; chain-5 leads none by +5.0% [99% interval: +2.0% to +8.0%] over 3 pairs, noise band +-3.0%")
    assert verdict_line(ranked, comparison("at the band"), SETTINGS) == (
        "cannot tell: the lead is about the servers' own spread, more pairs do not settle it; chain-5 leads none by"
        " +5.0% [99% interval: +2.0% to +8.0%] over 3 pairs, noise band +-1.0%")
    assert verdict_line(ranked, comparison("open", needed=7), SETTINGS) == (
        "cannot tell within the budget: chain-5 leads none by +5.0% [99% interval: +2.0% to +8.0%] over 3 pairs,"
        " noise band +-1.0%; about 7 pairs would resolve 2%")
    assert verdict_line(ranked, comparison("open", interval=(0.5, 1.0), needed=9), SETTINGS).startswith(
        "cannot tell within the budget: chain-5 leads none by +5.0% [99% interval: -50.0% to +0.0%] over 3 pairs"
    )  # within 2x: shown
    assert verdict_line(ranked, comparison("open", interval=(0.5, 1.25)), SETTINGS) == (
        "cannot tell within the budget: chain-5 leads none by +5.0% [interval wider than 2x: nothing resolved] over"
        " 3 pairs, noise band +-1.0%; resolving 2% needs more than 50 pairs at this spread")
    assert verdict_line(ranked, comparison("best", confidence=0.95), SETTINGS) == (  # a proof's fixed design
        "chain-5 is best by +5.0% [95% interval: +2.0% to +8.0%] over none (3 pairs, noise band +-1.0%)")
    assert verdict_line(ranked, comparison("open", interval=(0.5, 1.25), pairs=2), SETTINGS).endswith(
        "; resolving 2% needs more than 50 pairs at this spread")  # two pairs are enough to say so
    assert verdict_line(ranked, comparison("open", 1.1, None, 1, 0.0), SETTINGS) == (
        "cannot tell within the budget: chain-5 leads none by +10.0% over 1 pair")


MODEL = {"cannot_predict": None, "accept_at_least": [0.8, 0.6], "acceptance_source": "per request", "requests": 8,
         "tau_ms": {"alpha": 1.5, "beta": 0.25}, "depths_measured": [3, 7]}


def level(**over):
    rows = [{"candidate": "none", "predicted": None, "measured": 1000.0, "interval": (990.0, 1010.0),
             "values": [995.0, 1000.0, 1005.0], "n": 3, "failed": False},
            {"candidate": "chain-3", "predicted": 900.0, "measured": 945.0, "interval": None, "values": [945.0],
             "n": 1, "failed": False},
            {"candidate": "chain-1", "predicted": None, "measured": 905.0, "interval": (850.0, 960.0),
             "values": [900.0, 910.0], "n": 2, "failed": False},
            {"candidate": "chain-5", "predicted": 1100.0, "measured": None, "interval": None, "values": [], "n": 0,
             "failed": False},
            {"candidate": "chain-6", "predicted": None, "measured": None, "interval": None, "values": [], "n": 0,
             "failed": False},
            {"candidate": "chain-7", "predicted": None, "measured": None, "interval": None, "values": [], "n": 0,
             "failed": True}]
    result = {"label": "output tok/s at c=32", "rows": rows, "model": MODEL, "verdict": "V", "answer": "none",
              "unmeasured_higher": {"chain-5": {"predicted": 1100.0, "servers": 1, "minutes": 1.5}},
              "no_speculation_best": True,
              "break_even": {"candidate": "chain-3", "needed_tokens_per_verify": 2.75,
                             "measured_tokens_per_verify": 2.5}}
    result.update(over)
    return result


def test_a_levels_lines():
    assert report._level_lines(level(), 32) == [
        "output tok/s at c=32",
        "  candidate   predicted   measured   95% interval (n>=3)             min-max   n  note",
        "  none                -     1000.0        [990.0-1010.0]        995.0-1005.0   3  answer",
        "  chain-3         900.0      945.0                     -                   -   1  measured/predicted 1.050",
        "  chain-1             -      905.0                     -         900.0-910.0   2  ",
        "  chain-5        1100.0          -                     -                   -   0  ",
        "  chain-7             -          -                     -                   -   0  FAILED",
        "  accepted at least j drafts, deepest chain (per request, 8 request(s)): 1: 80.0%  2: 60.0%",
        "  step time per request-verify: 1.500 + 0.250 ms per draft step (chains measured at 3, 7 steps)",
        "  verdict: V",
        "  answer at c=32: none (measured)",
        "  not measured: chain-5, predicted 1100.0, above the answer; one server, about 1.5 min would tell (the"
        " answer stays the measured one)",
        "  speculation does not pay here: chain-3 would need 2.75 tokens per verify at this box's costs, its drafter"
        " gives 2.50"]


def test_cannot_predict_and_an_unmeasured_leader_without_a_server_time():
    lines = report._level_lines(level(model=dict(MODEL, cannot_predict="no acceptance histograms"),
                                      unmeasured_higher={"chain-5": {"predicted": 1100.0, "servers": 1,
                                                                     "minutes": None}},
                                      no_speculation_best=False), 1)
    assert "  the model cannot predict: no acceptance histograms" in lines
    assert not any(line.startswith("  accepted at least") or line.startswith("  step time") for line in lines)
    assert "  answer at one request (c=1): none (measured)" in lines
    assert ("  not measured: chain-5, predicted 1100.0, above the answer; one server would tell (the answer stays"
            " the measured one)") in lines
    assert not any("speculation does not pay" in line for line in lines)


def entry(name, kind, steps, figures, role="model", ok=True):
    return {"candidate": name, "kind": kind, "steps": steps, "index": 0, "role": role, "ok": ok,
            "failure": None if ok else "start: exit 1", "levels": {str(c): {"value": v} for c, v in figures.items()}}


def test_the_level_keeps_the_users_setting_only_where_it_is_one_of_the_two_within():
    found, settings = make_settings(LAUNCH, levels=(32,))  # the user runs chain-3
    run = [entry("chain-7", "chain", 7, {32: 1000.0}), entry("chain-3", "chain", 3, {32: 999.5}),
           entry("chain-3", "chain", 3, {32: 1000.8}), entry("chain-7", "chain", 7, {32: 1001.0})]
    result = report.analyse(found, run, settings)["levels"]["32"]
    assert result["comparison"]["leader"] == "chain-7" and result["comparison"]["verdict"] == "within"
    assert result["answer"] == "chain-3"  # equal within 2%: the launch as it is
    assert result["unmeasured_higher"] == {} and result["no_speculation_best"] is False
    # the user's chain-3 not among the two within: the leader is the answer
    run = [entry("chain-7", "chain", 7, {32: 1000.0}), entry("chain-5", "chain", 5, {32: 999.5}),
           entry("chain-5", "chain", 5, {32: 1000.8}), entry("chain-7", "chain", 7, {32: 1001.0}),
           entry("chain-3", "chain", 3, {32: 900.0})]
    result = report.analyse(found, run, settings)["levels"]["32"]
    assert result["comparison"]["verdict"] == "within" and result["answer"] == "chain-7"


def test_only_predictions_above_the_best_measured_are_named(tmp_path):
    from support.spec_cost_model import CostModelServer, tune_with
    found, settings, state = tune_with(CostModelServer(noise=0.0), tmp_path, max_servers=3, levels=(8,))
    result = report.analyse(found, state["servers"], settings, mean_server_s=60.0)["levels"]["8"]
    best = max(r["measured"] for r in result["rows"] if r["measured"])
    predicted = {r["candidate"]: r["predicted"] for r in result["rows"] if r["predicted"] and not r["n"]}
    above = {n: v for n, v in predicted.items() if v > best}
    assert len(above) >= 2 and len(above) < len(predicted)  # some above the answer, some not
    assert result["unmeasured_higher"] == {n: {"predicted": v, "servers": 1, "minutes": 1.0} for n, v in above.items()}
    assert list(result["unmeasured_higher"]) == sorted(above, key=above.get, reverse=True)  # the highest first


def analysis(**over):
    base = {"servers_by_role": {"model": 2}, "levels": {"32": level()}, "proof": None, "table": None,
            "recommendation": {"candidate": None, "why": "no candidate was measured at every level", "launch": None}}
    base.update(over)
    return base


def text_of(result, servers=(), warmup=None):
    return format_report([], list(servers), SimpleNamespace(levels=(32,)), result, "the budget", "SGLang 0.5.16 ...",
                         warmup)


def test_the_report_says_no_table_needed_or_the_table_not_measured():
    table = {"buckets": {"1": [7], "32": [0]}, "notes": ["c=32: n"], "fixed": "chain-3", "needed": True}
    lines = text_of(analysis(table=table)).splitlines()
    assert lines[0] == "tune-spec: 0 server(s) measured (model 2); stopped: the budget"
    assert lines[1] == "release: SGLang 0.5.16 ..."
    assert ("the table for this box (adaptive-config.json in the run's folder): batch 1-31: 7 steps; batch 32-up: no"
            " speculation; NOT measured (no proof ran: --prove 0, the budget, or SGLang's own table left out): prove"
            " it with --resume DIR --prove 2") in lines
    assert "  note: c=32: n" in lines
    lines = text_of(analysis(table=dict(table, needed=False, notes=[]))).splitlines()
    assert "no table needed: chain-3 is the best measured fixed setting at every level" in lines
    assert not any("NOT measured" in line for line in lines)
    own = dict(table, buckets={"1": [1, 3, 7], "32": [0, 1]}, needed=False, notes=[])  # SGLang's buckets at each
    lines = text_of(analysis(table=own)).splitlines()
    assert "no table needed: SGLang's own table measured fastest of the speculative settings at every level" in lines
    assert not any("best measured fixed setting" in line for line in lines)
    assert lines[-1] == "recommendation: none measured (no candidate was measured at every level)"


def test_without_a_proof_the_report_says_whether_the_table_for_this_box_is_needed():
    found, settings = make_settings(LAUNCH, levels=(1, 32), facts=FACTS_0_5_16, prove=0)

    def said(chain_3_at_1):
        run = [entry("chain-7", "chain", 7, {1: 100.0, 32: 800.0}),
               entry("chain-3", "chain", 3, {1: chain_3_at_1, 32: 1000.0}),
               entry("none", "none", None, {1: 50.0, 32: 900.0})]
        return format_report(found, run, settings, report.analyse(found, run, settings), "the budget").splitlines()
    # chain-7 best at c=1, chain-3 at c=32: a table would run each
    assert ("the table for this box (adaptive-config.json in the run's folder): batch 1-31: 7 steps; batch 32-up: 3"
            " steps; NOT measured (no proof ran: --prove 0, the budget, or SGLang's own table left out): prove it with"
            " --resume DIR --prove 2") in said(90.0)
    # chain-3 best at both: the table is that fixed chain
    lines = said(110.0)
    assert "no table needed: chain-3 is the best measured fixed setting at every level" in lines
    assert not any(line.startswith("the table for this box") for line in lines)


def test_the_report_names_failed_servers_the_warm_up_and_the_launch():
    servers = [dict(entry("chain-7", "chain", 7, {}, ok=False), index=1)]
    warmup = {"candidate": "chain-7", "ok": True, "duration_s": 90.0, "failure": None}  # as servers.warm returns it
    pick = {"candidate": "none", "why": "w", "launch": "python -m sglang.launch_server --m /t"}
    lines = text_of(analysis(recommendation=pick), servers, warmup).splitlines()
    assert lines[0] == ("tune-spec: 1 server(s) measured (model 2) after one warm-up server (chain-7); stopped:"
                        " the budget")
    failed = dict(warmup, ok=False, failure="start: exit 1")
    assert text_of(analysis(recommendation=pick), servers, failed).splitlines()[0] == (
        "tune-spec: 1 server(s) measured (model 2) after one warm-up server (chain-7, FAILED: start: exit 1);"
        " stopped: the budget")
    assert text_of(analysis(recommendation=pick), servers).splitlines()[0] == (
        "tune-spec: 1 server(s) measured (model 2); stopped: the budget")
    assert "  server 1 (chain-7) FAILED: start: exit 1" in lines
    assert lines[-2:] == ["recommendation: none (w)", "launch: python -m sglang.launch_server --m /t"]


def test_the_proofs_lines():
    proof = {"buckets": {"1": [7], "8": [3], "64": [0]}, "notes": [], "members": ["tuned", "adaptive", "chain-3"],
             "fixed": "chain-3", "fixed_share": 0.9512, "repeats_run": 1, "repeats_planned": 2, "failed": ["tuned"],
             "main_levels": [1, 8], "rows": {"7": [{"a": "tuned", "b": "adaptive", "median": 1.031,
                                                    "interval": [1.01, 1.05], "verdict": "higher"},
                                                   {"a": "tuned", "b": "chain-3", "median": None, "interval": None,
                                                    "verdict": "cannot tell"}],
                                             "8": [{"a": "adaptive", "b": "chain-3", "median": 0.99,
                                                    "interval": [0.5, 1.5], "verdict": "cannot tell"}]}}
    assert proof_lines(proof) == [
        "the table for this box: batch 1-7: 7 steps; batch 8-63: 3 steps; batch 64-up: no speculation (SGLang pads a"
        " batch to a CUDA-graph batch size before it picks the bucket)",
        "proof: tuned, adaptive, chain-3 (chain-3 is the best fixed setting: geometric mean 0.951 of the best per"
        " level); 1 of 2 repeat(s) run; 95% intervals over the pairs, an effect called only beyond the proof servers'"
        " own spread",
        "  FAILED: tuned: the proof is incomplete",
        "  c=7 (edge): tuned/adaptive +3.1% [+1.0% to +5.0%] higher; tuned/chain-3 - cannot tell",
        "  c=8: adaptive/chain-3 -1.0% cannot tell"]


def sweep_of(first: dict, second: dict, level: int = 1) -> list[dict]:
    """Servers in A..Z Z..A order: each candidate's first figure, then its second, the second pass reversed."""
    names = list(first)
    return ([entry(n, "chain", 3, {level: first[n]}) for n in names]
            + [entry(n, "chain", 3, {level: second[n]}) for n in reversed(names)])


def test_drift_is_named_where_every_candidate_moved_alike_and_only_there():
    from sglang_pcie.tools.tune_spec.search import drift

    first = {"a": 1000.0, "b": 900.0, "c": 800.0, "d": 700.0}
    slower = drift(sweep_of(first, {"a": 790.0, "b": 730.0, "c": 610.0, "d": 560.0}), 1, 0.02)
    assert slower["resolved"] and slower["candidates"] == 4
    # the geometric mean of 0.790, 0.811, 0.7625 and 0.800
    assert slower["change"] == pytest.approx((0.79 * 730 / 900 * 0.7625 * 0.8) ** 0.25 - 1)
    assert slower["interval"][1] < 0
    assert (slower["smallest"], slower["largest"]) == (pytest.approx(610 / 800 - 1), pytest.approx(730 / 900 - 1))
    # the same figures, each candidate's two servers swapped: faster, named the same way
    assert drift(sweep_of({"a": 790.0, "b": 730.0, "c": 610.0, "d": 560.0}, first), 1, 0.02)["resolved"]
    # changes of both signs: noise, not drift
    assert not drift(sweep_of(first, {"a": 1100.0, "b": 800.0, "c": 880.0, "d": 620.0}), 1, 0.02)["resolved"]
    # every candidate a little slower, clearly, but less than the resolve target (the 2026-12-06 H100 at c=32: +1.5%
    # [+0.1, +2.9]): not named
    small = drift(sweep_of(first, {"a": 990.0, "b": 891.0, "c": 792.5, "d": 692.0}), 1, 0.02)
    assert small["interval"][1] < 0 and not small["resolved"]
    # two candidates with two servers: no interval worth the name
    assert drift(sweep_of({"a": 1000.0, "b": 900.0}, {"a": 700.0, "b": 600.0}), 1, 0.02) is None
    assert drift(sweep_of(first, {"a": 790.0, "b": 730.0, "c": 610.0, "d": 560.0}), 32, 0.02) is None  # no figures


def test_the_drift_line_under_the_verdict():
    slower = {"candidates": 5, "change": -0.214, "interval": [-0.359, -0.035], "smallest": -0.323,
              "largest": -0.094, "resolved": True, "confidence": 0.975}
    lines = report._level_lines(level(drift=slower), 1)
    assert lines[lines.index("  verdict: V") + 1] == (
        "  drift: each candidate's last server ran -21.4% against its first on average [97.5% interval: -35.9% to"
        " -3.5%; 5 candidates, from -32.3% to -9.4%]: this host's speed changed during the run; pairs cancel a"
        " steady drift, not a step: find what else ran here, rerun")
    for quiet in (dict(slower, resolved=False), None):
        assert not any("drift" in line for line in report._level_lines(level(drift=quiet), 1))
    assert not any("drift" in line for line in report._level_lines(level(), 1))  # a result from before the field


def test_the_drift_interval_widens_with_the_levels_a_run_judges():
    from sglang_pcie.tools.tune_spec.search import drift

    servers = sweep_of({"a": 1000.0, "b": 900.0, "c": 800.0}, {"a": 880.0, "b": 700.0, "c": 720.0})
    one, four = drift(servers, 1, 0.02), drift(servers, 1, 0.02, levels=4)
    assert (one["confidence"], four["confidence"]) == (0.95, 0.9875)
    assert four["interval"][0] < one["interval"][0] < one["interval"][1] < four["interval"][1]
    assert four["change"] == one["change"]
    found, settings = make_settings(LAUNCH, levels=(1, 32))
    analysed = report.analyse(found, [dict(s, candidate=f"chain-{' abc'.index(s['candidate'])}") for s in servers],
                              settings)
    assert analysed["levels"]["1"]["drift"]["confidence"] == 0.975  # two levels: 2.5% each
