"""Every environment variable sglang-pcie reads, parsed and validated in one place.

A bad value never raises: it becomes one line in ``Settings.errors`` naming the variable and the value (one
warning line when ``sglang`` is imported, exit code 2 in the CLI), and nothing is applied from it. The kill
switch is the exception that keeps the overlay safe: a ``SGLANG_PCIE_DISABLE`` that is not a boolean turns the
overlay off. Booleans are read by ``sglang_pcie_startup.parse_flag``, the parser the start-up hook uses, so
the hook and the settings never disagree about the kill switch.

A leaf: it imports nothing else of sglang-pcie. ``for_process()`` loads the settings once per process; activation
hands them down to the NCCL decision and the patches. What needs other knowledge is checked where that knowledge
is: patch ids against the register (activation, the CLI), the tuned file by the NCCL decision that reads it.
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
# Measured on 8 x RTX PRO 6000 Blackwell over PCIe (62.9 -> 88.8 tok/s decode). On 2 x H200 the same values made
# prefill-sized all-reduces 5-29x slower than NCCL's defaults, so only an explicit SGLANG_PCIE_NCCL_PROFILE=pcie
# applies them.
PCIE_PROFILE = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MIN_NCHANNELS": "2",
    "NCCL_MAX_NCHANNELS": "2",
    "NCCL_BUFFSIZE": "131072",
}
# SGLang's own switch and bound for FlashInfer's PCIe-IPC all-reduce: the NCCL decision keeps what the user set.
IPC_VARS = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "SGLANG_PCIE_IPC_MAX_NUMEL")
# Decode cycles per EAGLE profile report (the profiler's DEFAULT_INTERVAL, which this start-up module must not import;
# a test keeps them equal).  24 of them are timed (1 in 41) where the host budget has no room for more: that kept the
# profiler's host time at 0.79% of a host-bound H200 server's cycle (1 in 8, at 200, cost 1.1-1.8%).
EAGLE3_PROFILE_INTERVAL = 1000


@dataclass
class Settings:
    disabled: bool = False  # SGLANG_PCIE_DISABLE
    strict: bool = False  # SGLANG_PCIE_STRICT
    disabled_patches: frozenset = frozenset()  # SGLANG_PCIE_DISABLE_PATCHES (comma-separated ids)
    nccl_profile: str | None = "auto"  # SGLANG_PCIE_NCCL_PROFILE; None when the value was invalid
    sm120_fusion: bool = False  # SGLANG_PCIE_SM120_FUSION
    eagle3_profile: bool = False  # EAGLE3_PROFILE
    eagle3_profile_interval: int = EAGLE3_PROFILE_INTERVAL  # EAGLE3_PROFILE_INTERVAL
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


def _flag(env, name, s, invalid_means=False):
    raw = env.get(name, "")
    value = parse_flag(raw)
    if value is None:
        effect = "read as 1: the overlay is off" if invalid_means else "ignored"
        s.errors.append(f"{name}={shown(raw)} is not a boolean (use 1 or 0); {effect}")
        return invalid_means
    return value


def unknown_patch_ids(settings: "Settings", known: list[str], environ: Mapping[str, str] | None = None) -> str | None:
    """One error line when SGLANG_PCIE_DISABLE_PATCHES names ids that are not in ``known`` (the register's ids),
    else None. Such a list switches every patch off (``patch_table.disabled_reason``): applying a patch the user
    tried to turn off is the unsafe reading, and honouring only the ids that exist would half-apply the value."""
    unknown = sorted(settings.disabled_patches.difference(known))
    if not unknown:
        return None
    raw = (os.environ if environ is None else environ).get(DISABLE_PATCHES_VAR, "")
    return (f"{DISABLE_PATCHES_VAR}={shown(raw)} names no patch {', '.join(map(shown, unknown))}"
            f" (patch ids: {', '.join(known)}); every patch is off until it names only patch ids")


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
    raw = env.get(DISABLE_PATCHES_VAR, "")
    s.disabled_patches = frozenset(part.strip() for part in raw.split(",") if part.strip())

    raw = env.get("SGLANG_PCIE_NCCL_PROFILE", "")
    profile = raw.strip().lower() or "auto"
    if profile in NCCL_PROFILES:
        s.nccl_profile = profile
    else:
        s.nccl_profile = None
        s.errors.append(f"SGLANG_PCIE_NCCL_PROFILE={shown(raw)} is not one of {', '.join(NCCL_PROFILES)};"
                        " no NCCL profile applied")
    raw = env.get("EAGLE3_PROFILE_INTERVAL", "")
    if raw.strip():
        try:
            s.eagle3_profile_interval = int(raw)
            if s.eagle3_profile_interval < 1:
                raise ValueError
        except ValueError:
            s.eagle3_profile_interval = EAGLE3_PROFILE_INTERVAL
            s.errors.append(f"EAGLE3_PROFILE_INTERVAL={shown(raw)} is not a positive integer;"
                            f" using {EAGLE3_PROFILE_INTERVAL}")

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


_PROCESS_SETTINGS: Settings | None = None


def for_process() -> Settings:
    """This process's settings, read from its environment once (activation, the profiler and the diffs' hooks all
    ask; they get the same object)."""
    global _PROCESS_SETTINGS
    if _PROCESS_SETTINGS is None:
        _PROCESS_SETTINGS = load_settings()
    return _PROCESS_SETTINGS
