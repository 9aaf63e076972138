"""draft-token-watch's count of a target verify's first drafts: one Triton kernel, no host synchronisation.

It is launched from SGLang's logits processor in the target's verify forward (``payload.wrap``, kind
``verify-logits``), so where SGLang captures that forward in a CUDA graph (every batch size it captured) the kernel
is captured with it and runs on every verify at no host cost; an eager verify launches it only on the watch's turn.

One program per request of the verify batch. SGLang's verify input holds, per request, the verified token (the
first draft's context) and then the chain's drafts (``EagleVerifyInput.draft_token``, the forward's input ids), and
the target's logits hold one row per position. The first draft **agrees** with the target where it is the first
index of the maximum of the target's row at the verified token: the token greedy decoding takes there, SGLang's
``argmax`` (so whether greedy verification accepts it). Counted per target token: first drafts, those agreeing,
and the context bucket (verified token & ``buckets - 1``) it was proposed in.

Rows whose ``seq_lens`` is below 2 are not counted: SGLang pads a captured batch up to the graph's size and fills
the padded rows' ``seq_lens`` with its fill value (1 on every attention backend, 0 in the base class) while their
input ids are stale (a previous batch's); a real request's verified token follows at least one token, except at the
first verify of a one-token prompt (left out). A first draft outside the vocabulary is not counted.

This module imports triton: the watch imports it only where it counts on a GPU (tests: ``TRITON_INTERPRET=1``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048  # logits read per loop step


@triton.jit
def _count_first_drafts(logits, row_stride, input_ids, seq_lens, counts, contexts, per_request,
                        VOCAB: tl.constexpr, BLOCK: tl.constexpr, BUCKETS: tl.constexpr):
    request = tl.program_id(0)
    first = request.to(tl.int64) * per_request
    verified = tl.load(input_ids + first)
    draft = tl.load(input_ids + first + 1)
    counted = (tl.load(seq_lens + request) >= 2) & (draft >= 0) & (draft < VOCAB)
    draft = tl.where(counted, draft, 0)
    row = logits + first * row_stride  # the target's logits at the verified token
    chosen = tl.load(row + draft).to(tl.float32)
    # the draft agrees where no logit beats it and none before it equals it (argmax takes the first maximum)
    beaten = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, VOCAB, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        values = tl.load(row + offsets, mask=offsets < VOCAB, other=float("-inf")).to(tl.float32)
        beaten += ((values > chosen) | ((values == chosen) & (offsets < draft))).to(tl.int32)
    agrees = tl.sum(beaten, 0) == 0
    tl.atomic_add(counts + draft, 1, mask=counted, sem="relaxed")
    tl.atomic_add(counts + VOCAB + draft, agrees.to(tl.int64), mask=counted, sem="relaxed")
    tl.store(contexts + draft.to(tl.int64) * BUCKETS + (verified & (BUCKETS - 1)), 1, mask=counted)


def launch(logits, input_ids, seq_lens, counts, contexts) -> None:
    """Count one verify: ``logits`` [requests x per_request, vocab] (rows contiguous), ``input_ids`` [requests x
    per_request], ``seq_lens`` [requests]; into ``counts`` (int64: first drafts per token, then agreeing ones, each
    ``vocab`` long) and ``contexts`` (uint8 [vocab, buckets]: 1 where the token was proposed in that bucket)."""
    requests = seq_lens.shape[0]
    vocab, buckets = contexts.shape
    # the vocabulary is fixed per server: a compile-time constant (one compilation per server)
    _count_first_drafts[(requests,)](logits, logits.stride(0), input_ids, seq_lens, counts, contexts,
                                     input_ids.shape[0] // requests, VOCAB=vocab, BLOCK=BLOCK, BUCKETS=buckets)


def verify_inputs(batch, logits):
    """(input ids, seq_lens) of a target verify forward whose rows the kernel can count (a chain's verified token
    and at least one draft per request, one logits row per input id, rows contiguous), else None."""
    input_ids, seq_lens = getattr(batch, "input_ids", None), getattr(batch, "seq_lens", None)
    if not (isinstance(input_ids, torch.Tensor) and isinstance(seq_lens, torch.Tensor)) or seq_lens.dim() != 1:
        return None
    requests, rows = int(seq_lens.shape[0]), int(input_ids.numel())
    if requests == 0 or rows % requests or rows // requests < 2 or logits.shape[0] != rows or logits.stride(1) != 1:
        return None
    if input_ids.device != logits.device or seq_lens.device != logits.device:
        return None
    return input_ids.reshape(-1), seq_lens
