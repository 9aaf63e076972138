"""Turns the overlay on in this process; called when ``sglang`` is first imported (and by SGLang's plugin
loader from 0.5.11).  Idempotent: whatever path calls it, each patch is applied once per target module.

What it reads: the settings (once, ``settings.for_process``; handed down to the NCCL decision and to every patch),
the NCCL decision (which reads the tuned file once) and the runtime half of the patch register
(``patch_table``), which is data. A wrap patch is applied from its hooks there (``runtime/hooks.py``); a patch with
an install of its own (its module under ``patching/``) has that module imported only when one of its target modules
is imported, and only if the patch is wanted here.
"""
from __future__ import annotations

import functools
import sys
from types import ModuleType

from sglang_pcie.runtime import hooks, patch_table
from sglang_pcie.runtime.results import DRIFTED, ERROR, FAILING_STATUSES, Drift, Result, StrictModeError
from sglang_pcie.runtime.settings import DISABLE_VAR, for_process, unknown_patch_ids

# patch id -> {target module name -> Result}; read by ``verify-patches --runtime``.
RESULTS: dict = {}
# patch id -> why it is not wanted in this process (its hooks were never registered).
SWITCHED_OFF: dict[str, str] = {}
# The settings activation decided with (None before it ran): those handed to every patch, and to its runtime check.
SETTINGS = None
_activated: bool | None = None  # None until the first call decides; then whether the overlay is on


def warn(message: str) -> None:
    sys.stderr.write(f"sglang-pcie: {message}\n")


def activate() -> bool:
    """Apply the NCCL decision and register every wanted patch on its target modules. Returns whether active.

    Decided once per process, whichever path calls first (the start-up hook on ``import sglang``, or SGLang's
    plugin loader); later calls return the same answer and say nothing again.
    """
    global _activated, SETTINGS
    if _activated is not None:
        return _activated
    import sglang_pcie_startup

    from sglang_pcie.runtime import nccl

    settings = SETTINGS = for_process()
    _activated = not settings.disabled
    if settings.disabled:
        # Switched off means silent, except where the switch itself could not be read (it is off because of that).
        for error in settings.errors:
            if error.startswith(f"{DISABLE_VAR}="):
                warn(error)
        return False
    for error in settings.errors + list(filter(None, [unknown_patch_ids(settings, patch_table.ids())])):
        warn(error)
    try:
        nccl.apply_for_process(settings)
    except Exception as exc:  # the patches still register; NCCL keeps its defaults
        warn(f"NCCL decision failed, NCCL defaults kept: {type(exc).__name__}: {exc}")

    watcher = sglang_pcie_startup.get_watcher()
    for row in patch_table.TABLE:
        reason = patch_table.disabled_reason(row, settings)
        if reason:
            SWITCHED_OFF[row.id] = reason
            continue
        for target in row.targets:
            watcher.watch(target, functools.partial(_apply, row, settings))
    return True


def _apply(row: patch_table.Row, settings, module: ModuleType) -> None:
    try:
        result = hooks.apply(row, module, settings)
    except Drift as exc:
        result = Result(DRIFTED, str(exc))
    except Exception as exc:  # a broken patch must not break SGLang's import
        result = Result(ERROR, f"{type(exc).__name__}: {exc}")
    recorded = RESULTS.setdefault(row.id, {})
    already_failed = any(r.status in FAILING_STATUSES for r in recorded.values())
    recorded[module.__name__] = result
    if result.status in FAILING_STATUSES:
        message = f"patch {row.id} skipped on {module.__name__}: {result.detail}"
        if settings.strict:
            raise StrictModeError(f"sglang-pcie: SGLANG_PCIE_STRICT=1 and {message}")
        if not already_failed:  # one line per patch, however many of its target modules it spans
            warn(message)
