"""Every variable is validated in one place; a bad value is one line naming it, never an exception."""
from __future__ import annotations

import re

import pytest

from sglang_pcie.patching import register
from sglang_pcie.runtime.settings import (DISABLE_PATCHES_VAR, DISABLE_VAR, IPC_VARS, VARIABLES, Settings,
                                          load_settings, unknown_patch_ids, variable)
from support import REPO


def test_defaults():
    s = load_settings({})
    assert (s.disabled, s.strict, s.nccl_profile, s.eagle3_profile, s.eagle3_profile_interval, s.errors) == (
        False, False, "auto", False, 1000, [])


@pytest.mark.parametrize("name, value", [
    ("SGLANG_PCIE_NCCL_PROFILE", "fast"),
    ("EAGLE3_PROFILE", "maybe"),
    ("EAGLE3_PROFILE_INTERVAL", "-3"),
    ("EAGLE3_PROFILE_BASELINE_MS", "abc"),
    ("SGLANG_PCIE_STRICT", "2"),
])
def test_invalid_value_is_one_error_naming_variable_and_value(name, value):
    s = load_settings({name: value})
    assert len(s.errors) == 1 and name in s.errors[0] and repr(value) in s.errors[0]


def test_invalid_values_apply_nothing():
    s = load_settings({"SGLANG_PCIE_NCCL_PROFILE": "fast", "EAGLE3_PROFILE": "maybe"})
    assert s.nccl_profile is None and s.eagle3_profile is False


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_true_spellings(value):
    assert load_settings({"EAGLE3_PROFILE": value}).eagle3_profile is True


def test_profile_names_are_case_insensitive():
    assert load_settings({"SGLANG_PCIE_NCCL_PROFILE": " PCIe "}).nccl_profile == "pcie"


# ------------------------------------------------------------------------------- booleans: one parser


@pytest.mark.parametrize("value, expected", [
    ("1", True), (" TRUE ", True), ("yes", True), ("on", True),
    ("", False), ("0", False), ("false", False), ("No", False), ("off", False),
    ("2", None), ("y", None), ("maybe", None), ("\udcff", None),
])
def test_one_boolean_parser_for_the_hook_and_the_settings(value, expected):
    import sglang_pcie_startup

    assert sglang_pcie_startup.parse_flag(value) is expected
    s = load_settings({"EAGLE3_PROFILE": value})
    assert s.eagle3_profile is (expected is True) and len(s.errors) == (expected is None)


@pytest.mark.parametrize("value", ["2", "y", "maybe", "\udcff"])
def test_an_unreadable_kill_switch_disables_and_says_so(value):
    s = load_settings({"SGLANG_PCIE_DISABLE": value})
    assert s.disabled is True
    assert len(s.errors) == 1 and s.errors[0].startswith("SGLANG_PCIE_DISABLE=") and "the overlay is off" in s.errors[0]


def test_a_value_that_is_not_utf8_is_shown_as_its_bytes():
    s = load_settings({"SGLANG_PCIE_STRICT": "on\udcff"})
    assert s.errors == ["SGLANG_PCIE_STRICT=b'on\\xff' is not a boolean (use 1 or 0); ignored"]


# ------------------------------------------------------------------------------- SGLANG_PCIE_DISABLE_PATCHES


def test_settings_import_nothing_else_of_the_overlay():
    """The settings are a leaf: what needs the register or the tuned file is checked where those are read."""
    import ast

    from support import REPO

    tree = ast.parse((REPO / "sglang_pcie" / "runtime" / "settings.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("sglang_pcie.")}, imported  # the start-up hook is fine


def test_known_patch_ids_are_switched_off_silently():
    s = load_settings({"SGLANG_PCIE_DISABLE_PATCHES": " eagle3-profile, drafter-delegation ,"})
    assert s.disabled_patches == {"eagle3-profile", "drafter-delegation"} and s.errors == []
    assert unknown_patch_ids(s, register.ids(), {}) is None


@pytest.mark.parametrize("value, unknown", [
    ("drafter-delgation", "'drafter-delgation'"),
    ("eagle3-profile,sm120", "'sm120'"),
    ("eagle3-profile\udcff", "b'eagle3-profile\\xff'"),
])
def test_unknown_patch_id_is_one_error_naming_it(value, unknown):
    environ = {"SGLANG_PCIE_DISABLE_PATCHES": value}
    s = load_settings(environ)
    error = unknown_patch_ids(s, register.ids(), environ)
    assert error.startswith("SGLANG_PCIE_DISABLE_PATCHES=") and f"names no patch {unknown} " in error
    assert "eagle3-profile" in error  # the ids that exist are listed
    assert error.endswith("; every patch is off until it names only patch ids")  # what the gate does with it
    assert all(register.disabled_reason(entry, s) for entry in register.REGISTER)


# ------------------------------------------------------------------------------- EAGLE3_PROFILE_*


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity", "1e400", "0", "-2"])
def test_baseline_must_be_a_positive_finite_number(value):
    s = load_settings({"EAGLE3_PROFILE_BASELINE_MS": value})
    assert s.eagle3_profile_baseline_ms is None
    assert len(s.errors) == 1 and s.errors[0].startswith(f"EAGLE3_PROFILE_BASELINE_MS={value!r}")


def test_baseline_accepts_a_finite_number():
    s = load_settings({"EAGLE3_PROFILE_BASELINE_MS": " 12.5 "})
    assert (s.eagle3_profile_baseline_ms, s.errors) == (12.5, [])


def test_profile_file_in_a_writable_folder_is_kept_and_not_created(tmp_path):
    path = tmp_path / "profile.jsonl"
    s = load_settings({"EAGLE3_PROFILE_FILE": str(path)})
    assert (s.eagle3_profile_file, s.errors) == (str(path), [])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where, problem", [
    ("missing/profile.jsonl", "does not exist"),
    ("a-file/profile.jsonl", "does not exist"),
    ("", "is a folder"),
])
def test_profile_file_that_cannot_be_written_is_named_at_once(tmp_path, where, problem):
    (tmp_path / "a-file").write_text("")
    path = str(tmp_path / where)
    s = load_settings({"EAGLE3_PROFILE_FILE": path})
    assert s.eagle3_profile_file is None
    assert len(s.errors) == 1 and s.errors[0].startswith(f"EAGLE3_PROFILE_FILE={path!r}: ") and problem in s.errors[0]




def test_profile_file_in_a_read_only_folder_or_read_only_file_is_named():
    import json
    import os
    import subprocess
    import sys
    import tempfile

    import sglang_pcie_startup
    from support import REPO, SUPPORT

    with tempfile.TemporaryDirectory() as scratch:  # under /tmp, so that an ordinary user can reach it
        os.chmod(scratch, 0o755)
        folder = os.path.join(scratch, "read-only")
        os.mkdir(folder)
        files = [os.path.join(folder, "new.jsonl"), os.path.join(folder, "existing.jsonl")]
        open(files[1], "w").close()
        os.chmod(files[1], 0o444)
        os.chmod(folder, 0o555)
        paths = [str(REPO), os.path.dirname(sglang_pcie_startup.__file__)]
        script = SUPPORT / "scripts" / "settings_as_nobody.py"
        proc = subprocess.run([sys.executable, str(script), json.dumps({"paths": paths, "files": files,
                                                                           "scratch": scratch})],
                              capture_output=True, text=True)
        os.chmod(folder, 0o755)
    assert proc.returncode == 0, proc.stderr
    new, existing = json.loads(proc.stdout)
    assert new == [f"EAGLE3_PROFILE_FILE={files[0]!r}: folder {folder} is not writable; no JSON lines written"]
    assert existing == [f"EAGLE3_PROFILE_FILE={files[1]!r}: the file is not writable; no JSON lines written"]


def test_the_profile_interval_default_is_the_profilers():
    """One default in two places, because the settings are read at start-up and must not import the profiler (the
    benchmarks take the profiler's)."""
    from sglang_pcie.patches.eagle3_profile import profiler as profiler

    assert load_settings({}).eagle3_profile_interval == profiler.DEFAULT_INTERVAL == 1000


# ------------------------------------------------------------------------------- the one table of variables

NAME = re.compile(r"(?<![\w])(SGLANG_PCIE_[A-Z0-9_]*[A-Z0-9]|EAGLE3_PROFILE[A-Z0-9_]*)\b")
# Read by the checkout's GPU scripts (benchmarks/*.sh), never by the package: not the overlay's settings.
SCRIPT_VARIABLES = {"SGLANG_PCIE_WHEELS", "SGLANG_PCIE_FI_WHEELS"}


def _names_in(paths) -> dict[str, set]:
    found = {}
    for path in paths:
        for name in NAME.findall(path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_variable_the_source_names_is_a_row_of_the_table():
    """Every SGLANG_PCIE_* / EAGLE3_PROFILE* name in the package and the start-up hook (read through os.environ, an
    environment mapping, or a constant holding it) is declared in VARIABLES."""
    source = [*sorted((REPO / "sglang_pcie").rglob("*.py")), *sorted((REPO / "sitecustomize").rglob("*.py"))]
    named = _names_in(source)
    assert {"SGLANG_PCIE_DISABLE", "SGLANG_PCIE_TUNED_FILE", "SGLANG_PCIE_CACHE", "EAGLE3_PROFILE_FILE"} <= set(named)
    rows = {v.name for v in VARIABLES}
    assert {name: where for name, where in named.items() if name not in rows} == {}
    assert not SCRIPT_VARIABLES & set(named)


def test_the_pages_name_no_variable_the_table_lacks():
    pages = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", REPO / "ARCHITECTURE.md",
             REPO / "COMPATIBILITY.md", REPO / "benchmarks" / "README.md"]
    named = _names_in(pages)
    rows = {v.name for v in VARIABLES}
    assert {name: where for name, where in named.items() if name not in rows | SCRIPT_VARIABLES} == {}
    scripts = _names_in(sorted((REPO / "benchmarks").glob("*.sh")))
    assert SCRIPT_VARIABLES <= set(scripts)


def test_each_row_is_whole_and_named_once():
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names))
    for v in VARIABLES:
        assert v.reads_as and v.owner and v.meaning and "\n" not in v.meaning, v.name
        assert (v.field is None) == (v.parse is None), v.name
    assert {v.name for v in VARIABLES} >= set(IPC_VARS) | {DISABLE_VAR, DISABLE_PATCHES_VAR}


def test_the_settings_are_made_from_the_rows_with_a_field():
    """One attribute per parsed row, in the table's order, its default the row's default read by the row's parser."""
    import dataclasses

    parsed = [v for v in VARIABLES if v.field]
    assert [f.name for f in dataclasses.fields(Settings)] == [v.field for v in parsed] + ["errors"]
    s = Settings()
    assert [getattr(s, v.field) for v in parsed] == [v.parse(v.default) for v in parsed]
    assert load_settings({}) == s and s.errors == []
    assert variable("SGLANG_PCIE_NCCL_PROFILE").default == "auto" and s.nccl_profile == "auto"


@pytest.mark.parametrize("row", [v for v in VARIABLES if v.invalid], ids=lambda v: v.name)
def test_every_row_that_can_be_wrong_says_so_in_one_line_and_takes_its_safe_value(row, tmp_path):
    bad = {"boolean": "maybe", "writable_file": str(tmp_path / "missing" / "f.jsonl")}.get(row.parse.__name__, "x y")
    s = load_settings({row.name: bad})
    value, effect = row.invalid
    assert s.errors == [s.errors[0]] and s.errors[0].startswith(f"{row.name}={bad!r}")
    assert s.errors[0].endswith(f"; {effect}") and getattr(s, row.field) == value


def test_errors_are_listed_in_the_tables_order():
    s = load_settings({"EAGLE3_PROFILE_INTERVAL": "0", "SGLANG_PCIE_NCCL_PROFILE": "x", "EAGLE3_PROFILE": "x",
                       "SGLANG_PCIE_STRICT": "x"})
    assert [e.split("=")[0] for e in s.errors] == ["SGLANG_PCIE_STRICT", "EAGLE3_PROFILE", "SGLANG_PCIE_NCCL_PROFILE",
                                                  "EAGLE3_PROFILE_INTERVAL"]


def test_the_settings_pickle_by_name():
    import pickle

    s = load_settings({"SGLANG_PCIE_STRICT": "1", "SGLANG_PCIE_DISABLE_PATCHES": "a,b"})
    assert pickle.loads(pickle.dumps(s)) == s and type(s).__module__ == "sglang_pcie.runtime.settings"
