"""The patch register: data that names each patch, its targets, why it exists, its upstream state and its gate."""
from __future__ import annotations

from sglang_pcie.patching import register
from sglang_pcie.patching.engine import all_patches

from support import PATCH_IDS


def test_registry_ids_name_their_modules_and_load_in_order():
    assert [p.id for p in all_patches()] == PATCH_IDS == register.ids()
    for entry in register.REGISTER:  # a patch's id, its folder and its docs page share one name
        folder = f"sglang_pcie.patches.{entry.id.replace('-', '_')}"
        assert entry.module == f"{folder}.check", entry.id
        assert entry.payload.startswith(f"{folder}.") or entry.payload.startswith("sglang_pcie.runtime."), entry.id
        # where its mark tells that it acts (tests/support/scripts/baked_switches.py): members of its targets
        assert entry.marked and all(spec.partition(":")[0] in entry.targets and spec.partition(":")[2]
                                    for spec in entry.marked), entry.id




def test_ids_are_unique_and_each_module_defines_its_patch():
    assert len(set(register.ids())) == len(register.REGISTER)
    for entry, patch in zip(register.REGISTER, all_patches()):
        assert patch.id == entry.id and patch.entry is entry and patch.targets == entry.targets


class Settings:
    def __init__(self, **fields):
        self.disabled, self.disabled_patches = False, frozenset()
        self.__dict__.update({e.opt_in.setting: False for e in register.REGISTER if e.opt_in})  # every opt-in off
        self.__dict__.update(fields)

    def but(self, **fields):
        return Settings(**{**vars(self), **fields})


def test_one_gate_for_every_patch():
    for e in register.REGISTER:  # every patch of the register, each under every switch
        on = Settings(**({e.opt_in.setting: True} if e.opt_in else {}))
        assert register.disabled_reason(e, Settings()) == (e.opt_in.off_reason if e.opt_in else None), e.id
        assert register.disabled_reason(e, on) is None, e.id  # opted in where it must be: registered
        assert register.disabled_reason(e, on.but(disabled_patches=frozenset({e.id}))) == \
            register.DISABLE_PATCHES_REASON, e.id
        others = frozenset(set(register.ids()) - {e.id})  # switching the others off leaves this one alone
        assert register.disabled_reason(e, on.but(disabled_patches=others)) is None, e.id
        assert register.disabled_reason(e, on.but(disabled=True)) == "SGLANG_PCIE_DISABLE is set", e.id
        assert register.disabled_reason(e, Settings(disabled=True)) == "SGLANG_PCIE_DISABLE is set", e.id
    # the opt-ins' own words, as verify-patches prints them
    assert register.disabled_reason(register.entry("sm120-allreduce-fusion"), Settings()) == \
        "opt-in: set SGLANG_PCIE_SM120_FUSION=1"
    assert register.disabled_reason(register.entry("eagle3-profile"), Settings()) == "EAGLE3_PROFILE is not set to 1"
