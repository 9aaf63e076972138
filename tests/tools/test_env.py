"""sglang-pcie env: the NCCL decision and the all-reduce report, and its exit codes."""
from __future__ import annotations

import json


import pytest

from sglang_pcie.runtime.gpus import Topology
from support.cli import run_cli



def test_env_reports_the_decision(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "pcie")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    code, out, _ = run_cli(capsys, "env", "--json")
    decision = json.loads(out)
    assert code == 0 and decision["profile"] == "pcie"
    assert decision["user_set"] == {"NCCL_PROTO": "Simple"} and "NCCL_PROTO" not in decision["values"]




@pytest.mark.parametrize("topology", [
    Topology(detail="no NVIDIA driver, or it lists none"),
    Topology(["NVIDIA H200"], None, None, "nvml", "1 GPU(s)"),
    Topology(["NVIDIA RTX A6000"] * 3, None, None, "nvidia-smi", "no topology matrix"),
])
def test_human_output_says_unknown_and_why_never_none(capsys, monkeypatch, topology):
    from sglang_pcie.runtime import gpus

    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: topology)
    code, out, err = run_cli(capsys, "env")
    assert code == 0 and "None" not in out, out
    if topology.gpu_count == 3:
        assert "NVLink: unknown (nvidia-smi does not report it)" in out
    if topology.gpu_count == 1:
        assert "peer-to-peer n/a (one GPU)" in out


def test_a_box_without_gpus_is_said_once_per_line(capsys, monkeypatch):
    """Neither NVML nor nvidia-smi: "no GPU visible" once, with the cause beside it, not the finding twice."""
    from sglang_pcie.runtime import gpus

    monkeypatch.setattr(gpus, "_probe_nvml", lambda environ=None: None)
    monkeypatch.setattr(gpus, "_probe_nvidia_smi", lambda environ=None: None)
    code, out, _ = run_cli(capsys, "env")
    assert code == 0 and "GPUs: no GPU visible (no NVIDIA driver, or it lists none)" in out, out
    for clause in out.replace(":", ";").split(";"):
        assert clause.count("GPU visible") <= 1, clause
