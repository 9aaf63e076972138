"""The hooks of sglang_pcie.patches.eagle3_profile.payload: the register's gate (EAGLE3_PROFILE and the switches that
keep it off), and the versioned diffs' decorator (identity when profiling is off)."""
from __future__ import annotations

import types

import pytest

from sglang_pcie.patches.eagle3_profile.check import PATCH
from sglang_pcie.patches.eagle3_profile import payload as ep
from sglang_pcie.runtime import settings
from sglang_pcie.runtime.settings import load_settings


@pytest.mark.parametrize("environ, reason", [
    ({}, "EAGLE3_PROFILE is not set to 1"),
    ({"EAGLE3_PROFILE": "0"}, "EAGLE3_PROFILE is not set to 1"),
    ({"EAGLE3_PROFILE": "maybe"}, "EAGLE3_PROFILE is not set to 1"),
    ({"EAGLE3_PROFILE": "1", "SGLANG_PCIE_DISABLE_PATCHES": "eagle3-profile"}, "SGLANG_PCIE_DISABLE_PATCHES"),
    ({"EAGLE3_PROFILE": "1", "SGLANG_PCIE_DISABLE": "1"}, "SGLANG_PCIE_DISABLE"),
    ({"EAGLE3_PROFILE": "1"}, None),
])
def test_disabled_reason(environ, reason):
    got = PATCH.disabled_reason(load_settings(environ))
    assert got == reason if reason is None else reason in got


def test_invalid_profile_value_is_named_in_the_settings_errors():
    settings = load_settings({"EAGLE3_PROFILE": "maybe"})
    assert any("EAGLE3_PROFILE='maybe'" in e for e in settings.errors)


def test_diff_decorator_is_identity_when_profiling_is_off(monkeypatch):
    monkeypatch.delenv("EAGLE3_PROFILE", raising=False)

    def method(self):
        return 1

    assert ep.profile_phase("draft")(method) is method
    monkeypatch.setenv("EAGLE3_PROFILE", "1")
    monkeypatch.setattr(settings, "_PROCESS_SETTINGS", None)  # another process: it reads its own environment
    assert ep.profile_phase("draft")(method).__wrapped__ is method



def test_the_profiler_is_made_from_the_settings_the_wrapper_was_handed(monkeypatch, tmp_path):
    """Those the patch was gated with (the install's, or the baked guard's), not the process's read again."""
    made = []
    monkeypatch.setattr(ep, "_PROFILER", None)
    monkeypatch.setattr(ep, "Profiler", lambda **kwargs: made.append(kwargs) or types.SimpleNamespace(active=False))
    monkeypatch.setattr(ep, "calibrate", lambda profiler: None)
    monkeypatch.setenv("EAGLE3_PROFILE_INTERVAL", "7")
    monkeypatch.setattr(settings, "_PROCESS_SETTINGS", None)
    handed = load_settings({"EAGLE3_PROFILE": "1", "EAGLE3_PROFILE_INTERVAL": "50",
                            "EAGLE3_PROFILE_FILE": str(tmp_path / "profile.jsonl")})
    cycle = ep.wrap(lambda self: "cycled", "cycle", settings=handed)
    assert cycle(None) == "cycled"
    assert made == [{"interval": 50, "baseline_ms": None, "path": str(tmp_path / "profile.jsonl"),
                     "exit_flush": True}]
