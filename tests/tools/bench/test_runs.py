"""bench runs against a fake server process started exactly as a real launch_server would be: the workload and
its measures, failed starts, the whole process tree stopped, SIGTERM to bench, SGLang's own log figures."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from support import REPO

from sglang_pcie.tools.bench import runs as bench_runs
from sglang_pcie.tools.bench.acceptance import accept_length
from sglang_pcie.tools.bench.workload import server_decode_stats, short_outputs
from sglang_pcie.tools.cli import main as cli_main


def test_bench_end_to_end(run_bench, capsys, tmp_path, table_row):
    code, out, err, results = run_bench(
        "--repeats", "2", "--variant", "overlay", "--variant", "profile",
        "--variant", "s2:args=--fake-shift 1", "--variant", "nccl:env=NCCL_PROTO=LL;repeats=1",
        "--env", "FAKE_ACCEPT=3", "--env", "FAKE_BATCH=4", "--env", "NCCL_DEBUG=INFO", "--env", "NCCL_DEBUG_SUBSYS=ENV")
    assert code == 0, out + err
    runs = results["runs"]
    assert [r["variant"] for r in runs] == ["baseline", "overlay", "profile", "s2",
                                            "nccl", "s2", "profile", "overlay", "baseline"]
    assert all(r["ok"] and r["stop"]["survivors"] == [] for r in runs)
    # each server got exactly its variant's environment and arguments, launched as launch_server would be
    # (SGLANG_PCIE_CACHE is the test session's own cache, kept through the hermetic environment)
    env_of = {r["variant"]: {k: v for k, v in r["model_info"]["env"].items() if k != "SGLANG_PCIE_CACHE"}
              for r in runs}
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
    assert results["ratios"]["nccl"]["batch output tok/s"]["verdict"] == "one pair: no interval"
    assert results["outputs"]["overlay"]["verdict"] == "identical"
    assert results["outputs"]["overlay"]["vs_baseline"] == {"reference_run": 1, "compared": 20, "differing": 0,
                                                           "first": None}
    assert results["outputs"]["s2"]["verdict"].startswith("differs (allowed")
    assert results["outputs"]["s2"]["within_variant"]["differing"] == 0
    # the report: table on stdout, progress on stderr, per-server logs, results.json, chart or why not
    assert table_row("overlay", "batch output tok/s", results["ratios"]["overlay"]["batch output tok/s"]).search(out)
    assert "overlay       identical: 0/20 requests differ" in out
    assert ("NCCL read (run 5, nccl): NCCL_PROTO=LL [1 process(es)]; expected (user + overlay) NCCL_PROTO=LL:"
            " all read") in out
    assert re.search(r"profile run 3 \(profile\): \d+ decode cycles; phases 0.375 <= cycle 0.500 <= timed wall"
                     r" cycle 0.625 ms \(all cycles: 0.625\) \(GPU busy 80%\); accept length [\d.]+ vs SGLang's [\d.]+ \(ratio 1.0000\);"
                     r" profiler host 12.5 us/cycle; invariants hold", out)
    assert "9/9 baseline (repeat 2): stopped" in err and "ready in" in err
    assert (tmp_path / "out" / "progress.log").read_text().count("stopped") == 9
    assert "fake: serving on" in Path(runs[0]["log"]).read_text()
    assert results["complete"] is True
    assert results["chart"].endswith("ratios.png") or results["chart"].startswith("skipped: matplotlib")
    # --report re-reads the folder
    assert cli_main(["bench", "--report", str(tmp_path / "out")]) == 0
    assert "overlay       identical: 0/20 requests differ" in capsys.readouterr().out


def test_failed_start_reports_log_tail_and_others_run(run_bench):
    code, out, err, results = run_bench("--repeats", "2", "--variant", "overlay",
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


def test_whole_process_tree_is_stopped(run_bench):
    code, _, err, results = run_bench("--repeats", "1", "--variant",
                                      "kids:env=FAKE_STUBBORN_CHILD=1 FAKE_ESCAPED_CHILD=1")
    run = next(r for r in results["runs"] if r["variant"] == "kids")
    log = Path(run["log"]).read_text()
    pids = [int(p) for p in re.findall(r"child pid (\d+)", log)]
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)  # SIGTERM-ignoring and session-leaving children alike
    assert set(pids) <= set(run["stop"]["sigkilled"])
    assert run["stop"]["survivors"] == [] and run["stop"]["processes"] == 3
    assert code == 0 and "(SIGKILL needed)" in err


def test_survivor_is_reported(run_bench, monkeypatch):
    # A process that cannot be killed (here: the escaped child, which bench is kept from signalling) is named,
    # and fails the run.
    from sglang_pcie.tools import processes

    real_signal = processes._signal

    def sparing_the_escaped_child(pid, sig):
        if "sleep(600)" not in processes._cmdline(pid):
            real_signal(pid, sig)

    monkeypatch.setattr(processes, "_signal", sparing_the_escaped_child)
    monkeypatch.setattr(processes, "KILL_WAIT_S", 1.0)
    code, out, _, results = run_bench("--repeats", "1", "--variant", "kids:env=FAKE_ESCAPED_CHILD=1")
    for r in results["runs"]:
        for s in r["stop"]["survivors"]:
            os.kill(s["pid"], signal.SIGKILL)
    survivors = [s for r in results["runs"] for s in r["stop"]["survivors"]]
    assert code == 1 and survivors and "SURVIVED the stop" in out


def test_sglang_accept_length_with_and_without_the_prefill_token():
    served = [{"meta_info": {"completion_tokens": 16, "spec_verify_ct": 5}},
              {"meta_info": {"completion_tokens": 7, "spec_verify_ct": 2}},
              {"meta_info": {"completion_tokens": 9}}]  # not speculative: left out
    assert accept_length(served) == pytest.approx(23 / 7)
    assert accept_length(served, decode_only=True) == pytest.approx(21 / 7)
    assert accept_length(served[2:]) is None


def test_missing_server_command_is_a_failed_start(capsys, tmp_path, small_options):
    out = tmp_path / "out"
    code = cli_main(["bench", *small_options, "--repeats", "1", "--server-cmd", str(tmp_path / "no-such-server"),
                     "--out", str(out), "--", "--model-path", "m"])
    stdout, _ = capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    assert code == 1 and all(r["failure"]["stage"] == "start" for r in results["runs"])
    assert "cannot start" in stdout and "no-such-server" in stdout


def test_sigterm_to_bench_stops_the_server_tree(tmp_path, small_options, fake_server_cmd):
    import subprocess

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PCIE_", "EAGLE3_", "FAKE_", "NCCL_"))}
    env.update(FAKE_START_DELAY="120", FAKE_STUBBORN_CHILD="1")  # never ready while the test runs
    bench_proc = subprocess.Popen([sys.executable, "-m", "sglang_pcie", "bench", *small_options, "--repeats", "1",
                                   "--server-cmd", fake_server_cmd, "--out", str(out), "--", "--model-path", "m"],
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
    stats = server_decode_stats(log, len("before\n"), log.stat().st_size, 32)
    assert stats == {"lines": 3, "gen_tok_s_p50": 5000.0, "accept_len_mean": 1.5}
    assert server_decode_stats(log, 0, 7, 32)["lines"] == 0


def test_short_or_empty_outputs_fail_the_run_in_one_line_naming_the_variant(run_bench):
    code, out, err, results = run_bench("--repeats", "1", "--variant", "short:env=FAKE_MAX_TOKENS=5",
                                        "--variant", "empty:env=FAKE_MAX_TOKENS=0")
    assert code == 1
    assert [line for line in out.splitlines() if "FAILED" in line] == [
        "run 2 (short, repeat 1) FAILED at outputs: 10 of 10 requests returned fewer than the 12 tokens asked"
        " (0 empty, shortest 5); the ratios leave this run out",
        "run 3 (empty, repeat 1) FAILED at outputs: 10 of 10 requests returned fewer than the 12 tokens asked"
        " (10 empty, shortest 0); the ratios leave this run out"]
    assert "    | " not in out  # no log tail: the server answered, the line says what was wrong
    runs = {r["variant"]: r for r in results["runs"]}
    assert runs["baseline"]["ok"] and not runs["short"]["ok"] and not runs["empty"]["ok"]
    assert runs["short"]["metrics"]["batch"]["short_outputs"] == 8
    assert results["ratios"]["short"]["batch output tok/s"]["verdict"] == "no pairs"
    assert "short (repeat 1): FAILED (outputs)" in err


def test_short_outputs_counts_every_measured_request():
    outputs = {"batch": [[1, 2, 3], [1]], "stream": [[]]}
    assert short_outputs(outputs, 3) == ("2 of 3 requests returned fewer than the 3 tokens asked (1 empty, shortest"
                                         " 0); the ratios leave this run out")
    assert short_outputs({"batch": [[1, 2, 3]], "stream": []}, 3) is None


def constructed_servers(monkeypatch, throughput):
    """Servers that are records: ``throughput(run)`` gives each one's batch tok/s (None: it failed), each takes a
    minute of a clock that only they advance. The --repeats auto loop, without processes or the wall clock."""
    now = [0.0]

    def execute(plan, run, prompts, progress):
        now[0] += 60.0
        value = throughput(run)
        record = {"index": run["index"], "repeat": run["repeat"], "variant": run["variant"], "env": run["env"],
                  "ok": value is not None, "metrics": {"batch": {"output_tok_s": value}, "stream": {}},
                  "stop": {"survivors": []}}
        if value is None:
            record["failure"] = {"stage": "start", "message": "constructed", "log_tail": ""}
        return record

    monkeypatch.setattr(bench_runs, "execute_run", execute)
    monkeypatch.setattr(bench_runs, "clock", lambda: now[0])


def alternating(run):
    """baseline 100 tok/s every time; overlay 3% above, then below, ...: resolvable to 3% after some repeats."""
    return 100.0 if run["variant"] == "baseline" else 100.0 * (1.03 if run["index"] % 2 else 1 / 1.03)


def auto_bench(capsys, tmp_path, *options):
    code = cli_main(["bench", "--repeats", "auto", "--no-warmup", *options, "--out", str(tmp_path / "out"),
                     "--server-cmd", "constructed", "--", "--model-path", "m"])
    out = capsys.readouterr().out
    return code, out, json.loads((tmp_path / "out" / "results.json").read_text())


def test_repeats_auto_adds_repeats_until_the_target_is_resolvable(monkeypatch, capsys, tmp_path):
    constructed_servers(monkeypatch, alternating)
    code, out, results = auto_bench(capsys, tmp_path, "--resolve", "3%")
    auto, repeats = results["auto"], results["repeats"]
    assert code == 0 and auto["stopped"] == "resolved" and auto["target"] == 0.03
    assert [r["repeat"] for r in results["runs"]] == [r for r in range(1, repeats + 1) for _ in (0, 1)]
    # it stopped at the first repeat whose pairs resolve 3%, not one later
    from sglang_pcie.tools.bench.analysis import compute_ratios
    from sglang_pcie.tools.bench.plan import resolve_variants

    def resolvable(upto):
        kept = [r for r in results["runs"] if r["repeat"] <= upto]
        return compute_ratios(kept, resolve_variants([]))["overlay"]["batch output tok/s"]["resolvable"]
    assert repeats > 3 and resolvable(repeats) <= 0.03 < resolvable(repeats - 1)
    assert auto["resolvable"]["overlay"] == pytest.approx(resolvable(repeats))
    assert (f"repeats auto: resolved batch output tok/s to ±3.0% after {repeats} repeats ({2 * repeats:.1f}"
            f" minutes): every variant can see overlay ±") in out


@pytest.mark.parametrize("options, throughput, stopped, repeats, says", [
    (["--resolve", "1%", "--budget-minutes", "10"], alternating, "budget", 5,
     "repeats auto: NOT RESOLVABLE batch output tok/s to ±1.0% in 10 minutes: after 5 repeats (10.0 minutes) the"
     " smallest resolvable effects are overlay ±"),
    (["--resolve", "2%"], lambda run: 100.0 * (1.06, 1.0, 0.99)[run["repeat"] % 3], "noise floor", 3,
     "repeats auto: NOT RESOLVABLE batch output tok/s to ±2.0%: the baseline servers' own spread is ±6.0% after 3"
     " repeats (6.0 minutes); more repeats narrow the interval, not that"),
    (["--resolve", "2%"], lambda run: None if run["index"] == 3 else 100.0, "failure", 3,
     "repeats auto: stopped after 3 repeats (6.0 minutes): a server failed (below)"),
])
def test_repeats_auto_says_why_it_stopped(monkeypatch, capsys, tmp_path, options, throughput, stopped, repeats,
                                          says):
    constructed_servers(monkeypatch, throughput)
    code, out, results = auto_bench(capsys, tmp_path, *options)
    assert results["auto"]["stopped"] == stopped and results["repeats"] == repeats == results["auto"]["repeats"]
    assert says in out and code == (1 if stopped == "failure" else 0)


def test_process_counts_say_what_they_count_when_they_say_it(run_bench):
    """Ready: the processes then (the server and its start-up child). Stopped: the processes the stop ended (the
    server and the child started since; the start-up child had already ended, and is not counted as stopped)."""
    code, _, err, results = run_bench("--repeats", "1", "--no-warmup", "--variant", "swap:env=FAKE_CHILD_SWAP=1")
    assert code == 0, err
    run = next(r for r in results["runs"] if r["variant"] == "swap")
    label = f"{run['index']}/{len(results['runs'])} swap (repeat 1)"
    assert f"{label}: ready in " in err and f"{label}: ready in {run['ready_s']:.1f} s (2 processes)" in err
    assert run["stop"]["processes"] == 2 and run["stop"]["started_after_ready"] == 1
    assert re.search(rf"{re.escape(label)}: stopped 2 processes \(1 started after ready\) in [\d.]+ s\n", err), err
