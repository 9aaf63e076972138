"""The code swap a patch written as source applies at runtime: the rewritten module's changed functions run in the
live function objects (so a module that imported one by name sees the change), marked; its runtime check names
what is not swapped."""
from __future__ import annotations

import importlib.util
import inspect
import sys

import pytest

from sglang_pcie.runtime import code_swap
from sglang_pcie.runtime.results import APPLIED, DRIFTED, is_patched, mark

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


def test_the_swap_puts_the_changed_function_in_place_and_marks_it(live):
    held = live.gate  # a caller that imported it by name
    assert code_swap.not_swapped({"swap_target": live}, {"swap_target": NEW}, "p").status == DRIFTED
    result = code_swap.swap_in(live, inspect.getsource(live), NEW, "p")
    assert result.status == APPLIED and held() is True and held is live.gate
    assert is_patched(live.gate, "p") and is_patched(live._helper, "p") and not is_patched(live.other, "p")
    assert code_swap.not_swapped({"swap_target": live}, {"swap_target": NEW}, "p") is None
    again = code_swap.swap_in(live, OLD, NEW, "p")
    assert again.detail == "already applied in this process"


def test_a_module_the_rewrite_changes_that_was_not_imported_is_drift():
    result = code_swap.not_swapped({}, {"swap_target": NEW}, "p")
    assert (result.status, result.detail) == (DRIFTED, "swap_target was not imported")


def test_a_live_function_that_is_no_longer_the_one_in_the_file_is_drift_and_nothing_changes(live):
    live.gate.__code__ = (lambda: "someone else's").__code__  # another tool swapped it first
    with pytest.raises(code_swap.Drift, match=r"swap_target.gate in memory is not the one in .*swap_target.py"):
        code_swap.swap_in(live, OLD, NEW, "p")
    assert live.gate() == "someone else's" and not hasattr(live, "_helper") and not is_patched(live.gate, "p")


def test_a_changed_name_that_is_not_a_function_in_the_process_is_drift(live):
    live.gate = staticmethod(lambda: False)
    with pytest.raises(code_swap.Drift, match=r"^swap_target.gate is not a function in this process$"):
        code_swap.swap_in(live, OLD, NEW, "p")


def test_the_runtime_check_names_a_function_the_rewrite_adds_that_is_not_marked(live):
    code_swap.swap_in(live, OLD, NEW, "p")
    live._helper = lambda: True  # the added helper replaced by an unmarked one
    result = code_swap.not_swapped({"swap_target": live}, {"swap_target": NEW}, "p")
    assert (result.status, result.detail) == (DRIFTED, "swap_target: not patched in this process: _helper")
    del live._helper
    result = code_swap.not_swapped({"swap_target": live}, {"swap_target": NEW}, "p")
    assert result.detail == "swap_target: not patched in this process: _helper"


def test_before_the_swap_the_runtime_check_names_every_function_changed_or_added(live):
    result = code_swap.not_swapped({"swap_target": live}, {"swap_target": NEW}, "p")
    assert result.detail == "swap_target: not patched in this process: gate, _helper"


def test_the_swap_says_what_it_patched_and_defined_and_the_swapped_code_shows_the_patched_text(live):
    result = code_swap.swap_in(live, OLD, NEW, "p")
    assert result.detail == "patched gate; defined _helper"
    assert inspect.getsource(live.gate) == "def gate():\n    return _helper()\n"
    assert live.gate.__code__.co_filename.endswith("swap_target.py (patched by sglang-pcie p)")


def test_added_statements_run_in_the_module_and_a_function_with_defaults_is_refused(live):
    with_statement = NEW + "\nLIMIT = 3\n"
    result = code_swap.swap_in(live, OLD, with_statement, "p")
    assert live.LIMIT == 3 and result.detail == "patched gate; defined _helper, LIMIT"
    with pytest.raises(code_swap.Drift, match=r"^late: the runtime patch defines plain functions only$"):
        code_swap.swap_in(live, OLD, OLD + "\n\ndef late(x=1):\n    return x\n", "q")
    with pytest.raises(code_swap.Drift, match=r"^late: the runtime patch defines plain functions only$"):
        code_swap.swap_in(live, OLD, OLD + "\n\ndef late(*, x=1):\n    return x\n", "q")


def test_a_name_imported_from_a_module_that_lacks_it_is_drift(live, monkeypatch):
    helper = type(sys)("swap_helper")
    monkeypatch.setitem(sys.modules, "swap_helper", helper)
    importing = OLD + "from swap_helper import probe\n"
    with pytest.raises(code_swap.Drift, match=r"^swap_helper does not define probe \(its patch did not apply\)$"):
        code_swap.swap_in(live, OLD, importing, "p")
    helper.probe = mark(lambda: 7, "p")  # a helper the runtime half carries, marked there
    assert code_swap.swap_in(live, OLD, importing, "p").detail == "patched nothing; defined probe"
    assert live.probe() == 7
    assert code_swap.swap_in(live, OLD, importing, "p").detail == "already applied in this process"


def test_a_rewrite_that_removes_a_statement_is_drift():
    with pytest.raises(code_swap.Drift, match="removed top-level statements"):
        code_swap.top_level_changes(OLD, "def gate():\n    return True\n")
    changed, added = code_swap.top_level_changes(OLD, NEW)
    assert changed == ["gate"] and [n.name for n in added] == ["_helper"]


def test_a_function_compiled_other_than_once_is_drift():
    twice = compile("def f():\n    pass\n\n\ndef f():\n    pass\n", "m.py", "exec")
    with pytest.raises(code_swap.Drift, match=r"^f is compiled 2 times in m.py$"):
        code_swap.code_of(twice, "f")
    with pytest.raises(code_swap.Drift, match=r"^g is compiled 0 times in m.py$"):
        code_swap.code_of(twice, "g")
