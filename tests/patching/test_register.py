"""The patch register: data that names each patch, its targets, why it exists, its upstream state and its gate."""
from __future__ import annotations

from sglang_pcie.patching import register
from sglang_pcie.patching.engine import all_patches

from support import PATCH_IDS


def test_registry_ids_name_their_modules_and_load_in_order():
    assert [p.id for p in all_patches()] == PATCH_IDS == register.ids()
    for entry in register.REGISTER:  # a patch's id, its module and its docs page share one name
        assert entry.module == f"sglang_pcie.patching.{entry.id.replace('-', '_')}", entry.id




def test_ids_are_unique_and_each_module_defines_its_patch():
    assert len(set(register.ids())) == len(register.REGISTER)
    for entry, patch in zip(register.REGISTER, all_patches()):
        assert patch.id == entry.id and patch.entry is entry and patch.targets == entry.targets


class Settings:
    def __init__(self, **fields):
        self.disabled, self.disabled_patches, self.sm120_fusion, self.eagle3_profile = False, frozenset(), False, False
        self.__dict__.update(fields)


def test_one_gate_for_every_patch():
    sm120, eagle, drafter, alarm, agreement, watch = (register.entry(i) for i in PATCH_IDS)
    assert register.disabled_reason(agreement, Settings()) is None
    assert register.disabled_reason(watch, Settings()) is None  # default on in EAGLE chain runs
    assert register.disabled_reason(watch, Settings(disabled_patches=frozenset({"draft-token-watch"}))) == \
        register.DISABLE_PATCHES_REASON
    assert register.disabled_reason(alarm, Settings()) is None  # log lines only: on unless switched off
    assert register.disabled_reason(drafter, Settings()) is None
    assert register.disabled_reason(sm120, Settings()) == "opt-in: set SGLANG_PCIE_SM120_FUSION=1"
    assert register.disabled_reason(sm120, Settings(sm120_fusion=True)) is None
    assert register.disabled_reason(eagle, Settings()) == "EAGLE3_PROFILE is not set to 1"
    off = Settings(disabled_patches=frozenset({"drafter-delegation"}), eagle3_profile=True)
    assert register.disabled_reason(drafter, off) == register.DISABLE_PATCHES_REASON
    assert register.disabled_reason(eagle, off) is None
    assert all(register.disabled_reason(e, Settings(disabled=True)) == "SGLANG_PCIE_DISABLE is set"
               for e in register.REGISTER)
