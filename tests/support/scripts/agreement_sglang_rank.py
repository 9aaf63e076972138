"""One rank of a real SGLang world on CPU for the node-agreement tests, run with a real SGLang install's Python
(the overlay active through its .pth start-up hook, as in a server process).

With ``--nnodes N --node-rank R`` in its arguments the overlay's NCCL decision (on ``import sglang``) sees a launch
over N nodes, as each node's launcher does, and writes SGLANG_PCIE_NNODES. The rank then calls SGLang's own
``init_distributed_environment`` through ``sglang.srt.distributed`` (as the model runner and bootstrap do) with the
gloo backend; the one stand-in is SGLang's GPU test, answered "no" so that its groups use the CPU.

usage: agreement_sglang_rank.py --rank R --world W --port P --nnodes N --node-rank K
Prints a JSON line {"hook": ...} after the import, then {"started": true} once the world is up; a StrictModeError
ends it with a traceback and exit 1, as it ends an SGLang start.
"""
import argparse
import json
from datetime import timedelta

import sglang.srt.distributed as distributed
import sglang.srt.distributed.parallel_state as parallel_state
import torch.distributed as dist

from sglang_pcie.patches.node_agreement.check import PATCH
from sglang_pcie.runtime.activate import RESULTS
from sglang_pcie.runtime.results import is_patched
from sglang_pcie.runtime.settings import for_process

parser = argparse.ArgumentParser()
for name in ("--rank", "--world", "--port", "--nnodes", "--node-rank"):
    parser.add_argument(name, type=int, required=True)
args = parser.parse_args()

hook = parallel_state.init_distributed_environment
print(json.dumps({"hook": {
    "wrapped": is_patched(hook, PATCH.id),
    "package_binds_it": distributed.init_distributed_environment is hook,
    "results": {module: result.status for module, result in RESULTS.get(PATCH.id, {}).items()},
    "check_runtime": PATCH.check_runtime({parallel_state.__name__: parallel_state}, for_process()).status}}),
    flush=True)

parallel_state.is_cuda_alike = lambda: False  # no GPU here: SGLang's groups take the CPU device
distributed.init_distributed_environment(world_size=args.world, rank=args.rank, local_rank=args.rank,
                                         distributed_init_method=f"tcp://127.0.0.1:{args.port}", backend="gloo")
print(json.dumps({"started": True, "world": dist.get_world_size()}), flush=True)
store = dist.distributed_c10d._get_default_store()
store.set(f"test-done-{args.rank}", b"1")  # rank 0's process holds the store: it leaves last
store.wait([f"test-done-{r}" for r in range(args.world)], timedelta(seconds=60))
