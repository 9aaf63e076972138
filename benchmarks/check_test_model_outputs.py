"""Every output of a `sglang-pcie bench` run on `make-test-models --acceptance mixed|full --all-reduce-check` models
against the tokens the model files predict, and each run's accept length against the one that chain predicts.

usage: python -m benchmarks.check_test_model_outputs RUN_DIR MODELS_DIR [--json]

Bench compares each run with the first baseline run; this compares each run with the truth: a fault shared by every
variant is caught too, and a TP=1 run (nothing to all-reduce) still shows that the GPU kernels, CUDA graphs and
batching keep every token where the files put it. A request's tokens follow from its last prompt token alone
(make_test_models.predicted_chain); a request that repeats one token takes ceil((N - 1) / (steps + 1)) verifies
for its N tokens (the first comes from prefill), one that alternates two ceil((N - 1) / 2) (EAGLE-3 with topk 1).
Exit 0 when every request of every run is as predicted and every accept length within 1% of its prediction, 1
otherwise, 2 for unreadable input.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from sglang_pcie.tools.bench.plan import Workload
from sglang_pcie.tools.make_test_models import predicted_chain

ACCEPT_TOLERANCE = 0.01


def speculative_steps(launch_args: list[str]) -> int | None:
    if "--speculative-algorithm" not in launch_args:
        return None
    steps = [launch_args[i + 1] for i, a in enumerate(launch_args[:-1]) if a == "--speculative-num-steps"]
    return int(steps[-1]) if steps else None


def check_run(run: dict, run_dir: Path, prompts: dict, chain, steps: int | None) -> dict:
    outputs = json.loads((run_dir / "runs" / Path(run["outputs_file"]).parent.name / "outputs.json").read_text())
    result = {"run": Path(run["outputs_file"]).parent.name, "requests": 0, "as_predicted": 0, "unpredictable": 0,
              "repeating": 0, "first_wrong": None}
    tokens = verifies = 0
    for phase in ("batch", "stream"):
        for i, got in enumerate(outputs.get(phase, [])):
            expected = chain(prompts[phase][i][-1], len(got))
            result["requests"] += 1
            if expected is None:
                result["unpredictable"] += 1
                continue
            if got == expected:
                result["as_predicted"] += 1
            elif result["first_wrong"] is None:
                pos = next(k for k, (a, b) in enumerate(zip(expected, got)) if a != b)
                result["first_wrong"] = {"phase": phase, "request": i, "token": pos, "expected": expected[pos],
                                         "got": got[pos]}
            repeating = len(set(expected)) == 1
            result["repeating"] += repeating
            tokens += len(got)
            verifies += math.ceil((len(got) - 1) / ((steps + 1) if repeating else 2)) if steps else 0
    result["accept_length"] = (run.get("metrics") or {}).get("accept_length")
    result["accept_predicted"] = tokens / verifies if verifies else None
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("models_dir", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        results = json.loads((args.run_dir / "results.json").read_text())
        chain = predicted_chain(args.models_dir)
    except (OSError, ValueError, KeyError) as exc:
        print(f"check_test_model_outputs: {exc}", file=sys.stderr)
        return 2
    prompts = Workload(**results["workload"]).prompts()
    steps = speculative_steps(results.get("launch_args") or [])
    checked = [check_run(run, args.run_dir, prompts, chain, steps) for run in results["runs"]
               if run.get("ok") and run.get("outputs_file")]
    ok = bool(checked)
    for r in checked:
        line = f"{r['run']}: {r['as_predicted']}/{r['requests']} requests as predicted"
        line += f" ({r['repeating']} repeat one token, {r['requests'] - r['repeating']} alternate two)"
        good = r["as_predicted"] == r["requests"]
        if r["unpredictable"]:
            line += f"; {r['unpredictable']} not decided by the files (models without --all-reduce-check?)"
        if r["first_wrong"]:
            w = r["first_wrong"]
            line += f"; first wrong: {w['phase']} request {w['request']}, token {w['token']} ({w['got']}, expected {w['expected']})"
        if r["accept_predicted"] is not None and r["accept_length"] is not None:
            close = abs(r["accept_length"] / r["accept_predicted"] - 1) <= ACCEPT_TOLERANCE
            line += (f"; accept length {r['accept_length']:.3f}, predicted {r['accept_predicted']:.3f}"
                     + ("" if close else " (MORE THAN 1% OFF)"))
            good = good and close
        ok = ok and good
        print(("ok    " if good else "WRONG ") + line)
    if not checked:
        print("no run with outputs in", args.run_dir)
    if args.json:
        print(json.dumps(checked))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
