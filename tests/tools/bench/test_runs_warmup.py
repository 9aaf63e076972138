"""bench's unmeasured warm-up server (on by default, --no-warmup to skip): first, of the first run's variant, in
runs/00-warmup; in results.json under ``warmup``, never in ``runs``, a ratio or the schedule's order; a failed one is
one line and the run goes on; --repeats auto's budget counts it. And the pieces another tool (tune-spec) calls:
``warm_up``, ``execute_run`` with ``Plan.make_run``'s runs."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from support import SUPPORT

from sglang_pcie.tools.bench import runs as bench_runs
from sglang_pcie.tools.bench.analysis import exit_code
from sglang_pcie.tools.bench.plan import Plan, Workload, parse_variant, resolve_variants
from sglang_pcie.tools.bench.runs import execute_run, warm_up
from sglang_pcie.tools.cli import main as cli_main


def test_a_warm_up_server_runs_first_and_is_not_measured(run_bench):
    code, out, err, results = run_bench("--repeats", "1", "--variant", "overlay", "--env", "FAKE_ACCEPT=3",
                                        warmup=True)
    assert code == 0, out + err
    warmup = results["warmup"]
    assert warmup["ok"] and warmup["failure"] is None and warmup["variant"] == "baseline", warmup
    assert warmup["ready_s"] > 0 and warmup["wall_s"] >= warmup["ready_s"]
    assert Path(warmup["folder"]).name == "00-warmup" and warmup["stop"]["survivors"] == []
    # the measured servers are as without it: their own indexes, order and ratios
    assert [(r["index"], r["variant"]) for r in results["runs"]] == [(1, "baseline"), (2, "overlay")]
    assert results["ratios"]["overlay"]["batch output tok/s"]["n"] == 1
    # same command and environment as the first measured server, except its port
    log = Path(warmup["log"]).read_text()
    assert "fake: launch arguments ['--model-path', '/models/none', '--host'" in log
    first = Path(results["runs"][0]["log"]).read_text()
    assert re.sub(r"\d{4,5}", "P", log.splitlines()[0]) == re.sub(r"\d{4,5}", "P", first.splitlines()[0])
    # warm-up requests (4) and one batch of the workload (4 at concurrency 4): one scheduler line each
    assert log.count("Decode batch") == 8
    # started and stopped before the first measured server; one line in the table
    assert err.index("warm-up baseline: ready in") < err.index("warm-up baseline: stopped") < err.index(
        "1/2 baseline (repeat 1): starting")
    assert re.search(r"^warm-up \(baseline, not measured\): ready in [\d.]+ s, [\d.]+ s in all$", out, re.M)


def test_a_failed_warm_up_is_one_line_and_the_run_goes_on(run_bench):
    code, out, err, results = run_bench("--repeats", "1", "--env", "FAKE_FAIL_RUNS=00-warmup", warmup=True)
    warmup = results["warmup"]
    assert not warmup["ok"] and warmup["failure"]["stage"] == "start"
    assert "the model does not fit" in warmup["failure"]["log_tail"]
    assert all(r["ok"] for r in results["runs"]) and code == 0  # a warm-up measures nothing: not a failure
    lines = [line for line in out.splitlines() if "warm-up" in line]
    assert lines == [f"warm-up (baseline, not measured) FAILED at start: server exited with code 3 before /health"
                     f" answered (log {warmup['log']}); the measured servers ran without it"]
    assert "warm-up baseline FAILED at start" in err and "the measured servers go on" in err


def test_no_warmup_starts_none(run_bench):
    code, _, _, results = run_bench("--repeats", "1")
    assert code == 0 and "warmup" not in results
    assert not (Path(results["out"]) / "runs" / "00-warmup").exists()


def test_dry_run_shows_the_warm_up_server(capsys, tmp_path):
    argv = ["bench", "--dry-run", "--out", str(tmp_path / "out"), "--variant", "profile", "--", "--model-path", "m"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  0\. warm-up: baseline, not measured \(warm-up requests, one batch, one streamed request;"
                     r" stopped\) -> \S+/runs/00-warmup\n     env: SGLANG_PCIE_DISABLE=1\n     cmd: .* --model-path m"
                     r" --host 127.0.0.1 --port 30000\n  1\. baseline \(repeat 1\)", out, re.M)
    assert "order baseline profile profile baseline baseline profile" in out  # not in the counterbalanced order
    assert cli_main(argv[:2] + ["--no-warmup"] + argv[2:]) == 0
    out = capsys.readouterr().out
    assert "warm-up server: none (--no-warmup)" in out and "0. warm-up" not in out


def test_repeats_auto_budget_counts_the_warm_up_once(monkeypatch, capsys, tmp_path):
    """Servers that are records, a minute each on a clock only they advance, the warm-up too: with 10 minutes,
    the warm-up and 3 repeats (7 minutes) leave room for a 4th repeat (9), not a 5th (11). The mean repeat is
    that of the measured servers: the warm-up is spent once."""
    now = [0.0]
    seen = []

    def execute(plan, run, prompts, progress, drive=None):
        now[0] += 60.0
        seen.append((run["index"], run["variant"], drive is not None))
        value = 100.0 if run["variant"] == "baseline" else 100.0 * (1.03 if run["index"] % 2 else 1 / 1.03)
        return {"index": run["index"], "repeat": run["repeat"], "variant": run["variant"], "env": run["env"],
                "ok": True, "ready_s": 1.0, "metrics": {"batch": {"output_tok_s": value}, "stream": {}},
                "stop": {"survivors": []}}

    monkeypatch.setattr(bench_runs, "execute_run", execute)
    monkeypatch.setattr(bench_runs, "clock", lambda: now[0])
    code = cli_main(["bench", "--repeats", "auto", "--resolve", "1%", "--budget-minutes", "10", "--out",
                     str(tmp_path / "out"), "--server-cmd", "constructed", "--", "--model-path", "m"])
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert code == 0 and seen[0] == (0, "baseline", True) and not any(w for _, _, w in seen[1:])
    assert results["auto"]["stopped"] == "budget" and results["repeats"] == 4 and len(results["runs"]) == 8
    assert results["warmup"]["ok"] and results["warmup"]["ready_s"] == 1.0
    assert "after 4 repeats (9.0 minutes)" in out


def test_a_warm_up_that_left_a_process_fails_the_exit_status():
    results = {"runs": [{"ok": True, "stop": {"survivors": []}}], "outputs": {},
               "warmup": {"ok": False, "stop": {"survivors": []}}}
    assert exit_code(results) == 0
    results["warmup"]["stop"]["survivors"] = [{"pid": 1}]
    assert exit_code(results) == 1


def small_plan(tmp_path, variants) -> Plan:
    return Plan(variants=resolve_variants(variants), workload=Workload(
                    concurrency=2, batch_requests=4, stream_requests=1, input_len=4, output_len=10,
                    warmup_requests=2),
                launch_args=["--model-path", "m"], server_cmd=[sys.executable, str(SUPPORT / "fake_sglang_server.py")],
                extra_env={"FAKE_ACCEPT": "4"}, host="127.0.0.1", port=31000, repeats=1, out=tmp_path / "out",
                start_timeout=60, stop_timeout=3, request_timeout=60)


def test_another_tool_warms_up_and_runs_one_server_of_its_own(tmp_path):
    # what tune-spec does: its own Plan, the warm-up of the variant it names, then one server at an index and
    # folder of its own choosing, through the same execute_run
    plan = small_plan(tmp_path, ["s2:args=--fake-shift 1", "profile"])
    prompts, lines = plan.workload.prompts(), []
    summary = warm_up(plan, prompts, lines.append, variant="s2")
    assert summary["ok"] and summary["variant"] == "s2" and Path(summary["folder"]) == plan.out / "runs" / "00-warmup"
    assert "--fake-shift" in Path(summary["log"]).read_text()
    assert any(line.startswith("warm-up s2: ready in") for line in lines)
    run = plan.make_run(7, 3, "profile", folder=tmp_path / "mine" / "point-7", label="point 7")
    assert run["env"]["EAGLE3_PROFILE_FILE"] == str(tmp_path / "mine" / "point-7" / "eagle3-profile.jsonl")
    record = execute_run(plan, run, prompts, lines.append)
    assert record["ok"] and (record["index"], record["repeat"], record["variant"]) == (7, 3, "profile")
    assert record["profile"]["accept_length"] and (tmp_path / "mine" / "point-7" / "outputs.json").is_file()
    # per request 9 decoded tokens: 2 cycles of 4 tokens (3 drafts accepted), then 1 token (none)
    assert record["metrics"]["batch"]["accept_hist"] == [4, 0, 0, 8]
    assert any(line.startswith("point 7: ready in") for line in lines)


def test_make_run_is_what_schedule_makes():
    plan = Plan(variants=[parse_variant("baseline"), parse_variant("profile")], workload=Workload(),
                launch_args=["--a"], server_cmd=["srv"], extra_env={"K": "V"}, host="h", port=1, repeats=2,
                out=Path("/o"), start_timeout=1, stop_timeout=1, request_timeout=1)
    runs = plan.schedule()
    assert [plan.make_run(r["index"], r["repeat"], r["variant"]) for r in runs] == runs
    assert runs[1] == {"index": 2, "repeat": 1, "variant": "profile", "folder": Path("/o/runs/02-profile"),
                       "env": {"K": "V", "EAGLE3_PROFILE": "1",
                               "EAGLE3_PROFILE_FILE": "/o/runs/02-profile/eagle3-profile.jsonl"},
                       "args": ["--a"]}
    assert plan.warmup_run() == {"index": 0, "repeat": 0, "variant": "baseline", "folder": Path("/o/runs/00-warmup"),
                                 "env": {"K": "V", "SGLANG_PCIE_DISABLE": "1"}, "args": ["--a"],
                                 "label": "warm-up baseline"}
