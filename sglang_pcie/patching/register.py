"""The patch register, as data: per patch id, why it exists, the upstream work it relates to (with that work's
state), when it can be removed, the releases it covers and how it is applied and checked; built on the runtime half
(``sglang_pcie/runtime/patch_table.py``: where its code lives, its payload, the modules it patches, the one switch
that gates it), whose fields each ``Entry`` gives as its own.

This module imports nothing of sglang-pcie but that table (and nothing else but ``dataclasses``). Activation and
the baked diffs' guard read only the table; tools, docs and the patches read this register. docs/patches.md is
generated from it (``ci/generate-docs``; a test fails when it is stale).
"""
from __future__ import annotations

from dataclasses import dataclass

from sglang_pcie.runtime import patch_table
from sglang_pcie.runtime.patch_table import (  # noqa: F401  (the runtime half, re-exported)
    COVERED, COVERED_RELEASES, DISABLE_PATCHES_REASON, OptIn, disabled_reason)

# The state of an upstream reference, as last checked (``checked`` on the entry).
OPEN, MERGED, CLOSED, RELEASED, FIXED = "open", "merged", "closed without merging", "released", "closed as fixed"


@dataclass(frozen=True)
class Reference:
    """Upstream work a patch relates to."""
    name: str  # "sglang PR #32330"
    url: str
    state: str  # OPEN, MERGED, CLOSED, RELEASED or FIXED
    note: str  # what it means for the patch

    def text(self) -> str:
        return f"{self.name} ({self.state}): {self.note}"


@dataclass(frozen=True)
class Entry:
    id: str  # the id of its row in the runtime half (runtime/patch_table.py)
    summary: str
    why: str
    upstream: tuple[Reference, ...]
    upstream_note: str  # said where there is no reference, or beside them
    checked: str  # when the references' states were last checked
    remove_when: str
    upstream_check: str  # how the static check tells that upstream already has it
    runtime_method: str  # how it is applied at runtime
    static_method: str  # how it is checked statically against a source tree
    # Where the patch's mark (runtime.results.MARKER_ATTR) tells that it acts in a process, in a release whose sources
    # carry its baked diff: "module:Class.member" (or "module:function"), candidates in order, the first whose module
    # defines it counting. tests/support/scripts/baked_switches.py reads it. A wrap patch's: its hooks' (``marked``).
    marked_here: tuple[str, ...] = ()
    # True where SGLang itself tolerates a target failing to import (its model registry skips such model modules):
    # ``verify-patches --runtime`` then notes the failure instead of reporting an error.
    targets_may_fail_to_import: bool = False

    @property
    def row(self) -> patch_table.Row:
        """The runtime half of this entry: its row in ``runtime/patch_table.py``."""
        return patch_table.row(self.id)

    @property
    def releases(self) -> str:  # covered releases, a version specifier naming the first and the last
        return self.row.releases

    @property
    def marked(self) -> tuple[str, ...]:
        return self.marked_here or tuple(f"{hook.module}:{hook.member}" for hook in self.row.hooks)

    @property
    def module(self) -> str:  # the module defining PATCH
        return self.row.module

    @property
    def payload(self) -> str:  # "module:function" the runtime install and the baked guard apply
        return self.row.payload

    @property
    def targets(self) -> tuple[str, ...]:  # modules whose import applies the patch
        return self.row.targets

    @property
    def opt_in(self) -> OptIn | None:  # None: registered unless switched off (SGLANG_PCIE_DISABLE_PATCHES)
        return self.row.opt_in

    def upstream_text(self) -> str:
        return "; ".join([ref.text() for ref in self.upstream] + ([self.upstream_note] if self.upstream_note else []))


def covered_span() -> str:
    """The covered releases as people read them: ``0.5.8-0.5.23``."""
    return f"{COVERED_RELEASES[0]}-{COVERED_RELEASES[-1]}"


_SGLANG = "https://github.com/sgl-project/sglang"

REGISTER = (
    Entry(
        id="sm120-allreduce-fusion",
        summary=("FlashInfer all-reduce + residual + RMSNorm fusion on SM120 (opt-in): the gate, the backend "
                 "resolver and the workspace preflight admit SM120 where it can run"),
        why=("On 8 x RTX PRO 6000 Blackwell (SM120) over PCIe the fusion is never used: the gate admits only SM90 "
             "and SM100, and from 0.5.14 the backend resolver raises for anything else, so every layer pays a plain "
             "NCCL all-reduce followed by separate residual and RMSNorm kernels."),
        upstream=(
            Reference("sglang PR #32330", f"{_SGLANG}/pull/32330", CLOSED,
                      "SM12x enablement, closed after a TP4 regression; the closing note asks for an explicit "
                      "opt-in or TP gating, validated at TP2, TP4 and TP8"),
            Reference("sglang issue #15650", f"{_SGLANG}/issues/15650", FIXED,
                      "auto-enabled fusion crashed CUDA-graph capture on SM120 without SM12x kernels; fixed by no "
                      "longer auto-enabling it there (PR #16283)"),
            Reference("FlashInfer PR #3903", "https://github.com/flashinfer-ai/flashinfer/pull/3903", MERGED,
                      "SM12x kernels for the TRT-LLM all-reduce the fusion runs"),
        ),
        upstream_note="",
        checked="2026-12-01",
        remove_when="SGLang's gate and resolver admit SM12x (with an explicit opt-in)",
        upstream_check=("every part the patch changes already admits SM12x: the gate's and (0.5.14+) the "
                        "resolver's capability tests name SM120 / SM12x / Blackwell besides SM90 and SM100, in any "
                        "order; a part still missing keeps the patch applicable for that part"),
        runtime_method=("only with SGLANG_PCIE_SM120_FUSION=1 (otherwise not registered): post-import hooks "
                        "compile the rewritten source of the gate module and flashinfer_comm_fusion, define the "
                        "SM120 helper there and swap __code__ of the gate, the resolver and the workspace preflight "
                        "in place (callers that imported the gate by name see it too)"),
        static_method=("ast: the gate's `<sm90> or <sm100>` test (any operand order, anywhere in the gate); the "
                       "`if not (<sm90> or <sm100>): raise` of flashinfer_comm_fusion (0.5.14+); the multicast "
                       "query in the preflight loop (0.5.11+); the SM120 probe the helper calls "
                       "(get_platform().is_sm120 from 0.5.19, sglang.srt.utils.is_sm120_supported before) resolved "
                       "in the tree"),
        marked_here=("sglang.srt.layers.flashinfer_comm_fusion:_sglang_pcie_sm120_opted_in",
                     "sglang.srt.layers.communicator:_sglang_pcie_sm120_opted_in"),
    ),
    Entry(
        id="eagle3-profile",
        summary="EAGLE3_PROFILE=1: per-phase timers (draft, verify, re-extend, cycle) for SGLang's EAGLE workers",
        why=("A per-phase breakdown of one speculative cycle (draft 0.89 ms, verify 18.67 ms, re-extend 0.28 ms) "
             "showed that verify communication, not drafter quality, was the bottleneck. SGLang has no such "
             "breakdown (its speculative spans are missing on the spec-v2 paths) and hand-added timers are lost at "
             "each upgrade."),
        upstream=(),
        upstream_note="none: SGLang's speculative tracing spans do not time the spec-v2 phases on the GPU",
        checked="2026-12-01",
        remove_when="SGLang reports GPU-timed per-phase figures for its EAGLE workers itself",
        upstream_check=("never upstream so far; statically: the worker modules exist with the phase methods and "
                        "the cycle method calls each phase method"),
        runtime_method=("post-import hook on eagle_worker / eagle_worker_v2 replaces the phase methods of "
                        "EAGLEWorker, EAGLEWorkerV2 and EagleDraftWorker by "
                        "sglang_pcie.patches.eagle3_profile.payload.wrap(...) wrappers; only when EAGLE3_PROFILE=1"),
        static_method="ast: classes and methods present, the cycle method calls every phase method",
        marked_here=("sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2.verify",),
    ),
    Entry(
        id="drafter-delegation",
        summary=("EAGLE-3 drafters on wrapper target models (Kimi-K2.5 on 0.5.9 and more): forward the EAGLE-3 "
                 "methods"),
        why=("EAGLE-3 asks the target model to capture auxiliary hidden states and to share its embedding and LM "
             "head. Multimodal wrappers (KimiK25ForConditionalGeneration holds DeepSeek-V3 as language_model) do "
             "not forward those calls, so an EAGLE-3 drafter cannot run on them without a hand patch."),
        upstream=(
            Reference("sglang 0.5.10", f"{_SGLANG}/releases/tag/v0.5.10", RELEASED,
                      "added set_eagle3_layers_to_capture / get_embed_and_head / set_embed_and_head to "
                      "KimiK25ForConditionalGeneration; other wrappers still lack them"),
        ),
        upstream_note="",
        checked="2026-12-01",
        remove_when="no model class of the oldest supported release qualifies (verify-patches says upstream)",
        upstream_check=("every class holding an EAGLE-3-capable language model that its forward uses already "
                        "defines (or inherits) the methods EAGLE calls on the target"),
        runtime_method=("post-import hook on model_runner wraps ModelRunner.load_model; only in an EAGLE run, once "
                        "the target model is loaded, a class lacking the EAGLE methods that holds one language "
                        "model having them, run whole by its forward, gains methods forwarding to it (logged at "
                        "first use)"),
        static_method=("ast of model_runner for every name the wrapper relies on; ast of the EAGLE workers for the "
                       "methods they call on the target; text outline of srt/models plus ast of the candidate "
                       "classes for the classes that would gain methods"),
    ),
    Entry(
        id="accept-length-alarm",
        summary=("EAGLE runs: one warning per server (and a Prometheus gauge) when the drafter's drafts are almost "
                 "never accepted, naming the likely causes and the check-drafter command"),
        why=("Speculative decoding is lossless, so a broken drafter (a wrong d2t map, wrong aux hidden-state layer "
             "ids) loads, serves correct text and is silently useless: the Kimi-K2.5 deployment lost days to it. "
             "On one H200 a drafter with its d2t shifted by one within its hot set served token-identical outputs at "
             "accept length 1.00 instead of 2.68 and 0.465x batch throughput, with no warning anywhere "
             "(benchmarks/results/2026-12-02-h200/round3/gpu-bound.stdout)."),
        upstream=(),
        upstream_note="none: SGLang logs the accept length but never judges it",
        checked="2026-12-01",
        remove_when="SGLang warns by itself when an EAGLE drafter's drafts are almost never accepted",
        upstream_check=("never upstream so far; statically: TokenizerManager._calculate_spec_decoding_metrics "
                        "exists, reads the per-request verify and accepted-draft counters, and is called only for "
                        "finished requests"),
        runtime_method=("post-import hook on tokenizer_manager wraps TokenizerManager._calculate_spec_decoding_metrics "
                        "(called once per finished request of a speculative run; or the one component class the "
                        "module imports that has it, where SGLang moved it) with "
                        "sglang_pcie.patches.accept_length_alarm.payload.wrap; it acts only in EAGLE / EAGLE3 runs"),
        static_method=("ast: the class and method with its (self, meta_info, recv_obj, i) parameters (followed to the "
                       "one component class tokenizer_manager imports, where it moved), the counters it reads on "
                       "recv_obj, every call of it (through self, an attribute of self or the class) inside an "
                       "`if ...finished:` branch; where it went when it is gone (the module and class now defining "
                       "it, the files now calling it)"),
    ),
    Entry(
        id="node-agreement",
        summary=("multi-node servers: every node's NCCL and all-reduce-path settings compared once at start, before "
                 "NCCL's first collective; differing nodes named (SGLANG_PCIE_STRICT=1: the start stops)"),
        why=("Each node's launcher makes its own NCCL decision from its own GPUs, tuned file and shell. NCCL ranks "
             "that disagree on protocol or algorithm hang at some message sizes, typically at the first large "
             "prefill of a two-box server, and nothing says why."),
        upstream=(
            Reference("NCCL issue #1136", "https://github.com/NVIDIA/nccl/issues/1136", CLOSED,
                      "hosts whose NCCL chose different algorithms / protocols (from their CPU vendors) hung "
                      "allReduce at some sizes; pinning NCCL_ALGO / NCCL_PROTO alike on every node avoids it"),
            Reference("NCCL issue #626", "https://github.com/NVIDIA/nccl/issues/626", CLOSED,
                      "multi-node hang; the maintainers ask to set the environment consistently on every rank"),
            Reference("NCCL issue #1478", "https://github.com/NVIDIA/nccl/issues/1478", CLOSED,
                      "NCCL_IB_HCA set differently per rank of a node breaks NCCL's rings: host-specific variables "
                      "are compared within a node"),
        ),
        upstream_note="SGLang does not compare its nodes' NCCL settings; each rank's NCCL reads its own environment",
        checked="2026-12-01",
        remove_when="SGLang or NCCL checks that every rank runs the same NCCL settings",
        upstream_check="never upstream so far; statically: the hook and what it relies on are there",
        runtime_method=("post-import hook on parallel_state wraps init_distributed_environment; after its first "
                        "call, only where the launch spans nodes (SGLANG_PCIE_NNODES > 1, or more ranks than GPUs "
                        "here), each rank writes its settings to torch's default store and reads every rank's "
                        "(bounded wait); differences are logged by the first rank of each node"),
        static_method=("ast of parallel_state: init_distributed_environment defined at module level, reaches "
                       "torch.distributed.init_process_group (without device_id) and runs no collective but behind a "
                       "launch option (named in the detail), the world group builds no PyNccl communicator, "
                       "initialize_model_parallel is there"),
    ),
    Entry(
        id="draft-token-watch",
        summary=("EAGLE-3 runs: the drafter's vocabulary map checked against the heads at load, and in chain runs "
                 "the target tokens it proposes first that are never accepted; one warning per server naming the "
                 "wrong entries and the check-drafter command"),
        why=("A drafter with 10% of its d2t permuted within its hot set served identical text at accept length 2.51 "
             "instead of 2.76 and 0.89x batch throughput on one H200, far above the accept-length alarm's 1.10; the "
             "Kimi-K2.5 deployment's drafter built for the previous model revision gave about 1.5 instead of 2.0. "
             "Only check-drafter, run by hand, named them."),
        upstream=(),
        upstream_note="none: SGLang counts accepted drafts per request, never per proposed token",
        checked="2026-12-07",
        remove_when="SGLang reports per-token draft acceptance or checks the drafter's vocabulary map itself",
        upstream_check=("never upstream so far; statically: the worker classes' verify(self, batch), "
                        "LogitsProcessor.forward(self, input_ids, hidden_states, lm_head, logits_metadata) and the "
                        "names the count reads (next_token_logits, is_target_verify, input_ids, seq_lens, spec_info, "
                        "EagleVerifyInput.topk), the load steps (EagleDraftWorker.init_lm_head, "
                        "EAGLEWorker.init_cuda_graphs) and the map they bind"),
        runtime_method=("post-import hook on eagle_worker / eagle_worker_v2 wraps EagleDraftWorker.init_lm_head "
                        "(after it) and EAGLEWorker.init_cuda_graphs (before it) with the map check at load (once, TP "
                        "rank 0: every draft lm_head row against its mapped target row, rows that do not line up "
                        "scanned against every target row); on logits_processor it wraps LogitsProcessor.forward: in "
                        "the target's verify forward one Triton kernel counts per target token the first drafts, "
                        "those that are the target's argmax and the context buckets (TP rank 0, top-k 1, "
                        "EagleVerifyInput only); SGLang captures it with the forward in its CUDA graphs, so every "
                        "graph-run verify is counted at no host cost, an eager verify on the watch's turn only; "
                        "EAGLEWorker.verify and EAGLEWorkerV2.verify are wrapped with the watch's turn (one verify in "
                        "stride, at most 0.05% of the verify interval in host time, as measured): a non-blocking "
                        "read-back at 1, 2, 4, 8 s, then every 10 s, and the judging"),
        static_method=("ast: the worker classes and verify(self, batch) (own or inherited), "
                       "LogitsProcessor.forward and its parameters, next_token_logits in logits_processor, "
                       "is_target_verify / input_ids / seq_lens / spec_info in forward_batch_info, the class "
                       "EagleVerifyInput and topk in eagle_info, the load steps and the names hot_token_id / "
                       "target_worker where they are defined"),
    ),
)


def entry(patch_id: str) -> Entry:
    for item in REGISTER:
        if item.id == patch_id:
            return item
    raise KeyError(patch_id)


def ids() -> list[str]:
    return [item.id for item in REGISTER]
