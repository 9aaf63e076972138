"""One rank of one profile: ``python -m sglang_pcie.tools.tune_nccl --worker SPEC``, in a fresh process with the
profile's variables in its environment (NCCL reads them once per process). Prints one JSON report line."""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import traceback

from sglang_pcie.tools.tune_nccl.measure import IPC_NAME, measure_nccl, phase
from sglang_pcie.tools.tune_nccl.measure_ipc import measure_ipc


def torch_nccl_version(torch) -> str | None:
    """The NCCL torch links (asks the library, does not initialise CUDA); None for a build without NCCL."""
    try:
        version = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _process_group(torch, dist, spec: dict, rank: int, world: int, report: dict):
    """The rank's device, with the process group initialised on it."""
    if spec["backend"] == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
        report["device"] = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    return device


def run_worker(spec: dict) -> int:
    """One rank; prints one JSON line: {"ok": true, "us": {tokens: microseconds}, ...} or {"ok": false, "error"}."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    report = {"rank": rank, "ok": False}
    # A rank the parent gives up on gets SIGUSR1 first: every thread's Python stack goes to stderr, which the
    # parent then reports (where in FlashInfer or NCCL it hung), before it kills the process group.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        phase("importing torch")
        import torch
        import torch.distributed as dist

        report["nccl"] = torch_nccl_version(torch)
        phase(f"torch {torch.__version__} imported; initialising the {spec['backend']} process group")
        device = _process_group(torch, dist, spec, rank, world, report)
        phase("process group up")
        if spec.get("path") == IPC_NAME:
            if spec["backend"] != "nccl":
                raise RuntimeError("the PCIe-IPC all-reduce needs CUDA (--backend nccl)")
            report["us"] = measure_ipc(torch, dist, spec, rank, world, device, report)
        else:
            report["us"] = measure_nccl(torch, dist, spec, rank, world, device)
        report["ok"] = True
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"[:400]
        traceback.print_exc()  # the whole story goes to stderr, whose tail the parent reports
    print(json.dumps(report), flush=True)
    sys.stderr.flush()
    # Skip interpreter teardown: destroying a communicator whose peer has died can block.
    os._exit(0 if report["ok"] else 1)
