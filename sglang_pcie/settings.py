"""Every environment variable sglang-pcie reads, parsed in one place.

A bad value never raises: it becomes one entry in ``Settings.errors`` (printed as one warning line by the
runtime, exit code 2 in the CLI) and the setting falls back to "nothing applied from it".
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

NCCL_PROFILES = ("auto", "pcie", "tuned", "off")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass
class Settings:
    disabled: bool = False  # SGLANG_PCIE_DISABLE
    strict: bool = False  # SGLANG_PCIE_STRICT
    disabled_patches: frozenset = frozenset()  # SGLANG_PCIE_DISABLE_PATCHES (comma-separated ids)
    nccl_profile: str | None = "auto"  # SGLANG_PCIE_NCCL_PROFILE; None when the value was invalid
    sm120_fusion: bool = False  # SGLANG_PCIE_SM120_FUSION
    eagle3_profile: bool = False  # EAGLE3_PROFILE
    eagle3_profile_interval: int = 200  # EAGLE3_PROFILE_INTERVAL
    eagle3_profile_baseline_ms: float | None = None  # EAGLE3_PROFILE_BASELINE_MS
    eagle3_profile_file: str | None = None  # EAGLE3_PROFILE_FILE
    errors: list = field(default_factory=list)  # one line per invalid variable


def _flag(env, name, settings):
    raw = env.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value not in _FALSE:
        settings.errors.append(f"{name}={raw!r} is not a boolean (use 1 or 0); ignored")
    return False


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    s = Settings()
    s.disabled = _flag(env, "SGLANG_PCIE_DISABLE", s)
    s.strict = _flag(env, "SGLANG_PCIE_STRICT", s)
    s.sm120_fusion = _flag(env, "SGLANG_PCIE_SM120_FUSION", s)
    s.eagle3_profile = _flag(env, "EAGLE3_PROFILE", s)

    ids = {part.strip() for part in env.get("SGLANG_PCIE_DISABLE_PATCHES", "").split(",") if part.strip()}
    s.disabled_patches = frozenset(ids)

    raw = env.get("SGLANG_PCIE_NCCL_PROFILE", "")
    profile = raw.strip().lower() or "auto"
    if profile in NCCL_PROFILES:
        s.nccl_profile = profile
    else:
        s.nccl_profile = None
        s.errors.append(f"SGLANG_PCIE_NCCL_PROFILE={raw!r} is not one of {', '.join(NCCL_PROFILES)};"
                        " no NCCL profile applied")

    raw = env.get("EAGLE3_PROFILE_INTERVAL", "")
    if raw.strip():
        try:
            s.eagle3_profile_interval = int(raw)
            if s.eagle3_profile_interval < 1:
                raise ValueError
        except ValueError:
            s.eagle3_profile_interval = 200
            s.errors.append(f"EAGLE3_PROFILE_INTERVAL={raw!r} is not a positive integer; using 200")

    raw = env.get("EAGLE3_PROFILE_BASELINE_MS", "")
    if raw.strip():
        try:
            s.eagle3_profile_baseline_ms = float(raw)
            if not s.eagle3_profile_baseline_ms > 0:
                raise ValueError
        except ValueError:
            s.eagle3_profile_baseline_ms = None
            s.errors.append(f"EAGLE3_PROFILE_BASELINE_MS={raw!r} is not a positive number; ignored")

    s.eagle3_profile_file = env.get("EAGLE3_PROFILE_FILE") or None
    return s
