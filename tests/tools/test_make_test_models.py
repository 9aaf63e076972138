"""sglang-pcie make-test-models: the layout SGLang's loaders read, bad shapes, loading through SGLang 0.5.23's
real classes, and the accept lengths the --acceptance models give."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest


from sglang_pcie.tools import make_test_models as test_models
from sglang_pcie.tools.cli import main as cli_main
from sglang_pcie.tools.safetensors_io import read_header, read_tensor



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
target.set_eagle3_layers_to_capture(None)
d["default_captured"] = list(target.model.layers_to_capture)
d["fc_in"] = draft.model.fc.in_features
d["hot_token_id"] = draft.hot_token_id.tolist()
d["model_config_archs"] = [ModelConfig(f"{root}/{n}", is_draft_model=(n == "draft")).hf_config.architectures[0]
                           for n in ("target", "draft")]
print(json.dumps({"target": t, "draft": d}))
"""


def test_models_load_through_sglang_0_5_23(sglang_env, tmp_path):
    env = sglang_env("0.5.23")
    models = tmp_path / "models"
    written = test_models.make_models(models, test_models.PRESETS["tiny"], seed=0)
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
    while pos + 1 + steps < len(seq):
        token, state, keys, values, accepted = seq[pos + 1], aux[pos], [], [], 0
        for i in range(steps):
            token, state = draft_step(token, state, keys, values)
            if token != seq[pos + 2 + i]:
                break
            accepted += 1
        lengths.append(accepted + 1)
        pos += accepted + 1
    result.append({"tokens": seq[len(prompt[0]):], "accept_lengths": lengths})
print(json.dumps(result))
"""


@pytest.mark.parametrize("acceptance", ["random", "mixed", "full"])
def test_acceptance_of_the_test_models(sglang_env, tmp_path, acceptance):
    env = sglang_env("0.5.23")
    test_models.make_models(tmp_path, test_models.PRESETS["tiny"], seed=1, acceptance=acceptance)
    requests = env.run_json(ACCEPTANCE_PROBE.replace("sys.argv[1]", repr(str(tmp_path))))
    per_request = [sorted(set(r["accept_lengths"])) for r in requests]
    if acceptance == "random":
        assert all(lengths == [1] for lengths in per_request), per_request
        return
    _, _, d2t = read_tensor(tmp_path / "draft" / "model.safetensors", "d2t")
    draft_vocab = {d + i for i, d in enumerate(d2t)}
    for r in requests:  # from the first output token on, a request repeats one token or alternates two
        assert set(r["tokens"]) <= draft_vocab and len(set(r["tokens"])) in (1, 2)
        assert r["tokens"][2:] == r["tokens"][:-2]
    # every draft accepted (3 steps + the bonus) where the token repeats, one where it alternates
    if acceptance == "full":
        assert per_request == [[4]] * len(requests)
    else:
        assert sorted(set(map(tuple, per_request))) == [(2,), (4,)], per_request
