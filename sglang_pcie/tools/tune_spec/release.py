"""What the installed SGLang release offers tune-spec: adaptive speculative steps, where it declares them, and in
which form, read from its source (``SourceTree``: nothing is imported).

* 0.5.8 - 0.5.10.post1: no adaptive steps.
* 0.5.11 - 0.5.12.post1: ``--speculative-adaptive`` with one global EMA over ``candidate_steps`` (no table by
  batch size). In 0.5.11 only the v1 worker has it, so SGLang switches it off unless
  ``--disable-overlap-schedule`` (read from the release's source, not assumed).
* 0.5.13 and later: a table keyed by batch size (``DEFAULT_ADAPTIVE_CONFIG`` in
  ``speculative/adaptive_spec_params.py``, replaced by ``--speculative-adaptive-config FILE``): a batch is padded
  to a CUDA-graph batch size, then served by the bucket with the largest key not above it. 0.5.13 and 0.5.13.post1
  refuse step 0 (no speculation) in a bucket; 0.5.14 on take it.
* The option is declared in ``ServerArgs``' class body up to 0.5.19, and in ``sglang/srt/arg_groups/fields/``
  (``Spec``) from 0.5.20 on: both are looked in.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

SERVER_ARGS = ("sglang.srt.server_args", "ServerArgs")
FIELDS_PACKAGE = "sglang.srt.arg_groups.fields"
PARAMS = "sglang.srt.speculative.adaptive_spec_params"
OPTION = "speculative_adaptive"


@dataclass(frozen=True)
class AdaptiveFacts:
    available: bool  # --speculative-adaptive exists
    declared_in: str | None = None  # "module.Class" that declares the option
    per_batch: bool = False  # a table keyed by batch size (--speculative-adaptive-config)
    zero_steps: bool = False  # a bucket may hold step 0 (no speculation)
    default_table: dict = field(default_factory=dict)  # the release's built-in table, bucket -> candidate steps
    default_config: dict = field(default_factory=dict)  # ... each bucket's whole entry (steps and hysteresis)
    needs_no_overlap: bool = False  # SGLang switches adaptive off unless --disable-overlap-schedule
    version: str = "unknown"

    def as_dict(self) -> dict:
        return {"available": self.available, "declared_in": self.declared_in, "per_batch": self.per_batch,
                "zero_steps": self.zero_steps, "default_table": self.default_table,
                "default_config": self.default_config,
                "needs_no_overlap": self.needs_no_overlap, "version": self.version}

    @classmethod
    def from_dict(cls, data: dict | None) -> "AdaptiveFacts":
        data = dict(data or {"available": False})
        data["default_table"] = {int(k): list(v) for k, v in (data.get("default_table") or {}).items()}
        data["default_config"] = {int(k): dict(v) for k, v in (data.get("default_config") or {}).items()}
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def describe(self) -> str:
        if self.version == NOT_READ:
            return ("no SGLang source was read (no sglang for this python, or another --server-cmd, or"
                    " --no-adaptive): adaptive steps are left out")
        if not self.available:
            return f"SGLang {self.version} has no adaptive speculative steps"
        if not self.per_batch:
            return (f"SGLang {self.version} has adaptive steps without a table by batch size (one EMA for all"
                    f" batches{', and only with --disable-overlap-schedule' if self.needs_no_overlap else ''})")
        table = ", ".join(f"{k}: {v}" for k, v in sorted(self.default_table.items()))
        return (f"SGLang {self.version} runs adaptive steps from a table by batch size (declared in"
                f" {self.declared_in}; its default {{{table}}}; step 0 {'allowed' if self.zero_steps else 'refused'})")


NOT_READ = "not read"
NO_TREE = AdaptiveFacts(False, version=NOT_READ)


def declaring_class(tree) -> str | None:
    """``module.Class`` that declares ``speculative_adaptive``: ServerArgs' body, else a class of the fields
    package (0.5.20+)."""
    if OPTION in tree.members(*SERVER_ARGS):
        return ".".join(SERVER_ARGS)
    for module in tree.modules(FIELDS_PACKAGE):
        for name in tree.classes(module):
            if OPTION in tree.members(module, name):
                return f"{module}.{name}"
    return None


ENTRY_KEYS = ("candidate_steps", "up_hysteresis", "down_hysteresis", "ceiling_coeff", "ema_alpha", "update_interval",
              "warmup_batches")  # what a bucket of SGLang's table may set (AdaptiveStepSlot), copied where present


def default_config(tree) -> dict | None:
    """The release's ``DEFAULT_ADAPTIVE_CONFIG`` as bucket -> its entry (the keys of ENTRY_KEYS it sets), or None
    where it has none."""
    values = tree.assignments(PARAMS, "DEFAULT_ADAPTIVE_CONFIG")
    if not values:
        return None
    try:
        table = ast.literal_eval(values[-1])
    except ValueError:
        return None
    return {int(k): {key: v[key] for key in ENTRY_KEYS if key in v} for k, v in table.items() if str(k).isdigit()}


def default_table(tree) -> dict | None:
    """The release's ``DEFAULT_ADAPTIVE_CONFIG`` as bucket -> candidate steps, or None where it has none."""
    config = default_config(tree)
    return None if config is None else {k: list(v["candidate_steps"]) for k, v in config.items()}


def zero_steps_allowed(tree) -> bool:
    """Whether the config loader takes step 0: its check on each step compares ``>= 0`` (0.5.14+), not ``> 0``."""
    loader = tree.function(PARAMS, "_load_adaptive_config")
    for node in ast.walk(loader) if loader else []:
        if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value == 0
                                                 for c in node.comparators):
            if isinstance(node.ops[0], ast.GtE):
                return True
    return False


def adaptive_facts(root) -> AdaptiveFacts:
    """The facts of the SGLang tree at ``root`` (no tree, or another interpreter's: nothing available)."""
    if root is None:
        return NO_TREE
    from sglang_pcie.patching.source import SourceTree

    try:
        tree = SourceTree(root)
    except ValueError:
        return NO_TREE
    declared = declaring_class(tree)
    if declared is None:
        return AdaptiveFacts(False, version=tree.version)
    table, config = default_table(tree), default_config(tree)
    reason = tree.function(PARAMS, "adaptive_unsupported_reason")
    needs_no_overlap = reason is not None and "disable_overlap_schedule" in ast.unparse(reason)
    return AdaptiveFacts(True, declared, per_batch=table is not None, zero_steps=table is not None
                         and zero_steps_allowed(tree), default_table=table or {}, default_config=config or {},
                         needs_no_overlap=needs_no_overlap,
                         version=tree.version)
