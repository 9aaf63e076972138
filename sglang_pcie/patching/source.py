"""The one reader of SGLang's source: a folder holding an ``sglang`` package, read and parsed without importing it.

Every static question this project asks of SGLang (a patch's fit, the diffs, check-drafter's facts about a
release) goes through ``SourceTree``: modules by dotted name, names resolved as Python would resolve them
(re-exports, aliases, ``__all__``, relative imports), classes with their inherited methods.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path

class SourceTree:
    """A folder holding an ``sglang`` package (site-packages, an unpacked wheel, a checkout's python/)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if not (self.root / "sglang" / "__init__.py").is_file():
            raise ValueError(f"no sglang package under {str(self.root)!r}")
        # Each module is read and parsed once, so the patches' checks share the work; they never modify it.
        self._sources: dict[str, str | None] = {}
        self._trees: dict[str, ast.Module | None] = {}
        self._bindings: dict[str, dict[str, ast.stmt]] = {}
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
            for stmt in _executed_top_level(tree.body if tree else []):
                for name in _bound_names(stmt):
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

    def _is_package(self, module: str) -> bool:
        path = self.path(module)
        return path is not None and path.name == "__init__.py"

    def origin(self, module: str, name: str, _depth: int = 0) -> tuple[str, str] | None:
        """Where ``from module import name`` finds its value: (defining module, name there), following
        re-exports (``from x import name``, ``from x import *``); None when the name does not resolve. A
        submodule resolves to (``module.name``, ""); a module-level ``__getattr__`` makes any name resolve."""
        if _depth > 20 or self.path(module) is None:
            return None
        stmt = self.bindings(module).get(name)
        if isinstance(stmt, ast.ImportFrom):
            alias = next(a for a in stmt.names if (a.asname or a.name) == name)
            source = self.absolute(module, stmt)
            if self.path(source) is None and source.split(".")[0] != "sglang":  # torch, a third-party package
                return source, alias.name
            return self.origin(source, alias.name, _depth + 1) or (
                (f"{source}.{alias.name}", "") if self.path(f"{source}.{alias.name}") else None)
        if stmt is not None:
            return module, name
        for star in self._star_imports(module):
            if self.path(star) is None:
                continue
            exported = self._exports(star)
            if (name in exported) if exported is not None else not name.startswith("_"):
                found = self.origin(star, name, _depth + 1)
                if found:
                    return found
        if self._is_package(module) and self.path(f"{module}.{name}"):
            return f"{module}.{name}", ""
        if "__getattr__" in self.bindings(module):
            return module, name
        return None

    def defines(self, module: str, name: str) -> bool:
        """Whether ``from module import name`` would find ``name`` in this tree."""
        return self.origin(module, name) is not None

    def _star_imports(self, module: str) -> list[str]:
        tree = self.tree(module)
        return [self.absolute(module, s) for s in _executed_top_level(tree.body if tree else [])
                if isinstance(s, ast.ImportFrom) and any(a.name == "*" for a in s.names)]

    def _exports(self, module: str) -> set[str] | None:
        """A literal ``__all__`` of ``module``, or None."""
        stmt = self.bindings(module).get("__all__")
        if isinstance(stmt, ast.Assign):
            try:
                return set(ast.literal_eval(stmt.value))
            except ValueError:
                return None
        return None

    def find_class(self, module: str, name: str) -> tuple[str, ast.ClassDef] | None:
        """The class ``name`` refers to in ``module`` (followed through imports): (defining module, its ast)."""
        for _ in range(10):  # `Old = New` aliases are followed
            found = self.origin(module, name)
            if not found or not found[1]:
                return None
            stmt = self.bindings(found[0]).get(found[1])
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id != found[1]:
                module, name = found[0], stmt.value.id
                continue
            return (found[0], stmt) if isinstance(stmt, ast.ClassDef) else None
        return None

    def base_classes(self, module: str, cls: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The bases of ``cls`` (defined in ``module``) that are classes of this tree, in order."""
        found = []
        for base in cls.bases:
            while isinstance(base, ast.Subscript):  # Generic[T], Base[Config]
                base = base.value
            if isinstance(base, ast.Name):
                hit = self.find_class(module, base.id)
            elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
                holder = self.origin(module, base.value.id)
                hit = self.find_class(holder[0], base.attr) if holder and not holder[1] else None
                if hit is None:  # ``import a.b as m`` binds a module
                    imported = self.bindings(module).get(base.value.id)
                    if isinstance(imported, ast.Import):
                        alias = next(a for a in imported.names if (a.asname or a.name.split(".")[0]) == base.value.id)
                        hit = self.find_class(alias.name, base.attr) if alias.asname else None
            else:
                hit = None
            if hit:
                found.append(hit)
        return found

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


def _is_abstract(func: ast.FunctionDef) -> bool:
    if any(ast.unparse(d).endswith("abstractmethod") for d in func.decorator_list):
        return True
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Raise) and "NotImplementedError" in ast.unparse(s))
               for s in body)


def _executed_top_level(body: list[ast.stmt]):
    """The statements of a module body that run at import, looking into ``if``/``try``/``with`` blocks."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            if ast.unparse(stmt.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):  # the body never runs
                yield from _executed_top_level(stmt.orelse)
                continue
            if ast.unparse(stmt.test) in ("not TYPE_CHECKING", "not typing.TYPE_CHECKING"):  # only the body runs
                yield from _executed_top_level(stmt.body)
                continue
            yield from _executed_top_level(stmt.body)
            yield from _executed_top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _executed_top_level(block)
        elif isinstance(stmt, ast.With):
            yield from _executed_top_level(stmt.body)
        else:
            yield stmt


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.ImportFrom):
        return [a.asname or a.name for a in stmt.names if a.name != "*"]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, (ast.AnnAssign, ast.AugAssign)) and (not isinstance(stmt, ast.AnnAssign) or stmt.value) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def installed_sglang_root() -> Path | None:
    """The folder holding the ``sglang`` package this interpreter imports (found without importing it; once it
    is imported, the imported one), or None when there is none."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        return None
    # Not resolve(): the tree Python imports from, even where it is a farm of symbolic links.
    return Path(os.path.abspath(spec.origin)).parent.parent
