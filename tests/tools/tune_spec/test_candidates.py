"""The candidates made from the user's launch: their names, kinds and exact launch arguments (the user's launch with
only the speculative options replaced), the user's setting where it is no chain weighed, SGLang's adaptive steps
started at the table's largest step, and the launches that cannot speculate refused as usage errors."""
from __future__ import annotations

import pytest

from sglang_pcie.tools.command import UsageError
from sglang_pcie.tools.tune_spec.candidates import (Candidate, adaptive_args, candidates, current_name,
                                                    split_speculative, tuned_candidate)
from sglang_pcie.tools.tune_spec.release import AdaptiveFacts

BASE = ["--model-path", "/m/target", "--tp-size", "2"]
DRAFTER = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/m/draft"]
KEEP = ["--speculative-draft-model-path", "/m/draft", "--speculative-algorithm", "EAGLE3"]


def chain(k, topk=1, tokens=None):
    return ["--speculative-num-steps", str(k), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(k + 1 if tokens is None else tokens)]


def launch(*spec):
    return BASE + DRAFTER + list(spec)


def named(found):
    return {c.name: c for c in found}


def shape(found):
    return [(c.name, c.kind, c.steps) for c in found]


def test_none_and_each_chain_keep_the_launch_and_set_only_their_shape():
    found = candidates(BASE[:2] + DRAFTER + chain(3) + BASE[2:] + ["--speculative-attention-mode", "decode"], 3)
    assert shape(found) == [("none", "none", None), ("chain-1", "chain", 1), ("chain-2", "chain", 2),
                            ("chain-3", "chain", 3)]
    c = named(found)
    assert c["none"].args == tuple(BASE)  # every --speculative-* option removed, the rest in its order
    rest = DRAFTER + ["--speculative-attention-mode", "decode"]
    for k in (1, 2):
        assert c[f"chain-{k}"].args == tuple(BASE + rest + ["--speculative-num-steps", str(k),
                                                            "--speculative-eagle-topk", "1",
                                                            "--speculative-num-draft-tokens", str(k + 1)])
    assert current_name(BASE + DRAFTER + chain(3), found) == "chain-3"


def test_a_users_chain_deeper_than_max_steps_is_the_candidate_current():
    user = launch(*chain(5))
    found = candidates(user, 3)
    assert shape(found) == [("none", "none", None), ("chain-1", "chain", 1), ("chain-2", "chain", 2),
                            ("chain-3", "chain", 3), ("current", "current", 5)]
    assert named(found)["current"].args == tuple(user)  # the launch as the user gave it
    assert current_name(user, found) == "current"
    assert named(found)["current"].fixed_steps is None and not named(found)["current"].modelled


def test_only_the_depths_asked_for_and_the_users_chain_outside_them():
    found = candidates(launch(*chain(4)), 7, steps_wanted=[5, 1, 3, 3])
    assert shape(found) == [("none", "none", None), ("chain-1", "chain", 1), ("chain-3", "chain", 3),
                            ("chain-5", "chain", 5), ("current", "current", 4)]
    found = candidates(launch(*chain(3)), 7, steps_wanted=[1, 3])
    assert [c.name for c in found] == ["none", "chain-1", "chain-3"]


@pytest.mark.parametrize("spec", [chain(3, topk=4, tokens=8), chain(3, topk=2, tokens=4), chain(3, tokens=6),
                                  chain(3) + ["--speculative-adaptive"]])
def test_a_tree_or_other_draft_tokens_or_adaptive_is_current_with_no_steps(spec):
    found = candidates(launch(*spec), 7)
    assert found[-1] == Candidate("current", tuple(launch(*spec)), None, "current")
    assert current_name(launch(*spec), found) == "current"
    assert [c.name for c in found].count("chain-3") == 1


def test_a_chain_given_by_its_steps_alone_is_that_chain():
    found = candidates(launch("--speculative-num-steps", "2"), 4)
    assert [c.name for c in found] == ["none", "chain-1", "chain-2", "chain-3", "chain-4"]
    assert current_name(launch("--speculative-num-steps", "2"), found) == "chain-2"


def test_split_takes_both_forms_and_flags_without_a_value():
    rest, spec = split_speculative(["--model-path", "/m", "--speculative-num-steps=3", "--speculative-adaptive",
                                    "--trust-remote-code", "--speculative-eagle-topk", "1", "--speculative-x"])
    assert rest == ["--model-path", "/m", "--trust-remote-code"]
    assert spec == {"--speculative-num-steps": "3", "--speculative-adaptive": True, "--speculative-eagle-topk": "1",
                    "--speculative-x": True}


FACTS_TABLE = AdaptiveFacts(True, "x", per_batch=True, zero_steps=True,
                            default_table={1: [1, 3, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}, version="0.5.16")


def test_sglangs_adaptive_steps_start_at_the_tables_largest_step():
    """0.5.16 sizes the logits buffer its CUDA graphs share by the launch's draft tokens: started at 3 steps, it
    failed capturing the 7-step graphs. The launch starts at 7 steps, 8 draft tokens, top-k 1."""
    found = candidates(launch(*chain(3)), 7, FACTS_TABLE)
    adaptive = found[-1]
    assert (adaptive.name, adaptive.kind, adaptive.steps) == ("adaptive", "adaptive", None)
    assert adaptive.args == tuple(BASE + DRAFTER + ["--speculative-adaptive", "--speculative-num-steps", "7",
                                                    "--speculative-eagle-topk", "1",
                                                    "--speculative-num-draft-tokens", "8"])
    table = {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
    assert "--speculative-num-steps 7 " in " ".join(adaptive_args(BASE, {}, sorted({s for v in table.values()
                                                                                        for s in v})))
    assert adaptive_args(BASE, {}, [0]) == tuple(BASE + ["--speculative-adaptive", "--speculative-num-steps", "1",
                                                         "--speculative-eagle-topk", "1",
                                                         "--speculative-num-draft-tokens", "2"])


def test_the_global_ema_of_0_5_11_starts_at_7_and_turns_the_overlap_scheduler_off():
    facts = AdaptiveFacts(True, "x", needs_no_overlap=True, version="0.5.11")
    adaptive = candidates(launch(*chain(3)), 7, facts)[-1]
    assert adaptive.args == tuple(BASE + ["--disable-overlap-schedule"] + DRAFTER
                                  + ["--speculative-adaptive", "--speculative-num-steps", "7",
                                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8"])
    given = BASE + ["--disable-overlap-schedule"] + DRAFTER + chain(3)
    assert candidates(given, 7, facts)[-1].args.count("--disable-overlap-schedule") == 1
    plain = candidates(launch(*chain(3)), 7, AdaptiveFacts(True, "x", version="0.5.12"))[-1]
    assert "--disable-overlap-schedule" not in plain.args and "--speculative-num-steps 7" in " ".join(plain.args)


def test_no_adaptive_candidate_without_the_release_or_where_the_user_runs_it():
    assert candidates(launch(*chain(3)), 7, AdaptiveFacts(False, version="0.5.9"))[-1].name == "chain-7"
    assert candidates(launch(*chain(3)), 7, None)[-1].name == "chain-7"
    found = candidates(launch(*chain(3), "--speculative-adaptive"), 7, FACTS_TABLE)
    assert [c.name for c in found][-2:] == ["chain-7", "current"]


def test_a_given_table_and_the_tuned_table_run_their_file_from_its_largest_step():
    found = candidates(launch(*chain(3)), 3, None, table=("/t/a.json", {1: [5], 32: [0, 3]}))
    assert found[-1] == Candidate("table", tuple(BASE + DRAFTER + [
        "--speculative-adaptive", "--speculative-adaptive-config", "/t/a.json", "--speculative-num-steps", "5",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6"]), None, "table")
    tuned = tuned_candidate(launch(*chain(3), "--speculative-adaptive-config", "/old.json"), "/run/t.json",
                            {1: [4], 8: [2], 64: [0]})
    assert tuned == Candidate("tuned", tuple(BASE + DRAFTER + [
        "--speculative-adaptive", "--speculative-adaptive-config", "/run/t.json", "--speculative-num-steps", "4",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5"]), None, "tuned")


def test_what_each_kind_is_to_the_model_and_to_a_table():
    found = named(candidates(launch(*chain(3, topk=2, tokens=6)), 2, FACTS_TABLE))
    assert {n: (c.modelled, c.fixed_steps) for n, c in found.items()} == {
        "none": (False, 0), "chain-1": (True, 1), "chain-2": (True, 2), "current": (False, None),
        "adaptive": (False, None)}
    for c in found.values():
        assert Candidate.from_dict(c.as_dict()) == c


@pytest.mark.parametrize("spec, message", [
    (["--speculative-num-steps", "0"], "launch argument --speculative-num-steps 0: must be a positive integer"),
    (["--speculative-eagle-topk", "x"], "launch argument --speculative-eagle-topk x: must be a positive integer"),
    (["--speculative-num-draft-tokens"], "launch argument --speculative-num-draft-tokens: must be a positive integer"),
])
def test_a_shape_that_is_no_positive_integer_is_a_usage_error(spec, message):
    with pytest.raises(UsageError) as caught:
        candidates(launch(*spec), 7)
    assert str(caught.value) == message


def test_the_launch_must_speculate_with_an_eagle_drafter():
    with pytest.raises(UsageError, match="name no --speculative-algorithm"):
        candidates(BASE + ["--speculative-algorithm"], 7)
    with pytest.raises(UsageError, match="NGRAM: tune-spec models EAGLE and EAGLE3 chains only"):
        candidates(BASE + ["--speculative-algorithm", "NGRAM", "--speculative-draft-model-path", "/d"], 7)
    with pytest.raises(UsageError, match="names no --speculative-draft-model-path"):
        candidates(BASE + ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path"], 7)
    alias = BASE + ["--speculative-algorithm", "eagle", "--speculative-draft-model", "/d"]  # 0.5.20+'s alias
    assert [c.name for c in candidates(alias, 1)] == ["none", "chain-1", "current"]


@pytest.mark.parametrize("max_steps", [0, 17])
def test_max_steps_outside_1_to_16_is_a_usage_error(max_steps):
    with pytest.raises(UsageError, match=f"--max-steps {max_steps}: give 1 to 16"):
        candidates(launch(*chain(3)), max_steps)
    assert candidates(launch(*chain(3)), 16)[-1].name == "chain-16"
