"""The PCIe-IPC all-reduce switch: release x FlashInfer x measurement x user environment, against the real SGLang
release sources (the adapter file is there from 0.5.21, or not)."""
from __future__ import annotations

import itertools
import json
import sys

import pytest

from support import REPO

from sglang_pcie.runtime import gpus
from sglang_pcie.runtime import allreduce as allreduce_paths
from sglang_pcie.runtime import nccl
from sglang_pcie.runtime import tuned_file as tuning
from sglang_pcie.runtime.allreduce import ENABLE_VAR, MAX_NUMEL_VAR, FlashinferInstall, decide_ipc, sglang_install
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


def test_custom_all_reduce_says_why_in_words():
    one = Topology(["NVIDIA H200"], nvlink=None, p2p=None, source="nvml")
    assert allreduce_paths.custom_allreduce(one) == (False, "no all-reduce with one GPU")
    assert allreduce_paths.custom_allreduce(PCIE2_P2P) == (
        True, "2 GPUs, peer-to-peer over PCIe (2 GPUs): SGLang runs it first for reductions up to 8 MiB")
    assert allreduce_paths.custom_allreduce(NVLINK2, world=1)[0] is False
    assert allreduce_paths.custom_allreduce(PCIE3)[1] == "world size 3 is not one it supports (2, 4, 6, 8)"


def test_missing_kernels_name_the_flashinfer_an_sglang_release_pins_only_where_it_lacks_them(monkeypatch):
    def sglang(version):
        return allreduce_paths.SglangInstall(REPO, version, True)
    old = allreduce_paths.kernels_missing(sglang("0.5.21"), FI_OLD)
    assert old == ("FlashInfer 0.6.18 lacks the kernels (the PCIe-IPC kernels need flashinfer-python >= 0.7.0;"
                   " SGLang 0.5.21 pins 0.6.18, which lacks them; switched on, SGLang's adapter would log a warning"
                   " and stay on NCCL)")
    assert "pins" not in allreduce_paths.kernels_missing(sglang("0.5.22"), FI_OLD)  # it pins 0.7.1: has them
    assert allreduce_paths.kernels_missing(sglang("0.5.22"), FI_NONE).startswith("FlashInfer is not installed")
    assert allreduce_paths.kernels_missing(sglang("0.5.23"), FI_NEW) is None
    monkeypatch.setitem(allreduce_paths.FLASHINFER_PINS, "9.9", allreduce_paths.FLASHINFER_MIN)  # pins the first
    assert "pins" not in allreduce_paths.kernels_missing(sglang("9.9"), FI_OLD)  # release with them: no note


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


def test_auto_writes_the_ipc_variables_from_a_matching_result(tmp_path, installs, monkeypatch, capsys):
    path = tmp_path / "tuned.json"
    tuning.write_config(path, {"format": tuning.FORMAT, "fingerprint": tuning.fingerprint(PCIE4, {}),
                               "winner": "default", "values": {}, **WINS})
    monkeypatch.setattr(allreduce_paths, "sglang_install", lambda root=None: installs["0.5.23"])
    monkeypatch.setattr(allreduce_paths, "flashinfer_install", lambda: FI_NEW)
    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: PCIE4)
    env = {tuning.TUNED_FILE_VAR: str(path)}
    from sglang_pcie.runtime.settings import load_settings
    nccl.apply_for_process(load_settings({}), env)
    assert env[ENABLE_VAR] == "1" and env[MAX_NUMEL_VAR] == str(2 * 7168) and capsys.readouterr().err == ""
    user = {tuning.TUNED_FILE_VAR: str(path), ENABLE_VAR: "0"}
    nccl.apply_for_process(load_settings({}), user)
    assert user[ENABLE_VAR] == "0" and MAX_NUMEL_VAR not in user

def test_the_decision_on_the_2x_h200_measurement(installs):
    # tune-nccl's own result file from the 2 x H200 run (docs/evidence.md): the IPC path won at 1-8 tokens x 7168.
    # There, over NVLink, SGLang's custom all-reduce takes those reductions first, so auto leaves IPC off; the same
    # measurement on a 4-GPU PCIe box would switch it on, sized for decode (8 x 7168), never for prefill.
    measured = json.loads((REPO / "benchmarks/results/2026-11-30-h200x2/session2/"
                           "tune-nccl-ipc.json").read_text())
    assert measured["ipc"]["tune_saved"] > 0 and all(measured["ipc"]["wins"].values())
    there = decide_ipc("auto", measured, NVLINK2, {}, installs["0.5.23"], FI_NEW)
    assert not there.on and there.values == {} and "custom all-reduce takes these reductions first" in there.reason
    pcie = decide_ipc("auto", measured, PCIE4, {}, installs["0.5.23"], FI_NEW)
    assert pcie.values == {ENABLE_VAR: "1", MAX_NUMEL_VAR: "57344"}
    assert "up to 8 tokens x 7168" in pcie.reason
    assert decide_ipc("auto", measured, PCIE4, {}, installs["0.5.16"], FI_NEW).values == {}


@pytest.mark.parametrize("installed", ["0.7.4", None])
def test_a_measurement_of_other_flashinfer_kernels_keeps_ipc_off_and_says_rerun_once(installs, tmp_path, monkeypatch,
                                                                                    capsys, installed):
    # FlashInfer 0.7.4 changed the PCIe-IPC autotune cache format and keys: a 0.7.2 measurement is of other kernels.
    newer = FlashinferInstall(installed, True, "/site/flashinfer") if installed else FI_NEW
    if installed is None:
        newer = FlashinferInstall("0.7.2.post1", True, "/site/flashinfer")
    decision = decide_ipc("auto", MEASUREMENTS["wins"], PCIE4, {}, installs["0.5.23"], newer)
    assert decision.values == {} and not decision.on
    assert "measured the PCIe-IPC all-reduce with FlashInfer 0.7.2" in decision.reason
    assert "re-run sglang-pcie tune-nccl" in decision.advice
