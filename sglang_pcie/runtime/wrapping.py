"""The one way a runtime patch wraps a function or method of SGLang: idempotent, marked, and undoable.

``wrap_member(owner, name, wrapper, patch_id)`` replaces ``owner.<name>`` (a module's function, or a class's
method, own or inherited: the wrapper is set on ``owner`` itself, as a baked diff decorates it there) by
``wrapper(original)``, marked with the patch id; where the member already carries that mark nothing happens, so a
hook that runs twice wraps once. ``unwrap_member`` puts back what was there (or removes the override where the
method was inherited).
"""
from __future__ import annotations

import inspect
from typing import Callable

from sglang_pcie.runtime.results import is_patched, mark

UNDO_ATTR = "__sglang_pcie_undo__"  # on a wrapper: what ``owner.__dict__[name]`` held before it
_ABSENT = object()  # the method was inherited: undo removes the override


def member(owner, name: str):
    """``owner.<name>`` as stored: a class's (own or inherited, first in its MRO), or a module's; None if absent."""
    if inspect.isclass(owner):
        return next((c.__dict__[name] for c in owner.__mro__ if name in c.__dict__), None)
    return vars(owner).get(name)


def wrap_member(owner, name: str, wrapper: Callable, patch_id: str) -> bool:
    """``owner.<name> = wrapper(original)``, marked with ``patch_id``, unless it already is. Returns whether it
    changed anything. The caller checks the member's shape first (all or nothing)."""
    original = member(owner, name)
    if is_patched(original, patch_id):
        return False
    wrapped = mark(wrapper(original), patch_id)
    setattr(wrapped, UNDO_ATTR, vars(owner).get(name, _ABSENT))
    setattr(owner, name, wrapped)
    return True


def unwrap_member(owner, name: str, patch_id: str) -> bool:
    """Undo ``wrap_member`` for ``patch_id``; returns whether anything was undone."""
    wrapped = vars(owner).get(name)
    if not is_patched(wrapped, patch_id) or not hasattr(wrapped, UNDO_ATTR):
        return False
    previous = getattr(wrapped, UNDO_ATTR)
    if previous is _ABSENT:
        delattr(owner, name)
    else:
        setattr(owner, name, previous)
    return True
