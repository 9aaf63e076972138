"""draft-token-watch driven through its verify wrapper with SGLang-shaped inputs on CPU tensors, in a real SGLang
install (torch, numpy); prints one JSON object: scenario -> what the watch did."""
import json
import logging
import math
import sys
from types import SimpleNamespace as NS

import numpy as np
import torch

from sglang_pcie.patches.draft_token_watch import payload as dw


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def worker(tp_rank=0, topk=1, vocab=50):
    args = NS(speculative_algorithm="EAGLE3", model_path="/m/target", speculative_draft_model_path="/m/draft",
              speculative_num_steps=3, speculative_eagle_topk=topk)
    return NS(tp_rank=tp_rank, topk=topk, server_args=args, target_worker=NS(model_config=NS(vocab_size=vocab)))


VERIFIED = iter(range(10 ** 9))  # the verified tokens before the drafts: a new one each row (varied contexts)


def batch(first, accepted_drafts, steps=3, verified=None):
    """Per request [verified token, first draft, more drafts], flattened as SGLang holds draft_token."""
    draft = torch.zeros((len(first), steps + 1), dtype=torch.int64)
    draft[:, 1] = torch.tensor(first)
    draft[:, 0] = torch.tensor(verified if verified is not None else [next(VERIFIED) for _ in first])
    return NS(spec_info=NS(draft_token=draft.reshape(-1)), accepted=list(accepted_drafts))


def v2_verify(self, b):
    b.spec_info = "the next draft input"  # verify rebinds it, as SGLang's do
    return NS(accept_lens=torch.tensor(b.accepted, dtype=torch.int32) + 1)


def v1_verify(self, b):
    b.spec_info = "the next draft input"
    return ("logits", NS(num_correct_drafts_per_req_cpu=list(b.accepted)), True)


def fresh():
    clock = Clock()
    watch = dw.DraftWatch(clock=clock, look_seconds=1.0, first_stride=1)
    dw.set_watch(watch)
    return watch, clock


def counting(kind):
    watch, clock = fresh()
    wrapped = dw.wrap(v2_verify if kind == "v2" else v1_verify, kind)
    for _ in range(3):
        clock.now += 0.01
        wrapped(worker(), batch([7, 7, 9, 60], [0, 2, 1, 3]))
    watch.count_buffered()
    c = watch.counts.tolist()
    return {"proposed": {t: c[t] for t in (7, 9, 49)}, "accepted": {t: c[50 + t] for t in (7, 9, 49)},
            "total": sum(c[:50]), "sampled": watch.sampled, "state": watch.state}


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def repeated_contexts(verifies=600, seed=4):
    """The tokenwise test pair's traffic: each token is only ever drafted after one verified token (its one
    context), and the healthy drafter misses 1 token in 5 in its context, every time."""
    watch, clock = fresh()
    wrapped = dw.wrap(v2_verify, "v2")
    rng = np.random.default_rng(seed)
    for _ in range(verifies):
        clock.now += 0.01
        first = rng.integers(0, 40, 8)
        drafts = np.where(first % 5 == 0, 0, rng.integers(1, 3, 8))
        wrapped(worker(), batch(first.tolist(), drafts.tolist(), verified=(first + 1).tolist()))
    return {"state": watch.state, "lines": watch.lines, "looks": watch.looks}


def traffic(wrong, verifies=600, seed=3):
    watch, clock = fresh()
    records = Records()
    logging.getLogger("types").addHandler(records)  # the watch logs to the worker's module logger (here: types)
    logging.getLogger("types").setLevel(logging.INFO)
    wrapped = dw.wrap(v2_verify, "v2")
    rng = np.random.default_rng(seed)
    for _ in range(verifies):
        clock.now += 0.01
        first = rng.integers(0, 40, 8)
        drafts = np.where(np.isin(first, wrong), 0, rng.integers(0, 3, 8))
        wrapped(worker(), batch(first.tolist(), drafts.tolist()))
    logging.getLogger("types").removeHandler(records)
    return {"state": watch.state, "lines": watch.lines, "looks": watch.looks, "calls": watch.calls,
            "top": sorted(t for t, _ in (watch.finding or {}).get("top", [])), "logged": records.lines}


def buffer_wraps():
    """More first drafts than the GPU buffer holds: counted in bulk each time it fills, none lost."""
    saved, dw.BUFFER_ROWS = dw.BUFFER_ROWS, 10
    try:
        watch, clock = fresh()
        wrapped = dw.wrap(v2_verify, "v2")
        for i in range(9):  # 9 x 4 rows through a buffer of 10
            clock.now += 0.01
            wrapped(worker(), batch([i, i, 20, 21], [1, 0, 2, 0]))
        before = int(watch.counts.sum())
        watch.count_buffered()
        c = watch.counts.tolist()
    finally:
        dw.BUFFER_ROWS = saved
    return {"counted_before_flush": before, "proposed": c[:50], "accepted": c[50:], "sampled": watch.sampled}


def stride():
    watch, clock = fresh()
    wrapped = dw.wrap(v2_verify, "v2")
    real_count, real_bind = watch._count, watch._bind

    def slow_count(*args):  # the watch's own work: 20 us of the clock; the verify interval: 10 ms
        clock.now += 20e-6
        real_count(*args)

    def slow_bind(*args):  # a one-time set-up of 50 ms must not count as per-verify cost
        clock.now += 0.05
        return real_bind(*args)
    watch._count, watch._bind = slow_count, slow_bind
    for _ in range(400):
        clock.now += 0.01
        wrapped(worker(), batch([1, 2], [1, 1]))
    return {"stride": watch.stride, "expected": math.ceil(20e-6 / (dw.COST_SHARE * 0.01)),
            "cost_share": watch.own_seconds / watch.calls / 0.01, "sampled": watch.sampled, "calls": watch.calls,
            "setup": watch.setup_seconds, "cost_text": watch.cost_text()}


def left_alone(w):
    watch, clock = fresh()
    wrapped = dw.wrap(v2_verify, "v2")
    wrapped(w, batch([1, 2], [1, 1]))
    calls = watch.calls
    wrapped(w, batch([1, 2], [1, 1]))
    return {"state": watch.state, "lines": watch.lines, "counts": watch.counts is None, "calls_after": watch.calls,
            "calls_before": calls}


def no_drafts():
    """Adaptive steps at 0 (SGLang's trivial verify input): one token per request, no draft: nothing counted."""
    watch, clock = fresh()
    wrapped = dw.wrap(v2_verify, "v2")
    for _ in range(3):
        clock.now += 0.01
        wrapped(worker(), NS(spec_info=NS(draft_token=torch.tensor([5, 6, 7])), accepted=[0, 0, 0]))
    wrapped(worker(), batch([7, 8], [1, 0]))
    watch.count_buffered()
    return {"state": watch.state, "lines": watch.lines, "total": int(watch.counts[:50].sum())}


def read_backs():
    """When the counts are read back: [verify, first drafts counted] at each read-back requested."""
    watch, clock = fresh()
    wrapped = dw.wrap(v2_verify, "v2")
    reads = []
    for i in range(1, 503):
        clock.now += 1.0 if i == 501 else 0.001  # verify 501 completes the read-back of verify 500
        wrapped(worker(), batch([j % 40 for j in range(i, i + 8)], [1] * 8))
        if watch.counted_at_read != (reads[-1][1] if reads else 0):
            reads.append([i, watch.counted_at_read])
    return reads


class OnGpu(torch.Tensor):
    """A draft_token that says it is on the GPU (the capture check's path), held on the CPU."""

    @property
    def is_cuda(self):
        return True


def graph_capture():
    """The GPU path while SGLang captures its CUDA graphs: a verify inside a capture neither binds the watch
    (buffers made in a capture belong to the graph) nor counts (the copies would be baked into the graph)."""
    watch, clock = fresh()
    wrapped = dw.wrap(v2_verify, "v2")
    capturing = [True]
    real, torch.cuda.is_current_stream_capturing = torch.cuda.is_current_stream_capturing, lambda: capturing[0]
    steps = []
    try:
        for capture, first in ((True, [1, 2]), (False, [3, 4, 5]), (True, [6]), (False, [7, 8])):
            capturing[0] = capture
            clock.now += 0.01
            b = batch(first, [1] * len(first))
            b.spec_info.draft_token = b.spec_info.draft_token.as_subclass(OnGpu)
            wrapped(worker(), b)
            steps.append([capture, watch.counts is not None, watch.sampled, watch.counted])
    finally:
        torch.cuda.is_current_stream_capturing = real
    watch.count_buffered()
    c = watch.counts.tolist()
    return {"steps": steps, "proposed": [t for t in range(50) for _ in range(c[t])], "state": watch.state}


def v1_called_with_its_verify_input():
    """v1 up to 0.5.11 is called as ``verify(batch, spec_info)`` while ``batch.spec_info`` still holds the draft
    input (0.5.9's scheduler): the watch counts the spec_info it is handed."""
    watch, clock = fresh()

    def verify_0_5_9(self, b, spec_info):
        return ("logits", NS(num_correct_drafts_per_req_cpu=list(b.accepted)), True)

    wrapped = dw.wrap(verify_0_5_9, "v1")
    for _ in range(2):
        clock.now += 0.01
        given = batch([1, 2], [1, 0])
        wrapped(worker(), NS(spec_info=NS(kind="the draft input"), accepted=given.accepted), given.spec_info)
    if watch.counts is None:  # never bound (the bug: it read the draft input and went off)
        return {"state": watch.state, "lines": watch.lines, "proposed": None}
    watch.count_buffered()
    return {"state": watch.state, "lines": watch.lines, "proposed": int(watch.counts[:50].sum())}


def rank_from_sglang():
    """0.5.23's EAGLEWorkerV2 has no tp_rank: the rank comes from SGLang's parallel state (runtime_context), here
    set through its own override; rank 1 is left alone, rank 0 watches."""
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    real = object.__new__(EAGLEWorkerV2)
    template = worker()
    real.server_args, real.topk, real._target_worker = template.server_args, 1, template.target_worker
    out = {"has_tp_rank": hasattr(real, "tp_rank")}
    for rank in (1, 0):
        watch, clock = fresh()
        wrapped = dw.wrap(v2_verify, "v2")
        with get_parallel().override(tp_rank=rank):
            clock.now += 0.01
            wrapped(real, batch([1, 2], [1, 1]))
        out[f"rank_{rank}"] = {"state": watch.state, "bound": watch.counts is not None, "lines": watch.lines}
    return out


def error():
    watch, clock = fresh()
    wrapped = dw.wrap(lambda self, b: NS(accept_lens="not a tensor"), "v2")
    result = wrapped(worker(), batch([1, 2], [1, 1]))
    return {"returned": result.accept_lens, "state": watch.state, "lines": watch.lines}


print(json.dumps({
    "count_v2": counting("v2"), "count_v1": counting("v1"),
    "wrong": traffic([3, 13, 23, 33]), "healthy": traffic([]),
    "stride": stride(),
    "tp1": left_alone(worker(tp_rank=1)), "tree": left_alone(worker(topk=4)),
    "error": error(), "no_drafts": no_drafts(), "buffer_wraps": buffer_wraps(),
    "repeated_contexts": repeated_contexts(), "graph_capture": graph_capture(),
    "read_backs": read_backs(), "v1_spec_info": v1_called_with_its_verify_input(),
    "rank_from_sglang": rank_from_sglang(),
}))
