"""The figures of `make-test-models --all-reduce-check` on the CPU: greedy margins, each shard's partial, what a
simulated all-reduce fault does, and the same faults on the plain `--acceptance mixed` model.

usage: python -m benchmarks.allreduce_check_cpu --python SGLANG_ENV_PYTHON [--preset tiny|e2e] [--seed N]
                                              [--new-tokens N] [--out FILE]

Writes both model pairs into a temporary folder (seeded: the same bytes every time), then runs
tests/support/scripts/allreduce_faults.py (transformers' Llama, bf16, o_proj / down_proj as tensor-parallel
shards; see its docstring) with the given python, which needs torch, transformers and safetensors (the SGLang test
envs have them): with --sweep on the checked model, once on the plain one. Prints a summary; --out FILE keeps the
raw JSON (benchmarks/results/<date>-cpu/allreduce_check_<preset>.json).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglang_pcie.tools import make_test_models
from support import SUPPORT

SCRIPT = SUPPORT / "scripts" / "allreduce_faults.py"


def run(python: str, root: Path, *extra: str) -> dict:
    proc = subprocess.run([python, str(SCRIPT), str(root), *extra], capture_output=True, text=True, cwd=root)
    if proc.returncode != 0:
        sys.exit(f"{SCRIPT.name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="a python with torch, transformers and safetensors")
    parser.add_argument("--preset", choices=sorted(make_test_models.PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--new-tokens", type=int, default=24, help="greedy tokens per prompt (12 prompts)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shape = make_test_models.PRESETS[args.preset]
    result = {"argv": sys.argv, "preset": args.preset, "seed": args.seed, "shape": shape.__dict__}
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in (("checked", True), ("plain_mixed", False)):
            root = Path(tmp) / name
            make_test_models.make_models(root, shape, args.seed, "mixed", all_reduce_check=check)
            start = time.monotonic()
            result[name] = run(args.python, root, "--new-tokens", str(args.new_tokens),
                               *(["--sweep"] if check else []))
            result[name]["seconds"] = round(time.monotonic() - start, 1)
            result[name].pop("reference_tokens")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    checked, plain = result["checked"], result["plain_mixed"]
    m = checked["margins"]
    print(f"{args.preset}: {checked['requests']} prompts x {checked['new_tokens']} greedy tokens; smallest lead of"
          f" the chosen logit over the runner-up {m['min']:g} (chosen logits {m['chosen_min']:g}-{m['chosen_max']:g})")
    for kind, p in checked["partials"].items():
        print(f"  {kind}: one shard's partial (TP=2) rms per coordinate {p['rms_min']:.1f}-{p['rms_median']:.1f}"
              f" embedding entries (min-median); the pairs leave at most {checked['residue'][kind]:.3g}")
    values = [v for pair in checked["chain"].values() for v in pair]
    print(f"  chain: every link wrote {min(values):g}-{max(values):g}")
    for name, v in checked["variants"].items():
        print(f"  {name}: {v['differ']}/{checked['requests']} requests differ"
              f" (plain mixed model: {plain['variants'][name]['differ']})"
              + (f", max logprob diff {v['max_logprob_diff']:g}" if v["max_logprob_diff"] is not None else ""))
    for what, counts in checked.get("sweep", {}).items():
        print(f"  {what}, every layer: " + ", ".join(f"{f if f.startswith('2^') else 'x%g' % float(f)}: {n}"
                                                      for f, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
