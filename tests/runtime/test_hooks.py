"""Hook points as data (``runtime/hooks.py``): the template every patch passes on import, and the install and
runtime check a wrap patch gets from its hooks alone."""
from __future__ import annotations

import re
import sys
import types

import pytest

from sglang_pcie.runtime import hooks, patch_table
from sglang_pcie.runtime.patch_table import Hook, Row
from sglang_pcie.runtime.results import APPLIED, DISABLED, DRIFTED, NOT_APPLICABLE, Drift, Result, is_patched
from sglang_pcie.runtime.settings import load_settings

ON = load_settings({})
PAYLOAD = f"{__name__}:shout"


def shout(original, *args, settings=None):
    """The payload of these tests' rows: the original's answer in capitals, then the args handed down."""
    def shouting(*call_args, **kwargs):
        return (str(original(*call_args, **kwargs)).upper(), args, settings)
    shouting.__wrapped__ = original
    return shouting


def problem_named_by_the_module(module):
    return getattr(module, "PROBLEM", None)


def moved_owner(module, cls):
    return getattr(module, "Component", cls)


class Recording:
    """A patch with an install of its own (no hooks): what ``apply`` calls after the template's steps."""
    def __init__(self):
        self.installed = []

    def install(self, module, settings):
        self.installed.append(module.__name__)
        return Result(APPLIED, "installed")


@pytest.fixture
def own_install(monkeypatch):
    """A row without hooks whose install (``own_install_patch:install``) records the modules it is called with."""
    module = types.ModuleType("own_install_patch")
    recording = Recording()
    module.install = recording.install
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return Row(id="drafter-delegation", payload=PAYLOAD, install=f"{module.__name__}:install", targets=("plain",)), \
        recording


@pytest.fixture
def sglang_version(monkeypatch):
    def set_version(version):
        monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(__version__=version))
    return set_version


def module_from(tmp_path, name, text):
    path = tmp_path / f"{name.replace('.', '_')}.py"
    path.write_text(text)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(text, str(path), "exec"), module.__dict__)
    return module


# -- the template: baked, release gate, install

def test_the_install_runs_where_nothing_is_baked_in_and_the_release_is_covered(tmp_path, sglang_version, own_install):
    sglang_version("0.5.23")
    row, patch = own_install
    assert hooks.apply(row, module_from(tmp_path, "plain", "x = 1\n"), None) == Result(APPLIED, "installed")
    assert patch.installed == ["plain"]


def test_a_module_carrying_the_diff_is_left_alone(tmp_path, sglang_version, own_install):
    sglang_version("0.5.23")
    row, patch = own_install
    baked = module_from(tmp_path, "baked", "x = 1  # sglang-pcie: drafter-delegation\n")
    assert hooks.apply(row, baked, None) == Result(APPLIED, "source carries the sglang-pcie diff")
    other = module_from(tmp_path, "other", "x = 1  # sglang-pcie: eagle3-profile\n")  # another patch's marker
    hooks.apply(row, other, None)
    assert patch.installed == ["other"]


def test_an_older_release_is_not_touched(tmp_path, sglang_version, own_install):
    sglang_version("0.5.7")
    row, patch = own_install
    result = hooks.apply(row, module_from(tmp_path, "old", "x = 1\n"), None)
    assert result.status == NOT_APPLICABLE and "0.5.7 is older than the releases this patch covers" in result.detail
    assert patch.installed == []


def test_a_module_without_source_is_not_taken_for_baked(sglang_version, own_install):
    sglang_version("0.5.23")
    row, patch = own_install
    hooks.apply(row, types.ModuleType("no_source"), None)
    assert patch.installed == ["no_source"]


# -- the install from hooks

FUNCTION_ROW = Row(id="node-agreement", payload=PAYLOAD, hooks=(Hook("toy", "greet", says="greet shouts",
                                                                     problem=f"{__name__}:problem_named_by_the_module"),))
METHOD_ROW = Row(id="draft-token-watch", payload=PAYLOAD, hooks=(
    Hook("toy", "Worker.verify", args=("v2",), parameters=("self", "batch"), says="watching {member}"),
    Hook("toy", "Worker.draft", args=("d",), says="drafting {member}"),
    Hook("toy_old", "OldWorker.verify", args=("v1",), parameters=("self", "batch"), optional=True,
         says="watching {member}")))
TOY = '''
def greet(name):
    return f"hello {name}"


class Base:
    def draft(self):
        return "draft"


class Worker(Base):
    def verify(self, batch):
        return f"verified {batch}"
'''


def test_a_module_function_is_wrapped_once_with_the_payload_and_its_settings(tmp_path):
    toy = module_from(tmp_path, "toy", TOY)
    assert hooks.install(FUNCTION_ROW, toy, ON) == Result(APPLIED, "greet shouts")
    wrapped = toy.greet
    assert wrapped("you") == ("HELLO YOU", (), ON) and is_patched(wrapped, "node-agreement")
    assert hooks.install(FUNCTION_ROW, toy, ON).status == APPLIED and toy.greet is wrapped  # idempotent


def test_methods_own_and_inherited_are_wrapped_on_the_class_with_their_args(tmp_path):
    toy = module_from(tmp_path, "toy", TOY)
    result = hooks.install(METHOD_ROW, toy, ON)
    assert result == Result(APPLIED, "watching Worker.verify; drafting Worker.draft")
    worker = toy.Worker()
    assert worker.verify(3) == ("VERIFIED 3", ("v2",), ON) and worker.draft() == ("DRAFT", ("d",), ON)
    assert "draft" in vars(toy.Worker) and toy.Base().draft() == "draft"  # the base class is not touched


@pytest.mark.parametrize("text, message", [
    (TOY.replace("def verify(self, batch)", "def verify(self, batches)"),
     "Worker.verify takes (self, batches), not (self, batch)"),
    (TOY.replace("class Worker(Base)", "class Other(Base)"), "toy.Worker is missing"),
    (TOY.replace("    def draft(self):", "    draft = 1\n    def other(self):"),
     "Worker.draft is missing or not a plain function"),
])
def test_a_wrong_shape_is_drift_and_nothing_is_half_applied(tmp_path, text, message):
    toy = module_from(tmp_path, "toy", text)
    before = dict(vars(getattr(toy, "Worker", toy.Base)))
    with pytest.raises(Drift, match=f"^{re.escape(message)}$"):
        hooks.install(METHOD_ROW, toy, ON)
    assert dict(vars(getattr(toy, "Worker", toy.Base))) == before


def test_own_refuses_an_inherited_method(tmp_path):
    row = Row(id="drafter-delegation", payload=PAYLOAD, hooks=(Hook("toy", "Worker.draft", own=True, says="x"),))
    with pytest.raises(Drift, match=r"^toy\.Worker\.draft is missing$"):
        hooks.install(row, module_from(tmp_path, "toy", TOY), ON)


def test_a_problem_the_hook_names_is_drift_before_anything_changes(tmp_path):
    toy = module_from(tmp_path, "toy", TOY + "\nPROBLEM = 'no store here'\n")
    original = toy.greet
    with pytest.raises(Drift, match="^no store here$"):
        hooks.install(FUNCTION_ROW, toy, ON)
    assert toy.greet is original


def test_the_owner_function_follows_a_moved_method_and_details_name_where(tmp_path):
    row = Row(id="accept-length-alarm", payload=PAYLOAD, hooks=(Hook(
        "toy", "Worker.verify", owner=f"{__name__}:moved_owner", says="watching {member}"),))
    toy = module_from(tmp_path, "toy", TOY + "\n\nclass Component:\n    def verify(self, batch):\n        return 1\n")
    assert hooks.install(row, toy, ON) == Result(APPLIED, "watching toy.Component.verify")
    assert is_patched(vars(toy.Component)["verify"], "accept-length-alarm") and "verify" in vars(toy.Worker)
    assert not is_patched(vars(toy.Worker)["verify"], "accept-length-alarm")


# -- the runtime check

def test_check_says_what_is_in_effect_and_skips_an_optional_module_that_is_absent(tmp_path):
    toy = module_from(tmp_path, "toy", TOY)
    hooks.install(METHOD_ROW, toy, ON)
    assert hooks.check(METHOD_ROW, {"toy": toy}, ON) == Result(APPLIED, "watching Worker.verify; drafting "
                                                                        "Worker.draft")


def test_check_names_every_hook_not_in_effect(tmp_path):
    toy = module_from(tmp_path, "toy", TOY)
    old = module_from(tmp_path, "toy_old", "class OldWorker:\n    def verify(self, batch):\n        return 0\n")
    hooks.install(METHOD_ROW, toy, ON)
    result = hooks.check(METHOD_ROW, {"toy": toy, "toy_old": old}, ON)
    assert result == Result(DRIFTED, "not in effect in this process: OldWorker.verify is not wrapped")
    assert hooks.check(FUNCTION_ROW, {}, ON) == Result(DRIFTED, "not in effect in this process: toy did not import")
    toy.PROBLEM = "bound before the hook ran"
    assert hooks.check(FUNCTION_ROW, {"toy": toy}, ON) == Result(
        DRIFTED, "not in effect in this process: bound before the hook ran")


def test_check_says_when_a_baked_guard_left_sglangs_own(tmp_path):
    toy = module_from(tmp_path, "toy", TOY + "\n_sglang_pcie_node_agreement = None\n")
    assert hooks.check(FUNCTION_ROW, {"toy": toy}, ON) == Result(
        DRIFTED, "not in effect in this process: greet is not wrapped (its baked guard left it as SGLang ships it)")


def test_check_is_not_applicable_where_every_hook_is_optional_and_absent():
    row = Row(id="draft-token-watch", payload=PAYLOAD, hooks=METHOD_ROW.hooks[2:])
    assert hooks.check(row, {}, ON) == Result(NOT_APPLICABLE, "none of toy_old in this release")


def test_check_says_disabled_first():
    off = load_settings({"SGLANG_PCIE_DISABLE_PATCHES": "draft-token-watch"})
    assert hooks.check(METHOD_ROW, {}, off) == Result(DISABLED, patch_table.DISABLE_PATCHES_REASON)


def test_targets_are_the_hooks_modules_in_order_unless_named():
    assert METHOD_ROW.targets == ("toy", "toy_old")
    assert Row(id="x", payload=PAYLOAD, targets=("a",), hooks=METHOD_ROW.hooks).targets == ("a",)
    assert METHOD_ROW.hooks[0].cls == "Worker" and METHOD_ROW.hooks[0].name == "verify"
    assert FUNCTION_ROW.hooks[0].cls == "" and FUNCTION_ROW.hooks[0].name == "greet"
