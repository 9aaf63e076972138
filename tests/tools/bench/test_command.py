"""bench's command line: every bad value one line and exit 2 before anything starts, the dry-run schedule, an
interrupt."""
from __future__ import annotations

import re

import pytest

from sglang_pcie.tools.bench import command
from sglang_pcie.tools.cli import main as cli_main


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
    (["--repeats", "x"], "--repeats 'x': give a positive integer or auto"),
    (["--repeats", "0"], "--repeats 0: must be a positive integer"),
    (["--resolve", "2%"], "--resolve: only with --repeats auto"),
    (["--budget-minutes", "5"], "--budget-minutes: only with --repeats auto"),
    (["--repeats", "auto", "--resolve", "0"], "--resolve '0'"),
    (["--repeats", "auto", "--resolve", "two"], "--resolve 'two'"),
    (["--repeats", "auto", "--resolve-metric", "speed"], "--resolve-metric 'speed': choose one of batch.output_tok_s"),
    (["--repeats", "auto", "--budget-minutes", "0"], "--budget-minutes 0"),
    (["--repeats", "auto", "--variant", "x:env=A=1;repeats=1"], "repeats= needs a fixed --repeats, not auto"),
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


def test_an_interrupt_before_any_result_does_not_point_at_a_missing_file(capsys, tmp_path, monkeypatch,
                                                                         fake_server_cmd):
    def interrupted(plan):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "run_plan", interrupted)
    code = cli_main(["bench", "--out", str(tmp_path / "out"), "--server-cmd", fake_server_cmd, "--", "--model-path",
                     "m"])
    assert code == 130 and "interrupted; no results written" in capsys.readouterr().err


def test_dry_run_of_repeats_auto_says_how_it_goes_on(capsys, tmp_path):
    code = cli_main(["bench", "--dry-run", "--repeats", "auto", "--resolve", "5%", "--resolve-metric",
                     "stream.tpot_ms_p50", "--budget-minutes", "90", "--variant", "overlay", "--variant",
                     "aa:base=overlay", "--server-cmd", "/nonexistent/server", "--out", str(tmp_path / "o"), "--",
                     "--model-path", "/m"])
    out, _ = capsys.readouterr()
    assert code == 0 and not (tmp_path / "o").exists()
    assert "schedule: 3 variant(s) x 3 repeat(s) = 9 servers, one at a time, order baseline overlay aa aa" in out
    assert ("--repeats auto: then one more repeat at a time until every variant's c=1 TPOT p50 ms could resolve"
            " ±5.0%; no repeat started that would end past 90 minutes; at most 50 repeats") in out
