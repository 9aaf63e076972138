"""One rank of one profile: ``python -m sglang_pcie.tools.tune_nccl --worker SPEC``, in a fresh process with the
profile's variables in its environment (NCCL reads them once per process). Prints one JSON report line. Across nodes
torch's launcher starts it, and it meets the other nodes' ranks first (``rendezvous``)."""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import traceback

from sglang_pcie.tools.tune_nccl.measure import IPC_NAME, measure_nccl, phase
from sglang_pcie.tools.tune_nccl.measure_ipc import measure_ipc
from sglang_pcie.tools.tune_nccl.rendezvous import (KEY, NODE_VAR, PeerFailed, Rendezvous, local_setup,
                                                    mark_joined)


def torch_nccl_version(torch) -> str | None:
    """The NCCL torch links (asks the library, does not initialise CUDA); None for a build without NCCL."""
    try:
        version = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _process_group(torch, dist, spec: dict, rank: int, world: int, report: dict, local_rank: int | None = None,
                   store=None):
    """The rank's device (GPU ``local_rank`` of this node, default ``rank``), with the process group initialised on
    it (through ``store`` where given, else the environment's MASTER_ADDR / MASTER_PORT)."""
    through = {} if store is None else {"store": store}
    if spec["backend"] == "nccl":
        device = torch.device("cuda", rank if local_rank is None else local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device, **through)
        report["device"] = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world, **through)
    return device


def _on_this_node(torch, dist, spec: dict, rank: int, world: int, report: dict) -> None:
    phase(f"torch {torch.__version__} imported; initialising the {spec['backend']} process group")
    device = _process_group(torch, dist, spec, rank, world, report)
    phase("process group up")
    if spec.get("path") == IPC_NAME:
        if spec["backend"] != "nccl":
            raise RuntimeError("the PCIe-IPC all-reduce needs CUDA (--backend nccl)")
        report["us"] = measure_ipc(torch, dist, spec, rank, world, device, report)
    else:
        report["us"] = measure_nccl(torch, dist, spec, rank, world, device)


def _across_nodes(torch, dist, spec: dict, local: dict, report: dict) -> None:
    """One rank of a step across nodes: meet every rank (same step everywhere), then measure and share the figures
    (the report holds the slowest rank's), or hand out node 0's result."""
    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    phase(f"step {spec['step']} ({spec['label']}): meeting every rank at torch's rendezvous "
          f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
    report["stage"] = "join"  # a failure from here to the meeting means the nodes are apart
    rendezvous = Rendezvous(dist, spec, local)
    gpu = spec.get("backend") == "nccl"
    report.update(rendezvous.join(local["node"], torch.cuda.get_device_name(local_rank) if gpu else "cpu"))
    mark_joined(local)
    report["stage"] = "run"
    phase(f"every one of the {world} ranks is at step {spec['step']}")
    if spec.get("publish"):
        report["result_sha256"] = rendezvous.hand_out(local)
        return
    device = _process_group(torch, dist, spec, rank, world, report, local_rank,
                            dist.PrefixStore(f"{KEY}/{spec['step']}/group", rendezvous.store))
    phase("process group up")
    try:
        us = measure_nccl(torch, dist, spec, rank, world, device)
    except Exception as exc:
        rendezvous.fail(f"{type(exc).__name__}: {exc}"[:400])  # (PeerFailed where another rank failed first)
        raise
    report["us"] = rendezvous.slowest(us)


def run_worker(spec: dict) -> int:
    """One rank; prints one JSON line: {"ok": true, "us": {tokens: microseconds}, ...} or {"ok": false, "error"}."""
    local = local_setup() if NODE_VAR in os.environ else None  # across nodes: this rank's own output files
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
        if local is not None:
            _across_nodes(torch, dist, spec, local, report)
        else:
            _on_this_node(torch, dist, spec, rank, world, report)
        report["ok"] = True
    except PeerFailed as exc:  # across nodes: another rank's error, said as it is
        report.update(error=str(exc)[:500], peer=True)
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"[:400]
        traceback.print_exc()  # the whole story goes to stderr, whose tail the parent reports
    print(json.dumps(report), flush=True)
    sys.stderr.flush()
    # Skip interpreter teardown: destroying a communicator whose peer has died can block.
    os._exit(0 if report["ok"] else 1)
