"""accept-length-alarm: one loud warning per server when an EAGLE drafter's drafts are almost never accepted.

The watch itself lives in ``sglang_pcie.runtime.accept_alarm``; this module says where it hooks in each release,
wraps the hook at import (runtime) or writes the decorator line that does the same (versioned diffs), and checks
both.

The hook, the same in every release 0.5.8-0.5.23: ``TokenizerManager._calculate_spec_decoding_metrics(self,
meta_info, recv_obj, i)`` in ``srt/managers/tokenizer_manager.py``, which SGLang calls inside its
``if state.finished:`` branch of a speculative run: once per finished request, in the one process that serves the
API.  It reads ``recv_obj.spec_verify_ct`` and the accepted drafts (``spec_accepted_tokens`` up to 0.5.10.post1,
``spec_accepted_drafts`` in 0.5.11, ``spec_num_correct_drafts`` from 0.5.12), the same per-request counters the
scheduler sums into its ``accept len:`` line.  The scheduler's decode-line method itself is no hook for this: from
0.5.10 (``report_decode_stats``) it runs on every decode step and only its body checks the log interval.
"""
from __future__ import annotations

import ast
import inspect
import re
from types import ModuleType
from typing import Mapping

from sglang_pcie.patching.engine import (APPLICABLE, APPLIED, DIFF_MARKER, DISABLED, DRIFTED, Drift, Patch, Result,
                                         is_patched)
from sglang_pcie.patching import baked, register, wrapping
from sglang_pcie.patching.edits import SourceEdits
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.runtime import accept_alarm

MODULE = "sglang.srt.managers.tokenizer_manager"
CLASS = "TokenizerManager"
HOOK = accept_alarm.HOOK
PARAMETERS = ("self", "meta_info", "recv_obj", "i")  # as the wrapper takes them
COMMENT = f"# {DIFF_MARKER} {accept_alarm.PATCH_ID}"
DECORATION = baked.decorator(accept_alarm.PATCH_ID)


class AcceptLengthAlarm(Patch):
    id = accept_alarm.PATCH_ID

    # -- static

    def check_source(self, tree: SourceTree) -> Result:
        found, problems = _inspect(tree)
        if problems:
            return Result(DRIFTED, "; ".join(problems))
        if f"{DIFF_MARKER} {self.id}" in tree.source(MODULE):
            return Result(APPLIED, "source carries the sglang-pcie diff")
        owner_module, owner, _, field = found
        inherited = f", inherited from {owner}" if owner != CLASS else ""
        return Result(APPLICABLE, f"watches {CLASS}.{HOOK} (once per finished request{inherited}; reads "
                                  f"{accept_alarm.VERIFY_FIELD}, {field})")

    def rewrite(self, tree: SourceTree) -> dict[str, str]:
        if self.check_source(tree).status != APPLICABLE:
            return {}
        (owner_module, owner, function, _), _ = _inspect(tree)
        return {MODULE: _add_decorator(tree, function if owner_module == MODULE and owner == CLASS else None)}

    # -- runtime

    def install(self, module: ModuleType, settings) -> Result:
        cls = getattr(module, CLASS, None)
        if not inspect.isclass(cls):
            raise Drift(f"{MODULE}.{CLASS} is missing")
        function = wrapping.member(cls, HOOK)
        if not inspect.isfunction(function):
            raise Drift(f"{CLASS}.{HOOK} is missing or not a plain function")
        if not is_patched(function, self.id):
            parameters = tuple(inspect.signature(function).parameters)[:len(PARAMETERS)]
            if parameters != PARAMETERS:
                raise Drift(f"{CLASS}.{HOOK} takes ({', '.join(parameters)}), not ({', '.join(PARAMETERS)})")
            wrapping.wrap_member(cls, HOOK, self.wrapper(settings), self.id)  # on the class, as the diff decorates it
        return Result(APPLIED, f"watching {CLASS}.{HOOK}")

    def check_runtime(self, modules: Mapping[str, ModuleType], settings) -> Result:
        reason = self.disabled_reason(settings)
        if reason:
            return Result(DISABLED, reason)
        module = modules.get(MODULE)
        if module is None:
            return Result(DRIFTED, f"{MODULE} is missing")
        if not is_patched(getattr(getattr(module, CLASS, None), HOOK, None), self.id):
            return Result(DRIFTED, f"{CLASS}.{HOOK} is not watched in this process")
        return Result(APPLIED, f"watching {CLASS}.{HOOK} (one warning per server when EAGLE drafts are almost never "
                               "accepted)")


PATCH = AcceptLengthAlarm()


# -- the static check

def _inspect(tree: SourceTree):
    """((defining module, defining class, the hook's ast, the accepted-drafts field it reads), problems)."""
    if tree.source(MODULE) is None:
        return None, [_missing_module(tree)]
    if tree.find_class(MODULE, CLASS) is None:
        return None, [f"class {CLASS} missing from {MODULE}"]
    found = tree.method(MODULE, CLASS, HOOK, concrete=True)
    if found is None:
        return None, [f"{CLASS}.{HOOK} missing (SGLang's per-request speculative metrics moved?)"
                      + _now_defined_in(tree)]
    owner_module, owner, function = found
    if isinstance(function, ast.AsyncFunctionDef):
        return None, [f"{CLASS}.{HOOK} is a coroutine function now"]
    problems = []
    parameters = tuple(a.arg for a in function.args.posonlyargs + function.args.args)[:len(PARAMETERS)]
    if parameters != PARAMETERS:
        problems.append(f"{CLASS}.{HOOK} takes ({', '.join(parameters)}), not ({', '.join(PARAMETERS)})")
    read = {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "recv_obj"}
    if accept_alarm.VERIFY_FIELD not in read:
        problems.append(f"{HOOK} no longer reads recv_obj.{accept_alarm.VERIFY_FIELD}")
    field = next((f for f in accept_alarm.ACCEPTED_FIELDS if f in read), None)
    if field is None:
        problems.append(f"{HOOK} reads none of recv_obj.{', '.join(accept_alarm.ACCEPTED_FIELDS)} (the accepted-draft "
                        "counter was renamed?)")
    problems.extend(_call_site_problems(tree))
    return (owner_module, owner, function, field), problems


def _call_site_problems(tree: SourceTree) -> list[str]:
    """The hook must be called only for finished requests: a call outside SGLang's ``if ...finished:`` branch
    (a streamed chunk) would count a request's verifies again at each chunk."""
    module_tree = tree.tree(MODULE)
    parents = {child: node for node in ast.walk(module_tree) for child in ast.iter_child_nodes(node)}
    # ``self.<hook>(...)``, or through the class: ``TokenizerManager.<hook>(self, ...)`` is the same call.
    calls = [node for node in ast.walk(module_tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == HOOK
             and isinstance(node.func.value, ast.Name) and node.func.value.id in ("self", CLASS)]
    if not calls:
        return [f"{HOOK} is no longer called in {MODULE} (the per-request figures are computed elsewhere)"
                + _called_in(tree)]
    return [f"{HOOK} is called outside the finished-request branch (line {call.lineno}): it would count a request "
            "more than once" for call in calls if not _under_finished_branch(call, parents)]


def _under_finished_branch(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.If) and node in parent.body:
            test = ast.unparse(parent.test)
            if "finished" in test and not test.startswith("not "):
                return True
        node = parent
    return False


def _srt_files(tree: SourceTree, pattern: str) -> list[tuple[str, str]]:
    """(path relative to the tree, text) of each srt/ file whose text matches ``pattern``."""
    srt = tree.root / "sglang" / "srt"
    found = []
    for path in sorted(srt.rglob("*.py")) if srt.is_dir() else ():
        text = path.read_text(encoding="utf-8", errors="replace")
        if re.search(pattern, text, re.M):
            found.append((path.relative_to(tree.root).as_posix(), text))
    return found


def _now_defined_in(tree: SourceTree) -> str:
    """Where the hook is defined now (file and class), for a detail that says where it went; "" if nowhere."""
    places = []
    for rel, text in _srt_files(tree, rf"^\s*(async\s+)?def {HOOK}\("):
        try:
            module = ast.parse(text)
        except SyntaxError:
            places.append(rel)
            continue
        owners = [node.name for node in ast.walk(module) if isinstance(node, ast.ClassDef)
                  and any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == HOOK
                          for item in node.body)]
        places.extend(f"{rel} ({owner})" for owner in owners or ["module level"])
    return f"; {HOOK} is now defined in {', '.join(places)}" if places else ""


def _called_in(tree: SourceTree) -> str:
    """The other srt/ files that call the hook, for a detail that says where the computation went."""
    module_path = MODULE.replace(".", "/") + ".py"
    files = [rel for rel, _ in _srt_files(tree, rf"\.{HOOK}\(") if not rel.endswith(module_path)]
    return f"; it is called in {', '.join(files)}" if files else ""


def _missing_module(tree: SourceTree) -> str:
    srt = tree.root / "sglang" / "srt"
    moved = sorted(p.relative_to(tree.root).as_posix() for p in srt.rglob("*.py")
                   if re.search(rf"^class {CLASS}\b", p.read_text(encoding="utf-8", errors="replace"), re.M)
                   ) if srt.is_dir() else []
    where = f"; {CLASS} is now defined in {', '.join(moved)}" if moved else ""
    return (f"{MODULE} is missing (every covered release {register.covered_span()} has it: moved or renamed?)"
            f"{where}")


# -- the versioned diff

def _add_decorator(tree: SourceTree, own: ast.FunctionDef | None) -> str:
    """The module's source with the guard before the class and the decorator above the hook (or, where the class
    inherits it, a decorated override at the end of the class that calls the inherited method)."""
    cls = tree.find_class(MODULE, CLASS)[1]
    edits = SourceEdits(tree.source(MODULE))
    edits.insert_lines(min([cls.lineno] + [d.lineno for d in cls.decorator_list]),
                       baked.guard_block(accept_alarm.PATCH_ID) + "\n\n", indent="")
    if own is not None:
        edits.insert_lines(min([own.lineno] + [d.lineno for d in own.decorator_list]), DECORATION)
    else:
        edits.insert_lines(cls.end_lineno + 1, (
            f"\n{DECORATION}"
            f"def {HOOK}(self, meta_info, recv_obj, i, *args, **kwargs):  {COMMENT}: the inherited method\n"
            f"    return super().{HOOK}(meta_info, recv_obj, i, *args, **kwargs)  {COMMENT}\n"),
            indent=" " * (cls.col_offset + 4))
    return edits.text()
