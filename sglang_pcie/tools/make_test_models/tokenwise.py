"""``--acceptance tokenwise``: a drafter accepted token by token, that needs the right captured layers and d2t.

Tokens: f, the target's greedy next-token map, is two random cycles through the draft vocabulary: a core of
``CORE_TOKENS`` (512) and the rest. A token outside the draft vocabulary shares the embedding of a random core token,
so it is followed as that token is. The greedy text depends on the last prompt token only: with random prompts
(bench's default draws ids from 10:30000 of 32,000) about 3 in 4 requests walk the core and the rest a long cycle,
so 512 tokens take about 75% of the generated tokens, as the frequent tokens of real text take most of it; a
per-token signal sees the frequent tokens in seconds, the long tail in proportion to its traffic. Each draft token
has a code c(t) in {+-a}^d (a = 2^-3, d = (hidden - 1) // 3, coordinate 0 always +a, codes distinct).

Target (attention outputs zero, as in ``mixed``): the residual stream is [c, P_l c, 0...] after layer l, where the
P_l are random signed permutations of the d coordinates, one per layer (P_-1 in the embedding): each layer's MLP is
a linear map (gate on the constant coordinate 0, silu(16 x) ~ 16 x; up reads the code, down writes
(P_l - P_(l-1)) c into the second block). So every layer's output carries the token under a key of its own.
``lm_head`` row j is c(f^-1(j)) on the first block: the next token is f(current).

Drafter: ``fc`` decodes the second block of each captured layer with the inverse of that layer's key (weights
1/4, 1/4, 1/2; the first block is not read) into block 3 of its state ([block 1 | block 2 | block 3 | constant]),
so with the configured layers it holds c(t0) for the verified token t0, and with any other layers noise. Attention
output zero; the MLP moves block b to block b + 1 (3 -> 1), so at draft step k the state holds c(t0) in block k.
``lm_head`` row j holds c(f^-(k+1)(j)) in block k where the drafter "knows" j at step k, zero where it does not:
step k's guess is f^(k+1)(t0), the target's token, when known, and otherwise a wrong token (the nearest code's).
Knowledge is drawn per (token, step) with the shares in KNOWN (later steps are harder), so acceptance varies token
by token; the expected accept length at 3 steps is 1 + q1 + q1 q2 + q1 q2 q3 (2.70). The state cycles after 3
steps: a 4th step guesses wrong.

Layer ids shifted by one: every captured block is decoded with a wrong key, the state is noise, nearly every draft is
rejected. d2t partly permuted: the guesses at those draft ids name the wrong target tokens and are rejected.
Needs 5 target layers or more: the drafter captures [0, L // 2 - 1, L - 3], so ids + 1 still name layers that
SGLang captures (it captures the input of layer id + 1, never the last layer's output).
"""
from __future__ import annotations

from functools import lru_cache

from sglang_pcie.tools.make_test_models import bf16
from sglang_pcie.tools.make_test_models.bf16 import zeros
from sglang_pcie.tools.make_test_models.shape import RMS_NORM_EPS, Shape

CORE_TOKENS = 512  # the frequent tokens: one cycle of f, where 3 in 4 random prompts lead
KNOWN = (0.8, 0.7, 0.6)  # share of draft tokens the drafter guesses right at steps 1, 2, 3
AMPLITUDE = 2.0 ** -3
GATE = 16.0  # silu(GATE * x) = GATE * x (1 - 1e-7) at the normalized constant coordinate (x >= 1)
FC_WEIGHTS = (0.25, 0.25, 0.5)


pack = lru_cache(maxsize=None)(bf16.pack)  # few distinct values, packed millions of times


def code_size(shape: Shape) -> int:
    return (shape.hidden - 1) // 3


def aux_layer_ids(layers: int) -> list[int]:
    return [0, layers // 2 - 1, layers - 3]


def check(shape: Shape) -> None:
    if shape.layers < 5:
        raise ValueError(f"--acceptance tokenwise needs --layers 5 or more (got {shape.layers}): the drafter captures"
                         f" layers [0, L // 2 - 1, L - 3], so that layer ids shifted by one still name captured"
                         f" layers")
    if code_size(shape) < 24:
        raise ValueError(f"--acceptance tokenwise needs --hidden 73 or more (got {shape.hidden})")
    if shape.intermediate < 3 * code_size(shape):
        raise ValueError(f"--acceptance tokenwise needs --intermediate >= 3 x ((hidden - 1) // 3) ="
                         f" {3 * code_size(shape)} (got {shape.intermediate})")


def _matrix(rows: int, cols: int, entries: dict) -> tuple:
    """A bf16 [rows, cols] matrix, zero but for {(row, col): value}."""
    raw = bytearray(2 * rows * cols)
    for (r, c), value in entries.items():
        raw[2 * (r * cols + c):2 * (r * cols + c) + 2] = pack(value)
    return ("BF16", [rows, cols], bytes(raw))


def _signed_permutation(rng, d: int) -> list[tuple[int, float]]:
    """(P c)_i = sign_i * c[source_i]: a list of (source_i, sign_i)."""
    sources = list(range(d))
    rng.shuffle(sources)
    return [(s, rng.choice((-1.0, 1.0))) for s in sources]


def _mlp_scale(rms: float) -> float:
    """down weight so that silu(GATE * x0) * x_n * weight = the residual entry x_n * rms (x0 = a / rms)."""
    z = GATE * AMPLITUDE / rms
    silu = z / (1.0 + 2.718281828459045 ** -z)
    return rms / silu


def next_token_map(rng, vocab: int, hot: list[int], core_tokens: int = CORE_TOKENS) -> tuple[dict, dict, list[int]]:
    """f as {token: next} over ``hot`` (two cycles: a core of ``core_tokens`` and the rest), its inverse, and
    ``alias``: the draft token whose embedding each vocabulary token uses (itself in the draft vocabulary, a random
    core token outside)."""
    order = list(hot)
    rng.shuffle(order)
    core_size = min(core_tokens, len(order) // 2) or len(order)
    nxt = {}
    for ring in (order[:core_size], order[core_size:]):
        nxt.update({ring[i]: ring[(i + 1) % len(ring)] for i in range(len(ring))})
    prev = {v: k for k, v in nxt.items()}
    hot_set = set(hot)
    alias = [t if t in hot_set else order[rng.randrange(core_size)] for t in range(vocab)]
    return nxt, prev, alias


def _codes(rng, hot: list[int], d: int) -> dict[int, tuple]:
    codes: dict[int, tuple] = {}
    seen = set()
    for t in hot:
        while True:
            code = (1.0,) + tuple(rng.choice((-1.0, 1.0)) for _ in range(d - 1))
            if code not in seen:
                break
        seen.add(code)
        codes[t] = code
    return codes


def _keyed(key, code) -> list[float]:
    return [sign * code[source] for source, sign in key]


def build(rng, shape: Shape, target: dict, draft: dict, hot: list[int]) -> None:
    """Turn the random models into the tokenwise pair (in place): see the module docstring."""
    d = code_size(shape)
    codes = _codes(rng, hot, d)
    nxt, prev, alias = next_token_map(rng, shape.vocab, hot)
    keys = [_signed_permutation(rng, d) for _ in range(shape.layers + 1)]  # keys[l + 1] = P_l; keys[0] = P_-1
    _build_target(shape, target, codes, prev, alias, keys)
    _build_drafter(rng, shape, draft, hot, codes, prev, keys)


def embeddings(shape: Shape, codes: dict, alias: list[int], key: list) -> tuple:
    """The embedding table: row t is [c, P_-1 c, 0...] with c the code of t's alias (its own code for a draft token)
    and P_-1 ``key``, at amplitude ``AMPLITUDE``."""
    rows = []
    for t in range(shape.vocab):
        code = codes[alias[t]]
        rows.append(b"".join(pack(AMPLITUDE * x) for x in code)
                    + b"".join(pack(AMPLITUDE * x) for x in _keyed(key, code))
                    + bytes(2 * (shape.hidden - 2 * len(code))))
    return ("BF16", [shape.vocab, shape.hidden], b"".join(rows))


def _build_target(shape: Shape, target: dict, codes: dict, prev: dict, alias: list[int], keys: list) -> None:
    h, d, inter, a = shape.hidden, code_size(shape), shape.intermediate, AMPLITUDE
    target["model.embed_tokens.weight"] = embeddings(shape, codes, alias, keys[0])
    scale = _mlp_scale((2 * d * a * a / h + RMS_NORM_EPS) ** 0.5)
    for layer in range(shape.layers):
        prefix = f"model.layers.{layer}"
        target[f"{prefix}.self_attn.o_proj.weight"] = zeros(h, shape.heads * shape.head_dim)
        target[f"{prefix}.mlp.gate_proj.weight"] = _matrix(inter, h, {(n, 0): GATE for n in range(d)})
        target[f"{prefix}.mlp.up_proj.weight"] = _matrix(inter, h, {(n, n): 1.0 for n in range(d)})
        down: dict = {}
        for i, (source, sign) in enumerate(keys[layer + 1]):
            down[(d + i, source)] = down.get((d + i, source), 0.0) + sign * scale
        for i, (source, sign) in enumerate(keys[layer]):
            down[(d + i, source)] = down.get((d + i, source), 0.0) - sign * scale
        target[f"{prefix}.mlp.down_proj.weight"] = _matrix(h, inter, {k: v for k, v in down.items() if v})
    zero_row = bytes(2 * h)
    target["lm_head.weight"] = ("BF16", [shape.vocab, h], b"".join(
        b"".join(pack(x) for x in codes[prev[j]]) + bytes(2 * (h - d)) if j in prev else zero_row
        for j in range(shape.vocab)))


def _build_drafter(rng, shape: Shape, draft: dict, hot: list[int], codes: dict, prev: dict, keys: list) -> None:
    """The drafter state: block b (0-based 0, 1, 2) at coordinates b*d .. b*d + d - 1, the constant at 3d."""
    h, d, inter, a = shape.hidden, code_size(shape), shape.intermediate, AMPLITUDE
    const = 3 * d
    fc: dict = {(const, 0): 1.0}  # capture 0's coordinate 0 (+a)
    for k, layer in enumerate(aux_layer_ids(shape.layers)):
        for i, (source, sign) in enumerate(keys[layer + 1]):  # (P c)_i = sign c[source]: c[source] = sign (P c)_i
            fc[(2 * d + source, k * h + d + i)] = sign * FC_WEIGHTS[k]
    draft["fc.weight"] = _matrix(h, 3 * h, fc)
    draft["midlayer.self_attn.o_proj.weight"] = zeros(h, shape.heads * shape.head_dim)
    d_scale = _mlp_scale(((d + 1) * a * a / h + RMS_NORM_EPS) ** 0.5)
    draft["midlayer.mlp.gate_proj.weight"] = _matrix(inter, h, {(n, const): GATE for n in range(3 * d)})
    draft["midlayer.mlp.up_proj.weight"] = _matrix(inter, h, {(n, n): 1.0 for n in range(3 * d)})
    down = {}
    for n in range(3 * d):  # block b -> block b + 1 (mod 3)
        down[(n, n)] = -d_scale
        down[((n + d) % (3 * d), n)] = d_scale
    draft["midlayer.mlp.down_proj.weight"] = _matrix(h, inter, down)
    head = []
    for j in hot:
        row = []
        for k in range(3):  # block k predicts f^(k+2)(t0): row j holds c(f^-(k+2) (j))
            back = j
            for _ in range(k + 2):
                back = prev[back]
            row.extend(codes[back] if rng.random() < KNOWN[k] else (0.0,) * d)
        head.append(b"".join(pack(x) for x in row) + bytes(2 * (h - 3 * d)))
    draft["lm_head.weight"] = ("BF16", [shape.draft_vocab, h], b"".join(head))
