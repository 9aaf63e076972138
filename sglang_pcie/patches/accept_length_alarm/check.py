"""accept-length-alarm: one loud warning per server when an EAGLE drafter's drafts are almost never accepted.

The watch itself lives in ``sglang_pcie.patches.accept_length_alarm.payload``; this module says where it hooks in each
release,
wraps the hook at import (runtime) or writes the decorator line that does the same (versioned diffs), and checks
both.

The hook, the same in every release 0.5.8-0.5.23: ``TokenizerManager._calculate_spec_decoding_metrics(self,
meta_info, recv_obj, i)`` in ``srt/managers/tokenizer_manager.py``, which SGLang calls inside its
``if state.finished:`` branch of a speculative run: once per finished request, in the one process that serves the
API.  It reads ``recv_obj.spec_verify_ct`` and the accepted drafts (``spec_accepted_tokens`` up to 0.5.10.post1,
``spec_accepted_drafts`` in 0.5.11, ``spec_num_correct_drafts`` from 0.5.12), the same per-request counters the
scheduler sums into its ``accept len:`` line.  The scheduler's decode-line method itself is no hook for this: from
0.5.10 (``report_decode_stats``) it runs on every decode step and only its body checks the log interval.

Where SGLang moves the hook to a component class (as it split its scheduler and model runner into component
classes in 0.5.23; the tokenizer manager's split is being prepared), the hook is followed: a class that
``tokenizer_manager`` binds at its top level (imports, or defines) other than TokenizerManager, on which attribute
lookup finds the hook, is watched instead, statically (the check, the diff) and at runtime (the module's namespace
holds the same classes), provided it is the only one. A call through an attribute of the manager
(``self.<component>.<hook>(...)``) or through the class counts as a call. Where the hook went elsewhere, the detail
says where (``moved to <module>.<Class>.<hook>``).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DIFF_MARKER, DRIFTED, Patch, Result
from sglang_pcie.patching import baked, register
from sglang_pcie.patching.edits import SourceEdits
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patches.accept_length_alarm import payload as accept_alarm

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
        if any(f"{DIFF_MARKER} {self.id}" in (tree.source(m) or "") for m in {MODULE, found.module}):
            return Result(APPLIED, "source carries the sglang-pcie diff")
        inherited = f", inherited from {found.owner}" if found.owner != found.cls else ""
        moved = f"moved from {CLASS} to a component class; " if found.moved else ""
        return Result(APPLICABLE, f"watches {found.label}.{HOOK} ({moved}once per finished request{inherited}; reads "
                                  f"{accept_alarm.VERIFY_FIELD}, {found.field})")

    def rewrite(self, tree: SourceTree) -> dict[str, str]:
        if self.check_source(tree).status != APPLICABLE:
            return {}
        found, _ = _inspect(tree)
        own = (found.owner_module, found.owner) == (found.module, found.cls)
        return {found.module: _add_decorator(tree, found.module, found.cls, found.function if own else None)}


PATCH = AcceptLengthAlarm()


# -- the static check

@dataclass
class _Found:
    module: str  # the module of the class wrapped (tokenizer_manager, or a component's)
    cls: str  # TokenizerManager, or the component class the hook moved to
    owner_module: str  # where attribute lookup finds the hook (the class itself, or a base)
    owner: str
    function: ast.FunctionDef
    field: str | None = None  # the accepted-drafts counter it reads

    @property
    def moved(self) -> bool:
        return (self.module, self.cls) != (MODULE, CLASS)

    @property
    def label(self) -> str:
        return f"{self.module}.{self.cls}" if self.moved else CLASS


def _inspect(tree: SourceTree):
    """(_Found, problems)."""
    if tree.source(MODULE) is None:
        return None, [_missing_module(tree)]
    if tree.find_class(MODULE, CLASS) is None:
        return None, [f"class {CLASS} missing from {MODULE}"]
    where = (MODULE, CLASS)
    found = tree.method(MODULE, CLASS, HOOK, concrete=True)
    if found is None:
        components = _components(tree)
        found = tree.method(*components[0], HOOK, concrete=True) if len(components) == 1 else None
        if found is None:
            return None, [_missing_hook(tree, components)]
        where = components[0]
    owner_module, owner, function = found
    if isinstance(function, ast.AsyncFunctionDef):
        return None, [f"{where[1]}.{HOOK} is a coroutine function now"]
    result = _Found(*where, owner_module, owner, function)
    problems = []
    parameters = tuple(a.arg for a in function.args.posonlyargs + function.args.args)[:len(PARAMETERS)]
    if parameters != PARAMETERS:
        problems.append(f"{where[1]}.{HOOK} takes ({', '.join(parameters)}), not ({', '.join(PARAMETERS)})")
    read = {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "recv_obj"}
    if accept_alarm.VERIFY_FIELD not in read:
        problems.append(f"{HOOK} no longer reads recv_obj.{accept_alarm.VERIFY_FIELD}")
    result.field = next((f for f in accept_alarm.ACCEPTED_FIELDS if f in read), None)
    if result.field is None:
        problems.append(f"{HOOK} reads none of recv_obj.{', '.join(accept_alarm.ACCEPTED_FIELDS)} (the accepted-draft "
                        "counter was renamed?)")
    problems.extend(_call_site_problems(tree, result))
    return result, problems


def _components(tree: SourceTree) -> list[tuple[str, str]]:
    """(module, class) of each class ``MODULE`` binds at its top level (imported or its own), TokenizerManager
    aside, on which attribute lookup finds the hook: where a split of TokenizerManager into component classes moved
    it, as the runtime finds it (the module's namespace holds the same classes)."""
    found = []
    for name in tree.bindings(MODULE):
        key = tree.class_at(MODULE, name) if name != CLASS else None
        if key is not None and key not in found and tree.member_owner(*key, HOOK) is not None:
            found.append(key)
    return found


def _missing_hook(tree: SourceTree, components: list[tuple[str, str]]) -> str:
    if len(components) > 1:
        return (f"{CLASS}.{HOOK} missing; moved to more than one class {MODULE} uses: "
                + ", ".join(f"{module}.{cls}.{HOOK}" for module, cls in components)
                + " (which one runs per finished request is not known)")
    return f"{CLASS}.{HOOK} missing (SGLang's per-request speculative metrics moved?)" + _moved_to(tree)


def _call_site_problems(tree: SourceTree, found: _Found) -> list[str]:
    """The hook must be called only for finished requests: a call outside SGLang's ``if ...finished:`` branch
    (a streamed chunk) would count a request's verifies again at each chunk."""
    calls = []
    for module in dict.fromkeys([MODULE, found.module]):
        module_tree = tree.tree(module)
        parents = {child: node for node in ast.walk(module_tree) for child in ast.iter_child_nodes(node)}
        calls.extend((module, call, parents) for call in ast.walk(module_tree)
                     if isinstance(call, ast.Call) and _calls_the_hook(call.func, found))
    if not calls:
        where = MODULE if not found.moved else f"{MODULE} or {found.module}"
        return [f"{HOOK} is no longer called in {where} (the per-request figures are computed elsewhere)"
                + _called_in(tree)]
    return [f"{HOOK} is called outside the finished-request branch ({_at(module, call)}): it would count a request "
            "more than once" for module, call, parents in calls if not _under_finished_branch(call, parents)]


def _calls_the_hook(func: ast.expr, found: _Found) -> bool:
    """``self.<hook>(...)`` or ``TokenizerManager.<hook>(self, ...)``; where the hook moved to a component class,
    also through an attribute of the manager (``self.<component>.<hook>(...)``) or the component class."""
    if not isinstance(func, ast.Attribute) or func.attr != HOOK:
        return False
    receiver = func.value
    if isinstance(receiver, ast.Name):
        return receiver.id in ("self", CLASS, found.cls)
    while found.moved and isinstance(receiver, ast.Attribute):
        receiver = receiver.value
    return found.moved and isinstance(receiver, ast.Name) and receiver.id == "self"


def _at(module: str, call: ast.Call) -> str:
    return f"line {call.lineno}" if module == MODULE else f"{module} line {call.lineno}"


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


def _moved_to(tree: SourceTree) -> str:
    """Where the hook is defined now (``<module>.<Class>.<hook>``), for a detail that says where it went; "" if
    nowhere. A class there that ``MODULE`` does not bind is out of the runtime hook's reach: the detail says so."""
    places = []
    for rel, text in _srt_files(tree, rf"^\s*(async\s+)?def {HOOK}\("):
        module = rel[:-len(".py")].replace("/", ".").removesuffix(".__init__")
        try:
            parsed = ast.parse(text)
        except SyntaxError:
            places.append(f"{module} (does not parse)")
            continue
        owners = [node.name for node in ast.walk(parsed) if isinstance(node, ast.ClassDef)
                  and any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == HOOK
                          for item in node.body)]
        places.extend([f"{module}.{owner}.{HOOK}" for owner in owners] or [f"{module}.{HOOK} (module level)"])
    return (f"; moved to {', '.join(places)}, which {MODULE} does not import (the runtime hook cannot follow it "
            "there)") if places else ""


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

def _add_decorator(tree: SourceTree, module: str, cls_name: str, own: ast.FunctionDef | None) -> str:
    """The source of ``module`` with the guard before the class (TokenizerManager, or the component class the hook
    moved to) and the decorator above the hook (or, where the class inherits it, a decorated override at the end of
    the class that calls the inherited method)."""
    cls = tree.find_class(module, cls_name)[1]
    edits = SourceEdits(tree.source(module))
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
