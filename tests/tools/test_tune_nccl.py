"""sglang-pcie tune-nccl: the sweep's orchestration (real subprocesses, time bounds, dropped profiles) with a
scripted fake worker standing in for NCCL, and the real worker on CPU tensors (gloo) in a real SGLang env."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sglang_pcie.tools.cli import main as cli_main

from sglang_pcie.runtime import gpus
from sglang_pcie.tools import tune_nccl
from sglang_pcie.runtime import tuned_file as tuning
from sglang_pcie.runtime.nccl import PCIE_PROFILE
from sglang_pcie.runtime.gpus import Topology

from support import REPO, SUPPORT
PCIE_BOX = Topology(["NVIDIA RTX PRO 6000 Blackwell"] * 8, nvlink=False, p2p=False, source="nvml")
NVLINK_BOX = Topology(["NVIDIA H200"] * 2, nvlink=True, p2p=True, source="nvml", detail="36 active NVLink links")
PROFILES = tune_nccl.CANDIDATES


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A private tuned-file path, and none of the developer's NCCL switches leaking into fingerprints."""
    monkeypatch.setenv(tuning.TUNED_FILE_VAR, str(tmp_path / "nccl-tuned.json"))
    for name in (*tuning.TRANSPORT_VARS, *tune_nccl.TUNABLE_VARS):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "nccl-tuned.json"


def tune_nccl_main(argv: list) -> int:
    return cli_main(["tune-nccl", *argv])


def parse_tune_nccl(argv: list):
    from sglang_pcie.tools import cli

    return cli.build_parser().parse_args(["tune-nccl", *argv])


def runs(*sizes_us):
    """runs((10, 12), (11, 12)) -> two runs over sizes 1 and 8."""
    return [None if r is None else dict(zip((1, 8), r)) for r in sizes_us]


def test_candidates_include_defaults_and_pcie_and_never_touch_nvls():
    assert PROFILES["default"] == {} and PROFILES["pcie"] == PCIE_PROFILE
    assert all("NCCL_NVLS_ENABLE" not in values for values in PROFILES.values())
    assert all(name.startswith("NCCL_") for values in PROFILES.values() for name in values)


# ---------------------------------------------------------------------------------------------------------------
# The sweep's orchestration, with real subprocesses. The fake worker speaks the real worker's protocol and
# misbehaves the ways NCCL profiles do: hanging (with a child of its own), one rank crashing while the other
# waits, failing capture, running slower or faster.

FAKE_WORKER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    spec = json.loads(sys.argv[sys.argv.index("--worker") + 1])
    rank = int(os.environ["RANK"])
    nccl = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    with open(os.path.join(os.environ["FAKE_WORKER_LOG"], f"{os.getpid()}.json"), "w") as log:
        json.dump({"rank": rank, "nccl": nccl, "world": os.environ["WORLD_SIZE"], "spec": spec}, log)
    if os.environ.get("FAKE_WORKER_ALL_FAIL"):
        sys.exit("no GPU")
    if os.environ.get("FAKE_WORKER_HANG"):
        time.sleep(300)
    if os.environ.get("FAKE_WORKER_NO_REPORT"):  # exits 0 with no report, after 50 lines of stderr
        sys.stderr.write("".join(f"stderr line {i} of rank {rank}\\n" for i in range(50)))
        sys.exit(0)
    if spec.get("path") == "pcie-ipc":  # 5 us up to FAKE_IPC_FAST tokens, then slower than NCCL's 10 us per token
        fast = int(os.environ.get("FAKE_IPC_FAST", "0"))
        us = {str(t): 5.0 if t <= fast else 50.0 * t for t in spec["tokens"]}
        print(json.dumps({"rank": rank, "ok": True, "us": us, "flashinfer": "0.7.2", "tune_cache": "/c/ws2.json",
                          "tuned_shapes": len(spec["tune_batches"]) if spec["tune"] else 0}))
        sys.exit(0)
    algo, proto = nccl.get("NCCL_ALGO"), nccl.get("NCCL_PROTO")
    if algo == "Tree":  # hangs, with a child that must die with it
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open(os.path.join(os.environ["FAKE_WORKER_LOG"], f"grandchild-{rank}"), "w").write(str(child.pid))
        time.sleep(300)
    if proto == "Simple":  # rank 1 crashes; rank 0 would wait for it forever
        if rank == 1:
            sys.stderr.write("boom\\n")
            sys.exit(3)
        time.sleep(300)
    if proto == "LL128":
        print(json.dumps({"rank": rank, "ok": False, "error": "RuntimeError: CUDA graph capture failed"}))
        sys.exit(1)
    speed = {"LL": 0.8}.get(proto, 1.0) if algo is None else 1.1
    us = {str(t): 10.0 * t * speed + rank for t in spec["tokens"]}
    print(json.dumps({"rank": rank, "ok": True, "us": us, "nccl": "2.27.5", "device": "Fake GPU"}))
""")


@pytest.fixture
def fake_worker(tmp_path, monkeypatch):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv("FAKE_WORKER_LOG", str(log))
    command = [sys.executable, str(script)]
    monkeypatch.setattr(tune_nccl, "WORKER_COMMAND", command)
    return command, log


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in state  # killed, waiting for init to reap it


def test_sweep_drops_hanging_crashing_and_failing_profiles_and_writes_the_winner(fake_worker, isolated, capsys,
                                                                                  monkeypatch):
    command, log = fake_worker
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # kept as the environment has it
    monkeypatch.setenv("NCCL_PROTO", "Simple")  # the user's own: not part of any measurement
    out = isolated.parent / "out" / "tuned.json"
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2", "--prefill-tokens", "none",
                           "--timeout", "3", "--out", str(out),
                           "--profiles", "algo-Tree,proto-Simple,proto-LL128,proto-LL,algo-Ring"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = json.loads(out.read_text())
    assert config["winner"] == "proto-LL" and config["values"] == {"NCCL_PROTO": "LL"}
    table = config["table"]
    assert len(table["default"]["runs"]) == 2 and len(table["proto-LL"]["runs"]) == 2  # noise check, confirmation
    assert table["default"]["runs"][0] == {"1": 11.0, "2": 21.0}  # the slower rank's time
    assert table["algo-Tree"]["runs"] == [None]
    assert table["algo-Tree"]["verdict"] == "dropped: timed out after 3 s (killed)"
    # The crash ended the run at once (the waiting rank was killed), reported as the crash, not a timeout.
    assert table["proto-Simple"]["verdict"] == "dropped: rank 1 exited with 3: boom"
    assert "CUDA graph capture failed" in table["proto-LL128"]["verdict"]
    assert table["algo-Ring"]["verdict"].startswith("slower than defaults")
    assert config["fingerprint"]["transport_env"] == {"NCCL_NVLS_ENABLE": "0"}
    assert config["measured"]["torch_nccl"] == "2.27.5" and config["measured"]["tp"] == 2

    grandchildren = [int(p.read_text()) for p in log.glob("grandchild-*")]
    assert grandchildren and all(_dead(pid) for pid in grandchildren)
    environments = [json.loads(p.read_text()) for p in log.glob("*.json")]
    assert all(e["nccl"].get("NCCL_NVLS_ENABLE") == "0" and e["world"] == "2" for e in environments)
    assert sorted(e["rank"] for e in environments if e["nccl"] == {"NCCL_NVLS_ENABLE": "0"}) == [0, 0, 1, 1]
    assert "| proto-LL | PROTO=LL | 9.0 | 17.0 | winner: faster at 1, 2 tok (2 runs) |" in captured.out
    assert "Predicted communication per forward pass (2 x 61 layers" in captured.out
    assert config["guarantee_sizes"] == [1, 2] and config["ipc"]["verdict"].startswith("not measured")
    assert "measuring without your NCCL_PROTO" in captured.err and "[3/" in captured.err


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
    assert why in tune_nccl.ipc_unavailable(world, args)


def test_ipc_needs_flashinfer_with_the_kernels(monkeypatch):
    from sglang_pcie.runtime import allreduce as allreduce_paths

    args = parse_tune_nccl([])
    old = allreduce_paths.FlashinferInstall("0.6.18", False, "/site/flashinfer")
    assert "FlashInfer 0.6.18 has no PCIe-IPC" in tune_nccl.ipc_unavailable(2, args, old)
    assert tune_nccl.ipc_unavailable(4, args, allreduce_paths.FlashinferInstall("0.7.2", True, "/x")) is None


def test_prefill_graphs_hold_fewer_all_reduces():
    spec = {"hidden": 7168, "dtype": "bf16", "allreduces": 122}
    assert [tune_nccl.allreduces_per_graph(spec, t) for t in (1, 8, 512, 2048, 8192)] == [122, 122, 36, 9, 4]
    assert tune_nccl.sglang_tune_ladder(8) == [1, 2, 4, 8] and tune_nccl.sglang_tune_ladder(24) == [1, 2, 4, 8, 16, 24]


def test_sweep_stops_and_writes_nothing_when_defaults_fail(fake_worker, isolated, monkeypatch, capsys):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_WORKER_ALL_FAIL", "1")
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--out", str(isolated)])
    assert code == 1 and not isolated.exists()
    assert "NCCL defaults could not be measured (rank " in capsys.readouterr().err
    started = [json.loads(p.read_text()) for p in log.glob("*.json")]
    # Only the defaults' ranks started (the second may have been killed before it began): no candidate ran.
    assert 1 <= len(started) <= 2 and all(e["nccl"] == {} for e in started)


def test_stopping_the_sweep_stops_its_workers(fake_worker, isolated, monkeypatch):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_WORKER_HANG", "1")
    code = (f"import sys; from sglang_pcie.tools import cli, tune_nccl; tune_nccl.WORKER_COMMAND = {command!r}; "
            f"sys.exit(cli.main(['tune-nccl', '--backend', 'gloo', '--tp', '2', '--out', {str(isolated)!r}]))")
    sweep = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                             stderr=subprocess.DEVNULL)
    for _ in range(400):  # until both ranks have started
        if len(list(log.glob("*.json"))) == 2:
            break
        time.sleep(0.05)
    workers = [int(p.stem) for p in log.glob("*.json")]
    assert len(workers) == 2 and sweep.poll() is None
    sweep.terminate()  # SIGTERM, as `timeout` sends
    assert sweep.wait(timeout=30) == 128 + 15
    assert all(_dead(pid) for pid in workers) and not isolated.exists()


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "0"], "positive integers"),
    (["--tokens", "a,b"], "positive integers"),
    (["--timeout", "-1"], "positive number"),
    (["--dtype", "int8"], "invalid choice"),
    (["--profiles", "default,turbo"], "unknown profile 'turbo'"),
    (["--tp", "1"], "at least 2 ranks"),
    (["--backend", "gloo", "--tp", "2"], "give --out"),
])
def test_bad_usage_exits_2_naming_the_value(argv, message, capsys):
    try:
        code = tune_nccl_main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err


def test_nccl_backend_needs_the_gpus(monkeypatch, capsys):
    monkeypatch.setattr(gpus, "probe_topology", lambda: Topology(detail="no NVIDIA driver or GPU visible"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert tune_nccl_main(["--tp", "2"]) == 2 and "only 0 GPU(s) visible" in capsys.readouterr().err


def test_dry_run_lists_the_profiles_and_runs_nothing(fake_worker, capsys):
    command, log = fake_worker
    assert tune_nccl_main(["--backend", "gloo", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pcie" in out and "NCCL_PROTO=LL NCCL_ALGO=Ring" in out and not list(log.iterdir())


# ---------------------------------------------------------------------------------------------------------------
# The real worker, on CPU tensors, in a real SGLang environment (torch is there, not in the test interpreter)


@pytest.fixture(scope="module")
def torch_python():
    cache = Path(os.environ.get("SGLANG_PCIE_CACHE") or Path.home() / ".cache" / "sglang-pcie")
    python = cache / "envs" / "sglang-0.5.9" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} missing (ci/sglang-env 0.5.9 builds it)")
    return python


def test_real_worker_checks_sums_and_the_fingerprint_names_torchs_nccl(torch_python, tmp_path):
    out = tmp_path / "tuned.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([str(torch_python), "-m", "sglang_pcie", "tune-nccl", "--backend", "gloo", "--tp", "3",
                           "--tokens", "1,3", "--prefill-tokens", "40", "--hidden", "512", "--layers", "2",
                           "--profiles", "default", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    config = json.loads(out.read_text())
    assert config["winner"] == "default" and config["values"] == {}
    assert [sorted(run) for run in config["table"]["default"]["runs"]] == [["1", "3", "40"], ["1", "3", "40"]]
    assert config["measured"]["allreduces_per_graph"] == {"1": 4, "3": 4, "40": 4}
    # The launcher's cheap reading (the pip distribution) names the NCCL that torch actually links.
    assert config["fingerprint"]["nccl"] == f"nvidia-nccl-cu12=={config['measured']['torch_nccl']}"


def test_real_worker_sum_check_catches_a_broken_all_reduce(torch_python):
    # An all-reduce that leaves each rank's data as it was: the check must say so.
    code = textwrap.dedent("""
        import torch
        from types import SimpleNamespace
        from sglang_pcie.tools import tune_nccl
        spec = {"backend": "gloo", "tokens": [2], "hidden": 16, "dtype": "bf16", "allreduces": 3}
        try:
            tune_nccl._measure(torch, SimpleNamespace(all_reduce=lambda t: None), spec, 0, 2, torch.device("cpu"))
        except RuntimeError as exc:
            print(exc)
    """)
    done = subprocess.run([str(torch_python), "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "wrong sums after all-reduce at 2 tokens (3 of 3 buffers)", done.stderr


def test_ipc_benchmark_script_tabulates_both_paths_per_hidden_size(fake_worker, tmp_path, monkeypatch, capsys):
    import importlib.util

    command, log = fake_worker
    monkeypatch.setenv("FAKE_IPC_FAST", "2")
    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: NVLINK_BOX)
    spec = importlib.util.spec_from_file_location("ipc_allreduce", REPO / "benchmarks" / "ipc_allreduce.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--hidden", "16,32", "--tokens", "1,2,4", "--out", str(tmp_path / "r")],
                      worker_command=command) == 0
    out = capsys.readouterr().out
    assert "| 16 | nccl | 11.0 | 21.0 | 41.0 |" in out and "| 16 | pcie-ipc | 5.0 | 5.0 | 200.0 |" in out
    assert "| 32 | NCCL / IPC | 2.20x | 4.20x | 0.20x |" in out
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert [(r["hidden"], r["path"]) for r in results["runs"]] == [(16, "nccl"), (16, "pcie-ipc"), (32, "nccl"),
                                                                   (32, "pcie-ipc")]
    specs = [json.loads(p.read_text())["spec"] for p in log.glob("*.json")]
    assert {s["max_numel"] for s in specs if s.get("path")} == {4 * 16, 4 * 32}


# The real IPC worker (tune_nccl._measure_ipc) on CPU: gloo, torch.cuda stand-ins, and a FlashInfer workspace
# stand-in that enforces the collective contract of PcieIpcAllReduceWorkspace (tests/support/ipc_fake_worker.py).

IPC_SPEC = {"backend": "nccl", "path": "pcie-ipc", "tokens": [1, 2, 4], "hidden": 16, "dtype": "bf16",
            "allreduces": 3, "tune": True, "max_numel": 4 * 16, "tune_batches": [1, 2, 4]}


def run_fake_ipc(torch_python, spec, env=None):
    command = [str(torch_python), str(SUPPORT / "ipc_fake_worker.py")]
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        return tune_nccl.run_profile({}, spec, 2, 300, command)
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


def test_run_ipc_with_the_real_worker_measures_judges_and_tunes_for_the_servers_workspace(torch_python):
    command = [str(torch_python), str(SUPPORT / "ipc_fake_worker.py")]
    spec = {"backend": "nccl", "tokens": [1, 2, 4, 64], "hidden": 16, "dtype": "bf16", "allreduces": 3}
    # NCCL figures that IPC (CPU gloo here: hundreds of microseconds) beats at 1 and 2 tokens, not at 4.
    nccl_us, noise = {1: 1e6, 2: 1e6, 4: 1.0}, {1: 0.03, 2: 0.03, 4: 0.03}
    result = tune_nccl.run_ipc(spec, 2, [1, 2, 4], nccl_us, noise, 300, command)
    assert result["wins"] == {"1": True, "2": True, "4": False} and result["max_tokens"] == 2
    assert result["max_numel"] == 32 and result["tuned_max_numel"] == 32 and len(result["runs"]) == 2
    assert result["tune_cache"] == "/stand-in/autotune/pcie_ipc_all_reduce_ws2.json" and "error" not in result
    assert result["verdict"] == "the PCIe-IPC all-reduce beats NCCL at every measured size up to 2 tok (not at 4 tok)"


# What a failed, hung or silent run brings back: the ranks' stderr tails, the workers' progress lines, the stacks of
# hung ranks (the first GPU run had only "rank 0 exited without a report" and "timed out after 90 s").


def load_ipc_bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ipc_allreduce", REPO / "benchmarks" / "ipc_allreduce.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_a_report_is_read_whole_even_after_stray_output(tmp_path):
    report = {"rank": 0, "ok": True, "us": {"1": 5.0}, "fabric": "x" * 500}
    out = tmp_path / "rank0.out"
    out.write_text("NCCL INFO init\n[flashinfer] no newline" + json.dumps(report) + "\n\n")
    assert tune_nccl._read_report(out) == report
    out.write_text(json.dumps(report)[:300] + "\n")  # cut short: no report
    assert tune_nccl._read_report(out) is None


def test_a_rank_without_a_report_is_named_with_the_end_of_its_stderr(fake_worker, monkeypatch):
    command, _ = fake_worker
    monkeypatch.setenv("FAKE_WORKER_NO_REPORT", "1")
    spec = {"backend": "gloo", "tokens": [1], "hidden": 16, "dtype": "bf16", "allreduces": 2}
    outcome = tune_nccl.run_profile({}, spec, 2, 60, command)
    assert outcome.us is None
    assert outcome.error == "rank 0 exited without a report; its stderr ends: stderr line 49 of rank 0"
    assert outcome.stderr_tails[1] == [f"stderr line {i} of rank 1" for i in range(10, 50)]  # the last 40


def test_a_failed_ipc_run_in_tune_nccl_reports_each_ranks_stderr(torch_python, capsys):
    command = [str(torch_python), str(SUPPORT / "ipc_fake_worker.py")]
    spec = {"backend": "nccl", "tokens": [1, 2], "hidden": 16, "dtype": "bf16", "allreduces": 3}
    old = dict(os.environ)
    os.environ["FAKE_IPC_BROKEN"] = "1"
    try:
        result = tune_nccl.run_ipc(spec, 2, [1, 2], {1: 1.0, 2: 1.0}, {1: 0.03, 2: 0.03}, 300, command)
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


def test_ipc_benchmark_names_where_each_hung_rank_stopped_and_prints_their_stacks(torch_python, tmp_path, capsys,
                                                                                  monkeypatch):
    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: NVLINK_BOX)
    monkeypatch.setenv("FAKE_IPC_HANG", "tune")
    command = [str(torch_python), str(SUPPORT / "ipc_fake_worker.py")]
    argv = ["--paths", "pcie-ipc", "--hidden", "16", "--tokens", "1,2", "--layers", "2", "--timeout", "25",
            "--out", str(tmp_path / "r")]
    assert load_ipc_bench().main(argv, worker_command=command) == 0
    out = capsys.readouterr().out
    stuck = "tune() for hidden 16 (collective; FlashInfer builds its gloo group, rank 0 writes the cache)"
    assert f"FAILED: timed out after 25 s (killed); last phase: rank 0: {stuck}, rank 1: {stuck}" in out
    # Each rank's Python stack, dumped on SIGUSR1 before the kill: it hung inside the workspace's tune().
    for rank in (0, 1):
        assert re.search(rf"^#   rank {rank} \| .*ipc_fake_worker.py\", line \d+ in tune$", out, re.M), out
    row = json.loads((tmp_path / "r" / "results.json").read_text())["runs"][0]
    assert row["path"] == "pcie-ipc" and row["error"].startswith("timed out") and len(row["stderr_tails"]) == 2
    assert "| 16 | pcie-ipc (failed: timed out after 25 s (killed); last phase" in out


def test_ipc_benchmark_show_stderr_prints_the_workers_progress_of_a_good_run(torch_python, tmp_path, capsys,
                                                                            monkeypatch):
    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: NVLINK_BOX)
    monkeypatch.setenv("FAKE_IPC_STDOUT_JUNK", "1")  # and the report is still found
    command = [str(torch_python), str(SUPPORT / "ipc_fake_worker.py")]
    argv = ["--paths", "pcie-ipc", "--hidden", "16", "--tokens", "1,2", "--layers", "2", "--show-stderr",
            "--out", str(tmp_path / "r")]
    assert load_ipc_bench().main(argv, worker_command=command) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and "| 16 | nccl |" not in out and re.search(r"^\| 16 \| pcie-ipc \| \d", out, re.M)
    rank0 = [line.split("phase: ", 1)[1] for line in out.splitlines()
             if line.startswith("#   rank 0 | ") and "phase: " in line]
    assert rank0[0] == "importing flashinfer" and rank0[-2:] == ["destroy() (collective)", "done"], rank0
    assert "tune() done: 2 shapes in 0.0 s; the cache holds 2 configurations" in rank0, rank0
    assert "1 tok: captured; first replay" in rank0


def test_ipc_benchmark_paths_option():
    bench = load_ipc_bench()
    assert bench.parse_args(["--paths", "pcie-ipc,nccl"]).paths == ["nccl", "pcie-ipc"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--paths", "nvls"])


def test_an_unwritable_out_is_refused_before_the_sweep(fake_worker, isolated, capsys):
    command, log = fake_worker
    blocker = isolated.parent / "a-file"
    blocker.write_text("")
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--out", str(blocker / "tuned.json")])
    err = capsys.readouterr().err
    assert code == 2 and f"--out {blocker / 'tuned.json'}: {blocker} is not a folder" in err
    assert not list(log.glob("*.json"))  # no worker started
    assert tune_nccl.unwritable(isolated.parent / "new" / "deeper" / "tuned.json") is None  # created on write
    assert "is a folder" in tune_nccl.unwritable(isolated.parent)


def test_a_failed_write_keeps_the_measurements_on_stderr(fake_worker, isolated, capsys, monkeypatch):
    command, _ = fake_worker

    def refuse(path, config):
        raise ValueError("refusing to write an unusable tuned file: test")

    monkeypatch.setattr(tuning, "write_config", refuse)
    out = isolated.parent / "out" / "tuned.json"
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2", "--prefill-tokens", "none",
                           "--profiles", "proto-LL", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and not out.exists()
    assert f"could not write {out}: refusing to write an unusable tuned file: test" in err
    config = json.loads(err[err.index("\n{") + 1:])
    assert config["winner"] in ("default", "proto-LL") and "table" in config


def test_a_ranks_stderr_tail_reads_only_the_end_of_a_large_file(tmp_path):
    # NCCL_DEBUG=INFO can make a rank's stderr large: the tail comes from its last 64 KiB, blank lines dropped.
    err = tmp_path / "rank0.err"
    err.write_text("x" * 200_000 + "\n" + "".join(f"line {i}\n\n" for i in range(50)))
    assert tune_nccl._tail(err, lines=3) == ["line 47", "line 48", "line 49"]
    assert tune_nccl._tail(tmp_path / "missing.err") == []
