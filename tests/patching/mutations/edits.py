"""Edits for mutations that plain text replacement cannot express well; a YAML ``call:`` names one of them.

Every function takes the root of a private, hard-linked copy of a release (the folder holding ``sglang``) and
keyword arguments from the YAML.  Files of that copy share their data with the cached release: replace a file
(``write_text`` below), never write into it in place.
"""
from __future__ import annotations

import ast
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` by a new file holding ``text`` (never writes through a hard link)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    path.write_text(text, encoding="utf-8")


def _top_level(tree: ast.Module, name: str) -> ast.stmt:
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
             and n.name == name]
    assert len(found) == 1, f"{name} is defined {len(found)} times at the top level"
    return found[0]


def _method(tree: ast.Module, cls_name: str, name: str) -> ast.FunctionDef:
    cls = _top_level(tree, cls_name)
    found = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    assert len(found) == 1, f"{cls_name}.{name} is defined {len(found)} times"
    return found[0]


def _span(node: ast.stmt) -> tuple[int, int]:
    """0-based [first, last) line indexes of a definition, decorators included."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first - 1, node.end_lineno


def move_function(root: Path, file: str, name: str, to: str, import_back: bool = True) -> None:
    """Move top-level function (or class) ``name`` from ``file`` to the module file ``to`` (created or appended
    to); with ``import_back`` the old module imports it from the new one, as upstream does when it splits files."""
    source_path, target_path = root / file, root / to
    lines = source_path.read_text(encoding="utf-8").splitlines(keepends=True)
    node = _top_level(ast.parse("".join(lines)), name)
    first, last = _span(node)
    body = "".join(lines[first:last])
    target_module = to[:-len(".py")].replace("/", ".").removesuffix(".__init__")
    source_module = file[:-len(".py")].replace("/", ".").removesuffix(".__init__")
    replacement = [f"from {target_module} import {name}  # noqa: F401\n"] if import_back else []
    lines[first:last] = replacement
    write_text(source_path, "".join(lines))
    header = "" if target_path.exists() else f"from {source_module} import *  # noqa: F401,F403\n\n\n"
    old = target_path.read_text(encoding="utf-8") if target_path.exists() else ""
    write_text(target_path, header + old + ("\n\n" if old else "") + body)


def move_method_to_base(root: Path, file: str, cls: str, methods: list[str], base: str,
                        base_file: str | None = None) -> None:
    """Move methods of class ``cls`` into a new base class ``base`` (defined above ``cls`` in the same file, or in
    ``base_file`` and imported), which ``cls`` then inherits from: the methods stay available, inherited."""
    path = root / file
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    cls_node = _top_level(tree, cls)
    spans = sorted((_span(_method(tree, cls, m)) for m in methods), reverse=True)
    moved = []
    for first, last in spans:
        moved.insert(0, "".join(lines[first:last]))
        del lines[first:last]
    header_line = cls_node.lineno - 1
    header = lines[header_line]
    if cls_node.bases:
        header = header.replace("(", f"({base}, ", 1)
    else:
        header = header.replace(f"class {cls}:", f"class {cls}({base}):", 1)
    assert header != lines[header_line], f"could not add {base} to the bases of {cls}"
    lines[header_line] = header
    base_source = f"class {base}:\n" + "\n".join(moved) + "\n\n"
    if base_file is None:
        first = min([cls_node.lineno] + [d.lineno for d in cls_node.decorator_list]) - 1
        lines.insert(first, base_source)
    else:
        module = base_file[:-len(".py")].replace("/", ".")
        target = root / base_file
        old = target.read_text(encoding="utf-8") if target.exists() else ""
        write_text(target, old + ("\n\n" if old else "") + base_source)
        first = min([cls_node.lineno] + [d.lineno for d in cls_node.decorator_list]) - 1
        lines.insert(first, f"from {module} import {base}\n\n\n")
    write_text(path, "".join(lines))


def rename_module(root: Path, module: str, to: str) -> None:
    """Rename a module file and rewrite every ``import``/``from`` of it in the package (as a move upstream does)."""
    old_rel = module.replace(".", "/") + ".py"
    new_rel = to.replace(".", "/") + ".py"
    text = (root / old_rel).read_text(encoding="utf-8")
    (root / old_rel).unlink()
    write_text(root / new_rel, text)
    for path in (root / "sglang").rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        if module in source:
            write_text(path, source.replace(module, to))


def move_method_to_component(root: Path, file: str, cls: str, method: str, component: str, component_file: str,
                             attribute: str) -> None:
    """Move method ``method`` of class ``cls`` into a new component class ``component`` in ``component_file``, which
    ``file`` imports; the calls ``self.<method>(`` in ``file`` become ``self.<attribute>.<method>(`` (as SGLang
    split its scheduler into component classes, held by the scheduler as attributes)."""
    path = root / file
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    cls_node = _top_level(tree, cls)
    first, last = _span(_method(tree, cls, method))
    body = "".join(lines[first:last])
    del lines[first:last]
    start = min([cls_node.lineno] + [d.lineno for d in cls_node.decorator_list]) - 1
    module = component_file[:-len(".py")].replace("/", ".")
    lines.insert(start, f"from {module} import {component}\n\n\n")
    new = "".join(lines)
    assert f"self.{method}(" in new, f"{file} does not call self.{method}("
    write_text(path, new.replace(f"self.{method}(", f"self.{attribute}.{method}("))
    write_text(root / component_file, f"from __future__ import annotations\n\nfrom typing import Any, Dict, Union\n\n\n"
                                      f"class {component}:\n{body}")
