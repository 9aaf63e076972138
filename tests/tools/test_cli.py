"""The command line as a whole: one parser tree, usage errors, settings errors in every command, help texts."""
from __future__ import annotations


import pytest

from support.cli import run_cli



@pytest.mark.parametrize("argv", [
    ["verify-patches", "--sglang-source", "/nonexistent"],
    ["verify-patches", "--runtime", "--sglang-version", "0.5.9"],
    ["apply-diffs", "--target", "/nonexistent"],
])
def test_bad_usage_exits_2_with_one_line(capsys, argv):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("sglang-pcie: error:")


# ------------------------------------------------------------------------------------------------------------
# Settings and arguments validated before anything happens (helper `settings`): exit 2, one line naming them.


@pytest.mark.parametrize("name, value, shown", [
    ("SGLANG_PCIE_DISABLE_PATCHES", "drafter-delgation", "'drafter-delgation'"),
    ("SGLANG_PCIE_DISABLE_PATCHES", "eagle3-profile\udcff", "b'eagle3-profile\\xff'"),
    ("SGLANG_PCIE_TUNED_FILE", "/nonexistent/nccl-tuned.json", "'/nonexistent/nccl-tuned.json'"),
    ("EAGLE3_PROFILE_BASELINE_MS", "inf", "'inf'"),
    ("EAGLE3_PROFILE_FILE", "/nonexistent/profile.jsonl", "'/nonexistent/profile.jsonl'"),
    ("SGLANG_PCIE_DISABLE", "maybe", "'maybe'"),
])
@pytest.mark.parametrize("command", ["env", "verify-patches"])
def test_every_bad_setting_exits_2_naming_it(capsys, pristine_source, monkeypatch, name, value, shown, command):
    monkeypatch.setenv(name, value)
    argv = [command] if command == "env" else [command, "--sglang-source", str(pristine_source("0.5.23"))]
    code, _, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("sglang-pcie: error:")]
    assert code == 2 and len(lines) == 1 and f"{name}={shown}" in lines[0], err


def test_malformed_tuned_file_exits_2_naming_the_variable(capsys, monkeypatch, tmp_path):
    tuned = tmp_path / "tuned.json"
    tuned.write_text("{not json")
    monkeypatch.setenv("SGLANG_PCIE_TUNED_FILE", str(tuned))
    code, _, err = run_cli(capsys, "env")
    assert code == 2 and f"sglang-pcie: error: SGLANG_PCIE_TUNED_FILE={str(tuned)!r}: " in err


@pytest.mark.parametrize("version", ["../../x", "banana", "0.5.23/../../../y"])
def test_bad_version_is_one_line_naming_it_and_creates_nothing(capsys, monkeypatch, tmp_path, version):
    cache = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("SGLANG_PCIE_CACHE", str(cache))
    code, _, err = run_cli(capsys, "verify-patches", "--sglang-version", version)
    assert code == 2 and err == f"sglang-pcie: error: sglang version {version!r} is not a version number (e.g. 0.5.23)\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


def _parsers():
    """(command, parser) for the top-level parser and every command: one parser tree, whatever commands exist now."""
    import argparse

    from sglang_pcie.tools import cli

    found = []

    def walk(name, parser):
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{name} {sub_name}", sub)

    walk("sglang-pcie", cli.build_parser())
    return found


def test_every_option_of_every_command_has_help_text():
    import argparse

    parsers = _parsers()
    missing = []
    for name, parser in parsers:
        if parser is None:
            missing.append(f"{name}: no argparse parser found")
            continue
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {choice.dest for choice in action._choices_actions if choice.help}
                missing += [f"{name} {sub}: no help" for sub in action.choices if sub not in helped]
            elif not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
    assert len(parsers) >= 6 and not missing, "\n".join(missing)


@pytest.mark.parametrize("command", [["env"], ["env", "--json"], ["verify-patches", "--sglang-version", "0.5.23"]])
def test_a_tuned_file_that_is_a_fifo_is_one_error_line_not_a_hang_or_a_traceback(capsys, monkeypatch, tmp_path,
                                                                                  command):
    import os

    fifo = tmp_path / "nccl-tuned.json"
    os.mkfifo(fifo)
    monkeypatch.setenv("SGLANG_PCIE_TUNED_FILE", str(fifo))
    code, out, err = run_cli(capsys, *command)
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [f"sglang-pcie: error: SGLANG_PCIE_TUNED_FILE={str(fifo)!r}: tuned NCCL file"
                                        f" {fifo} is a FIFO, not a regular file; nothing applied from it"]


def test_every_commands_help_lists_its_exit_codes_in_plain_text_and_names_docs_by_url():
    """README: every command's --help lists its exit codes. Help is read in a terminal: no reST markup, and a page
    it points to is a URL (a wheel install has no docs/ folder)."""
    import re

    problems = []
    for name, parser in _parsers()[1:]:
        text = " ".join(parser.format_help().split())
        if not re.search(r"\bExit( status)?:? 0\b", text):
            problems.append(f"{name}: no exit codes")
        if "``" in text:
            problems.append(f"{name}: reST markup")
        for path in re.findall(r"(?<![\w/.-])docs/[\w.-]*\w", text):
            problems.append(f"{name}: names {path}, not its URL")
    assert not problems, "\n".join(problems)


def test_a_written_usage_line_names_each_options_argument_as_the_option_list_does():
    import re

    problems = []
    for name, parser in _parsers()[1:]:
        usage = parser.format_usage()
        for action in parser._actions:
            for option in action.option_strings:
                for written in re.findall(rf"{re.escape(option)} ([A-Z][A-Z_]*)\b", usage):
                    if written != (action.metavar or action.dest.upper()):
                        problems.append(f"{name}: usage {option} {written}, options {option} {action.metavar}")
    assert not problems, "\n".join(problems)


def _readme_tool_lines() -> dict[str, str]:
    """README's "The tools" block: command name -> the line that shows it (``verify-patches | apply-diffs`` both)."""
    import re

    from support import REPO

    block = re.search(r"## The tools\n\n```\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    lines = {}
    for line in block.splitlines():
        head = re.match(r"sglang-pcie ([\w-]+(?: \| [\w-]+)*)", line)
        assert head, f"README's tools block: {line!r} names no command"
        for name in head.group(1).split(" | "):
            lines[name] = line
    return lines


def test_readmes_tool_list_names_every_command_and_only_options_each_has():
    """README's list of tools: every command of the parser tree (tune-spec was missing), and each option it shows is
    one of that command's, with the choices it writes (``--workload batch|latency|both``) the parser's own."""
    import re

    from support import REPO

    lines = _readme_tool_lines()
    parsers = {name.removeprefix("sglang-pcie "): parser for name, parser in _parsers()[1:]}
    assert sorted(lines) == sorted(parsers)
    problems = []
    for name, line in lines.items():
        options = {o: a for a in parsers[name]._actions for o in a.option_strings}
        for option, choices in re.findall(r"(--[\w-]+)(?: ([a-z0-9]+(?:\|[a-z0-9]+)+)\b)?", line):
            if option not in options:
                problems.append(f"{name}: README shows {option}, which it does not take")
            elif choices and options[option].choices and set(choices.split("|")) != set(options[option].choices):
                problems.append(f"{name}: README shows {option} {choices}, the parser {options[option].choices}")
    assert not problems, "\n".join(problems)
    assert "--compare-d2t DIR" in lines["check-drafter"]
    pypi = (REPO / "docs" / "pypi.md").read_text()  # PyPI's page lists the commands too
    commands = pypi[pypi.index("## Commands"):].split("each has `--help`")[0]
    assert sorted(re.findall(r"`([\w-]+)`", commands)) == sorted(parsers)


def test_readme_links_the_page_of_every_command_that_has_one():
    import re

    from support import REPO

    text = (REPO / "README.md").read_text()
    pages = " ".join(text[text.index("## The tools"):text.index("## Release tracking")].split())
    linked = set(re.findall(r"\]\(docs/([\w-]+)\.md\)", pages))
    have_page = {name for name in _readme_tool_lines() if (REPO / "docs" / f"{name}.md").is_file()}
    assert have_page - linked == set() and "tune-spec" in have_page


# ------------------------------------------------------------------------------------------------------------
# The protocol every command shares (tools/command.py, run by tools/cli.py), on a command of the test's own.


@pytest.fixture
def probe_command(monkeypatch):
    """A command ``probe`` in place of the real ones: what it was handed, and what it should do."""
    from sglang_pcie.tools import cli
    from sglang_pcie.tools.command import Command, UsageError

    seen = {}

    def add_arguments(p):
        p.add_argument("--flag", action="store_true", help="a flag")

    def run(args):
        seen.update(argv=args.argv, passthrough=args.passthrough, flag=args.flag)
        if seen.get("raise"):
            raise UsageError(seen["raise"])
        return seen.get("code", 0)

    def install(**fields):
        command = Command("probe", "probes the protocol", add_arguments, run, **fields)
        monkeypatch.setattr(cli, "commands", lambda: [command])
        return command

    return install, seen


def test_what_follows_the_first_double_dash_goes_to_a_command_that_takes_it(capsys, probe_command):
    install, seen = probe_command
    install(passthrough=True)
    code, _, _ = run_cli(capsys, "probe", "--flag", "--", "--model-path", "m", "--", "x")
    assert code == 0 and seen["passthrough"] == ["--model-path", "m", "--", "x"] and seen["flag"] is True
    assert seen["argv"] == ["--flag", "--", "--model-path", "m", "--", "x"]  # as typed after the command's name
    run_cli(capsys, "probe")
    assert seen["passthrough"] is None and seen["argv"] == []


@pytest.mark.parametrize("after, shown", [(["a", "b"], "a b"), ([], "none")])
def test_a_command_that_takes_nothing_after_double_dash_refuses_it_in_one_line(capsys, probe_command, after, shown):
    install, seen = probe_command
    install()
    code, out, err = run_cli(capsys, "probe", "--", *after)
    assert (code, out, err) == (2, "", f"sglang-pcie probe: error: takes no arguments after '--' (got {shown})\n")
    assert seen == {}  # it never ran


def test_a_usage_error_is_one_line_under_the_commands_prefix_and_exit_2(capsys, probe_command):
    install, seen = probe_command
    install(error_prefix="sglang-pcie")
    seen["raise"] = "--flag: not today"
    assert run_cli(capsys, "probe", "--flag") == (2, "", "sglang-pcie: error: --flag: not today\n")
    install()
    assert run_cli(capsys, "probe", "--flag") == (2, "", "sglang-pcie probe: error: --flag: not today\n")


def test_the_commands_own_status_is_the_exit_status_and_help_defaults_to_its_line(capsys, probe_command):
    install, seen = probe_command
    install(epilog="Exit status: 0, or 3.")
    seen["code"] = 3
    assert run_cli(capsys, "probe")[0] == 3
    code, out, _ = run_cli(capsys, "probe", "--help")
    assert code == 0 and "probes the protocol" in out and "Exit status: 0, or 3." in out
    install(description="a longer description")
    assert "a longer description" in run_cli(capsys, "probe", "--help")[1]


def test_version_and_argparse_errors_exit_as_argparse_says(capsys):
    import sglang_pcie

    code, out, _ = run_cli(capsys, "--version")
    assert (code, out) == (0, f"sglang-pcie {sglang_pcie.__version__}\n")
    code, _, err = run_cli(capsys, "env", "--no-such-option")
    assert code == 2 and "unrecognized arguments: --no-such-option" in err
    assert run_cli(capsys)[0] == 2  # no command


def test_a_reader_that_left_ends_the_command_with_141_and_no_traceback():
    """``sglang-pcie env | head``, the reader gone before the first write: the shell's status for a broken pipe
    (128 + SIGPIPE), nothing on stderr."""
    import os
    import subprocess
    import sys

    from support import REPO

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "sglang_pcie", "env"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, timeout=120,
                              env={k: v for k, v in os.environ.items() if not k.startswith("SGLANG_PCIE_")})
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


# ------------------------------------------------------------------------------------------------------------
# The table of commands: data, each module imported only when its command runs or its own --help is asked.


def test_the_tables_help_lines_and_order_are_each_modules_own():
    import importlib

    from sglang_pcie.tools import cli

    loaded = [importlib.import_module(entry.module).COMMAND for entry in cli.COMMANDS]
    assert [(c.name, c.help) for c in loaded] == [(e.name, e.help) for e in cli.COMMANDS]
    assert [c.name for c in loaded] == [e.name for e in cli.COMMANDS] and len(loaded) >= 10


def _command_modules_imported(*argv):
    """(exit status, the table's modules a fresh ``sglang-pcie ARGV`` imported, how many sglang_pcie modules)."""
    import json
    import os
    import subprocess
    import sys

    from support import REPO

    code = ("import json, sys\nfrom sglang_pcie.tools import cli\nstatus = cli.main(sys.argv[1:])\n"
            "own = [m for m in sys.modules if m.startswith('sglang_pcie')]\n"
            "print(json.dumps([status, [e.module for e in cli.COMMANDS if e.module in sys.modules], len(own)]),"
            " file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("SGLANG_PCIE_")} | {"COLUMNS": "400"})
    return json.loads(proc.stderr.strip().splitlines()[-1]), proc.stdout


def test_top_level_help_imports_no_command_module_and_lists_the_table():
    from sglang_pcie.tools import cli

    (status, imported, own), out = _command_modules_imported("--help")
    assert (status, imported) == (0, []) and own <= 5
    listed = [line.split(None, 1) for line in out.splitlines() if line.startswith("    ")]  # one line each (COLUMNS)
    assert listed == [[entry.name, entry.help] for entry in cli.COMMANDS]


def test_a_commands_own_help_imports_only_its_module():
    (status, imported, _), out = _command_modules_imported("env", "--help")
    assert (status, imported) == (0, ["sglang_pcie.tools.env"]) and "--nnodes N" in out
    (status, imported, _), _ = _command_modules_imported("nope")
    assert (status, imported) == (2, [])


def test_the_command_named_is_the_first_word_that_is_not_an_option():
    from sglang_pcie.tools.cli import named

    assert named(["--version"]) is None and named([]) is None
    assert named(["env", "--json"]) == "env" and named(["-h", "bench", "x"]) == "bench"
