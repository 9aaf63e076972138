"""The shipped diffs read and applied in a process (``runtime/shipped_diffs``): as ``patch -p1 --fuzz=0`` applies
them (exact context, a hunk found at another line where a release moved it), the diff of the installed release or
of the newest older one, and Drift naming the hunk where the installed text differs, with nothing applied."""
from __future__ import annotations

import difflib
import subprocess

import pytest

from sglang_pcie.runtime import shipped_diffs
from sglang_pcie.runtime.results import Drift

OLD = "".join(f"line {n}\n" for n in range(1, 41))


def diff_of(old: str, new: str, rel: str = "sglang/m.py") -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}"))


def changed(text: str) -> str:
    """Two separate changes (a replaced line near the top, lines added near the end) and one pure insertion."""
    return (text.replace("line 5\n", "line five\n").replace("line 30\n", "line 30\nadded a\nadded b\n")
            .replace("line 40\n", "line 40\ntail\n"))


def test_a_diff_applies_as_patch_applies_it(tmp_path):
    new = changed(OLD)
    files = shipped_diffs.parse(diff_of(OLD, new))
    assert list(files) == ["sglang/m.py"] and len(files["sglang/m.py"]) == 3
    assert shipped_diffs.apply(OLD, files["sglang/m.py"], "m.py") == new
    # the same diff, applied by patch itself to the same text
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "m.py").write_text(OLD)
    (tmp_path / "d.diff").write_text(diff_of(OLD, new))
    subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", "-s", "-i", "d.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "sglang" / "m.py").read_text() == new


def test_a_hunk_is_found_where_a_newer_release_moved_it():
    hunks = shipped_diffs.parse(diff_of(OLD, changed(OLD)))["sglang/m.py"]
    moved = "import os\nimport sys\n" + OLD.replace("line 20\n", "line 20\nextra 1\nextra 2\nextra 3\n")
    assert shipped_diffs.apply(moved, hunks, "m.py") == changed(moved)
    earlier = OLD.replace("line 1\n", "").replace("line 15\nline 16\n", "")  # lines removed above the hunks
    assert shipped_diffs.apply(earlier, hunks, "m.py") == changed(earlier)


def test_a_hunk_whose_context_changed_is_drift_naming_it():
    hunks = shipped_diffs.parse(diff_of(OLD, changed(OLD)))["sglang/m.py"]
    with pytest.raises(Drift, match=r"^m.py: hunk 2 of 3 \(at line 2\d\) does not match the installed file$"):
        shipped_diffs.apply(OLD.replace("line 29\n", "line twenty-nine\n"), hunks, "m.py")


def test_a_hunk_is_never_applied_twice_or_before_the_one_before_it():
    text = "a\nb\nc\nd\ne\nf\ng\na\nb\nc\nd\ne\nf\ng\n"
    new = text.replace("d\n", "D\n")  # both copies
    hunks = shipped_diffs.parse(diff_of(text, new))["sglang/m.py"]
    assert shipped_diffs.apply(text, hunks, "m.py") == new


@pytest.mark.parametrize("text, why", [
    ("", r"no file in the diff"),
    ("hello\n", r"line 1 is not part of a unified diff"),
    ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n x\n", r"ends early"),
    ("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n?x\n", r"line 4 is not part of the hunk"),
])
def test_what_is_not_a_unified_diff_is_drift(text, why):
    with pytest.raises(Drift, match=why):
        shipped_diffs.parse(text)


def test_a_file_larger_than_a_shipped_diff_is_not_read(tmp_path, monkeypatch):
    path = tmp_path / "p.diff"
    path.write_text(diff_of(OLD, changed(OLD)))
    monkeypatch.setattr(shipped_diffs, "MAX_DIFF_BYTES", 100)
    with pytest.raises(Drift, match=r"bytes, more than a shipped diff \(100\)"):
        shipped_diffs.read_diff(path)


def test_the_diff_of_the_release_or_of_the_newest_older_one(tmp_path):
    for release in ("0.5.9", "0.5.10", "0.5.23"):
        (tmp_path / release).mkdir()
        (tmp_path / release / "p.diff").write_text("x")
    (tmp_path / "0.5.10" / "p.diff").unlink()
    (tmp_path / "README.md").write_text("not a release")
    assert shipped_diffs.diff_for_release("p", "0.5.9", tmp_path) == (tmp_path / "0.5.9" / "p.diff", "0.5.9")
    assert shipped_diffs.diff_for_release("p", "0.5.24", tmp_path) == (tmp_path / "0.5.23" / "p.diff", "0.5.23")
    assert shipped_diffs.diff_for_release("p", "0.5.10", tmp_path) == (None, "no p diff for sglang 0.5.10")
    assert shipped_diffs.diff_for_release("p", "0.5.8", tmp_path) == (
        None, "no diffs for sglang 0.5.8 or any older release")
    assert shipped_diffs.diff_for_release("p", "not-a-version", tmp_path) == (
        None, "sglang version 'not-a-version' cannot be read")


def test_the_checkout_diffs_are_found_in_an_editable_install():
    from support import REPO

    assert shipped_diffs.diffs_root() == REPO / "diffs"
    assert shipped_diffs.module_name("sglang/srt/layers/communicator.py") == "sglang.srt.layers.communicator"
