"""The one setting to launch: the proof's paired comparisons at known figures (95% Student-t interval of the pairs'
log ratios, the noise band of the proof's own servers), each member's outcomes, the simplest proven pick (fixed,
then SGLang's table, then the tuned one; a less simple one only where resolved higher somewhere and lower nowhere),
and without a proof the geometric-mean pick or the one level's answer."""
from __future__ import annotations

import math
import statistics
from itertools import combinations

import pytest

from sglang_pcie.tools.tune_spec.answer import (analyse_proof, geometric_best, outcomes, paired, proven_pick,
                                                recommend)
from sglang_pcie.tools.tune_spec.candidates import Candidate
from sglang_pcie.tools.tune_spec.search import Settings

T95_DF2 = 4.302652729911275  # P(|T| <= t) = 0.95, two degrees of freedom

FOUND = [Candidate("none", ("--m", "/t"), None, "none"),
         Candidate("chain-3", ("--m", "/t", "--speculative-num-steps", "3"), 3, "chain"),
         Candidate("adaptive", ("--m", "/t", "--speculative-adaptive"), None, "adaptive"),
         Candidate("tuned", ("--m", "/t", "--speculative-adaptive-config", "/r/a c.json"), None, "tuned")]
MEMBERS = ["tuned", "adaptive", "chain-3"]


def servers(level, **figures):
    """Proof servers in counterbalanced order: the i-th of each candidate is its i-th figure."""
    out = []
    for i in range(max(len(v) for v in figures.values())):
        for name, values in (figures.items() if i % 2 == 0 else reversed(figures.items())):
            out.append({"candidate": name, "ok": True, "role": "proof", "levels": {str(level): {"value": values[i]}}})
    return out


def test_paired_higher_and_lower_with_the_interval_at_known_figures():
    run = servers(32, a=[110.0, 112.0, 108.0], b=[100.0, 100.0, 100.0])
    logs = [math.log(r) for r in (1.10, 1.12, 1.08)]
    mean, half = statistics.fmean(logs), T95_DF2 * statistics.stdev(logs) / math.sqrt(3)
    row = paired(run, 32, "a", "b", 0.02)
    assert row["verdict"] == "higher" and row["pairs"] == 3 and row["median"] == pytest.approx(1.10, abs=1e-12)
    assert row["interval"] == pytest.approx([math.exp(mean - half), math.exp(mean + half)], abs=1e-9)
    assert row["noise_margin"] == pytest.approx(110 / 108 - 1, abs=1e-12)  # a's 108 is the farthest from 110
    assert (row["a"], row["b"]) == ("a", "b")
    assert paired(run, 32, "b", "a", 0.02)["verdict"] == "lower"


def test_paired_within_and_cannot_tell():
    run = servers(8, a=[100.0, 100.5, 99.8], b=[100.0, 100.2, 100.0])
    assert paired(run, 8, "a", "b", 0.02)["verdict"] == "within +-2%"
    assert paired(run, 8, "a", "b", 0.025)["verdict"] == "within +-2.5%"
    # a 5% lead on two pairs: the 95% interval (t = 12.7) does not clear zero
    run = servers(8, a=[105.0, 103.0], b=[100.0, 100.0])
    row = paired(run, 8, "a", "b", 0.02)
    assert row["verdict"] == "cannot tell" and row["pairs"] == 2 and row["interval"][0] < 1 < row["interval"][1]
    one = paired(servers(8, a=[150.0], b=[100.0]), 8, "a", "b", 0.02)
    assert (one["verdict"], one["pairs"], one["interval"], one["median"]) == ("cannot tell", 1, None, 1.5)


def test_the_proofs_interval_is_95_not_the_searchs_99():
    """Three pairs whose 95% interval clears the band and whose 99% interval does not."""
    run = servers(32, a=[104.0, 106.0, 105.0], b=[100.0, 100.0, 100.0])
    logs = [math.log(r) for r in (1.04, 1.06, 1.05)]
    low95 = statistics.fmean(logs) - T95_DF2 * statistics.stdev(logs) / math.sqrt(3)
    low99 = statistics.fmean(logs) - 9.924843200918 * statistics.stdev(logs) / math.sqrt(3)
    margin = math.log(105 / 104)  # a's 104 is the farthest from its median 105
    assert low95 > margin > low99
    assert paired(run, 32, "a", "b", 0.02)["verdict"] == "higher"


def row(a, b, verdict):
    return {"a": a, "b": b, "verdict": verdict, "pairs": 2, "median": None, "interval": None, "noise_margin": 0.0}


def proof(verdicts: dict, repeats=2, failed=()):
    """verdicts: level -> {(a, b): verdict}; every other pair of members 'cannot tell'."""
    rows = {str(level): [row(*pair, given.get(pair, "cannot tell")) if pair in given or pair[::-1] not in given
                         else row(*pair[::-1], given[pair[::-1]]) for pair in combinations(MEMBERS, 2)]
            for level, given in verdicts.items()}
    return {"members": MEMBERS, "rows": rows, "repeats_run": repeats, "failed": list(failed)}


def test_outcomes_are_each_members_levels_lower_and_higher():
    got = outcomes(proof({1: {("tuned", "adaptive"): "higher"}, 32: {("chain-3", "tuned"): "higher",
                                                                     ("adaptive", "chain-3"): "within +-2%"}}))
    assert got == {"tuned": (["32"], ["1"]), "adaptive": (["1"], []), "chain-3": ([], ["32"])}


def test_with_nothing_resolved_the_best_fixed_setting_is_the_pick():
    assert proven_pick(FOUND, proof({1: {}, 32: {}})) == (
        "chain-3", "the proof (2 repeat(s)): no less simple member was resolved higher than it and lower nowhere;"
                   " resolved lower than no member")


def test_sglangs_table_replaces_the_fixed_setting_where_resolved_higher_and_lower_nowhere():
    assert proven_pick(FOUND, proof({1: {}, 32: {("adaptive", "chain-3"): "higher"}})) == (
        "adaptive", "the proof (2 repeat(s)): resolved higher than chain-3 at c=32; resolved lower than no member")


def test_a_member_resolved_lower_anywhere_does_not_replace_the_pick():
    pick, why = proven_pick(FOUND, proof({1: {("tuned", "adaptive"): "higher"},
                                          32: {("adaptive", "chain-3"): "higher"}}))
    assert (pick, why) == ("chain-3", "the proof (2 repeat(s)): no less simple member was resolved higher than it"
                                      " and lower nowhere; lower than another member at c=32")
    pick, _ = proven_pick(FOUND, proof({1: {("tuned", "chain-3"): "higher"}, 32: {("tuned", "chain-3"): "lower"}}))
    assert pick == "chain-3"


def test_the_tuned_table_is_picked_over_the_pick_in_either_orientation_of_the_rows():
    # rows as (chain-3, tuned): 'lower' there is the tuned table resolved higher
    given = {1: {("chain-3", "tuned"): "lower"}, 32: {("tuned", "chain-3"): "higher"}}
    assert proven_pick(FOUND, proof(given)) == (
        "tuned", "the proof (2 repeat(s)): resolved higher than chain-3 at c=1, c=32; resolved lower than no member")
    # over chain-3 at more levels than SGLang's table, but nothing resolved over it: the simpler table stays
    given = {1: {("tuned", "chain-3"): "higher"}, 32: {("adaptive", "chain-3"): "higher",
                                                       ("tuned", "chain-3"): "higher"}}
    assert proven_pick(FOUND, proof(given)) == (
        "adaptive", "the proof (2 repeat(s)): resolved higher than chain-3 at c=32; resolved lower than no member")


def settings(levels=(1, 32)):
    return Settings(levels=levels, resolve=0.02, budget_s=3600.0, max_steps=7, current="chain-3", per_batch=True)


def measured(figures: dict, role="model"):
    """name -> {level: figure}: one server each."""
    return [{"candidate": n, "ok": True, "role": role, "levels": {str(c): {"value": v} for c, v in by.items()}}
            for n, by in figures.items()]


def test_recommend_takes_the_proof_where_it_ran_complete():
    analysis = {"proof": proof({1: {}, 32: {("adaptive", "chain-3"): "higher"}}), "levels": {}}
    pick = recommend(FOUND, [], settings(), analysis)
    assert pick == {"candidate": "adaptive", "launch": "python -m sglang.launch_server --m /t --speculative-adaptive",
                    "why": "the proof (2 repeat(s)): resolved higher than chain-3 at c=32; resolved lower than no"
                           " member"}
    one = recommend(FOUND, [], settings(), dict(analysis, proof=dict(analysis["proof"], repeats_run=1)))
    assert (one["candidate"], one["why"].split(":")[0]) == ("adaptive", "the proof (1 repeat(s))")  # one repeat decides
    run = measured({"none": {1: 50.0, 32: 1000.0}, "chain-3": {1: 100.0, 32: 800.0}, "tuned": {1: 99.0, 32: 990.0}})
    for broken in (dict(analysis["proof"], repeats_run=0), dict(analysis["proof"], failed=["tuned"])):
        pick = recommend(FOUND, run, settings(), {"proof": broken, "levels": {}})
        assert pick["candidate"] == "tuned"
        assert pick["launch"] == "python -m sglang.launch_server --m /t --speculative-adaptive-config '/r/a c.json'"
        assert pick["why"] == ("no proof ran; the measured candidate closest to each level's best (geometric mean"
                               " 0.990 of the best per level)")


def test_without_a_proof_one_level_takes_that_levels_answer():
    analysis = {"proof": None, "levels": {"32": {"answer": "none"}}}
    assert recommend(FOUND, [], settings((32,)), analysis) == {
        "candidate": "none", "why": "the best measured candidate at the one level measured",
        "launch": "python -m sglang.launch_server --m /t"}
    nothing = recommend(FOUND, [], settings(), {"proof": None, "levels": {}})
    assert nothing == {"candidate": None, "why": "no candidate was measured at every level", "launch": None}


def test_the_geometric_best_is_measured_at_every_level_and_the_simplest_at_a_tie():
    run = measured({"none": {1: 50.0, 32: 1000.0}, "chain-3": {1: 100.0, 32: 800.0}, "adaptive": {1: 100.0},
                    "tuned": {1: 90.0, 32: 900.0}})
    name, share = geometric_best(FOUND, run, (1, 32))
    assert name == "tuned" and share == pytest.approx(math.sqrt(0.9 * 0.9), abs=1e-12)
    tie = measured({"tuned": {1: 100.0, 32: 800.0}, "adaptive": {1: 100.0, 32: 800.0},
                    "chain-3": {1: 100.0, 32: 800.0}})
    assert geometric_best(FOUND, tie, (1, 32)) == ("chain-3", 1.0)
    assert geometric_best(FOUND, measured({"tuned": {1: 1.0}, "none": {32: 1.0}}), (1, 32)) == (None, None)
    assert geometric_best(FOUND, [], (1, 32)) == (None, None)


def test_analyse_proof_compares_every_pair_at_the_proofs_levels(tmp_path):
    from support.spec_cost_model import FACTS_0_5_16, make_settings
    found, s = make_settings(facts=FACTS_0_5_16, levels=(1, 32))
    search = measured({"chain-7": {1: 100.0, 32: 850.0}, "chain-3": {1: 90.0, 32: 1000.0},
                       "none": {1: 50.0, 32: 950.0}})
    for entry, (kind, steps) in zip(search, (("chain", 7), ("chain", 3), ("none", None))):
        entry.update(kind=kind, steps=steps)
    figures = {"tuned": {1: 101.0, 31: 1010.0, 32: 1010.0}, "adaptive": {1: 95.0, 31: 900.0, 32: 900.0},
               "chain-3": {1: 90.0, 31: 1000.0, 32: 1000.0}}
    proofs = [dict(e, ok=e["candidate"] != "adaptive" or i < 3) for i, e in
              enumerate(measured(figures, "proof") + measured(figures, "proof")[::-1])]
    got = analyse_proof(found, search + proofs, s)
    assert got["members"] == ["tuned", "adaptive", "chain-3"] and got["buckets"] == {"1": [7], "32": [3]}
    assert got["levels"] == [1, 31, 32] and got["main_levels"] == [1, 32]
    assert (got["repeats_run"], got["repeats_planned"], got["failed"]) == (1, 2, ["adaptive"])
    assert {level: [(r["a"], r["b"]) for r in rows] for level, rows in got["rows"].items()} == {
        level: [("tuned", "adaptive"), ("tuned", "chain-3"), ("adaptive", "chain-3")] for level in ("1", "31", "32")}
