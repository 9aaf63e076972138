"""drafter-delegation: EAGLE-3 drafters work with wrapper target models (Kimi-K2.5 on 0.5.9, other wrappers).

EAGLE asks the *target* model to capture auxiliary hidden states (``set_eagle3_layers_to_capture``, from the model
runner) and to share its embedding and LM head (``get_embed_and_head``, from the EAGLE workers).  A wrapper such
as ``KimiK25ForConditionalGeneration`` holds the causal LM as ``language_model``; in SGLang 0.5.9 it forwards none
of it, so an EAGLE-3 drafter cannot run on Kimi-K2.5.  Upstream added the forwarding to that wrapper in 0.5.10;
other wrappers still lack it (0.5.23 refuses them explicitly: "does not implement set_eagle3_layers_to_capture").

The patch acts only where it is needed: ``ModelRunner.load_model`` is wrapped so that, once the *target* model of
an EAGLE run is loaded (not the draft model; no speculative decoding: nothing happens), a class that lacks those
methods but holds exactly one language model that has them, and whose ``forward`` runs that model whole (so the
captured hidden states reach the logits), gains methods forwarding to it.  The first call of one logs one line
naming the class and the inner model.  Anything else (no such language model, the forward runs only its backbone)
is left to SGLang's own error.

The wrapper is ``sglang_pcie.patches.drafter_delegation.payload.wrap``: installed at runtime, and applied by the
versioned
diffs' guard (the one every diff binds) applied to ``load_model`` after the class.  The static check reads the model runner for every
name the wrapper relies on, the EAGLE workers for the methods they call on the target, and ``srt/models`` for the
classes that would gain methods if served.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterable

from sglang_pcie.patching.engine import (APPLICABLE, APPLIED, DIFF_MARKER, DRIFTED, NOT_APPLICABLE, UPSTREAM, Patch,
                                         Result)
from sglang_pcie.patching import baked
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patches.drafter_delegation import payload

PATCH_ID = payload.PATCH_ID
MODELS = "sglang.srt.models"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
RUNNER_CLASS = "ModelRunner"
KIMI_MODULE = f"{MODELS}.kimi_k25"
KIMI_CLASS = "KimiK25ForConditionalGeneration"

# What EAGLE asks of a target model (read off the workers, model runners and graph runners of 0.5.8-0.5.23):
# set_eagle3_layers_to_capture (model runner and CUDA-graph runner, for the target only), get_embed_and_head (every
# EAGLE worker, through pp_draft_embedding from 0.5.21), set_embed_and_head (the setter of the pair; upstream's
# Kimi-K2.5 wrapper forwards it too), get_embed_and_head_for_draft (pp_draft_embedding probes it first, 0.5.22+).
DELEGATED_METHODS = payload.METHODS
# A language model offering both is EAGLE-3-capable; a backbone (``FooModel``) has no LM head to share.
CAPABLE = payload.CAPABLE
# nn.Module's own methods: every wrapper has them, so the workers may call them freely.
MODULE_API = frozenset({
    "apply", "buffers", "children", "cpu", "cuda", "eval", "forward", "load_state_dict", "modules", "named_buffers",
    "named_children", "named_modules", "named_parameters", "parameters", "state_dict", "to", "train",
})
MARKER = f"{DIFF_MARKER} {PATCH_ID}"

DECORATOR = baked.guard_name(PATCH_ID)  # defined at module level by the diff
GUARD = baked.guard_block(PATCH_ID) + "\n\n"
INSTALL_LINE = baked.rebinding(PATCH_ID, "ModelRunner.load_model")


@dataclass(frozen=True)
class Wrapper:
    """A model class holding an EAGLE-3-capable language model in ``attr`` and handing it to its forward."""

    module: str  # dotted module name
    name: str  # class name
    attr: str
    inner: tuple[str, ...]  # the capable classes ``attr`` is built from
    missing: tuple[str, ...]  # DELEGATED_METHODS the class lacks and an inner class offers: what it would gain

    @property
    def label(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.name}"


# -- the wrapper rule, on ASTs (static; the runtime applies the same rule to the live instance)

def _self_attr(node: ast.AST) -> str | None:
    """``x`` for the expression ``self.x``."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _statements(node: ast.AST):
    """Every statement under ``node``, through compound statements (cheaper than ast.walk: no expressions)."""
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()):
            yield child
            yield from _statements(child)


def inner_model_assignments(function: ast.AST) -> list[tuple[str, str]]:
    """(attribute, called name) for each ``self.<attribute> = <Name or module.Name>(...)`` in ``function``."""
    found = []
    for node in _statements(function):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, ast.Call) and (callee := _dotted(value.func)) and not callee.startswith("self."):
            found.extend((attr, callee) for target in targets if (attr := _self_attr(target)))
    return found


def hands_over(forward: ast.AST, attr: str) -> bool:
    """Whether ``forward`` calls ``self.<attr>`` (or its ``forward``) or passes it whole as an argument: the rule
    the runtime applies to the live class's forward too."""
    for node in ast.walk(forward):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if _self_attr(func) == attr:
            return True
        if isinstance(func, ast.Attribute) and func.attr == "forward" and _self_attr(func.value) == attr:
            return True
        if any(_self_attr(arg) == attr for arg in [*node.args, *(k.value for k in node.keywords)]):
            return True
    return False


def classify(module: str, name: str, assignments: Iterable[tuple[str, str]], forward: ast.AST | None,
             is_capable: Callable[[str], bool], inner_offers: Callable[[str, str], bool],
             lacks: Callable[[str], bool]) -> Wrapper | None:
    """The Wrapper a class is, or None.  Names are resolved by the caller."""
    by_attr: dict[str, list[str]] = {}
    for attr, callee in assignments:
        if is_capable(callee) and callee not in by_attr.get(attr, []):
            by_attr.setdefault(attr, []).append(callee)
    if forward is None:
        return None
    handed = [attr for attr in by_attr if hands_over(forward, attr)]
    if len(handed) != 1:  # none, or two language models: nothing sure to delegate to
        return None
    attr = handed[0]
    inner = tuple(by_attr[attr])
    missing = tuple(m for m in DELEGATED_METHODS if lacks(m) and any(inner_offers(c, m) for c in inner))
    return Wrapper(module, name, attr, inner, missing)


def summarize(wrappers: list[Wrapper]) -> str:
    return ", ".join(f"{w.label} (.{w.attr})" for w in wrappers)


# -- static: the model classes
#
# Parsing every file of srt/models takes more than a second, so SourceTree's text filters come first (the classes
# a module's text shows, which of them mention set_eagle3_layers_to_capture or assign ``self.x = Name(...)``) and
# only the classes that look like wrappers, and the classes their names resolve to, are parsed.  Names resolve as
# Python imports them, into any module of the tree (a mixin in sglang/srt/layers counts), never outside it.

_SELF_CALL_ASSIGN = re.compile(r"self\.\w+\s*(?::[^=\n]*)?=\s*([\w.]+)\s*\(")


def capable_names(tree: SourceTree, models: list[str]) -> set[str]:
    """Names of the model classes that may be EAGLE-3-capable (a filter: names only, bases matched by name)."""
    method = f"def {CAPABLE[0]}"
    names = {name for module in models if method in tree.source(module)
             for name, definition in tree.classes(module).items() if method in definition.text}
    bases = {name: definition.bases for module in models for name, definition in tree.classes(module).items()}
    while True:
        more = {name for name, listed in bases.items() if name not in names
                and any(b.rsplit(".", 1)[-1] in names for b in listed)}
        if not more:
            return names
        names |= more


def is_capable(tree: SourceTree, module: str, name: str) -> bool:
    """Whether the class a (dotted) name of ``module`` refers to has both CAPABLE methods, own or inherited."""
    found = tree.class_at(module, name)
    return bool(found) and all(tree.member_owner(*found, m) for m in CAPABLE)


def forward_of(tree: SourceTree, module: str, name: str) -> ast.AST | None:
    """The ``forward`` the class runs: its own, or the first found through its bases."""
    for key in tree.lineage(module, name):
        for item in tree.class_node(*key).body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "forward":
                return item
    return None


def wrapper_of(tree: SourceTree, module: str, name: str) -> Wrapper | None:
    """The class as the delegation rule sees it, or None when it holds no language model it could serve."""
    node = tree.class_node(module, name)
    assignments = [pair for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for pair in inner_model_assignments(item)]
    return classify(module, name, assignments, forward_of(tree, module, name),
                    is_capable=lambda callee: is_capable(tree, module, callee),
                    inner_offers=lambda callee, m: tree.member_owner(*tree.class_at(module, callee), m) is not None,
                    lacks=lambda m: tree.member_owner(module, name, m) is None)


def model_wrappers(tree: SourceTree) -> list[Wrapper]:
    """Every class of srt/models that holds an EAGLE-3-capable language model and hands it to its forward."""
    models = tree.modules(MODELS)
    found, candidates = [], capable_names(tree, models)
    for module in models:
        text = tree.source(module)
        callees = set(_SELF_CALL_ASSIGN.findall(text))
        if not candidates.intersection(c.rsplit(".", 1)[-1] for c in callees):
            # An alias (``import m as Y``, ``from m import X as Y``): the name it was imported under.
            heads = {c.split(".")[0] for c in callees if f" as {c.split('.')[0]}" in text}
            if not any(is_capable(tree, module, c) for c in callees if c.split(".")[0] in heads):
                continue
        for name, definition in tree.classes(module).items():
            # Only classes assigning self.x = <capable class>(...) in their text are parsed.
            callees = set(_SELF_CALL_ASSIGN.findall(definition.text))
            if any(is_capable(tree, module, callee) for callee in callees):
                found.extend(filter(None, [wrapper_of(tree, module, name)]))
    return found


# -- static: the EAGLE code path

def eagle_target_methods(tree: SourceTree) -> tuple[set[str], set[str]]:
    """(methods called, names probed with hasattr/getattr) on the target model along the EAGLE code path.

    Read from the speculative modules named ``*eagle*``, the speculative modules they import, and (for
    ``set_eagle3_layers_to_capture``, called on the target by the model and graph runners) ``model_executor``.
    """
    package = "sglang.srt.speculative"
    texts = {m: tree.source(m) for m in tree.modules(package) if "eagle" in m.rpartition(".")[2]}
    for text in list(texts.values()):
        for dependency in re.findall(r"from sglang\.srt\.speculative\.(\w+) import", text):
            module = f"{package}.{dependency}"
            if module not in texts and tree.source(module) is not None:
                texts[module] = tree.source(module)
    called, probed = set(), set()
    for module in texts:
        for function in tree.functions_mentioning(module, "target_worker", "target_model"):
            function_called, function_probed = _target_model_uses(function)
            called |= function_called
            probed |= function_probed
    if any(".set_eagle3_layers_to_capture(" in tree.source(m)
           for m in tree.modules("sglang.srt.model_executor", recursive=True)):
        called.add("set_eagle3_layers_to_capture")
    return called, probed


def _target_model_uses(function: ast.AST) -> tuple[set[str], set[str]]:
    """Methods called on, and names probed with hasattr/getattr on, the target model in one function."""
    models, runners = {"target_model", "self.target_model"}, set()

    def is_target(node):
        dotted = _dotted(node)
        if dotted is None:
            return False
        owner, _, last = dotted.rpartition(".")
        return (dotted in models or dotted.endswith("target_worker.model_runner.model")
                or (last == "model" and owner in runners))

    for node in _statements(function):  # local aliases: target_model = self.target_worker.model_runner.model
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and (name := _dotted(node.targets[0])):
            if is_target(node.value):
                models.add(name)
            elif (_dotted(node.value) or "").endswith("target_worker.model_runner"):
                runners.add(name)
    called, probed = set(), set()
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and is_target(node.func.value):
            called.add(node.func.attr)
        elif (isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2
              and is_target(node.args[0]) and isinstance(node.args[1], ast.Constant)):
            probed.add(node.args[1].value)
    return called, probed


def _worker_problem(called: set[str], probed: set[str]) -> str | None:
    """Why the EAGLE code path no longer fits the delegated methods, or None."""
    if not called & set(CAPABLE):
        return "the EAGLE workers call neither " + " nor ".join(CAPABLE) + " on the target model"
    unknown = sorted(called - set(DELEGATED_METHODS) - MODULE_API - probed)
    if unknown:
        return f"the EAGLE workers call {', '.join(unknown)} on the target model, which {PATCH_ID} does not forward"
    return None


# -- static: the model runner, and every name the wrapper (patches/drafter_delegation/payload.py) relies on

def _runner_class(tree: SourceTree) -> ast.ClassDef | None:
    module = tree.tree(MODEL_RUNNER)
    return next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == RUNNER_CLASS), None) \
        if module else None


def _self_assigned(cls: ast.ClassDef) -> set[str]:
    """Attributes some method of ``cls`` assigns (``self.x = ...``, ``self.x: T = ...``)."""
    found = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        found.update(attr for t in targets for n in ast.walk(t) if (attr := _self_attr(n)))
    return found


def hook_problems(tree: SourceTree) -> list[str]:
    """What the inserted wrapper would miss in this tree: each name it relies on, and the order it needs."""
    module = tree.tree(MODEL_RUNNER)
    if module is None:
        return ["no sglang/srt/model_executor/model_runner.py (every covered release has it)"]
    cls = _runner_class(tree)
    if cls is None:
        return [f"model_runner has no class {RUNNER_CLASS}"]
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    problems = []
    if not any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "logger" for t in n.targets)
               for n in module.body if n.lineno < cls.lineno):
        problems.append("model_runner defines no module-level logger before ModelRunner")
    load_model = methods.get("load_model")
    if load_model is None:
        problems.append("ModelRunner.load_model is missing")
    else:
        used = {n.attr for n in ast.walk(load_model) if isinstance(n, ast.Attribute)} | {
            n.id for n in ast.walk(load_model) if isinstance(n, ast.Name)}
        asked = sorted(used & {*DELEGATED_METHODS, "configure_aux_hidden_state_capture"})
        if asked:  # the wrapper runs after load_model: too late for a call inside it
            problems.append(f"ModelRunner.load_model itself uses {', '.join(asked)}")
    if not any(isinstance(n, ast.Call) and ast.unparse(n.func) == "self.load_model"
               for name, method in methods.items() if name != "load_model" for n in ast.walk(method)):
        problems.append("ModelRunner never calls self.load_model()")
    if "model" not in _self_assigned(cls):
        problems.append("ModelRunner never sets self.model")
    # The wrapper reads these right after loading: __init__ must set them before it loads (through initialize).
    init = methods.get("__init__")
    loads = [n.lineno for n in ast.walk(init) if isinstance(n, ast.Call)
             and ast.unparse(n.func) in ("self.initialize", "self.load_model")] if init else []
    for attr in ("is_draft_worker", "spec_algorithm"):
        lines = [n.lineno for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
                 and any(_self_attr(t) == attr for t in getattr(n, "targets", [getattr(n, "target", None)]))] \
            if init else []
        if not lines:
            problems.append(f"ModelRunner.__init__ never sets self.{attr}")
        elif loads and min(lines) > min(loads):
            problems.append(f"ModelRunner.__init__ sets self.{attr} only after loading the model")
    imported = next((tree.absolute(MODEL_RUNNER, node) for node in module.body if isinstance(node, ast.ImportFrom)
                     and any((a.asname or a.name) == "SpeculativeAlgorithm" for a in node.names)), None)
    algorithm = tree.find_class(imported, "SpeculativeAlgorithm") if imported else None
    if imported is None:
        problems.append("model_runner does not import SpeculativeAlgorithm")
    elif algorithm is None:
        problems.append(f"{imported} has no SpeculativeAlgorithm" if tree.path(imported) else f"no module {imported}")
    elif tree.method(imported, "SpeculativeAlgorithm", "is_eagle") is None:
        problems.append(f"{algorithm[0]}.SpeculativeAlgorithm.is_eagle is missing")
    return problems


class DrafterDelegation(Patch):
    id = PATCH_ID

    # -- static

    def check_source(self, tree: SourceTree) -> Result:
        return self._assess(tree)[0]

    def _assess(self, tree: SourceTree) -> tuple[Result, list[Wrapper]]:
        """check_source's result, with the classes that would gain methods."""
        runner = tree.source(MODEL_RUNNER)
        if runner is not None and MARKER in runner:
            complete = runner.count(GUARD) == 1 and runner.count(INSTALL_LINE) == 1
            return (Result(APPLIED, "source carries the sglang-pcie diff") if complete else
                    Result(DRIFTED, "model_runner carries part of the sglang-pcie diff, or another version's "
                                    "(reverse it with the sglang-pcie that applied it)")), []
        problems = hook_problems(tree)
        if not (tree.root / "sglang" / "srt" / "models").is_dir():
            problems.append("no sglang/srt/models folder")
        else:
            problems += filter(None, [_worker_problem(*eagle_target_methods(tree))])
        if problems:
            return Result(DRIFTED, "; ".join(problems)), []
        wrappers = model_wrappers(tree)
        kimi = next((w for w in wrappers if w.module == KIMI_MODULE and w.name == KIMI_CLASS), None)
        if kimi is None and KIMI_CLASS in tree.classes(KIMI_MODULE):
            lacking = [m for m in CAPABLE if tree.member_owner(KIMI_MODULE, KIMI_CLASS, m) is None]
            if lacking:  # the class this patch exists for would no longer be served
                return Result(DRIFTED, f"{KIMI_CLASS} no longer holds an EAGLE-3-capable language model that its "
                                       f"forward runs, and lacks {', '.join(lacking)} (srt/models/kimi_k25.py)"), []
        # As at runtime: a class acts only when it lacks one of CAPABLE (then it gains every method it lacks).
        qualifying = [w for w in wrappers if set(w.missing) & set(CAPABLE)]
        if qualifying:
            return Result(APPLICABLE, f"if served as the target of an EAGLE run, {len(qualifying)} class(es) gain "
                                      "forwarding methods (nothing happens otherwise): "
                          + summarize(qualifying)), qualifying
        if wrappers:
            return Result(UPSTREAM, "every wrapper already has the methods EAGLE calls on the target: "
                          + ", ".join(w.label for w in wrappers)), []
        return Result(NOT_APPLICABLE, "no model class holds an EAGLE-3-capable language model"), []


PATCH = DrafterDelegation()
