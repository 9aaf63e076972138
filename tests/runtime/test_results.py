"""What applying a patch leaves in a process (runtime/results.py): the statuses, a Result's status checked, and the
mark, found on a function or on what it wraps (two patches may wrap one method)."""
from __future__ import annotations

import pytest

from sglang_pcie.runtime import results
from sglang_pcie.runtime.results import Result, is_patched, mark


def test_a_result_takes_only_the_known_statuses_and_the_failing_ones_are_drifted_and_error():
    assert Result(results.APPLIED).detail == ""
    with pytest.raises(ValueError, match="unknown patch status 'fine'"):
        Result("fine")
    assert results.FAILING_STATUSES == (results.DRIFTED, results.ERROR)
    assert results.StrictModeError.sglang_pcie_fatal is True


def wrapping(function):
    """A wrapper as functools.wraps leaves it (``__wrapped__``), without the wrapped function's attributes."""
    def wrapper():
        return function()
    wrapper.__wrapped__ = function
    return wrapper


def test_the_mark_is_found_through_the_wrappers_around_it_and_never_for_another_patch():
    def original():
        return 1
    marked = mark(original, "inner")
    assert marked is original and getattr(original, results.MARKER_ATTR) == "inner"
    outer = original
    for depth in range(7):  # the mark seven wrappers down is found
        outer = wrapping(outer)
        assert is_patched(outer, "inner") and not is_patched(outer, "other"), depth
    assert not is_patched(wrapping(outer), "inner")  # eight down: a chain too long to follow
    assert not is_patched(None, "inner") and not is_patched(lambda: 1, "inner")
