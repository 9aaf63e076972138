"""The checks on the healthy pair and on each mistake of the drafter's shapes and layer ids, against the pristine
SGLang 0.5.9 and 0.5.23 sources."""
from __future__ import annotations

import pytest

from drafter_models import (DRAFT_VOCAB, H, HEAD_DIM, HEADS, TARGET_VOCAB, by_name, check, make_draft, make_target,
                            raw_tensors, run_cli)
from sglang_pcie.tools import safetensors_io as st
from drafter_models import (frequent_ids_fixture, pair_fixture, src23_fixture, src9_fixture,  # noqa: F401 (fixtures)
                            tokenizer_json_fixture)


def test_healthy_pair(capsys, pair, src23):
    target, draft = pair
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", src23)
    assert code == 0, report
    checks = by_name(report)
    assert {c["status"] for c in report["checks"]} == {"ok"}, report
    assert "LlamaForCausalLMEagle3 is an EAGLE-3 draft class of SGLang 0.5.23" in checks["architecture"]["reason"]
    assert checks["layer ids"]["captured"] == ["output of layer 1", "output of layer 29", "output of layer 57"]
    assert checks["coverage"]["share"] > 0.95
    code, out, _ = run_cli(capsys, "--draft", draft, "--target", target, "--sglang-source", src23)
    assert code == 0 and "0 failed, 0 warned" in out


def test_same_ids_capture_other_layers_on_0_5_9(capsys, pair, src9):
    """0.5.9's DeepseekV3 adds 1 to [2, 30, 58]: one layer later than the default, hence a warning."""
    target, draft = pair
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", src9)
    assert code == 0
    ids = by_name(report)["layer ids"]
    assert ids["status"] == "warn"
    assert ids["captured"] == ["output of layer 2", "output of layer 30", "output of layer 58"]
    assert "shifted by +1 layer" in ids["reason"]


def test_layer_ids_minus_one_on_a_llama_target(capsys, tmp_path, tokenizer_json, frequent_ids, src23):
    """Story 2 on a Llama-style target: -1 becomes loop index 0 (the embeddings); warn, naming both patterns."""
    target = make_target(tmp_path / "target", tokenizer_json, arch="LlamaForCausalLM")
    draft = make_draft(tmp_path / "draft", frequent_ids, layer_ids=(-1, 2, 30))
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", src23)
    ids = by_name(report)["layer ids"]
    assert code == 0 and ids["status"] == "warn"
    assert ids["captured"][0] == "the embeddings (input of layer 0)"
    assert "-1 is not 'the last layer'" in ids["reason"]
    assert "moved by one position" in ids["reason"]


def test_layer_ids_minus_one_crashes_0_5_9(capsys, tmp_path, tokenizer_json, frequent_ids, src9):
    """0.5.9's loop adds a residual that is still None before layer 0: capturing index 0 cannot work."""
    target = make_target(tmp_path / "target", tokenizer_json, arch="LlamaForCausalLM")
    draft = make_draft(tmp_path / "draft", frequent_ids, layer_ids=(-1, 2, 30))
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", src9)
    ids = by_name(report)["layer ids"]
    assert code == 1 and ids["status"] == "fail"
    assert "residual while residual is still None: the first forward raises" in ids["reason"]


def test_layer_ids_minus_one_on_kimi_0_5_23(capsys, tmp_path, tokenizer_json, frequent_ids, src23):
    """Story 2 on Kimi (DeepseekV3, 0.5.23 keeps ids unchanged): -1 is never reached, a state goes missing."""
    target = make_target(tmp_path / "target", tokenizer_json)
    reference = make_draft(tmp_path / "trained", frequent_ids)
    draft = make_draft(tmp_path / "draft", frequent_ids, layer_ids=(-1, 2, 30))
    code, report = check(capsys, "--draft", draft, "--target", target, "--compare-d2t", reference,
                         "--sglang-source", src23)
    assert code == 1
    ids = by_name(report)["layer ids"]
    assert ids["status"] == "fail"
    assert "[-1] are never reached" in ids["reason"] and "only 2 of 3 aux states" in ids["reason"]
    assert "layer ids differ: [-1, 2, 30] here, [2, 30, 58] there" in by_name(report)["comparison"]["reason"]


def test_out_of_range_layer_ids(capsys, tmp_path, tokenizer_json, frequent_ids, src23):
    target = make_target(tmp_path / "target", tokenizer_json, arch="LlamaForCausalLM", layers=32)
    draft = make_draft(tmp_path / "draft", frequent_ids, layer_ids=(2, 30, 58))
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", src23)
    assert code == 1
    assert "[59] are never reached in 0..31" in by_name(report)["layer ids"]["reason"]


@pytest.mark.parametrize("layer_ids, status, words", [
    ([], "fail", "[] -> 0 captures, but the drafter's fc takes 3 aux states"),
    ([2, 2, 30], "fail", "indices [3, 3, 31] repeat: the loop captures each layer once, so 2 states reach"),
    ([30, 2, 58], "warn", "ids [30, 2, 58] are not ascending: SGLang concatenates the states in layer order"),
    ([1, 29, 57], "ok", "output of layer 57 of 61, as SGLang's default does"),
])
def test_layer_id_lists(capsys, tmp_path, tokenizer_json, frequent_ids, src23, layer_ids, status, words):
    target = make_target(tmp_path / "target", tokenizer_json, arch="LlamaForCausalLM")
    draft = make_draft(tmp_path / "draft", frequent_ids, layer_ids=layer_ids)
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", src23)
    ids = by_name(report)["layer ids"]
    assert (code, ids["status"]) == (int(status == "fail"), status)
    assert words in ids["reason"]


def test_default_layers_when_config_gives_none(capsys, tmp_path, tokenizer_json, frequent_ids, src23):
    target = make_target(tmp_path / "target", tokenizer_json, arch="LlamaForCausalLM", layers=32)
    draft = make_draft(tmp_path / "draft", frequent_ids, layer_ids=None)
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", src23)
    ids = by_name(report)["layer ids"]
    assert code == 0 and ids["status"] == "ok"
    assert "no layer ids in the draft config: the target default [2, L//2, L-3] is in force" in ids["reason"]
    assert ids["captured"] == ["output of layer 1", "output of layer 15", "output of layer 28"]


def test_input_width_mismatch(capsys, tmp_path, pair, frequent_ids, src23):
    """fc built for 2 aux states while the config asks for 3 (target_hidden_size x 3)."""
    target, _ = pair
    draft = make_draft(tmp_path / "draft", frequent_ids, fc_aux=2)
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", src23)
    assert code == 1
    assert by_name(report)["input width"]["reason"] == (
        "fc.weight is [32, 64], the loader builds [32, 96] = hidden_size x (target_hidden_size 32 x 3 aux states,"
        " eagle_aux_hidden_state_layer_ids)")


def test_four_aux_states_fit_0_5_23_but_not_0_5_9(capsys, tmp_path, pair, frequent_ids, src9, src23):
    target, _ = pair
    draft = make_draft(tmp_path / "draft", frequent_ids, layer_ids=(1, 15, 30, 57), fc_aux=4)
    assert by_name(check(capsys, "--draft", draft, "--sglang-source", src23)[1])["input width"]["status"] == "ok"
    code, report = check(capsys, "--draft", draft, "--sglang-source", src9)
    width = by_name(report)["input width"]
    assert code == 1 and width["status"] == "fail"
    assert "3 aux states, fixed at 3 by this SGLang's loader" in width["reason"]


def test_hidden_and_vocab_mismatch_with_target(capsys, tmp_path, tokenizer_json, frequent_ids):
    target = make_target(tmp_path / "target", tokenizer_json, hidden=48, vocab=1024)
    draft = make_draft(tmp_path / "draft", frequent_ids)
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert code == 1
    assert by_name(report)["target match"]["reason"] == (
        "draft target_hidden_size 32 != target hidden_size 48; draft vocab_size 512 != target vocab_size 1024")


def test_lm_head_from_target_without_draft_vocab_size(capsys, tmp_path, pair):
    target, _ = pair
    draft = make_draft(tmp_path / "draft", list(range(TARGET_VOCAB)), draft_vocab=None)
    code, report = check(capsys, "--draft", draft, "--target", target)
    emb = by_name(report)["embeddings"]
    assert emb["status"] == "ok" and emb["lm_head_from"] == "target"
    assert "set_embed_and_head" in emb["reason"]


def test_unknown_architecture(capsys, tmp_path, frequent_ids, src23):
    draft = make_draft(tmp_path / "draft", frequent_ids, extra_config={"architectures": ["LlamaForCausalLM"]})
    code, report = check(capsys, "--draft", draft, "--sglang-source", src23)
    assert code == 1
    assert "'LlamaForCausalLM' is a SGLang 0.5.23 model but not an EAGLE-3 draft class" in \
        by_name(report)["architecture"]["reason"]


@pytest.mark.parametrize("kv_heads, k_rows, status", [(2, 2 * HEAD_DIM, "ok"), (2, HEADS * HEAD_DIM, "fail")])
def test_k_proj_shape_against_the_kv_heads(capsys, tmp_path, pair, frequent_ids, kv_heads, k_rows, status):
    """k_proj has num_key_value_heads x head_dim rows (grouped-query attention), whatever q_proj has."""
    target, _ = pair
    draft = make_draft(tmp_path / "draft", frequent_ids, extra_config={"num_key_value_heads": kv_heads})
    tensors = raw_tensors(draft / "model.safetensors")
    tensors["midlayer.self_attn.k_proj.weight"] = ("BF16", (k_rows, 2 * H), None)
    st.write_safetensors(draft / "model.safetensors", tensors)
    code, report = check(capsys, "--draft", draft, "--target", target)
    attention = by_name(report)["attention"]
    assert attention["status"] == status
    if status == "fail":
        assert attention["reason"] == f"midlayer.self_attn.k_proj.weight is [{k_rows}, {2 * H}], config gives" \
                                      f" [{kv_heads * HEAD_DIM}, {2 * H}]"


@pytest.mark.parametrize("layer_ids, shift", [([2, 30, 58], "+1"), ([0, 28, 56], "-1")])
def test_layer_ids_shifted_by_one(capsys, tmp_path, tokenizer_json, frequent_ids, src23, layer_ids, shift):
    """The default points of a 61-layer Llama target are the outputs of layers 1, 29, 57 ([1, 29, 57] as ids):
    ids one off either way capture the neighbours, which is right only for a drafter trained on those."""
    target = make_target(tmp_path / "target", tokenizer_json, arch="LlamaForCausalLM")
    draft = make_draft(tmp_path / "draft", frequent_ids, layer_ids=layer_ids)
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", src23)
    ids = by_name(report)["layer ids"]
    assert code == 0 and ids["status"] == "warn"
    assert f"they are the default capture points shifted by {shift} layer" in ids["reason"]


@pytest.mark.parametrize("draft_vocab, status", [(DRAFT_VOCAB, "fail"), (TARGET_VOCAB, "ok")])
def test_tied_embeddings_with_a_reduced_vocabulary(capsys, tmp_path, pair, frequent_ids, draft_vocab, status):
    target, _ = pair
    ids = frequent_ids if draft_vocab == DRAFT_VOCAB else list(range(TARGET_VOCAB))
    draft = make_draft(tmp_path / "draft", ids, draft_vocab=draft_vocab, extra_config={"tie_word_embeddings": True})
    code, report = check(capsys, "--draft", draft, "--target", target)
    embeddings = by_name(report)["embeddings"]
    assert embeddings["status"] == status
    if status == "fail":
        assert embeddings["reason"].startswith(f"tie_word_embeddings with draft_vocab_size {DRAFT_VOCAB} < vocab_size"
                                               f" {TARGET_VOCAB}: SGLang's loader makes lm_head the embedding table")


def test_a_missing_lm_head(capsys, tmp_path, pair, frequent_ids):
    """draft_vocab_size given, no lm_head.weight: SGLang's fresh lm_head keeps its random initialisation."""
    target, _ = pair
    draft = make_draft(tmp_path / "draft", frequent_ids, with_head=False)
    code, report = check(capsys, "--draft", draft, "--target", target)
    embeddings = by_name(report)["embeddings"]
    assert code == 1 and embeddings["status"] == "fail"
    assert "keeps its random initialisation and no draft is accepted (sglang #27908)" in embeddings["reason"]


def test_an_lm_head_that_sglang_replaces_by_the_targets(capsys, tmp_path, pair):
    """No draft_vocab_size: SGLang loads the drafter's lm_head, then replaces it by the target's."""
    target, _ = pair
    draft = make_draft(tmp_path / "draft", list(range(TARGET_VOCAB)), draft_vocab=None, with_head=True)
    code, report = check(capsys, "--draft", draft, "--target", target)
    embeddings = by_name(report)["embeddings"]
    assert code == 0 and embeddings["status"] == "warn"
    assert "a head trained with the drafter goes unused (give draft_vocab_size to keep it)" in embeddings["reason"]
