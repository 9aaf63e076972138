"""Accept lengths of the `make-test-models --acceptance tokenwise` drafter on the CPU: healthy, layer ids shifted by
one, 10% and 40% of d2t permuted within its hot set.

usage: python -m benchmarks.tokenwise_drafter_cpu --python SGLANG_ENV_PYTHON [--preset P] [--layers N] [--seed N]
                                                  [--prompts N] [--new-tokens N] [--bf16] [--out FILE]

Writes the pair (`--preset tiny --layers 6` by default: hidden 256, 6 layers, draft vocabulary 8192) into a
temporary folder, its broken copies with benchmarks/break_drafter.py, then runs tests/support/scripts/eagle3_accept.py
with the given python (torch, transformers, safetensors: the SGLang test envs have them): transformers' Llama decodes
greedily in fp32, each drafter's EAGLE-3 chain (3 steps, topk 1) is replayed as SGLang's llama_eagle3.py computes it.
Prints a table; --out FILE keeps the raw JSON (benchmarks/results/<date>-cpu/tokenwise_drafter.json).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from sglang_pcie.tools import make_test_models
from support import REPO, SUPPORT

SCRIPT = SUPPORT / "scripts" / "eagle3_accept.py"
BREAKS = ("layer-ids-plus1", "d2t-permuted-10pct", "d2t-permuted-40pct")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="a python with torch, transformers and safetensors")
    parser.add_argument("--preset", choices=sorted(make_test_models.PRESETS), default="tiny")
    parser.add_argument("--layers", type=int, help="target layers (default: 6 for tiny, the preset's otherwise)")
    parser.add_argument("--seed", type=int, default=0, help="the models' seed and the permutations' seed")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--bf16", action="store_true", help="decode and draft in bf16 (default fp32)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    preset = make_test_models.PRESETS[args.preset]
    shape = replace(preset, layers=args.layers or (6 if args.preset == "tiny" else preset.layers))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_test_models.make_models(root, shape, args.seed, "tokenwise")
        broke = subprocess.run([sys.executable, "-m", "benchmarks.break_drafter", str(root / "draft"),
                                "--only", *BREAKS, "--seed", str(args.seed)], check=True, capture_output=True,
                               text=True, cwd=REPO).stdout
        drafts = [str(root / "draft")] + [str(root / f"draft-{b}") for b in BREAKS]
        proc = subprocess.run([args.python, str(SCRIPT), str(root / "target"), *drafts, "--prompts",
                               str(args.prompts), "--new-tokens", str(args.new_tokens),
                               *(["--bf16"] if args.bf16 else [])],
                              capture_output=True, text=True, cwd=root)
        if proc.returncode != 0:
            sys.exit(f"{SCRIPT.name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        raw = json.loads(proc.stdout.strip().splitlines()[-1])
    result = {"argv": sys.argv, "preset": args.preset, "seed": args.seed, "shape": shape.__dict__,
              "acceptance": "tokenwise",
              "break_drafter": broke.replace(tmp, "<tmp>").strip().splitlines(),
              **{k: v for k, v in raw.items() if k != "drafts"},
              "drafts": {Path(name).name: value for name, value in raw["drafts"].items()}}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    healthy = result["drafts"]["draft"]["accept_length"]
    print(f"tokenwise, {args.preset} with {shape.layers} layers (hidden {shape.hidden}), seed {args.seed}:"
          f" {args.prompts} prompts x {args.new_tokens} greedy tokens, EAGLE-3 3 steps topk 1"
          f" (CPU, {'bf16' if args.bf16 else 'fp32'})")
    for name, d in result["drafts"].items():
        steps = ", ".join(f"{a}/{r}" for a, r in zip(d["step_accepted"], d["step_reached"]))
        print(f"  {name:24} accept length {d['accept_length']:.3f} ({d['accept_length'] / healthy:.2f}x healthy) over"
              f" {d['verifies']} verifies; per step accepted/reached {steps}; layer ids {d['layer_ids']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
