"""Release tracking: ci/check-sglang-releases, ci/prepare-release-diffs, COMPATIBILITY.md and the workflows.

These run the scripts themselves, against the releases the package index serves and their real wheels (cached
under ${SGLANG_PCIE_CACHE:-~/.cache/sglang-pcie}), so the suite keeps the scheduled workflow's scripts working.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from sglang_pcie.patching.engine import APPLICABLE, ERROR, NOT_APPLICABLE, UPSTREAM
from sglang_pcie.patching.matrix import failing, run_matrix, select_releases
from sglang_pcie.patching.engine import all_patches
from sglang_pcie.patching.releases import COVERED_RELEASES, fetch_source, list_releases

from support import REPO

pytestmark = pytest.mark.slow  # upstream tracking over every release tree: CI runs it, the fast loop leaves it out
CHECK = REPO / "ci" / "check-sglang-releases"
PREPARE = REPO / "ci" / "prepare-release-diffs"
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.y*ml"))
COVERED_RANGE = ("--from", COVERED_RELEASES[0], "--to", COVERED_RELEASES[-1])
REGENERATE = f"ci/check-sglang-releases {' '.join(COVERED_RANGE)} --markdown-out COMPATIBILITY.md"


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=900)


def committed_diffs(version: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in (REPO / "diffs" / version).glob("*.diff")}


def test_each_patch_covers_a_range_of_covered_releases():
    """The release range verify enforces (older: not-applicable; newer: "not yet covered by tests") is each
    patch's `releases`, whose ends are releases the tests cover."""
    from sglang_pcie.patching.verify import release_bounds

    for patch in all_patches():
        first, last = release_bounds(patch)
        assert first in COVERED_RELEASES and last in COVERED_RELEASES, (patch.id, patch.releases)


def test_the_covered_releases_are_listed_once():
    """The runtime table's COVERED_RELEASES is the one list (the register re-exports it): the patches' ranges derive
    from it, and no other module of the package spells the covered span."""
    from sglang_pcie.patching import register

    assert register.COVERED == f">={COVERED_RELEASES[0]},<={COVERED_RELEASES[-1]}"
    assert all(entry.releases == register.COVERED for entry in register.REGISTER)
    span = (f'"{COVERED_RELEASES[0]}"', f">={COVERED_RELEASES[0]},<={COVERED_RELEASES[-1]}")
    spelled = [p.relative_to(REPO).as_posix() for p in (REPO / "sglang_pcie").rglob("*.py")
               if p.name != "patch_table.py" and any(s in p.read_text() for s in span)]
    assert spelled == [], spelled


def test_select_releases_is_inclusive_and_ordered():
    available = ["0.5.10", "0.5.7", "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10.post1"]
    assert select_releases(available, "0.5.8", "0.5.10") == ["0.5.8", "0.5.8.post1", "0.5.9", "0.5.10"]
    assert select_releases(available, "0.5.10") == ["0.5.10", "0.5.10.post1"]
    assert select_releases(available, last="0.5.7") == ["0.5.7"]
    with pytest.raises(ValueError, match="'0.5.x'"):
        select_releases(available, "0.5.x")


def test_bounded_range_comes_from_the_index():
    """The range .ci/run checks: every release the index serves in it, each patch fits, progress on stderr."""
    proc = run_script(CHECK, "--from", "0.5.21", "--to", "0.5.23", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    on_index = [v for v in list_releases() if Version("0.5.21") <= Version(v) <= Version("0.5.23")]
    assert [row["version"] for row in report["releases"]] == on_index
    ids = [patch.id for patch in all_patches()]
    for row in report["releases"]:
        assert [cell["id"] for cell in row["patches"]] == ids
        assert {cell["status"] for cell in row["patches"]} <= {APPLICABLE, UPSTREAM, NOT_APPLICABLE}, row
        assert all(cell["detail"] for cell in row["patches"]), row
        assert row["diffs"] == sorted(Path(name).stem for name in committed_diffs(row["version"]))
    assert report["lacking_diffs"] == []
    assert re.search(r"\[3/3\] 0\.5\.2[123]: fetched", proc.stderr), proc.stderr


def test_compatibility_md_is_the_matrix_of_every_covered_release(tmp_path):
    """The full range shows no drift, and COMPATIBILITY.md is exactly what the script generates for it."""
    page = tmp_path / "COMPATIBILITY.md"
    proc = run_script(CHECK, *COVERED_RANGE, "--json", "--markdown-out", str(page))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert [row["version"] for row in report["releases"]] == list(COVERED_RELEASES)
    assert not failing(report["releases"])
    committed = REPO / "COMPATIBILITY.md"
    assert committed.is_file() and page.read_text() == committed.read_text(), f"stale; regenerate: {REGENERATE}"
    for version in COVERED_RELEASES:
        assert re.search(rf"^\| {re.escape(version)} \|", page.read_text(), re.M), version


def test_releases_newer_than_the_patches_folder_are_listed_as_lacking_diffs(tmp_path):
    diffs_dir = tmp_path / "diffs"
    shutil.copytree(REPO / "diffs" / "0.5.21", diffs_dir / "0.5.21")
    page = tmp_path / "matrix.md"
    proc = run_script(CHECK, "--versions", "0.5.21,0.5.23,0.5.22", "--diffs-dir", str(diffs_dir),
                      "--json", "--markdown-out", str(page))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert [row["version"] for row in report["releases"]] == ["0.5.21", "0.5.22", "0.5.23"]
    assert report["lacking_diffs"] == ["0.5.22", "0.5.23"]
    assert "sglang 0.5.23 lacks diffs in diffs/: run ci/prepare-release-diffs 0.5.23" in proc.stderr
    markdown = page.read_text()
    header = "| release | " + " | ".join(f"`{patch.id}`" for patch in all_patches()) + " | diffs in `diffs/` |"
    assert header in markdown
    assert "| **missing**: `ci/prepare-release-diffs 0.5.22` |" in markdown
    assert "Releases lacking diffs (newer than `diffs/0.5.21/`): 0.5.22, 0.5.23." in markdown


@pytest.mark.parametrize("args, message", [
    (["--from", "0.5.x"], "'0.5.x' is not a version"),
    (["--versions", "0.5.99"], "sglang 0.5.99 is not a release on"),
    (["--versions", "0.5.9", "--to", "0.5.10"], "give --versions or --from/--to, not both"),
    (["--from", "0.5.24", "--to", "0.5.23"], "no sglang release on"),
    (["--sglang-source", "/nonexistent/sglang-tree"], "no sglang package under '/nonexistent/sglang-tree'"),
    (["--sglang-source", ".", "--from", "0.5.9"], "takes no --from/--to/--versions"),
])
def test_bad_usage_is_one_line_naming_the_value(args, message):
    proc = run_script(CHECK, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("check-sglang-releases: error: ")
    assert message in proc.stderr
    assert proc.stdout == ""


def test_a_release_that_cannot_be_fetched_is_an_error_in_every_cell():
    rows, _ = run_matrix(["0.5.99"], fetch_source, fetch_jobs=1, check_jobs=1)
    assert [cell["status"] for cell in rows[0]["patches"]] == [ERROR] * len(all_patches())
    assert all("could not fetch sglang 0.5.99" in cell["detail"] for cell in rows[0]["patches"])
    assert failing(rows)


# -- ci/prepare-release-diffs


def test_prepare_carries_the_nearest_diffs_over_to_the_next_release(tmp_path):
    shutil.copytree(REPO / "diffs" / "0.5.19", tmp_path / "0.5.19")
    proc = run_script(PREPARE, "0.5.20", "--diffs-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NEED" not in proc.stdout + proc.stderr
    written = {p.name: p.read_text() for p in (tmp_path / "0.5.20").glob("*.diff")}
    assert written and written == committed_diffs("0.5.20")
    # what adding the release takes next: the one list of covered releases, at the path printed, then generated files
    assert "next: add '0.5.20' to COVERED_RELEASES in sglang_pcie/runtime/patch_table.py" in proc.stdout
    assert "COVERED_RELEASES = (" in (REPO / "sglang_pcie" / "runtime" / "patch_table.py").read_text()
    assert "ci/generate-docs" in proc.stdout and "--markdown-out COMPATIBILITY.md" in proc.stdout


def test_prepare_names_the_patch_whose_target_changed(tmp_path):
    """0.5.14 added the fusion backend resolver: the 0.5.13.post1 diff cannot carry over; nothing is written."""
    shutil.copytree(REPO / "diffs" / "0.5.13.post1", tmp_path / "0.5.13.post1")
    proc = run_script(PREPARE, "0.5.14", "--diffs-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"NEED A HUMAN: .*sm120-allreduce-fusion", proc.stderr), proc.stderr
    assert ("NEEDS A HUMAN  sm120-allreduce-fusion: the sglang 0.5.13.post1 diff does not apply:"
            " sglang/srt/layers/flashinfer_comm_fusion.py: Hunk #1 FAILED") in proc.stdout
    # rewrite() handles 0.5.14, so the human is pointed at the generated diff to review
    assert "review it: ci/generate-diffs --versions 0.5.14 --patch sm120-allreduce-fusion" in proc.stderr
    assert not (tmp_path / "0.5.14" / "sm120-allreduce-fusion.diff").exists()
    assert (tmp_path / "0.5.14" / "eagle3-profile.diff").read_text() == committed_diffs("0.5.14")["eagle3-profile.diff"]


def test_prepare_never_overwrites_a_release_folder(tmp_path):
    shutil.copytree(REPO / "diffs" / "0.5.23", tmp_path / "0.5.23")
    before = {p.name: p.read_text() for p in (tmp_path / "0.5.23").glob("*.diff")}
    proc = run_script(PREPARE, "0.5.23", "--from", "0.5.23", "--diffs-dir", str(tmp_path))
    assert proc.returncode == 2
    assert "already holds diffs" in proc.stderr
    assert {p.name: p.read_text() for p in (tmp_path / "0.5.23").glob("*.diff")} == before


# -- workflows


def _scripts_called(run: str) -> list[str]:
    """Paths of this repository's scripts that a workflow step's shell text calls."""
    return re.findall(r"(?<![\w/.$-])((?:ci|tests)/[\w./-]+)", run)


def test_workflows_are_valid_yaml_and_call_the_scripts_the_test_suite_runs():
    assert WORKFLOWS, "no workflow under .github/workflows"
    suite_text = "\n".join(p.read_text() for p in [*(REPO / "tests").rglob("*.py"), REPO / "ci" / "run-tests"])
    called = set()
    for path in WORKFLOWS:
        doc = yaml.safe_load(path.read_text())
        assert isinstance(doc, dict) and doc.get("jobs"), path
        assert doc.get("on", doc.get(True)), f"{path}: no triggers"  # YAML 1.1 reads a bare `on:` as True
        for name, job in doc["jobs"].items():
            assert job.get("runs-on") and job.get("steps"), f"{path}: job {name}"
            for step in job["steps"]:
                assert ("uses" in step) != ("run" in step), f"{path}: job {name}: {step}"
                for script in _scripts_called(step.get("run", "")):
                    assert (REPO / script).is_file(), f"{path}: job {name} calls missing {script}"
                    if not script.endswith(".py"):
                        assert os.access(REPO / script, os.X_OK), f"{script} is not executable"
                    called.add(script)
    for script in called:  # what the workflows call, the suite (.ci/run) runs too, so it keeps working
        assert Path(script).stem in suite_text, f"{script} is called by a workflow but by no test"


def test_release_workflow_runs_the_matrix_daily_and_on_pull_requests():
    doc = yaml.safe_load((REPO / ".github" / "workflows" / "release-matrix.yml").read_text())
    triggers = doc.get("on", doc.get(True))
    assert "schedule" in triggers and "pull_request" in triggers
    runs = {name: "\n".join(step.get("run", "") for step in job["steps"]) for name, job in doc["jobs"].items()}
    matrix_jobs = [name for name, text in runs.items() if "ci/check-sglang-releases" in text]
    assert matrix_jobs, "no job runs ci/check-sglang-releases"
    assert any(f"--from {COVERED_RELEASES[0]} " in runs[name] for name in matrix_jobs)
    assert any(f"--to {COVERED_RELEASES[-1]} --markdown-out COMPATIBILITY.md" in runs[name]
               and "git diff --exit-code COMPATIBILITY.md" in runs[name] for name in matrix_jobs)
    runtime = [name for name, text in runs.items() if "verify-patches --runtime" in text]
    assert runtime and all("ci/sglang-env" in runs[n] and "tests/support/cuda_stub.py" in runs[n] for n in runtime)
    assert all(doc["jobs"][n]["runs-on"] == "ubuntu-latest" for n in runs)


def test_a_tests_workflow_runs_the_readmes_test_command_on_pull_requests_and_main():
    doc = yaml.safe_load((REPO / ".github" / "workflows" / "tests.yml").read_text())
    triggers = doc.get("on", doc.get(True))
    assert "pull_request" in triggers and triggers["push"]["branches"] == ["main"]
    readme = (REPO / "README.md").read_text()
    assert "CI runs exactly this (`.ci/run`)" in readme and "bash ci/run-tests" in readme
    assert "exec bash ci/run-tests" in (REPO / ".ci" / "run").read_text()
    (job,) = doc["jobs"].values()
    runs = [step["run"].strip() for step in job["steps"] if "run" in step]
    assert runs[-1] == ".ci/run"
    caches = [step["with"] for step in job["steps"] if step.get("uses", "").startswith("actions/cache@")]
    assert any("~/.cache/sglang-pcie/envs" in cache["path"] for cache in caches)  # ci/run-tests' default cache


def test_workflow_cache_keys_hash_files_that_exist_and_comments_name_paths_that_exist():
    """A hashFiles() of a file that does not exist hashes nothing: the key never changes, and a cache once saved
    under it is never saved again. A path a comment names is one a reader looks for."""
    for path in WORKFLOWS:
        text = path.read_text()
        for args in re.findall(r"hashFiles\(([^)]*)\)", text):
            for name in re.findall(r"'([^']+)'", args):
                assert list(REPO.glob(name)), f"{path.name}: hashFiles('{name}') matches no file"
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                for named in re.findall(r"(?<![\w/.-])((?:ci|tests|sglang_pcie|docs)/[\w./-]*\w)", line):
                    assert (REPO / named).exists(), f"{path.name}: a comment names {named}, which does not exist"
