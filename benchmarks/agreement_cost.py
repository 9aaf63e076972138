#!/usr/bin/env python3
"""What node-agreement costs a server start: the comparison (each rank's record, the exchange through torch's TCP
store, the verdict) on worlds of 2 to 8 gloo ranks on CPU, with nodes that agree and nodes that differ; and what
it costs a single-node start, where it only decides not to run.

Each world is fresh processes (a Python with torch: a real SGLang env's), one TCP store, as in a server. Before each
round the ranks meet at a gloo barrier, so a round times the comparison, not the ranks' start skew; the round's
cost to the start is its slowest rank's time (the others wait for it at NCCL's first collective anyway). Ranks are
split over two "nodes" (--node-rank), half of the second node's ranks with NCCL_PROTO=LL in "differ" rounds.

Usage: python -m benchmarks.agreement_cost --python PY [--ranks 2,4,8] [--rounds 20] [--out FILE]
(PY: e.g. ~/.cache/sglang-pcie/envs/sglang-0.5.9/bin/python; the checkout's sglang_pcie is put on its path.)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

WORKER = r'''
import json, os, sys, time
from datetime import timedelta
import torch.distributed as dist
from sglang_pcie.patches.node_agreement import payload as agreement

rank, world, port, rounds = (int(x) for x in sys.argv[1:5])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        timeout=timedelta(seconds=300))
store = dist.distributed_c10d._get_default_store()
out = {"agree": [], "differ": [], "record_bytes": len(agreement.own_record(rank, world, os.environ).to_json())}
for mode in ("agree", "differ"):
    env = dict(os.environ)
    if mode == "differ" and rank >= world // 2 and rank % 2:
        env["NCCL_PROTO"] = "LL"
    for i in range(rounds):
        agreement.KEY = f"bench/{mode}/{i}/rank-"
        dist.barrier()
        start = time.perf_counter()
        verdict = agreement.agree(store, rank, world, env, strict=False)
        out[mode].append(time.perf_counter() - start)
        assert (verdict.lines == []) == (mode == "agree"), verdict.lines
# A single-node start: the wrapper's check decides not to run (no SGLANG_PCIE_NNODES, no GPU count above the world).
env = {k: v for k, v in os.environ.items() if k != "SGLANG_PCIE_NNODES"}
single = []
for _ in range(1000):
    agreement._checked = False
    start = time.perf_counter()
    assert agreement.check_once(env) is None
    single.append(time.perf_counter() - start)
out["single_node_check_s"] = sorted(single)[len(single) // 2]
dist.barrier()
print(json.dumps(out))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def world(python: str, ranks: int, rounds: int) -> list[dict]:
    port, procs = free_port(), []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SGLANG_PCIE_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "sitecustomize")])
    for rank in range(ranks):
        node = 0 if rank < ranks // 2 else 1
        argv = [python, "-c", WORKER, str(rank), str(ranks), str(port), str(rounds), "--nnodes", "2",
                "--node-rank", str(node)]
        procs.append(subprocess.Popen(argv, env={**env, "SGLANG_PCIE_NNODES": "2"}, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"a rank of the {ranks}-rank world failed:\n{err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True)
    parser.add_argument("--ranks", default="2,4,8")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    lines = [f"# node-agreement cost: {platform.node()}, {os.cpu_count()} cores, load average "
             f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {args.rounds} rounds per world and mode; "
             f"git {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, capture_output=True, text=True).stdout.strip()}",
             "# ranks mode   slowest-rank ms per round: median  p90  max | record bytes | single-node check us"]
    raw = {}
    for ranks in [int(x) for x in args.ranks.split(",")]:
        results = world(args.python, ranks, args.rounds)
        raw[ranks] = results
        for mode in ("agree", "differ"):
            slowest = [max(r[mode][i] for r in results) * 1e3 for i in range(args.rounds)]
            ordered = sorted(slowest)
            lines.append(f"{ranks:7d} {mode:6s} {statistics.median(slowest):8.2f} "
                         f"{ordered[int(0.9 * (len(ordered) - 1))]:5.2f} {ordered[-1]:6.2f} | "
                         f"{max(r['record_bytes'] for r in results):5d} | "
                         f"{statistics.median(r['single_node_check_s'] for r in results) * 1e6:6.1f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "# raw seconds per rank and round:\n" + json.dumps(raw) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
