"""The ``.pth`` start-up hook in real interpreters: what it installs, what it imports, what it leaves alone."""
from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from support import REPO, SUPPORT
from support.overlay_venv import make_venv, site_packages

SCRIPTS = SUPPORT / "scripts"


def run(python, code, env=None, cwd=None, flags=()):
    """``python -c code`` (a one-liner), or ``python tests/support/scripts/<code> args`` (a script: a name ending
    in .py, then its arguments), without the overlay's or Python's variables of this process."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PCIE_", "PYTHON"))}
    program = [str(SCRIPTS / code[0]), *map(str, code[1:])] if isinstance(code, tuple) else ["-c", textwrap.dedent(code)]
    return subprocess.run([str(python), *flags, *program], capture_output=True, text=True,
                          env={**base, **(env or {})}, cwd=cwd)


@pytest.fixture(scope="module")
def overlay_python(tmp_path_factory, checkout_wheel):
    return make_venv(tmp_path_factory.mktemp("overlay") / "venv", [str(checkout_wheel)])


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    return make_venv(tmp_path_factory.mktemp("bare") / "venv")




def state(python, env=None):
    proc = run(python, ("watcher_state.py",), env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_wheel_installs_the_hook_beside_a_startup_module(overlay_python):
    site = site_packages(overlay_python)
    assert (site / "sglang_pcie.pth").read_text().startswith("import sglang_pcie_startup")
    assert (site / "sglang_pcie_startup.py").is_file()
    assert (site / "sglang_pcie" / "diffs").is_dir()


def test_every_interpreter_watches_for_sglang(overlay_python):
    assert state(overlay_python) | {"modules": None} == {"watchers": 1, "watched": ["sglang"], "modules": None}


def test_startup_imports_nothing_but_its_own_module(overlay_python, bare_python):
    added = set(state(overlay_python)["modules"]) - set(state(bare_python)["modules"])
    assert added == {"sglang_pcie_startup"}


def test_disable_variable_installs_nothing(overlay_python):
    assert state(overlay_python, {"SGLANG_PCIE_DISABLE": "1"})["watchers"] == 0


def test_existing_sitecustomize_is_neither_shadowed_nor_overwritten(tmp_path, checkout_wheel):
    python = make_venv(tmp_path / "venv")
    mine = site_packages(python) / "sitecustomize.py"
    mine.write_text("import os\nos.environ['SITECUSTOMIZE_RAN'] = 'yes'\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(checkout_wheel)], check=True)
    assert mine.read_text() == "import os\nos.environ['SITECUSTOMIZE_RAN'] = 'yes'\n"
    proc = run(python, """
        import os, sys
        print(os.environ.get('SITECUSTOMIZE_RAN'), 'sglang_pcie_startup' in sys.modules)
    """)
    assert proc.stdout.split() == ["yes", "True"], proc.stderr


def test_editable_install_activates(tmp_path):
    python = make_venv(tmp_path / "venv", ["-e", str(REPO)])
    assert state(python)["watched"] == ["sglang"]
    proc = run(python, "import sglang_pcie, sglang_pcie.patching.diffs as d; print(sglang_pcie.__file__, d.diffs_root())")
    module_file, diffs = proc.stdout.split()
    assert module_file == str(REPO / "sglang_pcie" / "__init__.py") and diffs == str(REPO / "diffs")


def test_console_script_and_module_entry_agree(overlay_python):
    script = overlay_python.parent / "sglang-pcie"
    by_script = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    by_module = run(overlay_python, "import runpy, sys; sys.argv = ['x', '--version']; "
                                    "runpy.run_module('sglang_pcie', run_name='__main__')")
    assert by_script.stdout.strip() == by_module.stdout.strip()
    assert by_script.stdout.startswith("sglang-pcie ")




def test_post_import_hooks_run_after_the_module_and_never_break_its_import(overlay_python, tmp_path):
    (tmp_path / "watched_mod.py").write_text("VALUE = 42\n")
    (tmp_path / "other_mod.py").write_text("VALUE = 1\n")
    proc = run(overlay_python, ("post_import_hooks.py", tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[42] SourceFileLoader True", "[42, 42]", "fatal propagated False"]
    errors = proc.stderr.strip().splitlines()
    assert errors == ["sglang-pcie: hook for watched_mod failed, module left as shipped: ValueError: boom"]


# ------------------------------------------------------------------------------------------------------------
# The kill switch and the activation paths, end to end in a real interpreter (a stand-in ``sglang`` package:
# what is checked here is the overlay's side; tests/test_activation.py does the same in real SGLang).



@pytest.fixture
def stand_in_sglang(tmp_path):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    return {"PYTHONPATH": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "SGLANG_PCIE_NCCL_PROFILE": "pcie"}


@pytest.mark.parametrize("value, hooked, active", [
    ("1", False, False), ("yes", False, False), ("0", True, True), ("", True, True),
    ("2", True, False), ("y", True, False), ("maybe", True, False), ("\udcff", True, False),
])
def test_kill_switch_reads_the_same_in_the_hook_the_settings_and_the_plugin_loader(
        overlay_python, stand_in_sglang, value, hooked, active):
    proc = run(overlay_python, ("kill_switch.py",), {**stand_in_sglang, "SGLANG_PCIE_DISABLE": value})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["hooked"], out["active"], out["settings_disabled"]) == (hooked, active, not active)
    assert out["after_import"] == (active if hooked else None)
    # Off: nothing written for NCCL (the plugin loader used to write them, then fail on the missing watcher).
    assert bool(out["written"]) is active
    if parse := {"1": True, "yes": True, "0": False, "": False}.get(value) is None:
        shown = "b'\\xff'" if value == "\udcff" else repr(value)
        assert proc.stderr.splitlines() == [f"sglang-pcie: SGLANG_PCIE_DISABLE={shown} is not a boolean (use 1 or 0);"
                                            " read as 1: the overlay is off"]
    else:
        assert proc.stderr == "", parse




def test_plugin_loader_activates_where_the_hook_did_not_run(overlay_python, stand_in_sglang):
    # python -S: no site, so no .pth; site-packages reached through PYTHONPATH, as in an embedded interpreter.
    env = {**stand_in_sglang, "PYTHONPATH": f"{stand_in_sglang['PYTHONPATH']}:{site_packages(overlay_python)}"}
    proc = run(overlay_python, ("plugin_only.py",), env, flags=("-S",))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"hooked": False, "before": None, "after": True, "proto": "LL"}
    assert proc.stderr == ""


def test_plugin_load_never_raises(overlay_python, stand_in_sglang):
    proc = run(overlay_python, """
        import sglang_pcie.runtime.activate as act
        def broken():
            raise OSError("disk gone")
        act.activate = broken
        from sglang_pcie.runtime.plugin import load
        load()
        print("went on")
    """, stand_in_sglang)
    assert proc.returncode == 0 and proc.stdout == "went on\n"
    assert proc.stderr == "sglang-pcie: activation from SGLang's plugin loader failed: OSError: disk gone\n"
