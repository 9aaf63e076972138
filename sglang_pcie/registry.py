"""The list of code patches, in the order they are applied and reported."""
from __future__ import annotations

import importlib

from sglang_pcie.base import Patch

# One module per patch under sglang_pcie/patches/, each defining PATCH.
PATCH_MODULES = (
    "sglang_pcie.patches.sm120_allreduce_fusion",
    "sglang_pcie.patches.eagle3_profile",
    "sglang_pcie.patches.drafter_delegation",
)


def all_patches() -> list[Patch]:
    return [importlib.import_module(name).PATCH for name in PATCH_MODULES]


def get_patch(patch_id: str) -> Patch:
    for patch in all_patches():
        if patch.id == patch_id:
            return patch
    raise KeyError(patch_id)
