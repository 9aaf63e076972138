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


@pytest.mark.parametrize("dtype, shape", [("F32", (DRAFT_VOCAB,)), ("I64", (DRAFT_VOCAB, 1))])
def test_a_d2t_that_is_not_a_1d_integer_tensor_fails_and_coverage_is_not_measured(capsys, tmp_path, pair,
                                                                                frequent_ids, dtype, shape):
    target, _ = pair
    draft = make_draft(tmp_path / "draft", frequent_ids)
    tensors = raw_tensors(draft / "model.safetensors")
    tensors["d2t"] = (dtype, shape, st.pack(dtype, [0] * DRAFT_VOCAB))
    st.write_safetensors(draft / "model.safetensors", tensors)
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert code == 1 and by_name(report)["mapping"]["reason"] == (
        f"d2t is {dtype} {list(shape)}, expected I64 [draft_vocab_size {DRAFT_VOCAB}]")
    coverage = by_name(report)["coverage"]
    assert (coverage["status"], coverage["reason"]) == ("skip", "the d2t map could not be read: coverage not measured")


def test_a_valid_map_lets_the_lm_head_rows_be_compared(capsys, pair):
    """The mapping check records a valid map (ctx.map_valid); the lm_head rows check compares only under one."""
    target, draft = pair
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert by_name(report)["mapping"]["status"] == "ok" and by_name(report)["lm_head rows"]["status"] == "ok"


@pytest.mark.parametrize("with_d2t", [False, True])
def test_a_draft_vocabulary_as_large_as_the_targets_is_no_problem(capsys, tmp_path, pair, with_d2t):
    """draft_vocab_size == vocab_size: neither "larger than the target's" nor "no d2t but smaller"."""
    target, _ = pair
    draft = make_draft(tmp_path / "draft", list(range(TARGET_VOCAB)), draft_vocab=TARGET_VOCAB, with_t2d=False)
    if not with_d2t:
        tensors = raw_tensors(draft / "model.safetensors")
        del tensors["d2t"]
        st.write_safetensors(draft / "model.safetensors", tensors)
    code, report = check(capsys, "--draft", draft, "--target", target)
    mapping, coverage = by_name(report)["mapping"], by_name(report)["coverage"]
    if with_d2t:
        assert mapping["status"] == "ok" and mapping["reason"].startswith(f"d2t maps {TARGET_VOCAB} draft ids")
    else:
        assert (mapping["status"], mapping["reason"]) == (
            "ok", "no d2t: the drafter predicts over the full target vocabulary")
        assert (coverage["status"], coverage["reason"]) == (
            "ok", "no d2t: the draft vocabulary is the whole target vocabulary")


def test_without_a_target_the_map_is_held_to_the_drafters_vocab_size_and_coverage_skips(capsys, tmp_path,
                                                                                         frequent_ids):
    ids = list(frequent_ids)
    ids[-1] = TARGET_VOCAB + 3  # the drafter's own vocab_size is TARGET_VOCAB
    draft = make_draft(tmp_path / "draft", ids, with_t2d=False)
    code, report = check(capsys, "--draft", draft)
    assert f"1 target id out of range 0..511 (first: draft id {DRAFT_VOCAB - 1} -> {TARGET_VOCAB + 3})" \
        in by_name(report)["mapping"]["reason"]
    coverage = by_name(report)["coverage"]
    assert (coverage["status"], coverage["reason"]) == (
        "skip", "give --target (with a tokenizer.json) to measure vocabulary coverage")


def test_coverage_is_the_share_of_the_texts_tokens_in_the_draft_vocabulary(capsys, tmp_path, pair, tokenizer_json,
                                                                           frequent_ids):
    from tokenizers import Tokenizer

    target, draft = pair
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat; zzzz qqqq xxxx ~~ {{ }} \\\\ " * 3)
    tokens = Tokenizer.from_file(str(tokenizer_json)).encode(text.read_text(), add_special_tokens=False).ids
    share = sum(1 for t in tokens if t in set(frequent_ids)) / len(tokens)
    code, report = check(capsys, "--draft", draft, "--target", target, "--text", text)
    coverage = by_name(report)["coverage"]
    assert 0 < share < 1 and round(share, 4) != round(share, 5)  # a share that four decimals round
    assert (coverage["share"], coverage["tokens"]) == (round(share, 4), len(tokens))
    assert coverage["reason"].startswith(f"{share:.1%} of the {len(tokens)} target tokens of t.txt are in the draft"
                                         f" vocabulary ({DRAFT_VOCAB} ids; healthy: >= 80%)")


def test_a_text_with_no_tokens_is_not_measured(capsys, tmp_path, pair):
    target, draft = pair
    text = tmp_path / "empty.txt"
    text.write_text("")
    code, report = check(capsys, "--draft", draft, "--target", target, "--text", text)
    coverage = by_name(report)["coverage"]
    assert (coverage["status"], coverage["reason"]) == ("skip", "empty.txt gives no tokens")


@pytest.mark.parametrize("missing", ["mine", "theirs"])
def test_a_comparison_with_a_drafter_without_d2t_names_which(capsys, tmp_path, pair, frequent_ids, missing):
    target, reference = pair
    bare = make_draft(tmp_path / "bare", frequent_ids)
    tensors = raw_tensors(bare / "model.safetensors")
    del tensors["d2t"]
    st.write_safetensors(bare / "model.safetensors", tensors)
    mine, theirs = (bare, reference) if missing == "mine" else (reference, bare)
    code, report = check(capsys, "--draft", mine, "--target", target, "--compare-d2t", theirs)
    which = "the drafter" if missing == "mine" else "the --compare-d2t drafter"
    comparison = by_name(report)["comparison"]
    assert code == 1 and (comparison["status"], comparison["reason"]) == (
        "fail", f"{which} has no d2t tensor: nothing to compare")


@pytest.mark.parametrize("layer_ids, status", [((2, 30, 58), "ok"), ((3, 31, 59), "warn")])
def test_maps_that_agree_everywhere_warn_only_when_the_layer_ids_differ(capsys, tmp_path, pair, frequent_ids,
                                                                       layer_ids, status):
    target, reference = pair
    other = make_draft(tmp_path / "other", frequent_ids, layer_ids=layer_ids)
    code, report = check(capsys, "--draft", reference, "--target", target, "--compare-d2t", other)
    comparison = by_name(report)["comparison"]
    expected = f"all {DRAFT_VOCAB} d2t positions agree"
    if status == "warn":
        expected += "; layer ids differ: [2, 30, 58] here, [3, 31, 59] there"
    assert (comparison["status"], comparison["reason"]) == (status, expected)
    assert (comparison["agree"], comparison["positions"], comparison["shared_target_ids"]) == (
        DRAFT_VOCAB, DRAFT_VOCAB, DRAFT_VOCAB)


def test_the_positions_compared_are_the_longer_maps(capsys, tmp_path, pair, frequent_ids):
    target, reference = pair
    short = make_draft(tmp_path / "short", frequent_ids[:-10], draft_vocab=DRAFT_VOCAB - 10)
    code, report = check(capsys, "--draft", short, "--target", target, "--compare-d2t", reference)
    comparison = by_name(report)["comparison"]
    assert (comparison["positions"], comparison["shared_target_ids"]) == (DRAFT_VOCAB, DRAFT_VOCAB - 10)
