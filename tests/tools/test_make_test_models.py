"""sglang-pcie make-test-models: the layout SGLang's loaders read, bad shapes, loading through SGLang 0.5.23's
real classes, the accept lengths and tokens the --acceptance models give, what --all-reduce-check models do under
simulated tensor-parallel faults, and the benchmark helpers that use them on GPUs."""
from __future__ import annotations

import ast
import re
import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from sglang_pcie.tools import make_test_models as test_models
from sglang_pcie.tools.cli import main as cli_main
from sglang_pcie.tools.safetensors_io import read_header, read_tensor
from support import REPO, run_benchmark



# ---------------------------------------------------------------------------------------- make-test-models

def test_make_test_models_layout(tmp_path, capsys):
    assert cli_main(["make-test-models", str(tmp_path / "m"), "--seed", "3"]) == 0
    assert "--skip-tokenizer-init" in capsys.readouterr().out
    target = json.loads((tmp_path / "m/target/config.json").read_text())
    draft = json.loads((tmp_path / "m/draft/config.json").read_text())
    assert target["architectures"] == ["LlamaForCausalLM"] and draft["architectures"] == ["LlamaForCausalLMEagle3"]
    assert draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    header = read_header(tmp_path / "m/draft/model.safetensors")
    h = target["hidden_size"]
    assert header["fc.weight"]["shape"] == [h, 3 * h]
    assert header["midlayer.self_attn.q_proj.weight"]["shape"] == [h, 2 * h]
    assert header["lm_head.weight"]["shape"] == [draft["draft_vocab_size"], h]
    assert (header["d2t"]["dtype"], header["t2d"]["dtype"]) == ("I64", "BOOL")
    _, _, d2t = read_tensor(tmp_path / "m/draft/model.safetensors", "d2t")
    _, _, t2d = read_tensor(tmp_path / "m/draft/model.safetensors", "t2d")
    hot = [d + i for i, d in enumerate(d2t)]
    assert hot == sorted(set(hot)) and [i for i, flag in enumerate(t2d) if flag] == hot
    # seeded: the same bytes again, different bytes for another seed
    cli_main(["make-test-models", str(tmp_path / "again"), "--seed", "3"])
    cli_main(["make-test-models", str(tmp_path / "other"), "--seed", "4"])
    same = (tmp_path / "m/target/model.safetensors").read_bytes()
    assert (tmp_path / "again/target/model.safetensors").read_bytes() == same
    assert (tmp_path / "other/target/model.safetensors").read_bytes() != same


@pytest.mark.parametrize("argv, named", [(["--layers", "3"], "--layers 3"), (["--heads", "3"], "--heads 3"),
                                         (["--draft-vocab", "99999"], "--draft-vocab 99999"),
                                         (["--hidden", "0"], "--hidden 0")])
def test_make_test_models_bad_shape(tmp_path, capsys, argv, named):
    assert cli_main(["make-test-models", str(tmp_path / "m"), *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, named", [([], "--acceptance random"), (["--kv-heads", "1"], "--kv-heads 1"),
                                         (["--intermediate", "1026"], "--intermediate 1026")])
def test_all_reduce_check_bad_usage(tmp_path, capsys, argv, named):
    acceptance = [] if not argv else ["--acceptance", "mixed"]
    assert cli_main(["make-test-models", str(tmp_path / "m"), "--all-reduce-check", *acceptance, *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m").exists()


def _raw(path: Path, name: str) -> tuple[list, bytes]:
    return read_header(path)[name]["shape"], test_models.tensor_bytes(path, name)


def _bf16(raw: bytes, index: int) -> float:
    return struct.unpack("<f", b"\0\0" + raw[2 * index:2 * index + 2])[0]


def test_all_reduce_check_layout(tmp_path):
    """The construction, read back from the files: paired heads / KV heads / MLP blocks whose o_proj / down_proj
    rows subtract each pair (but for dimension 0's); the chain's rows (two equal weights on pair 0) in the last 2 x layers coordinates;
    +-2^-3 embeddings (dimension 0 positive, chain coordinates zero), out-of-draft tokens aliased to draft ones; a
    decoy row per draft token."""
    assert cli_main(["make-test-models", str(tmp_path), "--acceptance", "mixed", "--all-reduce-check"]) == 0
    shape = test_models.PRESETS["tiny"]
    h, d, heads, inter, layers = shape.hidden, shape.head_dim, shape.heads, shape.intermediate, shape.layers
    chain = list(range(h - 2 * layers, h))
    target, draft = tmp_path / "target/model.safetensors", tmp_path / "draft/model.safetensors"
    for file, prefix, in_dim, rows in ((target, "model.layers.2", h, (1, 2, chain[0] - 1)),
                                       (draft, "midlayer", 2 * h, (1, 2, h - 1))):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            dims, raw = _raw(file, f"{prefix}.{name}.weight")
            assert dims[1] == (in_dim if "attn" in name else h), name  # the drafter's q/k/v read 2 x hidden
            assert raw[:len(raw) // 2] == raw[len(raw) // 2:], name  # second half repeats
        for name, unit in (("self_attn.o_proj", d), ("mlp.down_proj", inter // heads)):
            dims, raw = _raw(file, f"{prefix}.{name}.weight")
            width = 2 * dims[1]
            assert raw[:width] == bytes(width)  # dimension 0, the chain's constant, gets no pair
            for c in rows:
                units = [raw[c * width + 2 * unit * u:c * width + 2 * unit * (u + 1)] for u in range(heads)]
                k = c % (heads // 2)
                flipped = bytearray(units[k])
                flipped[1::2] = bytes(b ^ 0x80 for b in flipped[1::2])
                assert units[k + heads // 2] == bytes(flipped) and any(units[k]), (name, c)
                assert all(u == bytes(len(u)) for i, u in enumerate(units) if i not in (k, k + heads // 2))
    # layer 2's links: attention writes chain[4] from chain[3] through value dimension 0 of KV head 0 and heads 0 and
    # heads / 2; the MLP writes chain[5] from chain[4] through neuron 0 of blocks 0 and heads / 2
    (_, v), (_, o), (_, gate), (_, up), (_, down) = (_raw(target, f"model.layers.2.{n}.weight") for n in (
        "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))
    assert [i for i in range(h) if _bf16(v, i)] == [chain[3]] and _bf16(v, chain[3]) == 1.0
    assert [i for i in range(h) if _bf16(gate, i)] == [0] and [i for i in range(h) if _bf16(up, i)] == [chain[4]]
    for weight, cols, row, nonzero in ((o, heads * d, chain[4], [0, heads // 2 * d]), (down, inter, chain[5],
                                                                                       [0, inter // 2])):
        for c in chain:
            values = [_bf16(weight, c * cols + i) for i in range(cols)]
            assert [i for i, x in enumerate(values) if x] == (nonzero if c == row else [])
            assert c != row or values[nonzero[0]] == values[nonzero[1]] > 0
    _, embed = _raw(target, "model.embed_tokens.weight")
    rows = [embed[t * 2 * h:(t + 1) * 2 * h] for t in range(shape.vocab)]
    e_bytes = 2 * chain[0]
    assert {b for row in rows for b in row[1:e_bytes:2]} == {0x3E, 0xBE} and {row[1] for row in rows} == {0x3E}
    assert {row[e_bytes:] for row in rows} == {bytes(2 * len(chain))} and not any(any(row[0:e_bytes:2]) for row in rows)
    _, _, d2t = read_tensor(draft, "d2t")
    hot = [x + i for i, x in enumerate(d2t)]
    assert len({rows[t] for t in hot}) == len(hot) and set(rows) == {rows[t] for t in hot}
    # lm_head: a draft token's row is a draft token's embedding plus +beta in the last chain coordinate; as many
    # rows outside the draft vocabulary (the decoys) have twice one, and -beta there
    _, head = _raw(target, "lm_head.weight")
    by_embedding = {rows[t][:e_bytes]: t for t in hot}
    betas = {_bf16(head, j * h + h - 1) for j in hot}
    assert len(betas) == 1 and betas.pop() > 0
    assert all(head[j * 2 * h:j * 2 * h + e_bytes] in by_embedding for j in hot)
    hot_set = set(hot)
    decoys = [j for j in range(shape.vocab) if j not in hot_set and any(head[j * 2 * h:(j + 1) * 2 * h])]
    assert len(decoys) == len(hot) and all(_bf16(head, j * h + h - 1) < 0 for j in decoys)
    halved = {bytes(x if i % 2 else 0 for i, x in enumerate(head[j * 2 * h:j * 2 * h + e_bytes])) for j in decoys}
    assert halved == set(by_embedding)  # twice +-2^-3 differs from it only in the low bytes (0x80)


def _function_source(path: Path, cls: str, name: str) -> str:
    tree = ast.parse(path.read_text())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return ast.unparse(next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name))


def test_loaders_are_the_same_in_0_5_16_and_0_5_23(pristine_source):
    # The GPU run uses 0.5.16; the loader test below runs the real 0.5.23. Same loaders, same verdict.
    # (0.5.23 renamed the target's loader _legacy_load_weights, still its default: SGLANG_ENABLE_WEIGHT_LOADER_V2
    # is off unless set.)
    for cls, old, new, rel in (
            ("LlamaForCausalLMEagle3", "load_weights", "load_weights", "sglang/srt/models/llama_eagle3.py"),
            ("LlamaForCausalLM", "load_weights", "_legacy_load_weights", "sglang/srt/models/llama.py"),
            ("LlamaForCausalLM", "set_eagle3_layers_to_capture", "set_eagle3_layers_to_capture",
             "sglang/srt/models/llama.py")):
        before = _function_source(pristine_source("0.5.16") / rel, cls, old)
        assert before.replace(f"def {old}(", f"def {new}(") == _function_source(pristine_source("0.5.23") / rel,
                                                                              cls, new), (rel, old)


# Builds both models on the CPU with SGLang's own classes and feeds them the files through their own
# load_weights, one tensor at a time, recording which parameters each tensor filled (all start as NaN).
LOADER_PROBE = r"""
import json, socket, sys
import torch
from safetensors.torch import load_file
from transformers import AutoConfig
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.srt.distributed import parallel_state
from sglang.srt.runtime_context import get_parallel
from sglang.srt.configs.model_config import ModelConfig

root = sys.argv[1]
set_global_server_args_for_scheduler(ServerArgs(
    model_path=f"{root}/target", speculative_algorithm="EAGLE3", speculative_draft_model_path=f"{root}/draft",
    device="cpu", skip_tokenizer_init=True))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                            distributed_init_method=f"tcp://127.0.0.1:{port}")
parallel_state.initialize_model_parallel(backend="gloo")
get_parallel().override_permanently(tp_rank=0, pp_rank=0)
from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

def load(cls, folder):
    model = cls(AutoConfig.from_pretrained(folder))
    params = dict(model.named_parameters())
    for p in params.values():
        p.data.fill_(float("nan"))
    filled = {}
    for name, tensor in load_file(f"{folder}/model.safetensors").items():
        before = {n: int(torch.isnan(p).sum()) for n, p in params.items()}
        hot = getattr(model, "hot_token_id", None)
        model.load_weights([(name, tensor)])
        filled[name] = [n for n, p in params.items() if int(torch.isnan(p).sum()) < before[n]]
        if getattr(model, "hot_token_id", None) is not hot:
            filled[name].append("hot_token_id")
    return model, {"filled": filled, "unfilled": sorted(n for n, p in params.items() if torch.isnan(p).any())}

target, t = load(LlamaForCausalLM, f"{root}/target")
draft, d = load(LlamaForCausalLMEagle3, f"{root}/draft")
layer_ids = draft.config.eagle_config["eagle_aux_hidden_state_layer_ids"]
target.set_eagle3_layers_to_capture(layer_ids)
d["captured"] = list(target.model.layers_to_capture)
target.set_eagle3_layers_to_capture([i + 1 for i in layer_ids])
d["shifted_captured"] = list(target.model.layers_to_capture)
d["target_layers"] = len(target.model.layers)
target.set_eagle3_layers_to_capture(None)
d["default_captured"] = list(target.model.layers_to_capture)
d["fc_in"] = draft.model.fc.in_features
d["hot_token_id"] = draft.hot_token_id.tolist()
d["model_config_archs"] = [ModelConfig(f"{root}/{n}", is_draft_model=(n == "draft")).hf_config.architectures[0]
                           for n in ("target", "draft")]
print(json.dumps({"target": t, "draft": d}))
"""


@pytest.mark.parametrize("acceptance, check", [("random", False), ("mixed", True), ("tokenwise", False)])
def test_models_load_through_sglang_0_5_23(sglang_env, tmp_path, acceptance, check):
    env = sglang_env("0.5.23")
    models = tmp_path / "models"
    shape = test_models.PRESETS["tiny"]
    if acceptance == "tokenwise":
        shape = replace(shape, layers=6)
    written = test_models.make_models(models, shape, seed=0, acceptance=acceptance, all_reduce_check=check)
    assert set(written) == {"target", "draft"}
    result = env.run_json(LOADER_PROBE.replace("sys.argv[1]", repr(str(models))),
                          env={"SGLANG_USE_CPU_ENGINE": "1"})
    target, draft = result["target"], result["draft"]
    assert target["unfilled"] == []
    assert all(target["filled"].values()), [n for n, f in target["filled"].items() if not f]
    # Every drafter tensor lands in a parameter; t2d is read by no loader (SGLang derives the map from d2t).
    # The drafter's token embedding is the target's (SGLang's EAGLE worker calls set_embed), so not in the file.
    assert {n: f for n, f in draft["filled"].items() if not f} == {"t2d": []}
    assert draft["filled"]["midlayer.self_attn.k_proj.weight"] == ["model.layers.0.self_attn.qkv_proj.weight"]
    assert draft["filled"]["fc.weight"] == ["model.fc.weight"]
    assert draft["filled"]["d2t"] == ["hot_token_id"]
    assert draft["unfilled"] == ["model.embed_tokens.weight"]
    # three distinct captured target layers feed fc (3 x hidden); SGLang's default would repeat one on 4 layers
    hidden = test_models.PRESETS["tiny"].hidden
    assert len(set(draft["captured"])) == 3 and draft["fc_in"] == 3 * hidden
    assert len(set(draft["default_captured"])) < 3
    if acceptance == "tokenwise":  # ids + 1 still name layers SGLang's forward loop captures (inputs of layers < L)
        assert draft["target_layers"] == 6 and draft["captured"] == [1, 3, 4]
        assert draft["shifted_captured"] == [2, 4, 5]
    _, _, d2t = read_tensor(models / "draft" / "model.safetensors", "d2t")
    assert draft["hot_token_id"] == [d + i for i, d in enumerate(d2t)]
    assert draft["model_config_archs"] == ["LlamaForCausalLM", "LlamaForCausalLMEagle3"]


# Greedy decoding by transformers' own Llama (an implementation independent of SGLang and of make-test-models), and
# SGLang's EAGLE-3 chain (topk 1) replayed with the drafter's tensors in the order llama_eagle3.py applies them:
# fc on the captured target states (HF hidden_states[id + 1], what SGLang captures for layer id), then the midlayer
# (hidden_norm / input_layernorm, attention over the drafted chain, o_proj, post_attention_layernorm, MLP), norm,
# lm_head over the draft vocabulary, d2t back to target ids; later steps take the pre-norm state. Prints, per prompt,
# the accept length of every verify: accepted drafts + 1.
ACCEPTANCE_PROBE = r"""
import json, sys
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

root, steps = sys.argv[1], 3
target = LlamaForCausalLM.from_pretrained(f"{root}/target", dtype=torch.float32).eval()
cfg = json.load(open(f"{root}/draft/config.json"))
w = {k: v.float() for k, v in load_file(f"{root}/draft/model.safetensors").items()}
hot = (w["d2t"] + torch.arange(len(w["d2t"]))).long()
layer_ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
heads, kv_heads, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
norm = lambda x, name: F.rms_norm(x, x.shape[-1:], w[name], 1e-5)
lin = lambda x, name: x @ w[name].T

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

result = []
gen = torch.Generator().manual_seed(0)
for _ in range(12):
    prompt = torch.randint(10, cfg["vocab_size"], (1, 6), generator=gen)
    with torch.no_grad():
        seq = target.generate(prompt, max_new_tokens=24, do_sample=False, min_new_tokens=24,
                              pad_token_id=0)[0].tolist()
        states = target(torch.tensor([seq]), output_hidden_states=True).hidden_states
    aux = torch.cat([states[i + 1][0] for i in layer_ids], -1)
    lengths, pos = [], len(prompt[0]) - 1  # seq[pos] is the last verified token, seq[pos + 1] the bonus
    pos0 = pos
    while pos + 1 + steps < len(seq):
        token, state, keys, values, accepted = seq[pos + 1], aux[pos], [], [], 0
        for i in range(steps):
            token, state = draft_step(token, state, keys, values)
            if token != seq[pos + 2 + i]:
                break
            accepted += 1
        lengths.append(accepted + 1)
        pos += accepted + 1
    result.append({"tokens": seq[len(prompt[0]):], "accept_lengths": lengths, "last_prompt_token": seq[pos0]})
print(json.dumps(result))
"""


@pytest.mark.parametrize("acceptance, check", [("random", False), ("mixed", False), ("full", False),
                                               ("mixed", True), ("full", True)])
def test_acceptance_of_the_test_models(sglang_env, tmp_path, acceptance, check):
    env = sglang_env("0.5.23")
    test_models.make_models(tmp_path, test_models.PRESETS["tiny"], seed=1, acceptance=acceptance,
                            all_reduce_check=check)
    requests = env.run_json(ACCEPTANCE_PROBE.replace("sys.argv[1]", repr(str(tmp_path))))
    per_request = [sorted(set(r["accept_lengths"])) for r in requests]
    if acceptance == "random":
        assert all(lengths == [1] for lengths in per_request), per_request
        return
    _, _, d2t = read_tensor(tmp_path / "draft" / "model.safetensors", "d2t")
    draft_vocab = {d + i for i, d in enumerate(d2t)}
    chain = test_models.predicted_chain(tmp_path)
    for r in requests:  # from the first output token on, a request repeats one token or alternates two
        assert set(r["tokens"]) <= draft_vocab and len(set(r["tokens"])) in (1, 2)
        assert r["tokens"][2:] == r["tokens"][:-2]
        # which tokens follows from the files: always with --all-reduce-check; without, where the last prompt token
        # is in the draft vocabulary (outside it, the first output token is a near-tie of random rows)
        expected = chain(r["last_prompt_token"], len(r["tokens"]))
        assert expected is not None or not check
        assert expected is None or r["tokens"] == expected
    # every draft accepted (3 steps + the bonus) where the token repeats, one where it alternates
    if acceptance == "full":
        assert per_request == [[4]] * len(requests)
    else:
        assert sorted(set(map(tuple, per_request))) == [(2,), (4,)], per_request


@pytest.mark.parametrize("check", [True, False])
def test_all_reduce_faults_change_the_tokens(sglang_env, tmp_path, check):
    """o_proj / down_proj run as tensor-parallel shards in transformers' Llama (bf16): summed in any order, in bf16 or
    fp32, at TP 2 or 4, the greedy tokens and their logprobs are the unsharded model's, bit for bit. A shard's
    partial dropped, doubled or scaled by 1.25 (everywhere or in one sublayer), an all-reduce that returns zeros or
    the previous all-reduce's result (in one sublayer) or half the sum: every request's tokens change from the
    first one on. The --acceptance mixed model without the check is blind to all of them."""
    env = sglang_env("0.5.23")
    test_models.make_models(tmp_path, test_models.PRESETS["tiny"], seed=2, acceptance="mixed",
                            all_reduce_check=check)
    result = env.run_script_json("allreduce_faults.py", tmp_path, "--new-tokens", "6")
    variants, requests = result["variants"], result["requests"]
    faults = [name for name in variants if name.startswith("fault:")]
    assert len(variants) == 16 and len(faults) == 11
    if not check:
        assert {name: v["differ"] for name, v in variants.items()} == dict.fromkeys(variants, 0)
        return
    for name in set(variants) - set(faults):
        assert variants[name] == {"differ": 0, "max_logprob_diff": 0.0, "first": None}, name
    for name in faults:
        assert variants[name]["differ"] == requests and variants[name]["first"] == [0, 0], name
    # the pairs leave less than half a bf16 step of an embedding entry (2^-12): the residual stream outside the
    # chain is exactly the token's embedding; each shard's partial is ~64 entries strong; every link writes ~2^-2
    assert all(r < 2 ** -12 for r in result["residue"].values()), result["residue"]
    assert all(p["rms_min"] > 32 for p in result["partials"].values()), result["partials"]
    assert all(0.24 < low <= high < 0.26 for low, high in result["chain"].values()), result["chain"]
    margins = result["margins"]
    assert margins["min"] > 0.25 * margins["chosen_min"], margins


def test_tokenwise_layout_and_bad_shapes(tmp_path, capsys):
    """The tokenwise pair's config and the tensors its construction sets (sparse MLPs on the constant coordinate,
    a zero o_proj); too few layers, too small a hidden size or MLP: one usage line, nothing written."""
    assert cli_main(["make-test-models", str(tmp_path / "m"), "--acceptance", "tokenwise", "--layers", "6"]) == 0
    draft = json.loads((tmp_path / "m/draft/config.json").read_text())
    assert draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    shape = replace(test_models.PRESETS["tiny"], layers=6)
    h, d = shape.hidden, (shape.hidden - 1) // 3
    target = tmp_path / "m/target/model.safetensors"
    _, gate = _raw(target, "model.layers.1.mlp.gate_proj.weight")
    assert {i % h for i in range(len(gate) // 2) if _bf16(gate, i)} == {0} and _bf16(gate, 0) == 16.0
    _, o_proj = _raw(target, "model.layers.1.self_attn.o_proj.weight")
    assert o_proj == bytes(len(o_proj))
    _, down = _raw(target, "model.layers.1.mlp.down_proj.weight")  # writes only the keyed block
    assert {i // shape.intermediate for i in range(len(down) // 2) if _bf16(down, i)} <= set(range(d, 2 * d))
    for argv, named in ((["--layers", "4"], "--layers 5"), (["--layers", "6", "--hidden", "64", "--heads", "4"],
                                                             "--hidden 73"),
                        (["--layers", "6", "--intermediate", "128"], "--intermediate")):
        assert cli_main(["make-test-models", str(tmp_path / "bad"), "--acceptance", "tokenwise", *argv]) == 2
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "bad").exists()
    assert cli_main(["make-test-models", str(tmp_path / "bad"), "--acceptance", "tokenwise", "--layers", "6",
                     "--all-reduce-check"]) == 2
    assert "--all-reduce-check needs --acceptance mixed or full" in capsys.readouterr().err


def test_tokenwise_drafter_partly_wrong_lowers_the_accept_length(sglang_env, tmp_path):
    """--acceptance tokenwise: the healthy drafter is accepted token by token (accept lengths 1 to 4 within a
    request, later steps accepted less often), and each partly wrong copy (benchmarks/break_drafter.py) lowers the
    accept length on the same greedy tokens: layer ids + 1 to 1.0, d2t permuted at 10% / 40% of its draft ids
    below the healthy one, 40% below 10%."""
    shape = replace(test_models.PRESETS["tiny"], layers=6)
    test_models.make_models(tmp_path, shape, seed=0, acceptance="tokenwise")
    breaks = ["layer-ids-plus1", "d2t-permuted-10pct", "d2t-permuted-40pct"]
    assert run_benchmark("break_drafter", tmp_path / "draft", "--only", *breaks).returncode == 0
    names = ["draft"] + [f"draft-{b}" for b in breaks]
    result = sglang_env("0.5.23").run_script_json("eagle3_accept.py", tmp_path / "target",
                                                  *(tmp_path / n for n in names), "--prompts", "4",
                                                  "--new-tokens", "40")
    accept = {Path(k).name: v for k, v in result["drafts"].items()}
    healthy = accept["draft"]
    assert 2.2 < healthy["accept_length"] < 3.2, healthy
    assert all(len(set(lengths)) >= 3 for lengths in healthy["per_prompt"]), healthy["per_prompt"]  # token by token
    reached, accepted = healthy["step_reached"], healthy["step_accepted"]
    rates = [a / r for a, r in zip(accepted, reached)]
    assert 0.35 < rates[2] < rates[0] < 0.95, rates  # 4 prompts: step 3 reached about 35 times
    lengths = {name: accept[name]["accept_length"] for name in names}
    assert lengths["draft-layer-ids-plus1"] == 1.0, lengths
    assert lengths["draft-d2t-permuted-10pct"] < lengths["draft"] - 0.1, lengths
    assert lengths["draft-d2t-permuted-40pct"] < lengths["draft-d2t-permuted-10pct"] - 0.3, lengths
    assert accept["draft-layer-ids-plus1"]["layer_ids"] == [1, 3, 4]
    # the greedy tokens: each in the draft vocabulary after the first, each followed by its one successor
    _, _, d2t = read_tensor(tmp_path / "draft" / "model.safetensors", "d2t")
    hot = {x + i for i, x in enumerate(d2t)}
    successor = {}
    for tokens in result["tokens"]:
        assert set(tokens) <= hot
        for a, b in zip(tokens, tokens[1:]):
            assert successor.setdefault(a, b) == b


def test_break_drafter_layer_ids_and_partial_d2t(tmp_path):
    """benchmarks/break_drafter.py's new copies: config.json's layer ids + 1 with the tensors untouched; d2t
    permuted at 10% / 40% of the draft ids, as one cycle within the same hot set, the other ids unchanged."""
    from sglang_pcie.tools.make_test_models import make_models

    make_models(tmp_path / "m", replace(test_models.PRESETS["tiny"], layers=6, draft_vocab=1000), seed=4,
                acceptance="tokenwise")
    proc = run_benchmark("break_drafter", tmp_path / "m" / "draft", "--only", "layer-ids-plus1", "d2t-permuted-10pct",
                         "d2t-permuted-40pct", "--seed", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "[0, 2, 3] -> [1, 3, 4]" in out and "100 of 1000 draft ids" in out and "400 of 1000" in out
    base = tmp_path / "m" / "draft"
    shifted = tmp_path / "m" / "draft-layer-ids-plus1"
    config = json.loads((shifted / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert (shifted / "model.safetensors").read_bytes() == (base / "model.safetensors").read_bytes()
    _, _, d2t = read_tensor(base / "model.safetensors", "d2t")
    hot = [x + i for i, x in enumerate(d2t)]
    for share in (10, 40):
        _, _, permuted = read_tensor(tmp_path / "m" / f"draft-d2t-permuted-{share}pct" / "model.safetensors", "d2t")
        mapped = [x + i for i, x in enumerate(permuted)]
        moved = [i for i in range(1000) if mapped[i] != hot[i]]
        assert len(moved) == 10 * share and sorted(mapped) == hot  # a permutation within the hot set
        # one cycle: following draft id -> the id whose target it took visits every moved id
        index = {t: i for i, t in enumerate(hot)}
        seen, i = set(), moved[0]
        while i not in seen:
            seen.add(i)
            i = index[mapped[i]]
        assert seen == set(moved)
    assert (tmp_path / "m" / "draft-d2t-permuted-10pct" / "config.json").read_bytes() == \
        (base / "config.json").read_bytes()


def test_bench_outputs_checked_against_the_files(tmp_path):
    """benchmarks/check_test_model_outputs.py on a bench run folder: each request's tokens against the chain the
    files predict from its last prompt token, each run's accept length against the one the chain implies."""
    from sglang_pcie.tools.bench.plan import Workload

    models = tmp_path / "models"
    test_models.make_models(models, test_models.PRESETS["tiny"], seed=3, acceptance="mixed", all_reduce_check=True)
    workload = Workload(batch_requests=6, stream_requests=2, input_len=5, output_len=9)
    prompts = workload.prompts()
    chain = test_models.predicted_chain(models)
    expected = {phase: [chain(p[-1], 9) for p in prompts[phase]] for phase in ("batch", "stream")}
    steps, tokens, verifies = 3, 0, 0
    for outputs in expected["batch"] + expected["stream"]:
        tokens += 9
        verifies += 2 if len(set(outputs)) == 1 else 4  # ceil(8 / 4), ceil(8 / 2)
    wrong = {phase: [list(o) for o in outs] for phase, outs in expected.items()}
    wrong["stream"][1][4] += 1
    runs = []
    for index, (name, outputs, accept) in enumerate((("baseline", expected, tokens / verifies),
                                                     ("fault", wrong, tokens / verifies * 0.9)), start=1):
        folder = tmp_path / "run" / "runs" / f"{index:02d}-{name}"
        folder.mkdir(parents=True)
        (folder / "outputs.json").write_text(json.dumps(outputs))
        runs.append({"ok": True, "variant": name, "outputs_file": f"/elsewhere/runs/{folder.name}/outputs.json",
                     "metrics": {"accept_length": accept}})
    (tmp_path / "run" / "results.json").write_text(json.dumps({
        "workload": workload.as_dict(), "runs": runs,
        "launch_args": ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(steps)]}))
    check = run_benchmark("check_test_model_outputs", tmp_path / "run", models)
    assert check.returncode == 1, check.stderr
    ok, bad = check.stdout.strip().splitlines()
    assert ok.startswith("ok    01-baseline: 8/8 requests as predicted") and "MORE THAN" not in ok
    assert bad.startswith("WRONG 02-fault: 7/8 requests as predicted")
    assert "first wrong: stream request 1, token 4" in bad and "(MORE THAN 1% OFF)" in bad
    assert run_benchmark("check_test_model_outputs", tmp_path / "nothing", models).returncode == 2


def test_the_gpu_fault_hook_patches_sglangs_row_parallel_linear(sglang_env, tmp_path):
    """benchmarks/allreduce_fault: with AR_FAULT set, importing SGLang 0.5.23's linear module patches
    RowParallelLinear.forward (and says so on stderr); without it, nothing is patched."""
    env = sglang_env("0.5.23")
    code = (f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks' / 'allreduce_fault')!r}); "
            "import allreduce_fault, json; from sglang.srt.layers import linear; "
            "print(json.dumps(linear.RowParallelLinear.forward.__name__))")
    assert env.run_json(code, env={"AR_FAULT": "0", "SGLANG_USE_CPU_ENGINE": "1"}) == "faulty_forward"
    assert env.run_json(code, env={"SGLANG_USE_CPU_ENGINE": "1"}) == "forward"
    proc = env.run(code, env={"AR_FAULT": "2", "AR_FAULT_RANK": "0", "SGLANG_USE_CPU_ENGINE": "1"})
    assert "allreduce_fault: TP rank 0 multiplies its RowParallelLinear partials by 2.0" in proc.stderr


def test_every_pages_usage_line_offers_every_construction():
    """The usage lines README and docs/bench.md print (`... [--acceptance a|b|...]`) name every construction the
    command takes (bench.md's lacked `interleaved`)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    lines = [(page.name, line) for page in pages for line in page.read_text().splitlines()
             if line.startswith("sglang-pcie make-test-models") and "[--acceptance " in line]
    import argparse

    parser = argparse.ArgumentParser()
    test_models.add_arguments(parser)
    offered = next(a.choices for a in parser._actions if "--acceptance" in a.option_strings)
    assert {name for name, _ in lines} >= {"README.md", "bench.md"} and "interleaved" in offered
    for name, line in lines:
        written = re.search(r"\[--acceptance ([\w|]+)\]", line).group(1).split("|")
        assert sorted(written) == sorted(offered), (name, line)


def test_the_tokenwise_figures_the_pages_quote_are_the_raw_files():
    """docs/make-test-models.md and docs/bench.md quote the tokenwise CPU run with the 512-token core."""
    raw = (REPO / "benchmarks/results/2026-12-04-cpu/tokenwise_drafter_core.txt").read_text()
    figures = [f"{float(x):.3f}" for x in re.findall(r"accept length ([\d.]+)", raw)]
    assert figures == ["2.707", "1.000", "2.430", "1.685"]
    page = (REPO / "docs" / "make-test-models.md").read_text()
    assert all(f"| {x} |" in page for x in figures)
    bench = " ".join((REPO / "docs" / "bench.md").read_text().split())
    assert "(2.43 / 1.69 against 2.71;" in bench
