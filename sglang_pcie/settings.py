"""Every environment variable sglang-pcie reads, parsed and validated in one place.

A bad value never raises: it becomes one line in ``Settings.errors`` naming the variable and the value (one
warning line when ``sglang`` is imported, exit code 2 in the CLI), and nothing is applied from it. The kill
switch is the exception that keeps the overlay safe: a ``SGLANG_PCIE_DISABLE`` that is not a boolean turns the
overlay off. Booleans are read by ``sglang_pcie_startup.parse_flag``, the parser the start-up hook uses, so
the hook and the settings never disagree about the kill switch.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Mapping

from sglang_pcie_startup import parse_flag

DISABLE_VAR = "SGLANG_PCIE_DISABLE"
DISABLE_PATCHES_VAR = "SGLANG_PCIE_DISABLE_PATCHES"
NCCL_PROFILES = ("auto", "pcie", "tuned", "off")


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
    eagle3_profile_file: str | None = None  # EAGLE3_PROFILE_FILE; None also when it cannot be written
    errors: list = field(default_factory=list)  # one line per invalid variable, starting "NAME="


def shown(raw: str) -> str:
    """A value as the user set it: the text's repr, or the bytes' repr where they are not UTF-8 (os.environ
    holds such bytes as lone surrogates, which would print as '\\udcff')."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return repr(os.fsencode(raw))
    return repr(raw)


def known_patch_ids() -> list[str]:
    """Every patch id, read from the registry's module names (one module per patch, named after its id)
    rather than by importing the patches themselves."""
    from sglang_pcie.registry import PATCH_MODULES

    return [name.rpartition(".")[2].replace("_", "-") for name in PATCH_MODULES]


def _flag(env, name, s, invalid_means=False):
    raw = env.get(name, "")
    value = parse_flag(raw)
    if value is None:
        effect = "read as 1: the overlay is off" if invalid_means else "ignored"
        s.errors.append(f"{name}={shown(raw)} is not a boolean (use 1 or 0); {effect}")
        return invalid_means
    return value


def _patch_ids(env, s) -> frozenset:
    raw = env.get(DISABLE_PATCHES_VAR, "")
    ids = {part.strip() for part in raw.split(",") if part.strip()}
    if ids:
        known = known_patch_ids()
        unknown = sorted(ids.difference(known))
        if unknown:
            # The known ids stay switched off: applying a patch the user tried to turn off is the unsafe reading.
            s.errors.append(f"{DISABLE_PATCHES_VAR}={shown(raw)} names no patch {', '.join(map(shown, unknown))}"
                            f" (patch ids: {', '.join(known)}); unknown ids ignored")
    return frozenset(ids)


def _tuned_file_error(env) -> str | None:
    """Why the tuned NCCL file (SGLANG_PCIE_TUNED_FILE, or its default path) cannot be used; None when it can
    or when the default path simply holds no file."""
    from sglang_pcie import tuning

    raw = env.get(tuning.TUNED_FILE_VAR, "")
    path = tuning.config_path(env)
    config, problem = tuning.read_config(path)
    if raw.strip():
        name = f"{tuning.TUNED_FILE_VAR}={shown(raw)}"
        if config is None and problem is None:
            problem = f"no such file {path}"
    else:
        name = f"{tuning.TUNED_FILE_VAR} (unset: the default {path})"
    return f"{name}: {problem}; nothing applied from it" if problem else None


def _unwritable(raw: str) -> str | None:
    """Why JSON lines cannot be appended to the file ``raw``, found without creating anything; None if they can."""
    path = os.path.abspath(raw)
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        return "is a folder"
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else "the file is not writable"
    return None if os.access(folder, os.W_OK | os.X_OK) else f"folder {folder} is not writable"


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    s = Settings()
    s.disabled = _flag(env, DISABLE_VAR, s, invalid_means=True)
    s.strict = _flag(env, "SGLANG_PCIE_STRICT", s)
    s.sm120_fusion = _flag(env, "SGLANG_PCIE_SM120_FUSION", s)
    s.eagle3_profile = _flag(env, "EAGLE3_PROFILE", s)
    s.disabled_patches = _patch_ids(env, s)

    raw = env.get("SGLANG_PCIE_NCCL_PROFILE", "")
    profile = raw.strip().lower() or "auto"
    if profile in NCCL_PROFILES:
        s.nccl_profile = profile
    else:
        s.nccl_profile = None
        s.errors.append(f"SGLANG_PCIE_NCCL_PROFILE={shown(raw)} is not one of {', '.join(NCCL_PROFILES)};"
                        " no NCCL profile applied")
    # The tuned file is read only where the NCCL decision reads it: profile auto or tuned, in the process that
    # decides. Spawned workers inherit the decision (and its one warning) instead of saying it again.
    from sglang_pcie.nccl import DECIDED_VAR

    if s.nccl_profile in ("auto", "tuned") and DECIDED_VAR not in env:
        error = _tuned_file_error(env)
        if error:
            s.errors.append(error)

    raw = env.get("EAGLE3_PROFILE_INTERVAL", "")
    if raw.strip():
        try:
            s.eagle3_profile_interval = int(raw)
            if s.eagle3_profile_interval < 1:
                raise ValueError
        except ValueError:
            s.eagle3_profile_interval = 200
            s.errors.append(f"EAGLE3_PROFILE_INTERVAL={shown(raw)} is not a positive integer; using 200")

    raw = env.get("EAGLE3_PROFILE_BASELINE_MS", "")
    if raw.strip():
        try:
            s.eagle3_profile_baseline_ms = float(raw)
            # inf / nan would reach the JSON-lines file as Infinity / NaN, which are not JSON.
            if not (math.isfinite(s.eagle3_profile_baseline_ms) and s.eagle3_profile_baseline_ms > 0):
                raise ValueError
        except ValueError:
            s.eagle3_profile_baseline_ms = None
            s.errors.append(f"EAGLE3_PROFILE_BASELINE_MS={shown(raw)} is not a positive finite number; ignored")

    raw = env.get("EAGLE3_PROFILE_FILE", "")
    if raw.strip():
        problem = _unwritable(raw)
        if problem:
            s.errors.append(f"EAGLE3_PROFILE_FILE={shown(raw)}: {problem}; no JSON lines written")
        else:
            s.eagle3_profile_file = raw
    return s
