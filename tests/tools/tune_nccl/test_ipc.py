"""The PCIe-IPC all-reduce in tune-nccl: where it is measured, how it is judged against NCCL, the tune() for the
server's workspace; with the scripted fake worker and with the real IPC worker on CPU
(tests/support/ipc_fake_worker.py)."""
from __future__ import annotations

import json
import os

import pytest

from sglang_pcie.tools.cli import main as cli_main
from sglang_pcie.tools.tune_nccl import ipc as tune_ipc

from support import SUPPORT


def tune_nccl_main(argv: list) -> int:
    return cli_main(["tune-nccl", *argv])


def parse_tune_nccl(argv: list):
    from sglang_pcie.tools import cli

    return cli.build_parser().parse_args(["tune-nccl", *argv])


def run_ipc_sweep(command, out, *extra):
    return tune_nccl_main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2,4,8", "--prefill-tokens", "64",
                           "--hidden", "16", "--profiles", "proto-LL", "--ipc", "on", "--out", str(out), *extra])


def test_the_ipc_path_is_measured_next_to_nccl_and_tuned_for_the_servers_workspace(fake_worker, isolated,
                                                                                   monkeypatch, capsys):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_IPC_FAST", "2")  # faster than NCCL at 1 and 2 tokens only
    assert run_ipc_sweep(command, isolated) == 0, capsys.readouterr().err
    ipc = json.loads(isolated.read_text())["ipc"]
    assert ipc["wins"] == {"1": True, "2": True, "4": False, "8": False}
    assert ipc["max_tokens"] == 2 and ipc["max_numel"] == 2 * 16 and ipc["flashinfer"] == "0.7.2"
    assert ipc["nccl_us"] == {"1": 9.0, "2": 17.0, "4": 33.0, "8": 65.0}  # proto-LL won: its fastest run
    assert len(ipc["runs"]) == 2 and ipc["tune_cache"] == "/c/ws2.json"
    specs = [json.loads(p.read_text())["spec"] for p in sorted(log.glob("*.json"), key=lambda p: p.stat().st_mtime)]
    ipc_specs = [s for s in specs if s.get("path") == "pcie-ipc"]
    # Run 1 tunes (measured workspace: 8 x hidden), run 2 reads the cache, run 3 tunes the server's 2 x hidden.
    assert [(s["tune"], s["max_numel"], s["tune_batches"]) for s in ipc_specs[::2]] == [
        (True, 8 * 16, [1, 2, 4, 8]), (False, 8 * 16, [1, 2, 4, 8]), (True, 2 * 16, [1, 2])]
    assert all(s["tokens"] == [1, 2, 4, 8] for s in ipc_specs[:4])  # decode sizes only, never 64
    assert ipc["tuned_max_numel"] == 2 * 16
    assert "| pcie-ipc | FlashInfer 0.7.2 | 5.0 | 5.0 | 200.0 | 400.0 | - |" in capsys.readouterr().out


def test_an_ipc_path_slower_everywhere_is_recorded_as_such(fake_worker, isolated, capsys):
    command, log = fake_worker
    assert run_ipc_sweep(command, isolated) == 0
    ipc = json.loads(isolated.read_text())["ipc"]
    assert ipc["max_numel"] is None and "not faster than NCCL" in ipc["verdict"]
    assert len([p for p in log.glob("*.json") if json.loads(p.read_text())["spec"].get("path")]) == 4  # 2 runs


@pytest.mark.parametrize("world, dtype, ipc, why", [
    (2, "bf16", "off", "--ipc off"), (3, "bf16", "auto", "not 3"), (2, "fp16", "auto", "bf16 only"),
])
def test_where_the_ipc_path_is_not_measured(world, dtype, ipc, why):
    args = parse_tune_nccl(["--dtype", dtype, "--ipc", ipc])
    assert why in tune_ipc.ipc_unavailable(world, args)


def test_ipc_needs_flashinfer_with_the_kernels(monkeypatch):
    from sglang_pcie.runtime import allreduce as allreduce_paths

    args = parse_tune_nccl([])
    old = allreduce_paths.FlashinferInstall("0.6.18", False, "/site/flashinfer")
    assert "FlashInfer 0.6.18 has no PCIe-IPC" in tune_ipc.ipc_unavailable(2, args, old)
    assert tune_ipc.ipc_unavailable(4, args, allreduce_paths.FlashinferInstall("0.7.2", True, "/x")) is None


def test_the_tune_ladder_is_sglangs():
    assert tune_ipc.sglang_tune_ladder(8) == [1, 2, 4, 8]
    assert tune_ipc.sglang_tune_ladder(24) == [1, 2, 4, 8, 16, 24]


def test_run_ipc_with_the_real_worker_measures_judges_and_tunes_for_the_servers_workspace(torch_python):
    command = [str(torch_python), str(SUPPORT / "ipc_fake_worker.py")]
    spec = {"backend": "nccl", "tokens": [1, 2, 4, 64], "hidden": 16, "dtype": "bf16", "allreduces": 3}
    # NCCL figures that IPC (CPU gloo here: hundreds of microseconds) beats at 1 and 2 tokens, not at 4.
    nccl_us, noise = {1: 1e6, 2: 1e6, 4: 1.0}, {1: 0.03, 2: 0.03, 4: 0.03}
    result = tune_ipc.run_ipc(spec, 2, [1, 2, 4], nccl_us, noise, 300, command)
    assert result["wins"] == {"1": True, "2": True, "4": False} and result["max_tokens"] == 2
    assert result["max_numel"] == 32 and result["tuned_max_numel"] == 32 and len(result["runs"]) == 2
    assert result["tune_cache"] == "/stand-in/autotune/pcie_ipc_all_reduce_ws2.json" and "error" not in result
    assert result["verdict"] == (
        "the PCIe-IPC all-reduce beats NCCL at every measured size up to 2 tok (not faster than NCCL beyond the noise "
        "at 4 tok)")


def test_a_failed_ipc_run_in_tune_nccl_reports_each_ranks_stderr(torch_python, capsys):
    command = [str(torch_python), str(SUPPORT / "ipc_fake_worker.py")]
    spec = {"backend": "nccl", "tokens": [1, 2], "hidden": 16, "dtype": "bf16", "allreduces": 3}
    old = dict(os.environ)
    os.environ["FAKE_IPC_BROKEN"] = "1"
    try:
        result = tune_ipc.run_ipc(spec, 2, [1, 2], {1: 1.0, 2: 1.0}, {1: 0.03, 2: 0.03}, 300, command)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert "wrong sums after eager all-reduce at 1 tokens" in result["error"]
    # The worker's progress up to where it failed, as written to the tuned file. The broken stand-in needs no peer
    # after init, so the first rank to fail can end its run while the other is still starting: one rank suffices.
    assert sorted(result["stderr_tails"]) == ["0", "1"]
    phases = [[line.split("phase: ", 1)[1] for line in tail if "phase: " in line]
              for tail in result["stderr_tails"].values()]
    failed = next(p for p in phases if p and p[-1] == "prepared")
    assert failed[0] == "importing flashinfer" and failed[-4] == (
        "tune() for hidden 16 (collective; FlashInfer builds its gloo group, rank 0 writes the cache)"), failed
    err = capsys.readouterr().err
    assert "[pcie-ipc] the ranks' stderr ends:\n  rank " in err and " phase: prepared\n" in err
