"""The patch base class: the release gate (the same statically and at runtime, ``runtime/hooks.py``, whose tests
hold the template's) and the payload handed the settings."""
from __future__ import annotations

import types

import pytest

from sglang_pcie.patching import engine
from sglang_pcie.patching.engine import Patch, release_gate


class Recording(Patch):
    id = "drafter-delegation"  # any registered id: the entry gives its payload


@pytest.mark.parametrize("version, gated", [("0.5.7", True), ("0.5.8", False), ("0.5.99", False),
                                            ("not-a-version", False), (None, False)])
def test_the_release_gate(version, gated):
    result = release_gate(engine.get_patch("eagle3-profile"), version)
    assert (result is not None) is gated
    if gated:
        assert result.detail == "sglang 0.5.7 is older than the releases this patch covers (0.5.8 to 0.5.23)"


def test_the_install_hands_its_settings_to_the_registers_payload(monkeypatch):
    """``Patch.wrapper``: the payload the register names, called as the baked guard calls it, with the settings the
    install was handed."""
    from sglang_pcie.patches.drafter_delegation import payload as drafter_delegation
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
