"""What the payloads of several patches read alike from SGLang: from its server arguments the drafter a speculative
run serves (named in a warning with the check-drafter command that checks it), SGLang's own metrics switch and the
served model's name; from the worker and SGLang's parallel state, the process's ranks (only TP rank 0 speaks).
Attributes are read with getattr: any release."""
from __future__ import annotations

import shlex

# The launch options a warning repeats in its check-drafter command: what decides the drafter and its map.
LAUNCH_OPTIONS = (
    ("--speculative-algorithm", "speculative_algorithm"),
    ("--speculative-num-steps", "speculative_num_steps"),
    ("--speculative-eagle-topk", "speculative_eagle_topk"),
    ("--speculative-num-draft-tokens", "speculative_num_draft_tokens"),
    ("--speculative-token-map", "speculative_token_map"),
    ("--revision", "revision"),
    ("--speculative-draft-model-revision", "speculative_draft_model_revision"),
)


def describe_server(server_args) -> dict:
    """What a warning names, from SGLang's ServerArgs."""
    def value(name):
        return getattr(server_args, name, None)

    algorithm = str(value("speculative_algorithm") or "").upper()
    options = []
    for option, name in LAUNCH_OPTIONS:
        setting = value(name)
        if setting not in (None, ""):
            options += [option, str(setting)]
    return {"algorithm": algorithm, "draft": str(value("speculative_draft_model_path") or value("model_path")),
            "target": str(value("model_path")), "steps": value("speculative_num_steps"), "options": options}


def check_command(server: dict) -> str:
    return shlex.join(["sglang-pcie", "check-drafter", "--draft", server["draft"], "--target", server["target"],
                       "--", *server["options"]])


def metrics_enabled(holder) -> bool:
    """SGLang's own switch: ``--enable-metrics`` (``server_args.enable_metrics`` of a worker or any holder)."""
    return bool(getattr(getattr(holder, "server_args", None), "enable_metrics", False))


def model_name(holder) -> str:
    args = getattr(holder, "server_args", None)
    return str(getattr(args, "served_model_name", None) or getattr(args, "model_path", None) or "")


def int_attr(holder, name):
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
        value = next((v for v in (int_attr(h, key) for h in holders) if v is not None), None)
        ranks[key] = value if value is not None else _from_sglang(key, getter)
    if ranks["tp_rank"] is None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                ranks["tp_rank"] = dist.get_rank()
        except Exception:
            pass
    return ranks


def tp_rank(worker) -> int:
    """The worker's tensor-parallel rank (0 where nothing says otherwise: a single process)."""
    return worker_ranks(worker)["tp_rank"] or 0
