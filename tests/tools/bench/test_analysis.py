"""What bench concludes: ratios paired by repeat, outputs compared request by request (also end to end against the
fake server), NCCL's variables against what the overlay chose, a profiled server's invariants."""
from __future__ import annotations

import re

import pytest

from sglang_pcie.patches.eagle3_profile.records import SCHEMA_FAMILY, to_json
from sglang_pcie.tools.bench.analysis import (compare_outputs, compute_ratios, exit_code, expected_nccl,
                                              first_difference, nccl_debug_env, nccl_env_lines, profile_checks,
                                              read_profile)
from sglang_pcie.tools.bench.plan import resolve_variants
from support.eagle_records import interval_stats


def record(index, repeat, variant, tok_s, ok=True, outputs=None):
    return {"index": index, "repeat": repeat, "variant": variant, "ok": ok, "env": {},
            "metrics": {"batch": {"output_tok_s": tok_s}, "stream": {}, "accept_length": None},
            "outputs": outputs or {"batch": [[1, 2, 3]], "stream": [[4, 5]]}}


def test_ratios_pair_runs_of_one_repeat_and_skip_failed_runs():
    variants = resolve_variants(["profile"])
    records = [record(1, 1, "baseline", 100.0), record(2, 1, "profile", 86.0),
               record(3, 2, "profile", 90.0), record(4, 2, "baseline", 100.0),
               record(5, 3, "baseline", 50.0), record(6, 3, "profile", 0.0, ok=False)]
    table = compute_ratios(records, variants)
    row = table["profile"]["batch output tok/s"]
    assert row["ratios"] == [0.86, 0.9] and row["n"] == 2
    # two pairs: a t interval 12.7 standard errors wide; and the baselines' own spread is 2x (test_verdicts.py)
    assert row["median"] == pytest.approx(0.88) and row["verdict"] == "within noise"
    assert table["baseline"]["batch output tok/s"]["value_median"] == 100.0
    # identical servers' own spread around their median: the noise floor the ratios must be read against
    assert table["baseline"]["batch output tok/s"]["spread"] == [0.5, 1.0]
    assert "spread" not in table["baseline"]["c=1 TTFT p50 ms"]
    assert table["profile"]["c=1 TTFT p50 ms"]["verdict"] == "no pairs"


def test_first_difference():
    ref = {"batch": [[1, 2, 3], [4, 5, 6]], "stream": [[7, 8]]}
    assert first_difference(ref, ref) == (3, 0, None)
    got = {"batch": [[1, 2, 3], [4, 9, 6]], "stream": [[7]]}
    compared, differing, first = first_difference(ref, got)
    assert (compared, differing) == (3, 2)
    assert first == {"phase": "batch", "request": 1, "token": 1, "reference": 5, "got": 9}
    _, _, short = first_difference({"batch": [], "stream": [[7, 8]]}, {"batch": [], "stream": [[7]]})
    assert short["token"] == 1 and short["got"] is None
    _, _, missing = first_difference(ref, {"batch": [[1, 2, 3]], "stream": [[7, 8]]})
    assert missing["detail"] == "missing output" and missing["request"] == 1


def test_compare_outputs_must_match_and_may_differ():
    variants = resolve_variants(["overlay", "s2:args=--x 1"])
    same = {"batch": [[1, 2, 3]], "stream": [[4, 5]]}
    other = {"batch": [[1, 2, 9]], "stream": [[4, 5]]}
    records = [record(1, 1, "baseline", 1, outputs=same), record(2, 1, "overlay", 1, outputs=other),
               record(3, 1, "s2", 1, outputs=other), record(4, 2, "s2", 1, outputs=other),
               record(5, 2, "overlay", 1, outputs=same), record(6, 2, "baseline", 1, outputs=same)]
    result = compare_outputs(records, variants)
    assert result["baseline"]["verdict"] == "identical"
    assert result["overlay"]["verdict"] == "DIFFERENT"
    assert result["overlay"]["vs_baseline"]["differing"] == 1
    assert result["overlay"]["vs_baseline"]["first"] == {"phase": "batch", "request": 0, "token": 2,
                                                         "reference": 3, "got": 9, "run": 2}
    assert result["s2"]["verdict"].startswith("differs (allowed")
    assert result["s2"]["within_variant"] == {"compared": 2, "differing": 0}


def test_changed_tokens_are_reported(run_bench):
    code, out, _, results = run_bench("--repeats", "1", "--variant", "x:env=FAKE_DIFFER_EVERY=2")
    entry = results["outputs"]["x"]
    assert code == 1 and entry["verdict"] == "DIFFERENT"
    assert 0 < entry["vs_baseline"]["differing"] < entry["vs_baseline"]["compared"] == 10
    assert entry["vs_baseline"]["first"]["token"] == 3
    assert re.search(r"x +DIFFERENT: \d+/10 requests differ; first: run 2, \w+ request \d+, token 3", out)


def test_nccl_values_the_overlay_chose_are_checked_against_what_nccl_read(run_bench):
    from sglang_pcie.runtime.nccl import PCIE_PROFILE

    code, out, _, results = run_bench(
        "--repeats", "1", "--variant", "pcie:env=SGLANG_PCIE_NCCL_PROFILE=pcie",
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
    assert expected_nccl(env) == {"NCCL_NVLS_ENABLE": "0"}


def test_profile_invariant_failure_fails_the_run(run_bench):
    code, out, _, results = run_bench("--repeats", "1", "--variant",
                                      "p:base=profile;env=FAKE_PROFILE_WALL_RATIO=0.5")
    # the fake's records put the cycle above its own wall time: profile-report skips them as impossible, and the
    # run fails naming the record and why
    run = next(r for r in results["runs"] if r["variant"] == "p")
    checks = run["profile_checks"]
    assert checks["failed"] == ["no_impossible_records"] and run["profile"]["skipped_records"] >= 1
    assert code == 1 and "INVARIANT FAILED: no_impossible_records (eagle3-profile.jsonl:1: impossible: the " in out
    assert "cycle is longer than its own" in out


def test_profile_checks_math():
    ok = profile_checks({"phases_sum_ms": 3.0, "cycle_ms": 4.0, "wall_cycle_ms": 6.0, "accept_length": 2.019},
                              2.0)
    assert ok["failed"] == [] and ok["accept_ratio"] == pytest.approx(1.0095)
    off = profile_checks({"phases_sum_ms": 4.5, "cycle_ms": 4.0, "wall_cycle_ms": 6.0, "accept_length": 2.1},
                               2.0)
    assert off["failed"] == ["phases_le_cycle", "accept_within_1pct"]
    unknown = profile_checks({"accept_length": None}, None)
    assert unknown["failed"] == [] and unknown["cycle_le_wall"] is None
    # cycle_ms is a sampled mean: 5% over the wall cycle passes, more fails; forced waits or a second rank fail
    assert profile_checks({"cycle_ms": 5.2, "wall_cycle_ms": 5.0}, None)["cycle_le_wall"] is True
    assert profile_checks({"cycle_ms": 5.3, "wall_cycle_ms": 5.0}, None)["failed"] == ["cycle_le_wall"]
    two = profile_checks({"syncs": 3, "runs_in_file": 2, "ranks": {"tp_rank": [0, 1]}}, None)
    assert two["failed"] == ["no_forced_waits", "one_run_tp_rank_0"]


def test_profile_checks_at_their_edges():
    # an accept length below SGLang's is as wrong as one above it
    assert profile_checks({"accept_length": 1.97}, 2.0)["failed"] == ["accept_within_1pct"]
    assert profile_checks({"accept_length": 1.99}, 2.0)["failed"] == []
    # phases that sum past the cycle, by more than rounding, fail; equal to it pass
    assert profile_checks({"phases_sum_ms": 4.0, "cycle_ms": 4.0}, None)["phases_le_cycle"] is True
    assert profile_checks({"phases_sum_ms": 4.0001, "cycle_ms": 4.0}, None)["failed"] == ["phases_le_cycle"]
    # schema 3's wall time of exactly the timed cycles: no tolerance, the cycle must fit in it
    exact = {"cycle_ms": 5.01, "timed_wall_cycle_ms": 5.0, "wall_cycle_ms": 9.0}
    assert profile_checks(exact, None)["failed"] == ["cycle_le_wall"]
    assert profile_checks(dict(exact, cycle_ms=5.0), None)["failed"] == []
    assert profile_checks({"skipped_records": 1}, None)["failed"] == ["no_impossible_records"]


def test_one_baseline_server_gives_no_noise_floor():
    # "with two servers or more, the noise floor": one baseline run has no spread to read a ratio against
    variants = resolve_variants(["profile"])
    table = compute_ratios([record(1, 1, "baseline", 100.0), record(2, 1, "profile", 90.0)], variants)
    baseline = table["baseline"]["batch output tok/s"]
    assert baseline == {"n": 1, "value_median": 100.0}
    assert table["profile"]["batch output tok/s"]["noise_margin"] == 0.0


def test_an_output_longer_than_the_reference_differs_at_the_reference_end():
    compared, differing, first = first_difference({"batch": [], "stream": [[7]]}, {"batch": [], "stream": [[7, 8]]})
    assert (compared, differing) == (1, 1)
    assert first == {"phase": "stream", "request": 0, "token": 1, "reference": None, "got": 8}


def test_a_may_differ_variant_with_one_run_has_nothing_to_compare_within_itself():
    variants = resolve_variants(["s2:args=--x 1"])
    same = {"batch": [[1, 2, 3]], "stream": [[4, 5]]}
    result = compare_outputs([record(1, 1, "baseline", 1, outputs=same), record(2, 1, "s2", 1, outputs=same)],
                             variants)
    assert result["s2"]["verdict"] == "identical" and "within_variant" not in result["s2"]


def test_nccl_env_lines_count_the_processes_that_printed_them(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("host:101:201 [0] NCCL INFO NCCL_PROTO set by environment to LL.\n"
                   "host:102:202 [1] NCCL INFO NCCL_PROTO set by environment to Simple\n"
                   "host:101:201 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n"
                   "NCCL INFO NCCL_ALGO set by environment to Ring\n"  # no process prefix: not a process
                   "unrelated line\n")
    assert nccl_env_lines(log) == ({"NCCL_ALGO": ["Ring"], "NCCL_PROTO": ["LL", "Simple"]}, 2)
    assert nccl_env_lines(tmp_path / "missing.log") == ({}, 0)


def test_nccl_prints_its_variables_at_info_or_trace_with_env_or_all_subsystems():
    assert nccl_debug_env({"NCCL_DEBUG": "INFO"})  # NCCL's default subsystems include ENV
    assert nccl_debug_env({"NCCL_DEBUG": "trace", "NCCL_DEBUG_SUBSYS": "all"})
    assert nccl_debug_env({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"})
    assert not nccl_debug_env({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"})
    assert not nccl_debug_env({"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "ALL"})
    assert not nccl_debug_env({})


def test_read_profile_summarises_the_newest_run_and_counts_what_it_skipped(tmp_path):
    def interval(run_id, started, wall_cycle_ms):
        stats = interval_stats([(1.0, 2.0, 0.5, 4.0)] * 30, decode_cycles=100, wall_cycle_ms=wall_cycle_ms)
        return to_json(stats.record(None, run_id=run_id, run_started=started, pid=1, tp_rank=0, pp_rank=None,
                                    dp_rank=None, worker="W", timer="test", interval=100))

    path = tmp_path / "eagle3-profile.jsonl"
    # the newer process (by its start) wrote first: it is still the one summarised
    path.write_text(interval("new", 2.0, 6.0) + "\n" + interval("old", 1.0, 5.0) + "\n")
    summary = read_profile(path)
    assert summary["run_id"] == "new" and summary["wall_cycle_ms"] == 6.0
    assert summary["runs_in_file"] == 2 and summary["skipped_records"] == 0 and "first_skipped" not in summary
    # a file of nothing but a broken record is not "no profile": the skip is counted and named
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"schema": "' + SCHEMA_FAMILY + '1", \n')
    summary = read_profile(broken)
    assert summary["skipped_records"] == 1 and summary["first_skipped"].startswith("broken.jsonl:1: ")
    assert "runs_in_file" not in summary
    assert read_profile(tmp_path / "none.jsonl") is None
    (tmp_path / "empty.jsonl").write_text("\n")
    assert read_profile(tmp_path / "empty.jsonl") is None


def test_one_profiled_process_of_tp_rank_0_per_server():
    assert profile_checks({"runs_in_file": 1, "ranks": {"tp_rank": [0]}}, None)["failed"] == []
    assert profile_checks({"runs_in_file": 1, "ranks": {"tp_rank": []}}, None)["failed"] == []  # rank not reported
    assert profile_checks({"runs_in_file": 2, "ranks": {"tp_rank": [0]}}, None)["failed"] == ["one_run_tp_rank_0"]
    assert profile_checks({"runs_in_file": 1, "ranks": {"tp_rank": [1]}}, None)["failed"] == ["one_run_tp_rank_0"]
    assert profile_checks({"runs_in_file": 1}, None)["one_run_tp_rank_0"] is None


def test_the_exit_status_fails_on_a_failed_server_a_left_process_changed_tokens_or_a_broken_invariant():
    def results(**changes):
        run = {"ok": True, "stop": {"survivors": []}, "profile_checks": {"failed": []}}
        run.update(changes.pop("run", {}))
        return dict({"runs": [run], "outputs": {"x": {"verdict": "identical"}}}, **changes)

    assert exit_code(results()) == 0
    assert exit_code(results(run={"ok": False})) == 1
    assert exit_code(results(run={"stop": {"survivors": [{"pid": 7}]}})) == 1
    assert exit_code(results(outputs={"x": {"verdict": "DIFFERENT"}})) == 1
    assert exit_code(results(outputs={"x": {"verdict": "differs (allowed: launch arguments change decoding)"}})) == 0
    assert exit_code(results(run={"profile_checks": {"failed": ["phases_le_cycle"]}})) == 1
    assert exit_code(results(warmup={"ok": False, "stop": {"survivors": []}})) == 0
