"""The runtime half of the patch register: what activation and the baked diffs' guard read in every SGLang process."""
from __future__ import annotations

import inspect

from sglang_pcie.patching import register
from sglang_pcie.runtime import baked, patch_table


def test_one_row_per_register_entry_in_the_same_order():
    assert patch_table.ids() == register.ids() and len(set(patch_table.ids())) == len(patch_table.TABLE)
    for entry, row in zip(register.REGISTER, patch_table.TABLE):
        assert entry.row is row and (entry.module, entry.payload, entry.targets, entry.opt_in) == \
            (row.module, row.payload, row.targets, row.opt_in)
    assert register.disabled_reason is patch_table.disabled_reason and register.OptIn is patch_table.OptIn


def test_every_payload_takes_the_settings_handed_down():
    """``payload(original, *args, settings=...)``: the runtime install and the baked guard call it alike."""
    for row in patch_table.TABLE:
        parameters = inspect.signature(baked.payload_of(row)).parameters
        assert "settings" in parameters and parameters["settings"].default is None, row.id
