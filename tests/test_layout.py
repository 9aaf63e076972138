"""The three wings and the one-way imports between them (ARCHITECTURE.md), read from the package's own source:
every ``import`` statement, at module level or inside a function, counts."""
from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

PACKAGE = REPO / "sglang_pcie"
# What the runtime wing may import: itself (the patch table, the runtime half of the register, included).
RUNTIME_MAY_IMPORT = ("sglang_pcie.runtime",)
PATCHES = "sglang_pcie.patches."


def is_check(name: str) -> bool:
    """A module of a patch folder's build-and-verify half: ``check`` and ``check_*`` (sglang_pcie/patches/)."""
    return name.startswith(PATCHES) and name.rpartition(".")[2].startswith("check")


def wing(name: str) -> str:
    """runtime (what runs in a server: runtime/ and the patch folders but their checks), patching (build and
    verify: patching/ and the patch folders' checks), tools, or the package itself."""
    if name.startswith("sglang_pcie.runtime") or (name.startswith(PATCHES) and not is_check(name)):
        return "runtime"
    if name.startswith("sglang_pcie.patching") or is_check(name):
        return "patching"
    return "tools" if name.startswith("sglang_pcie.tools") else "package"


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


def own_folder(name: str) -> str:
    """A patch folder's package (``sglang_pcie.patches.<id>``) for its modules, "" for others."""
    return ".".join(name.split(".")[:3]) if name.startswith(PATCHES) else ""


def test_runtime_imports_nothing_from_the_tools_or_patching():
    """The server's half imports runtime/ and, in a patch folder, its own folder's server half: never a check,
    patching/, the tools or another patch."""
    bad = {}
    for name, deps in graph().items():
        if wing(name) != "runtime":
            continue
        folder = own_folder(name)
        bad[name] = sorted(m for m in deps if not (
            m.startswith(RUNTIME_MAY_IMPORT) or m == "sglang_pcie.patches"
            or (folder and (m == folder or m.startswith(folder + ".")) and not is_check(m))))
    assert not {k: v for k, v in bad.items() if v}


def test_patching_imports_nothing_from_the_tools():
    bad = {name: sorted(m for m in deps if m.startswith("sglang_pcie.tools"))
           for name, deps in graph().items() if wing(name) == "patching"}
    assert not {k: v for k, v in bad.items() if v}


def test_a_patch_folder_package_imports_nothing():
    """Importing ``sglang_pcie.patches.<id>`` loads nothing else: a server with the patch on loads its payload."""
    folders = [name for name, path in modules().items()
               if name.startswith(PATCHES) and name.count(".") == 2 and path.name == "__init__.py"]
    assert len(folders) == len(patch_ids()) and all(graph()[name] == set() for name in folders)


def test_each_patch_has_one_folder_named_after_its_id():
    from sglang_pcie.runtime import patch_table
    for row in patch_table.TABLE:
        folder = PATCHES + row.id.replace("-", "_")
        assert row.module == folder + ".check", row.id
        assert (TESTS / "patches" / row.id.replace("-", "_")).is_dir(), row.id


def patch_ids() -> list[str]:
    from sglang_pcie.runtime import patch_table
    return patch_table.ids()


def test_the_register_is_data():
    deps = graph()
    assert deps["sglang_pcie.runtime.patch_table"] == set()  # the runtime half: read in every SGLang process
    assert deps["sglang_pcie.patching.register"] == {"sglang_pcie.runtime.patch_table"}  # and the human half


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
                              "sglang_pcie.patches", "sglang_pcie.tools")]
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


# -- the mirror: a module's tests at its path

TESTS = REPO / "tests"
MIRRORED = ("runtime", "patching", "patches", "tools", "sitecustomize")  # tests/sitecustomize mirrors sitecustomize/
# Test modules that are the test of no one module or package, each with why.
CROSS_CUTTING = {
    "patching/test_hidden_drift.py": "every patch's static check on releases drifted the ways SGLang changes",
    "patching/test_release_matrix.py": "release tracking: the ci/ scripts, COMPATIBILITY.md and the workflows",
    "patching/mutations/test_mutations.py": "every patch and apply-diffs on upstream-style changes (YAML beside it)",
    "patching/test_throwaway_patch.py": "a throw-away patch (tests/patching/throwaway/) through all the generic machinery",
    "tools/check_drafter/test_check_drafter_checks.py": "model_checks and layer_ids on one pair and its breakages",
    "tools/doctor/test_doctor_parsers.py": "doctor's readers (gpu_facts, host) on recorded nvidia-smi and lspci text",
}


def mirrored(test: Path) -> Path | None:
    """What ``test`` is the test of by its path, or None.

    ``tests/<dir>/test_<name>.py`` tests ``sglang_pcie/<dir>/<name>.py`` or the package ``sglang_pcie/<dir>/<name>/``
    (``tests/sitecustomize``: ``sitecustomize/``). ``<name>`` may start with the folder's own name, which keeps
    basenames unique across tests/ (``tests/tools/doctor/test_doctor_host.py``: ``tools/doctor/host.py``), and
    may end in an aspect that names no module of the folder, one module's tests in several files
    (``test_profiler_busy.py``: ``profiler.py``). ``test_<folder>.py`` in a package's folder tests the package
    itself (``tests/tools/tune_nccl/test_tune_nccl.py``: ``tools/tune_nccl/``)."""
    folder_rel = test.parent.relative_to(TESTS)
    folder = (REPO if folder_rel.parts[0] == "sitecustomize" else PACKAGE) / folder_rel
    if not folder.is_dir():
        return None
    stem, own = test.stem.removeprefix("test_"), folder.name
    if stem == own and (folder / "__init__.py").is_file():
        return folder
    names = {p.stem: p for p in folder.glob("*.py") if p.name != "__init__.py"}
    names.update({p.name: p for p in folder.iterdir() if (p / "__init__.py").is_file()})
    for name in dict.fromkeys((stem, stem.removeprefix(own + "_"))):
        if name in names:
            return names[name]
        for module, path in sorted(names.items(), key=lambda item: -len(item[0])):  # the longest module first
            if name.startswith(module + "_") and name[len(module) + 1:] not in names:
                return path
    return None


def mirror_test_modules() -> list[Path]:
    return sorted(path for top in MIRRORED for path in (TESTS / top).rglob("test_*.py"))


def test_every_test_module_is_at_the_path_of_what_it_tests():
    astray = [str(test.relative_to(TESTS)) for test in mirror_test_modules()
              if mirrored(test) is None and str(test.relative_to(TESTS)) not in CROSS_CUTTING]
    assert astray == []


def test_the_cross_cutting_test_modules_exist_and_mirror_nothing():
    for test, why in CROSS_CUTTING.items():
        assert (TESTS / test).is_file() and mirrored(TESTS / test) is None and why, test


def test_the_mirror_rule_on_the_cases_it_names():
    assert mirrored(TESTS / "runtime/test_nccl.py") == PACKAGE / "runtime/nccl.py"
    assert mirrored(TESTS / "tools/doctor/test_doctor_host.py") == PACKAGE / "tools/doctor/host.py"
    profiler = PACKAGE / "patches/eagle3_profile/profiler.py"
    assert mirrored(TESTS / "patches/eagle3_profile/test_profiler_busy.py") == profiler
    assert mirrored(TESTS / "tools/tune_nccl/test_tune_nccl.py") == PACKAGE / "tools/tune_nccl"
    assert mirrored(TESTS / "tools/test_make_test_models.py") == PACKAGE / "tools/make_test_models"
    startup = REPO / "sitecustomize/sglang_pcie_startup.py"
    assert mirrored(TESTS / "sitecustomize/test_sglang_pcie_startup.py") == startup
    # an aspect that is itself a module of the folder is that module's test, misnamed
    assert mirrored(TESTS / "patches/eagle3_profile/test_profiler_clocks.py") is None
    assert mirrored(TESTS / "runtime/test_nowhere.py") is None
