"""eagle3-profile's runtime install: which worker methods are which phase, wrapped with the profiler's timers when
a worker module is imported (the patch's row names ``install``). Runs in SGLang: imports ``runtime/`` and this
folder only; the static check and the diff (``check.py``) read the same ``TARGETS``.
"""
from __future__ import annotations

import inspect
from types import ModuleType

from sglang_pcie.runtime import hooks, patch_table, wrapping
from sglang_pcie.runtime.results import APPLIED, NOT_APPLICABLE, Drift, Result
from sglang_pcie.patches.eagle3_profile import payload as eagle_profiler

V1 = "sglang.srt.speculative.eagle_worker"
V2 = "sglang.srt.speculative.eagle_worker_v2"
# Runtime only: SpeculativeAlgorithm.create_worker is wrapped so that an EAGLE-family worker whose cycle is not timed
# (multi-layer EAGLE, frozen-KV MTP) warns once, naming its class, at its first cycle.
SPEC_INFO = "sglang.srt.speculative.spec_info"
# module -> class -> method -> phase.  The same methods in every release 0.5.8-0.5.23 (v1 up to 0.5.12.post1).
TARGETS = {
    V1: {"EAGLEWorker": {"forward_batch_generation": "cycle", "draft": "draft", "verify": "verify",
                         "forward_draft_extend_after_decode": "draft_extend"}},
    V2: {"EAGLEWorkerV2": {"forward_batch_generation": "cycle", "verify": "verify"},
         "EagleDraftWorker": {"draft": "draft", "_draft_extend_for_decode": "draft_extend"}},
}


def methods(module_name):
    """(class, method, phase) of every method timed in ``module_name``."""
    for cls_name, phases in TARGETS[module_name].items():
        for method, phase in phases.items():
            yield cls_name, method, phase


def install(module: ModuleType, settings) -> Result:
    """Time every method of ``TARGETS`` in the worker module just imported (all or nothing: every shape checked
    first), or flag untimed EAGLE-family workers where it is ``SPEC_INFO``."""
    if module.__name__ == SPEC_INFO:
        return flag_untimed_workers(module)
    if module.__name__ not in TARGETS:
        return Result(NOT_APPLICABLE, f"{module.__name__} is not an EAGLE worker module")
    found = []
    for cls_name, method, phase in methods(module.__name__):  # check everything before changing anything
        cls = getattr(module, cls_name, None)
        if not inspect.isclass(cls):
            raise Drift(f"{module.__name__}.{cls_name} is missing")
        # Defined on the class or inherited (as the static check accepts): wrapped on the class itself.
        function = wrapping.member(cls, method)
        if not inspect.isfunction(function):
            raise Drift(f"{cls_name}.{method} is missing or not a plain function")
        found.append((cls, method, phase))
    row = patch_table.row(eagle_profiler.PATCH_ID)
    for cls, method, phase in found:  # the payload as a baked diff's guard calls it: (original, phase, settings)
        wrapping.wrap_member(cls, method, hooks.wrapper(row, (phase,), settings), eagle_profiler.PATCH_ID)
    return Result(APPLIED, describe(module.__name__))


def flag_untimed_workers(module: ModuleType) -> Result:
    """Wrap SpeculativeAlgorithm.create_worker (see SPEC_INFO); nothing else changes in the module."""
    algorithm = getattr(module, "SpeculativeAlgorithm", None)
    create = getattr(algorithm, "__dict__", {}).get("create_worker")
    if not inspect.isfunction(create):
        return Result(NOT_APPLICABLE, "no SpeculativeAlgorithm.create_worker: EAGLE workers that are not timed are"
                                      " not flagged")
    wrapping.wrap_member(algorithm, "create_worker", eagle_profiler.flag_untimed_workers, eagle_profiler.PATCH_ID)
    return Result(APPLIED, "EAGLE-family workers that are not timed warn once at their first cycle")


def describe(module_name, tree=None) -> str:
    """What is timed in ``module_name``; with a ``SourceTree`` (the static check), where a method is inherited."""
    kind = "v2" if module_name == V2 else "v1"
    parts = []
    for cls_name, method, phase in methods(module_name):
        found = tree.method(module_name, cls_name, method) if tree is not None else None
        inherited = f", inherited from {found[1]}" if found and found[1] != cls_name else ""
        parts.append(f"{cls_name}.{method} ({phase}{inherited})")
    return f"{kind} " + ", ".join(parts)
