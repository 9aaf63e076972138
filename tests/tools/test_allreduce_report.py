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


# ------------------------------------------------------------------------------------------------------------
# Each line of the report, pinned: which paths are listed for how many GPUs, what each says is missing, the figure
# the PCIe-IPC line names, and where the SGLang it describes came from.

IPC_ON = allreduce_paths.IpcDecision({}, {}, "tune-nccl measured it faster", on=True)


def ipc_report(monkeypatch, pristine_source, topology, ipc=IPC_ON, release="0.5.23", fi=FI_NEW, **decision):
    monkeypatch.setattr(allreduce_paths, "flashinfer_install", lambda: fi)
    fields = dict(dict(requested="auto", profile="none", values={}, user_set={}, reason="auto: test"), **decision)
    made = nccl.NcclDecision(fields["requested"], fields["profile"], fields["values"], fields["user_set"],
                             fields["reason"], topology, None, None, ipc)
    return report(made, pristine_source(release) if release else None)


def test_one_gpu_lists_no_custom_path_assumes_nothing_and_keeps_the_ipc_path_off(monkeypatch, pristine_source):
    one = Topology(["NVIDIA H200"], None, None, "nvml", "1 GPU(s)")
    rep = ipc_report(monkeypatch, pristine_source, one)
    assert [p["path"] for p in rep["paths"]] == ["PCIe-IPC all-reduce (FlashInfer)", "NCCL"]
    assert rep["paths"][0]["on"] is False and rep["paths"][0]["available"] is True  # switched on, but one GPU
    assert (rep["server_uses"], rep["why"]) == ("no all-reduce", "one GPU visible") and "assumes" not in rep
    assert format_report(rep)[-1] == "  a server started now uses: no all-reduce. Why: one GPU visible"


def test_no_gpu_says_why_from_the_probe(monkeypatch, pristine_source):
    rep = ipc_report(monkeypatch, pristine_source, Topology(detail="no NVIDIA driver, or it lists none"))
    assert (rep["server_uses"], rep["why"]) == ("no all-reduce", "no GPU visible: no NVIDIA driver, or it lists none")


def test_a_world_the_ipc_kernels_do_not_support_keeps_it_off_and_says_so(monkeypatch, pristine_source):
    rep = ipc_report(monkeypatch, pristine_source, PCIE3)  # 3 GPUs: the kernels know 2, 4 and 8 ranks
    ipc = rep["paths"][1]
    assert ipc["available"] is True and ipc["on"] is False
    assert ipc["detail"].endswith("on: tune-nccl measured it faster; its kernels do not support 3 ranks (2, 4, 8)")
    assert rep["server_uses"] == "NCCL for every reduction" and rep["assumes"] == "tensor parallelism over all 3 visible GPUs"
    assert "its kernels do not support" not in ipc_report(monkeypatch, pristine_source, PCIE4)["paths"][1]["detail"]


@pytest.mark.parametrize("values, user_set, named", [
    ({MAX_NUMEL_VAR: "14336"}, {}, "14336"),
    ({}, {MAX_NUMEL_VAR: "4096"}, "4096"),  # the user's value, where the overlay wrote none
    ({MAX_NUMEL_VAR: "14336"}, {MAX_NUMEL_VAR: "4096"}, "14336"),
    ({}, {}, "SGLang's decode width x hidden"),
])
def test_the_ipc_bound_named_is_the_written_value_else_the_users_else_sglangs(monkeypatch, pristine_source, values,
                                                                              user_set, named):
    ipc = allreduce_paths.IpcDecision(values, user_set, "measured", on=True)
    rep = ipc_report(monkeypatch, pristine_source, PCIE4, ipc=ipc)
    assert rep["server_uses"] == f"PCIe-IPC all-reduce for bf16 reductions up to {named} elements, NCCL above"
    assert rep["why"] == "custom all-reduce: 4 GPUs without NVLink between all of them (it needs NVLink above 2 GPUs);" \
                         " PCIe-IPC: measured"


def test_the_nccl_line_names_the_profile_and_every_value_it_sets_or_keeps(monkeypatch, pristine_source):
    rep = ipc_report(monkeypatch, pristine_source, PCIE2_NO_P2P, profile="tuned", values={"NCCL_PROTO": "LL"},
                     user_set={"NCCL_ALGO": "Ring"})
    assert rep["paths"][-1] == {"path": "NCCL", "available": True,
                                "detail": "profile tuned: NCCL_PROTO=LL NCCL_ALGO=Ring (every reduction the others"
                                          " leave)"}
    plain = ipc_report(monkeypatch, pristine_source, PCIE2_NO_P2P)
    assert plain["paths"][-1]["detail"] == "its defaults (every reduction the others leave)"


def test_without_sglang_the_ipc_line_names_only_that(monkeypatch):
    """No SGLang here (the tests' own python): not available, and no FlashInfer clause (a release without the
    adapter gets one: test_report_says_what_is_missing_per_release)."""
    monkeypatch.setattr(allreduce_paths, "flashinfer_install", lambda: FI_NONE)
    monkeypatch.setattr(allreduce_paths, "sglang_install", lambda root=None: allreduce_paths.SglangInstall(None, None,
                                                                                                          False))
    rep = report(decision_with(PCIE2_P2P))
    assert rep["paths"][1]["detail"] == "not available: SGLang is not installed here" and not rep["paths"][1]["on"]
    assert rep["server_uses"] == "custom all-reduce up to 8 MiB, NCCL above"  # 2 GPUs with peer-to-peer
    head = format_report(rep)[0]
    assert head == ("All-reduce paths (2 GPU(s); NVLink no; peer-to-peer yes; SGLang not installed; FlashInfer not"
                    " installed):")
    assert "sglang_from" not in rep


def test_an_adapterless_release_also_names_the_flashinfer_it_would_need(monkeypatch, pristine_source):
    rep = ipc_report(monkeypatch, pristine_source, PCIE4, release="0.5.16")
    assert rep["paths"][1]["detail"] == ("not available: SGLang 0.5.16 has no PCIe-IPC all-reduce adapter (SGLang"
                                         " 0.5.21 adds it), and FlashInfer >= 0.7.0 for its kernels")
    assert rep["paths"][1]["available"] is False and rep["paths"][1]["on"] is False
    assert rep["why"].endswith("PCIe-IPC off: SGLang 0.5.16 has no PCIe-IPC all-reduce adapter (SGLang 0.5.21 adds"
                               " it)")


def test_a_release_checked_elsewhere_is_said_to_be_that_not_this_machines(monkeypatch, pristine_source):
    monkeypatch.setattr(allreduce_paths, "flashinfer_install", lambda: FI_NEW)
    source = pristine_source("0.5.23")
    elsewhere = report(decision_with(PCIE2_NO_P2P), source, elsewhere=True)
    assert elsewhere["sglang_from"] == str(source)
    assert format_report(elsewhere)[0] == (
        f"All-reduce paths (this machine: 2 GPU(s); NVLink no; peer-to-peer no; FlashInfer 0.7.2. SGLang 0.5.23 from"
        f" {source}, the release checked, not this machine's install):")
    here = report(decision_with(PCIE2_NO_P2P), source)
    assert "sglang_from" not in here and format_report(here)[0].startswith("All-reduce paths (2 GPU(s);")
