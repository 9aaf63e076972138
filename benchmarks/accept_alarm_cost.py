#!/usr/bin/env python3
"""What the accept-length alarm costs: its host time per finished request, in the real SGLang installs.

The alarm runs once per finished request of a speculative run, in the process that serves the API (SGLang's
TokenizerManager), after SGLang's own ``_calculate_spec_decoding_metrics``; nothing of it runs per decode step or
in the scheduler.  This times the real method of the real TokenizerManager class (0.5.9 and 0.5.23 by default, the
installs the tests use, with this checkout's HEAD installed) as SGLang calls it, wrapped and unwrapped, on a
TokenizerManager made without __init__ and output batches of 32 requests shaped as SGLang's:

* ``watching``: a working drafter, judged at every finished request once the minimums are met (the steady state
  of a healthy server);
* ``alarmed``: a broken drafter after its warning (counted and judged at every request, until it recovers);
* ``ended``: after the recovery line, or in an NGRAM run (one state check);
* ``watching+metrics``: as ``watching`` with SGLang's metrics on: the accept-length gauge set at every request, in
  prometheus_client's multiprocess mode as SGLang runs it (PROMETHEUS_MULTIPROC_DIR).

Rounds alternate wrapped and unwrapped calls (ABBA); the figure is the median over rounds of (wrapped - unwrapped)
CPU time per call (the thread's CPU clock, so time spent descheduled on a loaded machine does not count), with the
min-max of the rounds.

Usage: python -m benchmarks.accept_alarm_cost [--versions 0.5.9,0.5.23] [--rounds 15] [--calls 20000] [--json FILE]
       [--no-install]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.activation_cost import child_env, head_commit, install_checkout, sglang_python

CHILD = r'''
import gc, json, os, sys, tempfile, time, types
os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()  # as SGLang sets it when metrics are enabled
import sglang.srt.managers.tokenizer_manager as tm
from sglang_pcie.patches.accept_length_alarm import payload as aa

ROUNDS, CALLS = int(sys.argv[1]), int(sys.argv[2])
hook = tm.TokenizerManager.__dict__[aa.HOOK]
assert getattr(hook, "__sglang_pcie_patch__", None) == aa.PATCH_ID, "the alarm is not installed"
original = hook.__wrapped__
if hasattr(tm, "get_spec"):  # 0.5.18+: the runtime context a launched server publishes
    tm.get_spec = lambda: types.SimpleNamespace(speculative_algorithm="EAGLE3", speculative_num_draft_tokens=4)
field = next(f for f in aa.ACCEPTED_FIELDS if f in original.__code__.co_names)
manager = object.__new__(tm.TokenizerManager)
manager.server_args = types.SimpleNamespace(
    model_path="/models/target", speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/draft",
    speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4, enable_metrics=False,
    served_model_name="m")

def output_batch(accepted):  # 32 finished requests of 200 verifies
    n = 32
    return types.SimpleNamespace(spec_verify_ct=[200] * n, completion_tokens=[201 + accepted] * n,
                                 **{field: [accepted] * n}, spec_acceptance_histogram=[[1, 2]] * n,
                                 spec_correct_drafts_histogram=[[1, 2]] * n, spec_num_cap_tokens=None,
                                 spec_num_block_accept_tokens=None)

def watch_in(state, accepted, metrics=False):
    manager.server_args.enable_metrics = metrics
    watch = aa.AcceptWatch()
    aa.set_watch(watch)
    batch = output_batch(accepted)
    for i in range(32):  # past the minimums (and the warning, for a broken drafter)
        hook(manager, {}, batch, i)
    if state == "ended":
        watch.state = aa.DONE
    assert watch.state == {"watching": aa.WATCHING, "alarmed": aa.ALARMED, "ended": aa.DONE}[state], watch.state
    return batch

def per_call_ns(function, batch):  # this thread's CPU time: time spent descheduled on a shared machine not counted
    meta = {}
    start = time.thread_time_ns()
    for k in range(CALLS):
        function(manager, meta, batch, k & 31)
    return (time.thread_time_ns() - start) / CALLS

logs = []
results = {}
for label, state, accepted, metrics in (("watching", "watching", 300, False), ("alarmed", "alarmed", 0, False),
                                        ("ended", "ended", 300, False), ("watching+metrics", "watching", 300, True)):
    batch = watch_in(state, accepted, metrics)
    aa.get_watch().logger.disabled = True  # the one warning is not part of the per-call cost
    gc.disable()
    rounds = []
    for r in range(ROUNDS):
        first, second = (hook, original) if r % 2 == 0 else (original, hook)
        a, b = per_call_ns(first, batch), per_call_ns(second, batch)
        wrapped, plain = (a, b) if first is hook else (b, a)
        rounds.append({"wrapped_ns": wrapped, "sglang_ns": plain})
    gc.enable()
    results[label] = rounds
    assert aa.get_watch().state != aa.OFF, "the watch switched itself off"
print(json.dumps({"sglang": __import__("sglang").__version__, "field": field, "results": results}))
'''


def measure(version: str, rounds: int, calls: int, install: bool) -> dict:
    python = sglang_python(version)
    if install:
        install_checkout(python)
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.run([str(python), "-c", CHILD, str(rounds), str(calls)], env=child_env(python, "overlay"),
                              cwd=workdir, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"accept_alarm_cost: child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["sglang_pcie"] = head_commit() if install else "as installed"
    report["rounds"], report["calls"] = rounds, calls
    for label, rows in report["results"].items():
        deltas = sorted(r["wrapped_ns"] - r["sglang_ns"] for r in rows)
        report[label] = {"hook_ns": statistics.median(deltas), "min_ns": deltas[0], "max_ns": deltas[-1],
                         "sglang_ns": statistics.median(r["sglang_ns"] for r in rows)}
    return report


def format_result(r: dict) -> str:
    lines = [f"sglang {r['sglang']} (accepted drafts read from {r['field']}), {r['rounds']} ABBA rounds x "
             f"{r['calls']} calls; sglang-pcie {r['sglang_pcie']}"]
    for label in r["results"]:
        m = r[label]
        lines.append(f"  {label:17} alarm {m['hook_ns'] / 1e3:6.2f} us per finished request (rounds "
                     f"{m['min_ns'] / 1e3:.2f}-{m['max_ns'] / 1e3:.2f}); "
                     f"SGLang's own method {m['sglang_ns'] / 1e3:.2f} us")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="0.5.9,0.5.23")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed block")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--no-install", action="store_true",
                        help="use the sglang-pcie already installed in the venvs instead of this checkout's HEAD")
    args = parser.parse_args(argv)
    reports = []
    for version in args.versions.split(","):
        report = measure(version, args.rounds, args.calls, not args.no_install)
        print(format_result(report), flush=True)
        reports.append(report)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
