"""``sglang-pcie`` / ``python -m sglang_pcie``: one parser tree over the commands of ``COMMAND_MODULES``."""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

import sglang_pcie
from sglang_pcie.tools.command import Command, UsageError

# In the order `sglang-pcie --help` lists them; each module defines COMMAND.
COMMAND_MODULES = (
    "sglang_pcie.tools.verify_patches",
    "sglang_pcie.tools.apply_diffs",
    "sglang_pcie.tools.env",
    "sglang_pcie.tools.doctor",
    "sglang_pcie.tools.profile_report",
    "sglang_pcie.tools.tune_nccl",
    "sglang_pcie.tools.bench",
    "sglang_pcie.tools.tune_spec",
    "sglang_pcie.tools.make_test_models",
    "sglang_pcie.tools.check_drafter",
)
BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a writer whose reader left (`... | head`)


def commands() -> list[Command]:
    return [importlib.import_module(name).COMMAND for name in COMMAND_MODULES]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-pcie", description=sglang_pcie.__doc__)
    parser.add_argument("--version", action="version", version=f"sglang-pcie {sglang_pcie.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in commands():
        p = sub.add_parser(command.name, help=command.help, description=command.description or command.help,
                           epilog=command.epilog, usage=command.usage)
        command.add_arguments(p)
        p.set_defaults(command_object=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    given = list(argv)
    passthrough = None
    if "--" in argv:  # what follows belongs to the command (bench: SGLang's launch arguments)
        split = argv.index("--")
        argv, passthrough = argv[:split], argv[split + 1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, or argparse's own usage error (2)
        return int(exc.code or 0)
    command: Command = args.command_object
    args.passthrough = passthrough
    args.argv = given[given.index(command.name) + 1:]  # as typed after the command's name (bench records it)
    try:
        if passthrough is not None and not command.passthrough:
            raise UsageError(f"takes no arguments after '--' (got {' '.join(passthrough) or 'none'})")
        code = command.run(args)
        sys.stdout.flush()  # here, where a reader that left is caught, not at exit
        return code
    except UsageError as exc:
        print(f"{command.prefix}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `sglang-pcie ... | head`: the reader left; no traceback
        quiet_stdout()
        return BROKEN_PIPE


def quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null, so that flushing it at exit raises nothing."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
