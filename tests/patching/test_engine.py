"""The patch template: a module that carries the patch's diff is left alone, a release older than the patch covers is
not touched, and only then does the patch's own install run; the release gate is the same statically."""
from __future__ import annotations

import sys
import types

import pytest

from sglang_pcie.patching import engine
from sglang_pcie.patching.engine import APPLIED, NOT_APPLICABLE, Patch, Result, release_gate


class Recording(Patch):
    id = "drafter-delegation"  # any registered id: the entry gives targets and releases

    def __init__(self):
        super().__init__()
        self.installed = []

    def install(self, module, settings):
        self.installed.append(module.__name__)
        return Result(APPLIED, "installed")


def module_from(tmp_path, name, text):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(text, str(path), "exec"), module.__dict__)
    return module


@pytest.fixture
def sglang_version(monkeypatch):
    def set_version(version):
        monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(__version__=version))
    return set_version


def test_install_runs_where_nothing_is_baked_in_and_the_release_is_covered(tmp_path, sglang_version):
    sglang_version("0.5.23")
    patch = Recording()
    result = patch.apply(module_from(tmp_path, "plain", "x = 1\n"), settings=None)
    assert result == Result(APPLIED, "installed") and patch.installed == ["plain"]


def test_a_module_carrying_the_diff_is_left_alone(tmp_path, sglang_version):
    sglang_version("0.5.23")
    patch = Recording()
    baked = module_from(tmp_path, "baked", "x = 1  # sglang-pcie: drafter-delegation\n")
    assert patch.apply(baked, None) == Result(APPLIED, "source carries the sglang-pcie diff")
    other = module_from(tmp_path, "other", "x = 1  # sglang-pcie: eagle3-profile\n")  # another patch's marker
    patch.apply(other, None)
    assert patch.installed == ["other"]


def test_an_older_release_is_not_touched_at_runtime_either(tmp_path, sglang_version):
    sglang_version("0.5.7")
    patch = Recording()
    result = patch.apply(module_from(tmp_path, "old", "x = 1\n"), None)
    assert result.status == NOT_APPLICABLE and "0.5.7 is older than the releases this patch covers" in result.detail
    assert patch.installed == []


@pytest.mark.parametrize("version, gated", [("0.5.7", True), ("0.5.8", False), ("0.5.99", False),
                                            ("not-a-version", False), (None, False)])
def test_the_release_gate(version, gated):
    result = release_gate(engine.get_patch("eagle3-profile"), version)
    assert (result is not None) is gated
    if gated:
        assert result.detail == "sglang 0.5.7 is older than the releases this patch covers (0.5.8 to 0.5.23)"


def test_a_module_without_source_is_not_taken_for_baked(sglang_version):
    sglang_version("0.5.23")
    patch = Recording()
    patch.apply(types.ModuleType("no_source"), None)
    assert patch.installed == ["no_source"]


def test_the_install_hands_its_settings_to_the_registers_payload(monkeypatch):
    """``Patch.wrapper``: the payload the register names, called as the baked guard calls it, with the settings the
    install was handed."""
    from sglang_pcie.runtime import drafter_delegation
    from sglang_pcie.runtime.settings import load_settings

    calls = []
    monkeypatch.setattr(drafter_delegation, "wrap", lambda original, *args, settings: calls.append(
        (original, args, settings)) or "wrapped")
    settings = load_settings({})
    assert Recording().wrapper(settings, "extra")(len) == "wrapped" and calls == [(len, ("extra",), settings)]


@pytest.mark.parametrize("releases, bounds", [(">=0.5.8,<=0.5.23", ("0.5.8", "0.5.23")),
                                              (">=0.5.8,>=0.5.10,<=0.5.23,<=0.5.20", ("0.5.10", "0.5.20")),
                                              ("==0.5.9", ("0.5.9", "0.5.9"))])
def test_release_bounds_are_the_narrowest_first_and_last_named(releases, bounds):
    assert engine.release_bounds(types.SimpleNamespace(id="p", releases=releases)) == bounds


def test_release_bounds_refuse_a_specifier_without_a_first_or_last_release():
    with pytest.raises(ValueError, match=r"^p: releases '>=0.5.8' does not name its first and last release$"):
        engine.release_bounds(types.SimpleNamespace(id="p", releases=">=0.5.8"))
