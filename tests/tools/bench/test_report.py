"""What bench writes: the table line by line, the schedule, the chart, and results.json as strict JSON."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.tools.bench.analysis import METRICS, ratio_summary
from sglang_pcie.tools.bench.report import auto_text, format_schedule, format_table, percent, save, write_chart


def test_chart_when_matplotlib_is_importable(tmp_path):
    pytest.importorskip("matplotlib")
    results = {"repeats": 2, "ratios": {"baseline": {}, "overlay": {label: ratio_summary([0.98, 1.01], True)
                                                                    for _, _, label, _ in METRICS}}}
    path = write_chart(results, tmp_path / "r.png")
    assert path == str(tmp_path / "r.png") and (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_results_json_is_strict_json(tmp_path):
    save({"ratio": float("nan"), "runs": [{"tok_s": float("inf"), "ok": True, "n": 3, "log": tmp_path}]},
               tmp_path)
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    saved = json.loads(text, parse_constant=lambda name: pytest.fail(f"non-strict JSON constant {name}"))
    assert saved == {"ratio": None, "runs": [{"tok_s": None, "ok": True, "n": 3, "log": str(tmp_path)}]}


def test_auto_text_for_every_reason():
    auto = {"target": 0.02, "metric": "batch output tok/s", "budget_s": 1800.0, "repeats": 7, "elapsed_s": 1500.0,
            "resolvable": {"overlay": 0.031, "aa": 0.0125}, "noise_margin": 0.004}
    assert auto_text(dict(auto, stopped="resolved")) == (
        "repeats auto: resolved batch output tok/s to ±2.0% after 7 repeats (25.0 minutes): every variant can see"
        " overlay ±3.1%, aa ±1.2%")
    assert auto_text(dict(auto, stopped="budget")) == (
        "repeats auto: NOT RESOLVABLE batch output tok/s to ±2.0% in 30 minutes: after 7 repeats (25.0 minutes) the"
        " smallest resolvable effects are overlay ±3.1%, aa ±1.2%")
    assert auto_text(dict(auto, stopped="max repeats")).startswith(
        "repeats auto: NOT RESOLVABLE batch output tok/s to ±2.0% in 7 repeats: ")
    assert "own spread is ±0.4% after 7 repeats" in auto_text(dict(auto, stopped="noise floor"))
    assert percent(None) == "-" and percent(12.0) == "±>999%"


def test_an_interval_that_cannot_resolve_is_not_printed_as_a_figure():
    from sglang_pcie.tools.bench.report import _ratio_lines
    from sglang_pcie.tools.bench.verdicts import ratio_summary

    row = dict(ratio_summary([0.1, 10.0], higher_is_better=False), value_median=12.5)
    (line,) = [l for l in _ratio_lines({"x": {"stream TTFT p50 (ms)": row}}) if l.startswith("x ")]
    assert "too wide" in line and "[0.0" not in line and "100." not in line, line
    assert line.endswith("  cannot resolve: this interval cannot tell a 10x effect from none"), line


# ------------------------------------------------------------------------------------------------------------
# The table, line by line, from a constructed results.json (the end-to-end runs check it against real runs)

WORKLOAD = {"batch_requests": 8, "concurrency": 4, "stream_requests": 2, "input_len": 8, "output_len": 12, "seed": 5}


def a_run(index, variant, **fields):
    run = {"index": index, "repeat": 1, "variant": variant, "env": {}, "ok": True, "stop": {"survivors": []}}
    run.update(fields)
    return run


def table(runs, **fields):
    results = {"runs": runs, "repeats": 1, "workload": WORKLOAD, "ratios": {}, "outputs": {}, "out": "/o"}
    results.update(fields)
    return format_table(results).splitlines()


def test_the_heading_counts_servers_that_ran_and_failed_and_says_the_workload():
    lines = table([a_run(1, "baseline"), a_run(2, "overlay", ok=False, failure={"stage": "start", "message": "m"})])
    assert lines[0] == "sglang-pcie bench: 2 servers (1 ran, 1 failed), 1 repeat(s), order baseline overlay"
    assert lines[1] == ("workload: batch 8 requests at concurrency 4, stream 2 at concurrency 1; 8 prompt / 12 output"
                        " tokens, greedy, seed 5")
    assert lines[-1] == "results: /o/results.json"


def test_a_failed_run_gets_its_log_tail_unless_it_failed_at_its_outputs():
    lines = table([a_run(1, "baseline", ok=False, failure={"stage": "start", "message": "exited",
                                                           "log_tail": "one\ntwo"}),
                   a_run(2, "overlay", ok=False, failure={"stage": "workload", "message": "broke", "log_tail": ""}),
                   a_run(3, "short", ok=False, failure={"stage": "outputs", "message": "short", "log_tail": "x"})])
    at = lines.index("run 1 (baseline, repeat 1) FAILED at start: exited")
    assert lines[at + 1:at + 3] == ["    | one", "    | two"]
    at = lines.index("run 2 (overlay, repeat 1) FAILED at workload: broke")
    assert lines[at + 1] == "    | (empty log)"
    at = lines.index("run 3 (short, repeat 1) FAILED at outputs: short")
    assert not lines[at + 1].startswith("    | ")


def test_survivors_and_the_chart_have_their_lines():
    survivor = [{"pid": 7, "cmdline": "x"}]
    lines = table([a_run(1, "baseline", stop={"survivors": survivor})], chart="/o/ratios.png")
    assert f"run 1 (baseline): 1 process(es) SURVIVED the stop: {survivor}" in lines
    assert lines[-2:] == ["chart: /o/ratios.png", "results: /o/results.json"]
    assert not any("SURVIVED" in line for line in table([a_run(1, "baseline")]))


@pytest.mark.parametrize("warmup, line", [
    ({"variant": "baseline", "ok": True, "ready_s": 141.23, "wall_s": 163.49},
     "warm-up (baseline, not measured): ready in 141.2 s, 163.5 s in all"),
    ({"variant": "baseline", "ok": False, "log": "/o/runs/00-warmup/server.log",
      "failure": {"stage": "start", "message": "server exited with code 1 before /health answered"}},
     "warm-up (baseline, not measured) FAILED at start: server exited with code 1 before /health answered (log"
     " /o/runs/00-warmup/server.log); the measured servers ran without it"),
    ({"variant": "overlay", "ok": True, "ready_s": 1.0, "wall_s": 2.0, "stop": {"survivors": [{"pid": 9}]}},
     "warm-up (overlay, not measured): ready in 1.0 s, 2.0 s in all; 1 process(es) SURVIVED the stop: [{'pid': 9}]"),
])
def test_the_warm_up_server_is_one_line_after_the_workload(warmup, line):
    assert table([a_run(1, "baseline")], warmup=warmup)[2] == line


def test_the_outputs_lines_name_the_first_difference_and_a_variants_own_repeats():
    outputs = {"baseline": {"verdict": "reference", "vs_baseline": {"compared": 0}},
               "s2": {"verdict": "differs (allowed: launch arguments change decoding)",
                      "vs_baseline": {"compared": 20, "differing": 3,
                                      "first": {"run": 4, "phase": "batch", "request": 2, "token": 5,
                                                "reference": 11, "got": 12}},
                      "within_variant": {"compared": 10, "differing": 0}},
               "none": {"verdict": "not compared: no run succeeded"}}
    lines = table([a_run(1, "baseline")], outputs=outputs)
    at = lines.index("outputs (request by request against the first baseline run):")
    assert lines[at + 1:at + 4] == [
        "  baseline      reference",
        "  s2            differs (allowed: launch arguments change decoding): 3/20 requests differ; first: run 4, batch"
        " request 2, token 5 (11 vs 12); its own repeats: 0/10 differ",
        "  none          not compared: no run succeeded"]


def test_the_nccl_line_says_what_was_read_and_what_was_missing_or_mismatched():
    check = {"ok": False, "expected": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, "missing": ["NCCL_ALGO"],
             "mismatched": ["NCCL_PROTO"], "processes": 2}
    lines = table([a_run(3, "nccl", nccl_env={"NCCL_PROTO": ["LL128", "Simple"]}, nccl_check=check),
                   a_run(4, "plain", nccl_env={}, nccl_check=dict(check, ok=True, expected={}, missing=[],
                                                                  mismatched=[])),
                   a_run(5, "quiet", nccl_env={"NCCL_P2P_LEVEL": ["SYS"]})])
    assert ("NCCL read (run 3, nccl): NCCL_PROTO=LL128/Simple [2 process(es)]; expected (user + overlay)"
            " NCCL_PROTO=LL, NCCL_ALGO=Ring: MISSING ['NCCL_ALGO'] MISMATCHED ['NCCL_PROTO']") in lines
    assert ("NCCL read (run 4, plain): no variable [2 process(es)]; expected (user + overlay) nothing: all read"
            in lines)
    assert "NCCL read (run 5, quiet): NCCL_P2P_LEVEL=SYS" in lines  # NCCL printed, bench was not told to check
    only_missing = table([a_run(3, "nccl", nccl_env={}, nccl_check=dict(check, mismatched=[]))])
    assert any(line.endswith(": MISSING ['NCCL_ALGO']") for line in only_missing)


def test_the_profile_line_says_each_invariant_or_what_failed():
    profile = {"decode_cycles": 40, "gpu_busy": 0.8, "accept_length": 2.5, "profiler_host_us_per_cycle": 12.5}
    checks = {"phases_sum_ms": 0.375, "cycle_ms": 0.5, "wall_cycle_ms": 0.625, "timed_wall_cycle_ms": None,
              "accept_ratio": 1.0, "phases_le_cycle": True, "cycle_le_wall": True, "accept_within_1pct": True,
              "failed": []}
    good = a_run(3, "profile", profile=profile, profile_checks=checks, metrics={"accept_length_served": 2.5})
    (line,) = [x for x in table([good]) if x.startswith("profile run")]
    assert line == ("profile run 3 (profile): 40 decode cycles; phases 0.375 <= cycle 0.500 <= wall cycle 0.625 ms"
                    " (GPU busy 80%); accept length 2.500 vs SGLang's 2.500 (ratio 1.0000); profiler host 12.5"
                    " us/cycle; invariants hold")
    broken = dict(good, profile=dict(profile, first_skipped="p.jsonl:3: impossible", decode_cycles=None),
                  profile_checks=dict(checks, failed=["cycle_le_wall", "no_impossible_records"],
                                      timed_wall_cycle_ms=0.6))
    (line,) = [x for x in table([broken]) if x.startswith("profile run")]
    assert line.startswith("profile run 3 (profile): no readable record; phases 0.375 <= cycle 0.500 <= timed wall"
                           " cycle 0.600 ms (all cycles: 0.625)")
    assert line.endswith("; INVARIANT FAILED: cycle_le_wall, no_impossible_records (p.jsonl:3: impossible)")
    unchecked = dict(good, profile_checks={})
    (line,) = [x for x in table([unchecked]) if x.startswith("profile run")]
    assert not line.endswith("invariants hold") and "INVARIANT" not in line
    silent = a_run(4, "profile", env={"EAGLE3_PROFILE": "1"})
    assert "profile run 4 (profile): no EAGLE3 profile intervals were written" in table([silent])
    assert not any("profile run" in x for x in table([dict(silent, ok=False, failure={"stage": "start"})]))


def test_the_auto_line_comes_after_the_ratios_once_it_stopped():
    auto = {"target": 0.02, "metric": "batch output tok/s", "budget_s": 60.0, "repeats": 3, "elapsed_s": 60.0,
            "resolvable": {}, "noise_margin": None, "stopped": "failure"}
    lines = table([a_run(1, "baseline")], auto=auto)
    assert "repeats auto: stopped after 3 repeats (1.0 minutes): a server failed (below)" in lines
    assert not any(x.startswith("repeats auto") for x in table([a_run(1, "baseline")], auto=dict(auto, stopped=None)))
    assert "no variant" in auto_text(dict(auto, stopped="budget"))


def test_a_row_without_pairs_and_the_percent_bound():
    from sglang_pcie.tools.bench.report import _ratio_lines

    row = dict(ratio_summary([], True), value_median=None)
    (line,) = [x for x in _ratio_lines({"x": {"m": row}}) if x.startswith("x ")]
    assert line.split() == ["x", "m", "-", "-", "0", "-", "no", "pairs"]
    assert percent(9.99) == "±999.0%" and percent(9.991) == "±>999%" and percent(0.0421) == "±4.2%"


def test_the_schedule_lists_the_warm_up_each_server_and_how_auto_goes_on(tmp_path):
    from sglang_pcie.tools.bench.plan import Plan, Resolve, Workload, resolve_variants

    plan = Plan(variants=resolve_variants(["s2:args=--x 1;env=A='a b'"]), workload=Workload(), launch_args=["--m"],
                server_cmd=["srv"], extra_env={}, host="127.0.0.1", port=31000, repeats=1, out=tmp_path,
                start_timeout=1, stop_timeout=1, request_timeout=1,
                resolve=Resolve(0.05, "batch output tok/s", 5400.0))
    lines = format_schedule(plan).splitlines()
    assert lines[0] == "schedule: 2 variant(s) x 1 repeat(s) = 2 servers, one at a time, order baseline s2"
    assert lines[1].startswith("--repeats auto: then one more repeat at a time until every variant's batch output"
                               " tok/s could resolve ±5.0%; no repeat started that would end past 90 minutes")
    assert "variant s2: tokens may-differ; env A='a b'; extra args --x 1" in lines
    assert "variant baseline: tokens must-match; env SGLANG_PCIE_DISABLE=1; extra args -" in lines
    at = lines.index(f"  0. warm-up: baseline, not measured (warm-up requests, one batch, one streamed request;"
                     f" stopped) -> {tmp_path / 'runs' / '00-warmup'}")
    assert lines[at + 2] == "     cmd: srv --m --host 127.0.0.1 --port 31000"
    assert f"  2. s2 (repeat 1) -> {tmp_path / 'runs' / '02-s2'}" in lines
    assert lines[-1] == f"(ports: the first free one from 31000; results in {tmp_path}/results.json)"
    plan.warmup, plan.resolve = False, None
    lines = format_schedule(plan).splitlines()
    assert lines[1] == "warm-up server: none (--no-warmup)" and not any("0. warm-up" in x for x in lines)


def test_a_chart_with_no_variant_besides_baseline_is_skipped(tmp_path):
    pytest.importorskip("matplotlib")
    assert write_chart({"repeats": 1, "ratios": {"baseline": {}}}, tmp_path / "r.png") == (
        "skipped: no variant besides baseline")
    assert not (tmp_path / "r.png").exists()
