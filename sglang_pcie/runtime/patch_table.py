"""The runtime half of the patch register: per patch, what a process needs to decide whether the patch acts here
and how (its id, the module defining it, the payload its install and its baked diff both apply, the modules whose
import applies it, its opt-in), and the one gate every patch passes (``disabled_reason``).

Activation and the baked diffs' guard read it in every SGLang process, so it is data and imports nothing of
sglang-pcie (nothing else but ``dataclasses``). The other half, what people read (why, upstream references, the
releases covered, the removal condition), is ``sglang_pcie/patching/register.py``: one ``Entry`` per row here, in
the same order, whose ``module``, ``payload``, ``targets`` and ``opt_in`` are this table's.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OptIn:
    """The switch a patch needs before it is even registered."""
    setting: str  # the Settings attribute that must be true
    variable: str  # the environment variable behind it
    off_reason: str  # verify-patches' detail while it is not given


@dataclass(frozen=True)
class Row:
    id: str
    module: str  # the module defining PATCH (loaded only when a target is imported and the patch is wanted)
    # "module:function": ``function(original, *args, settings=settings)`` returns what replaces ``original``; the
    # runtime install (``Patch.wrapper``) and a baked diff's guard (runtime/baked.py) call it alike, each handing
    # down the settings the patch was gated with.
    payload: str
    targets: tuple[str, ...]  # modules whose import applies the patch
    opt_in: OptIn | None = None  # None: registered unless switched off (SGLANG_PCIE_DISABLE_PATCHES)


TABLE = (
    Row(id="sm120-allreduce-fusion",
        module="sglang_pcie.patching.sm120_allreduce_fusion",
        payload="sglang_pcie.runtime.baked:switched_on",
        targets=("sglang.srt.layers.flashinfer_comm_fusion", "sglang.srt.layers.communicator",
                 "sglang.srt.layers.layer_boundary.residual.add_norm"),
        opt_in=OptIn("sm120_fusion", "SGLANG_PCIE_SM120_FUSION", "opt-in: set SGLANG_PCIE_SM120_FUSION=1")),
    Row(id="eagle3-profile",
        module="sglang_pcie.patching.eagle3_profile",
        payload="sglang_pcie.runtime.eagle_profiler:wrap",
        targets=("sglang.srt.speculative.eagle_worker", "sglang.srt.speculative.eagle_worker_v2",
                 "sglang.srt.speculative.spec_info"),
        opt_in=OptIn("eagle3_profile", "EAGLE3_PROFILE", "EAGLE3_PROFILE is not set to 1")),
    Row(id="drafter-delegation",
        module="sglang_pcie.patching.drafter_delegation",
        payload="sglang_pcie.runtime.drafter_delegation:wrap",
        targets=("sglang.srt.model_executor.model_runner",)),
    Row(id="accept-length-alarm",
        module="sglang_pcie.patching.accept_length_alarm",
        payload="sglang_pcie.runtime.accept_alarm:wrap",
        targets=("sglang.srt.managers.tokenizer_manager",)),
    Row(id="node-agreement",
        module="sglang_pcie.patching.node_agreement",
        payload="sglang_pcie.runtime.agreement:wrap",
        targets=("sglang.srt.distributed.parallel_state",)),
    Row(id="draft-token-watch",
        module="sglang_pcie.patching.draft_token_watch",
        payload="sglang_pcie.runtime.draft_watch:wrap",
        targets=("sglang.srt.speculative.eagle_worker", "sglang.srt.speculative.eagle_worker_v2")),
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
