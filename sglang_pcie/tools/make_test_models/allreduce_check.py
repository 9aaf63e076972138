"""``--all-reduce-check``: the ``mixed`` / ``full`` chain of tokens, held up by every tensor-parallel all-reduce.

Two mechanisms, both exact in any order of summation and at any TP size that splits the heads (2, 4, ... heads):

* Pairs that cancel. In every layer (the drafter's midlayer too) the second half of the attention heads, KV heads
  and MLP blocks (intermediate / heads neurons each) repeats the first half's weights, so unit k and unit
  k + heads/2 compute the same outputs. o_proj / down_proj give output coordinate c weights w on unit
  k = c mod (heads/2) and -w on its partner: the sum is x - x = 0. Tensor parallelism splits heads and blocks
  contiguously, so the two units of a pair sit in different shards (at the same position within each): every
  shard's partial sum is large (about CHECK_STRENGTH embedding entries rms per coordinate), every coordinate's
  all-reduce adds one x, one -x and zeros. A shard's partial dropped, doubled, scaled or replaced leaves a large
  vector in the residual stream, which otherwise stays the token's embedding exactly; that moves the residual's
  rms, which every link of the chain below divides by (dimension 0, the chain's constant, gets no pair).
* A chain that must arrive. The last 2 x layers hidden coordinates (zero in every embedding) carry a value from
  sublayer to sublayer: layer l's attention reads the previous link's coordinate through one value dimension of
  KV-head pair 0 (a value the same at every position, so attention passes it on whatever it attends to), and
  both heads of pair 0 write it, scaled, into the next coordinate; the MLP reads that with one neuron of block
  pair 0 (gate on the constant dimension 0, up on the coordinate) and writes the next. Each link's all-reduce adds
  two equal partials (x + x, exact), so the last coordinate holds CHAIN_VALUE only if every link's sum arrived.
  lm_head reads it: the true next token's row gains DECOY_SHARE x its embedding logit from it, while a decoy
  token (outside the draft vocabulary, one per draft token) has twice the true row's embedding part and loses as
  much. All links right: the true token leads its decoy by half its embedding logit. An all-reduce that returns
  zeros, a stale result, half the sum, or one shard's partial, anywhere in the chain: the decoy wins.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_pcie.tools.make_test_models.bf16 import BF16_ONE, negated, pack, random_bf16, rounded, signed_bf16
from sglang_pcie.tools.make_test_models.shape import RMS_NORM_EPS, Shape

EMBED = 2.0 ** -3  # every embedding entry is +-EMBED (dimension 0: +EMBED, the chain's start)
CHECK_STRENGTH = 64  # rms of one shard's partial output per coordinate, in embedding entries (before cancelling)
SILU_PRODUCT_RMS = 0.6  # rms of silu(g) * u for independent standard normal g and u (0.596)
CHAIN_VALUE = 2 * EMBED  # what each link of the chain writes
CHAIN_GATE = 4.0  # the chain neuron's gate input: silu(4) = 3.93, it passes its up input on, scaled
DECOY_SHARE = 0.75  # the chain's part of the true token's logit, in units of its embedding part
_EMBED_HIGH = bytes((b & 0x80) | 0x3E for b in range(256))  # high byte of bf16 +-2^-3


@dataclass(frozen=True)
class Link:
    source: int  # the coordinate of the normalized input it reads
    target: int  # the coordinate it writes, through both units of pair 0
    weight: float  # o_proj / down_proj weight on each of the two units (bf16)
    gate: float = 0.0  # MLP links: the gate weight on dimension 0 (bf16)


def chain_coordinates(shape: Shape) -> list[int]:
    """One per sublayer (layer 0's attention, layer 0's MLP, layer 1's attention, ...): the last 2 x layers."""
    return list(range(shape.hidden - 2 * shape.layers, shape.hidden))


def check_chain(shape: Shape) -> tuple[list[Link], float]:
    """The links, with weights that make every link write about CHAIN_VALUE, and the value the last one leaves
    (floats standing in for the kernels' bf16: within a few 2^-9 of it per link)."""
    e_dims = shape.hidden - 2 * shape.layers
    written = {0: EMBED}

    def normalized(coord: int) -> float:  # RMSNorm of the residual stream, with weight 1
        mean_square = (e_dims * EMBED ** 2 + sum(v * v for c, v in written.items() if c)) / shape.hidden
        return written[coord] / math.sqrt(mean_square + RMS_NORM_EPS)

    links, source = [], 0
    for i, target in enumerate(chain_coordinates(shape)):
        gate = 0.0
        factor = normalized(source)  # attention: the value dimension reads the source with weight 1
        if i % 2:  # MLP: silu(gate * x[0]) * x[source]
            gate = rounded(CHAIN_GATE / normalized(0))
            g = gate * normalized(0)
            factor *= g / (1 + math.exp(-g))
        weight = rounded(CHAIN_VALUE / (2 * factor))
        written[target] = 2 * weight * factor
        links.append(Link(source, target, weight, gate))
        source = target
    return links, written[source]


def sign_embeddings(rng, shape: Shape, hot: list[int]) -> bytes:
    """Rows of +-EMBED with random signs, +EMBED in dimension 0, zero in the chain's coordinates. A token outside
    the draft vocabulary shares a random draft token's row: the first output token after any prompt is then as
    clear a choice as every later one (random rows would leave it on near-ties)."""
    e_dims = shape.hidden - 2 * shape.layers
    rows = {}
    for token in hot:
        raw = bytearray(2 * shape.hidden)
        raw[1:2 * e_dims:2] = rng.randbytes(e_dims).translate(_EMBED_HIGH)
        raw[1] = 0x3E
        rows[token] = bytes(raw)
    return b"".join(rows[t] if t in rows else rows[rng.choice(hot)] for t in range(shape.vocab))


def cancelling_columns(rng, rows: int, units: int, width: int, rms: float, skip=()) -> bytearray:
    """A [rows, units x width] weight: row c reads unit k = c mod (units / 2) with random weights and unit
    k + units / 2 with the same weights negated, nothing else; the rows in ``skip`` are zero."""
    half = units // 2
    out = bytearray()
    for c in range(rows):
        if c in skip:
            out += bytes(2 * width * units)
            continue
        k = c % half
        values = signed_bf16(rng, width, rms)
        out += b"".join((bytes(2 * width * k), values, bytes(2 * width * (half - 1)), negated(values),
                         bytes(2 * width * (half - 1 - k))))
    return out


def put(weight: bytearray, cols: int, row: int, col: int, value: float) -> None:
    weight[2 * (row * cols + col):2 * (row * cols + col) + 2] = pack(value)


def cancelling_layer(rng, prefix: str, shape: Shape, in_dim: int, links: tuple[Link, Link] | None = None) -> dict:
    """One decoder layer of paired units (module docstring); with ``links`` (attention's, MLP's), the chain's
    value dimension, neuron and rows too, and the other chain coordinates' rows left zero (and dimension 0's)."""
    h, d, heads, kv, inter = shape.hidden, shape.head_dim, shape.heads, shape.kv_heads, shape.intermediate
    block = inter // heads  # MLP block b pairs with block b + heads / 2, as head b pairs with head b + heads / 2
    value = bytearray(signed_bf16(rng, kv // 2 * d * in_dim, 0.5 / math.sqrt(in_dim)))
    for r in range(kv // 2 * d):  # a constant part, +-1, from the constant every normalized input has in dimension 0
        value[2 * r * in_dim:2 * r * in_dim + 2] = rng.choice((BF16_ONE, negated(BF16_ONE)))
    gate = bytearray(signed_bf16(rng, inter // 2 * h, h ** -0.5))  # the MLP reads h (the drafter's q/k/v: 2 x h)
    up = bytearray(signed_bf16(rng, inter // 2 * h, h ** -0.5))
    partial = CHECK_STRENGTH * EMBED  # a head's outputs are about +-1 (the constant part), silu(g) * u about 0.6
    # dimension 0 (the constant the chain's gates and the value rows read) gets no pair: a fault elsewhere then
    # moves the chain only through the residual's rms
    skip = {0, *(chain_coordinates(shape) if links else ())}
    o_proj = cancelling_columns(rng, h, heads, d, partial / math.sqrt(d), skip)
    down = cancelling_columns(rng, h, heads, block, partial / (SILU_PRODUCT_RMS * math.sqrt(block)), skip)
    if links:
        attention, mlp = links
        for weight, cols in ((value, in_dim), (gate, h), (up, h)):  # row 0 (value dimension 0 of KV head 0,
            weight[:2 * cols] = bytes(2 * cols)  # neuron 0) becomes the chain's
        put(value, in_dim, 0, attention.source, 1.0)
        put(gate, h, 0, 0, mlp.gate)
        put(up, h, 0, mlp.source, 1.0)
        for col in (0, heads // 2 * d):  # value dimension 0 of head 0 and of its partner
            put(o_proj, heads * d, attention.target, col, attention.weight)
        for col in (0, inter // 2):  # neuron 0 of block 0 and of its partner
            put(down, inter, mlp.target, col, mlp.weight)
    halves = {"self_attn.q_proj": ([heads * d, in_dim], random_bf16(rng, heads // 2 * d * in_dim)),
              "self_attn.k_proj": ([kv * d, in_dim], random_bf16(rng, kv // 2 * d * in_dim)),
              "self_attn.v_proj": ([kv * d, in_dim], bytes(value)),
              "mlp.gate_proj": ([inter, h], bytes(gate)), "mlp.up_proj": ([inter, h], bytes(up))}
    tensors = {f"{prefix}.{name}.weight": ("BF16", dims, half + half) for name, (dims, half) in halves.items()}
    tensors[f"{prefix}.self_attn.o_proj.weight"] = ("BF16", [h, heads * d], bytes(o_proj))
    tensors[f"{prefix}.mlp.down_proj.weight"] = ("BF16", [h, inter], bytes(down))
    return tensors


def build_layers(rng, shape: Shape, target: dict, draft: dict, hot: list[int]) -> float:
    """Embeddings and every layer of both models (in place); returns the value the chain leaves."""
    target["model.embed_tokens.weight"] = ("BF16", [shape.vocab, shape.hidden], sign_embeddings(rng, shape, hot))
    links, final = check_chain(shape)
    for i in range(shape.layers):
        target.update(cancelling_layer(rng, f"model.layers.{i}", shape, shape.hidden, tuple(links[2 * i:2 * i + 2])))
    draft.update(cancelling_layer(rng, "midlayer", shape, 2 * shape.hidden))
    return final


def lm_head(rng, shape: Shape, embedding, hot: list[int], partner: dict, final: float) -> bytes:
    """Draft token j's row: the embedding of partner(j) plus +beta on the chain's last coordinate; a decoy per
    draft token t (a random token outside the draft vocabulary): twice t's embedding, -beta there. beta makes the
    chain's part DECOY_SHARE of the embedding part; every other row is zero."""
    e_dims = shape.hidden - 2 * shape.layers
    beta = DECOY_SHARE * e_dims * EMBED ** 2 / final
    tail = bytes(2 * (2 * shape.layers - 1))
    hot_set = set(hot)
    decoy_of = dict(zip(rng.sample([t for t in range(shape.vocab) if t not in hot_set], len(hot)), hot))

    def true_row(t: int) -> bytes:
        return embedding(t)[:2 * e_dims] + tail + pack(beta)

    def decoy_row(t: int) -> bytes:
        doubled = bytearray(embedding(t)[:2 * e_dims])
        doubled[0::2] = b"\x80" * e_dims  # +-2^-3 -> +-2^-2: the low byte's top bit is the exponent's last bit
        return bytes(doubled) + tail + pack(-beta)
    zero_row = bytes(2 * shape.hidden)
    return b"".join(true_row(partner[j]) if j in partner else decoy_row(decoy_of[j]) if j in decoy_of else zero_row
                    for j in range(shape.vocab))
