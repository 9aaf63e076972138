"""The PCIe-IPC all-reduce switch and the all-reduce report: release x FlashInfer x measurement x user environment,
against the real SGLang release sources (the adapter file is there from 0.5.21, or not)."""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

from sglang_pcie import allreduce_paths, cli, nccl, tuning
from sglang_pcie.allreduce_paths import (ENABLE_VAR, MAX_NUMEL_VAR, FlashinferInstall, decide_ipc, format_report,
                                         report, sglang_install)
from sglang_pcie.nccl import Topology

PCIE4 = Topology(["NVIDIA RTX PRO 6000 Blackwell"] * 4, nvlink=False, p2p=True, source="nvml",
                 uuids=[f"GPU-{i}" for i in range(4)])
PCIE2_P2P = Topology(["NVIDIA RTX PRO 6000 Blackwell"] * 2, nvlink=False, p2p=True, source="nvml")
PCIE2_NO_P2P = Topology(["NVIDIA GeForce RTX 5090"] * 2, nvlink=False, p2p=False, source="nvml")
NVLINK2 = Topology(["NVIDIA H200"] * 2, nvlink=True, p2p=True, source="nvml")
PCIE3 = Topology(["NVIDIA L40S"] * 3, nvlink=False, p2p=True, source="nvml")

FI_NONE = FlashinferInstall(None, False)
FI_OLD = FlashinferInstall("0.6.18", False, "/site/flashinfer")
FI_NEW = FlashinferInstall("0.7.2", True, "/site/flashinfer")
WINS = {"ipc": {"max_tokens": 2, "max_numel": 2 * 7168, "hidden": 7168, "verdict": "beats NCCL up to 2 tok"}}
LOSES = {"ipc": {"max_tokens": None, "max_numel": None,
                 "verdict": "the PCIe-IPC all-reduce is not faster than NCCL beyond the noise at 1 tok"}}
MEASUREMENTS = {"none": None, "loses": dict(LOSES, values={}), "wins": dict(WINS, values={})}
USER_ENVS = {"none": {}, "off": {ENABLE_VAR: "0"}, "numel": {MAX_NUMEL_VAR: "4096"}}


@pytest.fixture(scope="module")
def installs(pristine_source):
    return {v: sglang_install(pristine_source(v)) for v in ("0.5.16", "0.5.21", "0.5.23")}


def test_the_adapter_is_found_in_the_releases_that_have_it(installs):
    assert {v: (i.version, i.has_adapter) for v, i in installs.items()} == {
        "0.5.16": ("0.5.16", False), "0.5.21": ("0.5.21", True), "0.5.23": ("0.5.23", True)}


@pytest.mark.parametrize("release, fi, measured, user", list(itertools.product(
    ("0.5.16", "0.5.21", "0.5.23"), ("none", "old", "new"), MEASUREMENTS, USER_ENVS)))
def test_decision_table(installs, release, fi, measured, user):
    flashinfer = {"none": FI_NONE, "old": FI_OLD, "new": FI_NEW}[fi]
    env = dict(USER_ENVS[user])
    decision = decide_ipc("auto", MEASUREMENTS[measured], PCIE4, env, installs[release], flashinfer)
    switched = release != "0.5.16" and fi == "new" and measured == "wins" and user == "none"
    assert decision.values == ({ENABLE_VAR: "1", MAX_NUMEL_VAR: str(2 * 7168)} if switched else {})
    assert decision.user_set == env
    if user != "none":
        assert "set by the user" in decision.reason
    elif measured == "none":
        assert "no tune-nccl result" in decision.reason
    elif measured == "loses":
        assert "not faster than NCCL" in decision.reason
    elif release == "0.5.16":
        assert "SGLang 0.5.16 has no PCIe-IPC all-reduce adapter (SGLang 0.5.21 adds it)" in decision.reason
    elif fi != "new":
        assert "kernels need flashinfer-python >= 0.7.0" in decision.reason
        assert ("pins 0.6.18" in decision.reason) == (release == "0.5.21")
    else:
        assert decision.on and "up to 2 tokens x 7168" in decision.reason


@pytest.mark.parametrize("topology, on", [(PCIE4, True), (PCIE2_NO_P2P, True), (PCIE2_P2P, False), (NVLINK2, False)])
def test_not_switched_on_where_sglangs_custom_all_reduce_takes_the_reductions_first(installs, topology, on):
    decision = decide_ipc("auto", MEASUREMENTS["wins"], topology, {}, installs["0.5.23"], FI_NEW)
    assert decision.on is on
    if not on:
        assert "custom all-reduce takes these reductions first" in decision.reason


@pytest.mark.parametrize("requested", ["off", "pcie", None])
def test_only_auto_and_tuned_switch_it(installs, requested):
    assert decide_ipc(requested, MEASUREMENTS["wins"], PCIE4, {}, installs["0.5.23"], FI_NEW).values == {}
    assert decide_ipc("tuned", MEASUREMENTS["wins"], PCIE4, {}, installs["0.5.23"], FI_NEW).on


def test_the_install_is_not_looked_at_without_a_winning_measurement(monkeypatch):
    def boom(*args):
        raise AssertionError("probed the install")
    monkeypatch.setattr(allreduce_paths, "sglang_install", boom)
    monkeypatch.setattr(allreduce_paths, "flashinfer_install", boom)
    for measured in ("none", "loses"):
        assert decide_ipc("auto", MEASUREMENTS[measured], PCIE4, {}).values == {}


@pytest.mark.parametrize("topology, eligible", [
    (NVLINK2, True), (PCIE2_P2P, True), (PCIE2_NO_P2P, False), (PCIE4, False), (PCIE3, False),
    (Topology(["A"] * 4, nvlink=True, p2p=True), True), (Topology(["A"] * 2, nvlink=False, p2p=None), None),
])
def test_custom_all_reduce_eligibility_follows_sglangs_rule(topology, eligible):
    assert allreduce_paths.custom_allreduce(topology)[0] is eligible


def test_flashinfer_is_read_from_the_listing_without_importing_it(tmp_path, monkeypatch):
    (tmp_path / "flashinfer" / "comm").mkdir(parents=True)
    (tmp_path / "flashinfer" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "flashinfer_python-0.6.18.dist-info").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("flashinfer", None)
    assert allreduce_paths.flashinfer_install() == FlashinferInstall("0.6.18", False, str(tmp_path / "flashinfer"))
    (tmp_path / "flashinfer" / "comm" / "pcie_ipc_ar.py").write_text("")
    (tmp_path / "flashinfer_python-0.6.18.dist-info").rename(tmp_path / "flashinfer_python-0.7.2.dist-info")
    assert allreduce_paths.flashinfer_install().has_kernels and "flashinfer" not in sys.modules


def decision_with(topology, requested="auto", config=None, ipc=None):
    return nccl.NcclDecision(requested, "none", {}, {}, "auto: test", topology, None, config, ipc)


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


def test_auto_writes_the_ipc_variables_from_a_matching_result(tmp_path, installs, monkeypatch, capsys):
    path = tmp_path / "tuned.json"
    tuning.write_config(path, {"format": tuning.FORMAT, "fingerprint": tuning.fingerprint(PCIE4, {}),
                               "winner": "default", "values": {}, **WINS})
    monkeypatch.setattr(allreduce_paths, "sglang_install", lambda root=None: installs["0.5.23"])
    monkeypatch.setattr(allreduce_paths, "flashinfer_install", lambda: FI_NEW)
    monkeypatch.setattr(nccl, "probe_topology", lambda environ=None: PCIE4)
    env = {tuning.TUNED_FILE_VAR: str(path)}
    from sglang_pcie.settings import load_settings
    nccl.apply_for_process(load_settings({}), env)
    assert env[ENABLE_VAR] == "1" and env[MAX_NUMEL_VAR] == str(2 * 7168) and capsys.readouterr().err == ""
    user = {tuning.TUNED_FILE_VAR: str(path), ENABLE_VAR: "0"}
    nccl.apply_for_process(load_settings({}), user)
    assert user[ENABLE_VAR] == "0" and MAX_NUMEL_VAR not in user


def test_env_without_gpus_says_no_gpu_visible(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(nccl, "_load_nvml", lambda: None)
    monkeypatch.setattr(nccl.shutil, "which", lambda name: None)
    monkeypatch.setenv(tuning.TUNED_FILE_VAR, str(tmp_path / "none.json"))
    for name in (*allreduce_paths.IPC_VARS, "SGLANG_PCIE_NCCL_PROFILE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["env"]) in (0, 2)
    out = capsys.readouterr().out
    assert "GPUs: no GPU visible" in out and "a server started now uses: no all-reduce" in out
    cli.main(["env", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["allreduce"]["server_uses"] == "no all-reduce" and "ipc" not in data  # nothing to decide


def test_the_decision_on_the_2x_h200_measurement(installs):
    # tune-nccl's own result file from the 2 x H200 run (docs/evidence.md): the IPC path won at 1-8 tokens x 7168.
    # There, over NVLink, SGLang's custom all-reduce takes those reductions first, so auto leaves IPC off; the same
    # measurement on a 4-GPU PCIe box would switch it on, sized for decode (8 x 7168), never for prefill.
    measured = json.loads((Path(__file__).parents[1] / "benchmarks/results/2026-11-30-h200x2/session2/"
                           "tune-nccl-ipc.json").read_text())
    assert measured["ipc"]["tune_saved"] > 0 and all(measured["ipc"]["wins"].values())
    there = decide_ipc("auto", measured, NVLINK2, {}, installs["0.5.23"], FI_NEW)
    assert not there.on and there.values == {} and "custom all-reduce takes these reductions first" in there.reason
    pcie = decide_ipc("auto", measured, PCIE4, {}, installs["0.5.23"], FI_NEW)
    assert pcie.values == {ENABLE_VAR: "1", MAX_NUMEL_VAR: "57344"}
    assert "up to 8 tokens x 7168" in pcie.reason
    assert decide_ipc("auto", measured, PCIE4, {}, installs["0.5.16"], FI_NEW).values == {}
