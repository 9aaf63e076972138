"""Which drafters check-drafter's "lm_head rows" check can judge: the models make-test-models writes, each with its
own d2t and with wrong but valid ones, no tokenizer and no reference drafter.

    python -m benchmarks.check_drafter_head_rows [--preset tiny] [--out DIR] [--sglang-source DIR]

For each ``--acceptance`` (random: the drafter's lm_head rows are random; mixed and full: they are the target's
embedding rows of its hot tokens) and each map: the drafter's own d2t; d2t shifted by one within its hot set (draft
id i -> the target id of draft id i+1, the drafter served on one H200 with accept length 1.00 instead of 2.76);
d2t permuted at random within its hot set; a d2t (and t2d) of another hot set of the same size, as if regenerated
after training. Printed per case: the check's status; the whole check-drafter run's wall and CPU seconds (the SGLang
facts included); the mapping check's status (every map here is valid on its own); the first 200 characters of the
reason.
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from sglang_pcie.tools import safetensors_io as st
from sglang_pcie.tools.check_drafter import run_checks
from sglang_pcie.tools.make_test_models import PRESETS, make_models


def raw_tensors(file: Path) -> dict:
    with open(file, "rb") as f:
        f.seek(8 + int.from_bytes(f.read(8), "little"))
        data = f.read()
    return {name: (e["dtype"], e["shape"], data[e["data_offsets"][0]:e["data_offsets"][1]])
            for name, e in st.read_header(file).items()}


def with_map(draft: Path, folder: Path, targets_of, vocab: int) -> Path:
    """A copy of ``draft`` whose d2t maps draft id i to ``targets_of(hot)[i]``; t2d marks the new ids."""
    shutil.copytree(draft, folder)
    file = folder / "model.safetensors"
    tensors = raw_tensors(file)
    hot = [i + d for i, d in enumerate(st.read_tensor(file, "d2t")[2])]
    new = targets_of(hot)
    tensors["d2t"] = ("I64", [len(new)], st.pack("I64", [t - i for i, t in enumerate(new)]))
    marked = set(new)
    tensors["t2d"] = ("BOOL", [vocab], st.pack("BOOL", [j in marked for j in range(vocab)]))
    st.write_safetensors(file, tensors, {"format": "pt"})
    return folder


MAPS = {
    "own d2t": None,
    "shifted by one": lambda hot, vocab, rng: [hot[(i + 1) % len(hot)] for i in range(len(hot))],
    "permuted in its hot set": lambda hot, vocab, rng: rng.sample(hot, len(hot)),
    "another hot set": lambda hot, vocab, rng: sorted(rng.sample(range(vocab), len(hot))),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--out", help="where the models go (default: a temporary folder, removed)")
    parser.add_argument("--sglang-source", help="an SGLang tree for the other checks (default: the installed one)")
    args = parser.parse_args()
    shape = replace(PRESETS[args.preset])
    root = Path(args.out or tempfile.mkdtemp(prefix="head-rows-"))
    print(f"make-test-models preset {args.preset}: vocab {shape.vocab}, hidden {shape.hidden}, draft vocab"
          f" {shape.draft_vocab}")
    print(f"{'acceptance':<10}  {'map':<24}  {'status':<6}  {'wall':>5}  {'cpu':>5}  mapping  reason")
    for acceptance in ("random", "mixed", "full"):
        made = make_models(root / acceptance, shape, seed=0, acceptance=acceptance)
        draft, target = Path(made["draft"]["path"]), made["target"]["path"]
        for label, targets_of in MAPS.items():
            rng = random.Random(1)
            folder = draft if targets_of is None else with_map(
                draft, root / acceptance / label.replace(" ", "-"),
                lambda hot: targets_of(hot, shape.vocab, rng), shape.vocab)
            started, cpu = time.perf_counter(), time.process_time()
            report = run_checks(str(folder), target, sglang_source=args.sglang_source)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            checks = {c["check"]: c for c in report["checks"]}
            rows = checks["lm_head rows"]
            print(f"{acceptance:<10}  {label:<24}  {rows['status']:<6}  {seconds:5.2f}  {cpu:5.2f}"
                  f"  {checks['mapping']['status']:<7}  {rows['reason'][:200]}", flush=True)
    if not args.out:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
