"""drafter-delegation's payload: ``ModelRunner.load_model`` followed, in an EAGLE run, by the forwarding of EAGLE's
methods from a wrapper target class to its language model.

Applied by the runtime patch (``patches/drafter_delegation/check.py``, which checks every name used here against the
release) and, in images with the diffs baked in, by the diff's guard (``runtime/baked.py``).  The warning goes to
the model runner's own ``logger``, as SGLang's messages about loading the model do.
"""
from __future__ import annotations

import ast
import functools
import inspect
import logging
import sys
import textwrap

from sglang_pcie.runtime.results import mark

PATCH_ID = "drafter-delegation"
# A language model offering both is EAGLE-3-capable (and EAGLE asks both of the target).
CAPABLE = ("set_eagle3_layers_to_capture", "get_embed_and_head")
# What EAGLE asks of a target model (read off the workers, model runners and graph runners of 0.5.8-0.5.23).
METHODS = CAPABLE + ("set_embed_and_head", "get_embed_and_head_for_draft")


def hook_problem(model_runner) -> str | None:
    """Why the hook (``runtime/patch_table.py``) would not work in ``model_runner``: what is said is logged to the
    module's own ``logger``."""
    if not isinstance(getattr(model_runner, "logger", None), logging.Logger):
        return f"{model_runner.__name__} has no module-level logger"
    return None


def wrap(load_model, settings=None):
    """``load_model`` (ModelRunner's), then the delegation where the loaded target class needs it (it reads no
    setting)."""
    runner_module = load_model.__module__  # whose ``logger`` says what was added (read when it is said)

    @functools.wraps(load_model)
    def load_model_then_delegate(self, *args, **kwargs):
        result = load_model(self, *args, **kwargs)
        cls = type(self.model)
        if self.is_draft_worker or not self.spec_algorithm.is_eagle() or all(hasattr(cls, m) for m in CAPABLE):
            return result
        held = _language_models(self.model, cls)
        for name, inner in held if len(held) == 1 else ():  # one language model: its hidden states reach the logits
            added, logged = [m for m in METHODS if not hasattr(cls, m) and hasattr(inner, m)], []
            logger = sys.modules[runner_module].logger
            for method in added:
                setattr(cls, method, _forwarding(cls, name, method, added, logged, logger))
        return result
    return mark(load_model_then_delegate, PATCH_ID)


def _language_models(model, cls) -> list:
    """(name, child) of each EAGLE-3-capable child that ``cls.forward`` calls or hands on whole."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):  # no source to read: SGLang's own error stands
        return []
    handed = {ast.unparse(node) for call in ast.walk(tree) if isinstance(call, ast.Call)
              for node in (call.func, *call.args, *(k.value for k in call.keywords))}
    return [(name, child) for name, child in model.named_children()
            if all(hasattr(child, m) for m in CAPABLE) and {f"self.{name}", f"self.{name}.forward"} & handed]


def _forwarding(cls, name: str, method: str, added: list, logged: list, logger):
    """``cls.<method>`` forwarding to ``self.<name>.<method>``; the first call of any of ``added`` logs once."""
    def forwarded(self, *args, **kwargs):
        if not logged:
            logged.append(method)
            logger.warning(f"sglang-pcie {PATCH_ID}: %s lacks %s; forwarding to its %s (%s)", cls.__name__, ", ".join(added), name, type(getattr(self, name)).__name__)
        return getattr(getattr(self, name), method)(*args, **kwargs)
    forwarded.__qualname__ = f"{cls.__qualname__}.{method}"
    return mark(forwarded, PATCH_ID)
