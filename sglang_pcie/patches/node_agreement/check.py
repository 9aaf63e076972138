"""node-agreement: a server that spans nodes compares every node's NCCL and all-reduce-path settings once at start.

The hook is SGLang's ``parallel_state.init_distributed_environment`` (every release 0.5.8-0.5.23): when it returns,
torch's default process group and its store exist, SGLang's world group (with its gloo CPU group) is built, and no
NCCL collective has run: torch creates NCCL communicators lazily, the world group builds no PyNccl communicator,
and every caller (the model runner up to 0.5.15, ``distributed/bootstrap`` from 0.5.16, the encoder server, the
weight-cache daemon) calls ``initialize_model_parallel`` next, whose TP group runs the first NCCL collective (the
PyNccl warm-up all-reduce). The comparison itself is ``sglang_pcie.patches.node_agreement.payload``.

Runtime: a post-import hook replaces the module's function by ``agreement.wrap(...)`` (before
``sglang.srt.distributed`` star-imports it, so every caller gets the wrapper). Versioned diffs: the same wrapper
as a decorator, imported under a guard so that the patched file runs without sglang-pcie.
"""
from __future__ import annotations

import ast

from sglang_pcie.patching import baked
from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DIFF_MARKER, DRIFTED, Patch, Result
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patches.node_agreement import payload as agreement

PATCH_ID = agreement.PATCH_ID
PARALLEL_STATE = "sglang.srt.distributed.parallel_state"
PACKAGE = "sglang.srt.distributed"  # star-imports parallel_state: callers import the hook from here
HOOK = "init_distributed_environment"
NEXT = "initialize_model_parallel"  # what every caller runs next: the first NCCL collective is in there
WORLD_BUILDER = "init_world_group"
MARKER = f"{DIFF_MARKER} {PATCH_ID}"
DECORATOR = baked.guard_name(PATCH_ID)  # defined at module level by the diff
GUARD = baked.guard_block(PATCH_ID) + "\n\n"
DECORATION = baked.decorator(PATCH_ID)
# torch.distributed's collectives and the eager communicator switch: none may run before the comparison.
COLLECTIVES = frozenset({
    "all_reduce", "broadcast", "barrier", "monitored_barrier", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather",
    "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv",
})
HELPER_DEPTH = 2  # how deep the hook's own module-level helpers are followed
DETAIL = (f"{HOOK} wrapped: in a server spanning nodes, every node's NCCL settings are compared once, before NCCL's "
          "first collective")


def _dotted(node: ast.AST) -> str:
    return ast.unparse(node)


def reached_calls(tree: SourceTree, body: list, conditions: tuple = (), depth: int = 0,
                  seen: frozenset = frozenset()) -> list[tuple[ast.Call, tuple]]:
    """(call, the ``if`` tests it runs under) for every call in the statements ``body``, and in the module-level
    functions of parallel_state they call (HELPER_DEPTH deep): a collective behind a launch option is not one
    that every start runs."""
    found = []
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # defined here, not run here
        if isinstance(statement, ast.If):
            test = _dotted(statement.test)
            found += [(c, conditions) for c in ast.walk(statement.test) if isinstance(c, ast.Call)]
            found += reached_calls(tree, statement.body, conditions + (test,), depth, seen)
            found += reached_calls(tree, statement.orelse, conditions + (f"not ({test})",), depth, seen)
            continue
        nested = [getattr(statement, f, []) for f in ("body", "orelse", "finalbody")]
        nested += [h.body for h in getattr(statement, "handlers", [])]
        if any(nested):  # for / while / with / try: their headers here, their blocks as statements
            heads = [v for f, v in ast.iter_fields(statement) if f not in ("body", "orelse", "finalbody", "handlers")]
            calls = [c for h in heads for n in (h if isinstance(h, list) else [h]) if isinstance(n, ast.AST)
                     for c in ast.walk(n) if isinstance(c, ast.Call)]
            found += [(c, conditions) for c in calls]
            for block in nested:
                found += reached_calls(tree, block, conditions, depth, seen)
            continue
        for call in (n for n in ast.walk(statement) if isinstance(n, ast.Call)):
            found.append((call, conditions))
            name = call.func.id if isinstance(call.func, ast.Name) else None
            helper = tree.function(PARALLEL_STATE, name) if name and name not in seen and depth < HELPER_DEPTH \
                and name not in (WORLD_BUILDER, NEXT) else None
            if helper is not None:
                found += reached_calls(tree, helper.body, conditions, depth + 1, seen | {name})
    return found


def hook_problems(tree: SourceTree) -> list[str]:
    """What the hook relies on that this tree lacks: the function, the store it leaves behind, no collective and no
    PyNccl communicator before it returns, and initialize_model_parallel after it."""
    hook = tree.function(PARALLEL_STATE, HOOK)
    if not isinstance(hook, ast.FunctionDef):
        moved = [module for module in _distributed_modules(tree) if module != PARALLEL_STATE
                 and isinstance(tree.function(module, HOOK), ast.FunctionDef)]
        where = f" (now defined in {', '.join(moved)})" if moved else " (renamed or moved?)"
        return [f"parallel_state has no module-level {HOOK}{where}"]
    problems = []
    reached = reached_calls(tree, hook.body)
    calls = [call for call, _ in reached]
    inits = [c for c, conditions in reached if _dotted(c.func).endswith("init_process_group")]
    if not inits:
        problems.append(f"{HOOK} no longer calls torch.distributed.init_process_group (the store the nodes' "
                        "settings travel through)")
    if any(k.arg == "device_id" for c in inits for k in c.keywords):
        problems.append(f"{HOOK} passes device_id to init_process_group: NCCL's communicator is created eagerly, "
                        "before the comparison")
    collectives = sorted({f"{_dotted(c.func)} (line {c.lineno})" for c, conditions in reached
                          if not conditions and _is_collective(c)})
    if collectives:
        problems.append(f"{HOOK} runs a collective before returning: {', '.join(collectives)}")
    builder = tree.function(PARALLEL_STATE, WORLD_BUILDER)
    if builder is None or not any(_dotted(c.func) == WORLD_BUILDER for c in calls):
        problems.append(f"{HOOK} no longer builds the world group through {WORLD_BUILDER}")
    else:
        pynccl = [k for c in ast.walk(builder) if isinstance(c, ast.Call) for k in c.keywords if k.arg == "use_pynccl"]
        if not pynccl or not all(isinstance(k.value, ast.Constant) and k.value.value is False for k in pynccl):
            problems.append(f"{WORLD_BUILDER} no longer passes use_pynccl=False: a world PyNccl communicator would run"
                            " its warm-up all-reduce before the comparison")
    if not isinstance(tree.function(PARALLEL_STATE, NEXT), ast.FunctionDef):
        problems.append(f"parallel_state has no {NEXT} (where the first NCCL collective runs)")
    return problems


def _is_collective(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr in COLLECTIVES


def conditional_collectives(tree: SourceTree) -> list[str]:
    """The collectives the hook runs only under some launch options, each with its conditions (outermost first)."""
    hook = tree.function(PARALLEL_STATE, HOOK)
    found = []
    for call, conditions in reached_calls(tree, hook.body) if hook is not None else []:
        text = f"{_dotted(call.func)} where {' and '.join(conditions)}"
        if conditions and _is_collective(call) and text not in found:
            found.append(text)
    return found


def _distributed_modules(tree: SourceTree) -> list[str]:
    folder = tree.root / "sglang" / "srt" / "distributed"
    return [f"{PACKAGE}.{p.stem}" for p in sorted(folder.glob("*.py"))] if folder.is_dir() else []


class NodeAgreement(Patch):
    id = PATCH_ID

    # -- static

    def check_source(self, tree: SourceTree) -> Result:
        source = tree.source(PARALLEL_STATE)
        if source is None:
            return Result(DRIFTED, "sglang/srt/distributed/parallel_state.py is missing (every covered release has "
                                   "it: moved or renamed?)")
        if MARKER in source:
            hook = tree.function(PARALLEL_STATE, HOOK)
            decorated = hook is not None and [ast.unparse(d) for d in hook.decorator_list][:1] == [baked.decorator_call(PATCH_ID)]
            if decorated and source.count(GUARD + DECORATION) == 1:
                return Result(APPLIED, "source carries the sglang-pcie diff")
            return Result(DRIFTED, "parallel_state carries part of the sglang-pcie diff, or another version's "
                                   "(reverse it with the sglang-pcie that applied it)")
        problems = hook_problems(tree)
        if problems:
            return Result(DRIFTED, "; ".join(problems))
        conditional = conditional_collectives(tree)
        caveat = (f"; except that under some options it first runs {'; '.join(conditional)} (over the default "
                  "process group: NCCL where that is the backend)") if conditional else ""
        return Result(APPLICABLE, f"wraps parallel_state.{HOOK}: when it returns the world group exists and no NCCL "
                                  f"collective has run (the first is in {NEXT}, called next){caveat}")


PATCH = NodeAgreement()
