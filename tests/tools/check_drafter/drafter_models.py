"""Builders shared by the check-drafter tests: tiny checkpoints (config.json + safetensors; zero weights are holes
in sparse files, only shapes and the d2t / t2d values matter), a tokenizer trained on the bundled sample, the CLI
run in process. The fixtures are imported by the test modules that use them."""
from __future__ import annotations

import collections
import json
import random
from pathlib import Path

import pytest

from sglang_pcie.tools import safetensors_io as st
from sglang_pcie.tools.cli import main as cli_main

from support import REPO, SUPPORT

DATA = SUPPORT / "data" / "eagle3-configs"
SAMPLE = REPO / "sglang_pcie" / "tools" / "data" / "sample.txt"

H = 32  # hidden size of the tiny target and drafter
HEADS, HEAD_DIM = 4, 8
TARGET_VOCAB = 512
DRAFT_VOCAB = 256
KIMI_LAYERS = 61


def zeros(dtype: str, shape) -> tuple:
    return dtype, tuple(shape), None  # a hole in a sparse file


@pytest.fixture(scope="session", name="tokenizer_json")
def tokenizer_json_fixture(tmp_path_factory) -> Path:
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


@pytest.fixture(scope="session", name="frequent_ids")
def frequent_ids_fixture(tokenizer_json) -> list[int]:
    """The draft vocabulary a training tool would pick: the most frequent target ids first, then the rest."""
    from tokenizers import Tokenizer

    counts = collections.Counter(Tokenizer.from_file(str(tokenizer_json)).encode(
        SAMPLE.read_text(encoding="utf-8")).ids)
    ranked = [t for t, _ in counts.most_common()]
    ranked += [t for t in range(TARGET_VOCAB) if t not in counts]
    return sorted(ranked[:DRAFT_VOCAB])


def random_rows(rows: int, width: int, seed: int) -> tuple:
    """A BF16 matrix of random values in [-1, 1): rows that differ from one another like a model's."""
    rng = random.Random(seed)
    return "BF16", (rows, width), st.pack("BF16", [rng.uniform(-1, 1) for _ in range(rows * width)])


def make_target(folder: Path, tokenizer_json: Path | None = None, *, layers: int = KIMI_LAYERS,
                arch: str = "DeepseekV3ForCausalLM", hidden: int = H, vocab: int = TARGET_VOCAB,
                wrapper: bool = False, shards: int = 1, layer_tensors: int = 0, weights: bool = False) -> Path:
    """A target with zero weights (holes), or with ``weights`` random embedding and lm_head rows."""
    folder.mkdir(parents=True, exist_ok=True)
    text = {"hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": vocab,
            "num_attention_heads": HEADS, "head_dim": HEAD_DIM}
    if wrapper:  # Kimi-K2.5 layout: a multimodal wrapper with the language model's settings in text_config
        config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                  "text_config": {"architectures": [arch], **text}}
    else:
        config = {"architectures": [arch], **text}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {"model.embed_tokens.weight": random_rows(vocab, hidden, 1) if weights else zeros("BF16", (vocab, hidden)),
               "lm_head.weight": random_rows(vocab, hidden, 2) if weights else zeros("BF16", (vocab, hidden))}
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
               extra_config: dict | None = None, head_from: Path | None = None,
               head_rows: list[int] | None = None, with_head: bool | None = None) -> Path:
    """An EAGLE-3 drafter whose draft id i stands for target id ``target_ids[i]``. Its lm_head is zeros, or with
    ``head_from`` (a target folder) row i is that target's embedding row of ``head_rows[i]`` (default
    ``target_ids[i]``: a head built from the target's rows under its own map). Without draft_vocab_size SGLang
    takes the target's lm_head, and such a checkpoint has none (``with_head`` overrides)."""
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
        "lm_head.weight": (zeros("BF16", (len(target_ids), hidden)) if head_from is None else
                           embedding_rows(head_from, head_rows or target_ids)),
        "d2t": ("I64", (len(target_ids),), st.pack("I64", [t - i for i, t in enumerate(target_ids)])),
    }
    if not (with_head if with_head is not None else draft_vocab is not None):
        del tensors["lm_head.weight"]
    if with_t2d:
        marked = set(target_ids if t2d_ids is None else t2d_ids)
        tensors["t2d"] = ("BOOL", (vocab,), st.pack("BOOL", [j in marked for j in range(vocab)]))
    st.write_safetensors(folder / "model.safetensors", tensors)
    return folder


def embedding_rows(target: Path, ids: list[int]) -> tuple:
    """The target's embedding rows of ``ids``, as a BF16 matrix."""
    file = target / "model.safetensors"
    _, (_, width), values = st.read_tensor(file, "model.embed_tokens.weight")
    return "BF16", (len(ids), width), st.pack("BF16", [v for i in ids for v in values[i * width:(i + 1) * width]])


def raw_tensors(file: Path) -> dict:
    """Every tensor of a safetensors file as (dtype, shape, its bytes), to write back with some replaced."""
    with open(file, "rb") as f:
        f.seek(8 + int.from_bytes(f.read(8), "little"))
        data = f.read()
    return {name: (e["dtype"], e["shape"], data[e["data_offsets"][0]:e["data_offsets"][1]])
            for name, e in st.read_header(file).items()}


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


@pytest.fixture(scope="module", name="src23")
def src23_fixture(pristine_source) -> Path:
    return pristine_source("0.5.23")


@pytest.fixture(scope="module", name="src9")
def src9_fixture(pristine_source) -> Path:
    return pristine_source("0.5.9")


@pytest.fixture(name="pair")
def pair_fixture(tmp_path, tokenizer_json, frequent_ids):
    """A healthy Kimi-like target (61 layers) and its drafter trained on [2, 30, 58], its lm_head rows built from
    the target's embedding rows under its map."""
    target = make_target(tmp_path / "target", tokenizer_json, weights=True)
    draft = make_draft(tmp_path / "draft", frequent_ids, head_from=target)
    return target, draft
