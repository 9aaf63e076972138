"""tune-spec end to end against the fake server that speaks SGLang's HTTP API (tests/support/fake_sglang_server.py):
the wiring (bench's servers, the levels, the state, the report, a failed server, --resume with the run's own
workload, usage errors). What the fake's figures are is the machine's business: nothing here depends on them (the
search itself is tested against a known cost model in test_search.py)."""
from __future__ import annotations

import json
import sys

import pytest

from support import SUPPORT, first_port
from support.spec_cost_model import FACTS_0_5_16

import sglang_pcie.tools.tune_spec as tune_spec
from sglang_pcie.tools.cli import main as cli_main
from sglang_pcie.tools.tune_spec.release import AdaptiveFacts

FAKE = f"{sys.executable} {SUPPORT / 'fake_sglang_server.py'}"
FIRST_PORT = first_port(1)
SMALL = ["--concurrency", "1,2", "--batch-requests", "4", "--stream-requests", "2", "--input-len", "8",
         "--output-len", "12", "--stop-timeout", "3", "--start-timeout", "60", "--port", FIRST_PORT,
         "--server-cmd", FAKE, "--steps", "1,3,5", "--no-adaptive"]
LAUNCH = ["--", "--model-path", "/m/target", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
          "/m/draft", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "4"]


def tune(capsys, *argv, launch=LAUNCH):
    code = cli_main(["tune-spec", *SMALL, *argv, *launch])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_measures_every_level_keeps_its_state_and_says_what_to_launch(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL_RUNS", "01-chain-5")  # the deepest chain's server fails at start
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), "--max-servers", "4", "--no-warmup")
    assert code == 0, out + err
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["complete"] and state["stopped"] == "the server limit (4) is reached"
    names = [s["candidate"] for s in state["servers"]]
    assert names[:4] == ["chain-5", "chain-3", "chain-1", "none"]  # chain-1 stands in for the failed chain-5
    assert [s["ok"] for s in state["servers"]] == [False, True, True, True]
    assert [s["role"] for s in state["servers"]] == ["model"] * 4
    assert state["warmup"] is None and not (tmp_path / "run" / "runs" / "00-warmup").exists()  # --no-warmup
    assert out.startswith("tune-spec: 4 server(s) measured (model 4); stopped: the server limit (4) is reached")
    assert all(set(s["levels"]) == {"1", "2"} for s in state["servers"][1:])
    assert state["servers"][1]["levels"]["2"]["requests"] == 4 and state["servers"][1]["levels"]["1"]["requests"] == 2
    assert "server 1 (chain-5) FAILED: start: server exited with code 3" in out
    for label in ("one-request decode tok/s (c=1)", "output tok/s at c=2", "answer at c=2: ",
                  "answer at one request (c=1): "):
        assert label in out
    assert out.count("launch: python -m sglang.launch_server --model-path /m/target") == 1
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert set(result["analysis"]["levels"]) == {"1", "2"}
    assert "server 2: chain-3" in err and "c=2: 4 x 12 tokens" in err  # progress on stderr


def test_batch_waves_scale_each_levels_requests_and_a_resume_keeps_them(capsys, tmp_path):
    small = [{"1,2": "1,2,3", "--batch-requests": "--batch-waves", "4": "3"}.get(w, w) for w in SMALL]
    code = cli_main(["tune-spec", *small, "--out", str(tmp_path / "run"), "--max-servers", "1", "--no-warmup",
                     *LAUNCH])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert {c: state["servers"][0]["levels"][c]["requests"] for c in ("1", "2", "3")} == {"1": 2, "2": 6, "3": 9}
    state["complete"] = False
    (tmp_path / "run" / "state.json").write_text(json.dumps(state))
    code = cli_main(["tune-spec", "--resume", str(tmp_path / "run"), "--max-servers", "2", "--port", FIRST_PORT])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    resumed = json.loads((tmp_path / "run" / "state.json").read_text())
    assert {c: resumed["servers"][1]["levels"][c]["requests"] for c in ("2", "3")} == {"2": 6, "3": 9}


def test_resume_continues_a_run_with_its_own_launch_and_workload(capsys, tmp_path):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), "--max-servers", "1", "--no-warmup",
                          "--budget-minutes", "30")
    assert code == 0, out + err
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    state["complete"] = False
    (tmp_path / "run" / "state.json").write_text(json.dumps(state))
    # no workload option given now: the run's (c=1,2, 4 batch requests), not bench's defaults (c=32, 128); the limits
    # given now (either form) replace the run's, the one not given (--budget-minutes) stays the run's
    code = cli_main(["tune-spec", "--resume", str(tmp_path / "run"), "--max-servers=2", "--prove", "3",
                     "--port", FIRST_PORT])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    resumed = json.loads((tmp_path / "run" / "state.json").read_text())
    assert [s["candidate"] for s in resumed["servers"]] == ["chain-5", "chain-3"]
    assert resumed["servers"][0] == state["servers"][0]  # kept, not measured again
    assert set(resumed["servers"][1]["levels"]) == {"1", "2"}
    assert resumed["servers"][1]["levels"]["2"]["requests"] == 4
    assert resumed["settings"]["max_servers"] == 2 and resumed["settings"]["prove"] == 3  # limits may change
    assert resumed["settings"]["budget_s"] == 30 * 60


def test_resume_keeps_the_runs_candidates_and_release_facts(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(tune_spec, "adaptive_facts", lambda root: FACTS_0_5_16)
    argv = [a for a in SMALL if a != "--no-adaptive"]
    code = cli_main(["tune-spec", *argv, "--out", str(tmp_path / "run"), "--max-servers", "1", "--no-warmup", *LAUNCH])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    # resumed where the release read now has no adaptive steps: the run's own candidates and facts go on
    monkeypatch.setattr(tune_spec, "adaptive_facts", lambda root: AdaptiveFacts(False, version="0.5.9"))
    code = cli_main(["tune-spec", "--resume", str(tmp_path / "run"), "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "release: SGLang 0.5.16 runs adaptive steps from a table by batch size" in out
    assert "\n  adaptive   adaptive python -m sglang.launch_server " in out


@pytest.mark.parametrize("option", [["--concurrency", "1,32"], ["--batch-requests", "8"], ["--steps", "1,3"],
                                    ["--resolve", "5%"], ["--output-len", "16"]])
def test_resume_refuses_an_option_that_differs_from_the_runs(capsys, tmp_path, option):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), "--max-servers", "1", "--no-warmup")
    assert code == 0, out + err
    code = cli_main(["tune-spec", "--resume", str(tmp_path / "run"), *option])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"--resume: {option[0]} " in err, err
    assert "differs from the run's" in err


def test_resume_refuses_another_launch(capsys, tmp_path):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), "--max-servers", "1", "--no-warmup")
    assert code == 0, out + err
    other = [a if a != "/m/draft" else "/m/other-draft" for a in LAUNCH]
    code = cli_main(["tune-spec", "--resume", str(tmp_path / "run"), "--max-servers", "2", *other])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "the launch arguments differ from the run's" in err
    assert len(json.loads((tmp_path / "run" / "state.json").read_text())["servers"]) == 1


@pytest.mark.parametrize("argv, message", [
    (["--resolve", "0%"], "--resolve '0%'"),
    (["--budget-minutes", "0"], "--budget-minutes 0"),
    (["--steps", "1,x"], "--steps '1,x'"),
    (["--steps", ""], "--steps ''"),
    (["--max-servers", "0"], "--max-servers 0"),
    (["--sweep", "-1"], "--sweep -1"),
    (["--prove", "-1"], "--prove -1"),
    (["--concurrency", "0,8"], "--concurrency '0,8'"),
    (["--concurrency", ""], "--concurrency ''"),
    (["--workload", "batch", "--concurrency", "1"], "--workload batch"),
    (["--stream-requests", "0"], "--stream-requests 0"),
    (["--table", "/nonexistent/table.json"], "--table /nonexistent/table.json: not a file"),
    (["--candidates", "chain-3"], "--candidates: only with --sweep"),
    (["--sweep", "1", "--candidates", "chain-3,chain-9"], "--candidates 'chain-3,chain-9': chain-9: this launch's"
                                                           " candidates are none, chain-1, chain-3, chain-5"),
    (["--sweep", "1", "--candidates", ","], "--candidates ',': no name given"),
    (["--batch-waves", "0"], "--batch-waves 0: must be a positive integer"),
    (["--batch-waves", "8"], "--batch-waves 8 and --batch-requests 4 exclude each other"),
])
def test_bad_options_are_one_line_naming_them_and_start_nothing(capsys, tmp_path, argv, message):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("launch, message", [
    (["--", "--model-path", "/m/target"], "name no --speculative-algorithm"),
    (["--", "--model-path", "/m/target", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"],
     "names no --speculative-draft-model-path"),
    (["--", "--model-path", "/m/target", "--speculative-algorithm", "NGRAM"], "EAGLE and EAGLE3 chains only"),
])
def test_a_launch_that_cannot_speculate_is_refused_before_any_server(capsys, tmp_path, launch, message):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), launch=launch)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag", [["--host", "0.0.0.0"], ["--port=31000"]])
def test_a_host_or_port_in_the_launch_is_refused_before_any_server(capsys, tmp_path, flag):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), launch=LAUNCH + flag)
    name = flag[0].partition("=")[0]
    assert code == 2 and f"launch argument {name}: give it to tune-spec" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [["--stream-requests", "1"], ["--workload", "batch", "--stream-requests", "0"]])
def test_stream_requests_0_is_refused_only_where_c1_is_measured(capsys, argv):
    code, out, err = tune(capsys, "--dry-run", *argv)
    assert code == 0 and err == "", err


def test_the_warm_up_server_runs_the_first_candidate_measured_and_is_not_measured(capsys, tmp_path):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), "--max-servers", "1")
    assert code == 0, out + err
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["warmup"]["candidate"] == "chain-5" and state["warmup"]["ok"]  # the deepest chain, built first
    assert [s["candidate"] for s in state["servers"]] == ["chain-5"]
    assert (tmp_path / "run" / "runs" / "00-warmup").is_dir()
    assert out.startswith("tune-spec: 1 server(s) measured (model 1) after one warm-up server (chain-5); stopped:")


def test_the_proof_of_the_table_for_this_box_measures_just_below_each_bucket(capsys, tmp_path, monkeypatch):
    """With the release's table: after the model's servers (chains 1 and 3 both measured: no leader), the proof's
    servers (the tuned table where it differs, SGLang's, the best fixed) measure c=3 too, below the bucket of c=4."""
    monkeypatch.setattr(tune_spec, "adaptive_facts", lambda root: FACTS_0_5_16)
    argv = [a for a in SMALL if a != "--no-adaptive"]
    argv[argv.index("--concurrency") + 1], argv[argv.index("--steps") + 1] = "1,4", "1,3"
    code = cli_main(["tune-spec", *argv, "--out", str(tmp_path / "run"), "--prove", "1", "--max-servers", "6",
                     "--no-warmup", *LAUNCH])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    servers = json.loads((tmp_path / "run" / "state.json").read_text())["servers"]
    assert [(s["role"], sorted(s["levels"])) for s in servers[:3]] == [("model", ["1", "4"])] * 3
    proof = [s for s in servers if s["role"] == "proof"]
    assert len(proof) in (2, 3) and "adaptive" in {s["candidate"] for s in proof}
    assert all(s["ok"] and sorted(s["levels"]) == ["1", "3", "4"] for s in proof), proof
    assert "  c=3 (edge): " in out and "recommendation: " in out


def test_no_edges_leaves_the_edges_out(capsys, tmp_path):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), "--max-servers", "1", "--no-warmup", "--no-edges")
    assert code == 0, out + err
    assert json.loads((tmp_path / "run" / "state.json").read_text())["settings"]["edges"] is False


@pytest.mark.parametrize("workload, concurrency, levels", [
    ("latency", "32,8", "c=1"), ("batch", "32,8,1", "c=8, c=32"), ("both", "32,8,1", "c=1, c=8, c=32")])
def test_the_workload_picks_the_levels(capsys, workload, concurrency, levels):
    code, out, err = tune(capsys, "--dry-run", "--workload", workload, "--concurrency", concurrency)
    assert code == 0, err
    assert f"\nlevels: {levels}\n" in out


def test_dry_run_lists_the_candidates_the_levels_and_the_model_servers(capsys, tmp_path):
    code, out, err = tune(capsys, "--dry-run", "--out", str(tmp_path / "run"))
    assert code == 0
    assert "chain-5    chain" in out and "the user's setting: chain-3" in out and "levels: c=1, c=2" in out
    assert "\nrequests per level: c=1: 2 streamed, c=2: 4\n" in out  # --stream-requests 2, --batch-requests 4
    small = [{"1,2": "1,2,32", "--batch-requests": "--batch-waves", "4": "16"}.get(w, w) for w in SMALL]
    assert cli_main(["tune-spec", *small, "--dry-run", *LAUNCH]) == 0
    assert "\nrequests per level: c=1: 2 streamed, c=2: 32, c=32: 512\n" in capsys.readouterr().out
    assert "first servers (the model): chain-5, chain-3, none" in out


def test_adaptive_steps_and_the_proof_where_the_release_has_the_table(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(tune_spec, "adaptive_facts", lambda root: FACTS_0_5_16)
    argv = [a for a in SMALL if a != "--no-adaptive"]
    code = cli_main(["tune-spec", *argv, "--dry-run", *LAUNCH])
    out = capsys.readouterr().out
    assert code == 0
    assert ("adaptive   adaptive python -m sglang.launch_server --model-path /m/target --speculative-algorithm EAGLE3"
            " --speculative-draft-model-path /m/draft --speculative-adaptive --speculative-num-steps 7"
            " --speculative-eagle-topk 1 --speculative-num-draft-tokens 8") in out
    assert "table for this box proven against SGLang's own and the best fixed setting (2 repeat(s))" in out


def test_a_table_given_is_weighed_as_a_candidate(capsys, tmp_path):
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"1": {"candidate_steps": [5]}, "32": {"candidate_steps": [0, 3]}}))
    code, out, err = tune(capsys, "--dry-run", "--table", str(table))
    assert code == 0, err
    assert (f"table      table    python -m sglang.launch_server --model-path /m/target --speculative-algorithm EAGLE3"
            f" --speculative-draft-model-path /m/draft --speculative-adaptive --speculative-adaptive-config {table}"
            " --speculative-num-steps 5") in out
    table.write_text(json.dumps({"1": {"candidate_steps": [True]}}))  # a boolean is no step
    code, out, err = tune(capsys, "--dry-run", "--table", str(table))
    assert code == 2 and "candidate_steps must be a list of steps 0 to 16" in err


def test_a_sweep_of_the_named_candidates_measures_only_those_in_counterbalanced_order(capsys, tmp_path):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), "--sweep", "2", "--candidates", "chain-5,chain-1",
                          "--no-warmup")
    assert code == 0, out + err
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    # listed order (chain-1 before chain-5), then reversed; none and chain-3 never started
    assert [s["candidate"] for s in state["servers"]] == ["chain-1", "chain-5", "chain-5", "chain-1"]
    assert [c["name"] for c in state["candidates"]] == ["chain-1", "chain-5"]
