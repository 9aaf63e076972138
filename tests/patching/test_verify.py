"""verify.check_source: a patch's static check within its release range; a checker bug is an error result, never
raised; computed once per tree."""
from __future__ import annotations

import pytest

from sglang_pcie.patching import verify
from sglang_pcie.patching.engine import APPLICABLE, DISABLED, ERROR, NOT_APPLICABLE, Patch, Result
from sglang_pcie.patching.source import SourceTree


class Counting(Patch):
    id = "eagle3-profile"

    def __init__(self, outcome):
        super().__init__()
        self.outcome, self.calls = outcome, 0

    def check_source(self, tree):
        self.calls += 1
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def tree_of(tmp_path, version):
    (tmp_path / "sglang").mkdir(exist_ok=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "version.py").write_text(f"__version__ = '{version}'\n")
    return SourceTree(tmp_path)


@pytest.mark.parametrize("version, status, said", [
    ("0.5.7", NOT_APPLICABLE, "is older than the releases this patch covers (0.5.8 to 0.5.23)"),
    ("0.5.16", APPLICABLE, "fits"),
    ("0.6.0", APPLICABLE, "sglang 0.6.0 is newer than 0.5.23, the last release covered by tests"),
    ("main-nightly", APPLICABLE, "sglang version 'main-nightly' unknown: release range 0.5.8 to 0.5.23 not checked"),
])
def test_the_release_range_decides_before_and_after_the_check(tmp_path, version, status, said):
    patch = Counting(Result(APPLICABLE, "fits"))
    result = verify.check_source(patch, tree_of(tmp_path, version))
    assert result.status == status and said in result.detail
    assert patch.calls == (0 if status == NOT_APPLICABLE else 1)


def test_a_checker_bug_is_an_error_result_and_the_answer_is_kept_per_tree(tmp_path):
    patch = Counting(KeyError("surprise"))
    tree = tree_of(tmp_path, "0.5.16")
    first = verify.check_source(patch, tree)
    assert first == Result(ERROR, "static check failed: KeyError: 'surprise'")
    assert verify.check_source(patch, tree) is first and patch.calls == 1


def test_a_switched_off_patch_is_disabled_but_drift_still_shows(pristine_source):
    from sglang_pcie.runtime.settings import load_settings

    tree = SourceTree(pristine_source("0.5.23"))
    rows = {p.id: r for p, r in verify.static_results(tree, load_settings({}))}
    assert rows["eagle3-profile"].status == DISABLED
    assert rows["eagle3-profile"].detail == "EAGLE3_PROFILE is not set to 1 (source check: applicable)"
