"""The code swap a patch written as source applies at runtime: the rewritten module's changed functions run in the
live function objects (so a module that imported one by name sees the change), marked; its runtime check names
what is not swapped."""
from __future__ import annotations

import importlib.util
import inspect
import sys

import pytest

from sglang_pcie.patching import code_swap
from sglang_pcie.runtime.results import APPLICABLE, APPLIED, DRIFTED, NOT_APPLICABLE, UPSTREAM, is_patched

OLD = "def gate():\n    return False\n\n\ndef other():\n    return 1\n"
NEW = "def _helper():\n    return True\n\n\ndef gate():\n    return _helper()\n\n\ndef other():\n    return 1\n"


@pytest.fixture
def live(tmp_path, monkeypatch):
    path = tmp_path / "swap_target.py"
    path.write_text(OLD)
    spec = importlib.util.spec_from_file_location("swap_target", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "swap_target", module)
    spec.loader.exec_module(module)
    return module


def test_install_swaps_the_changed_function_in_place_and_marks_it(live):
    held = live.gate  # a caller that imported it by name
    assert code_swap.not_swapped({"swap_target": live}, {"swap_target": NEW}, "p").status == DRIFTED
    result = code_swap.install(live, inspect.getsource(live), (APPLICABLE, "", {"swap_target": NEW}), "p")
    assert result.status == APPLIED and held() is True and held is live.gate
    assert is_patched(live.gate, "p") and is_patched(live._helper, "p") and not is_patched(live.other, "p")
    assert code_swap.not_swapped({"swap_target": live}, {"swap_target": NEW}, "p") is None
    again = code_swap.install(live, OLD, (APPLICABLE, "", {"swap_target": NEW}), "p")
    assert again.detail == "already applied in this process"


def test_install_passes_on_a_status_that_is_not_applicable_and_a_module_left_unchanged(live):
    assert code_swap.install(live, OLD, (UPSTREAM, "upstream has it", {}), "p").status == UPSTREAM
    assert code_swap.install(live, OLD, (APPLICABLE, "", {"elsewhere": NEW}), "p").status == NOT_APPLICABLE
    assert live.gate() is False


def test_a_module_the_rewrite_changes_that_was_not_imported_is_drift():
    result = code_swap.not_swapped({}, {"swap_target": NEW}, "p")
    assert (result.status, result.detail) == (DRIFTED, "swap_target was not imported")
