"""The vocabulary checks: d2t / t2d, coverage of a text, agreement with a reference drafter."""
from __future__ import annotations

import random

import pytest

from drafter_models import DRAFT_VOCAB, TARGET_VOCAB, by_name, check, make_draft, make_target, raw_tensors
from drafter_models import (frequent_ids_fixture, pair_fixture, src23_fixture,  # noqa: F401 (fixtures)
                            tokenizer_json_fixture)
from sglang_pcie.tools import safetensors_io as st
from sglang_pcie.tools.check_drafter import vocab


def test_wrong_d2t_against_reference_drafter(capsys, tmp_path, pair, frequent_ids, src23):
    """Story 1: a drafter fine-tuned from another model's drafter keeps that model's d2t."""
    target, reference = pair
    rng = random.Random(0)
    others = sorted(rng.sample(range(TARGET_VOCAB), DRAFT_VOCAB))
    broken = make_draft(tmp_path / "finetuned", others)
    code, report = check(capsys, "--draft", broken, "--target", target, "--compare-d2t", reference,
                         "--sglang-source", src23)
    assert code == 1
    comparison = by_name(report)["comparison"]
    assert comparison["status"] == "fail"
    agree = sum(1 for a, b in zip(others, frequent_ids) if a == b)
    assert comparison["agree"] == agree < DRAFT_VOCAB
    assert comparison["reason"].startswith(f"{agree} of {DRAFT_VOCAB} positions agree: the lm_head rows")
    # The broken map alone is valid; the coverage check sees that it misses the text's tokens.
    assert by_name(report)["mapping"]["status"] == "ok"
    assert by_name(report)["coverage"]["share"] < by_name(check(capsys, "--draft", reference, "--target", target,
                                                                 "--sglang-source", src23)[1])["coverage"]["share"]


def test_duplicate_target_ids_in_d2t(capsys, tmp_path, pair, frequent_ids):
    target, _ = pair
    ids = list(frequent_ids)
    ids[10] = ids[9]
    draft = make_draft(tmp_path / "draft", ids)
    code, report = check(capsys, "--draft", draft, "--target", target)
    mapping = by_name(report)["mapping"]
    assert code == 1 and mapping["status"] == "fail"
    assert f"1 duplicate target id (first: draft id 10 -> {ids[9]}, already mapped)" in mapping["reason"]


def test_out_of_range_target_ids_in_d2t(capsys, tmp_path, pair, frequent_ids):
    target, _ = pair
    ids = list(frequent_ids)
    ids[-1] = TARGET_VOCAB + 7
    draft = make_draft(tmp_path / "draft", ids, t2d_ids=frequent_ids)
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert code == 1
    assert (f"1 target id out of range 0..511 (first: draft id {DRAFT_VOCAB - 1} -> {TARGET_VOCAB + 7})"
            in by_name(report)["mapping"]["reason"])


def test_t2d_count_differs_from_draft_vocab_size(capsys, tmp_path, pair, frequent_ids):
    target, _ = pair
    extra = next(t for t in range(TARGET_VOCAB) if t not in frequent_ids)
    draft = make_draft(tmp_path / "draft", frequent_ids, t2d_ids=frequent_ids + [extra])
    code, report = check(capsys, "--draft", draft, "--target", target)
    reason = by_name(report)["mapping"]["reason"]
    assert code == 1
    assert f"t2d marks 257 ids, draft_vocab_size is {DRAFT_VOCAB}" in reason
    assert "d2t and t2d disagree: 0 ids only in d2t, 1 only in t2d" in reason


def test_d2t_and_t2d_inconsistent(capsys, tmp_path, pair, frequent_ids):
    target, _ = pair
    rest = [t for t in range(TARGET_VOCAB) if t not in frequent_ids]
    t2d = frequent_ids[:-5] + rest[:5]  # same count, five different ids
    draft = make_draft(tmp_path / "draft", frequent_ids, t2d_ids=t2d)
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert code == 1
    assert by_name(report)["mapping"]["reason"] == "d2t and t2d disagree: 5 ids only in d2t, 5 only in t2d"


def test_d2t_length_differs_from_draft_vocab_size(capsys, tmp_path, pair, frequent_ids):
    target, _ = pair
    draft = make_draft(tmp_path / "draft", frequent_ids, extra_config={"draft_vocab_size": 300})
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert code == 1
    assert "d2t has 256 entries, draft_vocab_size is 300" in by_name(report)["mapping"]["reason"]


def test_missing_d2t_with_a_smaller_draft_vocab(capsys, tmp_path, pair, frequent_ids):
    target, _ = pair
    draft = make_draft(tmp_path / "draft", frequent_ids)
    tensors = st.read_header(draft / "model.safetensors")
    kept = {n: (e["dtype"], e["shape"], st.pack(e["dtype"], list(st.read_tensor(draft / "model.safetensors", n)[2])))
            for n, e in tensors.items() if n not in ("d2t", "t2d")}
    st.write_safetensors(draft / "model.safetensors", kept)
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert code == 1
    assert by_name(report)["mapping"]["reason"] == (
        "no d2t tensor but draft_vocab_size 256 < vocab_size 512: SGLang would take draft ids 0..255 as target ids")


def test_coverage_without_a_tokenizer_is_a_warning(capsys, tmp_path, frequent_ids):
    target = make_target(tmp_path / "target", None)
    draft = make_draft(tmp_path / "draft", frequent_ids)
    code, report = check(capsys, "--draft", draft, "--target", target)
    cov = by_name(report)["coverage"]
    assert code == 0 and cov["status"] == "warn"
    assert cov["reason"] == "no tokenizer.json in target: coverage not measured"


def test_coverage_with_own_text(capsys, tmp_path, pair):
    target, draft = pair
    text = tmp_path / "t.txt"
    text.write_text("zzzz qqqq xxxx " * 20)  # characters the sample barely has: few tokens in the draft vocab
    code, report = check(capsys, "--draft", draft, "--target", target, "--text", text)
    cov = by_name(report)["coverage"]
    assert cov["text"] == str(text) and cov["share"] < by_name(check(
        capsys, "--draft", draft, "--target", target)[1])["coverage"]["share"]


@pytest.mark.parametrize("last, status", [(TARGET_VOCAB - 1, "ok"), (TARGET_VOCAB, "fail")])
def test_d2t_upper_bound_is_the_vocabulary_size(capsys, tmp_path, pair, frequent_ids, last, status):
    """i + d2t[i] may be vocab_size - 1, never vocab_size."""
    target, _ = pair
    ids = [t for t in frequent_ids if t < TARGET_VOCAB - 1][:DRAFT_VOCAB - 1] + [last]
    draft = make_draft(tmp_path / "draft", ids, t2d_ids=[t for t in ids if t < TARGET_VOCAB])
    code, report = check(capsys, "--draft", draft, "--target", target)
    mapping = by_name(report)["mapping"]
    if status == "ok":
        assert mapping["status"] == "ok" and mapping["reason"].startswith("d2t maps 256 draft ids to distinct target"
                                                                          " ids in 0..511")
    else:
        assert mapping["status"] == "fail"
        assert f"1 target id out of range 0..511 (first: draft id {DRAFT_VOCAB - 1} -> 512)" in mapping["reason"]


@pytest.mark.parametrize("with_d2t", [False, True])
def test_draft_vocabulary_larger_than_the_targets(capsys, tmp_path, pair, with_d2t):
    target, _ = pair
    ids = list(range(TARGET_VOCAB)) + [TARGET_VOCAB + i for i in range(8)]
    draft = make_draft(tmp_path / "draft", ids, draft_vocab=TARGET_VOCAB + 8, with_t2d=False)
    if not with_d2t:
        tensors = raw_tensors(draft / "model.safetensors")
        del tensors["d2t"]
        st.write_safetensors(draft / "model.safetensors", tensors)
    code, report = check(capsys, "--draft", draft, "--target", target)
    mapping = by_name(report)["mapping"]
    assert code == 1 and mapping["status"] == "fail"
    if with_d2t:
        assert mapping["reason"].startswith("draft_vocab_size 520 > the target's vocabulary 512")
    else:
        assert mapping["reason"] == ("no d2t tensor and draft_vocab_size 520 > the target's vocabulary 512: SGLang"
                                     " serves draft id i as target id i, and draft ids 512..519 are no token of the"
                                     " target")


@pytest.mark.parametrize("share, status", [(0.80, "ok"), (0.7999, "warn"), (0.50, "warn"), (0.4999, "fail")])
def test_coverage_thresholds(share, status):
    """Coverage of 80% passes, just below warns; 50% still warns, just below fails."""
    assert vocab.coverage_status(share) == status
    assert (vocab.COVERAGE_WARN, vocab.COVERAGE_FAIL) == (0.80, 0.50)


def test_coverage_below_the_fail_threshold(capsys, tmp_path, pair, tokenizer_json, frequent_ids):
    """A draft vocabulary of the text's rarest tokens: most of the sample's tokens are outside it."""
    target, _ = pair
    rare = [t for t in range(TARGET_VOCAB) if t not in frequent_ids][:DRAFT_VOCAB]
    draft = make_draft(tmp_path / "draft", sorted(rare))
    code, report = check(capsys, "--draft", draft, "--target", target)
    coverage = by_name(report)["coverage"]
    assert code == 1 and coverage["status"] == "fail" and coverage["share"] < vocab.COVERAGE_FAIL


def test_a_t2d_of_the_wrong_length_is_named(capsys, tmp_path, pair, frequent_ids):
    target, _ = pair
    draft = make_draft(tmp_path / "draft", frequent_ids)
    file = draft / "model.safetensors"
    tensors = raw_tensors(file)
    marked = set(frequent_ids)
    tensors["t2d"] = ("BOOL", (TARGET_VOCAB - 1,), st.pack("BOOL", [j in marked for j in range(TARGET_VOCAB - 1)]))
    st.write_safetensors(file, tensors)
    code, report = check(capsys, "--draft", draft, "--target", target)
    mapping = by_name(report)["mapping"]
    assert code == 1 and mapping["status"] == "fail"
    assert f"t2d has shape [{TARGET_VOCAB - 1}], expected [target vocab {TARGET_VOCAB}]" in mapping["reason"]


@pytest.mark.parametrize("shorter", ["mine", "theirs"])
def test_d2t_maps_of_different_lengths_never_agree_whatever_their_common_part(capsys, tmp_path, pair, frequent_ids,
                                                                             shorter):
    """Every position the two maps share agrees, but one map is longer: not "all agree"; the lengths are named."""
    target, reference = pair
    short = make_draft(tmp_path / "short", frequent_ids[:-10], draft_vocab=DRAFT_VOCAB - 10)
    mine, theirs = (short, reference) if shorter == "mine" else (reference, short)
    code, report = check(capsys, "--draft", mine, "--target", target, "--compare-d2t", theirs)
    comparison = by_name(report)["comparison"]
    lengths = ((DRAFT_VOCAB - 10, DRAFT_VOCAB) if shorter == "mine" else (DRAFT_VOCAB, DRAFT_VOCAB - 10))
    assert comparison["status"] == "fail" and comparison["agree"] == DRAFT_VOCAB - 10
    assert comparison["reason"].startswith(f"{DRAFT_VOCAB - 10} of {DRAFT_VOCAB} positions agree")
    assert comparison["reason"].endswith(f"lengths differ: {lengths[0]} vs {lengths[1]}")
