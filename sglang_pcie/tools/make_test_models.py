"""``sglang-pcie make-test-models DIR``: a tiny random Llama target and a random EAGLE-3 drafter for SGLang.

DIR/target: ``LlamaForCausalLM`` (config.json, generation_config.json, model.safetensors).
DIR/draft:  ``LlamaForCausalLMEagle3`` in the layout SGLang's loader (``sglang/srt/models/llama_eagle3.py``,
            0.5.16 and 0.5.23) reads: one ``midlayer`` decoder layer (renamed to ``layers.0`` on load) whose
            q/k/v projections take 2 x hidden (token embedding ++ fused target state), ``fc`` fusing the three
            captured target hidden states (3 x hidden -> hidden), ``midlayer.hidden_norm``, ``norm``, a
            reduced-vocabulary ``lm_head`` (draft_vocab_size rows) and the ``d2t`` (I64, target id minus draft
            id) / ``t2d`` (BOOL over the target vocabulary) maps. No ``embed_tokens``: SGLang's EAGLE worker gives
            the drafter the target's embedding (``set_embed``).

The drafter's config names the captured target layers (``eagle_config.eagle_aux_hidden_state_layer_ids``):
SGLang's default, layers [2, L // 2, L - 3], repeats a layer for L < 7 and then feeds ``fc`` two states
instead of three.

``--acceptance`` decides how often SGLang accepts the drafter's guesses:
- ``random`` (default): random weights; the drafter almost never guesses right (accept length 1.0).
- ``mixed`` / ``full``: the same shapes and the same work per token, but the attention and MLP outputs of both models
  are zero (``o_proj`` and ``down_proj``), so each position's hidden state is its token's embedding. The target's
  ``lm_head`` then makes the greedy next token a function f of the current token, with values in the draft
  vocabulary, where f either keeps a token or swaps it with a partner (f(f(t)) == t). The drafter (``fc`` passes
  the first captured state through, its ``lm_head`` rows are the embeddings of its own tokens) guesses "the token
  two back", which is right for the whole chain when f keeps the token and for the first guess when f swaps.
  ``full``: f keeps every token, every draft is accepted (accept length = num_steps + 1 with topk 1). ``mixed``:
  f keeps half the tokens; from its first output token on, a request repeats one token (every draft accepted:
  num_steps + 1 tokens per verify) or alternates two (2 per verify). SGLang's accept length, tokens per verify over
  all requests, is then 1 / (p / (num_steps + 1) + (1 - p) / 2) for a share p of repeating requests (2.67 at 3
  steps for p = 1/2; which requests repeat depends on their last prompt token).

No tokenizer is written: start the server with ``--skip-tokenizer-init`` and send token ids (as
``sglang-pcie bench`` does). Weights are random bf16 of magnitude 2^-7..2^-5 with random signs, norms are 1,
from ``--seed``: the same bytes on every run. Pure standard library (no torch, no numpy): the 256-hidden default
takes about a second, ``--preset e2e`` (2048 hidden, 8 layers, ~1 GiB) tens of seconds.
"""
from __future__ import annotations

import argparse
import json
import random
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.safetensors_io import write_safetensors

PROG = "sglang-pcie make-test-models"
BF16_ONE = struct.pack("<H", 0x3F80)
# High byte of a bf16: sign bit kept from the random byte, exponent bits 7..1 fixed to 0b0111100, so with the
# random low byte's top bit as the exponent's last bit the magnitude is 2^-7 .. 2^-5 (like std 0.02 weights).
_HIGH_BYTE = bytes((b & 0x80) | 0x3C for b in range(256))


@dataclass(frozen=True)
class Shape:
    vocab: int = 32000
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 1024
    draft_vocab: int = 8192
    max_positions: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def check(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"--hidden {self.hidden} is not a multiple of --heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"--heads {self.heads} is not a multiple of --kv-heads {self.kv_heads}")
        if self.layers < 4:
            raise ValueError(f"--layers {self.layers}: the drafter captures three distinct target layers (>= 4)")
        if not 0 < self.draft_vocab <= self.vocab:
            raise ValueError(f"--draft-vocab {self.draft_vocab}: must be in 1..{self.vocab} (the target's vocab)")


# share of the draft vocabulary that f keeps (the rest is swapped in pairs); None: random weights
ACCEPTANCE = {"random": None, "mixed": 0.5, "full": 1.0}

PRESETS = {
    "tiny": Shape(),
    # The shapes of the first 2 x H200 run (../shared/gpu-e2e): host-bound decode with CUDA graphs.
    "e2e": Shape(hidden=2048, layers=8, heads=16, kv_heads=8, intermediate=5632),
}


def aux_layer_ids(layers: int) -> list[int]:
    """Three distinct target layers for the drafter (0-based; SGLang captures the output of id + 1)."""
    return [0, layers // 2 - 1, layers - 2]


def random_bf16(rng: random.Random, count: int) -> bytes:
    raw = bytearray(rng.randbytes(2 * count))
    raw[1::2] = raw[1::2].translate(_HIGH_BYTE)
    return bytes(raw)


def common_config(shape: Shape) -> dict:
    return {
        "model_type": "llama", "hidden_act": "silu", "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": shape.max_positions, "initializer_range": 0.02,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": shape.vocab,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "attention_bias": False, "mlp_bias": False,
        "use_cache": True,
    }


def layer_tensors(rng, prefix: str, shape: Shape, in_dim: int) -> dict:
    h, q, kv, inter = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate

    def w(rows, cols):
        return ("BF16", [rows, cols], random_bf16(rng, rows * cols))

    return {
        f"{prefix}.self_attn.q_proj.weight": w(q, in_dim),
        f"{prefix}.self_attn.k_proj.weight": w(kv, in_dim),
        f"{prefix}.self_attn.v_proj.weight": w(kv, in_dim),
        f"{prefix}.self_attn.o_proj.weight": w(h, q),
        f"{prefix}.mlp.gate_proj.weight": w(inter, h),
        f"{prefix}.mlp.up_proj.weight": w(inter, h),
        f"{prefix}.mlp.down_proj.weight": w(h, inter),
        f"{prefix}.input_layernorm.weight": ones(h),
        f"{prefix}.post_attention_layernorm.weight": ones(h),
    }


def ones(n: int):
    return ("BF16", [n], BF16_ONE * n)


def target_tensors(rng, shape: Shape) -> dict:
    tensors = {"model.embed_tokens.weight": ("BF16", [shape.vocab, shape.hidden],
                                             random_bf16(rng, shape.vocab * shape.hidden))}
    for i in range(shape.layers):
        tensors.update(layer_tensors(rng, f"model.layers.{i}", shape, shape.hidden))
    tensors["model.norm.weight"] = ones(shape.hidden)
    tensors["lm_head.weight"] = ("BF16", [shape.vocab, shape.hidden], random_bf16(rng, shape.vocab * shape.hidden))
    return tensors


def draft_tensors(rng, shape: Shape, hot: list[int]) -> dict:
    """``hot``: the draft vocabulary, in target ids (sorted)."""
    t2d = bytearray(shape.vocab)
    for token in hot:
        t2d[token] = 1
    tensors = layer_tensors(rng, "midlayer", shape, 2 * shape.hidden)
    tensors.update({
        "midlayer.hidden_norm.weight": ones(shape.hidden),
        "fc.weight": ("BF16", [shape.hidden, 3 * shape.hidden], random_bf16(rng, 3 * shape.hidden * shape.hidden)),
        "norm.weight": ones(shape.hidden),
        "lm_head.weight": ("BF16", [shape.draft_vocab, shape.hidden],
                           random_bf16(rng, shape.draft_vocab * shape.hidden)),
        # SGLang: hot_token_id = d2t + arange(draft_vocab), i.e. d2t[i] = target id of draft token i, minus i
        "d2t": ("I64", [shape.draft_vocab], struct.pack(f"<{len(hot)}q", *(t - i for i, t in enumerate(hot)))),
        "t2d": ("BOOL", [shape.vocab], bytes(t2d)),
    })
    return tensors


def zeros(rows: int, cols: int):
    return ("BF16", [rows, cols], bytes(2 * rows * cols))


def make_predictable(rng, shape: Shape, target: dict, draft: dict, hot: list[int], keep_share: float) -> None:
    """Turn the random models into the ``mixed``/``full`` pair of the module docstring (in place)."""
    h, row = shape.hidden, 2 * shape.hidden
    for tensors, prefixes in ((target, [f"model.layers.{i}" for i in range(shape.layers)]), (draft, ["midlayer"])):
        for prefix in prefixes:  # each position's hidden state stays its token embedding
            tensors[f"{prefix}.self_attn.o_proj.weight"] = zeros(h, shape.heads * shape.head_dim)
            tensors[f"{prefix}.mlp.down_proj.weight"] = zeros(h, shape.intermediate)
    embed = target["model.embed_tokens.weight"][2]

    def embedding(token: int) -> bytes:
        return embed[token * row:(token + 1) * row]

    order = list(hot)
    rng.shuffle(order)
    kept = round(keep_share * len(order))
    kept -= (len(order) - kept) % 2  # the swapped tokens go in pairs
    partner = {t: t for t in order[:kept]}
    swapped = order[kept:]
    for a, b in zip(swapped[0::2], swapped[1::2]):
        partner[a], partner[b] = b, a
    # target: logit of token j is <embedding(partner(j)), state>, largest for j = partner(current token); the rows
    # outside the draft vocabulary are zero, so a token outside it (a prompt token) is followed by one inside.
    zero_row = bytes(row)
    target["lm_head.weight"] = ("BF16", [shape.vocab, h], b"".join(
        embedding(partner[j]) if j in partner else zero_row for j in range(shape.vocab)))
    # drafter: fc passes the first captured target state (the current token's embedding) through; draft token i's
    # logit is <embedding(hot[i]), state>, so it guesses partner(partner(current)) == current, the token two back.
    fc = bytearray(2 * h * 3 * h)
    for r in range(h):
        fc[2 * (r * 3 * h + r):2 * (r * 3 * h + r) + 2] = BF16_ONE
    draft["fc.weight"] = ("BF16", [h, 3 * h], bytes(fc))
    draft["lm_head.weight"] = ("BF16", [shape.draft_vocab, h], b"".join(embedding(t) for t in hot))


def write_model(folder: Path, config: dict, tensors: dict) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}) + "\n")
    write_safetensors(folder / "model.safetensors", tensors, metadata={"format": "pt"})
    return sum(len(t[2]) for t in tensors.values())


def make_models(out: Path, shape: Shape, seed: int = 0, acceptance: str = "random") -> dict:
    """Write DIR/target and DIR/draft; returns {"target": path, "draft": path}."""
    shape.check()
    if acceptance not in ACCEPTANCE:
        raise ValueError(f"--acceptance {acceptance}: must be one of {', '.join(ACCEPTANCE)}")
    rng = random.Random(seed)
    target_config = {**common_config(shape), "architectures": ["LlamaForCausalLM"],
                     "num_hidden_layers": shape.layers}
    draft_config = {**common_config(shape), "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
                    "draft_vocab_size": shape.draft_vocab,
                    "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layer_ids(shape.layers),
                                     "use_aux_hidden_state": True}}
    target = target_tensors(rng, shape)
    hot = sorted(rng.sample(range(shape.vocab), shape.draft_vocab))
    draft = draft_tensors(rng, shape, hot)
    if ACCEPTANCE[acceptance] is not None:
        make_predictable(rng, shape, target, draft, hot, ACCEPTANCE[acceptance])
    sizes = {"target": write_model(out / "target", target_config, target),
             "draft": write_model(out / "draft", draft_config, draft)}
    return {name: {"path": str(out / name), "bytes": size} for name, size in sizes.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="DIR", help="writes DIR/target and DIR/draft")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                        help="tiny (default: hidden 256, 4 layers) or e2e (hidden 2048, 8 layers, the shapes of the"
                             " first 2 x H200 run)")
    for name, help_text in (("vocab", "target vocabulary"), ("hidden", "hidden size"), ("layers", "target layers"),
                            ("heads", "attention heads"), ("kv-heads", "key/value heads"),
                            ("intermediate", "MLP size"), ("draft-vocab", "drafter vocabulary")):
        parser.add_argument(f"--{name}", type=int, help=f"{help_text} (overrides the preset)")
    parser.add_argument("--seed", type=int, default=0, help="weights and draft vocabulary come from it (default 0)")
    parser.add_argument("--acceptance", choices=list(ACCEPTANCE), default="random",
                        help="random (default: drafts almost never accepted), mixed (about half the requests accept"
                             " every draft, the others one per verify) or full (every draft accepted)")


def run(args: argparse.Namespace) -> int:
    overrides = {key: getattr(args, key) for key in ("vocab", "hidden", "layers", "heads", "kv_heads",
                                                      "intermediate", "draft_vocab")
                 if getattr(args, key) is not None}
    shape = replace(PRESETS[args.preset], **overrides)
    bad = [f"--{k.replace('_', '-')} {v}" for k, v in overrides.items() if v < 1]
    try:
        if bad:
            raise ValueError(f"{bad[0]}: must be a positive integer")
        written = make_models(Path(args.out), shape, args.seed, args.acceptance)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    for name, info in written.items():
        print(f"{info['path']}: {info['bytes'] / 2**20:.1f} MiB")
    print(f"serve with --skip-tokenizer-init (no tokenizer is written): --model-path {written['target']['path']}"
          f" --speculative-algorithm EAGLE3 --speculative-draft-model-path {written['draft']['path']}")
    return 0



COMMAND = Command("make-test-models", "write a tiny random Llama target and EAGLE-3 drafter (no downloads)",
                  add_arguments, run, description=__doc__.splitlines()[0])
