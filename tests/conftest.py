"""Shared fixtures: pristine SGLang sources, and real SGLang installs that run code with the overlay active.

``sglang_env("0.5.9")`` gives a venv holding the real ``sglang==0.5.9`` (built by ``ci/sglang-env`` on first
use: minutes and ~11 GB), with this checkout's sglang-pcie installed into it as users install it (a wheel,
so the real ``.pth`` start-up hook runs), and a stub ``libcuda.so.1`` on LD_LIBRARY_PATH so that SGLang's CUDA
modules import on a machine without a GPU.  Tests never skip for lack of an env: the fixture builds it.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import REPO, SUPPORT, cuda_stub  # (pytest puts tests/ on sys.path: pyproject's pythonpath)

SCRIPTS = SUPPORT / "scripts"  # the programs tests run in child processes

# The checkout's own package, whatever the runner has installed (CI clones to another path).
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Inherited variables that would change what the overlay or NCCL does in a child: tests set them explicitly.
# PYTHONPATH goes too, so that the child imports the installed sglang-pcie, not a checkout on the path.
HERMETIC_PREFIXES = ("SGLANG_PCIE_", "EAGLE3_", "NCCL_")
HERMETIC_NAMES = ("PYTHONPATH",)
# The test infrastructure's own settings: where the real SGLang installs and release wheels are cached.
KEPT_NAMES = ("SGLANG_PCIE_CACHE", "SGLANG_PCIE_INDEX_URL")
OUTPUT_TAIL_CHARS = 4000


def child_environment(stub: Path, overrides: dict | None = None, base: dict | None = None) -> dict:
    """``base`` (default os.environ) without the overlay's, EAGLE3's and NCCL's variables, with the stub libcuda
    first on LD_LIBRARY_PATH, then ``overrides`` (a value of None removes the variable)."""
    env = {name: value for name, value in (os.environ if base is None else base).items()
           if name in KEPT_NAMES or not (name.startswith(HERMETIC_PREFIXES) or name in HERMETIC_NAMES)}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(stub), env.get("LD_LIBRARY_PATH")]))
    for name, value in (overrides or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def output_tails(proc: subprocess.CompletedProcess) -> str:
    return (f"--- stdout (tail) ---\n{proc.stdout[-OUTPUT_TAIL_CHARS:]}\n"
            f"--- stderr (tail) ---\n{proc.stderr[-OUTPUT_TAIL_CHARS:]}")


@dataclass(frozen=True)
class SglangEnv:
    version: str
    python: Path
    stub_dir: Path
    workdir: Path  # an empty cwd: with the repo as cwd, ``python -c`` would import the checkout, not the install

    def env(self, overrides: dict | None = None) -> dict:
        return child_environment(self.stub_dir, overrides)

    def run(self, code: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
        """``python -c code`` in this SGLang install (overlay active through its real start-up hook)."""
        return subprocess.run([str(self.python), "-c", code], env=self.env(env), cwd=self.workdir,
                              capture_output=True, text=True, timeout=timeout)

    def run_script(self, script: str, *args, env: dict | None = None, timeout: float = 900,
                   flags: tuple = ()) -> subprocess.CompletedProcess:
        """``python [flags] tests/support/scripts/<script> args...`` in this SGLang install."""
        return subprocess.run([str(self.python), *flags, str(SCRIPTS / script), *map(str, args)], env=self.env(env),
                              cwd=self.workdir, capture_output=True, text=True, timeout=timeout)

    def run_script_json(self, script: str, *args, env: dict | None = None, timeout: float = 900):
        """The JSON value the script prints on its last stdout line; fails the test on a non-zero exit."""
        return self._json(self.run_script(script, *args, env=env, timeout=timeout))

    def run_json(self, code: str, env: dict | None = None, timeout: float = 900):
        """The JSON value ``code`` prints on its last stdout line; fails the test on a non-zero exit."""
        return self._json(self.run(code, env, timeout))

    def _json(self, proc: subprocess.CompletedProcess):
        if proc.returncode != 0:
            pytest.fail(f"child python (sglang {self.version}) exited {proc.returncode}\n{output_tails(proc)}",
                        pytrace=False)
        lines = proc.stdout.strip().splitlines()
        try:
            return json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            pytest.fail(f"child python (sglang {self.version}) printed no JSON on its last stdout line\n"
                        f"{output_tails(proc)}", pytrace=False)


def ensure_sglang_python(version: str) -> Path:
    """The python of the cached real install (ci/sglang-env builds it if missing; progress on stderr)."""
    proc = subprocess.run([str(REPO / "ci" / "sglang-env"), version], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(f"ci/sglang-env {version} failed (exit {proc.returncode}); its stderr is above", pytrace=False)
    return Path(proc.stdout.strip().splitlines()[-1])


def install_wheel(python: Path, wheel: Path) -> None:
    """Install ``wheel`` into the venv of ``python`` unless the same contents are installed there already.

    One pip at a time per venv: parallel test sessions share these installs. The xdist workers of one run build the
    same wheel; a worker reinstalling it (remove, then write) while another's child interpreter imports from the venv
    left that child without the overlay now and then (a patch not applied: a failed release test), so the same
    contents are installed once, not once per worker."""
    venv = python.parent.parent
    digest = wheel_digest(wheel)
    with open(venv / ".sglang-pcie-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = venv / ".sglang-pcie-installed"
        if stamp.is_file() and stamp.read_text() == digest:
            return
        stamp.unlink(missing_ok=True)
        proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                               str(wheel)], capture_output=True, text=True)
        if proc.returncode == 0:
            stamp.write_text(digest)
    if proc.returncode != 0:
        pytest.fail(f"installing {wheel.name} into {python} failed\n{output_tails(proc)}", pytrace=False)


def wheel_digest(wheel: Path) -> str:
    """The wheel's contents (member names and bytes), not its archive's timestamps: the same checkout, the same
    digest."""
    import hashlib
    import zipfile

    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + b"\0" + archive.read(name) + b"\0")
    return digest.hexdigest()


# The ``unit`` tier (`pytest -m unit -n 2`, README): fast modules of the core logic, chosen by measured duration;
# their tests that need a release tree, a real SGLang install or a built wheel (RELEASE_FIXTURES) are left out, and a
# unit test that would fetch a release fails (``no_release_fetch``).
UNIT_MODULES = (
    "test_ci.py", "test_docs.py", "test_layout.py", "test_ports.py", "test_support.py", "runtime/test_code_swap.py",
    "runtime/test_shipped_diffs.py",
    "patching/test_diffs.py", "patching/test_edits.py", "patching/test_engine.py",
    "patching/test_baked_hook_diffs.py", "patching/test_pages.py", "patching/test_register.py",
    "patches/sm120_allreduce_fusion/test_sm120_allreduce_fusion_check_inserted.py", "patching/test_verify.py",
    "patches/accept_length_alarm/test_accept_length_alarm_payload.py", "runtime/test_activate.py",
    "patches/node_agreement/test_node_agreement_payload.py", "runtime/test_allreduce.py", "runtime/test_baked.py",
    "runtime/test_bounded_read.py", "runtime/test_hooks.py", "runtime/test_launch.py", "runtime/test_nccl.py",
    "runtime/test_patch_table.py", "runtime/test_settings.py",
    "patches/sm120_allreduce_fusion/test_sm120_allreduce_fusion_payload.py", "runtime/test_tuned_file.py",
    "runtime/test_wrapping.py", "patches/eagle3_profile/test_eagle3_profile_payload.py",
    "patches/eagle3_profile/test_eagle3_profile_clocks.py", "patches/eagle3_profile/test_eagle3_profile_process.py",
    "patches/eagle3_profile/test_eagle3_profile_ranks.py", "patches/eagle3_profile/test_eagle3_profile_records.py",
    "patches/eagle3_profile/test_eagle3_profile_slots.py", "patches/eagle3_profile/test_profiler_accept_hist.py",
    "patches/eagle3_profile/test_profiler_busy.py", "patches/eagle3_profile/test_profiler_cycles.py",
    "tools/test_allreduce_report.py", "tools/test_cli.py", "tools/test_common.py", "tools/test_env.py",
    "tools/test_processes.py", "tools/test_profile_report.py", "tools/test_safetensors_io.py",
    "tools/bench/test_command.py", "tools/bench/test_plan.py", "tools/bench/test_report.py",
    "tools/check_drafter/test_check_drafter_checkpoint.py", "tools/doctor/test_doctor.py",
    "tools/doctor/test_doctor_host.py", "tools/doctor/test_doctor_p2p.py", "tools/doctor/test_doctor_parsers.py",
    "tools/doctor/test_doctor_world.py", "tools/make_test_models/test_bf16.py",
    "tools/make_test_models/test_shape.py", "tools/tune_nccl/test_ipc.py", "tools/tune_nccl/test_nodes.py",
    "tools/tune_nccl/test_rendezvous.py", "tools/tune_nccl/test_tune_nccl_launch.py",
    "tools/tune_nccl/test_tune_nccl_report.py", "tools/tune_nccl/test_verdict.py",
)
RELEASE_FIXTURES = {"sglang_env", "torch_python", "pristine_source", "checkout_wheel"}
NOT_UNIT = {  # tests of UNIT_MODULES left out, and why (their durations measured with --durations=0)
    "tools/test_cli.py::test_a_tuned_file_that_is_a_fifo_is_one_error_line_not_a_hang_or_a_traceback[command2]":
        "fetches release 0.5.23",
    "tools/doctor/test_doctor_world.py::test_a_command_past_its_bound_is_killed_with_its_children_and_its_output_kept":
        "3 s: waits out a bound",
    "tools/bench/test_command.py::test_where_sglang_imports_the_servers_start": "2 s: starts servers",
    "tools/bench/test_command.py::test_another_server_command_is_not_checked": "1.3 s: starts a server",
    "tools/bench/test_report.py::test_chart_when_matplotlib_is_importable": "1.2 s: imports matplotlib",
    "tools/tune_nccl/test_rendezvous.py::test_a_failure_is_said_at_once_and_every_other_rank_names_it": "1 s: waits",
}
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """Every test that runs code in a real SGLang install (``sglang_env``, or its python: ``torch_python``) is
    marked ``release``: ``pytest -m "not release"`` is the loop without them; CI runs everything. The tests of
    UNIT_MODULES that need none of RELEASE_FIXTURES are marked ``unit``."""
    missing = [name for name in UNIT_MODULES if not (TESTS / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py's UNIT_MODULES names no test module: {', '.join(missing)}")
    unit = {TESTS / name for name in UNIT_MODULES}
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if {"sglang_env", "torch_python"} & fixtures:  # torch_python: 0.5.9's python
            item.add_marker(pytest.mark.release)
        elif (item.path in unit and not RELEASE_FIXTURES & fixtures and not item.get_closest_marker("slow")
              and f"{item.path.relative_to(TESTS).as_posix()}::{item.name}" not in NOT_UNIT):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def no_release_fetch(request, monkeypatch):
    """A unit test fetches no SGLang release (nor lists them): doing so fails it, naming the test's tier."""
    if request.node.get_closest_marker("unit") is None:
        return
    from sglang_pcie.patching import releases

    def refused(version, *args, **kwargs):
        releases.release_version(version)  # a version that is no version is still the usage error it was
        raise pytest.fail(f"a unit-tier test fetches no SGLang release (asked for {version!r})", pytrace=False)

    monkeypatch.setattr(releases, "fetch_source", refused)
    monkeypatch.setattr(releases, "list_releases", lambda *a, **k: pytest.fail("a unit-tier test lists no releases"))


@pytest.fixture(autouse=True)
def hermetic_environment(monkeypatch, tmp_path_factory):
    """No overlay, EAGLE3, NCCL or fake-server variable of the developer's shell reaches a test, nor their tuned
    NCCL file (XDG_CONFIG_HOME is an empty folder), nor settings or a profiler left by an earlier test."""
    from sglang_pcie.runtime import settings
    from sglang_pcie.patches.eagle3_profile import payload as eagle_profiler

    for name in list(os.environ):
        if name.startswith(HERMETIC_PREFIXES + ("FAKE_",)) and name not in KEPT_NAMES:
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    monkeypatch.setattr(settings, "_PROCESS_SETTINGS", None)
    monkeypatch.setattr(eagle_profiler, "_PROFILER", None)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def pristine_source():
    """``pristine_source(version)`` -> folder holding that release's pristine ``sglang`` package (.py files)."""
    from sglang_pcie.patching.releases import fetch_source

    return fetch_source


@pytest.fixture(scope="session")
def checkout_wheel(tmp_path_factory) -> Path:
    """This checkout built as a wheel, once per session: installed exactly as users install it."""
    out = tmp_path_factory.mktemp("sglang-pcie-wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)],
                          capture_output=True, text=True)
    wheels = sorted(out.glob("sglang_pcie-*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.fail(f"building the sglang-pcie wheel from {REPO} failed\n{output_tails(proc)}", pytrace=False)
    return wheels[0]


@pytest.fixture(scope="session")
def sglang_env(checkout_wheel, tmp_path_factory):
    """``sglang_env(version)`` -> SglangEnv for a real SGLang release with this checkout installed in it."""
    ready: dict[str, SglangEnv] = {}
    workdir = tmp_path_factory.mktemp("sglang-env-cwd")

    def get(version: str) -> SglangEnv:
        if version not in ready:
            python = ensure_sglang_python(version)
            install_wheel(python, checkout_wheel)
            ready[version] = SglangEnv(version, python, cuda_stub.stub_dir(python), workdir)
        return ready[version]

    return get
