"""The one shape every ``sglang-pcie`` command has: a name, a help line, what it adds to the parser, what it runs.

Each command module defines ``COMMAND = Command(...)``; ``sglang_pcie.tools.cli`` builds one parser tree from them.
``run`` returns the exit status; ``args.passthrough`` holds what followed the first ``--`` (None without one), for
the commands that take it (bench: SGLang launch arguments).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Command:
    name: str
    help: str  # one line, for `sglang-pcie --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None  # the command's own --help text (default: help)
    epilog: str | None = None  # statuses and exit codes
    usage: str | None = None
    passthrough: bool = False  # takes arguments after `--`
    error_prefix: str = ""  # before ": error: <message>"; default "sglang-pcie <name>"

    @property
    def prefix(self) -> str:
        return self.error_prefix or f"sglang-pcie {self.name}"


class UsageError(Exception):
    """Bad input found after parsing: one line naming it, exit 2."""
