"""One rank's PCIe-IPC measurement, the real code on CPU: gloo, torch.cuda stand-ins, and a FlashInfer workspace
stand-in that enforces the collective contract of PcieIpcAllReduceWorkspace (tests/support/ipc_fake_worker.py)."""
from __future__ import annotations

import os

from sglang_pcie.tools.tune_nccl.launch import run_profile

from support import SUPPORT

IPC_SPEC = {"backend": "nccl", "path": "pcie-ipc", "tokens": [1, 2, 4], "hidden": 16, "dtype": "bf16",
            "allreduces": 3, "tune": True, "max_numel": 4 * 16, "tune_batches": [1, 2, 4]}


def run_fake_ipc(torch_python, spec, env=None):
    command = [str(torch_python), str(SUPPORT / "ipc_fake_worker.py")]
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        return run_profile({}, spec, 2, 300, command)
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_ipc_worker_keeps_the_collective_contract_and_checks_sums(torch_python):
    outcome = run_fake_ipc(torch_python, IPC_SPEC)
    assert outcome.error is None and sorted(outcome.us) == [1, 2, 4] and all(v > 0 for v in outcome.us.values())
    calls = [c[0] for c in outcome.info["calls"]]
    assert calls == ["jit", "jit", "init", "tune", "prepare", "destroy"]
    assert outcome.info["calls"][2] == ["init", 64, [1, 2, 4], "/stand-in/autotune/pcie_ipc_all_reduce_ws2.json"]
    assert outcome.info["tuned_shapes"] == 3 and outcome.info["flashinfer"] == "0.7.2-stand-in"


def test_ipc_worker_reports_sizes_beyond_the_workspace_as_refused(torch_python):
    outcome = run_fake_ipc(torch_python, dict(IPC_SPEC, max_numel=2 * 16, tune=False))
    assert outcome.error is None and outcome.us[4] is None and outcome.us[2] > 0
    # No tune(): only the kernels' module is loaded, not the autotuner's delay kernel.
    assert outcome.info["calls"][:2] == [["jit", "pcie_ipc_comm"], ["init", 32, [1, 2, 4], outcome.info["tune_cache"]]]
    assert [c[0] for c in outcome.info["calls"]] == ["jit", "init", "prepare", "destroy"]


# The second 2 x H200 run: both ranks built FlashInfer's trtllm_utils inside tune() at once, and a rank polled its
# JIT file lock while its peer waited in the autotuner's timing all-reduce. The worker now loads every JIT module
# tune() needs before any FlashInfer collective, one rank at a time.

def test_ipc_worker_loads_the_jit_modules_one_rank_at_a_time_before_any_collective(torch_python, tmp_path):
    log = tmp_path / "jit.log"
    outcome = run_fake_ipc(torch_python, IPC_SPEC, {"FAKE_IPC_JIT_LOG": str(log)})
    assert outcome.error is None
    # Each load takes 0.2 s: ranks loading at the same time would interleave here.
    assert log.read_text().splitlines() == [f"{rank} {name} {what}" for rank in ("0", "1")
                                            for name in ("pcie_ipc_comm", "trtllm_utils") for what in ("start", "end")]
    assert outcome.info["calls"][:3] == [["jit", "pcie_ipc_comm"], ["jit", "trtllm_utils"],
                                         ["init", 64, [1, 2, 4], outcome.info["tune_cache"]]]


def test_an_autotuner_delay_kernel_that_cannot_be_built_fails_the_run_before_tune(torch_python, tmp_path):
    log = tmp_path / "jit.log"
    outcome = run_fake_ipc(torch_python, IPC_SPEC, {"FAKE_IPC_JIT_FAIL": "trtllm_utils", "FAKE_IPC_JIT_LOG": str(log)})
    assert outcome.us is None and outcome.error.startswith(
        "rank 0: RuntimeError: FlashInfer's autotuner cannot load its JIT module trtllm_utils"), outcome.error
    assert "ninja: error: '/tmp/fi/flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/delayStream.cu'" in (
        outcome.error)
    # Rank 1 never started its turn: it waited at the barrier until rank 0's failure ended the run.
    assert log.read_text().splitlines() == ["0 pcie_ipc_comm start", "0 pcie_ipc_comm end", "0 trtllm_utils start",
                                            "0 trtllm_utils failed"]


def test_a_tune_that_saves_no_configuration_fails_the_run(torch_python, tmp_path):
    env = {"FLASHINFER_AUTOTUNE_DIR": str(tmp_path / "autotune")}
    outcome = run_fake_ipc(torch_python, IPC_SPEC, env)
    assert outcome.error is None and outcome.info["tune_saved"] == 3
    outcome = run_fake_ipc(torch_python, IPC_SPEC, dict(env, FAKE_IPC_TUNE_SAVES_NOTHING="1"))
    assert outcome.us is None and "tune() saved no configuration to " in outcome.error, outcome.error
    assert str(tmp_path / "autotune" / "pcie_ipc_all_reduce_ws2.json") in outcome.error


def test_ipc_worker_catches_wrong_sums(torch_python):
    outcome = run_fake_ipc(torch_python, IPC_SPEC, {"FAKE_IPC_BROKEN": "1"})
    assert outcome.us is None and "wrong sums after eager all-reduce at 1 tokens (3 of 3 buffers)" in outcome.error
