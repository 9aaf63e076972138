"""benchmarks/ipc_allreduce.py, run as its command: IPC against NCCL per hidden size through tune-nccl's workers,
with the scripted fake worker and with the real IPC worker on CPU; hung ranks named with where they stopped and
their stacks."""
from __future__ import annotations

import json
import re
import shlex
import sys

from support import SUPPORT, run_benchmark


def ipc_bench(*argv, worker: list[str], timeout: float = 300) -> str:
    """The benchmark's stdout, with ``worker`` as every rank's worker program, on 2 ranks; it exits 0."""
    proc = run_benchmark("ipc_allreduce", "--tp", "2", "--worker-command", shlex.join(map(str, worker)), *argv,
                         timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_ipc_benchmark_script_tabulates_both_paths_per_hidden_size(fake_worker, tmp_path, monkeypatch):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_IPC_FAST", "2")
    out = ipc_bench("--hidden", "16,32", "--tokens", "1,2,4", "--out", tmp_path / "r", worker=command)
    assert "| 16 | nccl | 11.0 | 21.0 | 41.0 |" in out and "| 16 | pcie-ipc | 5.0 | 5.0 | 200.0 |" in out
    assert "| 32 | NCCL / IPC | 2.20x | 4.20x | 0.20x |" in out
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert [(r["hidden"], r["path"]) for r in results["runs"]] == [(16, "nccl"), (16, "pcie-ipc"), (32, "nccl"),
                                                                   (32, "pcie-ipc")]
    specs = [json.loads(p.read_text())["spec"] for p in log.glob("*.json")]
    assert {s["max_numel"] for s in specs if s.get("path")} == {4 * 16, 4 * 32}


def test_ipc_benchmark_names_where_each_hung_rank_stopped_and_prints_their_stacks(torch_python, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("FAKE_IPC_HANG", "tune")
    out = ipc_bench("--paths", "pcie-ipc", "--hidden", "16", "--tokens", "1,2", "--layers", "2", "--timeout", "25",
                    "--out", tmp_path / "r", worker=[torch_python, SUPPORT / "ipc_fake_worker.py"])
    stuck = "tune() for hidden 16 (collective; FlashInfer builds its gloo group, rank 0 writes the cache)"
    assert f"FAILED: timed out after 25 s (killed); last phase: rank 0: {stuck}, rank 1: {stuck}" in out
    # Each rank's Python stack, dumped on SIGUSR1 before the kill: it hung inside the workspace's tune().
    for rank in (0, 1):
        assert re.search(rf"^#   rank {rank} \| .*ipc_fake_worker.py\", line \d+ in tune$", out, re.M), out
    row = json.loads((tmp_path / "r" / "results.json").read_text())["runs"][0]
    assert row["path"] == "pcie-ipc" and row["error"].startswith("timed out") and len(row["stderr_tails"]) == 2
    assert "| 16 | pcie-ipc (failed: timed out after 25 s (killed); last phase" in out


def test_ipc_benchmark_show_stderr_prints_the_workers_progress_of_a_good_run(torch_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_IPC_STDOUT_JUNK", "1")  # and the report is still found
    out = ipc_bench("--paths", "pcie-ipc", "--hidden", "16", "--tokens", "1,2", "--layers", "2", "--show-stderr",
                    "--out", tmp_path / "r", worker=[torch_python, SUPPORT / "ipc_fake_worker.py"])
    assert "FAILED" not in out and "| 16 | nccl |" not in out and re.search(r"^\| 16 \| pcie-ipc \| \d", out, re.M)
    rank0 = [line.split("phase: ", 1)[1] for line in out.splitlines()
             if line.startswith("#   rank 0 | ") and "phase: " in line]
    assert rank0[0] == "importing flashinfer" and rank0[-2:] == ["destroy() (collective)", "done"], rank0
    assert "tune() done: 2 shapes in 0.0 s; the cache holds 2 configurations" in rank0, rank0
    assert "1 tok: captured; first replay" in rank0


def test_ipc_benchmark_paths_option():
    out = ipc_bench("--paths", "pcie-ipc,nccl", "--hidden", "16", "--dry-run", worker=[sys.executable])
    assert out.splitlines()[1:] == ["would run nccl at hidden 16", "would run pcie-ipc at hidden 16"]
    proc = run_benchmark("ipc_allreduce", "--paths", "nvls")
    assert proc.returncode == 2 and "'nvls': give one or more of nccl, pcie-ipc, comma-separated" in proc.stderr
