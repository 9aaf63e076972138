"""The three wings and the one-way imports between them (ARCHITECTURE.md), read from the package's own source:
every ``import`` statement, at module level or inside a function, counts."""
from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

PACKAGE = REPO / "sglang_pcie"
# What the runtime wing may import from the patching wing: the register, which is data.
RUNTIME_MAY_IMPORT = ("sglang_pcie.runtime", "sglang_pcie.patching.register")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The sglang_pcie modules ``path`` imports (``from pkg import mod`` counts as the module where mod is one)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
    return {m for m in found if m == "sglang_pcie" or m.startswith("sglang_pcie.")}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) - {name} for name, path in mods.items()}


def test_runtime_imports_nothing_from_the_tools_and_only_the_register_from_patching():
    bad = {name: sorted(m for m in deps if not m.startswith(RUNTIME_MAY_IMPORT))
           for name, deps in graph().items() if name.startswith("sglang_pcie.runtime")}
    assert not {k: v for k, v in bad.items() if v}


def test_patching_imports_nothing_from_the_tools():
    bad = {name: sorted(m for m in deps if m.startswith("sglang_pcie.tools"))
           for name, deps in graph().items() if name.startswith("sglang_pcie.patching")}
    assert not {k: v for k, v in bad.items() if v}


def test_the_register_is_data():
    deps = graph()["sglang_pcie.patching.register"]
    assert deps == set()


def test_no_import_circle():
    edges = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep in edges and not state.get(dep):
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(edges):
        if not state.get(node):
            visit(node, [node])
    assert cycles == []


def test_every_module_lives_in_a_wing():
    loose = [name for name in modules() if name.count(".") == 1
             and name not in ("sglang_pcie.__main__", "sglang_pcie.runtime", "sglang_pcie.patching",
                              "sglang_pcie.tools")]
    assert loose == []



# -- sizes: a module a reader can hold, a function a reader can see whole

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60  # from its def line to its last line (decorators not counted)


def test_no_module_is_over_500_lines():
    long = {name: lines for name, path in modules().items()
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_or_method_is_over_60_lines():
    long = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{name}:{node.lineno} {node.name}"] = lines
    assert long == {}

