"""Turns the overlay on in this process; called when ``sglang`` is first imported (and by SGLang's plugin
loader from 0.5.11).  Idempotent: whatever path calls it, each patch is applied once per target module."""
from __future__ import annotations

import functools
import sys
from types import ModuleType

from sglang_pcie.base import DRIFTED, ERROR, Drift, Patch, Result, StrictModeError

# patch id -> {target module name -> Result}; read by ``verify-patches --runtime``.
RESULTS: dict[str, dict[str, Result]] = {}
# patch id -> why the user switched it off in this process (its hooks were never registered).
SWITCHED_OFF: dict[str, str] = {}
_activated: bool | None = None  # None until the first call decides; then whether the overlay is on


def warn(message: str) -> None:
    sys.stderr.write(f"sglang-pcie: {message}\n")


def activate() -> bool:
    """Apply the NCCL profile and register every enabled patch on its target modules. Returns whether active.

    Decided once per process, whichever path calls first (the start-up hook on ``import sglang``, or SGLang's
    plugin loader); later calls return the same answer and say nothing again.
    """
    global _activated
    if _activated is not None:
        return _activated
    import sglang_pcie_startup

    from sglang_pcie import nccl, registry
    from sglang_pcie.settings import DISABLE_VAR, load_settings

    settings = load_settings()
    _activated = not settings.disabled
    if settings.disabled:
        # Switched off means silent, except where the switch itself could not be read (it is off because of that).
        for error in settings.errors:
            if error.startswith(f"{DISABLE_VAR}="):
                warn(error)
        return False
    for error in settings.errors:
        warn(error)
    try:
        nccl.apply_for_process(settings)
    except Exception as exc:  # the patches still register; NCCL keeps its defaults
        warn(f"NCCL decision failed, NCCL defaults kept: {type(exc).__name__}: {exc}")

    watcher = sglang_pcie_startup.get_watcher()
    for patch in registry.all_patches():
        reason = patch.disabled_reason(settings)
        if reason:
            SWITCHED_OFF[patch.id] = reason
            continue
        for target in patch.targets:
            watcher.watch(target, functools.partial(_apply, patch, settings.strict))
    return True


def _apply(patch: Patch, strict: bool, module: ModuleType) -> None:
    try:
        result = patch.apply(module)
    except Drift as exc:
        result = Result(DRIFTED, str(exc))
    except Exception as exc:  # a broken patch must not break SGLang's import
        result = Result(ERROR, f"{type(exc).__name__}: {exc}")
    recorded = RESULTS.setdefault(patch.id, {})
    already_failed = any(r.status in (DRIFTED, ERROR) for r in recorded.values())
    recorded[module.__name__] = result
    if result.status in (DRIFTED, ERROR):
        message = f"patch {patch.id} skipped on {module.__name__}: {result.detail}"
        if strict:
            raise StrictModeError(f"sglang-pcie: SGLANG_PCIE_STRICT=1 and {message}")
        if not already_failed:  # one line per patch, however many of its target modules it spans
            warn(message)
