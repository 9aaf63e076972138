"""Every variable is validated in one place; a bad value is one line naming it, never an exception."""
from __future__ import annotations

import pytest

from sglang_pcie.settings import load_settings


def test_defaults():
    s = load_settings({})
    assert (s.disabled, s.strict, s.nccl_profile, s.eagle3_profile, s.eagle3_profile_interval, s.errors) == (
        False, False, "auto", False, 200, [])


@pytest.mark.parametrize("name, value", [
    ("SGLANG_PCIE_NCCL_PROFILE", "fast"),
    ("EAGLE3_PROFILE", "maybe"),
    ("EAGLE3_PROFILE_INTERVAL", "-3"),
    ("EAGLE3_PROFILE_BASELINE_MS", "abc"),
    ("SGLANG_PCIE_STRICT", "2"),
])
def test_invalid_value_is_one_error_naming_variable_and_value(name, value):
    s = load_settings({name: value})
    assert len(s.errors) == 1 and name in s.errors[0] and repr(value) in s.errors[0]


def test_invalid_values_apply_nothing():
    s = load_settings({"SGLANG_PCIE_NCCL_PROFILE": "fast", "EAGLE3_PROFILE": "maybe"})
    assert s.nccl_profile is None and s.eagle3_profile is False


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_true_spellings(value):
    assert load_settings({"EAGLE3_PROFILE": value}).eagle3_profile is True


def test_profile_names_are_case_insensitive():
    assert load_settings({"SGLANG_PCIE_NCCL_PROFILE": " PCIe "}).nccl_profile == "pcie"
