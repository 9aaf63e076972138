"""drafter-delegation: EAGLE-3 drafters work with wrapper target models (Kimi-K2.5 and the other wrappers).

EAGLE-3 asks the *target* model to capture auxiliary hidden states (``set_eagle3_layers_to_capture``, from the model
runner and the CUDA-graph runner) and to share its embedding and LM head (``get_embed_and_head``, from the EAGLE
workers).  A wrapper such as ``KimiK25ForConditionalGeneration`` holds the causal LM as ``language_model`` and, in
SGLang 0.5.9, forwards none of it, so an EAGLE-3 drafter cannot run on Kimi-K2.5.  Upstream added the forwarding to
that one wrapper in 0.5.10; many other wrappers still lack it.

A model class gets the delegation when

1. one of its methods assigns ``self.<attr> = <Cls>(...)`` where ``Cls`` is an EAGLE-3-capable language model
   (it offers ``set_eagle3_layers_to_capture`` and ``get_embed_and_head``, i.e. a causal LM, not a backbone);
2. its ``forward`` hands ``self.<attr>`` whole to a call (``language_model=self.language_model`` or
   ``self.language_model(...)``), so the captured hidden states reach the logits.  A wrapper that runs only the inner
   backbone and its own logits processor would crash if capture were switched on, and is left alone;
3. it lacks one or more of ``DELEGATED_METHODS`` that the inner class offers.

The one rule runs on live classes (each ``sglang.srt.models.*`` module, right after its import) and on source files
(verify-patches, the versioned diffs); the added methods are the same source text in both.
"""
from __future__ import annotations

import ast
import inspect
import linecache
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Callable, Iterable, Mapping

from sglang_pcie.base import (APPLICABLE, APPLIED, DIFF_MARKER, DRIFTED, ERROR, NOT_APPLICABLE, UPSTREAM, Drift,
                              Patch, Result, SourceTree, installed_sglang_root, is_patched, mark)

PATCH_ID = "drafter-delegation"
MODELS = "sglang.srt.models"
KIMI_MODULE = f"{MODELS}.kimi_k25"
KIMI_CLASS = "KimiK25ForConditionalGeneration"

# What EAGLE asks of a target model (read off the workers, model runners and graph runners of 0.5.8-0.5.23):
DELEGATED_METHODS = (
    "set_eagle3_layers_to_capture",  # model runner and CUDA-graph runner, for the target only
    "get_embed_and_head",  # every EAGLE worker (through pp_draft_embedding from 0.5.21)
    "set_embed_and_head",  # the setter of the pair; upstream's Kimi-K2.5 wrapper forwards it too
    "get_embed_and_head_for_draft",  # pp_draft_embedding probes it first (0.5.22 and later)
)
# A language model offering both is EAGLE-3-capable; a backbone (``FooModel``) has no LM head to share.
CAPABLE = ("set_eagle3_layers_to_capture", "get_embed_and_head")
# nn.Module's own methods: every wrapper has them, so the workers may call them freely.
MODULE_API = frozenset({
    "apply", "buffers", "children", "cpu", "cuda", "eval", "forward", "load_state_dict", "modules", "named_buffers",
    "named_children", "named_modules", "named_parameters", "parameters", "state_dict", "to", "train",
})
MARKER = f"{DIFF_MARKER} {PATCH_ID}"

# The added method, in the versioned diffs and (compiled from this same text) at runtime.
METHOD_TEMPLATE = '''\
def {method}(self, *args, **kwargs):
    # {marker} (EAGLE-3 calls this on the target model)
    inner = self.{attr}
    if not hasattr(inner, "{method}"):
        raise AttributeError(
            f"{{type(self).__name__}}.{method}: its {attr} "
            f"({{type(inner).__name__}}) has no {method}"
        )
    return inner.{method}(*args, **kwargs)
'''


def method_source(method: str, attr: str) -> str:
    return METHOD_TEMPLATE.format(method=method, attr=attr, marker=MARKER)


@dataclass(frozen=True)
class Wrapper:
    """A model class holding an EAGLE-3-capable language model in ``attr`` and handing it to its forward."""

    module: str  # dotted module name
    name: str  # class name
    attr: str
    inner: tuple[str, ...]  # the capable classes ``attr`` is built from
    missing: tuple[str, ...]  # DELEGATED_METHODS the class lacks and an inner class offers: what the patch adds

    @property
    def label(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.name}"


# -- the rule, on ASTs (shared by the runtime and the static side)

def _self_attr(node: ast.AST) -> str | None:
    """``x`` for the expression ``self.x``."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _statements(node: ast.AST):
    """Every statement under ``node``, through compound statements (cheaper than ast.walk: no expressions)."""
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()):
            yield child
            yield from _statements(child)


def inner_model_assignments(function: ast.AST) -> list[tuple[str, str]]:
    """(attribute, called name) for each ``self.<attribute> = <Name>(...)`` in ``function``."""
    found = []
    for node in _statements(function):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            found.extend((attr, value.func.id) for target in targets if (attr := _self_attr(target)))
    return found


def hands_over(forward: ast.AST, attr: str) -> bool:
    """Whether ``forward`` calls ``self.<attr>`` (or its ``forward``) or passes it whole as an argument."""
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
    """The Wrapper a class is, or None.  Names are resolved by the callers (live module or source index)."""
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
    methods = [m for m in DELEGATED_METHODS if any(m in w.missing for w in wrappers)]
    classes = "1 class" if len(wrappers) == 1 else f"{len(wrappers)} classes"
    return (f"{', '.join(methods)} forwarded on {classes}: "
            + ", ".join(f"{w.label} (.{w.attr})" for w in wrappers))


# -- runtime: live classes

def _lacks(cls, method: str) -> bool:
    """No class in ``cls``'s MRO defines ``method``, except through this patch."""
    member = getattr(cls, method, None)
    return member is None or is_patched(member, PATCH_ID)


def _is_capable_class(obj) -> bool:
    return isinstance(obj, type) and not any(_lacks(obj, m) for m in CAPABLE)


def _function_ast(function) -> ast.AST:
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError) as exc:  # e.g. an install without .py files
        raise Drift(f"no source for {function.__qualname__}: {exc}") from exc
    return ast.parse(textwrap.dedent(source)).body[0]


def runtime_wrappers(module: ModuleType) -> list[Wrapper]:
    """The Wrappers among the classes ``module`` defines (judged on the live classes)."""
    namespace = vars(module)
    found = []
    # dict.fromkeys: a class bound to two names (``EntryClass = Foo``) is looked at once.
    for cls in dict.fromkeys(v for v in namespace.values() if isinstance(v, type)):
        if cls.__module__ != module.__name__:
            continue
        assignments = []
        for function in vars(cls).values():
            # Cheap filter first: only functions naming a capable class are worth parsing.
            if isinstance(function, FunctionType) and any(
                    _is_capable_class(namespace.get(n)) for n in function.__code__.co_names):
                assignments += inner_model_assignments(_function_ast(function))
        if not assignments:
            continue
        forward = getattr(cls, "forward", None)
        wrapper = classify(
            module.__name__, cls.__name__, assignments,
            _function_ast(forward) if isinstance(forward, FunctionType) else None,
            is_capable=lambda callee: _is_capable_class(namespace.get(callee)),
            inner_offers=lambda callee, m: not _lacks(namespace[callee], m),
            lacks=lambda m, cls=cls: _lacks(cls, m))
        if wrapper:
            found.append(wrapper)
    return found


def delegating_method(cls: type, attr: str, method: str) -> FunctionType:
    """The added method, compiled from METHOD_TEMPLATE (its source is kept for tracebacks and inspect)."""
    source = method_source(method, attr)
    filename = f"<{PATCH_ID} {cls.__module__}.{cls.__qualname__}.{method}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    function = namespace[method]
    function.__module__ = cls.__module__
    function.__qualname__ = f"{cls.__qualname__}.{method}"
    return mark(function, PATCH_ID)


def _carries_diff(cls: type) -> bool:
    """The class's delegated methods come from source that carries our versioned diff."""
    for method in DELEGATED_METHODS:
        function = vars(cls).get(method)
        if isinstance(function, FunctionType) and not is_patched(function, PATCH_ID):
            try:
                if MARKER in inspect.getsource(function):
                    return True
            except OSError:
                pass
    return False


# -- static: source files
#
# Parsing every file of srt/models with ast takes most of a second, so the text is outlined with regular
# expressions (classes, bases, members, imports: a filter) and only the classes that look like wrappers, and the
# functions of the EAGLE code that mention the target model, are parsed with ast.

# Patterns start with a literal (not ^) so that re can skip ahead quickly; the module text is prefixed with "\n".
_CLASS_HEADER = re.compile(r"\nclass\s+(\w+)\s*(?:\(([^)]*)\))?\s*:")
_TOP_LEVEL_LINE = re.compile(r"\n[^\s#)\]}]")  # a line starting a top-level statement
_METHOD_LINE = re.compile(r"\n(?:    )?(?:async\s+)?def\s")  # a top-level function or a method
_OUTER_LINE = re.compile(r"\n(?:    )?[^\s#)\]}]")  # a line at indentation 0 or 4
_MEMBER = re.compile(r"\n    (?:(?:async\s+)?def\s+(\w+)\s*\(|(\w+)\s*(?::[^=\n]*)?=[^=])")
_MODEL_IMPORT = re.compile(r"\nfrom\s+(?:sglang\.srt\.models)?\.(\w+)\s+import\s+(?:\([^)]*\)|[^\n]*)")
_SELF_CALL_ASSIGN = re.compile(r"self\.\w+\s*(?::[^=\n]*)?=\s*(\w+)\s*\(")


@dataclass
class _ClassOutline:
    bases: list[str]  # last dotted component of each base
    members: set[str]  # methods and class attributes defined in the body
    start: int  # character offsets of the class statement in the module text
    end: int


def _outline(text: str) -> dict[str, _ClassOutline]:
    classes = {}
    for header in _CLASS_HEADER.finditer(text):
        following = _TOP_LEVEL_LINE.search(text, header.end())
        end = following.start() + 1 if following else len(text)
        bases = [b.split("[")[0].strip().rsplit(".", 1)[-1] for b in (header.group(2) or "").split(",")
                 if b.strip() and "=" not in b]
        members = {m.group(1) or m.group(2) for m in _MEMBER.finditer(text, header.end(), end)}
        classes[header.group(1)] = _ClassOutline(bases, members, header.start() + 1, end)
    return classes


class SourceModels:
    """The top-level modules of ``sglang/srt/models`` in a source tree."""

    def __init__(self, tree: SourceTree):
        folder = tree.root / "sglang" / "srt" / "models"
        # "\n" first, so that the first line matches the patterns too; offsets count it.
        self.texts = {p.stem: "\n" + p.read_text(encoding="utf-8").lstrip("\ufeff")
                      for p in sorted(folder.glob("*.py"))}
        self._outlines: dict[str, dict[str, _ClassOutline]] = {}
        self._imports: dict[str, dict[str, tuple[str, str]]] = {}
        self._offers: dict[tuple[str, str, str], bool] = {}
        self._asts: dict[tuple[str, str], tuple[ast.ClassDef, int]] = {}

    def outline(self, module: str) -> dict[str, _ClassOutline]:
        if module not in self._outlines:
            self._outlines[module] = _outline(self.texts[module])
        return self._outlines[module]

    def capable_names(self) -> set[str]:
        """Names of the classes that may be EAGLE-3-capable (a filter: names only, bases matched by name)."""
        names = {name for module, text in self.texts.items() if f"def {CAPABLE[0]}" in text
                 for name, outline in self.outline(module).items() if CAPABLE[0] in outline.members}
        bases = {name: header.group(2) or "" for text in self.texts.values()
                 for header in _CLASS_HEADER.finditer(text) for name in [header.group(1)]}
        while True:
            more = {name for name, base_text in bases.items() if name not in names
                    and any(b.split("[")[0].strip().rsplit(".", 1)[-1] in names for b in base_text.split(","))}
            if not more:
                return names
            names |= more

    def imports(self, module: str) -> dict[str, tuple[str, str]]:
        """Local name -> (models module, class name) for ``from sglang.srt.models.X import ...``."""
        if module not in self._imports:
            names = {}
            for statement in _MODEL_IMPORT.finditer(self.texts[module]):
                try:
                    node = ast.parse(statement.group(0)).body[0]
                except SyntaxError:  # a continuation line the filter did not take in
                    continue
                source_module = node.module.rsplit(".", 1)[-1]
                names.update({alias.asname or alias.name: (source_module, alias.name) for alias in node.names})
            self._imports[module] = names
        return self._imports[module]

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        """The (module, class) a class name used in ``module`` refers to, within the models folder."""
        if name in self.outline(module):
            return module, name
        imported = self.imports(module).get(name)
        if imported and imported[0] in self.texts and depth < 5:
            return self.resolve(*imported, depth=depth + 1)
        return None

    def offers(self, module: str, name: str, member: str) -> bool:
        """Whether the class or one of its bases in the models folder defines ``member``."""
        key = (module, name, member)
        if key not in self._offers:
            self._offers[key] = False  # a cycle of bases ends here
            outline = self.outline(module).get(name)
            self._offers[key] = outline is not None and (member in outline.members or any(
                (base := self.resolve(module, b)) and self.offers(*base, member) for b in outline.bases))
        return self._offers[key]

    def is_capable(self, module: str, name: str) -> bool:
        resolved = self.resolve(module, name)
        return bool(resolved) and all(self.offers(*resolved, m) for m in CAPABLE)

    def class_ast(self, module: str, name: str) -> tuple[ast.ClassDef, int]:
        """The class's ast and the number of module lines before it."""
        key = (module, name)
        if key not in self._asts:
            text, outline = self.texts[module], self.outline(module)[name]
            offset = text.count("\n", 0, outline.start) - 1  # the "\n" put first
            try:
                node = ast.parse(text[outline.start:outline.end]).body[0]
            except SyntaxError:  # the outline cut the class short (a string at column 0): parse the module
                node = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == name)
                offset = 0
            self._asts[key] = (node, offset)
        return self._asts[key]

    def forward(self, module: str, name: str, depth: int = 0) -> ast.AST | None:
        """The ``forward`` the class runs: its own, or the first found through its bases."""
        node, _ = self.class_ast(module, name)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "forward":
                return item
        for base in self.outline(module)[name].bases:
            resolved = self.resolve(module, base)
            if resolved and depth < 20:
                found = self.forward(*resolved, depth=depth + 1)
                if found is not None:
                    return found
        return None

    def wrappers(self) -> list[Wrapper]:
        found, candidates = [], self.capable_names()
        for module, text in self.texts.items():
            if not candidates.intersection(_SELF_CALL_ASSIGN.findall(text)):
                continue
            for name, outline in self.outline(module).items():
                # Only classes assigning self.x = <capable class>(...) in their text are parsed.
                callees = set(_SELF_CALL_ASSIGN.findall(text, outline.start, outline.end))
                if not any(self.is_capable(module, callee) for callee in callees):
                    continue
                node, _ = self.class_ast(module, name)
                functions = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
                # Its own members from the ast (the outline's are only a filter): methods and class attributes.
                own = {f.name for f in functions} | {t.id for item in node.body if isinstance(item, ast.Assign)
                                                     for t in item.targets if isinstance(t, ast.Name)}
                assignments = [pair for function in functions for pair in inner_model_assignments(function)]
                wrapper = classify(
                    f"{MODELS}.{module}", name, assignments, self.forward(module, name),
                    is_capable=lambda callee, module=module: self.is_capable(module, callee),
                    inner_offers=lambda callee, m, module=module: self.offers(*self.resolve(module, callee), m),
                    lacks=lambda m, module=module, name=name, own=own: m not in own and not any(
                        (base := self.resolve(module, b)) and self.offers(*base, m)
                        for b in self.outline(module)[name].bases))
                if wrapper:
                    found.append(wrapper)
        return found

    def carries_diff(self) -> bool:
        return any(MARKER in text for text in self.texts.values())


def _functions_mentioning(text: str, words: tuple[str, ...]) -> list[ast.AST]:
    """The ast of each top-level function and method of a top-level class whose text mentions one of ``words``."""
    text = "\n" + text  # so that the first line matches the patterns too
    found = []
    for start in [m.start() + 1 for m in _METHOD_LINE.finditer(text)]:
        following = _OUTER_LINE.search(text, text.index("\n", start))
        segment = text[start:following.start() if following else len(text)]
        if any(word in segment for word in words):
            try:
                found.append(ast.parse(textwrap.dedent(segment)).body[0])
            except SyntaxError:  # the segment was cut short: take the whole module
                return [ast.parse(text)]
    return found


def eagle_target_methods(tree: SourceTree) -> tuple[set[str], set[str]]:
    """(methods called, names probed with hasattr/getattr) on the target model along the EAGLE code path.

    Read from the speculative modules named ``*eagle*``, the speculative modules they import, and (for
    ``set_eagle3_layers_to_capture``, called on the target by the model and graph runners) ``model_executor``.
    """
    folder = tree.root / "sglang" / "srt" / "speculative"
    texts = {p.stem: p.read_text(encoding="utf-8") for p in folder.glob("*.py") if "eagle" in p.stem}
    for text in list(texts.values()):
        for dependency in re.findall(r"from sglang\.srt\.speculative\.(\w+) import", text):
            if dependency not in texts and (folder / f"{dependency}.py").is_file():
                texts[dependency] = (folder / f"{dependency}.py").read_text(encoding="utf-8")
    called, probed = set(), set()
    for text in texts.values():
        for function in _functions_mentioning(text, ("target_worker", "target_model")):
            function_called, function_probed = _target_model_uses(function)
            called |= function_called
            probed |= function_probed
    executor = tree.root / "sglang" / "srt" / "model_executor"
    if any(".set_eagle3_layers_to_capture(" in p.read_text(encoding="utf-8") for p in executor.rglob("*.py")):
        called.add("set_eagle3_layers_to_capture")
    return called, probed


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


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


def _insert_methods(text: str, insertions: list[tuple[int, str]]) -> str:
    """``text`` with each block inserted after its (1-based) line number."""
    lines = text.splitlines(keepends=True)
    for line, block in sorted(insertions, reverse=True):
        lines[line:line] = [block]
    return "".join(lines)


class DrafterDelegation(Patch):
    id = PATCH_ID
    summary = "EAGLE-3 drafters on wrapper target models (Kimi-K2.5 and more): forward the EAGLE-3 methods"
    why = ("EAGLE-3 asks the target model to capture auxiliary hidden states and to share its embedding and LM "
           "head. Multimodal wrappers (KimiK25ForConditionalGeneration holds DeepSeek-V3 as language_model) do not "
           "forward those calls, so an EAGLE-3 drafter cannot run on them without a hand patch.")
    upstream = ("sglang 0.5.10 added set_eagle3_layers_to_capture / get_embed_and_head / set_embed_and_head to "
                "KimiK25ForConditionalGeneration; other wrappers still lack them")
    remove_when = "no model class of the oldest supported release qualifies (verify-patches says upstream)"
    releases = ">=0.5.8,<=0.5.23"
    upstream_check = ("every class holding an EAGLE-3-capable language model that its forward uses already "
                      "defines the delegated methods")
    runtime_method = ("post-import hook on every sglang.srt.models.* module: inspects the classes it defines and "
                      "adds the missing methods, each forwarding to the held language model (AttributeError naming "
                      "the method and the inner class when it lacks it)")
    static_method = ("text outline of srt/models plus ast of the candidate classes (same rule as at runtime); ast "
                     "of the EAGLE workers for the methods they call on the target model")

    targets_may_fail_to_import = True  # SGLang's model registry skips model modules that fail to import

    @property
    def targets(self) -> tuple[str, ...]:
        """Every top-level module of the installed ``sglang.srt.models``: the folder's files name them before
        any is imported."""
        folder = installed_models_folder()
        return tuple(f"{MODELS}.{p.stem}" for p in sorted(folder.glob("*.py"))) if folder else ()

    def metadata(self) -> dict:
        return super().metadata() | {"targets": [f"{MODELS}.* (every model module)"]}

    # -- static

    def check_source(self, tree: SourceTree) -> Result:
        return self._assess(tree)[0]

    def rewrite(self, tree: SourceTree) -> dict[str, str]:
        result, models, qualifying = self._assess(tree)
        if result.status != APPLICABLE:
            return {}
        insertions: dict[str, list[tuple[int, str]]] = {}
        for wrapper in qualifying:
            node, offset = models.class_ast(wrapper.module.rsplit(".", 1)[-1], wrapper.name)
            block = "".join("\n" + textwrap.indent(method_source(m, wrapper.attr), "    ") for m in wrapper.missing)
            insertions.setdefault(wrapper.module, []).append((offset + node.end_lineno, block))
        return {module: _insert_methods(tree.source(module), blocks) for module, blocks in insertions.items()}

    def _assess(self, tree: SourceTree) -> tuple[Result, SourceModels | None, list[Wrapper]]:
        """check_source's result, with the outlined models and the classes to patch."""
        if not (tree.root / "sglang" / "srt" / "models").is_dir():
            return Result(DRIFTED, "no sglang/srt/models folder"), None, []
        models = SourceModels(tree)
        if models.carries_diff():
            return Result(APPLIED, "source carries the sglang-pcie diff"), models, []
        problem = _worker_problem(*eagle_target_methods(tree))
        if problem:
            return Result(DRIFTED, problem), models, []
        wrappers = models.wrappers()
        if "kimi_k25" in models.texts and not any(w.name == KIMI_CLASS for w in wrappers):
            return Result(DRIFTED, f"{KIMI_CLASS} no longer holds an EAGLE-3-capable language model that its "
                                   "forward uses (srt/models/kimi_k25.py)"), models, []
        qualifying = [w for w in wrappers if w.missing]
        if qualifying:
            return Result(APPLICABLE, summarize(qualifying)), models, qualifying
        if wrappers:
            return Result(UPSTREAM, "every wrapper already forwards the EAGLE-3 methods: "
                          + ", ".join(w.label for w in wrappers)), models, []
        return Result(NOT_APPLICABLE, "no model class holds an EAGLE-3-capable language model"), models, []

    # -- runtime

    def apply(self, module: ModuleType) -> Result:
        wrappers = runtime_wrappers(module)
        if module.__name__ == KIMI_MODULE and not any(w.name == KIMI_CLASS for w in wrappers):
            raise Drift(f"{KIMI_CLASS} no longer holds an EAGLE-3-capable language model that its forward uses")
        qualifying = [w for w in wrappers if w.missing]
        if not qualifying:
            if any(_carries_diff(getattr(module, w.name)) for w in wrappers):
                return Result(APPLIED, "source carries the sglang-pcie diff")
            if wrappers:
                return Result(UPSTREAM, "the EAGLE-3 methods are upstream on " + ", ".join(w.label for w in wrappers))
            return Result(NOT_APPLICABLE, "no class here holds an EAGLE-3-capable language model")
        # Build every method first, then install: nothing half-applied.
        additions = []
        for wrapper in qualifying:
            cls = getattr(module, wrapper.name)
            additions += [(cls, m, delegating_method(cls, wrapper.attr, m)) for m in wrapper.missing
                          if not is_patched(vars(cls).get(m), self.id)]
        for cls, method, function in additions:
            setattr(cls, method, function)
        return Result(APPLIED, summarize(qualifying))

    def check_runtime(self, modules: Mapping[str, ModuleType]) -> Result:
        in_effect, pending, upstream, from_diff = [], [], [], []
        for name, module in sorted(modules.items()):
            if not name.startswith(MODELS + "."):
                continue
            for wrapper in runtime_wrappers(module):
                cls = getattr(module, wrapper.name)
                if not wrapper.missing:
                    (from_diff if _carries_diff(cls) else upstream).append(wrapper)
                elif all(is_patched(vars(cls).get(m), self.id) for m in wrapper.missing):
                    in_effect.append(wrapper)
                else:
                    pending.append(wrapper)
        if pending:
            return Result(ERROR, "not in effect on " + ", ".join(w.label for w in pending))
        if in_effect:
            return Result(APPLIED, summarize(in_effect))
        if from_diff:
            return Result(APPLIED, "source carries the sglang-pcie diff")
        if upstream:
            return Result(UPSTREAM, "every wrapper already forwards the EAGLE-3 methods: "
                          + ", ".join(w.label for w in upstream))
        return Result(NOT_APPLICABLE, "no imported model class holds an EAGLE-3-capable language model")


def _worker_problem(called: set[str], probed: set[str]) -> str | None:
    """Why the EAGLE code path no longer fits the delegated methods, or None."""
    if not called & set(CAPABLE):
        return "the EAGLE workers call neither " + " nor ".join(CAPABLE) + " on the target model"
    unknown = sorted(called - set(DELEGATED_METHODS) - MODULE_API - probed)
    if unknown:
        return f"the EAGLE workers call {', '.join(unknown)} on the target model, which {PATCH_ID} does not forward"
    return None


def installed_models_folder() -> Path | None:
    """``sglang/srt/models`` of the sglang this interpreter imports (without importing it), or None."""
    root = installed_sglang_root()
    folder = root / "sglang" / "srt" / "models" if root else None
    return folder if folder and folder.is_dir() else None


PATCH = DrafterDelegation()
