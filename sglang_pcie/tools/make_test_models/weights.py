"""The tensors of both models: random, then (``mixed`` / ``full``) made predictable."""
from __future__ import annotations

import struct

from sglang_pcie.tools.make_test_models import allreduce_check
from sglang_pcie.tools.make_test_models.bf16 import BF16_ONE, ones, random_bf16, zeros
from sglang_pcie.tools.make_test_models.shape import RMS_NORM_EPS, Shape


def common_config(shape: Shape) -> dict:
    return {
        "model_type": "llama", "hidden_act": "silu", "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "rms_norm_eps": RMS_NORM_EPS,
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


def make_predictable(rng, shape: Shape, target: dict, draft: dict, hot: list[int], keep_share: float,
                     all_reduce_check: bool = False) -> None:
    """Turn the random models into the ``mixed``/``full`` pair of the package docstring (in place); with
    ``all_reduce_check``, into the pair whose tokens hold only if every all-reduce adds all its partial sums
    (allreduce_check's docstring)."""
    h, row = shape.hidden, 2 * shape.hidden
    if all_reduce_check:
        final = allreduce_check.build_layers(rng, shape, target, draft, hot)
    else:
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
    if all_reduce_check:
        head = allreduce_check.lm_head(rng, shape, embedding, hot, partner, final)
    else:
        zero_row = bytes(row)
        head = b"".join(embedding(partner[j]) if j in partner else zero_row for j in range(shape.vocab))
    target["lm_head.weight"] = ("BF16", [shape.vocab, h], head)
    # drafter: fc passes the first captured target state (the current token's embedding) through; draft token i's
    # logit is <embedding(hot[i]), state>, so it guesses partner(partner(current)) == current, the token two back.
    fc = bytearray(2 * h * 3 * h)
    for r in range(h):
        fc[2 * (r * 3 * h + r):2 * (r * 3 * h + r) + 2] = BF16_ONE
    draft["fc.weight"] = ("BF16", [h, 3 * h], bytes(fc))
    draft["lm_head.weight"] = ("BF16", [shape.draft_vocab, h], b"".join(embedding(t) for t in hot))
