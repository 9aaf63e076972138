"""One rank of a CPU (gloo) world for the node-agreement tests, run with a Python that has torch.

The rank joins the world through ``torch.distributed.init_process_group`` wrapped by ``agreement.wrap``: the same
wrapper the node-agreement patch puts over SGLang's ``init_distributed_environment``, so the comparison runs as it
does in a server (once, after the world exists, gated on SGLANG_PCIE_NNODES). Its node is what its arguments and
environment say (``--nnodes N --node-rank R`` as SGLang's launcher takes them; NCCL variables set by the test).

usage: agreement_rank.py --rank R --world W --port P [--nnodes N --node-rank K] [--wait S] [--absent] [--linger S]

--absent: join the world without the check (a node without sglang-pcie), staying alive ``--linger`` seconds.
Prints one JSON line: {"rank", "started", "keys_written", "verdict": null or the Verdict's fields}.
A StrictModeError ends the process with a traceback and exit 1, as it ends an SGLang start.
"""
import argparse
import json
import time
from datetime import timedelta

import torch.distributed as dist

from sglang_pcie.patches.node_agreement import payload as agreement

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, required=True)
parser.add_argument("--world", type=int, required=True)
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--nnodes")  # read by the check from sys.argv, as in SGLang's processes
parser.add_argument("--node-rank")
parser.add_argument("--wait", type=float, default=agreement.WAIT_S)
parser.add_argument("--absent", action="store_true")
parser.add_argument("--linger", type=float, default=0.0)
args = parser.parse_args()
agreement.WAIT_S = args.wait


def init_world(**kwargs):
    """Stands in for SGLang's init_distributed_environment: the default group and its store, on gloo."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=120))


verdicts = []
if args.absent:
    init_world()
    time.sleep(args.linger)
else:
    check = agreement.check_once

    def recorded(environ=None, settings=None):
        verdicts.append(check(environ, settings))
        return verdicts[-1]

    agreement.check_once = recorded
    agreement.wrap(init_world)(backend="gloo")
    agreement.wrap(init_world)  # a second wrapper, as for a second call: the check runs once per process
    assert agreement.check_once() is None
store = dist.distributed_c10d._get_default_store()
written = [r for r in range(args.world) if store.check([f"{agreement.KEY}{r}"])]
store.set(f"test-done-{args.rank}", b"1")  # rank 0's process holds the store: it leaves last
store.wait([f"test-done-{r}" for r in range(args.world)], timedelta(seconds=60))
verdict = verdicts[0] if verdicts else None
print(json.dumps({"rank": args.rank, "started": True, "keys_written": written,
                  "verdict": None if verdict is None else vars(verdict)}), flush=True)
