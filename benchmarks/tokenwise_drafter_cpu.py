"""Accept lengths of the `make-test-models --acceptance tokenwise` (or `interleaved`, `mixed`) drafter on the CPU:
healthy, layer ids shifted by one, 10% and 40% of d2t permuted within its hot set; with --judge, what
draft-token-watch's test says about each drafter's first drafts.

usage: python -m benchmarks.tokenwise_drafter_cpu --python SGLANG_ENV_PYTHON [--acceptance A] [--preset P]
                                                  [--layers N] [--hidden N --heads N --kv-heads N] [--seed N]
                                                  [--prompts N] [--new-tokens N] [--bf16] [--judge] [--out FILE]

Writes the pair (`--preset tiny --layers 6` by default: hidden 256, 6 layers, draft vocabulary 8192) into a
temporary folder, its broken copies with benchmarks/break_drafter.py, then runs tests/support/scripts/eagle3_accept.py
with the given python (torch, transformers, safetensors: the SGLang test envs have them): transformers' Llama decodes
greedily in fp32, each drafter's EAGLE-3 chain (3 steps, topk 1) is replayed as SGLang's llama_eagle3.py computes it.
--judge: every verify's [verified token, first draft, accepted] in the order a server at concurrency = prompts would
count them (the prompts round-robin), judged by sglang_pcie.patches.draft_token_watch.payload.judge at 1,000 first
drafts and each
doubling after, and at the end (looks 1, 2, ...: the watch's looks as its counts double; here every verify counted).
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
    parser.add_argument("--acceptance", choices=sorted([*make_test_models.CONSTRUCTIONS, "mixed"]),
                        default="tokenwise")
    parser.add_argument("--preset", choices=sorted(make_test_models.PRESETS), default="tiny")
    parser.add_argument("--layers", type=int, help="target layers (default: 6 for tiny, the preset's otherwise)")
    parser.add_argument("--seed", type=int, default=0, help="the models' seed and the permutations' seed")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    for name in ("hidden", "heads", "kv-heads", "intermediate"):
        parser.add_argument(f"--{name}", type=int, help="override the preset's")
    parser.add_argument("--bf16", action="store_true", help="decode and draft in bf16 (default fp32)")
    parser.add_argument("--judge", action="store_true", help="judge each drafter's first drafts (draft-token-watch)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    preset = make_test_models.PRESETS[args.preset]
    overrides = {k: getattr(args, k) for k in ("hidden", "heads", "kv_heads", "intermediate") if getattr(args, k)}
    shape = replace(preset, layers=args.layers or (6 if args.preset == "tiny" else preset.layers), **overrides)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_test_models.make_models(root, shape, args.seed, args.acceptance)
        broke = subprocess.run([sys.executable, "-m", "benchmarks.break_drafter", str(root / "draft"),
                                "--only", *BREAKS, "--seed", str(args.seed)], check=True, capture_output=True,
                               text=True, cwd=REPO).stdout
        drafts = [str(root / "draft")] + [str(root / f"draft-{b}") for b in BREAKS]
        proc = subprocess.run([args.python, str(SCRIPT), str(root / "target"), *drafts, "--prompts",
                               str(args.prompts), "--new-tokens", str(args.new_tokens),
                               *(["--bf16"] if args.bf16 else []), *(["--first-drafts"] if args.judge else [])],
                              capture_output=True, text=True, cwd=root)
        if proc.returncode != 0:
            sys.exit(f"{SCRIPT.name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        raw = json.loads(proc.stdout.strip().splitlines()[-1])
    result = {"argv": sys.argv, "preset": args.preset, "seed": args.seed, "shape": shape.__dict__,
              "acceptance": args.acceptance,
              "break_drafter": broke.replace(tmp, "<tmp>").strip().splitlines(),
              **{k: v for k, v in raw.items() if k != "drafts"},
              "drafts": {Path(name).name: value for name, value in raw["drafts"].items()}}
    if args.judge:
        for d in result["drafts"].values():
            d["watch_looks"] = judged_looks(d, shape.vocab)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    healthy = result["drafts"]["draft"]["accept_length"]
    print(f"{args.acceptance}, {args.preset} with {shape.layers} layers (hidden {shape.hidden}), seed {args.seed}:"
          f" {args.prompts} prompts x {args.new_tokens} greedy tokens, EAGLE-3 3 steps topk 1"
          f" (CPU, {'bf16' if args.bf16 else 'fp32'})")
    for name, d in result["drafts"].items():
        steps = ", ".join(f"{a}/{r}" for a, r in zip(d["step_accepted"], d["step_reached"]))
        print(f"  {name:24} accept length {d['accept_length']:.3f} ({d['accept_length'] / healthy:.2f}x healthy) over"
              f" {d['verifies']} verifies; per step accepted/reached {steps}; layer ids {d['layer_ids']}")
        if args.judge:
            for look in d["watch_looks"]:
                print(f"    look {look['look']} at {look['proposals']:,} first drafts: {look['tested']} tokens tested,"
                      f" {look['dead']} never accepted (H0: at most {look['expected_dead']:.2g}), their share"
                      f" {look['dead_share']:.1%}, P <= {look['tail']:.1e} ->"
                      f" {'WARN' if look['warn'] else 'no warning'}")
    return 0


def judged_looks(drafter: dict, vocab: int) -> list[dict]:
    """draft-token-watch's judge over the drafter's first drafts in a server's counting order, at 1,000 first
    drafts, each doubling, and the end (the contexts: the verified token's bucket, as the watch hashes it)."""
    import numpy as np

    from sglang_pcie.patches.draft_token_watch import payload as draft_watch

    records, start = [], 0
    per_prompt = []
    for verifies in (len(p) for p in drafter["per_prompt"]):
        per_prompt.append(drafter["first_drafts"][start:start + verifies])
        start += verifies
    for step in range(max(map(len, per_prompt))):  # the prompts side by side, as a batch decodes them
        records += [p[step] for p in per_prompt if step < len(p)]
    rows = np.array(records, dtype=np.int64).reshape(-1, 3)
    marks, n = [], draft_watch.MIN_PROPOSALS
    while n < len(rows):
        marks.append(n)
        n *= 2
    looks = []
    for look, n in enumerate(marks + [len(rows)], start=1):
        verified, first, accepted = rows[:n].T
        proposed = np.bincount(first, minlength=vocab)
        hits = np.bincount(first, weights=accepted, minlength=vocab).astype(np.int64)
        buckets = np.zeros((vocab, draft_watch.CONTEXT_BUCKETS), dtype=bool)
        buckets[first, verified & (draft_watch.CONTEXT_BUCKETS - 1)] = True
        finding = draft_watch.judge(proposed, hits, look, buckets.sum(axis=1))
        if finding is not None:
            looks.append({k: v for k, v in finding.items() if k != "top"})
    return looks


if __name__ == "__main__":
    sys.exit(main())
