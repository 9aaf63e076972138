"""The lines every baked diff adds to gate itself, generated the same way for every patch.

A diff adds ``guard_block(id)`` once to each module it decorates something in, and ``decorator(id, *args)`` above
each function it changes; ``sglang_pcie.runtime.baked.guard`` decides, in the process, whether the decorated
function becomes the patch's payload (the runtime's gate) or stays SGLang's own. Without sglang-pcie installed,
the block's ``except ImportError`` branch makes every decorator the identity.
"""
from __future__ import annotations

from sglang_pcie.runtime.baked import guard_name  # noqa: F401  (the name the guard checks, re-exported)
from sglang_pcie.runtime.results import DIFF_MARKER

GUARD_FACTORY = "_sglang_pcie_guard"


def guard_block(patch_id: str) -> str:
    """The lines binding the guard (unindented, every one carrying the patch's marker)."""
    marker = f"# {DIFF_MARKER} {patch_id}"
    return (f"{marker}: acts where sglang-pcie's switches let it; SGLang's own code otherwise or without sglang-pcie\n"
            f"try:  {marker}\n"
            f"    from sglang_pcie.runtime.baked import guard as {GUARD_FACTORY}  {marker}\n"
            f"except ImportError:  {marker}\n"
            f"    def {GUARD_FACTORY}(patch_id):  {marker}\n"
            f"        return lambda *args: lambda original: original  {marker}\n"
            f"{guard_name(patch_id)} = {GUARD_FACTORY}({patch_id!r})  {marker}\n")


def decorator(patch_id: str, *args) -> str:
    """The decorator line (unindented, with its newline) a diff puts above a function it changes."""
    return f"@{decorator_call(patch_id, *args)}  # {DIFF_MARKER} {patch_id}\n"


def rebinding(patch_id: str, target: str, *args) -> str:
    """The line applying the guard to ``target`` (a dotted name) after its definition, where a decorator would sit
    in a hunk whose context changes more often (unindented, with its newline)."""
    return f"{target} = {decorator_call(patch_id, *args)}({target})  # {DIFF_MARKER} {patch_id}\n"


def decorator_call(patch_id: str, *args) -> str:
    """The decorator expression as ``ast.unparse`` writes it: ``_sglang_pcie_<id>(*args)``."""
    return f"{guard_name(patch_id)}({', '.join(repr(a) for a in args)})"
