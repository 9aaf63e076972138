"""sglang-pcie bench (variants, counterbalanced order, ratios, output comparison, report, process-tree stop) against
a fake server process started exactly as a real launch_server would be, and make-test-models against SGLang's real
config parsing and weight loaders."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from support import REPO, SUPPORT

from sglang_pcie.tools import bench
from sglang_pcie.tools.cli import main as cli_main

FAKE = f"{sys.executable} {SUPPORT / 'fake_sglang_server.py'}"
SMALL = ["--concurrency", "4", "--batch-requests", "8", "--stream-requests", "2", "--input-len", "8",
         "--output-len", "12", "--stop-timeout", "3", "--start-timeout", "60", "--port", "31200"]


def run_bench(capsys, tmp_path, *argv, launch=("--model-path", "/models/none")):
    out = tmp_path / "out"
    code = cli_main(["bench", *SMALL, "--server-cmd", FAKE, "--out", str(out), *argv, "--", *launch])
    stdout, stderr = capsys.readouterr()
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else None
    return code, stdout, stderr, results


# ------------------------------------------------------------------------------------------------ variants

def test_builtin_variants():
    assert bench.parse_variant("baseline").env == {"SGLANG_PCIE_DISABLE": "1"}
    assert bench.parse_variant("overlay").env == {}
    assert bench.parse_variant("profile").env == {"EAGLE3_PROFILE": "1"}


def test_user_variants_env_args_base_tokens_repeats():
    steps = bench.parse_variant("steps2:args=--speculative-num-steps 2 --speculative-num-draft-tokens 3")
    assert steps.args == ("--speculative-num-steps", "2", "--speculative-num-draft-tokens", "3")
    assert (steps.env, steps.base, steps.tokens, steps.repeats) == ({}, "overlay", "may-differ", None)
    nccl = bench.parse_variant("nccl-pcie:env=SGLANG_PCIE_NCCL_PROFILE=pcie NCCL_DEBUG=INFO")
    assert nccl.env == {"SGLANG_PCIE_NCCL_PROFILE": "pcie", "NCCL_DEBUG": "INFO"}
    assert (nccl.args, nccl.tokens) == ((), "must-match")
    both = bench.parse_variant("p5:base=profile;env=A='x y';args=--speculative-num-steps 5;tokens=must-match;"
                               "repeats=1")
    assert both.env == {"EAGLE3_PROFILE": "1", "A": "x y"} and both.profiling
    assert (both.args, both.tokens, both.repeats) == (("--speculative-num-steps", "5"), "must-match", 1)
    off = bench.parse_variant("off-nccl:base=baseline;env=SGLANG_PCIE_NCCL_PROFILE=off")
    assert off.env == {"SGLANG_PCIE_DISABLE": "1", "SGLANG_PCIE_NCCL_PROFILE": "off"}


@pytest.mark.parametrize("spec, named", [
    ("nonesuch", "'nonesuch'"),
    ("bad name:env=A=1", "'bad name'"),
    ("x:env=A", "'A'"),
    ("x:env=1A=2", "'1A=2'"),
    ("x:colour=red", "'colour=red'"),
    ("x:base=fast", "base='fast'"),
    ("x:tokens=maybe", "tokens='maybe'"),
    ("x:repeats=0;env=A=1", "repeats='0'"),
    ("x:args='unclosed", "args="),
    ("x:env=A=1;env=B=2", "env= given twice"),
    ("profile:env=A=1", "built-in"),
    ("x:", "gives no env="),
])
def test_bad_variant_is_one_line_exit_2(capsys, spec, named):
    code = cli_main(["bench", "--variant", spec, "--dry-run", "--", "--model-path", "m"])
    _, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and named in err and "bench: error:" in err


@pytest.mark.parametrize("argv, named", [
    (["--variant", "overlay", "--variant", "overlay"], "given twice"),
    (["--variant", "x:env=A=1;repeats=4"], "more than --repeats 3"),
    (["--env", "NOEQUALS"], "'NOEQUALS'"),
    (["--env", "EAGLE3_PROFILE=1"], "EAGLE3_PROFILE"),
    (["--token-range", "9:3"], "'9:3'"),
    (["--concurrency", "0"], "--concurrency 0"),
    (["--stream-requests", "-1"], "--stream-requests -1: must be an integer >= 0"),
    (["--port", "0"], "--port 0"),
    (["--port", "65400"], "--port 65400"),
    (["--start-timeout", "0"], "--start-timeout 0"),
    (["--stop-timeout", "-1"], "--stop-timeout -1"),
    (["--request-timeout", "nan"], "--request-timeout nan"),
])
def test_bad_options_exit_2(capsys, argv, named):
    code = cli_main(["bench", *argv, "--dry-run", "--", "--model-path", "m"])
    _, err = capsys.readouterr()
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1


def test_port_in_launch_args_and_missing_launch_args_exit_2(capsys):
    assert cli_main(["bench", "--dry-run", "--", "--model-path", "m", "--port", "1"]) == 2
    assert "--port" in capsys.readouterr().err
    assert cli_main(["bench", "--dry-run"]) == 2
    assert "after '--'" in capsys.readouterr().err


def test_baseline_always_first():
    names = [v.name for v in bench.resolve_variants(["profile", "overlay"])]
    assert names == ["baseline", "profile", "overlay"]
    assert [v.name for v in bench.resolve_variants(["overlay", "baseline"])] == ["baseline", "overlay"]
    assert [v.name for v in bench.resolve_variants([])] == ["baseline", "overlay"]


# ---------------------------------------------------------------------------------------------- ordering

def test_counterbalanced_order():
    order = bench.counterbalanced(["A", "B", "C"], 3)
    assert [n for _, n in order] == list("ABCCBAABC")
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # every variant's mean position is the same over an even number of repeats: a linear drift cancels
    order = bench.counterbalanced(["A", "B", "C"], 4)
    positions = {n: [i for i, (_, m) in enumerate(order) if m == n] for n in "ABC"}
    assert len({sum(p) for p in positions.values()}) == 1


def test_variant_with_fewer_repeats_runs_in_the_last_ones():
    order = bench.counterbalanced(["A", "B", "S"], 3, {"S": 1})
    assert [n for _, n in order] == list("ABBAABS")
    assert [r for r, n in order if n == "S"] == [2]


def test_dry_run_prints_schedule_and_starts_nothing(capsys, tmp_path):
    code = cli_main(["bench", "--dry-run", "--repeats", "2", "--server-cmd", "/nonexistent/server",
                     "--variant", "profile", "--variant", "s2:args=--speculative-num-steps 2",
                     "--env", "NCCL_DEBUG=INFO", "--out", str(tmp_path / "o"), "--", "--model-path", "/m"])
    out, _ = capsys.readouterr()
    assert code == 0 and not (tmp_path / "o").exists()
    assert "order baseline profile s2 s2 profile baseline" in out
    assert "/nonexistent/server --model-path /m --speculative-num-steps 2 --host 127.0.0.1 --port 30000" in out
    assert "env: NCCL_DEBUG=INFO SGLANG_PCIE_DISABLE=1" in out
    assert re.search(r"EAGLE3_PROFILE_FILE=\S+/runs/02-profile/eagle3-profile.jsonl", out)


# ---------------------------------------------------------------------------------------- ratios, verdicts

def test_ratio_summary_and_verdicts():
    noisy = bench.ratio_summary([0.97, 1.02, 0.99], higher_is_better=True)
    assert noisy["median"] == 0.99 and (noisy["min"], noisy["max"]) == (0.97, 1.02)
    assert noisy["verdict"] == "within noise"
    assert bench.ratio_summary([0.82, 0.86, 0.88], True)["verdict"] == "lower (worse)"
    assert bench.ratio_summary([0.82, 0.86, 0.88], False)["verdict"] == "lower (better)"
    assert bench.ratio_summary([1.1, 1.2], False)["verdict"] == "higher (worse)"
    assert bench.ratio_summary([1.0, 1.3], True)["verdict"] == "within noise"  # touching 1.0 is crossing it
    assert bench.ratio_summary([1.05], True)["verdict"] == "one pair: no spread"
    assert bench.ratio_summary([], True)["verdict"] == "no pairs"


def record(index, repeat, variant, tok_s, ok=True, outputs=None):
    return {"index": index, "repeat": repeat, "variant": variant, "ok": ok, "env": {},
            "metrics": {"batch": {"output_tok_s": tok_s}, "stream": {}, "accept_length": None},
            "outputs": outputs or {"batch": [[1, 2, 3]], "stream": [[4, 5]]}}


def test_ratios_pair_runs_of_one_repeat_and_skip_failed_runs():
    variants = bench.resolve_variants(["profile"])
    records = [record(1, 1, "baseline", 100.0), record(2, 1, "profile", 86.0),
               record(3, 2, "profile", 90.0), record(4, 2, "baseline", 100.0),
               record(5, 3, "baseline", 50.0), record(6, 3, "profile", 0.0, ok=False)]
    table = bench.compute_ratios(records, variants)
    row = table["profile"]["batch output tok/s"]
    assert row["ratios"] == [0.86, 0.9] and row["n"] == 2
    assert row["median"] == pytest.approx(0.88) and row["verdict"] == "lower (worse)"
    assert table["baseline"]["batch output tok/s"]["value_median"] == 100.0
    # identical servers' own spread around their median: the noise floor the ratios must be read against
    assert table["baseline"]["batch output tok/s"]["spread"] == [0.5, 1.0]
    assert "spread" not in table["baseline"]["c=1 TTFT p50 ms"]
    assert table["profile"]["c=1 TTFT p50 ms"]["verdict"] == "no pairs"


# ------------------------------------------------------------------------------------------- outputs

def test_first_difference():
    ref = {"batch": [[1, 2, 3], [4, 5, 6]], "stream": [[7, 8]]}
    assert bench.first_difference(ref, ref) == (3, 0, None)
    got = {"batch": [[1, 2, 3], [4, 9, 6]], "stream": [[7]]}
    compared, differing, first = bench.first_difference(ref, got)
    assert (compared, differing) == (3, 2)
    assert first == {"phase": "batch", "request": 1, "token": 1, "reference": 5, "got": 9}
    _, _, short = bench.first_difference({"batch": [], "stream": [[7, 8]]}, {"batch": [], "stream": [[7]]})
    assert short["token"] == 1 and short["got"] is None
    _, _, missing = bench.first_difference(ref, {"batch": [[1, 2, 3]], "stream": [[7, 8]]})
    assert missing["detail"] == "missing output" and missing["request"] == 1


def test_compare_outputs_must_match_and_may_differ():
    variants = bench.resolve_variants(["overlay", "s2:args=--x 1"])
    same = {"batch": [[1, 2, 3]], "stream": [[4, 5]]}
    other = {"batch": [[1, 2, 9]], "stream": [[4, 5]]}
    records = [record(1, 1, "baseline", 1, outputs=same), record(2, 1, "overlay", 1, outputs=other),
               record(3, 1, "s2", 1, outputs=other), record(4, 2, "s2", 1, outputs=other),
               record(5, 2, "overlay", 1, outputs=same), record(6, 2, "baseline", 1, outputs=same)]
    result = bench.compare_outputs(records, variants)
    assert result["baseline"]["verdict"] == "identical"
    assert result["overlay"]["verdict"] == "DIFFERENT"
    assert result["overlay"]["vs_baseline"]["differing"] == 1
    assert result["overlay"]["vs_baseline"]["first"] == {"phase": "batch", "request": 0, "token": 2,
                                                         "reference": 3, "got": 9, "run": 2}
    assert result["s2"]["verdict"].startswith("differs (allowed")
    assert result["s2"]["within_variant"] == {"compared": 2, "differing": 0}


# -------------------------------------------------------------------------------- end to end, fake server

def test_bench_end_to_end(capsys, tmp_path):
    code, out, err, results = run_bench(
        capsys, tmp_path, "--repeats", "2", "--variant", "overlay", "--variant", "profile",
        "--variant", "s2:args=--fake-shift 1", "--variant", "nccl:env=NCCL_PROTO=LL;repeats=1",
        "--env", "FAKE_ACCEPT=3", "--env", "FAKE_BATCH=4", "--env", "NCCL_DEBUG=INFO", "--env", "NCCL_DEBUG_SUBSYS=ENV")
    assert code == 0, out + err
    runs = results["runs"]
    assert [r["variant"] for r in runs] == ["baseline", "overlay", "profile", "s2",
                                            "nccl", "s2", "profile", "overlay", "baseline"]
    assert all(r["ok"] and r["stop"]["survivors"] == [] for r in runs)
    # each server got exactly its variant's environment and arguments, launched as launch_server would be
    env_of = {r["variant"]: r["model_info"]["env"] for r in runs}
    debug = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV", "FAKE_ACCEPT": "3", "FAKE_BATCH": "4"}
    assert env_of["baseline"] == {"SGLANG_PCIE_DISABLE": "1", **debug}
    assert {k: v for k, v in env_of["overlay"].items() if k != "SGLANG_PCIE_NCCL_DECIDED"} == debug
    assert env_of["profile"]["EAGLE3_PROFILE"] == "1"
    assert env_of["profile"]["EAGLE3_PROFILE_FILE"].endswith("eagle3-profile.jsonl")
    s2 = next(r for r in runs if r["variant"] == "s2")
    assert s2["model_info"]["argv"][:4] == ["--model-path", "/models/none", "--fake-shift", "1"]
    assert s2["model_info"]["argv"][-4:] == ["--host", "127.0.0.1", "--port", str(s2["port"])]
    # measures: 8 + 2 requests of 12 tokens, accept length from meta info, the profile read back
    batch = runs[0]["metrics"]["batch"]
    assert (batch["requests"], batch["output_tokens"], batch["short_outputs"]) == (8, 96, 0)
    # SGLang's own log figure, from the lines logged during the batch phase with 4 requests running: the fake
    # decodes in batches of 4 (FAKE_BATCH), so each of the 8 batch requests logs one such line, however the
    # client's threads were scheduled
    assert batch["server_log_lines"] == 8 and batch["server_gen_tok_s_p50"] == pytest.approx(4 * 3 / 0.0005)
    assert runs[0]["metrics"]["accept_length"] == pytest.approx(3.0)
    stream = runs[0]["metrics"]["stream"]
    assert stream["ttft_ms_p50"] > 0 and stream["tpot_ms_p50"] > 0
    assert stream["tokens_per_chunk"] == pytest.approx(12 / 5)  # the prefill token, then 3 + 3 + 3 + 2
    profile = next(r for r in runs if r["variant"] == "profile")
    assert profile["profile"]["accept_length"] == pytest.approx(profile["metrics"]["accept_length_served"])
    # the profile saw the warm-up too (15 decode tokens in 5 cycles), and counts decode tokens only: compared with
    # SGLang's figure over all the server served, without each request's prefill token
    assert runs[0]["metrics"]["accept_length_served"] == pytest.approx((4 * 15 + 10 * 11) / (4 * 5 + 10 * 4))
    checks = profile["profile_checks"]
    assert checks["accept_ratio"] == pytest.approx(1.0) and checks["failed"] == []
    assert checks["phases_le_cycle"] and checks["cycle_le_wall"] and checks["accept_within_1pct"]
    assert checks["no_forced_waits"] and checks["one_run_tp_rank_0"]
    assert "profile" not in runs[0]
    nccl_run = next(r for r in runs if r["variant"] == "nccl")
    assert nccl_run["nccl_env"] == {"NCCL_PROTO": ["LL"]}
    assert nccl_run["nccl_check"] == {"ok": True, "expected": {"NCCL_PROTO": "LL"}, "missing": [], "mismatched": [],
                                      "processes": 1}
    # ratios and output comparison
    assert results["ratios"]["overlay"]["batch output tok/s"]["n"] == 2
    assert results["ratios"]["nccl"]["batch output tok/s"]["verdict"] == "one pair: no spread"
    assert results["outputs"]["overlay"]["verdict"] == "identical"
    assert results["outputs"]["overlay"]["vs_baseline"] == {"reference_run": 1, "compared": 20, "differing": 0,
                                                           "first": None}
    assert results["outputs"]["s2"]["verdict"].startswith("differs (allowed")
    assert results["outputs"]["s2"]["within_variant"]["differing"] == 0
    # the report: table on stdout, progress on stderr, per-server logs, results.json, chart or why not
    assert re.search(r"^overlay +batch output tok/s +[\d.]+ +[\d.]+ \[[\d.]+-[\d.]+\] +2 ", out, re.M)
    assert "overlay       identical: 0/20 requests differ" in out
    assert ("NCCL read (run 5, nccl): NCCL_PROTO=LL [1 process(es)]; expected (user + overlay) NCCL_PROTO=LL:"
            " all read") in out
    assert re.search(r"profile run 3 \(profile\): \d+ decode cycles; phases 0.375 <= cycle 0.500 <= wall cycle"
                     r" 0.625 ms \(GPU busy 80%\); accept length [\d.]+ vs SGLang's [\d.]+ \(ratio 1.0000\);"
                     r" profiler host 12.5 us/cycle; invariants hold", out)
    assert "9/9 baseline (repeat 2): stopped" in err and "ready in" in err
    assert (tmp_path / "out" / "progress.log").read_text().count("stopped") == 9
    assert "fake: serving on" in Path(runs[0]["log"]).read_text()
    assert results["complete"] is True
    assert results["chart"].endswith("ratios.png") or results["chart"].startswith("skipped: matplotlib")
    # --report re-reads the folder
    assert cli_main(["bench", "--report", str(tmp_path / "out")]) == 0
    assert "overlay       identical: 0/20 requests differ" in capsys.readouterr().out


def test_changed_tokens_are_reported(capsys, tmp_path):
    code, out, _, results = run_bench(capsys, tmp_path, "--repeats", "1", "--variant", "x:env=FAKE_DIFFER_EVERY=2")
    entry = results["outputs"]["x"]
    assert code == 1 and entry["verdict"] == "DIFFERENT"
    assert 0 < entry["vs_baseline"]["differing"] < entry["vs_baseline"]["compared"] == 10
    assert entry["vs_baseline"]["first"]["token"] == 3
    assert re.search(r"x +DIFFERENT: \d+/10 requests differ; first: run 2, \w+ request \d+, token 3", out)


def test_failed_start_reports_log_tail_and_others_run(capsys, tmp_path):
    code, out, err, results = run_bench(capsys, tmp_path, "--repeats", "2", "--variant", "overlay",
                                        "--variant", "broken:env=FAKE_FAIL_START=1")
    assert code == 1
    broken = [r for r in results["runs"] if r["variant"] == "broken"]
    assert len(broken) == 2 and not any(r["ok"] for r in broken)
    assert broken[0]["failure"]["stage"] == "start"
    assert "exited with code 3" in broken[0]["failure"]["message"]
    assert "boom: the model does not fit" in broken[0]["failure"]["log_tail"]
    assert all(r["ok"] for r in results["runs"] if r["variant"] != "broken")
    assert results["ratios"]["overlay"]["batch output tok/s"]["n"] == 2
    assert results["ratios"]["broken"]["batch output tok/s"]["verdict"] == "no pairs"
    assert "FAILED at start" in out and "    | fake: boom: the model does not fit" in out
    assert "broken (repeat 1): FAILED (start)" in err


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_whole_process_tree_is_stopped(capsys, tmp_path):
    code, _, err, results = run_bench(capsys, tmp_path, "--repeats", "1", "--variant",
                                      "kids:env=FAKE_STUBBORN_CHILD=1 FAKE_ESCAPED_CHILD=1")
    run = next(r for r in results["runs"] if r["variant"] == "kids")
    log = Path(run["log"]).read_text()
    pids = [int(p) for p in re.findall(r"child pid (\d+)", log)]
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)  # SIGTERM-ignoring and session-leaving children alike
    assert set(pids) <= set(run["stop"]["sigkilled"])
    assert run["stop"]["survivors"] == [] and run["stop"]["processes"] == 3
    assert code == 0 and "(SIGKILL needed)" in err


def test_survivor_is_reported(monkeypatch, capsys, tmp_path):
    # A process that cannot be killed (here: the escaped child, which bench is kept from signalling) is named,
    # and fails the run.
    from sglang_pcie.tools import processes

    real_signal = processes._signal

    def sparing_the_escaped_child(pid, sig):
        if "sleep(600)" not in processes._cmdline(pid):
            real_signal(pid, sig)

    monkeypatch.setattr(processes, "_signal", sparing_the_escaped_child)
    monkeypatch.setattr(processes, "KILL_WAIT_S", 1.0)
    code, out, _, results = run_bench(capsys, tmp_path, "--repeats", "1", "--variant", "kids:env=FAKE_ESCAPED_CHILD=1")
    for r in results["runs"]:
        for s in r["stop"]["survivors"]:
            os.kill(s["pid"], signal.SIGKILL)
    survivors = [s for r in results["runs"] for s in r["stop"]["survivors"]]
    assert code == 1 and survivors and "SURVIVED the stop" in out


def test_chart_when_matplotlib_is_importable(tmp_path):
    pytest.importorskip("matplotlib")
    results = {"repeats": 2, "ratios": {"baseline": {}, "overlay": {label: bench.ratio_summary([0.98, 1.01], True)
                                                                    for _, _, label, _ in bench.METRICS}}}
    path = bench.write_chart(results, tmp_path / "r.png")
    assert path == str(tmp_path / "r.png") and (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_nccl_values_the_overlay_chose_are_checked_against_what_nccl_read(capsys, tmp_path):
    from sglang_pcie.runtime.nccl import PCIE_PROFILE

    code, out, _, results = run_bench(
        capsys, tmp_path, "--repeats", "1", "--variant", "pcie:env=SGLANG_PCIE_NCCL_PROFILE=pcie",
        "--variant", "deaf:env=SGLANG_PCIE_NCCL_PROFILE=pcie FAKE_NCCL_IGNORES=NCCL_PROTO",
        "--variant", "off:base=baseline;env=SGLANG_PCIE_NCCL_PROFILE=pcie",
        "--env", "NCCL_DEBUG=INFO", "--env", "NCCL_NVLS_ENABLE=0")
    runs = {r["variant"]: r for r in results["runs"]}
    assert code == 0
    assert runs["pcie"]["nccl_check"]["ok"] and runs["pcie"]["nccl_check"]["expected"] == {"NCCL_NVLS_ENABLE": "0",
                                                                                         **PCIE_PROFILE}
    assert runs["deaf"]["nccl_check"]["missing"] == ["NCCL_PROTO"] and not runs["deaf"]["nccl_check"]["ok"]
    assert "MISSING ['NCCL_PROTO']" in out
    # switched off, the overlay chooses nothing: NCCL reads only what the user set
    assert runs["off"]["nccl_check"] == {"ok": True, "expected": {"NCCL_NVLS_ENABLE": "0"}, "missing": [],
                                         "mismatched": [], "processes": 1}
    assert runs["off"]["nccl_env"] == {"NCCL_NVLS_ENABLE": ["0"]}


def test_nccl_version_exported_by_container_images_is_not_expected_to_be_read():
    # The 2 x H200 image exports NCCL_VERSION=2.28.3-1; NCCL never reports reading it, so it is no evidence either way.
    env = {"NCCL_VERSION": "2.28.3-1", "NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "INFO", "SGLANG_PCIE_DISABLE": "1"}
    assert bench.expected_nccl(env) == {"NCCL_NVLS_ENABLE": "0"}


def test_inherited_decision_marker_is_not_passed_on():
    from sglang_pcie.runtime.nccl import DECIDED_VAR

    assert DECIDED_VAR in bench.CONTROLLED_VARS


def test_profile_invariant_failure_fails_the_run(capsys, tmp_path):
    code, out, _, results = run_bench(capsys, tmp_path, "--repeats", "1", "--variant",
                                      "p:base=profile;env=FAKE_PROFILE_WALL_RATIO=0.5")
    checks = next(r for r in results["runs"] if r["variant"] == "p")["profile_checks"]
    assert checks["failed"] == ["cycle_le_wall"] and checks["phases_le_cycle"] is True
    assert code == 1 and "INVARIANT FAILED: cycle_le_wall" in out


def test_profile_checks_math():
    ok = bench.profile_checks({"phases_sum_ms": 3.0, "cycle_ms": 4.0, "wall_cycle_ms": 6.0, "accept_length": 2.019},
                              2.0)
    assert ok["failed"] == [] and ok["accept_ratio"] == pytest.approx(1.0095)
    off = bench.profile_checks({"phases_sum_ms": 4.5, "cycle_ms": 4.0, "wall_cycle_ms": 6.0, "accept_length": 2.1},
                               2.0)
    assert off["failed"] == ["phases_le_cycle", "accept_within_1pct"]
    unknown = bench.profile_checks({"accept_length": None}, None)
    assert unknown["failed"] == [] and unknown["cycle_le_wall"] is None
    # cycle_ms is a sampled mean: 5% over the wall cycle passes, more fails; forced waits or a second rank fail
    assert bench.profile_checks({"cycle_ms": 5.2, "wall_cycle_ms": 5.0}, None)["cycle_le_wall"] is True
    assert bench.profile_checks({"cycle_ms": 5.3, "wall_cycle_ms": 5.0}, None)["failed"] == ["cycle_le_wall"]
    two = bench.profile_checks({"syncs": 3, "runs_in_file": 2, "ranks": {"tp_rank": [0, 1]}}, None)
    assert two["failed"] == ["no_forced_waits", "one_run_tp_rank_0"]


def test_sglang_accept_length_with_and_without_the_prefill_token():
    served = [{"meta_info": {"completion_tokens": 16, "spec_verify_ct": 5}},
              {"meta_info": {"completion_tokens": 7, "spec_verify_ct": 2}},
              {"meta_info": {"completion_tokens": 9}}]  # not speculative: left out
    assert bench.accept_length(served) == pytest.approx(23 / 7)
    assert bench.accept_length(served, decode_only=True) == pytest.approx(21 / 7)
    assert bench.accept_length(served[2:]) is None


def test_missing_server_command_is_a_failed_start(capsys, tmp_path):
    out = tmp_path / "out"
    code = cli_main(["bench", *SMALL, "--repeats", "1", "--server-cmd", str(tmp_path / "no-such-server"),
                     "--out", str(out), "--", "--model-path", "m"])
    stdout, _ = capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    assert code == 1 and all(r["failure"]["stage"] == "start" for r in results["runs"])
    assert "cannot start" in stdout and "no-such-server" in stdout


def test_sigterm_to_bench_stops_the_server_tree(tmp_path):
    import subprocess

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PCIE_", "EAGLE3_", "FAKE_", "NCCL_"))}
    env.update(FAKE_START_DELAY="120", FAKE_STUBBORN_CHILD="1")  # never ready while the test runs
    bench_proc = subprocess.Popen([sys.executable, "-m", "sglang_pcie", "bench", *SMALL, "--repeats", "1",
                                   "--server-cmd", FAKE, "--out", str(out), "--", "--model-path", "m"],
                                  cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
    log = out / "runs" / "01-baseline" / "server.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.is_file() and "serving on" in log.read_text()):
        time.sleep(0.2)
    pids = [int(p) for p in re.findall(r"child pid (\d+)", log.read_text())]
    bench_proc.send_signal(signal.SIGTERM)
    _, err = bench_proc.communicate(timeout=60)
    assert bench_proc.returncode == 130 and f"interrupted; partial results in {out / 'results.json'}" in err
    results = json.loads((out / "results.json").read_text())  # saved although the first server never answered
    assert results["complete"] is False and [r["failure"]["stage"] for r in results["runs"]] == ["interrupted"]
    assert "1/2 baseline (repeat 1): stopped 2 processes" in err and "(SIGKILL needed)" in err
    assert len(pids) == 1 and not _alive(pids[0])


def test_server_decode_stats_reads_sglang_log_lines(tmp_path):
    log = tmp_path / "server.log"
    lines = ["[2026-11-30 10:00:00 TP0] Decode batch, #running-req: 32, #token: 9000, token usage: 0.01, accept len:"
             " 1.50, accept rate: 0.17, cuda graph: True, gen throughput (token/s): %s, #queue-req: 0" % v
             for v in ("5000.00", "5200.00", "4800.00")]
    lines.insert(1, "[2026-11-30 10:00:00 TP0] Decode batch, #running-req: 7, #token: 900, cuda graph: True,"
                    " gen throughput (token/s): 900.00, #queue-req: 0")
    log.write_text("before\n" + "\n".join(lines) + "\n")
    stats = bench.server_decode_stats(log, len("before\n"), log.stat().st_size, 32)
    assert stats == {"lines": 3, "gen_tok_s_p50": 5000.0, "accept_len_mean": 1.5}
    assert bench.server_decode_stats(log, 0, 7, 32)["lines"] == 0


# ------------------------------------------------------------------------------------------ malformed replies

@pytest.fixture
def canned_server():
    """A /generate that answers whatever body the test sets (a malformed SGLang, in-process)."""
    import http.server
    import threading

    reply = {"body": b""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply["body"])))
            self.end_headers()
            self.wfile.write(reply["body"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield reply, server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("body, named", [
    ({"output_ids": None, "meta_info": {}}, "output_ids that are not a list"),
    ({"output_ids": [1, "x"]}, "output_ids that are not a list"),
    ({"output_ids": [1], "meta_info": [1]}, "meta_info that is not an object"),
    ({"output_ids": [1], "meta_info": {"spec_verify_ct": "3"}}, "spec_verify_ct='3'"),
    ([1, 2], "answered without output_ids"),
])
def test_a_malformed_reply_is_a_request_error(canned_server, body, named):
    reply, port = canned_server
    reply["body"] = json.dumps(body).encode()
    with pytest.raises(bench.RequestError, match=re.escape(named)):
        bench.generate("127.0.0.1", port, [1, 2], 4, 5)


@pytest.mark.parametrize("chunk, named", [
    ("[1, 2]", "answered list, not an object"),
    ('"text"', "answered str, not an object"),
    ('{"output_ids": 7}', "output_ids that are not a list"),
    ('{"output_ids": [1], "meta_info": {"completion_tokens": 1.5}}', "completion_tokens=1.5"),
])
def test_a_malformed_stream_chunk_is_a_request_error(canned_server, chunk, named):
    reply, port = canned_server
    reply["body"] = f"data: {chunk}\n\ndata: [DONE]\n\n".encode()
    with pytest.raises(bench.RequestError, match=re.escape(named)):
        bench.generate_stream("127.0.0.1", port, [1, 2], 4, 5)


def test_well_formed_replies_still_parse(canned_server):
    reply, port = canned_server
    reply["body"] = json.dumps({"output_ids": [5, 6], "meta_info": {"completion_tokens": 2}}).encode()
    assert bench.generate("127.0.0.1", port, [1], 2, 5)["output_ids"] == [5, 6]
    reply["body"] = (b'data: {"output_ids": [5], "meta_info": {"completion_tokens": 1}}\n\n'
                     b'data: {"output_ids": [5, 6], "meta_info": {"completion_tokens": 2}}\n\ndata: [DONE]\n\n')
    result = bench.generate_stream("127.0.0.1", port, [1], 2, 5)
    assert result["output_ids"] == [5, 6] and len(result["arrivals"]) == 2


def test_an_interrupt_before_any_result_does_not_point_at_a_missing_file(capsys, tmp_path, monkeypatch):
    def interrupted(plan):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_plan", interrupted)
    code = cli_main(["bench", "--out", str(tmp_path / "out"), "--server-cmd", FAKE, "--", "--model-path", "m"])
    assert code == 130 and "interrupted; no results written" in capsys.readouterr().err


def test_results_json_is_strict_json(tmp_path):
    bench.save({"ratio": float("nan"), "runs": [{"tok_s": float("inf"), "ok": True, "n": 3, "log": tmp_path}]},
               tmp_path)
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    saved = json.loads(text, parse_constant=lambda name: pytest.fail(f"non-strict JSON constant {name}"))
    assert saved == {"ratio": None, "runs": [{"tok_s": None, "ok": True, "n": 3, "log": str(tmp_path)}]}
