"""`sglang-pcie doctor --facts DIR` over recorded machines: the lent H200 as recorded, and hand-made PCIe boxes
(tests/support/data/host-facts/*/README.md says what each one is). Real parsing, fake world."""
from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from support import SUPPORT

from sglang_pcie.runtime import tuned_file
from sglang_pcie.tools import cli
from sglang_pcie.tools.doctor import gpu_facts
from sglang_pcie.tools.doctor.world import RecordedWorld

FACTS = SUPPORT / "data" / "host-facts"


@pytest.fixture(autouse=True)
def hermetic(monkeypatch, tmp_path):
    """No tuned file, no SGLang cache and no GPU selection from this machine's user."""
    for name in ("CUDA_VISIBLE_DEVICES", "SGLANG_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", "/home/nobody")


def doctor(capsys, facts, *args):
    code = cli.main(["doctor", "--facts", str(FACTS / facts) if "/" not in str(facts) else str(facts), "--json",
                     *args])
    data = json.loads(capsys.readouterr().out)
    assert data["exit"] == code
    return code, data["findings"]


def only(findings, fid):
    found = [f for f in findings if f["id"] == fid]
    assert len(found) == 1, (fid, [f["id"] for f in findings])
    return found[0]


def severities(findings):
    return {f["id"]: f["severity"] for f in findings}


def test_the_recorded_h200_says_what_a_1_gpu_vm_shows(capsys):
    code, found = doctor(capsys, "h200-1gpu")
    seen = severities(found)
    assert code == 0
    assert seen["host.iommu"] == "ok" and "/sys/class/iommu is empty" in only(found, "host.iommu")["what"]
    assert seen["host.link"] == "ok" and "Gen5 x16" in only(found, "host.link")["what"]
    assert seen["host.bar1"] == "ok" and "BAR1 256 GiB" in only(found, "host.bar1")["what"]
    assert seen["host.numa"] == "ok" and seen["host.vm"] == "info" and "KVM" in only(found, "host.vm")["what"]
    # what was not recorded there is said so, never guessed
    assert seen["p2p.copy"] == "not-visible" and "not in this recording" in only(found, "p2p.copy")["what"]
    assert "no such file" in only(found, "host.driver")["what"]
    assert seen["net.nics"] == "not-visible"
    assert only(found, "plan.allreduce")["what"].startswith("a server started now with --tp 1 uses: no all-reduce")
    assert "host.acs" not in seen and "p2p.nvml" not in seen  # one GPU: no pair to judge


def test_eight_gpus_over_two_sockets(capsys):
    code, found = doctor(capsys, "pcie-8gpu-2socket")
    seen = severities(found)
    assert code == 1 and [f["id"] for f in found if f["severity"] == "warning"] == ["host.numa"]
    numa = only(found, "host.numa")["what"]
    assert "spans 2 CPU sockets (GPU 0,1,2,3 on socket 0; GPU 4,5,6,7 on socket 1)" in numa
    assert "56 ordered pairs" in only(found, "p2p.copy")["what"] and seen["p2p.nvml"] == "ok"
    assert "39.2-54.1 GB/s" in only(found, "p2p.copy")["what"]
    assert seen["host.iommu"] == "ok" and "identity for GPU 0, 1, 2, 3, 4, 5, 6, 7" in only(found, "host.iommu")["what"]
    assert seen["host.acs"] == "ok" and seen["net.gdr"] == "ok"
    assert only(found, "net.nic-distance")["severity"] == "info"  # one node: the network is information
    assert "sglang-pcie tune-nccl" in only(found, "plan.next")["what"]


def test_a_tp_group_inside_one_socket_is_fine(capsys):
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--tp", "4")
    assert code == 0 and only(found, "host.numa")["severity"] == "ok"
    assert "12 ordered pairs" in only(found, "p2p.copy")["what"]
    assert "the first 4 of 8 visible (--tp)" in only(found, "gpu.inventory")["what"]


def test_two_nodes_make_the_network_weigh(capsys):
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--tp", "4", "--nodes", "2")
    far = only(found, "net.nic-distance")
    assert code == 1 and far["severity"] == "warning" and "GPU 1 (NODE)" in far["what"]


def test_iommu_acs_downtrained_link_and_a_hanging_copy(capsys):
    code, found = doctor(capsys, "pcie-4gpu-iommu-acs")
    seen = severities(found)
    assert code == 3
    hang = only(found, "p2p.hang")
    assert hang["severity"] == "failure" and "during GPU 0 -> GPU 1 (copy-engine)" in hang["what"]
    assert "NCCL_P2P_DISABLE=1" in hang["fix"]
    assert seen["host.iommu"] == "warning" and "DMA-FQ for GPU 0, 1, 2, 3" in only(found, "host.iommu")["what"]
    acs = only(found, "host.acs")
    assert acs["severity"] == "warning" and "0000:40:01.1 (ReqRedir+ CmpltRedir+)" in acs["what"]
    assert "0000:c0:01.1" not in acs["what"] and "pci=disable_acs_redir=0000:40:01.1;0000:60:01.1" in acs["fix"]
    width = only(found, "host.link-width")
    assert width["severity"] == "warning" and width["what"].startswith("GPU 3 (0000:e1:00.0) negotiated PCIe x8 of")
    assert seen["host.link-speed"] == "info" and "GPU 2 (0000:c1:00.0) Gen1 (max Gen5)" in only(
        found, "host.link-speed")["what"]
    assert "fix the failures above" in only(found, "plan.next")["what"]


def test_a_corrupting_pair_on_a_patched_p2p_driver(capsys, monkeypatch):
    monkeypatch.setenv("HOME", "/home/user")  # the fixture holds SGLang's P2P cache under home/user
    code, found = doctor(capsys, "geforce-2gpu-patched-p2p")
    assert code == 3
    corrupt = only(found, "p2p.corrupt")
    assert corrupt["what"].startswith("GPU 0 -> GPU 1: data came back wrong (SM stores into the peer: 4,194,304 of "
                                      "16,777,216 words wrong")
    assert "do not start a TP server on these GPUs with P2P on" in corrupt["what"]
    assert only(found, "p2p.patched-driver")["severity"] == "warning"
    cache = only(found, "p2p.sglang-cache")
    assert cache["severity"] == "warning" and "0->1" in cache["what"] and "1->0" not in cache["what"]
    plan = only(found, "plan.allreduce")
    assert plan["severity"] == "warning" and "--disable-custom-all-reduce" in plan["fix"]
    assert "p2p.slow" not in severities(found)  # x8 links: 12.9 GB/s is most of what they carry


def test_blocked_p2p_small_bar1_and_no_root(capsys, monkeypatch):
    code, found = doctor(capsys, "pcie-2gpu-p2p-blocked")
    seen = severities(found)
    assert code == 1 and "failure" not in seen.values()
    assert seen["p2p.nvml"] == "warning" and "GPU 0-1 CNS (chipset not supported)" in only(found, "p2p.nvml")["what"]
    assert "2 pair(s) without peer access, copied through the host" in only(found, "p2p.copy")["what"]
    assert seen["host.bar1"] == "warning" and "256 MiB" in only(found, "host.bar1")["what"]
    assert seen["host.acs"] == "not-visible" and "without root" in only(found, "host.acs")["what"]
    assert seen["host.iommu"] == "warning" and "not visible" in only(found, "host.iommu")["what"]
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    code, found = doctor(capsys, "pcie-2gpu-p2p-blocked")
    switch = only(found, "plan.nccl-p2p-disable")
    assert switch["severity"] == "info" and "do not read this switch" in switch["what"]


def test_nccl_p2p_disable_on_a_healthy_box_costs_bandwidth(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--tp", "4")
    assert code == 1 and only(found, "plan.nccl-p2p-disable")["severity"] == "warning"


def test_no_p2p_test_skips_the_copy_check(capsys):
    code, found = doctor(capsys, "pcie-4gpu-iommu-acs", "--no-p2p-test")
    assert code == 1 and only(found, "p2p.copy")["severity"] == "info" and "p2p.hang" not in severities(found)
    assert "run without --no-p2p-test" in only(found, "host.link-speed")["what"]


def test_cuda_visible_devices_picks_the_gpus_and_the_recording_of_other_gpus_is_not_used(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    code, found = doctor(capsys, "pcie-8gpu-2socket")
    assert "(4 hidden by CUDA_VISIBLE_DEVICES)" in only(found, "gpu.inventory")["what"]
    assert only(found, "host.numa")["what"].startswith("all 4 GPU(s) on socket 1")
    assert only(found, "p2p.copy")["severity"] == "not-visible"


def test_nccl_socket_and_hca_selections(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth")
    code, found = doctor(capsys, "pcie-4gpu-iommu-acs", "--no-p2p-test")
    socket = only(found, "net.nccl-socket")
    assert socket["severity"] == "failure" and "matches no interface here (enp5s0, lo)" in socket["what"]
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "^docker,lo")
    monkeypatch.setenv("NCCL_IB_HCA", "=mlx5_1:1")
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--no-p2p-test")
    assert only(found, "net.nccl-socket")["what"] == "NCCL_SOCKET_IFNAME=^docker,lo selects eno1, ibp193s0, ibp65s0"
    assert only(found, "net.nccl-ib")["what"] == "NCCL_IB_HCA==mlx5_1:1 selects mlx5_1"
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_9")
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--no-p2p-test")
    assert only(found, "net.nccl-ib")["severity"] == "warning"


def test_sm120_fusion_at_tp4_and_above_names_the_upstream_regression(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_SM120_FUSION", "1")
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--tp", "4")
    fusion = only(found, "plan.sm120-fusion")
    assert code == 1 and fusion["severity"] == "warning" and "#32330" in fusion["what"]
    assert "sglang-pcie bench" in fusion["fix"] and "--tp 4" in fusion["fix"]
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--tp", "2")
    assert only(found, "plan.sm120-fusion")["severity"] == "info"
    code, found = doctor(capsys, "h200-1gpu")
    assert "no effect on these GPUs (Hopper)" in only(found, "plan.sm120-fusion")["what"]


def _tuned_file_for(folder, path, uuids=None):
    facts = gpu_facts.read_gpus(RecordedWorld(folder), None)
    topology = facts.topology(facts.visible)
    fingerprint = tuned_file.fingerprint(topology, {})
    if uuids:
        fingerprint["gpu_uuids"] = uuids
    tuned_file.write_config(path, {"format": tuned_file.FORMAT, "fingerprint": fingerprint, "winner": "default",
                                   "values": {}})


def test_a_tuned_result_that_matches_and_one_that_no_longer_does(capsys, tmp_path):
    path = tmp_path / "config" / "sglang-pcie" / "nccl-tuned.json"
    _tuned_file_for(FACTS / "pcie-8gpu-2socket", path)
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--tp", "4")
    assert only(found, "plan.tuned")["severity"] == "ok" and "start the server" in only(found, "plan.next")["what"]
    _tuned_file_for(FACTS / "pcie-8gpu-2socket", path, uuids=["GPU-elsewhere"] * 8)
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--tp", "4")
    tuned = only(found, "plan.tuned")
    assert code == 1 and tuned["severity"] == "warning" and "no longer matches" in tuned["what"]


def test_a_bad_setting_is_a_warning_line(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "fastest")
    code, found = doctor(capsys, "h200-1gpu")
    assert code == 1 and "SGLANG_PCIE_NCCL_PROFILE='fastest'" in only(found, "plan.settings")["what"]


def test_torch_built_for_a_newer_cuda_than_the_driver_is_a_failure(capsys, tmp_path):
    box = tmp_path / "box"
    shutil.copytree(FACTS / "pcie-2gpu-p2p-blocked", box)
    check = box / "commands" / "p2p-copy-check.txt"
    check.write_text(check.read_text().replace('"2.8.0+cu128", "cuda": "12.8"', '"2.11.0+cu130", "cuda": "13.0"'))
    code, found = doctor(capsys, box)
    cuda = only(found, "host.cuda")
    assert code == 3 and "torch is built for CUDA 13.0, the driver supports up to CUDA 12.8" in cuda["what"]


def test_no_gpu(capsys, tmp_path):
    (tmp_path / "commands.json").write_text(json.dumps({"nvidia-smi -q": {"missing": True}}))
    code, found = doctor(capsys, tmp_path)
    assert code == 0 and only(found, "gpu.inventory")["what"].startswith("no GPU visible: `nvidia-smi -q` not available")
    assert not [f for f in found if f["id"].startswith(("p2p.", "plan."))]


def test_the_table_one_line_per_finding_and_the_exit_status(capsys):
    code = cli.main(["doctor", "--facts", str(FACTS / "pcie-4gpu-iommu-acs")])
    lines = capsys.readouterr().out.splitlines()
    assert code == 3 and lines[0].startswith("(recorded machine:") and "== peer-to-peer" in lines
    hang = [line for line in lines if " p2p.hang " in line]
    assert len(hang) == 1 and hang[0].startswith("failure     p2p.hang") and " Fix: " in hang[0]
    assert hang[0].endswith("[P2P copy check]")
    assert lines[-2].startswith("doctor: ") and lines[-2].endswith("exit 3") and lines[-1].startswith("probes: gpus")


def test_bad_usage_exits_2_with_one_line(capsys, tmp_path):
    assert cli.main(["doctor", "--facts", str(FACTS / "pcie-8gpu-2socket"), "--tp", "9"]) == 2
    assert capsys.readouterr().err.strip() == "sglang-pcie doctor: error: --tp 9: only 8 GPU(s) visible here"
    assert cli.main(["doctor", "--facts", str(tmp_path / "nowhere")]) == 2
    assert cli.main(["doctor", "--p2p-timeout", "0"]) == 2
    assert cli.main(["doctor", "--facts", str(tmp_path), "--record", str(tmp_path)]) == 2
    capsys.readouterr()
    assert cli.main(["doctor", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "0 nothing wrong" in help_text and "1 at least one warning" in help_text and "2 bad usage" in help_text
    assert "3 at least one failure" in help_text


def test_the_hand_made_fixtures_are_what_their_script_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_handmade", FACTS / "make_handmade.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    make.OUT_ROOT = tmp_path
    for box in make.BOXES:
        box()
    for folder in tmp_path.iterdir():
        written = sorted(p.relative_to(tmp_path) for p in folder.rglob("*") if p.is_file())
        committed = sorted(p.relative_to(FACTS) for p in (FACTS / folder.name).rglob("*") if p.is_file())
        assert written == committed
        assert all((tmp_path / p).read_bytes() == (FACTS / p).read_bytes() for p in written), folder.name


def _copy(tmp_path, name):
    box = tmp_path / name
    shutil.copytree(FACTS / name, box)
    return box


def test_a_slow_slot_and_a_link_that_stays_slow_under_load(capsys, tmp_path):
    box = _copy(tmp_path, "pcie-8gpu-2socket")
    query = box / "commands" / "nvidia-smi-q.txt"
    text = query.read_text()
    query.write_text(text.replace("Host Max                               : 5", "Host Max                               : 4", 1))
    check = box / "commands" / "p2p-copy-check-4.txt"
    check.write_text(check.read_text().replace('"0": {"current_link_speed": "32.0 GT/s PCIe"',
                                               '"0": {"current_link_speed": "8.0 GT/s PCIe"'))  # every reading
    code, found = doctor(capsys, box, "--tp", "4")
    assert code == 1
    assert only(found, "host.link-slot")["what"].startswith("GPU 0 (0000:01:00.0) sits in a Gen4 slot")
    loaded = only(found, "p2p.link-under-load")
    assert "GPU 0 (0000:01:00.0) at Gen3 x16 (its maximum Gen5)" in loaded["what"]


@pytest.mark.parametrize("events, rc, fid, severity, said", [
    ([{"event": "start", "capabilities": ["12.0"] * 4}, {"event": "begin", "pair": [2, 3], "method": "sm-read"},
      {"event": "error", "kind": "cuda", "pair": [2, 3], "method": "sm-read",
       "message": "CudaError: cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS (700)"}],
     1, "p2p.error", "failure", "during GPU 2 -> GPU 3 (sm-read): CudaError"),
    ([{"event": "start"}, {"event": "error", "kind": "cuda", "pair": [0, 1], "method": "copy-engine",
                           "message": "OutOfMemoryError: CUDA out of memory."}],
     1, "p2p.copy", "not-visible", "out of memory"),
    ([{"event": "error", "kind": "no-torch", "message": "torch not importable: ModuleNotFoundError"}],
     0, "p2p.copy", "not-visible", "copy check not run: torch not importable"),
    ([{"event": "error", "kind": "mapping", "message": "GPU GPU-x is not among the 2 CUDA devices"}],
     1, "p2p.copy", "not-visible", "not among"),
    ([{"event": "start"}, {"event": "begin", "pair": [1, 0], "method": "sm-write"}],
     -11, "p2p.crash", "warning", "exited with -11 during GPU 1 -> GPU 0 (sm-write)"),
])
def test_how_a_copy_check_that_stopped_reads(capsys, tmp_path, events, rc, fid, severity, said):
    box = _copy(tmp_path, "pcie-4gpu-iommu-acs")
    (box / "commands" / "p2p-copy-check.txt").write_text(
        "".join("doctor-p2p " + json.dumps(e) + "\n" for e in events))
    commands = json.loads((box / "commands.json").read_text())
    commands["p2p-copy-check GPU 0,1,2,3"].update(rc=rc, timed_out=False)
    (box / "commands.json").write_text(json.dumps(commands))
    code, found = doctor(capsys, box)
    finding = only(found, fid)
    assert finding["severity"] == severity and said in finding["what"]
    assert "p2p.hang" not in severities(found)


def test_the_one_shot_all_reduce_switched_on_by_hand_across_sockets(capsys, monkeypatch):
    from pathlib import Path

    from sglang_pcie.runtime import allreduce

    monkeypatch.setattr(allreduce, "sglang_install", lambda root=None: allreduce.SglangInstall(Path("/s"), "0.5.23", True))
    monkeypatch.setattr(allreduce, "flashinfer_install", lambda: allreduce.FlashinferInstall("0.7.2", True, "/fi"))
    monkeypatch.setenv("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "1")
    code, found = doctor(capsys, "pcie-8gpu-2socket")
    assert only(found, "plan.allreduce")["what"].startswith("a server started now with --tp 8 uses: PCIe-IPC")
    assert only(found, "plan.ipc-sockets")["severity"] == "warning"
    code, found = doctor(capsys, "pcie-8gpu-2socket", "--tp", "4")
    assert "plan.ipc-sockets" not in severities(found)
