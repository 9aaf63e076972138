"""The NCCL profile decision: which variables are written, never overwriting the user's, never on NVLink."""
from __future__ import annotations

import pytest

from sglang_pcie import nccl
from sglang_pcie.nccl import PCIE_PROFILE, Topology, apply_for_process, decide
from sglang_pcie.settings import load_settings

PCIE_BOX = Topology(["NVIDIA RTX PRO 6000 Blackwell"] * 8, nvlink=False, p2p=False, source="nvml")
NVLINK_BOX = Topology(["NVIDIA H200"] * 2, nvlink=True, p2p=True, source="nvml", detail="36 active NVLink links")
NO_GPU = Topology(detail="no NVIDIA driver or GPU visible")


# The process environment the decisions see: no user NCCL variables, and no tuned file.
NO_TUNED = {"SGLANG_PCIE_TUNED_FILE": "/nonexistent/sglang-pcie/nccl-tuned.json"}


def test_pcie_profile_is_the_measured_set():
    assert PCIE_PROFILE == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS",
                            "NCCL_MIN_NCHANNELS": "2", "NCCL_MAX_NCHANNELS": "2", "NCCL_BUFFSIZE": "131072"}


@pytest.mark.parametrize("topology, expected", [
    (PCIE_BOX, "pcie"),
    (NVLINK_BOX, "none"),
    (NO_GPU, "none"),
    (Topology(["NVIDIA L4"], nvlink=False, source="nvml"), "none"),
    (Topology(["A", "B"], nvlink=None, source="nvidia-smi"), "none"),
])
def test_auto_applies_pcie_only_without_nvlink(topology, expected):
    decision = decide("auto", NO_TUNED, probe=lambda: topology)
    assert decision.profile == expected
    assert decision.values == (PCIE_PROFILE if expected == "pcie" else {})
    assert "NCCL_NVLS_ENABLE" not in decision.values


def test_auto_never_pushes_pcie_values_onto_nvlink_even_if_asked_nothing():
    decision = decide("auto", NO_TUNED, probe=lambda: NVLINK_BOX)
    assert "NVLink" in decision.reason and decision.values == {}


def test_explicit_pcie_applies_without_probing():
    def probe():
        raise AssertionError("pcie must not probe the GPUs")
    assert decide("pcie", NO_TUNED, probe=probe).values == PCIE_PROFILE


def test_user_variables_are_never_overwritten():
    env = {"NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "4194304"}
    decision = decide("pcie", env)
    assert decision.user_set == env
    assert set(decision.values) == set(PCIE_PROFILE) - set(env)


@pytest.mark.parametrize("requested", ["off", None])
def test_off_and_invalid_apply_nothing(requested):
    decision = decide(requested, NO_TUNED, probe=lambda: PCIE_BOX)
    assert decision.profile == "none" and decision.values == {}


def test_apply_for_process_writes_once_and_children_inherit():
    env = dict(NO_TUNED)
    settings = load_settings({"SGLANG_PCIE_NCCL_PROFILE": "pcie"})
    apply_for_process(settings, env)
    assert {k: env[k] for k in PCIE_PROFILE} == PCIE_PROFILE and env[nccl.DECIDED_VAR] == "pcie"
    # A spawned worker inherits env and must not decide again (e.g. re-probe or override).
    child = dict(env, NCCL_PROTO="Simple")
    assert apply_for_process(load_settings({}), child) is None and child["NCCL_PROTO"] == "Simple"


def test_probe_without_driver_reports_no_gpu(monkeypatch):
    monkeypatch.setattr(nccl, "_probe_nvml", lambda: None)
    monkeypatch.setattr(nccl.shutil, "which", lambda name: None)
    assert nccl.probe_topology().gpu_count == 0


def test_nvidia_smi_matrix_is_parsed(monkeypatch):
    listing = ("GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n")
    matrix = ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-31\nGPU1\tNV18\t X \t0-31\n")
    pcie_matrix = matrix.replace("NV18", "SYS")

    class Done:
        def __init__(self, out):
            self.returncode, self.stdout = 0, out

    for text, expected in ((matrix, True), (pcie_matrix, False)):
        monkeypatch.setattr(nccl.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
        monkeypatch.setattr(nccl.subprocess, "run",
                            lambda cmd, **kw: Done(listing if cmd[1] == "-L" else text))
        topology = nccl._probe_nvidia_smi()
        assert topology.gpu_names == ["NVIDIA H200", "NVIDIA H200"] and topology.nvlink is expected
