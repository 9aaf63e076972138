"""The one guard of every baked diff: the runtime's gate, and SGLang's own code without sglang-pcie.

The unit tests run the guard's lines as ``patching/baked.py`` generates them; the matrix runs the real SGLang 0.5.9
and 0.5.23 with every diff applied (``apply_release_diffs`` on a copy of the installed package) under each switch.
"""
from __future__ import annotations

import builtins
import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from sglang_pcie.patching import baked as lines
from sglang_pcie.patching import register
from sglang_pcie.patching.diff_apply import apply_release_diffs
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.runtime import baked, patch_table
from sglang_pcie.runtime.results import is_patched
from sglang_pcie.runtime.settings import load_settings

OPT_INS = {entry.opt_in.variable: "1" for entry in patch_table.TABLE if entry.opt_in}
ALL_IDS = patch_table.ids()
MARKED = json.dumps({entry.id: entry.marked for entry in register.REGISTER})  # where each patch's mark tells it acts


def original(x):
    return x


def test_the_guard_applies_the_registers_payload_only_where_the_gate_lets_it(monkeypatch):
    monkeypatch.setattr(baked, "payload_of", lambda row: lambda function, *args, settings: lambda: (row.id, args))
    for entry in patch_table.TABLE:
        monkeypatch.setattr("sglang_pcie.runtime.settings._PROCESS_SETTINGS", None)
        for name in ("SGLANG_PCIE_DISABLE", "SGLANG_PCIE_DISABLE_PATCHES", *OPT_INS):
            monkeypatch.delenv(name, raising=False)
        on = entry.opt_in is None
        assert (baked.guarded(entry.id, original) is not original) is on, entry.id
        if entry.opt_in:
            monkeypatch.setenv(entry.opt_in.variable, "1")
            monkeypatch.setattr("sglang_pcie.runtime.settings._PROCESS_SETTINGS", None)
            assert baked.guarded(entry.id, original, ("x",))() == (entry.id, ("x",))


@pytest.mark.parametrize("env", [{"SGLANG_PCIE_DISABLE": "1"}, {"SGLANG_PCIE_DISABLE_PATCHES": ",".join(ALL_IDS)},
                                 {"SGLANG_PCIE_DISABLE_PATCHES": f"{ALL_IDS[0]},no-such-patch"}],
                         ids=["disable", "disable-patches-all", "disable-patches-unknown-id"])
def test_every_switch_leaves_sglangs_own_function(monkeypatch, env):
    for name, value in {**OPT_INS, **env}.items():
        monkeypatch.setenv(name, value)
    assert all(baked.guard(patch_id)()(original) is original for patch_id in ALL_IDS)


def test_the_payload_gets_the_settings_the_gate_was_asked_with(monkeypatch):
    handed = []
    monkeypatch.setattr(baked, "payload_of", lambda row: lambda function, *args, settings: handed.append(settings))
    monkeypatch.setattr("sglang_pcie.runtime.settings._PROCESS_SETTINGS", None)
    from sglang_pcie.runtime.settings import for_process

    baked.guarded("node-agreement", original)
    assert handed == [for_process()]


def test_a_payload_that_fails_leaves_sglangs_function_and_says_so(monkeypatch, capsys):
    row = dataclasses.replace(patch_table.row("node-agreement"), payload="nowhere:x")
    monkeypatch.setattr(patch_table, "row", lambda patch_id: row)
    assert baked.guard(row.id)()(original) is original
    assert capsys.readouterr().err.startswith("sglang-pcie: node-agreement left original as SGLang ships it: ")


def test_the_payload_is_marked_with_its_patch():
    wrapped = baked.guarded("node-agreement", original)
    assert is_patched(wrapped, "node-agreement") and wrapped.__wrapped__ is original


@pytest.mark.parametrize("patch_id", ALL_IDS)
def test_without_sglang_pcie_the_guard_lines_are_the_identity(monkeypatch, patch_id):
    real_import = builtins.__import__

    def no_sglang_pcie(name, *args, **kwargs):
        if name.split(".")[0] == "sglang_pcie":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    for name, value in OPT_INS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(builtins, "__import__", no_sglang_pcie)
    namespace = {}
    exec(lines.guard_block(patch_id), namespace)
    decorator = namespace[lines.guard_name(patch_id)]
    assert decorator()(original) is original and decorator("draft")(original) is original


def test_every_line_the_guard_adds_carries_the_patchs_marker():
    for patch_id in ALL_IDS:
        block = lines.guard_block(patch_id) + lines.decorator(patch_id, "x")
        assert all(f"# sglang-pcie: {patch_id}" in line for line in block.splitlines())


# -- the real SGLang with every diff baked in

def baked_copy(site_packages, folder):
    """``folder``/sglang: the installed package as links, the files the diffs touch as copies, the diffs applied."""
    source = site_packages / "sglang"
    for root, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        target = folder / os.path.relpath(root, site_packages)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            (target / name).symlink_to(os.path.join(root, name))
    tree = SourceTree(folder)
    touched = {rel for patch_id in ALL_IDS for rel in _touched(tree.version, patch_id)}
    for rel in touched:  # copies, not links: the diffs write these
        path = folder / rel
        path.unlink()
        path.write_bytes((site_packages / rel).read_bytes())
    run = apply_release_diffs(tree)
    assert not run.refused and len(run.changing) == len(ALL_IDS), [(s.patch_id, s.action, s.why) for s in run.steps]
    return folder


def _touched(version, patch_id):
    from sglang_pcie.patching.diffs import diffs_root, touched_files

    diff = diffs_root() / version / f"{patch_id}.diff"
    return touched_files(diff) if diff.is_file() else []


def site_packages(python):
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


# (case, environment, sglang-pcie installed): every patch under each switch, the opt-ins given where they matter.
SWITCHES = [
    ("defaults", {}, True),
    ("opted-in", OPT_INS, True),
    ("disable", {**OPT_INS, "SGLANG_PCIE_DISABLE": "1"}, True),
    ("disable-patches-a", {**OPT_INS, "SGLANG_PCIE_DISABLE_PATCHES": ",".join(ALL_IDS[0::2])}, True),
    ("disable-patches-b", {**OPT_INS, "SGLANG_PCIE_DISABLE_PATCHES": ",".join(ALL_IDS[1::2])}, True),
    # an id that is no patch: every patch off in the baked image too (never half-applied)
    ("disable-patches-unknown-id", {**OPT_INS, "SGLANG_PCIE_DISABLE_PATCHES": f"{ALL_IDS[1]},no-such-patch"}, True),
    ("without-sglang-pcie", OPT_INS, False),
]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_baked_diffs_obey_every_switch(sglang_env, tmp_path, version):
    env = sglang_env(version)
    folder = baked_copy(site_packages(env.python), tmp_path / "baked")
    matrix = {}
    for case, variables, installed in SWITCHES:
        report = env.run_script_json("baked_switches.py", "installed" if installed else "absent", MARKED,
                                     env={**variables, "PYTHONPATH": str(folder)})
        assert report["sglang"].startswith(str(folder)), report["sglang"]  # the baked copy, not the install
        settings = load_settings(variables)
        expected = {e.id: installed and patch_table.disabled_reason(e, settings) is None for e in patch_table.TABLE}
        matrix[case] = report["acting"]
        assert report["acting"] == expected, case
        assert any(expected.values()) is (case in ("defaults", "opted-in", "disable-patches-a", "disable-patches-b"))
        if not installed:
            assert report["sglang_pcie_loaded"] == [], case
    print(version, matrix)  # the switch matrix, for the record (pytest -s)
