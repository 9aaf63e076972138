"""What the profiler reads from SGLang about the worker it times: its tensor-, pipeline- and data-parallel ranks
(only TP rank 0 reports), its speculative settings, whether SGLang's metrics are on, and the served model's name."""
from __future__ import annotations

from sglang_pcie.patches.eagle3_profile.records import SPEC_SETTINGS


def _int_attr(holder, name):
    try:
        value = getattr(holder, name, None)
    except Exception:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _from_sglang(name, getter=None):
    try:  # 0.5.16+: SGLang's runtime context (0.5.23: the ranks its launcher published)
        from sglang.srt.runtime_context import get_parallel

        value = getattr(get_parallel(), name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    except Exception:
        pass
    if getter is None:
        return None
    try:  # SGLang's process groups
        from sglang.srt.distributed import parallel_state

        value = getattr(parallel_state, getter)()
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    except Exception:
        pass
    return None


def worker_ranks(worker) -> dict:
    """The worker's tensor-, pipeline- and data-parallel ranks (None where unknown).

    Read from the worker (v1, v2 up to 0.5.15: ``tp_rank``), its ``ps`` ParallelState (0.5.16), its target worker,
    then SGLang's runtime context (0.5.16+: 0.5.23 workers have neither ``tp_rank`` nor ``ps``) and process groups;
    for the TP rank, last, the torch.distributed rank."""
    holders = [worker]
    for name in ("ps", "_target_worker"):
        try:
            holder = getattr(worker, name, None)
        except Exception:
            holder = None
        if holder is not None:
            holders.append(holder)
    ranks = {}
    for key, getter in (("tp_rank", "get_tensor_model_parallel_rank"),
                        ("pp_rank", "get_pipeline_model_parallel_rank"), ("dp_rank", None)):
        value = next((v for v in (_int_attr(h, key) for h in holders) if v is not None), None)
        ranks[key] = value if value is not None else _from_sglang(key, getter)
    if ranks["tp_rank"] is None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                ranks["tp_rank"] = dist.get_rank()
        except Exception:
            pass
    return ranks


def spec_settings(worker) -> dict:
    """The worker's speculative settings ({spec_steps, spec_topk, spec_draft_tokens}; None where unknown): SGLang's
    ``server_args.speculative_num_steps`` / ``speculative_eagle_topk`` / ``speculative_num_draft_tokens``, else the
    worker's own attributes (``speculative_num_steps``, ``topk``, ``speculative_num_draft_tokens``: v1 and v2 set
    them from the same server_args)."""
    try:
        args = getattr(worker, "server_args", None)
    except Exception:
        args = None
    settings = {}
    for key, arg_name, attr_name in SPEC_SETTINGS:
        value = _int_attr(args, arg_name) if args is not None else None
        settings[key] = value if value is not None else _int_attr(worker, attr_name)
    return settings


def tp_rank(worker) -> int:
    """The worker's tensor-parallel rank (0 where nothing says otherwise: a single process)."""
    return worker_ranks(worker)["tp_rank"] or 0
