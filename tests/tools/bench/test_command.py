"""bench's command line: every bad value one line and exit 2 before anything starts, SGLang importable with the
server command's python before anything starts, the dry-run schedule, an interrupt."""
from __future__ import annotations

import json
import re
import sys
import venv
from pathlib import Path

import pytest

from support import SUPPORT

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


# ------------------------------------------------------------------------------------- SGLang imports, first

def stub_sglang(folder: Path, init: str, launch_server: str | None = None) -> Path:
    """A folder holding a package named sglang (for PYTHONPATH): its __init__ and, if given, its launch_server."""
    package = folder / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    if launch_server is not None:
        (package / "launch_server.py").write_text(launch_server)
    return folder


def test_a_python_without_sglang_fails_in_one_line_before_anything_starts(capsys, tmp_path, monkeypatch):
    bare = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(bare)  # a python that has no sglang
    python = str(bare / "bin" / "python")
    for argv in (["--server-cmd", f"{python} -m sglang.launch_server"], []):
        monkeypatch.setattr(sys, "executable", python)  # the default command: this python -m sglang.launch_server
        code = cli_main(["bench", "--out", str(tmp_path / "out"), *argv, "--", "--model-path", "m"])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and not (tmp_path / "out").exists()
        assert err == (f"sglang-pcie bench: error: {python} cannot import SGLang (ModuleNotFoundError: No module named"
                       f" 'sglang'): every server would fail; install SGLang for that python, or name another with"
                       f" --server-cmd\n")


def test_the_import_error_is_named_and_checked_in_the_servers_environment(capsys, tmp_path):
    stub = stub_sglang(tmp_path / "stub", 'raise ImportError("libcuda.so.1: cannot open shared object file")')
    code = cli_main(["bench", "--out", str(tmp_path / "out"), "--env", f"PYTHONPATH={stub}", "--", "--model-path",
                     "m"])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "out").exists() and len(err.splitlines()) == 1
    assert f"{sys.executable} cannot import SGLang (ImportError: libcuda.so.1: cannot open shared object file)" in err
    stub = stub_sglang(tmp_path / "no-launcher", "")
    assert cli_main(["bench", "--out", str(tmp_path / "out"), "--env", f"PYTHONPATH={stub}", "--", "--model-path",
                     "m"]) == 2
    assert "(sglang imports but has no sglang.launch_server)" in capsys.readouterr().err


def test_where_sglang_imports_the_servers_start(capsys, tmp_path, small_options):
    # the default command, python -m sglang.launch_server, with an sglang whose launch_server is the fake server
    launcher = (f"import runpy, sys\nsys.argv[0] = {str(SUPPORT / 'fake_sglang_server.py')!r}\n"
                f"runpy.run_path(sys.argv[0], run_name='__main__')\n")
    stub = stub_sglang(tmp_path / "stub", "", launcher)
    code = cli_main(["bench", *small_options, "--repeats", "1", "--out", str(tmp_path / "out"), "--env",
                     f"PYTHONPATH={stub}", "--", "--model-path", "m"])
    out, _ = capsys.readouterr()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert code == 0, out
    assert [r["command"][:3] for r in results["runs"]] == [[sys.executable, "-m", "sglang.launch_server"]] * 2
    assert all(r["ok"] for r in results["runs"])


def test_another_server_command_is_not_checked(capsys, tmp_path, small_options):
    # a wrapper may set up its own environment: bench cannot know what it imports, so it says nothing and starts it
    code = cli_main(["bench", *small_options, "--repeats", "1", "--server-cmd",
                     f"{sys.executable} -c 'raise SystemExit(4)'", "--out", str(tmp_path / "out"), "--", "--model-path",
                     "m"])
    out, err = capsys.readouterr()
    assert code == 1 and "cannot import SGLang" not in out + err
    assert "server exited with code 4 before /health answered" in out


def test_a_dry_run_in_a_python_without_sglang_says_the_real_run_would_refuse(capsys, tmp_path, monkeypatch):
    bare = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(bare)  # a python that has no sglang
    python = str(bare / "bin" / "python")
    monkeypatch.setattr(sys, "executable", python)
    code = cli_main(["bench", "--dry-run", "--out", str(tmp_path / "out"), "--", "--model-path", "m"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("schedule: ") and not (tmp_path / "out").exists()
    assert err == (f"sglang-pcie bench: note: the real run would refuse: {python} cannot import SGLang"
                   " (ModuleNotFoundError: No module named 'sglang'): every server would fail; install SGLang for that"
                   " python, or name another with --server-cmd\n")
