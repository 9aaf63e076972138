"""What check-drafter costs against a Kimi-K2-shaped 1 TB target: wall seconds and peak memory of the whole command.

    python -m benchmarks.check_drafter_kimi_cost [--out DIR] [--runs 5] [--sglang-version 0.5.23 | --sglang-source DIR]

Writes (once, into --out; default a temporary folder, removed) a target with Kimi-K2's config (DeepseekV3ForCausalLM,
hidden 7168, 61 layers, 384 routed experts of 2048 in FP8 with block scales, vocab 163,840) as 64 safetensors shards
and an index, every tensor a hole in a sparse file, so that only the headers occupy disk; and a drafter with
SpecForge's published Kimi-K2.5 EAGLE-3 config (tests/support/data/eagle3-configs/), its d2t / t2d real (32,000 ids
of 163,840), its weights holes. Then runs `python -m sglang_pcie check-drafter --draft D --target T ...` in fresh
processes and prints for each: wall and CPU seconds of the process, the report's own seconds (its checks, once
Python and the command are loaded), peak resident memory (the child's ru_maxrss), and the checks' statuses. On a
shared machine wall seconds grow with the load; CPU seconds much less.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglang_pcie.tools import safetensors_io as st
from support import REPO, SUPPORT

DRAFT_CONFIG = SUPPORT / "data" / "eagle3-configs" / "specforge-kimi-k25-eagle3.json"
HIDDEN, LAYERS, EXPERTS, MOE, DENSE, VOCAB, HEADS = 7168, 61, 384, 2048, 18432, 163840, 64
Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD = 1536, 512, 64, 128, 128
SHARDS = 64


def fp8(name: str, rows: int, cols: int) -> dict:
    """An FP8 weight and its 128 x 128 block scales, as Kimi-K2's checkpoint stores them."""
    return {f"{name}.weight": ("F8_E4M3", (rows, cols), None),
            f"{name}.weight_scale_inv": ("F32", (-(-rows // 128), -(-cols // 128)), None)}


def layer_tensors(layer: int) -> dict:
    p = f"model.layers.{layer}"
    tensors = {f"{p}.input_layernorm.weight": ("BF16", (HIDDEN,), None),
               f"{p}.post_attention_layernorm.weight": ("BF16", (HIDDEN,), None),
               f"{p}.self_attn.q_a_layernorm.weight": ("BF16", (Q_LORA,), None),
               f"{p}.self_attn.kv_a_layernorm.weight": ("BF16", (KV_LORA,), None)}
    tensors.update(fp8(f"{p}.self_attn.q_a_proj", Q_LORA, HIDDEN))
    tensors.update(fp8(f"{p}.self_attn.q_b_proj", HEADS * (NOPE + ROPE), Q_LORA))
    tensors.update(fp8(f"{p}.self_attn.kv_a_proj_with_mqa", KV_LORA + ROPE, HIDDEN))
    tensors.update(fp8(f"{p}.self_attn.kv_b_proj", HEADS * (NOPE + V_HEAD), KV_LORA))
    tensors.update(fp8(f"{p}.self_attn.o_proj", HIDDEN, HEADS * V_HEAD))
    if layer == 0:  # first_k_dense_replace = 1
        for part, rows, cols in (("gate_proj", DENSE, HIDDEN), ("up_proj", DENSE, HIDDEN), ("down_proj", HIDDEN, DENSE)):
            tensors.update(fp8(f"{p}.mlp.{part}", rows, cols))
        return tensors
    tensors[f"{p}.mlp.gate.weight"] = ("BF16", (EXPERTS, HIDDEN), None)
    tensors[f"{p}.mlp.gate.e_score_correction_bias"] = ("F32", (EXPERTS,), None)
    for owner in ["shared_experts"] + [f"experts.{e}" for e in range(EXPERTS)]:
        for part, rows, cols in (("gate_proj", MOE, HIDDEN), ("up_proj", MOE, HIDDEN), ("down_proj", HIDDEN, MOE)):
            tensors.update(fp8(f"{p}.mlp.{owner}.{part}", rows, cols))
    return tensors


def write_target(folder: Path) -> tuple[int, int]:
    """(tensors, bytes they describe)."""
    folder.mkdir(parents=True)
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": HIDDEN,
              "num_hidden_layers": LAYERS, "n_routed_experts": EXPERTS, "moe_intermediate_size": MOE,
              "intermediate_size": DENSE, "first_k_dense_replace": 1, "vocab_size": VOCAB,
              "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "q_lora_rank": Q_LORA,
              "kv_lora_rank": KV_LORA, "qk_rope_head_dim": ROPE, "qk_nope_head_dim": NOPE, "v_head_dim": V_HEAD,
              "tie_word_embeddings": False,
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {"model.embed_tokens.weight": ("BF16", (VOCAB, HIDDEN), None)}
    for layer in range(LAYERS):
        tensors.update(layer_tensors(layer))
    tensors["model.norm.weight"] = ("BF16", (HIDDEN,), None)
    tensors["lm_head.weight"] = ("BF16", (VOCAB, HIDDEN), None)
    names, weight_map = list(tensors), {}
    per_shard = -(-len(names) // SHARDS)
    for s in range(SHARDS):
        file = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per_shard:(s + 1) * per_shard]}
        st.write_safetensors(folder / file, part, {"format": "pt"})
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return len(tensors), sum(st.numel(shape) * st.element_size(dtype) for dtype, shape, _ in tensors.values())


def write_draft(folder: Path) -> None:
    folder.mkdir(parents=True)
    config = json.loads(DRAFT_CONFIG.read_text())
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    hidden, dv, heads, head_dim = (config["hidden_size"], config["draft_vocab_size"], config["num_attention_heads"],
                                   config["head_dim"])
    hot = sorted(random.Random(0).sample(range(config["vocab_size"]), dv))
    marked = set(hot)
    tensors = {"fc.weight": ("BF16", (hidden, 3 * hidden), None),
               "midlayer.self_attn.q_proj.weight": ("BF16", (heads * head_dim, 2 * hidden), None),
               "midlayer.self_attn.k_proj.weight": ("BF16", (config["num_key_value_heads"] * head_dim, 2 * hidden), None),
               "midlayer.self_attn.v_proj.weight": ("BF16", (config["num_key_value_heads"] * head_dim, 2 * hidden), None),
               "midlayer.self_attn.o_proj.weight": ("BF16", (hidden, heads * head_dim), None),
               "midlayer.mlp.gate_proj.weight": ("BF16", (config["intermediate_size"], hidden), None),
               "midlayer.mlp.up_proj.weight": ("BF16", (config["intermediate_size"], hidden), None),
               "midlayer.mlp.down_proj.weight": ("BF16", (hidden, config["intermediate_size"]), None),
               "midlayer.hidden_norm.weight": ("BF16", (hidden,), None),
               "midlayer.input_layernorm.weight": ("BF16", (hidden,), None),
               "midlayer.post_attention_layernorm.weight": ("BF16", (hidden,), None),
               "norm.weight": ("BF16", (hidden,), None),
               "lm_head.weight": ("BF16", (dv, hidden), None),
               "d2t": ("I64", (dv,), st.pack("I64", [t - i for i, t in enumerate(hot)])),
               "t2d": ("BOOL", (config["vocab_size"],), st.pack("BOOL", [j in marked for j in range(config["vocab_size"])]))}
    st.write_safetensors(folder / "model.safetensors", tensors, {"format": "pt"})


def one_run(command: list[str], checkout: Path) -> tuple[float, float, dict, int]:
    """(wall seconds, CPU seconds, the JSON report, peak resident kilobytes) of one fresh process."""
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, cwd=checkout,
                                env={**os.environ, "PYTHONPATH": str(checkout)})
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here, for the child's own peak memory
        wall = time.perf_counter() - started
        proc.stdout.close()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):
            errors.seek(0)
            raise SystemExit(f"check-drafter failed: {errors.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, json.loads(out), usage.ru_maxrss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where the models go (default: a temporary folder, removed)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--checkout", type=Path, default=REPO, help="the sglang-pcie checkout to run (default: this)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sglang-version")
    where.add_argument("--sglang-source")
    args = parser.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="kimi-cost-"))
    target, draft = root / "kimi-1tb", root / "k25-drafter"
    if not target.exists():
        count, size = write_target(target)
        write_draft(draft)
        print(f"target: {count:,} tensors in {SHARDS} shards, {size / 1e12:.2f} TB described,"
              f" {sum(f.stat().st_blocks * 512 for f in target.iterdir()) / 2**20:.0f} MiB on disk")
    command = [sys.executable, "-m", "sglang_pcie", "check-drafter", "--draft", str(draft), "--target", str(target),
               "--json"]
    command += ["--sglang-version", args.sglang_version] if args.sglang_version else []
    command += ["--sglang-source", args.sglang_source] if args.sglang_source else []
    print("$", " ".join(command[1:]))
    print(f"checkout: {args.checkout}; load average: {os.getloadavg()}; {os.cpu_count()} CPUs")
    for run in range(args.runs):
        wall, cpu, report, peak_kb = one_run(command, args.checkout)
        statuses = " ".join(f"{c['check']}={c['status']}" for c in report["checks"])
        print(f"run {run + 1}: wall {wall:.2f} s, CPU {cpu:.2f} s, report {report['seconds']:.2f} s, peak"
              f" {peak_kb / 1024:.0f} MiB; {statuses}", flush=True)
    if not args.out:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
