"""benchmarks/: its README names every script and raw path that exists and lists every script; results/ holds no
scripts; scripts share only tests/support with the tests, never edit sys.path, and tests never import a script
(benchmarks/README.md, "What lives where"). Every shell script parses; every GPU script goes through gpu_env.sh (the
install-and-check step: one line and nothing else where the python lacks a module; SGLANG_PCIE_WHEELS=DIR installs
offline) and no tracked file reaches for a folder beside the checkout (README.md there, "GPU scripts from a clone")."""
from __future__ import annotations

import ast
import base64
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import REPO, TESTS
from support.overlay_venv import make_venv, site_packages

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


# --- Rerunning the GPU evidence from a clone (benchmarks/README.md, "GPU scripts from a clone") ---------------------

# The helpers the GPU scripts source, and the one script that builds a wheel set on a machine with a package index
# (it runs nothing on a GPU, so it has nothing to check).
INSTALL_CHECKS = {"gpu_env.sh", "gpu_common.sh", "gpu_detached.sh"}
GPU_HELPERS = INSTALL_CHECKS | {"gpu_user_launch.sh"}  # the last: the test pairs' launch, shared
GPU_BUILDERS = {"gpu_fi_wheels.sh"}
GPU_SCRIPTS = sorted(p for p in SHELL if (p.name.startswith("gpu_") or p.name == "ipc_smoke.sh")
                     and p.name not in GPU_HELPERS | GPU_BUILDERS)
OUTSIDE = ("../" + "shared", "/work/" + "shared")  # spelled apart, so that this file does not name them


def test_every_shell_script_parses():
    bad = {}
    for path in SHELL:
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=60)
        if proc.returncode:
            bad[path.name] = proc.stderr.strip()
    assert not bad


def test_no_tracked_file_reaches_outside_the_repository():
    """A clone holds everything its scripts and pages need: nothing names the workplace's folders beside the checkout
    (the frozen raw files under benchmarks/results/ record where they ran and are left as they are), and no script
    uses the models an outside kit wrote (its make_models.py, into /tmp/models): each makes its own with
    `sglang-pcie make-test-models`, into a folder of its own name, or takes a folder variable."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    bad = []
    for name in tracked.decode().split("\0")[:-1]:
        path = REPO / name
        if name.startswith("benchmarks/results/") or not path.is_file():
            continue
        text = path.read_bytes().decode(errors="replace")
        bad += [f"{name}: {word}" for word in OUTSIDE if word in text]
    for path in SHELL:
        if re.search(r"/tmp/models(?![\w-])|make_models\.py", path.read_text()):
            bad.append(f"{path.relative_to(REPO)}: /tmp/models or make_models.py (make them with make-test-models)")
    assert not bad


def test_every_gpu_script_goes_through_the_shared_install_check():
    """Each sources gpu_common.sh or gpu_detached.sh (which call gpu_env) or gpu_env.sh itself and calls it."""
    for helper in ("gpu_common.sh", "gpu_detached.sh"):
        assert re.search(r"^source .*gpu_env\.sh", (BENCHMARKS / helper).read_text(), re.M), helper
        assert re.search(r"^\s*gpu_env (--in \S+ )?\S+ \w", (BENCHMARKS / helper).read_text(), re.M), helper
    assert len(GPU_SCRIPTS) >= 11
    bad = []
    for path in GPU_SCRIPTS:
        text = path.read_text()
        sources = set(re.findall(r"^\s*source .*?(gpu_\w+\.sh)", text, re.M))
        if not sources & INSTALL_CHECKS:
            bad.append(f"{path.name}: sources none of {sorted(INSTALL_CHECKS)}")
        elif (sources & INSTALL_CHECKS == {"gpu_env.sh"}
              and not re.search(r"^\s*gpu_env (--in \S+ )?\S+ \w", text, re.M)):
            bad.append(f"{path.name}: sources gpu_env.sh but never calls gpu_env")
    assert not bad


@pytest.fixture(scope="module")
def python_without_packages(tmp_path_factory):
    """A folder whose `python3` is this interpreter without site-packages: no torch, no SGLang, no installed
    overlay (the checkout's sglang_pcie is still found from the checkout root, as the scripts that run it do)."""
    folder = tmp_path_factory.mktemp("bare-python")
    wrapper = folder / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    return folder


def script_env(bin_folder: Path, out: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PCIE_WHEELS", "SGLANG_PCIE_FI_WHEELS", "PYTHON")}
    env.update(PATH=f"{bin_folder}{os.pathsep}{env.get('PATH', '')}", OUT=str(out), **extra)
    return env


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: p.name)
def test_a_gpu_script_stops_at_once_naming_what_is_missing_and_the_ways_out(script, python_without_packages,
                                                                           tmp_path):
    """Started where python3 lacks what it needs, a GPU script says so in one line and does nothing else (the
    detached ones in `start`: nothing is started, no folder made)."""
    mode = ["start"] if "gpu_detached.sh" in script.read_text() else []
    proc = subprocess.run(["bash", str(script), *mode], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=script_env(python_without_packages, tmp_path / "out"))
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu_env: python3 (") and " cannot import " in lines[0], lines
    # the scripts that run the checkout uninstalled need torch; the others SGLang and the installed overlay
    needs = "torch (" if "gpu_common.sh" in script.read_text() else "sglang ("
    assert needs in lines[0], lines
    assert "pip install sglang==" in lines[0] and "pip install . in this checkout" in lines[0], lines
    assert "SGLANG_PCIE_WHEELS=DIR" in lines[0], lines


def fake_wheel(folder: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel holding ``files`` (name -> text), with the metadata pip reads."""
    module = dist.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}\n")
    files[f"{info}/RECORD"] = "".join(record) + f"{info}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def gpu_env_run(python: Path, wheels: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_PCIE_WHEELS"}
    if wheels is not None:
        env["SGLANG_PCIE_WHEELS"] = str(wheels)
    return subprocess.run(["bash", str(BENCHMARKS / "gpu_env.sh"), str(python)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=env)


def test_an_offline_wheel_set_in_parts_installs_without_an_index_and_the_overlay_is_reinstalled(tmp_path):
    """SGLANG_PCIE_WHEELS=DIR: the wheels of DIR and of its subfolders (a set split in parts), installed offline into
    the python named; sglang-pcie's wheel again each time (a rebuilt checkout keeps its version); then the check."""
    python = make_venv(tmp_path / "venv")
    before = gpu_env_run(python, None)  # nothing given: nothing installed, the check names both
    assert before.returncode == 1 and "cannot import sglang (" in before.stderr, before.stderr
    assert "sglang_pcie (" in before.stderr and "installed from" not in before.stdout
    wheels = tmp_path / "wheels"
    fake_wheel(wheels / "chunk1", "sglang", "0.0.1", {"sglang/__init__.py": "__version__ = '0.0.1'\n"})
    for build in ("first", "second"):
        fake_wheel(wheels / "overlay", "sglang-pcie", "0.1.0",
                   {"sglang_pcie/__init__.py": f"__version__ = '0.1.0'\nBUILD = {build!r}\n"})
        proc = gpu_env_run(python, wheels)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        installed, checked = proc.stdout.splitlines()
        assert installed == (f"gpu_env: installed from {wheels} into {python}, offline: 1 wheel(s) and"
                             f" sglang_pcie-0.1.0-py3-none-any.whl (reinstalled)")
        site = site_packages(python)
        assert checked.startswith(f"gpu_env: {python} (") and f"sglang 0.0.1 ({site / 'sglang'})" in checked
        assert f"sglang_pcie 0.1.0 ({site / 'sglang_pcie'})" in checked, checked
        assert f"BUILD = {build!r}" in (site / "sglang_pcie" / "__init__.py").read_text()


def test_a_wheel_folder_that_is_missing_or_holds_no_wheel_is_one_line(tmp_path):
    python = Path(sys.executable)
    (tmp_path / "empty" / "chunk1").mkdir(parents=True)
    nowhere, empty = tmp_path / "nowhere", tmp_path / "empty"
    for folder, says in ((nowhere, f"no such folder ({nowhere})"), (empty, f"no *.whl in {empty} or its subfolders")):
        proc = gpu_env_run(python, folder)
        assert proc.returncode == 1 and proc.stdout == "", proc.stdout
        assert proc.stderr.splitlines() == [f"gpu_env: SGLANG_PCIE_WHEELS={folder}: {says}"], proc.stderr
