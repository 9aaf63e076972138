"""The one way a patch makes a live module run rewritten source: swap the code of the functions it changes.

A patch whose change is written as source (``rewrite``: the versioned diffs are that text) applies at runtime the
shipped diff to the installed file's text (``shipped_diffs``), compiles the result and puts each changed function's
new code into the existing function object (``__code__``), so every module that imported the function by name sees
the change too. Statements the diff adds run in the module; functions it adds are defined from the whole new
module's code (the compiler's output depends on the module around a function, and the code must be the very code
the diffed file compiles to). All or nothing: everything is checked before anything changes; idempotent through
the patch's mark. Runs in SGLang processes: the standard library and ``runtime/`` only.
"""
from __future__ import annotations

import ast
import inspect
import linecache
import sys
from types import CodeType, FunctionType, ModuleType

from sglang_pcie.runtime.results import APPLIED, DRIFTED, Drift, Result, is_patched, mark


def not_swapped(modules, sources: dict[str, str], patch_id: str) -> Result | None:
    """A code-swap patch's runtime check: DRIFTED where a module its rewrite changes (``sources``: {module: new
    source}) was not imported or a function it changes or adds does not carry the patch's mark; None when all do."""
    for name, new_source in sources.items():
        module = modules.get(name)
        if module is None:
            return Result(DRIFTED, f"{name} was not imported")
        changed, added = top_level_changes(inspect.getsource(module), new_source)
        unpatched = [n for n in changed + function_names(added) if not is_patched(getattr(module, n, None), patch_id)]
        if unpatched:
            return Result(DRIFTED, f"{name}: not patched in this process: {', '.join(unpatched)}")
    return None


def swap_in(module: ModuleType, old_source: str, new_source: str, patch_id: str) -> Result:
    """Make ``module`` (whose file holds ``old_source``) run ``new_source``'s version of what changed."""
    changed, added = top_level_changes(old_source, new_source)
    if any(is_patched(module.__dict__.get(n), patch_id) for n in changed + function_names(added)):
        return Result(APPLIED, "already applied in this process")
    patched_name = f"{module.__file__} (patched by sglang-pcie {patch_id})"
    new_code = compile(new_source, patched_name, "exec", dont_inherit=True)
    functions = _changed_functions(module, old_source, new_code, changed)
    new_functions, statements = _added(added, new_code)
    statements_code = compile(ast.Module(body=statements, type_ignores=[]), patched_name, "exec", dont_inherit=True)
    # Nothing fails from here on: run the added statements (imports, the guard), define the new functions, swap.
    exec(statements_code, module.__dict__)
    for func_name, code in new_functions.items():
        module.__dict__[func_name] = mark(FunctionType(code, module.__dict__, func_name), patch_id)
    for func, code in functions.items():
        func.__code__ = code
        mark(func, patch_id)
    # Tracebacks and inspect.getsource() of the swapped code show the patched text.
    linecache.cache[patched_name] = (len(new_source), None, new_source.splitlines(keepends=True), patched_name)
    return Result(APPLIED, f"patched {', '.join(changed) or 'nothing'}; defined {', '.join(names(added))}")


def _changed_functions(module: ModuleType, old_source: str, new_code: CodeType, changed: list[str]) -> dict:
    """{live function: its new code}; Drift where the live function is not the one compiled from the file."""
    old_code = compile(old_source, module.__file__, "exec", dont_inherit=True)
    functions = {}
    for func_name in changed:
        func = module.__dict__.get(func_name)
        if not isinstance(func, FunctionType):
            raise Drift(f"{module.__name__}.{func_name} is not a function in this process")
        if func.__code__ != code_of(old_code, func_name):
            raise Drift(f"{module.__name__}.{func_name} in memory is not the one in {module.__file__} (changed by "
                        "someone else?)")
        functions[func] = code_of(new_code, func_name)
    return functions


def _added(added: list[ast.stmt], new_code: CodeType) -> tuple[dict[str, CodeType], list[ast.stmt]]:
    """({new plain function: its code}, the other added statements, in order). A decorated function (a stub a
    diff's guard replaces) runs as the statement it is, as in the diffed file; a name imported from another module
    must be there already (that module's patch applied)."""
    new_functions = {}
    for node in added:
        if isinstance(node, ast.FunctionDef) and not node.decorator_list:
            if node.args.defaults or node.args.kw_defaults:
                raise Drift(f"{node.name}: the runtime patch defines plain functions only")
            new_functions[node.name] = code_of(new_code, node.name)
        elif isinstance(node, ast.ImportFrom):
            source = sys.modules.get(node.module)
            missing = [a.name for a in node.names if not hasattr(source, a.name)]
            if missing:
                raise Drift(f"{node.module} does not define {', '.join(missing)} (its patch did not apply)")
    statements = [node for node in added if not (isinstance(node, ast.FunctionDef) and node.name in new_functions)]
    return new_functions, statements


def top_level_changes(old_source: str, new_source: str) -> tuple[list[str], list[ast.stmt]]:
    """(names of top-level functions whose body differs, top-level statements only in the new source)."""
    old_nodes = ast.parse(old_source).body
    old_dumps = [ast.dump(n) for n in old_nodes]
    old_functions = {n.name for n in old_nodes if isinstance(n, ast.FunctionDef)}
    changed, added = [], []
    for node in ast.parse(new_source).body:
        dump = ast.dump(node)
        if dump in old_dumps:
            old_dumps.remove(dump)
        elif isinstance(node, ast.FunctionDef) and node.name in old_functions:
            changed.append(node.name)
        else:
            added.append(node)
    if len(old_dumps) != len(changed):
        raise Drift("the rewrite removed top-level statements, which the runtime patch cannot do")
    return changed, added


def code_of(module_code: CodeType, name: str) -> CodeType:
    """The code object of function ``name`` in a compiled module (exactly one)."""
    found = [c for c in module_code.co_consts if isinstance(c, CodeType) and c.co_name == name]
    if len(found) != 1:
        raise Drift(f"{name} is compiled {len(found)} times in {module_code.co_filename}")
    return found[0]


def defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.ImportFrom):
        return [a.asname or a.name for a in node.names]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    return []


def names(nodes: list[ast.stmt]) -> list[str]:
    return [n for node in nodes for n in defined_names(node)]


def function_names(nodes: list[ast.stmt]) -> list[str]:
    """Functions the added statements define or import (a helper), which the patch marks."""
    return [n for node in nodes if isinstance(node, (ast.FunctionDef, ast.ImportFrom)) for n in defined_names(node)]
