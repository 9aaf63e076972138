"""The one guard of every baked diff (``sglang-pcie apply-diffs``).

Each diff binds, once per module it touches, ``_sglang_pcie_<id> = guard("<id>")`` (the lines
``patching/baked.py`` generates, the same for every patch) and decorates what it changes with
``@_sglang_pcie_<id>(*args)``.  Where the runtime's gate lets the patch act in this process
(``SGLANG_PCIE_DISABLE``, ``SGLANG_PCIE_DISABLE_PATCHES``, the patch's opt-in: ``patch_table.disabled_reason``,
the function activation asks), the decorated object is replaced by the patch's payload (``payload`` in the patch
table, the very function its runtime install applies, called alike: ``payload(original, *args, settings=...)``);
otherwise it stays SGLang's own.  Without sglang-pcie installed, the diff's ``except ImportError`` branch defines
the same names as the identity.

Decided when the decorated module is imported, from the process's settings (read once per process), as
activation decides whether to register a patch's hooks; the payload gets the settings the gate was asked with.
"""
from __future__ import annotations

import importlib
import sys
from typing import Callable

from sglang_pcie.runtime import patch_table
from sglang_pcie.runtime.results import mark


def guard_name(patch_id: str) -> str:
    """The module-level name a diff binds its patch's guard to: ``_sglang_pcie_<id with underscores>``."""
    return "_sglang_pcie_" + patch_id.replace("-", "_")


def guard(patch_id: str) -> Callable:
    """The decorator factory a baked diff binds for ``patch_id``: ``guard(id)(*args)(original)``."""
    def decorator(*args) -> Callable:
        def decorate(original):
            return guarded(patch_id, original, args)
        return decorate
    return decorator


def guarded(patch_id: str, original, args: tuple = ()):
    """``original`` replaced by the patch's payload where the patch is on here; ``original`` itself otherwise."""
    try:
        from sglang_pcie.runtime.settings import for_process

        row = patch_table.row(patch_id)
        settings = for_process()
        if patch_table.disabled_reason(row, settings) is not None:
            return original
        return mark(payload_of(row)(original, *args, settings=settings), patch_id)
    except Exception as exc:  # a baked diff never breaks SGLang's import: SGLang's own code, said once here
        sys.stderr.write(f"sglang-pcie: {patch_id} left {getattr(original, '__qualname__', original)!s} as "
                         f"SGLang ships it: {type(exc).__name__}: {exc}\n")
        return original


def payload_of(row: patch_table.Row) -> Callable:
    """The function the patch table names as the patch's payload (imported here, only where the patch is on)."""
    module, _, name = row.payload.partition(":")
    return getattr(importlib.import_module(module), name)


def switched_on(original: Callable, settings=None) -> Callable:
    """The payload of a diff that only asks whether its patch is on (sm120-allreduce-fusion's
    ``_sglang_pcie_sm120_opted_in``, whose own body answers False): an answer of True."""
    def opted_in():
        return True
    opted_in.__name__, opted_in.__qualname__ = original.__name__, original.__qualname__
    return opted_in
