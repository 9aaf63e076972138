"""The command: bad usage, the sample text in the wheel, the CLI in a real process."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from drafter_models import run_cli
from sglang_pcie.tools.cli import main as cli_main
from drafter_models import (frequent_ids_fixture, pair_fixture, src23_fixture,  # noqa: F401 (fixtures)
                            tokenizer_json_fixture)
from support import REPO


def test_bad_usage_exits_2(capsys):
    assert run_cli(capsys)[0] == 2
    assert run_cli(capsys, "--draft", "x", "--bogus")[0] == 2


def test_sample_text_ships_in_the_wheel(checkout_wheel):
    import zipfile

    with zipfile.ZipFile(checkout_wheel) as wheel:
        assert "sglang_pcie/tools/data/sample.txt" in wheel.namelist()


def test_cli_delegates(tmp_path, pair):
    target, draft = pair
    proc = subprocess.run([sys.executable, "-m", "sglang_pcie", "check-drafter", "--draft", str(draft), "--target",
                           str(target)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"drafter {draft}"
    assert "check-drafter" in subprocess.run([sys.executable, "-m", "sglang_pcie", "--help"], capture_output=True,
                                             text=True, cwd=REPO).stdout


# -- the server's launch arguments, after `--`

EAGLE3 = ["--speculative-algorithm", "EAGLE3"]


@pytest.mark.parametrize("arguments, status, words", [
    (["--speculative-algorithm", "EAGLE"], "fail", "SGLang runs it as EAGLE, the target captures no aux hidden states"
                                                   " and d2t is not read, so no draft is accepted"),
    (["--speculative-algorithm=NEXTN"], "fail", "use --speculative-algorithm EAGLE3"),
    ([], "warn", "no --speculative-algorithm: the server runs without the drafter"),
    (EAGLE3, "ok", "steps, topk and draft tokens left to SGLang's automatic choice"),
    (EAGLE3 + ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
     "ok", "3 steps, topk 1, 4 draft tokens (a chain)"),
    (EAGLE3 + ["--speculative-num-steps", "5", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
     "warn", "--speculative-num-draft-tokens 4 with topk 1: SGLang replaces it by steps + 1 = 6"),
    (EAGLE3 + ["--speculative-num-steps", "3"], "fail", "without --speculative-eagle-topk: SGLang compares the unset"
                                                        " topk with 1 (TypeError at start)"),
    (EAGLE3 + ["--speculative-eagle-topk", "1"], "fail", "without --speculative-num-steps: SGLang asserts they are"
                                                         " unset"),
    (EAGLE3 + ["--speculative-num-steps", "2", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "21"],
     "ok", "2 steps, topk 4, 21 draft tokens of 20 candidates"),
    (EAGLE3 + ["--speculative-num-steps", "2", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "22"],
     "fail", "the tree of 2 steps x topk 4 holds 20 candidates (topk + (steps - 1) x topk^2), SGLang asks for the"
             " best 21"),
    (EAGLE3 + ["--speculative-num-steps", "three"], "fail", "--speculative-num-steps 'three' is not an integer"),
    (EAGLE3 + ["--speculative-num-steps", "0"], "fail", "--speculative-num-steps 0 must be at least 1"),
    (EAGLE3 + ["--speculative-token-map", "map.pt"], "warn", "--speculative-token-map is ignored with EAGLE3"),
])
def test_launch_arguments(capsys, pair, arguments, status, words):
    target, draft = pair
    code, out, err = run_cli(capsys, "--draft", draft, "--target", target, "--json", "--", *arguments)
    found = {c["check"]: c for c in json.loads(out)["checks"]}["launch args"]
    assert (found["status"], code) == (status, int(status == "fail"))
    assert words in found["reason"]


def test_launch_arguments_name_another_drafter(capsys, tmp_path, pair):
    target, draft = pair
    other = tmp_path / "other"
    other.mkdir()
    code, out, _ = run_cli(capsys, "--draft", draft, "--target", target, "--json", "--", *EAGLE3,
                           "--speculative-draft-model-path", other, "--model-path", target)
    found = {c["check"]: c for c in json.loads(out)["checks"]}["launch args"]
    assert found["status"] == "warn"
    assert found["reason"].startswith(f"--speculative-draft-model-path {other} is not the drafter checked here")
    assert "--model-path" not in found["reason"]  # the target checked is the one the server loads


def test_without_launch_arguments_there_is_no_launch_check(capsys, pair):
    target, draft = pair
    code, out, _ = run_cli(capsys, "--draft", draft, "--target", target, "--json")
    assert "launch args" not in {c["check"] for c in json.loads(out)["checks"]}


# -- the front door

def test_json_into_a_closed_pipe_ends_quietly(pair):
    """`check-drafter ... --json | head`: a reader that left makes the write fail; the command ends with the
    shell's status for it (141) and no traceback. The pipe's read end is closed before the command starts, so
    the first write fails however fast the reader would have been."""
    target, draft = pair
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "sglang_pcie", "check-drafter", "--draft", str(draft),
                               "--target", str(target), "--json"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, timeout=300)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_json_through_head_ends_quietly(pair):
    """The same through a real `head -c 1`, as a user types it."""
    target, draft = pair
    proc = subprocess.run(f"{shlex.quote(sys.executable)} -m sglang_pcie check-drafter --draft {shlex.quote(str(draft))}"
                          f" --target {shlex.quote(str(target))} --json | head -c 1; exit ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.stdout == "{" and proc.stderr == ""
    assert proc.returncode in (0, 141)  # 0 where the whole report fit in the pipe before head left


@pytest.mark.parametrize("case", ["package folder", "file"])
def test_sglang_source_that_is_not_the_folder_to_give(capsys, tmp_path, pair, src23, case):
    target, draft = pair
    given = Path(src23) / "sglang" if case == "package folder" else draft / "config.json"
    code, out, err = run_cli(capsys, "--draft", draft, "--sglang-source", given)
    assert code == 2 and out == ""
    said = (f"that is the sglang package itself; give its parent folder '{src23}'" if case == "package folder"
            else "is a file, not a folder")
    assert said in err
    if case == "package folder":  # verify-patches reads through the same SourceTree
        assert cli_main(["verify-patches", "--sglang-source", str(given)]) == 2
        assert said in capsys.readouterr().err


def test_a_file_where_a_model_folder_is_expected(capsys, pair):
    target, draft = pair
    code, out, err = run_cli(capsys, "--draft", draft / "config.json", "--target", target)
    assert code == 2 and err.strip() == (f"sglang-pcie check-drafter: error: {draft / 'config.json'}: is a file, not"
                                         " a folder (give the model folder that holds config.json)")
