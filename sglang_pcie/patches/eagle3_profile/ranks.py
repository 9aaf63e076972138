"""What the profiler reads from SGLang about the worker it times: its speculative settings. Its ranks (only TP rank
0 reports) are ``runtime/server_facts.py``'s, which the draft-token watch reads too."""
from __future__ import annotations

from sglang_pcie.patches.eagle3_profile.records import SPEC_SETTINGS
from sglang_pcie.runtime.server_facts import int_attr


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
        value = int_attr(args, arg_name) if args is not None else None
        settings[key] = value if value is not None else int_attr(worker, attr_name)
    return settings
