"""What applying a patch leaves in a process: its result (a status and a detail), the exception a patch raises when
its target has the wrong shape, and the mark on every function or class member the overlay installs.

Shared by activation (which records each patch's result per target module), the runtime payloads (the EAGLE
profiler's wrappers carry the mark), the patches and ``verify-patches``.
"""
from __future__ import annotations

from dataclasses import dataclass

# Statuses, shared by verify-patches, the release matrix and the runtime hooks.
APPLIED = "applied"  # runtime: in effect in this process
APPLICABLE = "applicable"  # static: fits this source
UPSTREAM = "upstream"  # the release already has it
NOT_APPLICABLE = "not-applicable"  # the release lacks what the patch touches
DISABLED = "disabled"  # switched off by the user
DRIFTED = "drifted"  # the target moved or changed shape
ERROR = "error"
STATUSES = (APPLIED, APPLICABLE, UPSTREAM, NOT_APPLICABLE, DISABLED, DRIFTED, ERROR)
FAILING_STATUSES = (DRIFTED, ERROR)

# Comment carried by every line block the versioned diffs add; the static checks look for it.
DIFF_MARKER = "sglang-pcie:"


@dataclass(frozen=True)
class Result:
    status: str
    detail: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown patch status {self.status!r}")


class Drift(Exception):
    """Raised by ``Patch.apply`` when the target does not have the shape the patch expects."""


class StrictModeError(RuntimeError):
    """Raised instead of skipping a drifted patch when SGLANG_PCIE_STRICT=1; stops the import."""

    sglang_pcie_fatal = True


# Attribute set on every function or class member this overlay installs: value is the patch id.
MARKER_ATTR = "__sglang_pcie_patch__"


def is_patched(obj, patch_id: str) -> bool:
    """Whether ``obj`` or a function it wraps (``__wrapped__``, as functools.wraps sets it) carries the patch's
    mark: two patches may wrap one method (eagle3-profile's timer inside draft-token-watch's counter)."""
    for _ in range(8):
        if getattr(obj, MARKER_ATTR, None) == patch_id:
            return True
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            return False
    return False


def mark(obj, patch_id: str):
    setattr(obj, MARKER_ATTR, patch_id)
    return obj
