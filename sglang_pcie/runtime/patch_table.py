"""The runtime half of the patch register: per patch, what a process needs to decide whether the patch acts here
and how (its id, the payload its install and its baked diff both apply, the releases it covers, its hook points or
the module holding its own install, its opt-in), and the one gate every patch passes (``disabled_reason``).

Activation and the baked diffs' guard read it in every SGLang process, so it is data and imports nothing of
sglang-pcie (nothing else but ``dataclasses``). The other half, what people read (why, upstream references, the
removal condition), is ``sglang_pcie/patching/register.py``: one ``Entry`` per row here, in the same order, whose
runtime fields are this table's.
"""
from __future__ import annotations

from dataclasses import dataclass

# The SGLang releases every patch is checked and tested against, oldest first: the one place they are listed.
# Adding a release is one line here, then the generated files: ci/prepare-release-diffs NEW (the diffs, or what
# needs a human), ci/generate-diffs, ci/generate-docs, ci/check-sglang-releases ... --markdown-out COMPATIBILITY.md.
COVERED_RELEASES = (
    "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1",
    "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18",
    "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)
# A patch's ``releases`` where it covers them all (a patch written for fewer names its own first and last).
COVERED = f">={COVERED_RELEASES[0]},<={COVERED_RELEASES[-1]}"


@dataclass(frozen=True)
class OptIn:
    """The switch a patch needs before it is even registered."""
    setting: str  # the Settings attribute that must be true
    variable: str  # the environment variable behind it
    off_reason: str  # verify-patches' detail while it is not given


@dataclass(frozen=True)
class Hook:
    """One member of SGLang a wrap patch replaces by ``payload(original, *args, settings=...)``: declared once,
    read by the runtime install and check (``runtime/hooks.py``), the baked diff's lines and ``marked``."""
    module: str  # the module whose import applies it
    member: str  # "function" (module level) or "Class.method" (own or inherited, wrapped on the class)
    says: str  # the detail while it is in effect ("{member}": where it was found, e.g. a component class's)
    args: tuple = ()  # handed to the payload after the original
    parameters: tuple[str, ...] = ()  # the leading parameters the member must take
    own: bool = False  # the class must define the method itself (inherited is drift)
    # "module:function" (module, cls) -> the class to wrap, where SGLang may have moved the method to another class
    owner: str = ""
    # "module:function" (module) -> why the hook would not be in effect here, or None; asked before wrapping and by
    # the runtime check
    problem: str = ""
    optional: bool = False  # a release may lack the module (the patch is then not applicable there)
    # where the baked diff binds the guard: "decorate" (above the member, the guard before its class or function),
    # "after-class" (a rebinding line after the class) or "at-end" (a rebinding line at the end of the module)
    diff: str = "decorate"

    @property
    def cls(self) -> str:
        return self.member.rpartition(".")[0]

    @property
    def name(self) -> str:
        return self.member.rpartition(".")[2]


@dataclass(frozen=True)
class Row:
    id: str
    # "module:function": ``function(original, *args, settings=settings)`` returns what replaces ``original``; the
    # runtime install and a baked diff's guard (runtime/baked.py) call it alike, each handing down the settings the
    # patch was gated with.
    payload: str
    hooks: tuple[Hook, ...] = ()  # a wrap patch's hook points; () for a patch with an install of its own
    # the module defining PATCH: its static check, diff and runtime check (never imported by activation)
    module: str = ""
    # a patch without hooks: "module:function", ``function(module, settings)`` -> Result, its install in a server
    install: str = ""
    targets: tuple[str, ...] = ()  # modules whose import applies the patch; () = those of its hooks
    opt_in: OptIn | None = None  # None: registered unless switched off (SGLANG_PCIE_DISABLE_PATCHES)
    releases: str = COVERED  # covered releases, a version specifier naming the first and the last

    def __post_init__(self):
        if not self.targets:
            object.__setattr__(self, "targets", tuple(dict.fromkeys(hook.module for hook in self.hooks)))


_TURN = "its turn: the looks at the first drafts counted"
_COUNTED = ("counting each target verify's first drafts per token in LogitsProcessor.forward (captured in SGLang's "
            "CUDA graphs: every verify)")
_MAP_AT_LOAD = "checking the vocabulary map at load (the drafter's lm_head rows against the target's)"
TABLE = (
    Row(id="sm120-allreduce-fusion",
        module="sglang_pcie.patches.sm120_allreduce_fusion.check",
        install="sglang_pcie.patches.sm120_allreduce_fusion.swap:install",
        payload="sglang_pcie.runtime.baked:switched_on",
        targets=("sglang.srt.layers.flashinfer_comm_fusion", "sglang.srt.layers.communicator",
                 "sglang.srt.layers.layer_boundary.residual.add_norm"),
        opt_in=OptIn("sm120_fusion", "SGLANG_PCIE_SM120_FUSION", "opt-in: set SGLANG_PCIE_SM120_FUSION=1")),
    Row(id="eagle3-profile",
        module="sglang_pcie.patches.eagle3_profile.check",
        install="sglang_pcie.patches.eagle3_profile.install:install",
        payload="sglang_pcie.patches.eagle3_profile.payload:wrap",
        targets=("sglang.srt.speculative.eagle_worker", "sglang.srt.speculative.eagle_worker_v2",
                 "sglang.srt.speculative.spec_info"),
        opt_in=OptIn("eagle3_profile", "EAGLE3_PROFILE", "EAGLE3_PROFILE is not set to 1")),
    Row(id="drafter-delegation",
        module="sglang_pcie.patches.drafter_delegation.check",
        payload="sglang_pcie.patches.drafter_delegation.payload:wrap",
        hooks=(Hook("sglang.srt.model_executor.model_runner", "ModelRunner.load_model", own=True,
                    problem="sglang_pcie.patches.drafter_delegation.payload:hook_problem", diff="after-class",
                    says="ModelRunner.load_model wrapped: acts once an EAGLE run's target model is loaded"),)),
    Row(id="accept-length-alarm",
        module="sglang_pcie.patches.accept_length_alarm.check",
        payload="sglang_pcie.patches.accept_length_alarm.payload:wrap",
        hooks=(Hook("sglang.srt.managers.tokenizer_manager", "TokenizerManager._calculate_spec_decoding_metrics",
                    parameters=("self", "meta_info", "recv_obj", "i"),
                    owner="sglang_pcie.patches.accept_length_alarm.payload:owner",
                    says="watching {member} (one warning per server when EAGLE drafts are almost never accepted)"),)),
    Row(id="node-agreement",
        module="sglang_pcie.patches.node_agreement.check",
        payload="sglang_pcie.patches.node_agreement.payload:wrap",
        hooks=(Hook("sglang.srt.distributed.parallel_state", "init_distributed_environment",
                    problem="sglang_pcie.patches.node_agreement.payload:hook_problem",
                    says="init_distributed_environment wrapped: in a server spanning nodes, every node's NCCL settings "
                         "are compared once, before NCCL's first collective"),)),
    Row(id="draft-token-watch",
        module="sglang_pcie.patches.draft_token_watch.check",
        payload="sglang_pcie.patches.draft_token_watch.payload:wrap",
        hooks=(Hook("sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2.verify", args=("v2",),
                    parameters=("self", "batch"), optional=True, diff="at-end",
                    says=f"watching v2 EAGLEWorkerV2.verify ({_TURN})"),
               Hook("sglang.srt.speculative.eagle_worker", "EAGLEWorker.verify", args=("v1",),
                    parameters=("self", "batch"), optional=True, diff="at-end",
                    says=f"watching v1 EAGLEWorker.verify ({_TURN})"),
               Hook("sglang.srt.layers.logits_processor", "LogitsProcessor.forward", args=("verify-logits",),
                    parameters=("self", "input_ids", "hidden_states", "lm_head", "logits_metadata"), optional=True,
                    diff="at-end", says=_COUNTED),
               Hook("sglang.srt.speculative.eagle_worker_v2", "EagleDraftWorker.init_lm_head", args=("load-v2",),
                    parameters=("self",), optional=True, diff="at-end",
                    says=f"{_MAP_AT_LOAD} after v2 EagleDraftWorker.init_lm_head"),
               Hook("sglang.srt.speculative.eagle_worker", "EAGLEWorker.init_cuda_graphs", args=("load-v1",),
                    parameters=("self",), optional=True, diff="at-end",
                    says=f"{_MAP_AT_LOAD} before v1 EAGLEWorker.init_cuda_graphs"))),
)


def row(patch_id: str) -> Row:
    for item in TABLE:
        if item.id == patch_id:
            return item
    raise KeyError(patch_id)


def ids() -> list[str]:
    return [item.id for item in TABLE]


DISABLE_PATCHES_REASON = "listed in SGLANG_PCIE_DISABLE_PATCHES"
# A list naming an id that is no patch is not half-applied (the ids it names rightly off, the rest on): the user's
# intent to switch something off cannot be read, so every patch is off, as a kill switch that is not a boolean is
# read as on. One warning where sglang is imported names the ids (settings.unknown_patch_ids); the CLI exits 2.
UNKNOWN_ID_REASON = ("SGLANG_PCIE_DISABLE_PATCHES names an id that is no patch: every patch off until it names only"
                     " patch ids")


def unknown_ids(settings) -> list[str]:
    """The ids ``settings.disabled_patches`` names that are no patch of the table, sorted."""
    return sorted(settings.disabled_patches.difference(ids()))


def disabled_reason(entry, settings) -> str | None:
    """The one gate of every patch: why ``entry`` (a ``Row``, or the register's ``Entry`` of the same id) is not
    registered under ``settings``, or None when it is."""
    if settings.disabled:
        return "SGLANG_PCIE_DISABLE is set"
    if unknown_ids(settings):
        return UNKNOWN_ID_REASON
    if entry.id in settings.disabled_patches:
        return DISABLE_PATCHES_REASON
    if entry.opt_in is not None and not getattr(settings, entry.opt_in.setting):
        return entry.opt_in.off_reason
    return None
