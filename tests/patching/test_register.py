"""The patch register: data that names each patch, its targets, why it exists, its upstream state and its gate."""
from __future__ import annotations

from sglang_pcie.patching.engine import all_patches

PATCH_IDS = ["sm120-allreduce-fusion", "eagle3-profile", "drafter-delegation"]


def test_registry_ids_are_the_issue_ids():
    assert [p.id for p in all_patches()] == PATCH_IDS


