"""What the tune-nccl tests share: a private tuned-file path, a scripted fake worker standing in for NCCL (real
subprocesses), and a Python with torch (a real SGLang env) for the real workers on CPU tensors."""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_pcie.runtime import tuned_file as tuning
from sglang_pcie.tools import tune_nccl


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A private tuned-file path, and none of the developer's NCCL switches leaking into fingerprints."""
    monkeypatch.setenv(tuning.TUNED_FILE_VAR, str(tmp_path / "nccl-tuned.json"))
    for name in (*tuning.TRANSPORT_VARS, *tune_nccl.TUNABLE_VARS):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "nccl-tuned.json"


# The fake worker speaks the real worker's protocol and misbehaves the ways NCCL profiles do: hanging (with a
# child of its own), one rank crashing while the other waits, failing capture, running slower or faster.
# FAKE_DEFAULT_SCALES=a,b,c: the defaults' n-th run is that much slower (each rank counts its own defaults runs);
# FAKE_DEFAULT_NAN=1: the defaults report NaN at their largest size. FAKE_WORKER_PLAIN=1: no profile misbehaves.
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
    plain = os.environ.get("FAKE_WORKER_PLAIN")
    if algo == "Tree" and not plain:  # hangs, with a child that must die with it
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open(os.path.join(os.environ["FAKE_WORKER_LOG"], f"grandchild-{rank}"), "w").write(str(child.pid))
        time.sleep(300)
    if proto == "Simple" and not plain:  # rank 1 crashes; rank 0 would wait for it forever
        if rank == 1:
            sys.stderr.write("boom\\n")
            sys.exit(3)
        time.sleep(300)
    if proto == "LL128" and not plain:
        print(json.dumps({"rank": rank, "ok": False, "error": "RuntimeError: CUDA graph capture failed"}))
        sys.exit(1)
    speed = {"LL": 0.8}.get(proto, 1.0) if algo is None else 1.1
    if os.environ.get("FAKE_DEFAULT_SCALES") and not set(nccl) - {"NCCL_NVLS_ENABLE"}:
        counter = os.path.join(os.environ["FAKE_WORKER_LOG"], f"defaults-{rank}")
        done = int(open(counter).read()) if os.path.exists(counter) else 0
        open(counter, "w").write(str(done + 1))
        scales = os.environ["FAKE_DEFAULT_SCALES"].split(",")
        speed = float(scales[done % len(scales)])
    us = {str(t): 10.0 * t * speed + rank for t in spec["tokens"]}
    if os.environ.get("FAKE_DEFAULT_NAN") and not nccl:
        us[str(max(spec["tokens"]))] = float("nan")
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


@pytest.fixture(scope="module")
def torch_python():
    cache = Path(os.environ.get("SGLANG_PCIE_CACHE") or Path.home() / ".cache" / "sglang-pcie")
    python = cache / "envs" / "sglang-0.5.9" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} missing (ci/sglang-env 0.5.9 builds it)")
    return python
