"""A patch costs its own files only: a throw-away patch, registered in a temporary register that holds it alone,
goes through the generic machinery unchanged: the static check (``verify-patches``), diff generation (``diff_for``,
what ``ci/generate-diffs`` writes), ``apply-diffs`` and its reverse, the baked diff's guard under every switch,
activation on import (the settings handed down reaching the payload), ``verify-patches --runtime``, and the docs
table.

The files the throw-away patch needed (``tests/patching/throwaway/``), each standing for one file of a real wrap
patch, six by hand in all:

* ``throwaway_shout.py``: the patch's static check (``check_source``), as ``sglang_pcie/patches/<id>/check.py``;
  its install, runtime check, diff lines and ``marked`` come from its hook;
* ``throwaway_shout_payload.py``: what runs in SGLang, as ``sglang_pcie/patches/<id>/payload.py``;
* ``throwaway_register.py``: its ``Row`` with its ``Hook`` (``runtime/patch_table.py``) and ``Entry``
  (``patching/register.py``): two files of a real patch;
* this test, as ``tests/patches/<id>/test_<id>_check.py``; a real patch adds ``docs/<id>.md`` (the sixth), then the
  generated files: its diffs, docs/patches.md, COMPATIBILITY.md; and the test data the suites ask of every patch in
  its test folder (``drift.yaml``, ``mutations.yaml``).

``sitecustomize.py`` there is the test's plumbing: it installs the temporary register in child interpreters.
The fake release is written by the test: ``sglang`` 0.5.23 with one module, ``sglang.srt.toy``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_pcie.patching import diff_apply, diffs, engine, pages, register, verify
from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DISABLED, Result
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.runtime import patch_table
from sglang_pcie.runtime.settings import load_settings

from support import REPO
from support.cli import run_cli

THROWAWAY = Path(__file__).resolve().parent / "throwaway"
PATCH_ID = "throwaway-shout"
TOY = '''"""A module of a fake SGLang release."""


def greet(name):
    return f"hello {name}"
'''


@pytest.fixture
def tree(tmp_path) -> Path:
    """A fake SGLang 0.5.23 holding ``sglang.srt.toy``."""
    root = tmp_path / "release"
    for rel, text in {"sglang/__init__.py": '__version__ = "0.5.23"\n', "sglang/version.py": '__version__ = "0.5.23"\n',
                      "sglang/srt/__init__.py": "", "sglang/srt/toy.py": TOY}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def temporary_register(monkeypatch):
    """Both halves of the register hold the throw-away patch alone, in this process."""
    monkeypatch.syspath_prepend(str(THROWAWAY))
    import throwaway_register

    monkeypatch.setattr(patch_table, "TABLE", (throwaway_register.ROW,))
    monkeypatch.setattr(register, "REGISTER", (throwaway_register.ENTRY,))
    return engine.get_patch(PATCH_ID)


@pytest.fixture
def diffs_dir(tmp_path, tree, temporary_register, monkeypatch) -> Path:
    """The throw-away patch's diff for the fake release, generated as ``ci/generate-diffs`` does, in a folder that
    ``apply-diffs`` reads instead of the checkout's ``diffs/``."""
    folder = tmp_path / "diffs"
    text = diffs.diff_for(temporary_register, SourceTree(tree))
    (folder / "0.5.23").mkdir(parents=True)
    (folder / "0.5.23" / f"{PATCH_ID}.diff").write_text(text)
    monkeypatch.setattr(diffs, "diffs_root", lambda: folder)
    return folder


def child(tree: Path, code: str, env: dict | None = None, with_overlay: bool = True) -> subprocess.CompletedProcess:
    """``python -c code`` with the fake release, the checkout and the temporary register (its ``sitecustomize``)
    first on the path; ``with_overlay=False``: ``-S`` and the fake release alone (no sglang-pcie importable)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PCIE_", "EAGLE3_", "PYTHON"))}
    path = [str(THROWAWAY), str(tree), str(REPO / "sitecustomize"), str(REPO)] if with_overlay else [str(tree)]
    return subprocess.run([sys.executable, *([] if with_overlay else ["-S"]), "-c", code], capture_output=True,
                          text=True, env={**base, "PYTHONPATH": os.pathsep.join(path), **(env or {})}, cwd=tree)


IMPORT_TOY = """
import json
import sglang_pcie_startup
sglang_pcie_startup.install()  # what sglang_pcie.pth does in an installed overlay
import sglang.srt.toy as toy
from sglang_pcie.runtime import activate
print(json.dumps({"greet": toy.greet("you"), "switched_off": activate.SWITCHED_OFF,
                  "results": {i: {m: [r.status, r.detail] for m, r in rs.items()} for i, rs in activate.RESULTS.items()}}))
"""


def last_json(proc: subprocess.CompletedProcess):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_machinery_reads_the_temporary_register(temporary_register):
    assert [p.id for p in engine.all_patches()] == [PATCH_ID] == register.ids() == patch_table.ids()
    assert temporary_register.targets == ("sglang.srt.toy",) and temporary_register.entry.payload.endswith(":wrap")
    assert temporary_register.entry.marked == ("sglang.srt.toy:greet",)  # derived from its hook
    page = pages.patches_page()
    assert f"| `{PATCH_ID}` | a test's throw-away patch" in page and f"Page: [docs/{PATCH_ID}.md]({PATCH_ID}.md)" in page


def test_the_static_check_and_verify_patches(tree, temporary_register, capsys, monkeypatch):
    assert verify.check_source(temporary_register, SourceTree(tree)) == Result(APPLICABLE, "greet shouts")
    code, out, err = run_cli(capsys, "verify-patches", "--sglang-source", str(tree), "--json")
    report = json.loads(out)
    assert code == 0 and report["sglang_version"] == "0.5.23", err
    assert report["patches"] == [{"id": PATCH_ID, "status": APPLICABLE, "detail": "greet shouts"}]
    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", PATCH_ID)
    code, out, _ = run_cli(capsys, "verify-patches", "--sglang-source", str(tree), "--json")
    (row,) = json.loads(out)["patches"]
    assert code == 0 and row["status"] == DISABLED and row["detail"].startswith(register.DISABLE_PATCHES_REASON)
    assert verify.static_results(SourceTree(tree), load_settings({"SGLANG_PCIE_DISABLE": "1"}))[0][1].status == DISABLED


def test_the_generated_diff_applies_all_or_nothing_and_reverses(tree, diffs_dir, temporary_register, capsys):
    pristine = (tree / "sglang/srt/toy.py").read_bytes()
    diff = (diffs_dir / "0.5.23" / f"{PATCH_ID}.diff").read_text()
    assert diff.startswith("--- a/sglang/srt/toy.py\n+++ b/sglang/srt/toy.py\n")
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert all(f"sglang-pcie: {PATCH_ID}" in line for line in added if line.strip("+ "))
    code, out, err = run_cli(capsys, "apply-diffs", "--dry-run", "--target", str(tree))
    assert code == 0 and (tree / "sglang/srt/toy.py").read_bytes() == pristine, out + err
    code, out, err = run_cli(capsys, "apply-diffs", "--target", str(tree))
    assert code == 0, out + err
    baked = SourceTree(tree)
    assert temporary_register.check_source(baked) == Result(APPLIED, "source carries the sglang-pcie diff")
    assert temporary_register.rewrite(baked) == {}  # nothing to insert twice
    assert [step.action for step in diff_apply.plan(baked).steps] == [diff_apply.ALREADY]
    code, out, err = run_cli(capsys, "apply-diffs", "--reverse", "--target", str(tree))
    assert code == 0 and (tree / "sglang/srt/toy.py").read_bytes() == pristine, out + err


def test_activation_applies_it_on_import_with_the_settings_handed_down(tree):
    state = last_json(child(tree, IMPORT_TOY))
    assert state == {"greet": "HELLO YOU", "switched_off": {},
                     "results": {PATCH_ID: {"sglang.srt.toy": [APPLIED, "greet shouts"]}}}
    assert last_json(child(tree, IMPORT_TOY, {"SGLANG_PCIE_STRICT": "1"}))["greet"] == "HELLO YOU!"
    off = last_json(child(tree, IMPORT_TOY, {"SGLANG_PCIE_DISABLE_PATCHES": PATCH_ID}))
    assert off == {"greet": "hello you", "switched_off": {PATCH_ID: register.DISABLE_PATCHES_REASON}, "results": {}}


def test_verify_patches_runtime(tree):
    code = "import sys\nfrom sglang_pcie.tools.cli import main\nsys.exit(main(sys.argv[1:]))"
    argv = ["verify-patches", "--runtime", "--sglang-source", str(tree), "--json"]
    proc = child(tree, f"import sys; sys.argv[1:] = {argv!r}\n" + code)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["mode"] == "runtime"
    assert report["patches"] == [{"id": PATCH_ID, "status": APPLIED, "detail": "greet shouts"}]


@pytest.mark.parametrize("env, greeting", [
    ({}, "HELLO YOU"),
    ({"SGLANG_PCIE_STRICT": "1"}, "HELLO YOU!"),  # the guard hands the payload the settings it gated with
    ({"SGLANG_PCIE_DISABLE": "1"}, "hello you"),
    ({"SGLANG_PCIE_DISABLE_PATCHES": PATCH_ID}, "hello you"),
    (None, "hello you"),  # without sglang-pcie: the guard's lines are the identity
])
def test_the_baked_diff_obeys_every_switch(tree, diffs_dir, temporary_register, env, greeting):
    run = diff_apply.apply_release_diffs(SourceTree(tree), diffs_dir=diffs_dir)
    assert [step.action for step in run.steps] == [diff_apply.APPLY]
    code = "import sglang.srt.toy as toy; print(toy.greet('you'))"
    proc = child(tree, code, env, with_overlay=env is not None)
    assert proc.returncode == 0 and proc.stdout.strip() == greeting, proc.stderr
