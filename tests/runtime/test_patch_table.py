"""The runtime half of the patch register: what activation and the baked diffs' guard read in every SGLang process."""
from __future__ import annotations

import inspect

import pytest

from sglang_pcie.patching import register
from sglang_pcie.runtime import baked, patch_table


def test_one_row_per_register_entry_in_the_same_order():
    assert patch_table.ids() == register.ids() and len(set(patch_table.ids())) == len(patch_table.TABLE)
    for entry, row in zip(register.REGISTER, patch_table.TABLE):
        assert entry.row is row and (entry.module, entry.payload, entry.targets, entry.opt_in) == \
            (row.module, row.payload, row.targets, row.opt_in)
    assert register.disabled_reason is patch_table.disabled_reason and register.OptIn is patch_table.OptIn


def test_every_patch_installs_from_its_hooks_or_from_its_own_server_half():
    """A row without hooks names its install, a module of its own folder (never its check, never patching/)."""
    for row in patch_table.TABLE:
        assert bool(row.hooks) != bool(row.install), row.id
        if row.install:
            module, _, function = row.install.partition(":")
            folder = row.module.rpartition(".")[0]
            assert module.startswith(folder + ".") and module != row.module and function, row.id


def test_every_payload_takes_the_settings_handed_down():
    """``payload(original, *args, settings=...)``: the runtime install and the baked guard call it alike."""
    for row in patch_table.TABLE:
        parameters = inspect.signature(baked.payload_of(row)).parameters
        assert "settings" in parameters and parameters["settings"].default is None, row.id


def test_a_list_naming_an_id_that_is_no_patch_switches_every_patch_off_never_half_applied():
    """README: such a list is not half-applied (the ids it names rightly off, the others on); every patch is off,
    opt-ins given or not, as a kill switch that is not a boolean is read as on."""
    from sglang_pcie.runtime.settings import load_settings

    opt_ins = {row.opt_in.variable: "1" for row in patch_table.TABLE if row.opt_in}
    named = patch_table.ids()[2]
    known_only = load_settings({**opt_ins, "SGLANG_PCIE_DISABLE_PATCHES": named})
    assert patch_table.unknown_ids(known_only) == []
    assert {row.id for row in patch_table.TABLE if patch_table.disabled_reason(row, known_only)} == {named}

    settings = load_settings({**opt_ins, "SGLANG_PCIE_DISABLE_PATCHES": f"{named},no-such-patch, other"})
    assert patch_table.unknown_ids(settings) == ["no-such-patch", "other"]
    assert {row.id: patch_table.disabled_reason(row, settings) for row in patch_table.TABLE} == \
        {row.id: patch_table.UNKNOWN_ID_REASON for row in patch_table.TABLE}
    # the kill switch still says what it is first
    off = load_settings({"SGLANG_PCIE_DISABLE": "1", "SGLANG_PCIE_DISABLE_PATCHES": "no-such-patch"})
    assert patch_table.disabled_reason(patch_table.TABLE[0], off) == "SGLANG_PCIE_DISABLE is set"


def test_every_patch_id_alone_is_a_known_id_that_switches_off_that_patch_only():
    from sglang_pcie.runtime.settings import load_settings

    for patch_id in patch_table.ids():
        settings = load_settings({"SGLANG_PCIE_DISABLE_PATCHES": patch_id})
        assert patch_table.unknown_ids(settings) == [], patch_id
        assert patch_table.disabled_reason(patch_table.row(patch_id), settings) == patch_table.DISABLE_PATCHES_REASON
    assert patch_table.row("draft-token-watch").id == "draft-token-watch"
    with pytest.raises(KeyError):
        patch_table.row("no-such-patch")
