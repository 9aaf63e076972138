"""The test infrastructure itself: real SGLang installs whose CUDA modules import on this CPU-only machine
through the stub libcuda, with this checkout installed and activated by ``import sglang``."""
from __future__ import annotations

import ctypes
import json

import pytest

from support import REPO, cuda_stub

# The modules our patches target, per release (the layer-boundary refactor moved the residual norm in 0.5.23;
# the v1 EAGLE worker is gone by then).
TARGET_MODULES = {
    "0.5.9": ["sglang.srt.layers.communicator", "sglang.srt.layers.flashinfer_comm_fusion",
              "sglang.srt.speculative.eagle_worker", "sglang.srt.speculative.eagle_worker_v2",
              "sglang.srt.models.kimi_k25"],
    "0.5.23": ["sglang.srt.layers.layer_boundary.residual.add_norm", "sglang.srt.layers.flashinfer_comm_fusion",
               "sglang.srt.speculative.eagle_worker_v2", "sglang.srt.models.kimi_k25"],
}



@pytest.fixture(scope="module", params=sorted(TARGET_MODULES))
def import_report(request, sglang_env):
    """One child run per release; the tests below read its report."""
    env = sglang_env(request.param)
    modules = TARGET_MODULES[request.param]
    proc = env.run_script("import_report.py", json.dumps(modules))
    assert proc.returncode == 0, f"child failed\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["stderr_tail"] = proc.stderr[-4000:]
    return request.param, report


def test_patch_target_modules_import_on_cpu(import_report):
    version, report = import_report
    assert report["sglang_version"] == version
    assert report["import_errors"] == {}
    assert report["cuda_available"] is False
    # sgl_kernel's extension links libcuda: loaded means the stub stood in for the driver.
    assert report["sgl_kernel_loaded"]


def test_overlay_installed_in_env_and_activated_by_import_sglang(import_report):
    version, report = import_report
    assert report["sglang_pcie_file"].startswith(report["prefix"] + "/"), "imported a checkout, not the install"
    assert report["overlay_activated"], report["stderr_tail"]


@pytest.mark.parametrize("version", sorted(TARGET_MODULES))
def test_stub_exports_every_driver_symbol_the_env_needs(sglang_env, version):
    env = sglang_env(version)
    wanted = cuda_stub.undefined_driver_symbols(cuda_stub.shared_objects(cuda_stub.site_packages(env.python)))
    assert "cuInit" in cuda_stub.exported_symbols(env.stub_dir)
    assert wanted - cuda_stub.exported_symbols(env.stub_dir) == set()


def test_stub_answers_no_device(sglang_env):
    stub = ctypes.CDLL(str(sglang_env("0.5.9").stub_dir / "libcuda.so.1"))
    version = ctypes.c_int(-1)
    assert stub.cuInit(0) == cuda_stub.CUDA_ERROR_NO_DEVICE
    assert stub.cuDriverGetVersion(ctypes.byref(version)) == cuda_stub.CUDA_ERROR_NO_DEVICE and version.value == 0
    function = ctypes.c_void_p(1)
    assert stub.cuGetProcAddress_v2(b"cuInit", ctypes.byref(function), 12000, 0, None) == cuda_stub.CUDA_ERROR_NO_DEVICE
    assert function.value is None
    text = ctypes.c_char_p()
    assert stub.cuGetErrorString(100, ctypes.byref(text)) == 0 and b"no CUDA-capable device" in text.value


def test_child_environment_is_hermetic(sglang_env, monkeypatch):
    for name in ("SGLANG_PCIE_NCCL_PROFILE", "EAGLE3_PROFILE", "NCCL_ALGO", "PYTHONPATH"):
        monkeypatch.setenv(name, "from-the-outer-shell")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/outer/lib")
    monkeypatch.setenv("HOME_LIKE_SETTING", "kept")
    env = sglang_env("0.5.9")
    child = env.env({"NCCL_PROTO": "LL", "HOME_LIKE_SETTING": None})
    assert not {"SGLANG_PCIE_NCCL_PROFILE", "EAGLE3_PROFILE", "NCCL_ALGO", "PYTHONPATH"} & child.keys()
    assert child["NCCL_PROTO"] == "LL" and "HOME_LIKE_SETTING" not in child
    assert child["LD_LIBRARY_PATH"] == f"{env.stub_dir}:/outer/lib"
    assert env.env()["HOME_LIKE_SETTING"] == "kept"


def test_a_passing_tests_temporary_files_are_removed_when_the_run_ends(tmp_path):
    """The suite's own pytest settings (pyproject.toml): a passed test's tmp_path is gone after the run, a failed
    one's is kept (its files are the evidence)."""
    import subprocess
    import sys

    (tmp_path / "test_leaves.py").write_text(
        "def test_passes(tmp_path):\n    (tmp_path / 'big.bin').write_bytes(b'0' * 1024)\n\n"
        "def test_fails(tmp_path):\n    (tmp_path / 'evidence.txt').write_text('x')\n    assert False\n")
    base = tmp_path / "base"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                           str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "--basetemp", str(base),
                           str(tmp_path / "test_leaves.py")], capture_output=True, text=True, timeout=300)
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-2000:]
    left = sorted(p.name for p in base.rglob("*") if p.is_file())
    assert left == ["evidence.txt"], left
