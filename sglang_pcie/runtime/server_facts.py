"""What the payloads of several patches read alike from SGLang's server arguments: the drafter a speculative run
serves (named in a warning with the check-drafter command that checks it), SGLang's own metrics switch and the served
model's name. Attributes are read with getattr: any release."""
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
