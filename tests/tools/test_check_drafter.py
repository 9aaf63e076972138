"""check-drafter and safetensors_io: tiny generated checkpoints reproduce each drafter mistake, checked against the
pristine SGLang 0.5.9 and 0.5.23 sources; a published drafter config's layout; the stdlib safetensors reader
against the real ``safetensors`` library of the cached SGLang 0.5.23 install."""
from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_pcie.tools.cli import main as cli_main

from sglang_pcie.tools import check_drafter as cd
from sglang_pcie.tools import safetensors_io as st
from sglang_pcie.patching.source import SourceTree

from support import REPO, SUPPORT
DATA = SUPPORT / "data" / "eagle3-configs"
SAMPLE = REPO / "sglang_pcie" / "tools" / "data" / "sample.txt"

H = 32  # hidden size of the tiny target and drafter
HEADS, HEAD_DIM = 4, 8
TARGET_VOCAB = 512
DRAFT_VOCAB = 256
KIMI_LAYERS = 61


# ---------------------------------------------------------------------------------------------------------------
# Builders: config.json + safetensors with zero weights; only shapes and the d2t / t2d values matter.


def zeros(dtype: str, shape) -> tuple:
    return dtype, tuple(shape), None  # a hole in a sparse file


@pytest.fixture(scope="session")
def tokenizer_json(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer (the `tokenizers` library) trained on the bundled sample text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=480, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([SAMPLE.read_text(encoding="utf-8")], trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def frequent_ids(tokenizer_json) -> list[int]:
    """The draft vocabulary a training tool would pick: the most frequent target ids first, then the rest."""
    from tokenizers import Tokenizer

    counts = collections.Counter(Tokenizer.from_file(str(tokenizer_json)).encode(
        SAMPLE.read_text(encoding="utf-8")).ids)
    ranked = [t for t, _ in counts.most_common()]
    ranked += [t for t in range(TARGET_VOCAB) if t not in counts]
    return sorted(ranked[:DRAFT_VOCAB])


def make_target(folder: Path, tokenizer_json: Path | None = None, *, layers: int = KIMI_LAYERS,
                arch: str = "DeepseekV3ForCausalLM", hidden: int = H, vocab: int = TARGET_VOCAB,
                wrapper: bool = False, shards: int = 1, layer_tensors: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = {"hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
            "num_attention_heads": HEADS, "head_dim": HEAD_DIM}
    if wrapper:  # Kimi-K2.5 layout: a multimodal wrapper with the language model's settings in text_config
        config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                  "text_config": {"architectures": [arch], **text}}
    else:
        config = {"architectures": [arch], **text}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {"model.embed_tokens.weight": zeros("BF16", (vocab, hidden)),
               "lm_head.weight": zeros("BF16", (vocab, hidden))}
    for layer in range(layer_tensors):
        for part in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"model.layers.{layer}.self_attn.{part}.weight"] = zeros("BF16", (1, 1))
    if shards == 1:
        st.write_safetensors(folder / "model.safetensors", tensors, {"format": "pt"})
    else:
        names, weight_map = list(tensors), {}
        for s in range(shards):
            part = {n: tensors[n] for n in names[s::shards]}
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            st.write_safetensors(folder / file, part, {"format": "pt"})
            weight_map.update({n: file for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer_json is not None:
        (folder / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    return folder


def make_draft(folder: Path, target_ids: list[int], *, layer_ids=(2, 30, 58), hidden: int = H,
               target_hidden: int | None = None, fc_aux: int = 3, draft_vocab: int | None = DRAFT_VOCAB,
               vocab: int = TARGET_VOCAB, t2d_ids: list[int] | None = None, with_t2d: bool = True,
               extra_config: dict | None = None) -> Path:
    """An EAGLE-3 drafter whose draft id i stands for target id ``target_ids[i]``."""
    folder.mkdir(parents=True, exist_ok=True)
    target_hidden = target_hidden or hidden
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
              "head_dim": HEAD_DIM, "intermediate_size": 2 * hidden, "vocab_size": vocab,
              "draft_vocab_size": draft_vocab, "tie_word_embeddings": False, "target_hidden_size": target_hidden}
    if layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True}
    config.update(extra_config or {})
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {
        "fc.weight": zeros("BF16", (hidden, target_hidden * fc_aux)),
        "midlayer.self_attn.q_proj.weight": zeros("BF16", (HEADS * HEAD_DIM, 2 * hidden)),
        "midlayer.self_attn.k_proj.weight": zeros("BF16", (HEADS * HEAD_DIM, 2 * hidden)),
        "midlayer.self_attn.v_proj.weight": zeros("BF16", (HEADS * HEAD_DIM, 2 * hidden)),
        "midlayer.hidden_norm.weight": zeros("BF16", (hidden,)),
        "norm.weight": zeros("BF16", (hidden,)),
        "lm_head.weight": zeros("BF16", (len(target_ids), hidden)),
        "d2t": ("I64", (len(target_ids),), st.pack("I64", [t - i for i, t in enumerate(target_ids)])),
    }
    if with_t2d:
        marked = set(target_ids if t2d_ids is None else t2d_ids)
        tensors["t2d"] = ("BOOL", (vocab,), st.pack("BOOL", [j in marked for j in range(vocab)]))
    st.write_safetensors(folder / "model.safetensors", tensors)
    return folder


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = cli_main(["check-drafter", *[str(a) for a in args]])
    out, err = capsys.readouterr()
    return code, out, err


def by_name(report: dict) -> dict:
    return {c["check"]: c for c in report["checks"]}


def check(capsys, *args) -> tuple[int, dict]:
    code, out, err = run_cli(capsys, *args, "--json")
    assert err == ""
    return code, json.loads(out)


@pytest.fixture(scope="module")
def src23(pristine_source) -> Path:
    return pristine_source("0.5.23")


@pytest.fixture(scope="module")
def src9(pristine_source) -> Path:
    return pristine_source("0.5.9")


@pytest.fixture
def pair(tmp_path, tokenizer_json, frequent_ids):
    """A healthy Kimi-like target (61 layers) and its drafter trained on [2, 30, 58]."""
    target = make_target(tmp_path / "target", tokenizer_json)
    draft = make_draft(tmp_path / "draft", frequent_ids)
    return target, draft


# ---------------------------------------------------------------------------------------------------------------
# safetensors_io


def test_safetensors_roundtrip_and_single_tensor_read(tmp_path):
    path = tmp_path / "t.safetensors"
    st.write_safetensors(path, {"d2t": ("I64", (3,), st.pack("I64", [5, -1, 0])),
                                "t2d": ("BOOL", (4,), st.pack("BOOL", [1, 0, 0, 1])),
                                "w": ("BF16", (2,), st.pack("BF16", [1.5, -2.0])),
                                "f": ("F32", (1, 1), st.pack("F32", [0.25]))}, {"format": "pt"})
    header = st.read_header(path)
    assert header["w"] == {"dtype": "BF16", "shape": [2], "data_offsets": [28, 32]}
    assert st.read_metadata(path) == {"format": "pt"}
    assert list(st.read_tensor(path, "d2t")[2]) == [5, -1, 0]
    assert st.read_tensor(path, "t2d")[2] == [True, False, False, True]
    assert st.read_tensor(path, "w")[2] == [1.5, -2.0]
    assert st.read_tensor(path, "f")[:2] == ("F32", [1, 1])
    with pytest.raises(KeyError, match="nope"):
        st.read_tensor(path, "nope")


def test_safetensors_zero_tensors_are_holes(tmp_path):
    path = tmp_path / "sparse.safetensors"
    st.write_safetensors(path, {"big": ("BF16", (1 << 20, 1024), None), "d2t": ("I64", (2,), st.pack("I64", [1, 2])),
                                "tail": ("F32", (4,), None)})
    header = st.read_header(path)
    data_bytes = 2 * (1 << 30) + 16 + 16
    assert header["tail"]["data_offsets"][1] == data_bytes
    with open(path, "rb") as f:
        assert path.stat().st_size == 8 + int.from_bytes(f.read(8), "little") + data_bytes
    assert list(st.read_tensor(path, "d2t")[2]) == [1, 2]
    assert list(st.read_tensor(path, "tail")[2]) == [0.0] * 4
    assert path.stat().st_blocks * 512 < 1 << 20  # 2 GiB apparent size, almost nothing on disk


def test_safetensors_truncated_and_oversized_headers(tmp_path):
    good = tmp_path / "good.safetensors"
    st.write_safetensors(good, {"x": ("F32", (8,), st.pack("F32", range(8)))})
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-4])
    with pytest.raises(ValueError, match="'x' ends at byte 32 of a 28-byte data section"):
        st.read_header(cut)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes((10 ** 12).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header length 1000000000000 does not fit in a 10-byte file"):
        st.read_header(huge)
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="too short"):
        st.read_header(short)
    with pytest.raises(ValueError, match="needs 12"):
        st.write_safetensors(tmp_path / "bad.safetensors", {"x": ("F32", (3,), b"\0" * 8)})


def test_safetensors_agrees_with_the_real_library(tmp_path):
    """Files written here load with the real safetensors (in the cached SGLang 0.5.23 venv) and vice versa."""
    from conftest import ensure_sglang_python

    python = ensure_sglang_python("0.5.23")
    mine = tmp_path / "mine.safetensors"
    st.write_safetensors(mine, {"d2t": ("I64", (3,), st.pack("I64", [7, -2, 0])),
                                "t2d": ("BOOL", (2,), st.pack("BOOL", [0, 1])),
                                "w": ("BF16", (2, 1), st.pack("BF16", [0.5, 3.0]))})
    theirs = tmp_path / "theirs.safetensors"
    code = (
        "import sys, torch, json\n"
        "from safetensors.torch import load_file, save_file\n"
        "t = load_file(sys.argv[1])\n"
        "print(json.dumps({k: v.float().flatten().tolist() for k, v in t.items()}))\n"
        "save_file({'a': torch.arange(5, dtype=torch.int64) - 2, 'b': torch.tensor([1.25, -4.0],"
        " dtype=torch.bfloat16), 'c': torch.tensor([True, False, True])}, sys.argv[2])\n")
    proc = subprocess.run([str(python), "-c", code, str(mine), str(theirs)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"d2t": [7.0, -2.0, 0.0], "t2d": [0.0, 1.0],
                                                         "w": [0.5, 3.0]}
    assert list(st.read_tensor(theirs, "a")[2]) == [-2, -1, 0, 1, 2]
    assert st.read_tensor(theirs, "b")[2] == [1.25, -4.0]
    assert st.read_tensor(theirs, "c")[2] == [True, False, True]


# ---------------------------------------------------------------------------------------------------------------
# SGLang facts read from the pristine releases


def test_eagle3_classes_and_loader_behaviour_per_release(src9, src23):
    m9, m23 = cd.SglangFacts(SourceTree(src9)), cd.SglangFacts(SourceTree(src23))
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
    models = cd.SglangFacts(SourceTree(pristine_source(version)))
    text = {"num_hidden_layers": KIMI_LAYERS, "hidden_size": H}
    if wrapper:
        config = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": text}
        rule = cd.sglang_capture_rule(models, "KimiK25ForConditionalGeneration", config, text)
    else:
        rule = cd.sglang_capture_rule(models, arch, text, text)
    assert rule is not None
    assert rule(ids) == expected


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_every_target_rule_of_a_release_runs_alone(pristine_source, version):
    """Each EntryClass with set_eagle3_layers_to_capture: its own method runs on the stand-in and gives one of
    the two rules the releases have (MindSpore's forwards to a model outside SGLang)."""
    models = cd.SglangFacts(SourceTree(pristine_source(version)))
    text = {"num_hidden_layers": 40}
    rules = {name: cd.sglang_capture_rule(models, name, {"text_config": text, **text}, text)
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
    assert cd.sglang_capture_rule(cd.SglangFacts(SourceTree(src9)), "KimiK25ForConditionalGeneration", {"text_config": text},
                                  text) is None


# ---------------------------------------------------------------------------------------------------------------
# The command on the healthy pair and on each mistake


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


def test_unknown_architecture(capsys, tmp_path, frequent_ids, src23):
    draft = make_draft(tmp_path / "draft", frequent_ids, extra_config={"architectures": ["LlamaForCausalLM"]})
    code, report = check(capsys, "--draft", draft, "--sglang-source", src23)
    assert code == 1
    assert "'LlamaForCausalLM' is a SGLang 0.5.23 model but not an EAGLE-3 draft class" in \
        by_name(report)["architecture"]["reason"]


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


# ---------------------------------------------------------------------------------------------------------------
# Inputs: Hugging Face cache layout, shards, bad usage


def test_hugging_face_cache_entry_and_sharded_target(capsys, tmp_path, tokenizer_json, frequent_ids, src23):
    entry = tmp_path / "hub" / "models--org--target"
    snapshot = make_target(entry / "snapshots" / "abc123", tokenizer_json, shards=3, layer_tensors=4)
    (entry / "blobs").mkdir()
    for file in list(snapshot.iterdir()):  # as huggingface_hub stores them: links into blobs/
        blob = entry / "blobs" / f"blob-{file.name}"
        file.rename(blob)
        file.symlink_to(Path("..", "..", "blobs", blob.name))
    make_target(entry / "snapshots" / "old999", tokenizer_json, vocab=7)  # an older snapshot: must not be used
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("abc123\n")
    draft = make_draft(tmp_path / "draft", frequent_ids)
    code, report = check(capsys, "--draft", draft, "--target", entry, "--sglang-source", src23)
    assert code == 0, report
    assert report["target"] == str(entry / "snapshots" / "abc123")
    code, report = check(capsys, "--draft", draft, "--target", entry / "snapshots" / "abc123")
    assert code == 0


def test_reads_headers_and_maps_only(capsys, tmp_path, tokenizer_json, frequent_ids, monkeypatch):
    """A sharded target of 200 GiB (sparse files) costs kilobytes of reading: headers, d2t and t2d only."""
    target = make_target(tmp_path / "target", tokenizer_json, shards=4, layer_tensors=2)
    for shard in range(4):  # one 50 GiB hole per shard, listed in the index like real weights
        file = target / f"model-{shard + 1:05d}-of-00004.safetensors"
        tensors = {n: (e["dtype"], e["shape"], None) for n, e in st.read_header(file).items()}
        tensors[f"model.layers.{shard}.mlp.experts.weight"] = ("BF16", (25 * 1024, 1024 * 1024), None)
        st.write_safetensors(file, tensors)
    index = json.loads((target / "model.safetensors.index.json").read_text())
    index["weight_map"].update({f"model.layers.{s}.mlp.experts.weight": f"model-{s + 1:05d}-of-00004.safetensors"
                                for s in range(4)})
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    assert sum(f.stat().st_size for f in target.glob("*.safetensors")) > 200 * 2 ** 30
    draft = make_draft(tmp_path / "draft", frequent_ids)
    read = []
    real_open = open

    class Counting:
        def __init__(self, *args, **kwargs):
            self.f = real_open(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def seek(self, *args):
            return self.f.seek(*args)

    monkeypatch.setattr(st, "open", Counting, raising=False)
    code, report = check(capsys, "--draft", draft, "--target", target)
    assert code == 0, report
    assert 0 < sum(read) < 64 * 1024, read


@pytest.mark.parametrize("problem", ["missing", "no-config", "bad-json", "bad-header", "missing-shard", "text",
                                     "bad-value"])
def test_unreadable_input_exits_2(capsys, tmp_path, pair, problem):
    target, draft = pair
    args = ["--draft", draft, "--target", target]
    if problem == "missing":
        args[1] = tmp_path / "nowhere"
    elif problem == "no-config":
        (draft / "config.json").unlink()
    elif problem == "bad-json":
        (draft / "config.json").write_text("{not json")
    elif problem == "bad-header":
        (draft / "model.safetensors").write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    elif problem == "bad-value":
        config = json.loads((draft / "config.json").read_text())
        (draft / "config.json").write_text(json.dumps({**config, "hidden_size": "thirty-two"}))
    elif problem == "missing-shard":
        (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    else:
        args += ["--text", tmp_path / "none.txt"]
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("sglang-pcie check-drafter: error: ") and len(err.strip().splitlines()) == 1


def test_bad_usage_exits_2(capsys):
    assert run_cli(capsys)[0] == 2
    assert run_cli(capsys, "--draft", "x", "--bogus")[0] == 2


def test_sample_text_ships_in_the_wheel(checkout_wheel):
    import zipfile

    with zipfile.ZipFile(checkout_wheel) as wheel:
        assert "sglang_pcie/tools/data/sample.txt" in wheel.namelist()


def test_cli_delegates(tmp_path, pair):
    target, draft = pair
    proc = subprocess.run([sys.executable, "-m", "sglang_pcie", "check-drafter", "--draft", str(draft), "--target",
                           str(target)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"drafter {draft}"
    assert "check-drafter" in subprocess.run([sys.executable, "-m", "sglang_pcie", "--help"], capture_output=True,
                                             text=True, cwd=REPO).stdout


# ---------------------------------------------------------------------------------------------------------------
# A published drafter's config


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
    ckpt = cd.Checkpoint.__new__(cd.Checkpoint)
    ckpt.config = config
    assert cd.draft_layer_ids(ckpt) is None
    assert cd.aux_count(ckpt, reads_num_aux=True) == (3, "default 3")


def test_a_corrupt_cached_wheel_is_an_input_error_and_is_deleted(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_CACHE", str(tmp_path))
    wheel = tmp_path / "wheels" / "sglang-0.5.99-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK\x03\x04 truncated download")
    with pytest.raises(cd.InputError, match=f"{wheel}: not a readable wheel .*deleted, run again"):
        cd.sglang_facts(None, "0.5.99")
    assert not wheel.exists()  # the next run fetches it again
    assert not (tmp_path / "src" / "0.5.99").exists() and not (tmp_path / "src" / "0.5.99.partial").exists()
