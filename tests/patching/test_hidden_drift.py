"""Hidden drift: copies of real releases whose patch targets were renamed, moved or reshaped, as SGLang does.

The danger of an overlay is a patch that silently stops fitting.  Each case edits a pristine release the way an
upstream refactor would, and the static check, ci/check-sglang-releases and ci/prepare-release-diffs must all
report that patch `drifted` (or name it for a human), while the other patches read exactly as on the release.

The cases are each patch's own, in ``tests/patches/<id>/drift.yaml``: a list of ``name``, ``release``, ``kind``
(``drift``: the check must say drifted; ``tolerated``: a change the patch follows by design, which must still fit),
``edits`` (a list of ``file`` / ``replace`` / ``with``, each replacing EVERY occurrence of a text that must be
there; or the name of an edit in ``NAMED_EDITS`` below), ``detail`` (what the result must say) and ``also`` (other
patches that hook the same code and must read drifted too).
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from support.releases import release_copy

from sglang_pcie.patching.engine import DRIFTED
from sglang_pcie.patching.matrix import check_tree
from sglang_pcie.patching.releases import fetch_source

from support import REPO

pytestmark = pytest.mark.slow  # upstream tracking over every release tree: CI runs it, the fast loop leaves it out
# What the patches' static checks read, copied instead of a release's 4,700 files.  The control test below
# proves the copy reads exactly as the release, so a case cannot pass merely because a file was left out.
READ_BY_THE_CHECKS = (
    "sglang/__init__.py", "sglang/version.py", "sglang/_version.py",
    "sglang/srt/layers/communicator.py", "sglang/srt/layers/flashinfer_comm_fusion.py",
    "sglang/srt/layers/layer_boundary/residual/add_norm.py", "sglang/srt/layers/logits_processor.py",
    "sglang/srt/speculative", "sglang/srt/models", "sglang/srt/model_executor",
    "sglang/srt/runtime_context.py", "sglang/srt/utils/__init__.py", "sglang/srt/utils/common.py",
    "sglang/srt/distributed",
    "sglang/srt/managers/tokenizer_manager.py", "sglang/srt/managers/utils.py",
)
ADD_NORM = "sglang/srt/layers/layer_boundary/residual/add_norm.py"
TESTS = REPO / "tests"


def copy_release(version: str, dest: Path) -> Path:
    return release_copy(version, dest, only=list(READ_BY_THE_CHECKS))


def replace(rel: str, *pairs: tuple[str, str]) -> Callable[[Path], None]:
    """An edit of one file: every occurrence of each old text (which must be there) replaced."""
    def edit(root: Path) -> None:
        path = root / rel
        text = path.read_text(encoding="utf-8")
        for old, new in pairs:
            assert old in text, f"{rel} has no {old!r}: the case no longer matches the release"
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    return edit


def move_gate_to_its_own_module(root: Path) -> None:
    """0.5.23's gate moved from add_norm.py to a new module, which add_norm.py imports it from."""
    add_norm = root / ADD_NORM
    lines = add_norm.read_text(encoding="utf-8").splitlines(keepends=True)
    gate = next(node for node in ast.parse("".join(lines)).body
                if isinstance(node, ast.FunctionDef) and node.name == "flashinfer_ar_fusion_applies")
    body = "".join(lines[gate.lineno - 1:gate.end_lineno])
    (add_norm.parent / "fusion_gate.py").write_text(
        "from sglang.srt.layers.layer_boundary.residual.add_norm import *  # noqa\n\n\n" + body, encoding="utf-8")
    lines[gate.lineno - 1:gate.end_lineno] = [
        "from sglang.srt.layers.layer_boundary.residual.fusion_gate import flashinfer_ar_fusion_applies\n"]
    add_norm.write_text("".join(lines), encoding="utf-8")


NAMED_EDITS = {"move-gate-to-its-own-module": move_gate_to_its_own_module}
CASE_KEYS = {"name", "release", "kind", "edits", "detail", "also"}
EDIT_KEYS = {"file", "replace", "with"}


@dataclass(frozen=True)
class Case:
    name: str
    version: str
    patch: str
    edit: Callable[[Path], None]
    detail: str  # what the drifted result must say
    also: tuple[str, ...] = ()  # other patches that hook the same code and must read drifted too

    def __str__(self):
        return self.name


def edit_of(edits) -> Callable[[Path], None]:
    if isinstance(edits, str):
        return NAMED_EDITS[edits]
    steps = [replace(edit["file"], (edit["replace"], edit["with"])) for edit in edits]

    def edit(root: Path) -> None:
        for step in steps:
            step(root)
    return edit


def load_cases(kind: str) -> list[Case]:
    """Every patch folder's cases of ``kind`` (drift or tolerated), its patch id from its folder."""
    cases = []
    for path in sorted((TESTS / "patches").glob("*/drift.yaml")):
        for raw in yaml.safe_load(path.read_text(encoding="utf-8")) or []:
            # checked as the mutation suite checks its cases: a misspelt key or an unquoted release is an error
            where = f"{path.relative_to(TESTS).as_posix()}: {raw.get('name', raw)!r}"
            assert {"name", "release", "kind", "edits", "detail"} <= set(raw) <= CASE_KEYS, f"{where}: keys {set(raw)}"
            assert isinstance(raw["release"], str), f"{where}: quote the release"
            assert raw["kind"] in ("drift", "tolerated"), f"{where}: kind must be drift or tolerated"
            assert isinstance(raw["edits"], str) or all(set(e) == EDIT_KEYS for e in raw["edits"]), \
                f"{where}: each edit is exactly {sorted(EDIT_KEYS)}"
            if raw["kind"] == kind:
                cases.append(Case(raw["name"], raw["release"], path.parent.name.replace("_", "-"),
                                  edit_of(raw["edits"]), raw["detail"], tuple(raw.get("also", ()))))
    return cases


CASES = load_cases("drift")
# Changes a patch follows by design: the static check must still say it fits, not cry drift.
TOLERATED = load_cases("tolerated")


@pytest.fixture(scope="module")
def pristine_results():
    """Each patch's static result on the pristine releases the cases start from."""
    return {version: check_tree(str(fetch_source(version)))[1] for version in sorted({c.version for c in CASES + TOLERATED})}


def drifted_copy(case: Case, dest: Path) -> Path:
    root = copy_release(case.version, dest)
    case.edit(root)
    return root


def test_every_patch_has_hidden_drift_cases():
    from sglang_pcie.patching.engine import all_patches

    assert {patch.id for patch in all_patches()} <= {case.patch for case in CASES}


@pytest.mark.parametrize("version", sorted({case.version for case in CASES}))
def test_the_trimmed_copy_reads_exactly_as_the_release(version, pristine_results, tmp_path):
    version_read, rows, _ = check_tree(str(copy_release(version, tmp_path)))
    assert version_read == version
    assert rows == pristine_results[version]
    assert all(row["status"] != DRIFTED for row in rows)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_static_check_reports_hidden_drift(case, pristine_results, tmp_path):
    _, rows, _ = check_tree(str(drifted_copy(case, tmp_path)))
    cell = next(row for row in rows if row["id"] == case.patch)
    assert cell["status"] == DRIFTED, cell
    assert case.detail in cell["detail"], cell
    for patch_id in case.also:
        assert next(row for row in rows if row["id"] == patch_id)["status"] == DRIFTED, patch_id
    hit = {case.patch, *case.also}
    others = [row for row in rows if row["id"] not in hit]
    assert others == [row for row in pristine_results[case.version] if row["id"] not in hit]


@pytest.mark.parametrize("case", TOLERATED, ids=str)
def test_a_change_the_patch_follows_is_not_drift(case, pristine_results, tmp_path):
    _, rows, _ = check_tree(str(drifted_copy(case, tmp_path)))
    cell = next(row for row in rows if row["id"] == case.patch)
    pristine = next(row for row in pristine_results[case.version] if row["id"] == case.patch)
    assert cell["status"] == pristine["status"], cell
    assert case.detail in cell["detail"] and case.detail not in pristine["detail"], cell


def test_check_sglang_releases_reports_every_drifted_copy(tmp_path):
    sources = [drifted_copy(case, tmp_path / f"case{i}") for i, case in enumerate(CASES)]
    cmd = [sys.executable, str(REPO / "ci" / "check-sglang-releases"), "--json"]
    for source in sources:
        cmd += ["--sglang-source", str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["releases"]
    assert [row["source"] for row in rows] == [str(source) for source in sources]
    for case, row in zip(CASES, rows):
        assert row["version"] == case.version
        cell = next(c for c in row["patches"] if c["id"] == case.patch)
        assert cell["status"] == DRIFTED, (case.name, cell)


def test_prepare_release_diffs_names_the_drifted_patch(tmp_path):
    """On the pristine 0.5.23 the 0.5.22 eagle3-profile diff carries over; with the draft method renamed it may not."""
    case = next(c for c in CASES if c.name == "v2 EAGLE draft worker's draft method renamed")
    source = drifted_copy(case, tmp_path / "sglang-0.5.23")
    shutil.copytree(REPO / "diffs" / "0.5.22", tmp_path / "diffs" / "0.5.22")
    proc = subprocess.run([sys.executable, str(REPO / "ci" / "prepare-release-diffs"), "0.5.23",
                           "--sglang-source", str(source), "--diffs-dir", str(tmp_path / "diffs")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NEEDS A HUMAN  eagle3-profile: static check says drifted:" in proc.stdout
    assert "fix sglang_pcie/patches/eagle3_profile/check.py for sglang 0.5.23" in proc.stderr
    # the path printed is the patch's
    assert (REPO / "sglang_pcie" / "patches" / "eagle3_profile" / "check.py").is_file()
    assert not (tmp_path / "diffs" / "0.5.23" / "eagle3-profile.diff").exists()
