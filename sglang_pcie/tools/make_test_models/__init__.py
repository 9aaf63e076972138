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
- ``tokenwise``: a healthy drafter accepted token by token (accept length about 2.7 at 3 steps, from per-token,
  per-step knowledge), whose guesses depend on decoding each captured layer with that layer's own key: layer ids
  shifted by one, or part of ``d2t`` permuted, lower the accept length (``tokenwise.py``; needs 5 layers or more,
  e.g. ``--layers 6``; 3 draft steps, a 4th is always wrong). Each token follows one token only there.
- ``interleaved``: the tokenwise pair's keyed layers and per-token knowledge in a text where the next token is f
  of the token before the last, through a previous-token attention head in layer 0 (RoPE, ``rope_theta`` 10): each
  frequent token follows many different tokens, and the healthy drafter's misses depend on both of its tokens, as
  a real drafter's do. A per-context statistic (draft-token-watch's) sees a wrong ``d2t`` entry rejected after
  every token there; layer ids + 1 drop the accept length to 1.0 (``interleaved.py``; needs 5 layers or more, hidden
  145 or more; accept length about 2.7-2.8 at 3 steps with hidden 512 or ``--preset e2e``).
- ``--all-reduce-check`` (with ``mixed`` / ``full``): the same chain of tokens and accept lengths, but the attention
  and MLP outputs are not zero: each tensor-parallel shard's partial sum of o_proj / down_proj is large and is
  cancelled exactly by a partner shard's, and a value carried from sublayer to sublayer through every all-reduce
  decides, in lm_head, between the true next token and a decoy. A shard's partial dropped, doubled or scaled, an
  all-reduce that returns zeros, half the sum or a stale result: the tokens change (``allreduce_check.py``). The
  embeddings are +-2^-3, and a token outside the draft vocabulary shares a draft token's embedding, so that every
  output token, the first included, follows from the files (``files.predicted_chain``). Needs even heads and KV
  heads, intermediate a multiple of heads, hidden at least 4 x layers, vocab at least 2 x draft vocab.

No tokenizer is written: start the server with ``--skip-tokenizer-init`` and send token ids (as
``sglang-pcie bench`` does). Random weights are bf16 of magnitude 2^-7..2^-5 with random signs, norms are 1,
from ``--seed``: the same bytes on every run. Pure standard library (no torch, no numpy): the 256-hidden default
takes about a second, ``--preset e2e`` (2048 hidden, 8 layers, ~1 GiB) tens of seconds.
"""
from __future__ import annotations

import argparse
import random
from dataclasses import replace
from pathlib import Path

from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.make_test_models import interleaved, tokenwise
from sglang_pcie.tools.make_test_models.files import predicted_chain, tensor_bytes, write_model
from sglang_pcie.tools.make_test_models.shape import ACCEPTANCE, PRESETS, Shape, aux_layer_ids
from sglang_pcie.tools.make_test_models.weights import common_config, draft_tensors, make_predictable, target_tensors

__all__ = ["ACCEPTANCE", "COMMAND", "PRESETS", "Shape", "make_models", "predicted_chain", "tensor_bytes"]
PROG = "sglang-pcie make-test-models"
CONSTRUCTIONS = {"tokenwise": tokenwise, "interleaved": interleaved}  # acceptance modes built by a module of their own


def make_models(out: Path, shape: Shape, seed: int = 0, acceptance: str = "random",
                all_reduce_check: bool = False) -> dict:
    """Write DIR/target and DIR/draft; returns {"target": path, "draft": path}."""
    shape.check()
    if acceptance not in ACCEPTANCE:
        raise ValueError(f"--acceptance {acceptance}: must be one of {', '.join(ACCEPTANCE)}")
    if all_reduce_check:
        shape.check_all_reduce(acceptance)
    construction = CONSTRUCTIONS.get(acceptance)
    if construction is not None:
        construction.check(shape)
    layer_ids = construction.aux_layer_ids(shape.layers) if construction else aux_layer_ids(shape.layers)
    rng = random.Random(seed)
    config = common_config(shape)
    if acceptance == "interleaved":
        config["rope_theta"] = interleaved.ROPE_THETA  # its previous-token head's RoPE frequencies
    target_config = {**config, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": shape.layers}
    draft_config = {**config, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
                    "draft_vocab_size": shape.draft_vocab,
                    "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids,
                                     "use_aux_hidden_state": True}}
    target = target_tensors(rng, shape)
    hot = sorted(rng.sample(range(shape.vocab), shape.draft_vocab))
    draft = draft_tensors(rng, shape, hot)
    if construction is not None:
        construction.build(rng, shape, target, draft, hot)
    elif ACCEPTANCE[acceptance] is not None:
        make_predictable(rng, shape, target, draft, hot, ACCEPTANCE[acceptance], all_reduce_check)
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
                             " every draft, the others one per verify), full (every draft accepted) or tokenwise"
                             " (accepted token by token, about 2.7 per verify at 3 steps; wrong layer ids or d2t"
                             " entries lower it;"
                             " needs --layers 5 or more) or interleaved (as tokenwise, but the next token follows"
                             " the token before the last, so each frequent token follows many different tokens)")
    parser.add_argument("--all-reduce-check", action="store_true",
                        help="with --acceptance mixed or full: the same tokens and accept lengths, but only when"
                             " every tensor-parallel all-reduce of o_proj and down_proj adds every shard's partial"
                             " sum (each shard's is large, its partner shard's cancels it exactly)")


def run(args: argparse.Namespace) -> int:
    overrides = {key: getattr(args, key) for key in ("vocab", "hidden", "layers", "heads", "kv_heads",
                                                      "intermediate", "draft_vocab")
                 if getattr(args, key) is not None}
    shape = replace(PRESETS[args.preset], **overrides)
    bad = [f"--{k.replace('_', '-')} {v}" for k, v in overrides.items() if v < 1]
    try:
        if bad:
            raise ValueError(f"{bad[0]}: must be a positive integer")
        written = make_models(Path(args.out), shape, args.seed, args.acceptance, args.all_reduce_check)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    for name, info in written.items():
        print(f"{info['path']}: {info['bytes'] / 2**20:.1f} MiB")
    print(f"serve with --skip-tokenizer-init (no tokenizer is written): --model-path {written['target']['path']}"
          f" --speculative-algorithm EAGLE3 --speculative-draft-model-path {written['draft']['path']}")
    return 0


DESCRIPTION = ("Write a tiny random Llama target (DIR/target) and an EAGLE-3 drafter for it (DIR/draft) that "
               "SGLang loads and serves, with no downloads; --acceptance decides how often SGLang accepts the "
               "drafter's guesses.")
EPILOG = "Exit status: 0 when both models were written; 2 for bad usage or a folder that cannot be written."

COMMAND = Command("make-test-models", "write a tiny random Llama target and EAGLE-3 drafter (no downloads)",
                  add_arguments, run, description=DESCRIPTION, epilog=EPILOG)
