"""The one reader of SGLang's source: a folder holding an ``sglang`` package, read and parsed without importing it.

Every static question this project asks of SGLang (a patch's fit, the diffs, check-drafter's facts about a
release) goes through ``SourceTree``: modules by dotted name, names resolved as Python would resolve them
(re-exports, aliases, ``__all__``, relative imports), classes with their inherited methods.

Parsing all of ``srt/models`` takes more than a second, so names are resolved from a module's text cut at its
top-level statements (``source_text``): a statement is parsed when a name it mentions is asked for, a ``def`` or
``class`` only when its body is (``class_node``); a cut that does not parse gives way to parsing the whole module.
``tree()``, ``bindings()``, ``find_class()`` and ``method()`` hand out the whole module's own nodes (the diffs are
made from their positions); the cheap methods (``classes``, ``class_at``, ``class_node``, ``members``,
``lineage``, ``member_owner``, ``assignments``, ``functions_mentioning``) serve the checks that read hundreds of
modules.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path

from sglang_pcie.patching.source_text import (Cut, Definition, Piece, Whole, bound_names, cut_module, defines_in_body,
                                              executed_top_level, functions_mentioning, parse_whole, parsed,
                                              without_mark)


class SourceTree:
    """A folder holding an ``sglang`` package (site-packages, an unpacked wheel, a checkout's python/)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if not (self.root / "sglang" / "__init__.py").is_file():
            raise ValueError(_not_a_tree(self.root))
        # Each module is read and parsed once, so the patches' checks share the work; they never modify it.
        self._sources: dict[str, str | None] = {}
        self._trees: dict[str, ast.Module | None] = {}
        self._bindings: dict[str, dict[str, ast.stmt]] = {}
        self._cuts: dict[str, Cut | None] = {}
        self._wholes: dict[str, Whole] = {}
        self._bound: dict[tuple[str, str], ast.stmt | Definition | None] = {}
        self._paths: dict[str, Path | None] = {}
        self._members: dict[tuple[str, str], set[str]] = {}
        # Each patch's static check (verify.check_source), once per tree: a tree is read as it was when first
        # read; after writing into the folder (apply-diffs), make a new SourceTree.
        self.results: dict = {}  # patch id -> Result

    @property
    def version(self) -> str:
        for name in ("_version.py", "version.py"):
            path = self.root / "sglang" / name
            if path.is_file():
                match = re.search(r"""^__version__\s*=.*?['"]([^'"]+)['"]""", path.read_text(), re.M)
                if match:
                    return match.group(1)
        return "unknown"

    def path(self, module: str) -> Path | None:
        """File of a dotted module name (``sglang.srt.layers.communicator``), or None if absent."""
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def _located(self, module: str) -> Path | None:
        """``path``, looked up once per module: name resolution asks thousands of times."""
        if module not in self._paths:
            base = os.path.join(self.root, *module.split("."))
            found = next((c for c in (base + ".py", os.path.join(base, "__init__.py")) if os.path.isfile(c)), None)
            self._paths[module] = Path(found) if found else None
        return self._paths[module]

    def source(self, module: str) -> str | None:
        if module not in self._sources:
            path = self.path(module)
            # utf-8-sig: a UTF-8 BOM (which Python compiles) is not part of the text
            self._sources[module] = path.read_text(encoding="utf-8-sig") if path else None
        return self._sources[module]

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            text = self.source(module)
            self._trees[module] = ast.parse(text) if text is not None else None
        return self._trees[module]

    def function(self, module: str, name: str) -> ast.FunctionDef | None:
        """Top-level function ``name`` in ``module``, or ``Class.method``."""
        tree = self.tree(module)
        if tree is None:
            return None
        owner, _, member = name.rpartition(".")
        body = tree.body
        if owner:
            cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
            if cls is None:
                return None
            body = cls.body
        return next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == member), None)

    # -- names, as Python would resolve them, without importing anything

    def bindings(self, module: str) -> dict[str, ast.stmt]:
        """Top-level name -> the statement binding it (def, class, assignment, import), last binding winning;
        statements under ``if``/``try``/``with`` count, those under ``if TYPE_CHECKING:`` do not (they never run)."""
        if module not in self._bindings:
            tree = self.tree(module)
            found: dict[str, ast.stmt] = {}
            for stmt in executed_top_level(tree.body if tree else []):
                for name in bound_names(stmt):
                    found[name] = stmt
            self._bindings[module] = found
        return self._bindings[module]

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        """The absolute module an ``ImportFrom`` in ``module`` names (relative imports resolved)."""
        if not node.level:
            return node.module or ""
        package = module if self._is_package(module) else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return ".".join(filter(None, [package, node.module]))

    def top_level_import(self, module: str, imported: str) -> ast.stmt | None:
        """The first top-level ``from <imported> import ...`` (relative or not) or ``import <imported>`` of
        ``module``; None where it has none."""
        for node in self.tree(module).body:
            if isinstance(node, ast.ImportFrom) and self.absolute(module, node) == imported:
                return node
            if isinstance(node, ast.Import) and any(a.name == imported for a in node.names):
                return node
        return None

    def _is_package(self, module: str) -> bool:
        path = self._located(module)
        return path is not None and path.name == "__init__.py"

    def origin(self, module: str, name: str, _depth: int = 0) -> tuple[str, str] | None:
        """Where ``from module import name`` finds its value: (defining module, name there), following
        re-exports (``from x import name``, ``from x import *``); None when the name does not resolve. A
        submodule resolves to (``module.name``, ""); a module-level ``__getattr__`` makes any name resolve."""
        if _depth > 20 or self._located(module) is None:
            return None
        stmt = self._binding(module, name)
        if isinstance(stmt, ast.ImportFrom):
            alias = next(a for a in stmt.names if (a.asname or a.name) == name)
            source = self.absolute(module, stmt)
            if self._located(source) is None and source.split(".")[0] != "sglang":  # torch, a third-party package
                return source, alias.name
            return self.origin(source, alias.name, _depth + 1) or (
                (f"{source}.{alias.name}", "") if self._located(f"{source}.{alias.name}") else None)
        if stmt is not None:
            return module, name
        for star in self._star_imports(module):
            if self._located(star) is None:
                continue
            exported = self._exports(star)
            if (name in exported) if exported is not None else not name.startswith("_"):
                found = self.origin(star, name, _depth + 1)
                if found:
                    return found
        if self._is_package(module) and self._located(f"{module}.{name}"):
            return f"{module}.{name}", ""
        if self._binding(module, "__getattr__") is not None:
            return module, name
        return None

    def defines(self, module: str, name: str) -> bool:
        """Whether ``from module import name`` would find ``name`` in this tree."""
        return self.origin(module, name) is not None

    def _star_imports(self, module: str) -> list[str]:
        return [self.absolute(module, s) for s in executed_top_level(self._statements(module, "*"))
                if isinstance(s, ast.ImportFrom) and any(a.name == "*" for a in s.names)]

    def _exports(self, module: str) -> set[str] | None:
        """A literal ``__all__`` of ``module``, or None."""
        stmt = self._binding(module, "__all__")
        if isinstance(stmt, ast.Assign):
            try:
                return set(ast.literal_eval(stmt.value))
            except ValueError:
                return None
        return None

    def find_class(self, module: str, name: str) -> tuple[str, ast.ClassDef] | None:
        """The class ``name`` refers to in ``module`` (followed through imports): (defining module, its ast)."""
        return self._with_node(self._class_key(module, name))

    def base_classes(self, module: str, cls: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The bases of ``cls`` (defined in ``module``) that are classes of this tree, in order."""
        return [hit for base in cls.bases if (hit := self._with_node(self._base_key(module, base)))]

    def _with_node(self, key: tuple[str, str] | None) -> tuple[str, ast.ClassDef] | None:
        stmt = self.bindings(key[0]).get(key[1]) if key else None
        return (key[0], stmt) if isinstance(stmt, ast.ClassDef) else None

    def _class_key(self, module: str, name: str) -> tuple[str, str] | None:
        """(defining module, class name) of the class ``name`` refers to in ``module``, or None."""
        for _ in range(10):  # `Old = New` aliases are followed
            found = self.origin(module, name)
            if not found or not found[1]:
                return None
            stmt = self._binding(found[0], found[1])
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id != found[1]:
                module, name = found[0], stmt.value.id
                continue
            is_class = isinstance(stmt, ast.ClassDef) or isinstance(stmt, Definition) and stmt.kind == "class"
            return found if is_class else None
        return None

    def _base_key(self, module: str, base: ast.expr) -> tuple[str, str] | None:
        """The class a base-class expression (``Base``, ``Base[T]``, ``module.Base``) names, or None."""
        while isinstance(base, ast.Subscript):  # Generic[T], Base[Config]
            base = base.value
        if isinstance(base, ast.Name):
            return self._class_key(module, base.id)
        if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            holder = self._module_named(module, base.value.id)
            return self._class_key(holder, base.attr) if holder else None
        return None

    def _module_named(self, module: str, name: str) -> str | None:
        """The module a name of ``module`` stands for (a submodule imported, ``import a.b as m``), or None."""
        holder = self.origin(module, name)
        if holder and not holder[1]:
            return holder[0]
        imported = self._binding(module, name)
        if isinstance(imported, ast.Import):
            alias = next(a for a in imported.names if (a.asname or a.name.split(".")[0]) == name)
            return alias.name if alias.asname else None
        return None

    def method(self, module: str, cls_name: str, name: str,
               concrete: bool = False) -> tuple[str, str, ast.FunctionDef] | None:
        """``cls_name.name`` as attribute lookup finds it: defined on the class or inherited from a base class of
        this tree (depth first, left to right); (defining module, defining class, ast) or None. With ``concrete``
        an abstract declaration (``@abstractmethod``, or a body that only raises NotImplementedError / passes)
        does not count."""
        start = self.find_class(module, cls_name)
        seen = set()
        stack = [start] if start else []
        while stack:
            owner_module, cls = stack.pop(0)
            if (owner_module, cls.name) in seen or len(seen) > 50:
                continue
            seen.add((owner_module, cls.name))
            for node in cls.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                    if concrete and _is_abstract(node):
                        return None
                    return owner_module, cls.name, node
            stack[0:0] = self.base_classes(owner_module, cls)
        return None


    # -- the cheap reading: many modules, a text filter first, then only the classes asked for are parsed

    def modules(self, package: str, recursive: bool = False) -> list[str]:
        """Dotted names of the modules in a package folder (its ``__init__`` left out), sorted; with
        ``recursive`` those of its subpackages too (a subpackage's ``__init__.py`` by the subpackage's name)."""
        folder = self.root.joinpath(*package.split("."))
        names = []
        for path in sorted(folder.glob("**/*.py" if recursive else "*.py")):
            parts = path.relative_to(self.root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts != tuple(package.split(".")):
                names.append(".".join(parts))
        return names

    def classes(self, module: str) -> dict[str, Definition]:
        """The module's class statements at column 0, cut from its text without parsing them: name -> Definition
        (its text and bases as written, for text filters). A class under ``if``/``try`` is not listed here;
        ``class_at`` and ``class_node`` find it."""
        cut = self._cut(module)
        return cut.classes if cut else self._whole(module).classes

    def class_at(self, module: str, dotted: str) -> tuple[str, str] | None:
        """(defining module, class name) of the class a possibly dotted name (``Class``, ``module.Class``) used in
        ``module`` refers to, followed through imports as ``find_class`` does, without parsing a class body."""
        head, _, rest = dotted.partition(".")
        if not rest:
            return self._class_key(module, head)
        holder = self._module_named(module, head)
        return self.class_at(holder, rest) if holder else None

    def class_node(self, module: str, name: str) -> ast.ClassDef | None:
        """The ast of a top-level class, parsed from its own text (line numbers as in the module; not the object
        ``tree()`` holds); None when the module defines no class ``name``."""
        stmt = self._binding(module, name)
        if isinstance(stmt, ast.ClassDef):
            return stmt
        if not isinstance(stmt, Definition) or stmt.kind != "class":
            return None
        if stmt.node is None:
            try:
                stmt.node = ast.parse("\n" * (stmt.line - 1) + stmt.text).body[0]  # line numbers of the module
            except SyntaxError:  # the cut was wrong after all: the whole module decides
                whole = self._whole(module).names.get(name)
                stmt.node = whole if isinstance(whole, ast.ClassDef) else None
        return stmt.node

    def members(self, module: str, name: str) -> set[str]:
        """What the class's own body defines: methods, nested classes, class attributes (inherited ones not)."""
        key = (module, name)
        if key not in self._members:
            node = self.class_node(module, name)
            found = set()
            for item in node.body if node else []:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found.add(item.name)
                elif isinstance(item, ast.Assign):
                    found.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif isinstance(item, ast.AnnAssign) and item.value is not None and isinstance(item.target, ast.Name):
                    found.add(item.target.id)
            self._members[key] = found
        return self._members[key]

    def lineage(self, module: str, name: str) -> list[tuple[str, str]]:
        """The class and its bases of this tree, in the order ``method`` searches them (depth first, left to
        right), as (module, class name)."""
        found: list[tuple[str, str]] = []
        stack = [(module, name)]
        while stack and len(found) <= 50:
            key = stack.pop(0)
            bases = self._bases(*key)
            if key in found or bases is None:
                continue
            found.append(key)
            stack[0:0] = [base for b in bases if (base := self._base_key(key[0], b))]
        return found

    def _bases(self, module: str, name: str) -> list[ast.expr] | None:
        """The base-class expressions of a top-level class, from its header where that is enough."""
        stmt = self._binding(module, name)
        if not isinstance(stmt, Definition) or stmt.node is not None or stmt.header is None:
            node = self.class_node(module, name)
            return node.bases if node else None
        if stmt.base_nodes is None:  # ``Base`` and ``module.Base`` need no parser
            simple = all(_DOTTED_NAME.fullmatch(base) for base in stmt.bases)
            stmt.base_nodes = [_dotted_node(base) for base in stmt.bases] if simple else ast.parse(
                stmt.header + " pass").body[0].bases
        return stmt.base_nodes

    def member_owner(self, module: str, name: str, member: str) -> tuple[str, str] | None:
        """Where attribute lookup on the class finds ``member`` (a method or class attribute, own or inherited):
        (module, class) of the class that defines it, or None."""
        for key in self.lineage(module, name):
            definition = self._binding(*key)
            if isinstance(definition, Definition) and definition.node is None:
                if member not in definition.text:
                    continue  # the text does not even mention it: no need to parse the class
                if definition.header and defines_in_body(definition, member):
                    return key
            if member in self.members(*key):
                return key
        return None

    def assignments(self, module: str, name: str) -> list[ast.expr]:
        """The values assigned to a module-level name (``=``, ``: T =``, ``+=``), in the order they run."""
        found = []
        for stmt in executed_top_level(self._statements(module, name)):
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                found.append(stmt.value)
            elif (isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and isinstance(stmt.target, ast.Name)
                  and stmt.target.id == name and stmt.value is not None):
                found.append(stmt.value)
        return found

    def functions_mentioning(self, module: str, *words: str) -> list[ast.AST]:
        """The ast of each top-level function, and each method of a top-level class, whose text mentions one of
        ``words``, each parsed alone (the whole module, as one ast, where a cut does not parse)."""
        return functions_mentioning(without_mark(self.source(module) or ""), words)

    def _cut(self, module: str) -> Cut | None:
        if module not in self._cuts:
            self._cuts[module] = cut_module(without_mark(self.source(module) or ""))
        return self._cuts[module]

    def _binding(self, module: str, name: str) -> ast.stmt | Definition | None:
        """What binds a top-level name last, as ``bindings()`` finds it, parsing only the statements whose text
        mentions the name (a def or class at column 0 not at all: its Definition stands for it)."""
        key = (module, name)
        if key not in self._bound:
            found, cut = None, self._cut(module)
            try:
                for piece in cut.mentioning(name) if cut else ():
                    if isinstance(piece, Definition):
                        found = piece
                    else:
                        found = next((s for s in reversed(list(executed_top_level(parsed(piece))))
                                      if name in bound_names(s)), found)
            except SyntaxError:  # a statement cut short: the cut was wrong
                cut = self._forget_cut(module)
            self._bound[key] = found if cut else self._whole(module).names.get(name)
        return self._bound[key]

    def _statements(self, module: str, word: str) -> list[ast.stmt]:
        """The parsed top-level statements whose text mentions ``word`` (defs and classes at column 0 left out;
        every statement where the module had to be parsed whole), in order."""
        cut = self._cut(module)
        try:
            if cut:
                return [s for piece in cut.pieces if isinstance(piece, Piece) and word in piece.text
                        for s in parsed(piece)]
        except SyntaxError:
            self._forget_cut(module)
        return self._whole(module).statements

    def _forget_cut(self, module: str) -> None:
        """The cut of ``module`` was wrong: from now on its names come from the whole module, parsed."""
        self._cuts[module] = None
        self._bound = {key: value for key, value in self._bound.items() if key[0] != module}

    def _whole(self, module: str) -> Whole:
        if module not in self._wholes:
            self._wholes[module] = parse_whole(without_mark(self.source(module) or ""))
        return self._wholes[module]


_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")


def _dotted_node(dotted: str) -> ast.expr:
    """``Base`` or ``module.Base`` as the ast a parser would make of it."""
    head, _, attribute = dotted.partition(".")
    node = ast.Name(head, ast.Load())
    return ast.Attribute(node, attribute, ast.Load()) if attribute else node


def _is_abstract(func: ast.FunctionDef) -> bool:
    if any(ast.unparse(d).endswith("abstractmethod") for d in func.decorator_list):
        return True
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Raise) and "NotImplementedError" in ast.unparse(s))
               for s in body)


def _not_a_tree(root: Path) -> str:
    """Why ``root`` holds no sglang package, with the folder to give where that can be told."""
    if root.is_file():
        return f"{str(root)!r} is a file, not a folder: give the folder that holds the sglang package"
    said = f"no sglang package under {str(root)!r}"
    if (root / "__init__.py").is_file() and root.name == "sglang":
        return f"{said}: that is the sglang package itself; give its parent folder {str(root.parent)!r}"
    return said


def installed_sglang_root() -> Path | None:
    """The folder holding the ``sglang`` package this interpreter imports (found without importing it; once it
    is imported, the imported one), or None when there is none."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        return None
    # Not resolve(): the tree Python imports from, even where it is a farm of symbolic links.
    return Path(os.path.abspath(spec.origin)).parent.parent
