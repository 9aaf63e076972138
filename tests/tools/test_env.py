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


# ------------------------------------------------------------------------------------------------------------
# The human report, line by line, and what --nnodes changes


def test_values_written_and_values_kept_each_have_their_line(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "pcie")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    code, out, err = run_cli(capsys, "env")
    lines = out.splitlines()
    assert code == 0 and err == ""
    assert lines[:2] == ["SGLANG_PCIE_NCCL_PROFILE: pcie -> profile pcie",
                         "why: SGLANG_PCIE_NCCL_PROFILE=pcie (explicit; not measured here)"]
    assert "would set NCCL_ALGO=Ring" in lines and "keeps NCCL_PROTO=Simple (set by the user)" in lines
    assert "would set nothing: NCCL defaults" not in out and "nodes:" not in out
    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "off")
    monkeypatch.delenv("NCCL_PROTO")
    code, out, _ = run_cli(capsys, "env")
    assert code == 0 and "would set nothing: NCCL defaults" in out.splitlines() and "would set NCCL" not in out


def test_only_kept_values_is_not_nothing(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "off")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    from sglang_pcie.runtime import nccl

    kept = nccl.NcclDecision("off", "none", {}, {"NCCL_PROTO": "Simple"}, "test: kept", Topology())
    monkeypatch.setattr(nccl, "decide", lambda *a, **k: kept)
    out = run_cli(capsys, "env")[1]
    assert "keeps NCCL_PROTO=Simple (set by the user)" in out and "would set nothing" not in out


def test_the_pcie_ipc_switch_and_the_advice_are_said(capsys, monkeypatch):
    from sglang_pcie.runtime import nccl
    from sglang_pcie.runtime.allreduce import ENABLE_VAR, MAX_NUMEL_VAR, IpcDecision

    ipc = IpcDecision({ENABLE_VAR: "1"}, {MAX_NUMEL_VAR: "4096"}, "measured faster", on=True)
    made = nccl.NcclDecision("auto", "none", {}, {}, "auto: test", Topology(), "run tune-nccl again", None, ipc)
    monkeypatch.setattr(nccl, "decide", lambda *a, **k: made)
    code, out, _ = run_cli(capsys, "env")
    lines = out.splitlines()
    assert code == 0 and "advice: run tune-nccl again" in lines
    assert f"would set {ENABLE_VAR}=1" in lines and f"keeps {MAX_NUMEL_VAR}=4096 (set by the user)" in lines


def test_nnodes_describes_a_launch_and_ignores_what_the_environment_says(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "off")
    monkeypatch.setenv("SLURM_NNODES", "3")
    out = run_cli(capsys, "env")[1]
    assert "nodes: a launch over 3 nodes (SLURM_NNODES=3)" in out.splitlines()  # this environment's launch
    code, out, _ = run_cli(capsys, "env", "--nnodes", "1")
    assert code == 0 and "nodes:" not in out  # one node, as asked: SLURM's count does not apply
    out = run_cli(capsys, "env", "--nnodes", "2", "--json")[1]
    assert json.loads(out)["nodes"] == {"count": 2, "source": "--nnodes 2"}


@pytest.mark.parametrize("nodes", ["0", "-1"])
def test_nnodes_below_one_is_a_usage_error(capsys, nodes):
    assert run_cli(capsys, "env", "--nnodes", nodes) == (
        2, "", f"sglang-pcie: error: --nnodes {nodes}: give a number of nodes, 1 or more\n")


def test_a_bad_setting_still_prints_the_report_and_exits_2(capsys, monkeypatch):
    monkeypatch.setenv("EAGLE3_PROFILE_INTERVAL", "0")
    code, out, err = run_cli(capsys, "env", "--json")
    assert code == 2 and json.loads(out)["allreduce"]["paths"] and "EAGLE3_PROFILE_INTERVAL='0'" in err
    code, out, _ = run_cli(capsys, "env")
    assert code == 2 and out.startswith("SGLANG_PCIE_NCCL_PROFILE: ")
    monkeypatch.delenv("EAGLE3_PROFILE_INTERVAL")
    assert run_cli(capsys, "env", "--json")[0] == 0


def test_an_invalid_profile_is_named_invalid_and_exits_2(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "bogus")
    code, out, err = run_cli(capsys, "env")
    assert code == 2 and out.startswith("SGLANG_PCIE_NCCL_PROFILE: invalid -> profile ")
    assert "SGLANG_PCIE_NCCL_PROFILE='bogus'" in err


def test_the_variables_are_listed_before_the_all_reduce_paths(capsys, monkeypatch):
    from sglang_pcie.tools.common import variable_lines

    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "off")
    code, out, _ = run_cli(capsys, "env")
    lines = out.splitlines()
    table = variable_lines()
    start = lines.index(table[0])
    assert code == 0 and lines[start:start + len(table)] == table and "'off'" in lines[start + 6]
    assert lines[start + len(table)].startswith("All-reduce paths")
