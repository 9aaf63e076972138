"""The one wrapping primitive: idempotent, marked, undoable; own and inherited methods, module functions."""
from __future__ import annotations

import functools
import types

from sglang_pcie.runtime.wrapping import member, unwrap_member, wrap_member
from sglang_pcie.runtime.results import is_patched


def logging_wrapper(calls):
    def wrapper(function):
        @functools.wraps(function)
        def wrapped(*args, **kwargs):
            calls.append(function.__name__)
            return function(*args, **kwargs)
        return wrapped
    return wrapper


class Base:
    def hook(self, x):
        return x + 1


class Own(Base):
    def hook(self, x):
        return x + 2


class Inherits(Base):
    pass


def test_an_own_method_is_wrapped_once_and_put_back():
    calls, before = [], Own.__dict__["hook"]
    assert wrap_member(Own, "hook", logging_wrapper(calls), "p")
    assert not wrap_member(Own, "hook", logging_wrapper(calls), "p")  # a second hook run changes nothing
    assert Own().hook(1) == 3 and calls == ["hook"]
    assert is_patched(Own.__dict__["hook"], "p")
    assert unwrap_member(Own, "hook", "p") and Own.__dict__["hook"] is before
    assert not unwrap_member(Own, "hook", "p")


def test_an_inherited_method_is_wrapped_on_the_class_and_the_override_removed_on_undo():
    calls = []
    assert wrap_member(Inherits, "hook", logging_wrapper(calls), "p")
    assert "hook" in Inherits.__dict__ and Base.__dict__["hook"] is member(Base, "hook")
    assert Inherits().hook(1) == 2 and Base().hook(1) == 2 and calls == ["hook"]  # Base itself untouched
    assert unwrap_member(Inherits, "hook", "p") and "hook" not in Inherits.__dict__


def test_a_module_function_and_another_patchs_wrapper():
    module = types.ModuleType("m")
    exec("def init(n):\n    return n * 2\n", module.__dict__)
    before = module.init
    assert wrap_member(module, "init", logging_wrapper([]), "p")
    assert not unwrap_member(module, "init", "q")  # another patch's undo leaves it alone
    assert wrap_member(module, "init", logging_wrapper([]), "q")  # a second patch wraps the first's wrapper
    assert unwrap_member(module, "init", "q") and unwrap_member(module, "init", "p") and module.init is before
