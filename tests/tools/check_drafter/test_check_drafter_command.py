"""The command: bad usage, the sample text in the wheel, the CLI in a real process."""
from __future__ import annotations

import subprocess
import sys

from drafter_models import run_cli
from drafter_models import frequent_ids_fixture, pair_fixture, tokenizer_json_fixture  # noqa: F401 (fixtures)
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
