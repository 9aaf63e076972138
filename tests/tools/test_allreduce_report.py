"""The all-reduce report of env and verify-patches: which path a server started now would use, and why."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.runtime import gpus
from sglang_pcie.runtime import allreduce as allreduce_paths
from sglang_pcie.tools import cli
from sglang_pcie.runtime import nccl
from sglang_pcie.runtime import tuned_file as tuning
from sglang_pcie.runtime.allreduce import ENABLE_VAR, MAX_NUMEL_VAR, FlashinferInstall, decide_ipc, sglang_install
from sglang_pcie.tools.allreduce_report import format_report, report
from sglang_pcie.runtime.gpus import Topology

PCIE4 = Topology(["NVIDIA RTX PRO 6000 Blackwell"] * 4, nvlink=False, p2p=True, source="nvml",
                 uuids=[f"GPU-{i}" for i in range(4)])
PCIE2_P2P = Topology(["NVIDIA RTX PRO 6000 Blackwell"] * 2, nvlink=False, p2p=True, source="nvml")
PCIE2_NO_P2P = Topology(["NVIDIA GeForce RTX 5090"] * 2, nvlink=False, p2p=False, source="nvml")
NVLINK2 = Topology(["NVIDIA H200"] * 2, nvlink=True, p2p=True, source="nvml")
PCIE3 = Topology(["NVIDIA L40S"] * 3, nvlink=False, p2p=True, source="nvml")

FI_NONE = FlashinferInstall(None, False)
FI_OLD = FlashinferInstall("0.6.18", False, "/site/flashinfer")
FI_NEW = FlashinferInstall("0.7.2", True, "/site/flashinfer")
WINS = {"ipc": {"max_tokens": 2, "max_numel": 2 * 7168, "hidden": 7168, "tokens": [1, 2, 4, 8],
                "flashinfer": "0.7.2", "verdict": "beats NCCL up to 2 tok"}}
LOSES = {"ipc": {"max_tokens": None, "max_numel": None,
                 "verdict": "the PCIe-IPC all-reduce is not faster than NCCL beyond the noise at 1 tok"}}
MEASUREMENTS = {"none": None, "loses": dict(LOSES, values={}), "wins": dict(WINS, values={})}
USER_ENVS = {"none": {}, "off": {ENABLE_VAR: "0"}, "numel": {MAX_NUMEL_VAR: "4096"}}


def decision_with(topology, requested="auto", config=None, ipc=None):
    return nccl.NcclDecision(requested, "none", {}, {}, "auto: test", topology, None, config, ipc)


@pytest.fixture(scope="module")
def installs(pristine_source):
    return {v: sglang_install(pristine_source(v)) for v in ("0.5.16", "0.5.21", "0.5.23")}


def test_report_on_a_pcie_box_with_the_ipc_path_switched_on(installs, pristine_source, monkeypatch):
    monkeypatch.setattr(allreduce_paths, "flashinfer_install", lambda: FI_NEW)
    ipc = decide_ipc("auto", MEASUREMENTS["wins"], PCIE4, {}, installs["0.5.23"], FI_NEW)
    rep = report(decision_with(PCIE4, config=MEASUREMENTS["wins"], ipc=ipc), pristine_source("0.5.23"))
    assert [p["path"] for p in rep["paths"]] == ["custom all-reduce (SGLang)", "PCIe-IPC all-reduce (FlashInfer)",
                                                 "NCCL"]
    assert rep["paths"][0]["available"] is False and "without NVLink" in rep["paths"][0]["detail"]
    assert rep["paths"][1]["on"] and rep["server_uses"].startswith("PCIe-IPC all-reduce for bf16 reductions up to 14336")
    text = "\n".join(format_report(rep))
    assert "kernels present (FlashInfer 0.7.2); on:" in text and "a server started now uses: PCIe-IPC" in text


def test_report_on_an_nvlink_box_names_the_custom_all_reduce(installs, pristine_source, monkeypatch):
    monkeypatch.setattr(allreduce_paths, "flashinfer_install", lambda: FI_NEW)
    rep = report(decision_with(NVLINK2, config=MEASUREMENTS["wins"]), pristine_source("0.5.23"))
    assert rep["server_uses"] == "custom all-reduce up to 8 MiB, NCCL above"
    assert "NVLink" in rep["why"] and "--disable-custom-all-reduce" in rep["why"]
    assert not rep["paths"][1]["on"]


@pytest.mark.parametrize("release, fi, expected", [
    ("0.5.16", FI_NEW, "SGLang 0.5.16 has no PCIe-IPC all-reduce adapter (SGLang 0.5.21 adds it)"),
    ("0.5.21", FI_OLD, "FlashInfer 0.6.18 lacks the kernels (the PCIe-IPC kernels need flashinfer-python >= 0.7.0;"
                       " SGLang 0.5.21 pins 0.6.18, which lacks them"),
    ("0.5.21", FI_NONE, "FlashInfer is not installed (the PCIe-IPC kernels need flashinfer-python >= 0.7.0"),
    ("0.5.23", FI_NEW, "kernels present (FlashInfer 0.7.2); off: no tune-nccl result"),
])
def test_report_says_what_is_missing_per_release(pristine_source, monkeypatch, release, fi, expected):
    monkeypatch.setattr(allreduce_paths, "flashinfer_install", lambda: fi)
    rep = report(decision_with(PCIE2_NO_P2P), pristine_source(release))
    ipc_line = [line for line in format_report(rep) if "PCIe-IPC all-reduce (FlashInfer)" in line]
    assert len(ipc_line) == 1 and expected in ipc_line[0]
    assert rep["server_uses"] == "NCCL for every reduction"


def test_env_without_gpus_says_no_gpu_visible(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(gpus, "_load_nvml", lambda: None)
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    monkeypatch.setenv(tuning.TUNED_FILE_VAR, str(tmp_path / "none.json"))
    for name in (*allreduce_paths.IPC_VARS, "SGLANG_PCIE_NCCL_PROFILE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["env"]) in (0, 2)
    out = capsys.readouterr().out
    assert "GPUs: no GPU visible" in out and "a server started now uses: no all-reduce" in out
    cli.main(["env", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["allreduce"]["server_uses"] == "no all-reduce" and "ipc" not in data  # nothing to decide
