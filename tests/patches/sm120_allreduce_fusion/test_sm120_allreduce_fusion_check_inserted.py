"""The text sm120-allreduce-fusion inserts, read from the helper's module (``patches/sm120_allreduce_fusion/
payload.py``): the lines from its (begin) comment to its (end) comment, fitted to a release in three places and
nowhere else.

Whether the committed diffs are what this writes is ``ci/generate-diffs --check`` (and the diff tests of
``test_sm120_allreduce_fusion.py``)."""
from __future__ import annotations

import ast
import inspect

import pytest

from sglang_pcie.patching import baked
from sglang_pcie.patches.sm120_allreduce_fusion import check_inserted as inserted
from sglang_pcie.patches.sm120_allreduce_fusion import payload as sm120_fusion


def test_the_helper_is_its_modules_text_from_begin_to_end():
    source = inspect.getsource(sm120_fusion)
    assert source.count(inserted.HELPER_SOURCE) == 1
    assert inserted.HELPER_SOURCE.startswith(inserted.BEGIN) and inserted.HELPER_SOURCE.endswith(inserted.END)


def test_the_module_defines_what_the_patch_asks_for_by_name():
    defined = {node.name for node in ast.parse(inserted.HELPER_SOURCE).body if isinstance(node, ast.FunctionDef)}
    assert {inserted.HELPER, inserted.IS_SM120, inserted.OPTED_IN} <= defined
    assert f'logging.getLogger("{inserted.LOGGER_NAME}")' in inserted.HELPER_SOURCE


def test_the_two_ways_of_asking_for_sm12x_name_what_the_check_verifies():
    assert f"from {inserted.RUNTIME_CONTEXT} import get_platform" in inserted.IS_SM120_BY_PLATFORM
    assert f"get_platform().{inserted.SM120_FACT}" in inserted.IS_SM120_BY_PLATFORM
    assert f"from {inserted.UTILS} import {inserted.SM120_PROBE}\n" in inserted.IS_SM120_BY_PROBE
    assert inspect.getsource(sm120_fusion._sglang_pcie_is_sm120_by_probe).endswith(inserted.IS_SM120_BY_PROBE)


@pytest.mark.parametrize("body", [inserted.IS_SM120_BY_PLATFORM, inserted.IS_SM120_BY_PROBE])
def test_a_release_changes_three_places_and_nothing_else(body):
    block = inserted.helper_block(("allreduce_fusion", "create_workspace"), body)
    assert "_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS = (\n    'allreduce_fusion',\n    'create_workspace',\n)\n" in block
    assert baked.decorator(inserted.PATCH_ID) + f"def {inserted.OPTED_IN}():\n" in block
    assert f"def {inserted.IS_SM120}():\n{body}\n\n" in block
    undone = (block.replace(baked.decorator(inserted.PATCH_ID), "")
              .replace("(\n    'allreduce_fusion',\n    'create_workspace',\n)", "()")
              .replace(body, inserted.IS_SM120_BY_PLATFORM))
    assert undone == inserted.HELPER_SOURCE
    compile(baked.guard_block(inserted.PATCH_ID) + block, "helper", "exec")


def test_no_entry_points_is_an_empty_tuple():
    assert "_SGLANG_PCIE_FLASHINFER_ENTRY_POINTS = (\n)\n" in inserted.helper_block((), inserted.IS_SM120_BY_PROBE)


def test_a_helper_that_lost_a_place_to_fit_is_an_error(monkeypatch):
    lost = inserted.HELPER_SOURCE.replace("ENTRY_POINTS = ()", "ENTRY_POINTS = []")
    monkeypatch.setattr(inserted, "HELPER_SOURCE", lost)
    with pytest.raises(ValueError, match="0 times, not once"):
        inserted.helper_block((), inserted.IS_SM120_BY_PROBE)
