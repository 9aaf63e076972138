"""``sglang-pcie`` / ``python -m sglang_pcie``: one parser tree over the table of commands (``COMMANDS``).

The table is data (name, module, help line): ``sglang-pcie --help`` lists it without importing a command's module, and
a command's module (which defines ``COMMAND``) is imported only when that command runs or its own ``--help`` is asked.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from dataclasses import dataclass

import sglang_pcie
from sglang_pcie.tools.command import Command, UsageError


@dataclass(frozen=True)
class Entry:
    """A command as the table names it; ``load()`` imports its module for the ``Command`` (a test keeps ``help`` equal
    to the module's ``COMMAND.help``)."""
    name: str
    module: str
    help: str

    def load(self) -> Command:
        return importlib.import_module(self.module).COMMAND


# In the order `sglang-pcie --help` lists them.
COMMANDS = (
    Entry("verify-patches", "sglang_pcie.tools.verify_patches",
          "each patch's status for an SGLang release, and the NCCL profile"),
    Entry("apply-diffs", "sglang_pcie.tools.apply_diffs",
          "apply the versioned diffs to an SGLang source tree, all or nothing"),
    Entry("env", "sglang_pcie.tools.env",
          "the NCCL profile, the PCIe-IPC all-reduce switch and the all-reduce paths a server would use here, and why"),
    Entry("doctor", "sglang_pcie.tools.doctor",
          "what on this box will hang, corrupt or slow a multi-GPU server: peer-to-peer measured, the host, the "
          "all-reduce plan, the network"),
    Entry("profile-report", "sglang_pcie.tools.profile_report", "summarise an EAGLE3_PROFILE log or JSON-lines file"),
    Entry("tune-nccl", "sglang_pcie.tools.tune_nccl", "measure NCCL profiles on the local GPUs and keep the best"),
    Entry("bench", "sglang_pcie.tools.bench",
          "one real server per variant (baseline, overlay, profile, yours), side by side"),
    Entry("tune-spec", "sglang_pcie.tools.tune_spec",
          "the speculative setting that serves this box fastest at each concurrency, measured"),
    Entry("make-test-models", "sglang_pcie.tools.make_test_models",
          "write a tiny random Llama target and EAGLE-3 drafter (no downloads)"),
    Entry("check-drafter", "sglang_pcie.tools.check_drafter",
          "check an EAGLE-3 drafter against its target without loading weights"),
)
COMMAND_MODULES = tuple(entry.module for entry in COMMANDS)
BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a writer whose reader left (`... | head`)
EVERY = object()  # build_parser(only=EVERY): every command's own parser


def commands() -> list[Entry | Command]:
    """The commands, in --help's order: table entries, each loaded when it is wanted (a ``Command`` is taken as is)."""
    return list(COMMANDS)


def build_parser(only: str | None | object = EVERY) -> argparse.ArgumentParser:
    """The parser tree: every command's own parser, or only the command named ``only`` (None: none), the others a
    help line from the table (what `sglang-pcie --help` lists; naming one of them is parsed by its own parser)."""
    parser = argparse.ArgumentParser(prog="sglang-pcie", description=sglang_pcie.__doc__)
    parser.add_argument("--version", action="version", version=f"sglang-pcie {sglang_pcie.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for item in commands():
        if only is not EVERY and item.name != only:
            sub.add_parser(item.name, help=item.help)
            continue
        command = item.load() if isinstance(item, Entry) else item
        p = sub.add_parser(command.name, help=command.help, description=command.description or command.help,
                           epilog=command.epilog, usage=command.usage)
        command.add_arguments(p)
        p.set_defaults(command_object=command)
    return parser


def named(argv: list[str]) -> str | None:
    """The command argv names: its first word that is not an option (the top level's options take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    given = list(argv)
    passthrough = None
    if "--" in argv:  # what follows belongs to the command (bench: SGLang's launch arguments)
        split = argv.index("--")
        argv, passthrough = argv[:split], argv[split + 1:]
    try:
        args = build_parser(only=named(argv)).parse_args(argv)
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
