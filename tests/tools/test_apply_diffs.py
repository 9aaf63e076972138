"""sglang-pcie apply-diffs: all or nothing on copies of real releases, exactly the change the checks approve, and
the odd but legal trees users have (a BOM, links into a shared store, read-only folders, another owner)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from sglang_pcie.patching.diffs import diffs_for, touched_files
from support.cli import run_cli
from support.releases import release_copy, replace_text

from support import PATCH_IDS, REPO


@pytest.fixture
def copy_of(pristine_source, tmp_path):
    """A writable copy of the whole release, and the files the diffs of ``version`` touch."""
    def make(version):
        target = release_copy(version, tmp_path / version)
        files = sorted({rel for diff in diffs_for(version) for rel in touched_files(diff)})
        return pristine_source(version), target, files
    return make


def snapshot(root, version):
    """Every file (with its bytes) in the folders apply-diffs may write to (those of the files its diffs touch):
    what "nothing changed" and "restored byte for byte" compare, stray files included."""
    folders = {(root / rel).parent for diff in diffs_for(version) for rel in touched_files(diff)}
    return {p.relative_to(root).as_posix(): p.read_bytes() for folder in folders for p in sorted(folder.iterdir())
            if p.is_file()}




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
    assert code == 0 and out.startswith(f"would apply {len(PATCH_IDS)} diff(s) for sglang {version}")
    assert snapshot(target, version) == pristine

    code, out, _ = run_cli(capsys, "apply-diffs", "--target", str(target))
    assert code == 0 and out.startswith(f"applied {len(PATCH_IDS)} diff(s) for sglang {version}")
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
    assert code == 0 and out.startswith(f"would remove {len(PATCH_IDS)} diff(s)")
    assert snapshot(target, version) == applied
    code, out, _ = run_cli(capsys, "apply-diffs", "--target", str(target), "--reverse")
    assert code == 0 and out.startswith(f"removed {len(PATCH_IDS)} diff(s)")
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
    from sglang_pcie.patching.diff_apply import REFUSE, apply_release_diffs

    version = "0.5.9"
    _, target, _ = copy_of(version)
    before = snapshot(target, version)
    doctored = tmp_path / "diffs" / "0.5.9"
    shutil.copytree(diffs_for("0.5.9")[0].parent, doctored)
    eagle = doctored / "eagle3-profile.diff"
    eagle.write_text(eagle.read_text().replace("@_sglang_pcie_eagle3_profile('draft')",
                                               "@_sglang_pcie_eagle3_profile('verify')"))
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




# ---------------------------------------------------------------------------------------------------------------
# Odd but legal trees


def with_bom(path):
    data = path.read_bytes()
    path.unlink()  # never through a hard link
    path.write_bytes(b"\xef\xbb\xbf" + data)


def test_a_utf8_bom_is_read_through_and_kept(capsys, copy_of):
    version = "0.5.23"
    _, target, files = copy_of(version)
    for rel in files:
        with_bom(target / rel)
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(target), "--json")
    assert code == 0 and "error" not in {row["status"] for row in json.loads(out)["patches"]}
    before = snapshot(target, version)
    code, out, err = run_cli(capsys, "apply-diffs", "--target", str(target))
    assert code == 0 and out.startswith(f"applied {len(PATCH_IDS)} diff(s)"), err
    assert all((target / rel).read_bytes().startswith(b"\xef\xbb\xbf") for rel in files)
    code, _, err = run_cli(capsys, "apply-diffs", "--target", str(target), "--reverse")
    assert code == 0, err
    assert snapshot(target, version) == before  # byte for byte, BOM included


def test_a_link_into_a_shared_store_is_refused_by_default_and_followed_when_asked(capsys, copy_of, tmp_path):
    version = "0.5.23"
    _, target, files = copy_of(version)
    store = tmp_path / "store"
    store.mkdir()
    shared = store / "model_runner.py"
    linked = next(rel for rel in files if rel.endswith("model_runner.py"))
    shutil.copy(target / linked, shared)
    (target / linked).unlink()
    (target / linked).symlink_to(shared)
    before, shared_before = snapshot(target, version), shared.read_bytes()
    for dry_run in (["--dry-run"], []):
        code, out, err = run_cli(capsys, "apply-diffs", "--target", str(target), *dry_run)
        assert code == 1 and out == "" and f"{linked} is a symbolic link (to {shared})" in err
        assert "--follow-links" in err and snapshot(target, version) == before and shared.read_bytes() == shared_before
    code, out, err = run_cli(capsys, "apply-diffs", "--target", str(target), "--follow-links")
    assert code == 0, err
    assert (target / linked).is_symlink() and b"sglang-pcie: drafter-delegation" in shared.read_bytes()
    code, _, err = run_cli(capsys, "apply-diffs", "--target", str(target), "--reverse", "--follow-links")
    assert code == 0, err
    assert (target / linked).is_symlink() and shared.read_bytes() == shared_before


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_owner_and_mode_are_kept_by_a_root_run(capsys, copy_of):
    version = "0.5.23"
    _, target, files = copy_of(version)
    for rel in files:  # as an installer running as another user would have left them
        path = target / rel
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)
        os.chown(path, 1234, 5678)
        os.chmod(path, 0o640)
    code, _, err = run_cli(capsys, "apply-diffs", "--target", str(target))
    assert code == 0, err
    for rel in files:
        info = (target / rel).stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (1234, 5678, 0o640)


def test_a_dry_run_says_what_the_real_run_needs_when_the_folder_is_not_writable(capsys, copy_of, monkeypatch):
    # As a non-root user on a system tree: the folders cannot be written. os.access answers as the real run
    # would fail; root passes any permission check, so the denial is simulated for one folder.
    from sglang_pcie.patching import diff_apply

    version = "0.5.23"
    _, target, files = copy_of(version)
    locked = (target / files[0]).parent
    real_access = os.access
    monkeypatch.setattr(diff_apply.os, "access", lambda path, mode: False if path == locked else real_access(path, mode))
    before = snapshot(target, version)
    results = []
    for dry_run in (["--dry-run"], []):
        code, out, err = run_cli(capsys, "apply-diffs", "--target", str(target), *dry_run)
        results.append((code, err))
        assert code == 1 and out == "" and f"cannot write in {locked}" in err
        assert snapshot(target, version) == before
    assert results[0] == results[1]  # the dry run answers what the real run does


def test_the_diffs_applied_are_those_whose_source_check_verify_patches_shows_applicable(capsys, copy_of, monkeypatch):
    """verify-patches lists the opt-in patches as disabled (no switch given) with 'source check: applicable';
    apply-diffs applies their diffs too, since the baked code asks the switches when SGLang imports it (every switch
    works in baked diffs as in runtime patches). The output, --help and README say so."""
    from sglang_pcie.patching import register
    from sglang_pcie.runtime.patch_table import DISABLE_PATCHES_REASON

    _, target, _ = copy_of("0.5.23")
    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", "node-agreement")
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(target), "--json")
    rows = json.loads(out)["patches"]
    fits = [row["id"] for row in rows if row["status"] == "applicable"
            or row["status"] == "disabled" and row["detail"].endswith("(source check: applicable)")]
    off = {row["id"] for row in rows if row["status"] == "disabled"}
    assert code == 0 and off == {e.id for e in register.REGISTER if e.opt_in} | {"node-agreement"}

    code, out, _ = run_cli(capsys, "apply-diffs", "--target", str(target), "--dry-run")
    first, *notes = out.splitlines()
    assert code == 0 and first.endswith(f": {', '.join(fits)}") and fits == PATCH_IDS
    named = {line.split(":")[0].strip(): line for line in notes}
    assert set(named) == off
    for entry in register.REGISTER:
        if entry.opt_in:
            assert f"({entry.opt_in.off_reason})" in named[entry.id], named[entry.id]
    assert f"({DISABLE_PATCHES_REASON})" in named["node-agreement"]

    code, out, _ = run_cli(capsys, "apply-diffs", "--help")
    help_text = " ".join(out.split())
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "applied where the patch's source check says applicable" in help_text
    assert "The switches (SGLANG_PCIE_DISABLE_PATCHES, an opt-in such as SGLANG_PCIE_SM120_FUSION=1) do not choose" \
           " the diffs" in help_text
    assert "applies a diff only where the patch's source check says `applicable`" in readme
    assert "The switches do not choose the diffs" in readme
