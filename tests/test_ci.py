""".ci/run, CI's entry point and the README's test command: gcc and patch installed with apt-get where missing, as
root or through sudo, else one line saying what to install and nothing run; then ci/run-tests.

Each case runs the real script in a copy of the checkout's layout (``.ci/run`` and a stand-in ``ci/run-tests``), with
a PATH that holds only bash, the few programs the script calls and stand-ins for ``id``, ``sudo`` and ``apt-get``
that record how they were called: no package is installed, whoever runs the tests.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support import REPO

RUN_TESTS_RAN = "ci/run-tests ran"
INSTALL = ["apt-get update -qq", "apt-get install -y -qq patch gcc"]


def stand_in(path: Path, body: str) -> None:
    path.write_text(f"#!{shutil.which('bash')}\n{body}\n")
    path.chmod(0o755)


def run_ci(tmp_path: Path, uid: int, sudo: str | None = "works", apt_get: bool = True,
           present: tuple = ()) -> tuple[int, str, str, list[str]]:
    """(exit status, stdout, stderr, the calls the stand-ins recorded) of .ci/run as user ``uid``. ``sudo``: None
    (not installed), "works" (runs the command) or "refuses" (this user may not); ``present``: tools on PATH."""
    root, bin_dir = tmp_path / "checkout", tmp_path / "bin"
    (root / ".ci").mkdir(parents=True)
    (root / "ci").mkdir()
    bin_dir.mkdir()
    shutil.copy2(REPO / ".ci" / "run", root / ".ci" / "run")
    calls = tmp_path / "calls"
    stand_in(root / "ci" / "run-tests", f"echo '{RUN_TESTS_RAN}'")
    for tool in ("bash", "dirname", "mktemp", "rm"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    stand_in(bin_dir / "id", f'[ "$1" = -u ] && echo {uid}')
    if apt_get:
        stand_in(bin_dir / "apt-get", f'echo "apt-get $*" >> {calls}; echo "apt-get: progress"')
    if sudo == "works":
        stand_in(bin_dir / "sudo", f'echo "sudo $*" >> {calls}; exec "$@"')
    elif sudo == "refuses":
        stand_in(bin_dir / "sudo", f'echo "sudo $*" >> {calls}; echo "user is not in the sudoers file" >&2; exit 1')
    for tool in present:
        stand_in(bin_dir / tool, "exit 0")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([shutil.which("bash"), str(root / ".ci" / "run")], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    recorded = calls.read_text().splitlines() if calls.exists() else []
    return proc.returncode, proc.stdout, proc.stderr, recorded


def test_as_root_apt_get_installs_what_is_missing_without_sudo(tmp_path):
    code, out, err, calls = run_ci(tmp_path, uid=0)
    assert (code, out.strip(), err, calls) == (0, RUN_TESTS_RAN, "", INSTALL)


def test_a_user_with_sudo_installs_through_sudo(tmp_path):
    code, out, err, calls = run_ci(tmp_path, uid=1000)
    assert (code, out.strip(), err) == (0, RUN_TESTS_RAN, "")
    assert calls == [f"sudo {INSTALL[0]}", INSTALL[0], f"sudo {INSTALL[1]}", INSTALL[1]]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ci-run-apt")] == []  # its log removed


def test_only_the_missing_tool_is_installed(tmp_path):
    code, out, _, calls = run_ci(tmp_path, uid=1000, present=("gcc",))
    assert code == 0 and calls[-1] == "apt-get install -y -qq patch"


def test_nothing_missing_needs_neither_root_nor_sudo(tmp_path):
    code, out, err, calls = run_ci(tmp_path, uid=1000, sudo=None, apt_get=False, present=("gcc", "patch"))
    assert (code, out.strip(), err, calls) == (0, RUN_TESTS_RAN, "", [])


@pytest.mark.parametrize("sudo, apt_get, says", [
    (None, True, "installing them takes root and there is no sudo: as root, apt-get install patch gcc"),
    ("refuses", True, "could not install patch gcc with sudo apt-get (its output: "),
    ("works", False, "installs them only with apt-get, which is not here: install patch gcc"),
])
def test_otherwise_one_line_says_what_to_install_and_nothing_runs(tmp_path, sudo, apt_get, says):
    code, out, err, calls = run_ci(tmp_path, uid=1000, sudo=sudo, apt_get=apt_get)
    assert code == 1 and RUN_TESTS_RAN not in out and len(err.splitlines()) == 1, err
    assert err.startswith(".ci/run: ") and says in err, err
    assert not any(call.startswith("apt-get") for call in calls)
    if sudo == "refuses":  # sudo's own words are kept in the log the line names
        log = Path(err.split("(its output: ")[1].split(")")[0])
        assert "not in the sudoers file" in log.read_text()


def test_it_is_executable_as_the_workflow_calls_it():
    """The Tests workflow runs `.ci/run` itself (as GitHub's runner user, who has sudo, not root)."""
    assert "run: .ci/run" in (REPO / ".github" / "workflows" / "tests.yml").read_text()
    assert os.access(REPO / ".ci" / "run", os.X_OK)
