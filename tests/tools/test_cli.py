"""The command line on pristine release sources: verify-patches (report, exit codes), apply-diffs (all or
nothing), env and the metadata listing."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from sglang_pcie.patching.engine import STATUSES
from sglang_pcie.tools.cli import main
from sglang_pcie.patching.diffs import diffs_for, touched_files
from sglang_pcie.patching.engine import all_patches

PATCH_IDS = ["sm120-allreduce-fusion", "eagle3-profile", "drafter-delegation"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def copy_of(pristine_source, tmp_path):
    """A writable copy of the whole release (hard links: cheap; a file is only ever replaced, never written in
    place), and the files the diffs of ``version`` touch."""
    def make(version):
        source = pristine_source(version)
        target = tmp_path / version
        try:
            shutil.copytree(source, target, copy_function=os.link)
        except OSError:  # the cache is on another file system
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
        files = sorted({rel for diff in diffs_for(version) for rel in touched_files(diff)})
        return source, target, files
    return make


def replace_text(path, old, new):
    """Replace a file of a hard-linked copy by an edited one (never writing through the link)."""
    text = path.read_text()
    assert old in text
    path.unlink()
    path.write_text(text.replace(old, new))


def snapshot(root, version):
    """Every file (with its bytes) in the folders apply-diffs may write to (those of the files its diffs touch):
    what "nothing changed" and "restored byte for byte" compare, stray files included."""
    folders = {(root / rel).parent for diff in diffs_for(version) for rel in touched_files(diff)}
    return {p.relative_to(root).as_posix(): p.read_bytes() for folder in folders for p in sorted(folder.iterdir())
            if p.is_file()}


def test_registry_ids_are_the_issue_ids():
    assert [p.id for p in all_patches()] == PATCH_IDS


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_static_json_report(capsys, pristine_source, version):
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source(version)), "--json")
    report = json.loads(out)
    assert code == 0
    assert set(report) == {"sglang_version", "mode", "source", "patches", "nccl", "allreduce"}
    assert (report["sglang_version"], report["mode"]) == (version, "static")
    assert [row["id"] for row in report["patches"]] == PATCH_IDS
    assert all(row["status"] in STATUSES and row["detail"] for row in report["patches"])
    # eagle3-profile is opt-in: switched off, its fit is still checked and named.
    eagle = report["patches"][1]
    assert eagle["status"] == "disabled" and "applicable" in eagle["detail"]
    assert {"requested", "profile", "values", "user_set", "reason"} <= set(report["nccl"])


def test_sglang_version_fetches_the_release(capsys):
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-version", "0.5.21", "--json")
    assert code == 0 and json.loads(out)["sglang_version"] == "0.5.21"


def test_a_release_older_than_the_covered_range_is_not_applicable(capsys):
    """Issue 10: `verify-patches --sglang-version 0.5.7` must not say applicable; every row names the range."""
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-version", "0.5.7", "--json")
    rows = json.loads(out)["patches"]
    assert code == 0 and [row["id"] for row in rows] == PATCH_IDS
    assert all(row["status"] in ("not-applicable", "disabled") for row in rows), rows
    assert all("sglang 0.5.7 is older than the releases this patch covers (0.5.8 to 0.5.23)" in row["detail"]
               for row in rows), rows


def test_human_table_names_each_patch_and_the_nccl_profile(capsys, pristine_source):
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source("0.5.9")))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("sglang 0.5.9 (static")
    assert [line.split()[0] for line in lines[2:5]] == PATCH_IDS
    assert any(line.startswith("NCCL profile:") for line in lines) and "a server started now uses:" in lines[-1]


def test_user_disabled_patch_is_reported_disabled(capsys, pristine_source, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", "drafter-delegation")
    _, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source("0.5.9")), "--json")
    rows = {row["id"]: row for row in json.loads(out)["patches"]}
    assert rows["drafter-delegation"]["status"] == "disabled"
    assert rows["drafter-delegation"]["detail"].startswith("listed in SGLANG_PCIE_DISABLE_PATCHES")
    # sm120-allreduce-fusion is opt-in: disabled until SGLANG_PCIE_SM120_FUSION=1, its fit still checked.
    assert rows["sm120-allreduce-fusion"] == {"id": "sm120-allreduce-fusion", "status": "disabled",
                                              "detail": "opt-in: set SGLANG_PCIE_SM120_FUSION=1 (source check: "
                                                        "applicable)"}


@pytest.mark.parametrize("name, value", [("SGLANG_PCIE_NCCL_PROFILE", "fastest"), ("EAGLE3_PROFILE", "yes please")])
def test_bad_setting_exits_2_naming_it(capsys, pristine_source, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    code, _, err = run_cli(capsys, "verify-patches", "--sglang-source", str(pristine_source("0.5.9")))
    assert code == 2 and name in err and repr(value) in err


@pytest.mark.parametrize("argv", [
    ["verify-patches", "--sglang-source", "/nonexistent"],
    ["verify-patches", "--runtime", "--sglang-version", "0.5.9"],
    ["apply-diffs", "--target", "/nonexistent"],
])
def test_bad_usage_exits_2_with_one_line(capsys, argv):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("sglang-pcie: error:")


def test_both_sources_is_a_usage_error(capsys):
    assert main(["verify-patches", "--sglang-source", "x", "--sglang-version", "0.5.9"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_drift_exits_1(capsys, copy_of):
    _, target, _ = copy_of("0.5.9")
    replace_text(target / "sglang/srt/layers/communicator.py", "def apply_flashinfer_allreduce_fusion(",
                 "def fusion_gate(")
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(target), "--json")
    rows = {row["id"]: row["status"] for row in json.loads(out)["patches"]}
    assert code == 1 and rows["sm120-allreduce-fusion"] == "drifted"


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_apply_diffs_dry_run_apply_again_reverse(capsys, copy_of, version):
    source, target, files = copy_of(version)
    pristine = snapshot(target, version)

    # Removing diffs a tree does not carry: refused, one line per patch naming its status, exit 1.
    for dry_run in (["--dry-run"], []):
        code, out, err = run_cli(capsys, "apply-diffs", "--target", str(target), "--reverse", *dry_run)
        assert code == 1 and out == "", err
        lines = err.strip().splitlines()
        assert [line.split()[2] for line in lines[:-1]] == PATCH_IDS
        assert all(" is applicable: " in line for line in lines[:-1]) and "changed nothing" in lines[-1]
        assert snapshot(target, version) == pristine

    code, out, _ = run_cli(capsys, "apply-diffs", "--target", str(target), "--dry-run")
    assert code == 0 and out.startswith(f"would apply 3 diff(s) for sglang {version}")
    assert snapshot(target, version) == pristine

    code, out, _ = run_cli(capsys, "apply-diffs", "--target", str(target))
    assert code == 0 and out.startswith(f"applied 3 diff(s) for sglang {version}")
    applied = snapshot(target, version)
    changed = sorted(rel for rel in applied if applied[rel] != pristine.get(rel))
    assert changed == files and set(applied) == set(pristine)  # no stray staging file left behind
    assert all(b"sglang-pcie:" in applied[rel] for rel in changed)
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(target), "--json")
    assert {row["status"] for row in json.loads(out)["patches"]} <= {"applied", "disabled"}

    for dry_run in (["--dry-run"], []):  # a second run: already applied, exit 0, nothing changes
        code, out, _ = run_cli(capsys, "apply-diffs", "--target", str(target), *dry_run)
        assert code == 0 and out.startswith(f"already applied: sglang {version} in {target}"), out
        assert snapshot(target, version) == applied

    code, out, _ = run_cli(capsys, "apply-diffs", "--target", str(target), "--reverse", "--dry-run")
    assert code == 0 and out.startswith("would remove 3 diff(s)") and snapshot(target, version) == applied
    code, out, _ = run_cli(capsys, "apply-diffs", "--target", str(target), "--reverse")
    assert code == 0 and out.startswith("removed 3 diff(s)")
    assert snapshot(target, version) == pristine  # byte for byte


def test_apply_diffs_refuses_where_verify_says_drifted(capsys, copy_of):
    version = "0.5.9"
    source, target, files = copy_of(version)
    replace_text(target / "sglang/srt/layers/communicator.py", "(_is_sm90_supported or _is_sm100_supported)",
                 "(_is_sm90_supported)")
    before = snapshot(target, version)
    outputs = []
    for dry_run in (["--dry-run"], []):  # the dry run answers exactly what the real run does
        code, out, err = run_cli(capsys, "apply-diffs", "--target", str(target), *dry_run)
        assert code == 1 and out == ""
        outputs.append(err)
        assert snapshot(target, version) == before
    assert outputs[0] == outputs[1]
    lines = outputs[0].strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("sglang-pcie: refused: sm120-allreduce-fusion is drifted: ")


def test_apply_diffs_applies_only_the_change_the_check_approves(copy_of, tmp_path):
    """A diff that applies cleanly but is not what rewrite() makes of this tree (here: a doctored copy of the
    committed one) is refused, and nothing is written."""
    from sglang_pcie.patching.source import SourceTree
    from sglang_pcie.patching.diffs import REFUSE, apply_release_diffs

    version = "0.5.9"
    _, target, _ = copy_of(version)
    before = snapshot(target, version)
    doctored = tmp_path / "diffs" / "0.5.9"
    shutil.copytree(diffs_for("0.5.9")[0].parent, doctored)
    eagle = doctored / "eagle3-profile.diff"
    eagle.write_text(eagle.read_text().replace('@_sglang_pcie_profile_phase("draft")',
                                               '@_sglang_pcie_profile_phase("verify")'))
    run = apply_release_diffs(SourceTree(target), diffs_dir=doctored.parent)
    assert [s.patch_id for s in run.refused] == ["eagle3-profile"]
    assert "does not make the change this tree needs" in run.refused[0].why
    assert all(s.action != REFUSE for s in run.steps if s.patch_id != "eagle3-profile")
    assert snapshot(target, version) == before


def test_apply_diffs_that_cannot_write_changes_nothing(capsys, copy_of):
    """A file that cannot be written (here: its staging name is taken by a folder) fails before any original is
    replaced, and the copies already staged are removed."""
    version = "0.5.9"
    _, target, files = copy_of(version)
    (target / (files[-1] + ".sglang-pcie-new")).mkdir()
    before = snapshot(target, version)
    code, out, err = run_cli(capsys, "apply-diffs", "--target", str(target))
    assert code == 2 and out == "" and "cannot write in" in err and "nothing changed" in err
    assert snapshot(target, version) == before


def test_apply_diffs_for_a_release_without_diffs(capsys, tmp_path):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang/__init__.py").write_text("")
    (tmp_path / "sglang/_version.py").write_text("__version__ = version = '0.4.0'\n")
    code, _, err = run_cli(capsys, "apply-diffs", "--target", str(tmp_path))
    assert code == 2 and "no diffs for sglang 0.4.0" in err


def test_metadata_lists_every_field(capsys):
    code, out, _ = run_cli(capsys, "verify-patches", "--metadata", "--json")
    meta = json.loads(out)
    assert code == 0 and [m["id"] for m in meta] == PATCH_IDS
    for item in meta:
        for key in ("summary", "why", "upstream", "remove_when", "releases", "upstream_check", "runtime_method",
                    "static_method", "targets"):
            assert item[key], (item["id"], key)


def test_env_reports_the_decision(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "pcie")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    code, out, _ = run_cli(capsys, "env", "--json")
    decision = json.loads(out)
    assert code == 0 and decision["profile"] == "pcie"
    assert decision["user_set"] == {"NCCL_PROTO": "Simple"} and "NCCL_PROTO" not in decision["values"]


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
