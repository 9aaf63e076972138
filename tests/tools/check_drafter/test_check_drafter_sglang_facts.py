"""The SGLang facts, read from the pristine releases through SourceTree: the EAGLE-3 draft classes and their loaders,
and every target class's own capture rule run on a stand-in; a published drafter config's layout."""
from __future__ import annotations

import json

import pytest

from drafter_models import DATA, H, KIMI_LAYERS, by_name, check, make_draft, make_target, zeros
from drafter_models import (frequent_ids_fixture, pair_fixture, src23_fixture, src9_fixture,  # noqa: F401 (fixtures)
                            tokenizer_json_fixture)
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.tools.check_drafter import checkpoint, sglang_facts
from sglang_pcie.tools.check_drafter.report import InputError
from sglang_pcie.tools import safetensors_io as st


def test_eagle3_classes_and_loader_behaviour_per_release(src9, src23):
    m9, m23 = sglang_facts.SglangFacts(SourceTree(src9)), sglang_facts.SglangFacts(SourceTree(src23))
    assert sorted(m9.entry_classes(eagle3_only=True)) == ["LlamaForCausalLMEagle3"]
    assert sorted(m23.entry_classes(eagle3_only=True)) == ["Eagle3DeepseekV2ForCausalLM", "LlamaForCausalLMEagle3"]
    # 0.5.9's loader fixes fc at 3 aux states and one decoder layer; 0.5.23 reads the count from the config.
    assert "num_aux_hidden_states" not in m9.loader_text("LlamaForCausalLMEagle3")
    assert "only supports 1 layer" in m9.loader_text("LlamaForCausalLMEagle3")
    assert "num_aux_hidden_states" in m23.loader_text("LlamaForCausalLMEagle3")
    assert "only supports 1 layer" not in m23.loader_text("LlamaForCausalLMEagle3")


@pytest.mark.parametrize("version, arch, wrapper, ids, expected", [
    # Llama-style targets: id + 1 in every release; no ids: [2, L//2, L-3] as loop indices.
    ("0.5.9", "LlamaForCausalLM", False, [2, 30, 58], [3, 31, 59]),
    ("0.5.23", "LlamaForCausalLM", False, [2, 30, 58], [3, 31, 59]),
    ("0.5.23", "LlamaForCausalLM", False, None, [2, 30, 58]),
    # DeepseekV3 (Kimi-K2): 0.5.9 adds 1; 0.5.23 adds 1 only when the first id is 1.
    ("0.5.9", "DeepseekV3ForCausalLM", False, [2, 30, 58], [3, 31, 59]),
    ("0.5.16", "DeepseekV3ForCausalLM", False, [2, 30, 58], [2, 30, 58]),
    ("0.5.23", "DeepseekV3ForCausalLM", False, [2, 30, 58], [2, 30, 58]),
    ("0.5.23", "DeepseekV3ForCausalLM", False, [1, 29, 57], [2, 30, 58]),
    ("0.5.23", "DeepseekV3ForCausalLM", False, [-1, 2, 30], [-1, 2, 30]),
    # Kimi-K2.5's wrapper forwards to its DeepseekV3 language model (0.5.23; 0.5.9 lacks the method).
    ("0.5.23", "DeepseekV3ForCausalLM", True, [2, 30, 58], [2, 30, 58]),
])
def test_capture_rule_runs_the_releases_own_method(pristine_source, version, arch, wrapper, ids, expected):
    models = sglang_facts.SglangFacts(SourceTree(pristine_source(version)))
    text = {"num_hidden_layers": KIMI_LAYERS, "hidden_size": H}
    if wrapper:
        config = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": text}
        rule = sglang_facts.sglang_capture_rule(models, "KimiK25ForConditionalGeneration", config, text)
    else:
        rule = sglang_facts.sglang_capture_rule(models, arch, text, text)
    assert rule is not None
    assert rule(ids) == expected


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_every_target_rule_of_a_release_runs_alone(pristine_source, version):
    """Each EntryClass with set_eagle3_layers_to_capture: its own method runs on the stand-in and gives one of
    the two rules the releases have (MindSpore's forwards to a model outside SGLang)."""
    models = sglang_facts.SglangFacts(SourceTree(pristine_source(version)))
    text = {"num_hidden_layers": 40}
    rules = {name: sglang_facts.sglang_capture_rule(models, name, {"text_config": text, **text}, text)
             for name in sorted(models.entry_classes())
             if models.method(models.architecture_class(name), "set_eagle3_layers_to_capture")}
    assert len(rules) > 35
    unresolved = sorted(name for name, rule in rules.items() if rule is None or rule(None) is None)
    assert unresolved == ([] if version == "0.5.9" else ["MindSporeForCausalLM"])
    adds_one = {name for name, rule in rules.items() if rule and rule([2, 20, 37]) == [3, 21, 38]}
    keeps = {name for name, rule in rules.items() if rule and rule([2, 20, 37]) == [2, 20, 37]}
    assert adds_one | keeps | set(unresolved) == set(rules)
    assert "LlamaForCausalLM" in adds_one and "Qwen3MoeForCausalLM" in adds_one
    if version == "0.5.9":
        assert keeps == set()
    else:
        assert {"DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "Glm4MoeLiteForCausalLM"} <= keeps
        assert all(rules[name]([1, 19, 36]) == [2, 20, 37] for name in keeps - {"MindSporeForCausalLM"})


def test_kimi_k25_wrapper_has_no_rule_in_0_5_9(src9):
    text = {"num_hidden_layers": KIMI_LAYERS}
    assert sglang_facts.sglang_capture_rule(sglang_facts.SglangFacts(SourceTree(src9)), "KimiK25ForConditionalGeneration", {"text_config": text},
                                  text) is None


@pytest.mark.parametrize("version, status, captured", [
    ("0.5.9", "warn", ["output of layer 2", "output of layer 30", "output of layer 58"]),
    ("0.5.23", "ok", ["output of layer 1", "output of layer 29", "output of layer 57"]),
])
def test_published_kimi_k25_drafter_config(capsys, tmp_path, pristine_source, version, status, captured):
    """SpecForge's Kimi-K2.5 EAGLE-3 config, with weights of its shapes, against a Kimi-K2.5-shaped target."""
    config = json.loads((DATA / "specforge-kimi-k25-eagle3.json").read_text())
    hidden, vocab, dv = config["hidden_size"], config["vocab_size"], config["draft_vocab_size"]
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(config))
    heads, head_dim = config["num_attention_heads"], config["head_dim"]
    header_only = {"fc.weight": ("BF16", [hidden, 3 * hidden]),
                   "midlayer.self_attn.q_proj.weight": ("BF16", [heads * head_dim, 2 * hidden]),
                   "midlayer.self_attn.k_proj.weight": ("BF16", [config["num_key_value_heads"] * head_dim, 2 * hidden]),
                   "lm_head.weight": ("BF16", [dv, hidden])}
    tensors = {n: zeros(dtype, shape) for n, (dtype, shape) in header_only.items()}
    ids = list(range(0, 2 * dv, 2))
    tensors["d2t"] = ("I64", (dv,), st.pack("I64", [t - i for i, t in enumerate(ids)]))
    tensors["t2d"] = ("BOOL", (vocab,), st.pack("BOOL", [j % 2 == 0 and j < 2 * dv for j in range(vocab)]))
    st.write_safetensors(draft / "model.safetensors", tensors)
    target = make_target(tmp_path / "target", None, hidden=hidden, vocab=vocab, wrapper=True)
    code, report = check(capsys, "--draft", draft, "--target", target, "--sglang-source", pristine_source(version))
    checks = by_name(report)
    assert code == 0, report
    assert checks["input width"]["reason"].startswith("fc.weight [7168, 21504] = target_hidden_size 7168 x 3")
    assert checks["mapping"]["reason"].startswith("d2t maps 32,000 draft ids to distinct target ids")
    assert checks["embeddings"]["lm_head_from"] == "draft" and checks["embeddings"]["embed_from"] == "target"
    if version == "0.5.9":  # 0.5.9 has no set_eagle3_layers_to_capture on the K2.5 wrapper: the Llama rule is assumed
        assert "KimiK25ForConditionalGeneration has no set_eagle3_layers_to_capture" in checks["layer ids"]["rule"]
    assert checks["layer ids"]["status"] == status
    assert checks["layer ids"]["captured"] == captured


def test_published_llama3_drafter_config_uses_the_default_layers():
    config = json.loads((DATA / "specforge-llama3-8b-eagle3.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and "eagle_config" not in config
    assert config["draft_vocab_size"] == 31960 and config["vocab_size"] == 128256
    ckpt = checkpoint.Checkpoint.__new__(checkpoint.Checkpoint)
    ckpt.config = config
    assert checkpoint.draft_layer_ids(ckpt) is None
    assert checkpoint.aux_count(ckpt, reads_num_aux=True) == (3, "default 3")


def test_a_corrupt_cached_wheel_is_an_input_error_and_is_deleted(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_CACHE", str(tmp_path))
    wheel = tmp_path / "wheels" / "sglang-0.5.99-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK\x03\x04 truncated download")
    with pytest.raises(InputError, match=f"{wheel}: not a readable wheel .*deleted, run again"):
        sglang_facts.sglang_facts(None, "0.5.99")
    assert not wheel.exists()  # the next run fetches it again
    assert not (tmp_path / "src" / "0.5.99").exists() and not (tmp_path / "src" / "0.5.99.partial").exists()


def test_reads_the_installed_sglang_without_importing_it(sglang_env, pair):
    """In the real SGLang 0.5.23 install (with this checkout installed as a wheel) the installed release is read."""
    target, draft = pair
    env = sglang_env("0.5.23")
    code = ("import json, sys\n"
            "from sglang_pcie.tools import check_drafter\n"
            f"report = check_drafter.run_checks({str(draft)!r}, {str(target)!r})\n"
            "print(json.dumps({'report': report, 'imported': 'sglang' in sys.modules}))\n")
    result = env.run_json(code)
    assert result["imported"] is False
    checks = by_name(result["report"])
    assert checks["architecture"]["reason"].startswith("LlamaForCausalLMEagle3 is an EAGLE-3 draft class of"
                                                         " SGLang 0.5.23")
    assert "deepseek_v2.py, SGLang 0.5.23" in checks["layer ids"]["rule"]


def test_without_sglang_the_architecture_is_not_checked(capsys, tmp_path, frequent_ids, monkeypatch):
    monkeypatch.setattr("sglang_pcie.patching.source.installed_sglang_root", lambda: None)
    draft = make_draft(tmp_path / "draft", frequent_ids)
    code, report = check(capsys, "--draft", draft)
    arch = by_name(report)["architecture"]
    assert code == 0 and arch["status"] == "warn"
    assert arch["reason"].startswith("no SGLang installed: architecture not checked")
    assert by_name(report)["coverage"]["status"] == "skip"
