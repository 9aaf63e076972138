"""``--acceptance interleaved``: the tokenwise pair's keyed layers and per-token knowledge, in a text where each
token follows many different tokens.

Tokens: the next token is f of the token BEFORE the last one, t(n+1) = f(t(n-1)), with f two cycles through the
draft vocabulary (a core of ``CORE_TOKENS``, 128, and the rest; a token outside the draft vocabulary shares the
embedding of a random core token, as in ``tokenwise``). The greedy text interleaves two walks of f, one on the even
positions and one on the odd, at an offset set by the prompt's last two tokens: over many requests a core token
follows many different tokens. (In the tokenwise pair each token follows one token only: a per-context statistic
has one context per token there.)

Target: layer 0's attention is a previous-token head. Its queries and keys are constants read from coordinate 0 and
rotated by RoPE (``rope_theta`` ``ROPE_THETA``): the score of position j seen from position i is
S * sum_m cos(((i - j) - 1) theta_m), largest at j = i - 1 by ``SCORE_MARGIN`` (32) or more, so the head copies the
previous token's code. The residual stream after layer l is [c, P_l c, c', Q_l c'] (c the token's code, c' the
previous token's, one block of d = (hidden - 1) // 6 coordinates each; P_l, Q_l random signed permutations per layer:
each layer's output carries both codes under keys of its own). The other attention outputs are zero; the MLPs write
the keyed blocks as in ``tokenwise``. ``lm_head`` reads c': the next token is f(previous token).

Drafter: EAGLE-3 drafts from the target state of position i (token t_i, its previous token t_(i-1)) after the
verified token t_(i+1) = f(t_(i-1)). Step 1 guesses t_(i+2) = f(t_i), step 2 t_(i+3) = f^2(t_(i-1)), step 3
t_(i+4) = f^2(t_i). ``fc`` decodes P_l c and Q_l c' of each captured layer with that layer's keys into two groups
of three blocks ([G1 | G2 | constant]); the MLP rotates each group by one block per step, so at step k block k of G1
holds c(t_i) and block k of G2 holds c(t_(i-1)). ``lm_head`` row j holds, in the block its step reads, the code of
the token that j follows (zero where the drafter does not "know" j at that step; ``tokenwise.KNOWN``), and a random
code of weight ``NOISE`` in the other group's block of that step: a right guess is unchanged, but where the drafter
does not know the answer its wrong guess depends on both tokens, so it varies with the context as a real drafter's
misses do (a miss decided by t_i alone would repeat one wrong token after every context).

Layer ids shifted by one: the captured blocks are decoded with the wrong keys, nearly every draft is rejected.
d2t partly permuted: the guesses at those draft ids name the wrong target tokens and are rejected in every context.
Needs 5 target layers or more (the drafter captures [0, L // 2 - 1, L - 3]), hidden 145 or more, kv heads x
head_dim >= d (the head copies c' through as many KV heads as it takes) and intermediate >= 6 d.
"""
from __future__ import annotations

import math

from sglang_pcie.tools.make_test_models import tokenwise
from sglang_pcie.tools.make_test_models.bf16 import zeros
from sglang_pcie.tools.make_test_models.shape import RMS_NORM_EPS, Shape
from sglang_pcie.tools.make_test_models.tokenwise import AMPLITUDE, FC_WEIGHTS, GATE, KNOWN, pack

CORE_TOKENS = 128  # the frequent tokens: few enough that each is drafted about once a second at bench's sampling
ROPE_THETA = 10.0  # high RoPE frequencies: a previous-token head with a wide margin over every other position
SCORE_MARGIN = 32.0  # attention logit of the previous position over any other: weight e^-32 each, at most
NOISE = 1.0  # weight of the other group's random code in a head row (a miss depends on both tokens)
aux_layer_ids = tokenwise.aux_layer_ids
_matrix, _mlp_scale = tokenwise._matrix, tokenwise._mlp_scale


def code_size(shape: Shape) -> int:
    return (shape.hidden - 1) // 6


def copy_heads(shape: Shape) -> int:
    return -(-code_size(shape) // shape.head_dim)


def check(shape: Shape) -> None:
    d = code_size(shape)
    problems = []
    if shape.layers < 5:
        problems.append(f"--layers 5 or more (got {shape.layers}): the drafter captures [0, L // 2 - 1, L - 3]")
    if d < 24:
        problems.append(f"--hidden 145 or more (got {shape.hidden})")
    if shape.head_dim % 2:
        problems.append(f"an even head_dim (hidden / heads = {shape.head_dim})")
    if copy_heads(shape) > shape.kv_heads:
        problems.append(f"--kv-heads x head_dim >= (hidden - 1) // 6 = {d} (got {shape.kv_heads} x"
                        f" {shape.head_dim})")
    if shape.intermediate < 6 * d:
        problems.append(f"--intermediate >= 6 x ((hidden - 1) // 6) = {6 * d} (got {shape.intermediate})")
    if problems:
        raise ValueError(f"--acceptance interleaved needs {problems[0]}")


def score_scale(head_dim: int) -> float:
    """S: the attention logit is S * sum_m cos((i - j - 1) theta_m); the margin of j = i - 1 over any other j up
    to 4096 positions back (or j = i) is S * min over those of sum_m (1 - cos(delta theta_m))."""
    thetas = [ROPE_THETA ** (-2 * m / head_dim) for m in range(head_dim // 2)]
    gap = min(sum(1 - math.cos(delta * t) for t in thetas) for delta in [-1, *range(1, 4097)])
    return SCORE_MARGIN / gap


def build(rng, shape: Shape, target: dict, draft: dict, hot: list[int]) -> None:
    """Turn the random models into the interleaved pair (in place): see the module docstring."""
    d = code_size(shape)
    codes = tokenwise._codes(rng, hot, d)
    nxt, prev, alias = tokenwise.next_token_map(rng, shape.vocab, hot, CORE_TOKENS)
    keys_cur = [tokenwise._signed_permutation(rng, d) for _ in range(shape.layers + 1)]  # [l + 1] = P_l
    keys_prev = [tokenwise._signed_permutation(rng, d) for _ in range(shape.layers + 1)]  # [l + 1] = Q_l
    _build_target(shape, target, codes, prev, alias, keys_cur, keys_prev)
    _build_drafter(rng, shape, draft, hot, codes, prev, keys_cur, keys_prev)


def _build_target(shape: Shape, target: dict, codes: dict, prev: dict, alias: list[int], keys_cur: list,
                  keys_prev: list) -> None:
    h, d, inter, a = shape.hidden, code_size(shape), shape.intermediate, AMPLITUDE
    target["model.embed_tokens.weight"] = tokenwise.embeddings(shape, codes, alias, keys_cur[0])  # [c, P_-1 c, 0...]
    _previous_token_head(shape, target, keys_prev[0])
    scale = _mlp_scale((4 * d * a * a / h + RMS_NORM_EPS) ** 0.5)
    gate = {(n, 0): GATE for n in range(2 * d)}
    up = {**{(n, n): 1.0 for n in range(d)}, **{(d + n, 2 * d + n): 1.0 for n in range(d)}}
    for layer in range(shape.layers):
        prefix = f"model.layers.{layer}"
        if layer:
            target[f"{prefix}.self_attn.o_proj.weight"] = zeros(h, shape.heads * shape.head_dim)
        target[f"{prefix}.mlp.gate_proj.weight"] = _matrix(inter, h, gate)
        target[f"{prefix}.mlp.up_proj.weight"] = _matrix(inter, h, up)
        down: dict = {}
        for block, unit, keys in ((d, 0, keys_cur), (3 * d, d, keys_prev)):  # (P_l - P_(l-1)) c into block 1, Q: 3
            for sign_of, key in ((1.0, keys[layer + 1]), (-1.0, keys[layer])):
                for i, (source, sign) in enumerate(key):
                    cell = (block + i, unit + source)
                    down[cell] = down.get(cell, 0.0) + sign_of * sign * scale
        target[f"{prefix}.mlp.down_proj.weight"] = _matrix(h, inter, {k: v for k, v in down.items() if v})
    zero_row = bytes(2 * h)
    target["lm_head.weight"] = ("BF16", [shape.vocab, h], b"".join(
        bytes(2 * 2 * d) + b"".join(pack(x) for x in codes[prev[j]]) + bytes(2 * (h - 3 * d)) if j in prev
        else zero_row for j in range(shape.vocab)))


def _previous_token_head(shape: Shape, target: dict, key_prev: list) -> None:
    """Layer 0's attention: every head attends to the previous position; KV heads 0 .. copy_heads - 1 carry the
    code block (coordinates 0 .. d - 1) and o_proj writes it into block 2 (c') and, keyed, block 3 (Q_-1 c')."""
    h, d, a, hd = shape.hidden, code_size(shape), AMPLITUDE, shape.head_dim
    half, group = hd // 2, shape.heads // shape.kv_heads
    rms = (2 * d * a * a / h + RMS_NORM_EPS) ** 0.5  # layer 0's input: [c, P_-1 c]
    const = a / rms  # coordinate 0 after the input norm
    amp = (score_scale(hd) * hd ** 0.5) ** 0.5  # |q| = |k| per frequency: q.k / sqrt(hd) = S per frequency
    thetas = [ROPE_THETA ** (-2 * m / hd) for m in range(half)]
    prefix = "model.layers.0.self_attn"
    # q = (amp, 0) per frequency pair: rotated, amp (cos i theta, sin i theta); k = amp (cos theta, sin theta):
    # rotated, amp (cos (j + 1) theta, sin (j + 1) theta); q.k = amp^2 cos((i - j - 1) theta)
    target[f"{prefix}.q_proj.weight"] = _matrix(shape.heads * hd, h, {
        (head * hd + m, 0): amp / const for head in range(shape.heads) for m in range(half)})
    k_cells = {}
    for kv in range(shape.kv_heads):
        for m, theta in enumerate(thetas):
            k_cells[(kv * hd + m, 0)] = amp * math.cos(theta) / const
            k_cells[(kv * hd + half + m, 0)] = amp * math.sin(theta) / const
    target[f"{prefix}.k_proj.weight"] = _matrix(shape.kv_heads * hd, h, k_cells)
    target[f"{prefix}.v_proj.weight"] = _matrix(shape.kv_heads * hd, h, {(n, n): 1.0 for n in range(d)})
    o_cells = {}
    where = {source: (i, sign) for i, (source, sign) in enumerate(key_prev)}
    for n in range(d):  # value coordinate n (KV head n // hd) is read by the first query head of that KV head
        column = (n // hd) * group * hd + n % hd
        o_cells[(2 * d + n, column)] = rms
        i, sign = where[n]
        o_cells[(3 * d + i, column)] = sign * rms
    target[f"{prefix}.o_proj.weight"] = _matrix(h, shape.heads * hd, o_cells)


def _build_drafter(rng, shape: Shape, draft: dict, hot: list[int], codes: dict, prev: dict, keys_cur: list,
                   keys_prev: list) -> None:
    """The drafter state: G1 blocks 0, 1, 2 at coordinates 0 .. 3d - 1, G2 at 3d .. 6d - 1, the constant at 6d."""
    h, d, inter, a = shape.hidden, code_size(shape), shape.intermediate, AMPLITUDE
    const = 6 * d
    fc: dict = {(const, 0): 1.0}  # capture 0's coordinate 0 (+a)
    for k, layer in enumerate(aux_layer_ids(shape.layers)):
        for into, read, keys in ((2 * d, d, keys_cur), (5 * d, 3 * d, keys_prev)):  # c(t_i) -> G1 block 2, c' -> G2
            for i, (source, sign) in enumerate(keys[layer + 1]):
                fc[(into + source, k * h + read + i)] = sign * FC_WEIGHTS[k]
    draft["fc.weight"] = _matrix(h, 3 * h, fc)
    draft["midlayer.self_attn.o_proj.weight"] = zeros(h, shape.heads * shape.head_dim)
    d_scale = _mlp_scale(((2 * d + 1) * a * a / h + RMS_NORM_EPS) ** 0.5)
    draft["midlayer.mlp.gate_proj.weight"] = _matrix(inter, h, {(n, const): GATE for n in range(6 * d)})
    draft["midlayer.mlp.up_proj.weight"] = _matrix(inter, h, {(n, n): 1.0 for n in range(6 * d)})
    down = {}
    for n in range(6 * d):  # block b -> block b + 1 (mod 3) within each group
        start = n // (3 * d) * 3 * d
        down[(n, n)] = -d_scale
        down[(start + (n - start + d) % (3 * d), n)] = d_scale
    draft["midlayer.mlp.down_proj.weight"] = _matrix(h, inter, down)
    zero = (0.0,) * d
    head = []
    for j in hot:
        back2 = prev[prev[j]]
        noise = [tuple(NOISE * rng.choice((-1.0, 1.0)) for _ in range(d)) for _ in range(3)]
        known = [rng.random() < share for share in KNOWN]
        # step 1 reads G1 block 0 (c(t_i)): f(t_i); step 2 G2 block 1 (c(t_(i-1))): f^2; step 3 G1 block 2: f^2
        blocks = [codes[prev[j]] if known[0] else zero, noise[1], codes[back2] if known[2] else zero,
                  noise[0], codes[back2] if known[1] else zero, noise[2]]
        head.append(b"".join(pack(x) for block in blocks for x in block) + bytes(2 * (h - 6 * d)))
    draft["lm_head.weight"] = ("BF16", [shape.draft_vocab, h], b"".join(head))
