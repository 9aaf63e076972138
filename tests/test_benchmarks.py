"""benchmarks/: its README names every script and raw path that exists and lists every script; results/ holds no
scripts; scripts share only tests/support with the tests, never edit sys.path, and tests never import a script
(benchmarks/README.md, "What lives where")."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from support import REPO, TESTS

BENCHMARKS = REPO / "benchmarks"
README = BENCHMARKS / "README.md"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py")
SHELL = sorted(BENCHMARKS.glob("*.sh"))
# Not run with --help: no options (they print their figures), run pytest at import, import torch, or are helpers and
# in-server aids rather than programs.
NO_HELP = {"agreement_record_size", "tune_spec_gpu_replay", "eagle3_profile_opcode_ab", "draft_watch_cost",
           "eagle3_synthetic", "eagle3_profile_breakdown", "eagle3_profile_server_breakdown"}


def imported_roots(path: Path) -> set[str]:
    """The top-level names ``path`` imports (absolute imports; relative ones are its own package's)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_every_script_and_raw_path_the_readme_names_exists():
    text = README.read_text()
    linked = re.findall(r"\]\((?!https?:|#)([^)#\s]+)\)", text)
    modules = re.findall(r"-m benchmarks\.(\w+)", text)
    shell = re.findall(r"\bbenchmarks/(\w+\.sh)\b", text)
    assert linked and modules and shell
    missing = [link for link in linked if not (BENCHMARKS / link).exists()]
    missing += [f"{name}.py" for name in modules if not (BENCHMARKS / f"{name}.py").is_file()]
    missing += [name for name in shell if not (BENCHMARKS / name).is_file()]
    assert not missing, missing


def test_the_readme_lists_every_script():
    text = README.read_text()
    unlisted = [p.name for p in [*SCRIPTS, *SHELL] if p.name not in text]
    unlisted += [d.name for d in BENCHMARKS.iterdir()
                 if d.is_dir() and d.name not in ("results", "__pycache__") and f"{d.name}/" not in text]
    assert not unlisted, f"benchmarks/README.md does not list {unlisted}"


def test_results_hold_no_scripts():
    scripts = [str(p.relative_to(BENCHMARKS)) for p in (BENCHMARKS / "results").rglob("*")
               if p.suffix in (".py", ".sh", ".pth")]
    assert not scripts, f"frozen evidence holds scripts (move them to benchmarks/): {scripts}"


def test_scripts_import_only_support_from_tests_and_never_edit_sys_path():
    # every module of tests/ but support's, at whatever depth (a script could put its folder on the path)
    test_modules = {p.stem for p in TESTS.rglob("*.py") if p.relative_to(TESTS).parts[0] != "support"}
    test_modules |= {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "support"}
    bad = {}
    for path in sorted(BENCHMARKS.rglob("*.py")):
        wrong = sorted(imported_roots(path) & (test_modules | {"tests"}))
        tree = ast.parse(path.read_text())
        if path != BENCHMARKS / "__init__.py" and any(
                isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name)
                and n.value.id == "sys" for n in ast.walk(tree)):
            wrong.append("sys.path")
        if wrong:
            bad[str(path.relative_to(REPO))] = wrong
    assert not bad


def test_tests_run_benchmark_scripts_and_never_import_them():
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__):
            continue
        text = path.read_text()
        if "benchmarks" in imported_roots(path):
            bad.append(f"{path.relative_to(REPO)}: imports benchmarks")
        for line in text.splitlines():
            if "benchmarks" in line and re.search(r"spec_from_file_location|run_path|import_module", line):
                bad.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert not bad


def test_scripts_the_gpu_scripts_call_by_path_import_only_sglang_pcie():
    """The GPU scripts run from /tmp against the installed wheel: what they call by path cannot import other
    scripts or tests/support (only `python -m benchmarks.<name>` from the checkout root can)."""
    called = set()
    for path in SHELL:
        called.update(re.findall(r"(?:python3?|\$PY)\"?\s+\"?(?:\$\{?\w+\}?/)?benchmarks/(\w+)\.py", path.read_text()))
    assert "break_drafter" in called
    bad = {name: sorted(imported_roots(BENCHMARKS / f"{name}.py") & {"benchmarks", "support"}) for name in called}
    assert not {k: v for k, v in bad.items() if v}


def test_the_pages_show_python_scripts_run_as_modules():
    """`python -m benchmarks.<name>`, not by path (which finds no uninstalled sglang_pcie); a command for an older
    commit, on the line that checks it out, runs as that commit's layout did."""
    pages = [REPO / "README.md", README, *sorted((REPO / "docs").glob("*.md"))]
    by_path = {p.name: [line for line in p.read_text().splitlines()
                        if re.search(r"python3? benchmarks/\w+\.py", line) and "git archive" not in line]
               for p in pages}
    assert not {k: v for k, v in by_path.items() if v}


HELP = '''
import runpy, sys
for name in sys.argv[1:]:
    sys.argv = [name, "--help"]
    try:
        runpy.run_module(f"benchmarks.{name}", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    else:
        raise SystemExit(f"{name}: --help did not exit")
    print(f"ok {name}", file=sys.stderr)
'''


def test_every_script_with_options_starts_and_prints_its_help():
    assert NO_HELP <= {p.stem for p in SCRIPTS}
    names = [p.stem for p in SCRIPTS if p.stem not in NO_HELP]
    proc = subprocess.run([sys.executable, "-c", HELP, *names], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.startswith("ok ")] == [f"ok {n}" for n in names]
