"""Tensor-parallel all-reduce faults simulated on the CPU with transformers' own Llama (bf16).

usage: python allreduce_faults.py MODEL_DIR [--prompts N] [--prompt-len N] [--new-tokens N] [--sweep]

Each o_proj and down_proj of the target runs as TP shards, as SGLang's RowParallelLinear splits them (shard r holds
the r-th contiguous slice of the input dimension: whole heads, whole MLP blocks): every shard's partial output is
computed in bf16, then the partials are added one at a time in a given order, rounding to bf16 after each addition
(as a ring all-reduce does) or in fp32. A shard fault changes one shard's partial before the sum (dropped, doubled,
scaled); an output fault changes what the all-reduce returns (zeros, half the sum, the previous all-reduce's
result). Greedy decoding of the same prompts under each variant is compared with the unsharded model's.

Prints one JSON object on its last line:
  variants:  name -> {"differ": requests whose tokens differ, "max_logprob_diff": of the chosen tokens where they
             agree (null where none does), "first": [request, position] of the first difference or null}
  margins:   over every greedy step of the unsharded run: the smallest lead of the chosen logit over the runner-up,
             and the chosen logits' range
  residue:   largest |o_proj| / |down_proj| output of the unsharded run outside the chain's coordinates (the last
             2 x layers), i.e. what the cancelling pairs leave
  partials:  rms per coordinate of shard 0's partial output (TP=2) outside the chain's coordinates, in embedding
             entries (2^-3), min and median over positions
  chain:     the value each link wrote in the unsharded run (min, max over positions), per sublayer
  sweep:     (--sweep) requests that differ when shard 1's partial is scaled by a factor in every layer, when every
             all-reduce's result is, and when normal noise of a given rms is added to every result outside the
             chain's coordinates (how far from exact a sum may be)
"""
import argparse
import json

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

EMBED = 2.0 ** -3


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--prompt-len", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--sweep", action="store_true")
    return parser.parse_args()


class Shards:
    """Replaces the forward of every o_proj / down_proj with a sharded one, per the current variant:
    (tp, order, shard_fault, accumulate dtype, output_fault) or None (unsharded, measured)."""

    def __init__(self, model):
        config = model.config
        self.chain_start = config.hidden_size - 2 * config.num_hidden_layers
        self.variant = None
        self.last = None  # the previous all-reduce's result, for a stale-result fault
        self.partials = {"o_proj": [], "down_proj": []}
        self.residue = {"o_proj": 0.0, "down_proj": 0.0}
        self.chain = {}
        for i, layer in enumerate(model.model.layers):
            for kind, linear in (("o_proj", layer.self_attn.o_proj), ("down_proj", layer.mlp.down_proj)):
                linear.forward = self.forward_of(i, kind, linear)
        self.model = model

    def forward_of(self, layer, kind, linear):
        link = self.chain_start + 2 * layer + (kind == "down_proj")

        def forward(x):
            if self.variant is None:
                out = F.linear(x, linear.weight)
                self.residue[kind] = max(self.residue[kind], float(out[..., :self.chain_start].abs().max()))
                values = self.chain.setdefault(f"layer {layer} {kind}", [float("inf"), float("-inf")])
                values[0] = min(values[0], float(out[..., link].min()))
                values[1] = max(values[1], float(out[..., link].max()))
                return out
            tp, order, shard_fault, accumulate, output_fault = self.variant
            width = linear.weight.shape[1] // tp
            parts = [F.linear(x[..., r * width:(r + 1) * width], linear.weight[:, r * width:(r + 1) * width])
                     for r in range(tp)]
            if tp == 2 and shard_fault is None and output_fault is None:
                self.partials[kind].append(parts[0][..., :self.chain_start].float().pow(2).mean(-1).sqrt().flatten())
            if shard_fault is not None:
                parts = [shard_fault(layer, kind, r, part) for r, part in enumerate(parts)]
            total = parts[order[0]].to(accumulate)
            for r in order[1:]:
                total = (total + parts[r].to(accumulate)).to(accumulate)
            total = total.to(x.dtype)
            if output_fault is not None:
                total, self.last = output_fault(layer, kind, total, self.last), total
            return total
        return forward

    def generate(self, prompts, new_tokens, variant):
        self.variant, self.last = variant, None
        with torch.no_grad():
            out = self.model.generate(prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      do_sample=False, pad_token_id=0, output_scores=True,
                                      return_dict_in_generate=True)
        self.variant = None
        tokens = out.sequences[:, prompts.shape[1]:]
        scores = torch.stack([s.float() for s in out.scores], 1)
        chosen = torch.log_softmax(scores, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return tokens, chosen, scores


def shard(layer=None, kind=None, rank=1, scale=0.0):
    """Shard ``rank``'s partial times ``scale``, in every layer / kind unless one is named."""
    def fault(at_layer, at_kind, r, part):
        hit = r == rank and layer in (None, at_layer) and kind in (None, at_kind)
        return part * scale if hit else part
    return fault


def output(layer=None, kind=None, scale=0.0, stale=False, noise=0.0, chain_start=None):
    """The all-reduce returns its result times ``scale`` (or the previous all-reduce's result, or its result plus
    normal noise of rms ``noise`` outside the chain's coordinates), in every layer / kind unless one is named."""
    generator = torch.Generator().manual_seed(1)

    def fault(at_layer, at_kind, total, previous):
        if layer not in (None, at_layer) or kind not in (None, at_kind):
            return total
        if noise:
            extra = torch.randn(total.shape, generator=generator) * noise
            extra[..., chain_start:] = 0
            return (total.float() + extra).to(total.dtype)
        return previous if stale and previous is not None and previous.shape == total.shape else total * scale
    return fault


def variants(layers):
    bf16, fp32 = torch.bfloat16, torch.float32
    last = layers - 1
    return {
        "tp2 0+1 bf16": (2, [0, 1], None, bf16, None),
        "tp2 1+0 bf16": (2, [1, 0], None, bf16, None),
        "tp2 fp32": (2, [0, 1], None, fp32, None),
        "tp4 0+1+2+3 bf16": (4, [0, 1, 2, 3], None, bf16, None),
        "tp4 2+0+3+1 bf16": (4, [2, 0, 3, 1], None, bf16, None),
        "fault: tp2 shard 1 dropped": (2, [0, 1], shard(rank=1), bf16, None),
        "fault: tp2 shard 0 dropped": (2, [0, 1], shard(rank=0), bf16, None),
        "fault: tp2 shard 1 doubled": (2, [0, 1], shard(scale=2.0), bf16, None),
        "fault: tp2 shard 1 x 1.25": (2, [0, 1], shard(scale=1.25), bf16, None),
        "fault: tp4 shard 2 dropped": (4, [0, 1, 2, 3], shard(rank=2), bf16, None),
        "fault: tp2 shard 1 dropped, layer 0 o_proj only": (2, [0, 1], shard(layer=0, kind="o_proj"), bf16, None),
        f"fault: tp2 shard 1 dropped, layer {last} down_proj only": (
            2, [0, 1], shard(layer=last, kind="down_proj"), bf16, None),
        "fault: zeros returned, layer 1 o_proj only": (2, [0, 1], None, bf16, output(layer=1, kind="o_proj")),
        f"fault: zeros returned, layer {last} down_proj only": (
            2, [0, 1], None, bf16, output(layer=last, kind="down_proj")),
        "fault: half the sum returned, every layer": (2, [0, 1], None, bf16, output(scale=0.5)),
        "fault: previous result returned, layer 2 down_proj only": (
            2, [0, 1], None, bf16, output(layer=2, kind="down_proj", stale=True)),
    }


def main():
    args = parse()
    model = LlamaForCausalLM.from_pretrained(f"{args.root}/target", dtype=torch.bfloat16).eval()
    prompts = torch.randint(10, model.config.vocab_size, (args.prompts, args.prompt_len),
                            generator=torch.Generator().manual_seed(0))
    shards = Shards(model)
    reference, ref_logprobs, scores = shards.generate(prompts, args.new_tokens, None)
    top = scores.topk(2, -1).values
    result = {"requests": args.prompts, "new_tokens": args.new_tokens, "variants": {},
              "margins": {"min": float((top[..., 0] - top[..., 1]).min()), "chosen_min": float(top[..., 0].min()),
                          "chosen_max": float(top[..., 0].max())},
              "residue": shards.residue, "chain": shards.chain, "reference_tokens": reference.tolist()}
    for name, variant in variants(len(model.model.layers)).items():
        tokens, logprobs, _ = shards.generate(prompts, args.new_tokens, variant)
        same = tokens == reference
        first = (~same).nonzero()
        result["variants"][name] = {"differ": int((~same).any(-1).sum()),
                                    "max_logprob_diff": float((logprobs - ref_logprobs).abs()[same].max())
                                    if same.any() else None,
                                    "first": first[0].tolist() if len(first) else None}
    result["partials"] = {kind: {"rms_min": float(torch.cat(v).min()) / EMBED,
                                 "rms_median": float(torch.cat(v).median()) / EMBED}
                          for kind, v in shards.partials.items()}
    if args.sweep:
        bf16 = torch.bfloat16
        result["sweep"] = {"shard 1 scaled": {}, "result scaled": {}, "noise added to the result": {}}
        for factor in (1 + 2 ** -8, 1 + 2 ** -6, 1 + 2 ** -4, 1 + 2 ** -2, 1 - 2 ** -4, 1 - 2 ** -2, 0.5):
            for name, variant in (("shard 1 scaled", (2, [0, 1], shard(scale=factor), bf16, None)),
                                  ("result scaled", (2, [0, 1], None, bf16, output(scale=factor)))):
                tokens, _, _ = shards.generate(prompts, args.new_tokens, variant)
                result["sweep"][name][str(factor)] = int((tokens != reference).any(-1).sum())
        for exponent in (-12, -10, -8, -6, -4):  # rms of the noise: 2^-12 is half a bf16 step of an embedding entry
            variant = (2, [0, 1], None, bf16, output(noise=2.0 ** exponent, chain_start=shards.chain_start))
            tokens, _, _ = shards.generate(prompts, args.new_tokens, variant)
            result["sweep"]["noise added to the result"][f"2^{exponent}"] = int((tokens != reference).any(-1).sum())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
