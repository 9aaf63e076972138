"""Versioned diffs: where they are, what they touch, and a diff generated from a rewrite of a small tree."""
from __future__ import annotations

import pytest

from sglang_pcie.patching import diffs
from sglang_pcie.patching.source import SourceTree
from support import PATCH_IDS, REPO


def test_the_checkout_holds_a_diff_folder_per_covered_release():
    from sglang_pcie.patching.releases import COVERED_RELEASES

    assert diffs.releases_with_diffs(REPO / "diffs") == list(COVERED_RELEASES)
    assert {p.stem for p in diffs.diffs_for("0.5.23", REPO / "diffs")} == set(PATCH_IDS)


def test_a_release_without_diffs_names_those_that_have_them(tmp_path):
    (tmp_path / "0.5.9").mkdir()
    (tmp_path / "0.5.9" / "x.diff").write_text("")
    with pytest.raises(diffs.DiffError, match=r"no diffs for sglang 0.4.0 \(releases with diffs: 0.5.9\)"):
        diffs.diffs_for("0.4.0", tmp_path)


def test_unified_diff_of_a_rewrite_reads_the_source_without_its_bom(tmp_path):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "mod.py").write_bytes(b"\xef\xbb\xbfa = 1\nb = 2\n")
    tree = SourceTree(tmp_path)
    text = diffs.unified_diff(tree, {"sglang.mod": "a = 1\nb = 3\n"})
    assert text.splitlines()[:2] == ["--- a/sglang/mod.py", "+++ b/sglang/mod.py"]
    assert "-b = 2" in text and "+b = 3" in text and "\ufeff" not in text
    path = tmp_path / "d.diff"
    path.write_text(text)
    assert diffs.touched_files(path) == ["sglang/mod.py"]
