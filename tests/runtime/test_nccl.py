"""The NCCL decision: measured or untouched. What the GPUs are (NVML through a fake libnvidia-ml that speaks the
real ctypes calls), which of them CUDA_VISIBLE_DEVICES selects, and what auto / pcie / off write."""
from __future__ import annotations

import ctypes

import pytest


from sglang_pcie.runtime import gpus
from sglang_pcie.runtime import nccl
from sglang_pcie.runtime.nccl import PCIE_PROFILE, apply_for_process, decide
from sglang_pcie.runtime.gpus import Topology
from sglang_pcie.runtime.settings import load_settings

PCIE_BOX = Topology(["NVIDIA RTX PRO 6000 Blackwell"] * 8, nvlink=False, p2p=True, source="nvml")
NVLINK_BOX = Topology(["NVIDIA H200"] * 2, nvlink=True, p2p=True, source="nvml", detail="36 active NVLink links")
NO_GPU = Topology(detail="no NVIDIA driver, or it lists none")

# The process environment the decisions see: no user NCCL variables, and no tuned file.
NO_TUNED = {"XDG_CONFIG_HOME": "/nonexistent"}  # no tuned file at the default path: no result, no error


class FakeNvml:
    """libnvidia-ml.so.1 as ctypes sees it: the same function names, return codes and by-reference outputs.

    ``nvlink`` is a set of frozensets {a, b}: GPU pairs joined by NVLink; ``p2p`` likewise for peer-to-peer reads.
    """

    def __init__(self, names, uuids, nvlink=(), p2p=(), links_per_gpu=18):
        self.names, self.uuids = names, uuids
        self.nvlink = {frozenset(p) for p in nvlink}
        self.p2p = {frozenset(p) for p in p2p}
        self.links = links_per_gpu
        self.initialised = 0

    def nvmlInit_v2(self):
        self.initialised += 1
        return 0

    def nvmlShutdown(self):
        self.initialised -= 1
        return 0

    def nvmlDeviceGetCount_v2(self, ref):
        ref._obj.value = len(self.names)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, ref):
        ref._obj.value = 0x1000 + index
        return 0

    @staticmethod
    def _index(handle):
        return handle.value - 0x1000

    def nvmlDeviceGetName(self, handle, buffer, size):
        buffer.value = self.names[self._index(handle)].encode()
        return 0

    def nvmlDeviceGetUUID(self, handle, buffer, size):
        buffer.value = self.uuids[self._index(handle)].encode()
        return 0

    def nvmlDeviceGetP2PStatus(self, a, b, caps, ref):
        pair = frozenset((self._index(a), self._index(b)))
        table = {gpus._P2P_CAPS_NVLINK: self.nvlink, gpus._P2P_CAPS_READ: self.p2p}[caps]
        ref._obj.value = 0 if pair in table else 4  # 4: NVML_P2P_STATUS_NOT_SUPPORTED
        return 0

    def nvmlDeviceGetNvLinkState(self, handle, link, ref):
        index = self._index(handle)
        joined = any(index in pair for pair in self.nvlink)
        if not joined or link >= self.links:
            return 3  # NVML_ERROR_NOT_SUPPORTED
        ref._obj.value = 1
        return 0


def all_pairs(n):
    return [(a, b) for a in range(n) for b in range(a + 1, n)]


UUIDS = [f"GPU-{i}a1b2c3d-0000-0000-0000-00000000000{i}" for i in range(4)]
H200_NVLINK = FakeNvml(["NVIDIA H200"] * 2, UUIDS[:2], nvlink=all_pairs(2), p2p=all_pairs(2))
PCIE_P2P = FakeNvml(["NVIDIA RTX PRO 6000 Blackwell"] * 4, UUIDS, p2p=all_pairs(4))
# GPUs 0-1 joined by NVLink, 2-3 by NVLink, nothing across (two NVLink bridges): what matters is the selection.
BRIDGED = FakeNvml(["NVIDIA RTX A6000"] * 4, UUIDS, nvlink=[(0, 1), (2, 3)], p2p=all_pairs(4))


def test_nvml_reports_nvlink_and_peer_to_peer_of_an_nvlink_box():
    # Fails if the probe never sees NVLink (the mutant that made auto treat every box as PCIe).
    topology = gpus._probe_nvml(H200_NVLINK, environ={})
    assert topology.gpu_names == ["NVIDIA H200"] * 2 and topology.uuids == UUIDS[:2]
    assert topology.nvlink is True and topology.p2p is True
    assert "36 active NVLink links" in topology.detail and H200_NVLINK.initialised == 0  # shut down again


def test_nvml_reports_a_pcie_box_without_nvlink():
    topology = gpus._probe_nvml(PCIE_P2P, environ={})
    assert topology.gpu_count == 4 and topology.nvlink is False and topology.p2p is True
    no_p2p = FakeNvml(["L40S"] * 2, UUIDS[:2])
    assert gpus._probe_nvml(no_p2p, environ={}).p2p is False


@pytest.mark.parametrize("visible, names, nvlink", [
    (None, 4, False),  # all four: not every pair is joined
    ("0,1", 2, True),
    ("2,3", 2, True),
    ("1,2", 2, False),
    (f"{UUIDS[3][:12]},{UUIDS[2]}", 2, True),  # UUID prefixes, CUDA's syntax
    ("0,7,1", 1, None),  # CUDA stops at the first entry that names no GPU
    ("", 0, None),
    ("-1", 0, None),
])
def test_cuda_visible_devices_selects_the_gpus_whose_links_count(visible, names, nvlink):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    topology = gpus._probe_nvml(BRIDGED, environ=environ)
    assert topology.gpu_count == names and topology.nvlink is nvlink
    if visible and visible.startswith("GPU-"):
        assert topology.uuids == [UUIDS[3], UUIDS[2]]


def test_select_visible_maps_indices_and_uuids():
    assert gpus.select_visible(UUIDS, None) == ([0, 1, 2, 3], "")
    assert gpus.select_visible(UUIDS, ["3", "0"]) == ([3, 0], "")
    assert gpus.select_visible(UUIDS, ["GPU-2a1b"]) == ([2], "")
    assert gpus.select_visible(UUIDS, ["0", "0"]) == ([0], "")
    chosen, why = gpus.select_visible(UUIDS, ["MIG-abc"])
    assert chosen is None and "MIG" in why


def test_pcie_profile_is_the_measured_set():
    assert PCIE_PROFILE == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS",
                            "NCCL_MIN_NCHANNELS": "2", "NCCL_MAX_NCHANNELS": "2", "NCCL_BUFFSIZE": "131072"}


@pytest.mark.parametrize("topology", [PCIE_BOX, NVLINK_BOX, NO_GPU, Topology(["NVIDIA L4"], nvlink=None),
                                      Topology(["A", "B"], nvlink=None, source="nvidia-smi")])
def test_auto_without_a_tuned_result_keeps_nccl_defaults_everywhere(topology):
    decision = decide("auto", NO_TUNED, probe=lambda: topology)
    assert decision.profile == "none" and decision.values == {} and "NCCL defaults kept" in decision.reason


def test_auto_suggests_tune_nccl_only_on_a_multi_gpu_box_without_nvlink():
    advice = decide("auto", NO_TUNED, probe=lambda: PCIE_BOX).advice
    assert "sglang-pcie tune-nccl" in advice and "8 GPUs without NVLink" in advice
    for topology in (NVLINK_BOX, NO_GPU, Topology(["NVIDIA L4"], nvlink=None)):
        assert decide("auto", NO_TUNED, probe=lambda: topology).advice is None


def test_auto_on_the_fake_nvlink_box_end_to_end(monkeypatch):
    # The whole path from libnvidia-ml to the decision: an NVLink box gets no PCIe advice.
    monkeypatch.setattr(gpus, "_load_nvml", lambda: H200_NVLINK)
    decision = decide("auto", dict(NO_TUNED))
    assert decision.topology.nvlink is True and decision.advice is None and "NVLink between them" in decision.reason
    monkeypatch.setattr(gpus, "_load_nvml", lambda: PCIE_P2P)
    assert "tune-nccl" in decide("auto", dict(NO_TUNED)).advice


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
    assert decision.profile == "none" and decision.values == {} and decision.advice is None


def test_apply_for_process_writes_once_and_children_inherit():
    env = dict(NO_TUNED)
    settings = load_settings({"SGLANG_PCIE_NCCL_PROFILE": "pcie"})
    apply_for_process(settings, env)
    assert {k: env[k] for k in PCIE_PROFILE} == PCIE_PROFILE and env[nccl.DECIDED_VAR] == "pcie"
    # A spawned worker inherits env and must not decide again (e.g. re-probe or override).
    child = dict(env, NCCL_PROTO="Simple")
    assert apply_for_process(load_settings({}), child) is None and child["NCCL_PROTO"] == "Simple"


def test_the_advice_is_one_line_per_process_tree(monkeypatch, capsys):
    monkeypatch.setattr(gpus, "_load_nvml", lambda: PCIE_P2P)
    env = dict(NO_TUNED)
    decision = apply_for_process(load_settings({}), env)
    assert decision.values == {} and not any(k.startswith("NCCL_") for k in env)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sglang-pcie tune-nccl" in err
    for _ in range(3):  # the TP workers: they inherit the decision and say nothing
        assert apply_for_process(load_settings({}), dict(env)) is None
    assert capsys.readouterr().err == ""


def test_probe_without_driver_reports_no_gpu(monkeypatch):
    monkeypatch.setattr(gpus, "_load_nvml", lambda: None)
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    assert gpus.probe_topology({}).gpu_count == 0


def test_nvidia_smi_matrix_is_parsed_for_the_visible_gpus(monkeypatch):
    listing = "".join(f"GPU {i}: NVIDIA RTX A6000 (UUID: {UUIDS[i]})\n" for i in range(3))
    matrix = ("\tGPU0\tGPU1\tGPU2\tCPU Affinity\nGPU0\t X \tNV4\tSYS\t0-31\nGPU1\tNV4\t X \tSYS\t0-31\n"
              "GPU2\tSYS\tSYS\t X \t0-31\n")

    class Done:
        def __init__(self, out):
            self.returncode, self.stdout = 0, out

    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpus.subprocess, "run", lambda cmd, **kw: Done(listing if cmd[1] == "-L" else matrix))
    assert gpus._probe_nvidia_smi({}).nvlink is False  # GPU2 hangs off PCIe
    pair = gpus._probe_nvidia_smi({"CUDA_VISIBLE_DEVICES": "1,0"})
    assert pair.nvlink is True and pair.uuids == [UUIDS[1], UUIDS[0]] and pair.p2p is None
    assert gpus._probe_nvidia_smi({"CUDA_VISIBLE_DEVICES": "0,2"}).nvlink is False


def test_activation_cost_stays_small_without_gpus(monkeypatch):
    # Sanity, not a timing: the no-GPU decision touches neither torch nor CUDA nor SGLang.
    import sys

    monkeypatch.setattr(gpus, "_load_nvml", lambda: None)
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    before = set(sys.modules)
    apply_for_process(load_settings({}), dict(NO_TUNED))
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] in ("torch", "sglang", "flashinfer")}
    assert isinstance(ctypes.c_uint(0).value, int)


def test_a_config_folder_that_cannot_be_entered_does_not_break_the_decision(monkeypatch, tmp_path):
    # HOME of another user in a container: Path.exists() raises PermissionError instead of answering False.
    from pathlib import Path

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "exists", refuse)
    decision = nccl.decide("auto", {}, probe=lambda: gpus.Topology(["NVIDIA L40S"] * 2, False, True, "nvml", ""))
    assert decision.profile == "none" and decision.values == {}


TWO_PCIE = Topology(["NVIDIA L40S"] * 2, nvlink=False, p2p=True, source="nvml")
TWO_NODES = dict(NO_TUNED, SGLANG_PCIE_NNODES="2")


def test_two_gpus_without_nvlink_get_the_advice_and_an_unusable_tuned_file_is_named_in_the_reason(tmp_path):
    decision = decide("auto", NO_TUNED, probe=lambda: TWO_PCIE)
    assert decision.advice == nccl.TUNE_ADVICE.format(count=2)
    assert decision.reason == ("auto: no tune-nccl result for these 2 GPUs (no NVLink between them, peer-to-peer yes):"
                               " NCCL defaults kept")
    broken = tmp_path / "tuned.json"
    broken.write_text("{not json")
    decision = decide("auto", {"SGLANG_PCIE_TUNED_FILE": str(broken)}, probe=lambda: TWO_PCIE)
    assert decision.reason.startswith("auto: no tune-nccl result for these 2 GPUs")
    assert f"NCCL defaults kept; auto: tuned NCCL file {broken} is not valid JSON" in decision.reason
    assert decision.file_error is not None


@pytest.mark.parametrize("requested, reason", [("off", "SGLANG_PCIE_NCCL_PROFILE=off"),
                                               (None, "SGLANG_PCIE_NCCL_PROFILE is invalid: nothing applied")])
def test_off_and_invalid_across_nodes_keep_their_reason_and_say_nothing(requested, reason):
    decision = decide(requested, TWO_NODES, probe=lambda: TWO_PCIE)
    assert decision.reason == reason and decision.advice is None and decision.launch.nodes == 2


def test_across_nodes_an_unusable_tuned_file_is_named_after_why_and_the_advice_asks_for_the_same_settings(tmp_path):
    broken = tmp_path / "tuned.json"
    broken.write_text("{not json")
    decision = decide("tuned", dict(SGLANG_PCIE_TUNED_FILE=str(broken), SGLANG_PCIE_NNODES="2"),
                      probe=lambda: TWO_PCIE)
    why = ("tuned: a launch over 2 nodes (SGLANG_PCIE_NNODES=2, from the launcher): no tune-nccl result measured"
           " across 2 nodes here")
    assert decision.reason.startswith(why)
    assert f"stays off (SGLANG_PCIE_NCCL_PROFILE=tuned: tuned NCCL file {broken} is not valid JSON" in decision.reason
    assert decision.advice.startswith(why) and decision.advice.endswith(
        "stays off; every node must run the same NCCL settings (sglang-pcie compares them when the server starts)")
    plain = decide("auto", TWO_NODES, probe=lambda: TWO_PCIE)
    assert plain.reason.endswith("the PCIe-IPC all-reduce (single-node) stays off")


def test_an_ipc_variable_the_user_set_is_reported_even_with_the_profile_off():
    decision = decide("off", dict(NO_TUNED, SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1"), probe=lambda: TWO_PCIE)
    assert decision.ipc is not None and decision.ipc.on is True and decision.ipc.values == {}
    assert decision.ipc.user_set == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert decide("off", NO_TUNED, probe=lambda: TWO_PCIE).ipc is None


def test_apply_for_process_writes_the_ipc_values_the_node_count_only_across_nodes_and_a_launch_problem(
        monkeypatch, capsys):
    from sglang_pcie.runtime import allreduce, launch

    ipc = allreduce.IpcDecision({"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1", "SGLANG_PCIE_IPC_MAX_NUMEL": "4096"}, {},
                                "measured", True)
    monkeypatch.setattr(allreduce, "decide_ipc", lambda *args, **kwargs: ipc)
    env = dict(NO_TUNED, SGLANG_PCIE_IPC_MAX_NUMEL="1")  # a user IPC variable: the IPC decision is taken
    apply_for_process(load_settings({"SGLANG_PCIE_NCCL_PROFILE": "off"}), env)
    assert env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1" and env["SGLANG_PCIE_IPC_MAX_NUMEL"] == "4096"
    assert launch.NODES_VAR not in env
    monkeypatch.setattr(launch, "detect", lambda argv, environ: launch.Launch(3, "--nnodes 3", 0))
    env = dict(NO_TUNED)
    apply_for_process(load_settings({"SGLANG_PCIE_NCCL_PROFILE": "off"}), env)
    assert env[launch.NODES_VAR] == "3"
    capsys.readouterr()
    monkeypatch.setattr(launch, "detect", lambda argv, environ: launch.Launch(1, "one node", None, "config unreadable"))
    apply_for_process(load_settings({"SGLANG_PCIE_NCCL_PROFILE": "off"}), dict(NO_TUNED))
    assert capsys.readouterr().err == "sglang-pcie: config unreadable\n"


def test_a_folder_where_the_tuned_file_should_be_is_named_in_the_reason(tmp_path):
    decision = decide("auto", {"SGLANG_PCIE_TUNED_FILE": str(tmp_path)}, probe=lambda: TWO_PCIE)
    assert decision.reason.endswith(f"NCCL defaults kept; auto: tuned NCCL file {tmp_path} is a folder, not a regular"
                                    " file")
