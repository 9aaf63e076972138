"""Running ``sglang-pcie`` commands in the test's own process."""
from __future__ import annotations

from sglang_pcie.tools.cli import main


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr) of ``sglang-pcie ARGV``."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
