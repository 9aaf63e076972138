"""draft-token-watch: one warning per server when some of an EAGLE chain drafter's first drafts are never accepted.

The watch itself lives in ``sglang_pcie.patches.draft_token_watch.payload``; this module says where it hooks in each
release, wraps the hooks at import (runtime) or writes the lines that do the same (versioned diffs), and checks both.

The hooks:
- SGLang's ``LogitsProcessor.forward(self, input_ids, hidden_states, lm_head, logits_metadata)``, where the target's
  verify forward (``forward_mode.is_target_verify()``, a ForwardBatch with ``input_ids``, ``seq_lens`` and the
  ``EagleVerifyInput`` as ``spec_info``, its ``topk``) yields ``next_token_logits``: the count, captured with that
  forward in SGLang's CUDA graphs;
- the EAGLE worker's ``verify(self, batch)``, the watch's turn: v2 (``EAGLEWorkerV2`` in ``eagle_worker_v2.py``,
  every covered release; SGLang's default from 0.5.11) and v1 (``EAGLEWorker`` in ``eagle_worker.py``, up to
  0.5.12.post1; the default up to 0.5.10.post1); eagle3-profile decorates the same methods; this diff binds its
  wrapper after the class instead (a line appended to the module), so the two diffs never touch the same lines and
  the watch sits outside the profiler's timer, as at runtime;
- the worker's set-up step after which the map is checked at load (``LOAD_STEPS``).
"""
from __future__ import annotations

import ast

from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DIFF_MARKER, DRIFTED, NOT_APPLICABLE, Patch, Result
from sglang_pcie.patching import register
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patching.source_text import attribute_and_keyword_names, in_release_span
from sglang_pcie.patches.draft_token_watch import payload as draft_watch

V1 = "sglang.srt.speculative.eagle_worker"
V2 = "sglang.srt.speculative.eagle_worker_v2"
INFO = "sglang.srt.speculative.eagle_info"  # EagleVerifyInput, the verify forward's spec_info
LOGITS = "sglang.srt.layers.logits_processor"
FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info"
METHOD = "verify"
PARAMETERS = ("self", "batch")
TARGETS = {V1: ("v1", "EAGLEWorker"), V2: ("v2", "EAGLEWorkerV2")}
# the count's hook, and the names it reads: on the logits processor's output, and on the forward batch
LOGITS_HOOK = ("LogitsProcessor", "forward", ("self", "input_ids", "hidden_states", "lm_head", "logits_metadata"))
COUNT_NAMES = {LOGITS: ("next_token_logits",), FORWARD_BATCH: ("is_target_verify", "input_ids", "seq_lens",
                                                                 "spec_info")}
# module -> (class, method): the worker's set-up step that follows the vocabulary map and the heads, which the map
# check at load follows (v2) or precedes (v1), and the names the check reads on the worker there
LOAD_STEPS = {V2: ("EagleDraftWorker", "init_lm_head"), V1: ("EAGLEWorker", "init_cuda_graphs")}
LOAD_NAMES = ("hot_token_id", "target_worker")
# The covered releases that have each worker module (first, last; None: still there in the newest).
MODULE_RELEASES = {V1: (register.COVERED_RELEASES[0], "0.5.12.post1"), V2: (register.COVERED_RELEASES[0], None)}
PATCH_ID = draft_watch.PATCH_ID
COMMENT = f"# {DIFF_MARKER} {PATCH_ID}"


class DraftTokenWatch(Patch):
    id = PATCH_ID

    # -- static

    def _inspect(self, tree: SourceTree):
        present, problems = {}, []
        for module, (kind, cls_name) in TARGETS.items():
            if tree.source(module) is None:
                if _expected(module, tree.version):
                    problems.append(f"{module} is missing (every covered release {_span(module)} has it: moved or "
                                    "renamed?)")
                continue
            present[module] = kind
            problems.extend(f"{module}: {p}" for p in _method_problems(tree, module, cls_name, METHOD, PARAMETERS)[1])
            problems.extend(f"{module}: {p}" for p in _load_step_problems(tree, module))
        if present:
            problems.extend(_count_problems(tree))
        return present, problems

    def check_source(self, tree: SourceTree) -> Result:
        baked_in = [m for m in (*TARGETS, LOGITS) if tree.source(m) is not None]
        # first: the appended binding rebinds the class's attribute, which the class lookup does not follow
        if any(m in TARGETS for m in baked_in) and all(COMMENT in tree.source(m) for m in baked_in):
            return Result(APPLIED, "source carries the sglang-pcie diff")
        present, problems = self._inspect(tree)
        if problems:
            return Result(DRIFTED, "; ".join(problems))
        if not present:
            return Result(NOT_APPLICABLE, "no EAGLE worker module (srt/speculative/eagle_worker*.py)")
        return Result(APPLICABLE, "counts every verify in LogitsProcessor.forward; watches " +
                      "; ".join(_describe(m) for m in present))


PATCH = DraftTokenWatch()


def _describe(module_name: str) -> str:
    kind, cls_name = TARGETS[module_name]
    load_cls, load_method = LOAD_STEPS[module_name]
    return (f"{kind} {cls_name}.{METHOD} (its turn) and the map at load "
            f"({'after' if module_name == V2 else 'before'} {load_cls}.{load_method})")


def _count_problems(tree: SourceTree) -> list[str]:
    """Where the count hooks (the logits processor's forward) and the names it reads there."""
    cls_name, method, leading = LOGITS_HOOK
    if tree.source(LOGITS) is None:
        return [f"{LOGITS} is missing (the count hooks its {cls_name}.{method})"]
    problems = [f"{LOGITS}: {p} (the count hooks it)" for p in _method_problems(tree, LOGITS, cls_name, method,
                                                                                leading)[1]]
    for module, names in COUNT_NAMES.items():
        missing = [name for name in names if name not in _names(tree, module)]
        if missing:
            problems.append(f"{module} no longer names {', '.join(missing)} (what the count reads)")
    verify_input = tree.find_class(INFO, draft_watch.VERIFY_INPUT) if tree.source(INFO) is not None else None
    if verify_input is None:
        problems.append(f"{INFO}: class {draft_watch.VERIFY_INPUT} missing (the verify input the count knows)")
    elif "topk" not in _names(tree, INFO):
        problems.append(f"{INFO}: {draft_watch.VERIFY_INPUT} no longer has topk (chains only are counted)")
    return problems


def _span(module: str) -> str:
    first, last = MODULE_RELEASES[module]
    return f"{first} to {last}" if last else f"from {first} on"


def _expected(module: str, version: str) -> bool:
    return in_release_span(version, *MODULE_RELEASES[module])


def _names(tree: SourceTree, module: str) -> set[str]:
    """Attribute, keyword and annotated names in ``module`` (empty where it is missing)."""
    return attribute_and_keyword_names(tree.tree(module) if tree.source(module) is not None else None)


def _load_step_problems(tree: SourceTree, module: str) -> list[str]:
    """Where the map check at load hooks in ``module``, and the names it reads on the worker there."""
    cls_name, method = LOAD_STEPS[module]
    found, problems = _method_problems(tree, module, cls_name, method, ("self",))
    if problems:
        return [f"{p} (the map check at load follows it)" for p in problems]
    defining = found[0]  # the class may live in another module and be imported back (the hook wraps it there)
    missing = [name for name in LOAD_NAMES if name not in _names(tree, defining)]
    return [f"{defining} no longer names {', '.join(missing)} (what the map check at load reads)"] if missing else []


def _method_problems(tree: SourceTree, module: str, cls_name: str, method: str, leading: tuple[str, ...]):
    """(where ``cls_name.method`` is defined, what is wrong with its shape): the class and a concrete, plain method
    whose first parameters are ``leading``. Where nothing further can be read of it (missing, a coroutine function),
    the first is None."""
    if tree.find_class(module, cls_name) is None:
        return None, [f"class {cls_name} missing"]
    found = tree.method(module, cls_name, method, concrete=True)
    if found is None:
        return None, [f"{cls_name}.{method} missing"]
    function = found[2]
    if isinstance(function, ast.AsyncFunctionDef):
        return None, [f"{cls_name}.{method} is a coroutine function now"]
    parameters = tuple(a.arg for a in function.args.posonlyargs + function.args.args)[:len(leading)]
    if parameters != leading:
        return found, [f"{cls_name}.{method} takes ({', '.join(parameters)}), not ({', '.join(leading)})"]
    return found, []
