"""A deliberate tensor-parallel fault, for GPU test machines only: with AR_FAULT=<factor> in a process's
environment, tensor-parallel rank AR_FAULT_RANK (default 1) multiplies its partial output of every SGLang
RowParallelLinear (o_proj, down_proj) by the factor before the all-reduce: 0 drops that shard's partial sum, 2
doubles it, 1.05 perturbs it by 5%. On `make-test-models --all-reduce-check` models every such fault must change
the greedy tokens (`sglang-pcie bench` then reports the variant DIFFERENT); at TP=1 it does nothing.

Install (gpu_allreduce_check.sh does): copy this file and allreduce_fault.pth into the server python's
site-packages. The .pth imports this module only where AR_FAULT is set; it patches SGLang's linear module when
that is imported, and prints one line naming the fault in every process it patches. Never install it where real
traffic is served.
"""
import os
import sys
from importlib.machinery import PathFinder

TARGET = "sglang.srt.layers.linear"


def _patch(module) -> None:
    factor, rank = float(os.environ["AR_FAULT"]), int(os.environ.get("AR_FAULT_RANK", "1"))
    cls = module.RowParallelLinear
    forward = cls.forward
    group_rank_size = getattr(module, "get_group_rank_size", None)  # 0.5.2x: the layer's group decides

    def rank_size(layer):
        if hasattr(layer, "tp_rank"):  # 0.5.16 keeps them on the layer
            return layer.tp_rank, layer.tp_size
        return group_rank_size(layer.tp_group)

    def faulty_forward(self, input_, *args, **kwargs):
        tp_rank, tp_size = rank_size(self)
        if tp_size > 1 and tp_rank == rank:
            input_ = input_ * factor  # the partial output scales with it: x W^T, no bias in these models
        return forward(self, input_, *args, **kwargs)

    cls.forward = faulty_forward
    print(f"allreduce_fault: TP rank {rank} multiplies its RowParallelLinear partials by {factor} (pid"
          f" {os.getpid()})", file=sys.stderr, flush=True)


class _Finder:
    """Duck-typed meta-path finder: runs _patch right after SGLang's linear module executes."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("AR_FAULT"):
    sys.meta_path.insert(0, _Finder())
