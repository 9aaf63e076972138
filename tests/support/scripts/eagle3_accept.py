"""Accept lengths of EAGLE-3 drafters against one target, greedy, on the CPU.

usage: python eagle3_accept.py TARGET_DIR DRAFT_DIR [DRAFT_DIR...] [--prompts N] [--new-tokens N] [--steps N] [--bf16]

The target decodes greedily with transformers' Llama (fp32, or bf16 with --bf16; an implementation independent of
SGLang and of make-test-models); each drafter's chain (topk 1) is replayed in the order SGLang's llama_eagle3.py
applies its tensors: fc on the captured target states (HF hidden_states[id + 1], what SGLang captures for layer id,
ids from the drafter's own config), then the midlayer (hidden_norm / input_layernorm, attention over the drafted
chain, o_proj, post_attention_layernorm, MLP), norm, lm_head over the draft vocabulary, d2t back to target ids;
later steps take the pre-norm state. Prints one JSON line: per drafter, the accept length of every verify (accepted
drafts + 1) per prompt, their mean over all verifies, and per draft step how often it was reached and accepted.
"""
import argparse
import json

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("target")
parser.add_argument("drafts", nargs="+")
parser.add_argument("--prompts", type=int, default=8)
parser.add_argument("--new-tokens", type=int, default=32)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--bf16", action="store_true", help="target and drafter in bf16 (default fp32)")
parser.add_argument("--first-drafts", action="store_true",
                    help="also list every verify's [verified token, first draft, first draft accepted (0/1)]")
args = parser.parse_args()
dtype = torch.bfloat16 if args.bf16 else torch.float32

target = LlamaForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
vocab = target.config.vocab_size
gen = torch.Generator().manual_seed(args.seed)
sequences, states = [], []
with torch.no_grad():
    for _ in range(args.prompts):
        prompt = torch.randint(10, vocab, (1, 6), generator=gen)
        seq = target.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                              do_sample=False, pad_token_id=0)[0].tolist()
        sequences.append(seq)
        states.append(target(torch.tensor([seq]), output_hidden_states=True).hidden_states)


def replay(folder):
    cfg = json.load(open(f"{folder}/config.json"))
    w = {k: v.to(dtype) if v.is_floating_point() else v
         for k, v in load_file(f"{folder}/model.safetensors").items()}
    hot = (w["d2t"] + torch.arange(len(w["d2t"]))).long()
    layer_ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    heads, kv_heads, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg.get("rms_norm_eps", 1e-5)
    norm = lambda x, name: F.rms_norm(x, x.shape[-1:], w[name], eps)  # noqa: E731
    lin = lambda x, name: x @ w[name].T  # noqa: E731

    def draft_step(token, state, keys, values):
        embeds = target.model.embed_tokens.weight[token]
        if state.shape[-1] != embeds.shape[-1]:
            state = lin(state, "fc.weight")
        x = torch.cat([norm(embeds, "midlayer.input_layernorm.weight"), norm(state, "midlayer.hidden_norm.weight")])
        q = lin(x, "midlayer.self_attn.q_proj.weight").view(heads, hd)
        keys.append(lin(x, "midlayer.self_attn.k_proj.weight").view(kv_heads, hd))
        values.append(lin(x, "midlayer.self_attn.v_proj.weight").view(kv_heads, hd))
        k, v = (torch.stack(t).repeat_interleave(heads // kv_heads, 1) for t in (keys, values))
        attn = torch.einsum("hs,hsd->hd", torch.softmax(torch.einsum("hd,shd->hs", q, k) / hd ** 0.5, -1),
                            v.transpose(0, 1)).reshape(-1)
        residual = lin(attn, "midlayer.self_attn.o_proj.weight") + state
        y = norm(residual, "midlayer.post_attention_layernorm.weight")
        y = lin(F.silu(lin(y, "midlayer.mlp.gate_proj.weight")) * lin(y, "midlayer.mlp.up_proj.weight"),
                "midlayer.mlp.down_proj.weight")
        pre_norm = y + residual
        return int(hot[int(torch.argmax(lin(norm(pre_norm, "norm.weight"), "lm_head.weight")))]), pre_norm

    per_prompt, reached, accepted_at, first_drafts = [], [0] * args.steps, [0] * args.steps, []
    with torch.no_grad():
        for seq, hidden in zip(sequences, states):
            aux = torch.cat([hidden[i + 1][0] for i in layer_ids], -1)
            lengths, pos = [], 5  # seq[pos] is the last verified token (the last prompt token), seq[pos + 1] the bonus
            while pos + 1 + args.steps < len(seq):
                token, state, keys, values, accepted = seq[pos + 1], aux[pos], [], [], 0
                for i in range(args.steps):
                    token, state = draft_step(token, state, keys, values)
                    reached[i] += 1
                    if i == 0:
                        first_drafts.append([seq[pos + 1], token, int(token == seq[pos + 2])])
                    if token != seq[pos + 2 + i]:
                        break
                    accepted_at[i] += 1
                    accepted += 1
                lengths.append(accepted + 1)
                pos += accepted + 1
            per_prompt.append(lengths)
    flat = [x for lengths in per_prompt for x in lengths]
    return {"layer_ids": layer_ids, "accept_length": sum(flat) / len(flat), "verifies": len(flat),
            "per_prompt": per_prompt, "step_reached": reached, "step_accepted": accepted_at,
            **({"first_drafts": first_drafts} if args.first_drafts else {})}


print(json.dumps({"dtype": str(dtype), "prompts": args.prompts, "new_tokens": args.new_tokens, "steps": args.steps,
                  "tokens": [s[6:] for s in sequences], "drafts": {d: replay(d) for d in args.drafts}}))
