"""tune-spec end to end against the fake server that speaks SGLang's HTTP API (tests/support/fake_sglang_server.py):
the wiring (bench's servers, the state, the report, a failed server, --resume, usage errors). What the fake's
figures are is the machine's business: nothing here depends on them (the search itself is tested against a known
cost model in test_search.py)."""
from __future__ import annotations

import json
import random
import sys

import pytest

from support import SUPPORT

from sglang_pcie.tools.cli import main as cli_main

FAKE = f"{sys.executable} {SUPPORT / 'fake_sglang_server.py'}"
FIRST_PORT = str(random.SystemRandom().randrange(20000, 29800, 200))
SMALL = ["--concurrency", "2", "--batch-requests", "4", "--stream-requests", "2", "--input-len", "8",
         "--output-len", "12", "--stop-timeout", "3", "--start-timeout", "60", "--port", FIRST_PORT,
         "--server-cmd", FAKE, "--steps", "1,3,5", "--no-adaptive"]
LAUNCH = ["--", "--model-path", "/m/target", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
          "/m/draft", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "4"]


def tune(capsys, *argv):
    code = cli_main(["tune-spec", *SMALL, *argv, *LAUNCH])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_measures_the_model_servers_keeps_its_state_and_says_what_to_launch(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL_RUNS", "01-chain-5")  # the deepest chain's server fails at start
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), "--max-servers", "4", "--no-warmup")
    assert code == 0, out + err
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["complete"] and state["stopped"] == "the server limit (4) is reached"
    names = [s["candidate"] for s in state["servers"]]
    assert names[:4] == ["chain-5", "chain-3", "chain-1", "none"]  # chain-1 stands in for the failed chain-5
    assert [s["ok"] for s in state["servers"]] == [False, True, True, True]
    assert "server 1 (chain-5) FAILED: start: server exited with code 3" in out
    for label in ("batch output tok/s at concurrency 2", "one-request decode tok/s at concurrency 1"):
        assert label in out
    assert out.count("  launch (") == 2 and "python -m sglang.launch_server --model-path /m/target" in out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert set(result["analysis"]) == {"batch", "latency"}
    assert "server 2: chain-3" in err  # progress on stderr


def test_resume_continues_a_run_with_its_own_launch(capsys, tmp_path):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), "--max-servers", "1", "--no-warmup")
    assert code == 0, out + err
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    state["settings"]["max_servers"] = 2  # as if the first run had been stopped after one server
    state["complete"] = False
    (tmp_path / "run" / "state.json").write_text(json.dumps(state))
    code = cli_main(["tune-spec", "--resume", str(tmp_path / "run"), *SMALL])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    resumed = json.loads((tmp_path / "run" / "state.json").read_text())
    assert [s["candidate"] for s in resumed["servers"]] == ["chain-5", "chain-3"]
    assert resumed["servers"][0] == state["servers"][0]  # kept, not measured again


@pytest.mark.parametrize("argv, message", [
    (["--resolve", "0%"], "--resolve '0%'"),
    (["--steps", "1,x"], "--steps '1,x'"),
    (["--max-servers", "0"], "--max-servers 0"),
    (["--sweep", "-1"], "--sweep -1"),
])
def test_bad_options_are_one_line_naming_them(capsys, tmp_path, argv, message):
    code, out, err = tune(capsys, "--out", str(tmp_path / "run"), *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_launch_without_speculation_is_refused(capsys, tmp_path):
    code = cli_main(["tune-spec", *SMALL, "--out", str(tmp_path / "run"), "--", "--model-path", "/m/target"])
    err = capsys.readouterr().err
    assert code == 2 and "name no --speculative-algorithm" in err


def test_dry_run_lists_the_candidates_and_the_model_servers(capsys, tmp_path):
    code, out, err = tune(capsys, "--dry-run", "--out", str(tmp_path / "run"))
    assert code == 0
    assert "chain-5    chain" in out and "the user's setting: chain-3" in out
    assert "first servers (the model): chain-5, chain-3, none" in out
