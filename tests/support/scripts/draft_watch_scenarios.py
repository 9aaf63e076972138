"""draft-token-watch driven through its two wrappers (the EAGLE worker's verify: the watch's turn; SGLang's logits
processor: the count) with SGLang-shaped inputs on CPU tensors, in a real SGLang install (its ForwardMode and
EagleVerifyInput, torch, numpy), the count's Triton kernel run by Triton's interpreter; prints one JSON object:
scenario -> what the watch did."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernel runs on the CPU

import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
from types import SimpleNamespace as NS  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.speculative.eagle_info import EagleVerifyInput  # noqa: E402

from sglang_pcie.patches.draft_token_watch import payload as dw  # noqa: E402
from sglang_pcie.patches.draft_token_watch import verify_count  # noqa: E402

VOCAB = 50
FILL = 1  # SGLang's seq_lens fill value for a captured batch's padded rows


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def worker(tp_rank=0, topk=1):
    args = NS(speculative_algorithm="EAGLE3", model_path="/m/target", speculative_draft_model_path="/m/draft",
              speculative_num_steps=3, speculative_eagle_topk=topk)
    return NS(tp_rank=tp_rank, topk=topk, server_args=args)


def verify_input(topk=1):
    spec = object.__new__(EagleVerifyInput)  # SGLang's own class, as the target's verify forward carries it
    spec.topk = topk
    return spec


VERIFIED = iter(range(10 ** 9))  # the verified tokens before the drafts: a new one each row (varied contexts)


def forward(first, chosen, steps=3, verified=None, seq_lens=None, topk=1, mode=ForwardMode.TARGET_VERIFY):
    """A target verify forward as the logits processor sees it: per request [verified token, first draft, more
    drafts] as input ids, and logits whose row at the verified token peaks at ``chosen`` (the target's greedy
    token there; the first draft agrees where it is the same)."""
    rows = len(first)
    ids = torch.zeros((rows, steps + 1), dtype=torch.int64)
    if steps:
        ids[:, 1] = torch.tensor(first)
    ids[:, 0] = torch.tensor(verified if verified is not None else [next(VERIFIED) % VOCAB for _ in first])
    logits = torch.randn((rows, steps + 1, VOCAB), generator=torch.Generator().manual_seed(rows)) \
        .to(torch.bfloat16)
    logits[torch.arange(rows), 0, torch.tensor(chosen)] = 20.0
    batch = NS(forward_mode=mode, input_ids=ids.reshape(-1), spec_info=verify_input(topk),
               seq_lens=torch.tensor(seq_lens if seq_lens is not None else [40] * rows))
    return batch, NS(next_token_logits=logits.reshape(rows * (steps + 1), VOCAB))


def logits_forward(self, input_ids, hidden_states, lm_head, logits_metadata, *args):
    return logits_metadata.output  # SGLang's computed logits, carried here by the test batch


LOGITS = dw.wrap(logits_forward, "verify-logits")
LM_HEAD = NS(tp_rank=0)


def serve(verify_wrapped, work, batch, output, lm_head=LM_HEAD):
    """One verify: the worker's verify (the watch's turn), inside which SGLang runs the target's verify forward
    (eagerly here: the logits processor is called)."""
    batch.output = output

    def verify(self, b):
        LOGITS(None, batch.input_ids, None, lm_head, batch)
        return "result"
    return verify_wrapped(verify)(work, batch)


def fresh(first_stride=1):
    clock = Clock()
    watch = dw.DraftWatch(clock=clock, look_seconds=1.0, first_stride=first_stride)
    dw.set_watch(watch)
    return watch, clock


def turn(kind="v2"):
    return lambda verify: dw.wrap(verify, kind)


def counts(watch):
    c = watch.counts.tolist()
    return {"proposed": c[:VOCAB], "agreed": c[VOCAB:2 * VOCAB],
            "contexts": watch.contexts.nonzero().tolist()}


def kernel_against_numpy(seed=5):
    """The kernel on ties, bf16 logits, padded rows (seq_lens at the fill value), drafts outside the vocabulary and
    a logits view with a row stride wider than the vocabulary, against numpy's argmax (the first maximum)."""
    rng = np.random.default_rng(seed)
    requests, per, vocab = 24, 4, 300
    wide = torch.tensor(rng.integers(-3, 4, (requests * per, vocab + 7)), dtype=torch.bfloat16)  # ties abound
    logits = wide[:, :vocab]
    ids = torch.tensor(rng.integers(0, vocab, requests * per))
    argmax = logits.float().numpy().argmax(1)
    ids_view = ids.view(requests, per)
    ids_view[::2, 1] = torch.tensor(argmax.reshape(requests, per)[::2, 0])  # half agree
    ids_view[3, 1], ids_view[5, 1] = vocab + 4, -1  # outside the vocabulary
    seq_lens = torch.tensor(rng.integers(2, 900, requests))
    seq_lens[[7, 8]] = FILL
    seq_lens[9] = 0
    counted = torch.zeros(3 * vocab, dtype=torch.int64)
    contexts = torch.zeros((vocab, dw.CONTEXT_BUCKETS), dtype=torch.uint8)
    verify_count.launch(logits, ids, seq_lens, counted, contexts)
    want_p, want_a = np.zeros(vocab, np.int64), np.zeros(vocab, np.int64)
    want_c = np.zeros((vocab, dw.CONTEXT_BUCKETS), np.uint8)
    for r in range(requests):
        verified, draft = int(ids_view[r, 0]), int(ids_view[r, 1])
        if seq_lens[r] < 2 or not 0 <= draft < vocab:
            continue
        want_p[draft] += 1
        want_a[draft] += int(argmax[r * per] == draft)
        want_c[draft, verified & 63] = 1
    return {"proposed": counted[:vocab].tolist() == want_p.tolist(),
            "agreed": counted[vocab:2 * vocab].tolist() == want_a.tolist(),
            "contexts": contexts.numpy().tolist() == want_c.tolist(),
            "total": int(counted[:vocab].sum()), "agreeing": int(want_a.sum()),
            "untouched": int(counted[2 * vocab:].sum())}


def capture_and_turns():
    """SGLang's capture of a verify graph: its eager warm-up forward (padded rows only) sets the counts up and
    counts nothing; the captured forward takes the count (each replay of the graph counts that way); eager verifies
    are counted on the watch's turn only; a graph captured before the set-up is named, not counted."""
    watch, clock = fresh(first_stride=3)
    watch._restride = lambda: None  # a turn every 3 verifies throughout (the stride's rule: the stride scenario)
    capturing = [False]
    real, dw._capturing = dw._capturing, lambda logits: capturing[0]
    steps = []
    try:
        capturing[0] = True  # a capture before any eager forward: nothing can be set up inside it
        LOGITS(None, None, None, LM_HEAD, _with_output(*forward([1, 2], [1, 2])))
        steps.append(["capture before set-up", watch.counts is not None, watch.graphs, watch.graphs_missed])
        capturing[0] = False
        LOGITS(None, None, None, LM_HEAD, _with_output(*forward([3, 4], [3, 4], seq_lens=[FILL, FILL])))
        steps.append(["warm-up", watch.counts is not None, int(watch.counts.sum()), watch.graphs])
        capturing[0] = True
        LOGITS(None, None, None, LM_HEAD, _with_output(*forward([5, 6, 7], [5, 0, 7], seq_lens=[40, 41, FILL])))
        steps.append(["capture", int(watch.counts[:VOCAB].sum()), int(watch.counts[VOCAB:2 * VOCAB].sum()),
                      watch.graphs])
        capturing[0] = False
        wrapped = turn()
        for i in range(6):  # eager verifies: turns at calls 1 (the first), 3 and 6
            clock.now += 0.01
            serve(wrapped, worker(), *forward([10 + i], [10 + i]))
        steps.append(["eager", int(watch.counts[:VOCAB].sum()), watch.eager_counted, watch.eager_verifies,
                      watch.calls])
    finally:
        dw._capturing = real
    return {"steps": steps, "proposed": [t for t in range(VOCAB) for _ in range(int(watch.counts[t]))],
            "state": watch.state, "cost": watch.cost_text()}


def _with_output(batch, output):
    batch.output = output
    return batch


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def traffic(wrong, verifies=600, seed=3, repeated=False):
    """``verifies`` of 8 requests, 10 ms apart, every one counted (stride 1, eager). Healthy: the target agrees
    with a first draft 2 times in 3; ``wrong`` tokens never. ``repeated``: the tokenwise pair's traffic, each token
    drafted after one verified token only, and a fifth of the tokens always missed there."""
    watch, clock = fresh()
    records = Records()
    logging.getLogger("types").addHandler(records)  # the watch logs to the worker's module logger (here: types)
    logging.getLogger("types").setLevel(logging.INFO)
    wrapped = turn()
    rng = np.random.default_rng(seed)
    for _ in range(verifies):
        clock.now += 0.01
        first = rng.integers(0, 40, 8)
        if repeated:
            agree = first % 5 != 0
        else:
            agree = ~np.isin(first, wrong) & (rng.random(8) < 2 / 3)
        chosen = np.where(agree, first, (first + 1) % VOCAB)
        verified = (first + 1).tolist() if repeated else None
        serve(wrapped, worker(), *forward(first.tolist(), chosen.tolist(), verified=verified))
    logging.getLogger("types").removeHandler(records)
    return {"state": watch.state, "lines": watch.lines, "looks": watch.looks, "calls": watch.calls,
            "top": sorted(t for t, _ in (watch.finding or {}).get("top", [])), "logged": records.lines}


def stride():
    """The watch's turn costs 20 us of the clock, the verifies come 10 ms apart: one turn in 4 (0.05%); a 50 ms
    set-up is not charged per turn."""
    watch, clock = fresh(first_stride=1)
    wrapped = turn()
    real_read_back, real_set_up = watch._read_back, watch._set_up

    def slow_read_back(*args):  # inside the turn's timed work
        clock.now += 20e-6
        real_read_back(*args)

    def slow_set_up(*args):
        clock.now += 0.05
        return real_set_up(*args)
    watch._read_back, watch._set_up = slow_read_back, slow_set_up
    for _ in range(400):
        clock.now += 0.01
        serve(wrapped, worker(), *forward([1, 2], [1, 2]))
    return {"stride": watch.stride, "expected": math.ceil(20e-6 / (dw.COST_SHARE * 0.01)),
            "cost_share": watch.own_seconds / watch.calls / 0.01, "turns": watch.turns, "calls": watch.calls,
            "setup": watch.setup_seconds, "cost_text": watch.cost_text()}


def left_alone(work=None, topk=1, lm_head=LM_HEAD, spec=None):
    watch, clock = fresh()
    wrapped = turn()
    batch, output = forward([1, 2], [1, 2], topk=topk)
    if spec is not None:
        batch.spec_info = spec
    serve(wrapped, work or worker(), batch, output, lm_head=lm_head)
    calls = watch.calls
    serve(wrapped, work or worker(), batch, output, lm_head=lm_head)
    return {"state": watch.state, "lines": watch.lines, "counts": watch.counts is None, "calls_after": watch.calls,
            "calls_before": calls}


def no_drafts():
    """Adaptive steps at 0 (SGLang's trivial verify input): one token per request, no draft: nothing counted."""
    watch, clock = fresh()
    wrapped = turn()
    serve(wrapped, worker(), *forward([7, 8], [7, 8]))
    clock.now += 0.01
    serve(wrapped, worker(), *forward([1, 2, 3], [1, 2, 3], steps=0))
    return {"state": watch.state, "lines": watch.lines, "total": int(watch.counts[:VOCAB].sum())}


def other_forwards():
    """Prefill, decode and draft forwards pass through the logits processor untouched: nothing set up or counted."""
    watch, clock = fresh()
    for mode in (ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.IDLE):
        LOGITS(None, None, None, LM_HEAD, _with_output(*forward([1, 2], [1, 2], mode=mode)))
    return {"state": watch.state, "set_up": watch.counts is not None, "lines": watch.lines}


def shard_and_compiled():
    """Logits holding a vocabulary shard (the processor's vocabulary is larger): off, with one line; a forward that
    torch.compile traces: left alone, nothing set up."""
    watch, clock = fresh()
    real, dw._compiling = dw._compiling, lambda: True
    try:
        LOGITS(None, None, None, LM_HEAD, _with_output(*forward([1, 2], [1, 2])))
    finally:
        dw._compiling = real
    compiled = {"state": watch.state, "set_up": watch.counts is not None}
    LOGITS(NS(vocab_size=2 * VOCAB), None, None, LM_HEAD, _with_output(*forward([1, 2], [1, 2])))
    return {"compiled": compiled, "shard": {"state": watch.state, "lines": watch.lines,
                                            "set_up": watch.counts is not None}}


def read_backs():
    """When the counts are read back: seconds after the first verify (1, 2, 4, 8 s, then every look_seconds)."""
    watch, clock = fresh()
    watch.look_seconds = 10.0
    wrapped = turn()
    reads, last = [], None
    for _ in range(400):
        clock.now += 0.1
        serve(wrapped, worker(), *forward([1], [1]))
        if watch.last_read != last and watch.last_read != watch.started:
            reads.append(round(watch.last_read - watch.started, 2))
        last = watch.last_read
    return reads


def v1_called_with_its_verify_input():
    """v1 up to 0.5.11 is called as ``verify(batch, spec_info)``: the turn passes every argument through."""
    watch, clock = fresh()
    seen = []

    def verify_0_5_9(self, b, spec_info):
        seen.append(spec_info)
        LOGITS(None, None, None, LM_HEAD, _with_output(*forward([1, 2], [1, 0])))
        return "result"

    wrapped = dw.wrap(verify_0_5_9, "v1")
    result = wrapped(worker(), NS(spec_info="the draft input"), "the verify input")
    return {"state": watch.state, "lines": watch.lines, "seen": seen, "result": result,
            "proposed": int(watch.counts[:VOCAB].sum())}


def rank_from_sglang():
    """0.5.23's EAGLEWorkerV2 has no tp_rank: the rank comes from SGLang's parallel state (runtime_context), here
    set through its own override; rank 1 is left alone, rank 0 watches."""
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    real = object.__new__(EAGLEWorkerV2)
    real.server_args, real.topk = worker().server_args, 1
    out = {"has_tp_rank": hasattr(real, "tp_rank")}
    for rank in (1, 0):
        watch, clock = fresh()
        wrapped = turn()
        with get_parallel().override(tp_rank=rank):
            clock.now += 0.01
            serve(wrapped, real, *forward([1, 2], [1, 1]), lm_head=NS())  # a head without tp_rank: SGLang's state
        out[f"rank_{rank}"] = {"state": watch.state, "bound": watch.counts is not None, "lines": watch.lines}
    return out


def uncounted():
    """A server whose verify forward never reaches the count (here: no forward at all): one INFO line after the
    first look's time, not silence."""
    watch, clock = fresh()
    records = Records()
    logging.getLogger("types").addHandler(records)
    logging.getLogger("types").setLevel(logging.INFO)
    wrapped = turn()(lambda self, b: "result")
    for _ in range(300):
        clock.now += 0.01
        wrapped(worker(), NS())
    logging.getLogger("types").removeHandler(records)
    return {"state": watch.state, "lines": watch.lines, "logged": records.lines}


def error():
    watch, clock = fresh()
    wrapped = turn()
    serve(wrapped, worker(), *forward([1, 2], [1, 1]))

    def broken(*args):
        raise RuntimeError("a launch that fails")
    watch._launch = broken
    clock.now += 0.01
    result = serve(wrapped, worker(), *forward([1, 2], [1, 1]))
    clock.now += 0.01
    again = serve(wrapped, worker(), *forward([1, 2], [1, 1]))
    return {"returned": [result, again], "state": watch.state, "lines": watch.lines}


print(json.dumps({
    "kernel": kernel_against_numpy(), "capture": capture_and_turns(),
    "wrong": traffic([3, 13, 23, 33]), "healthy": traffic([]),
    "repeated_contexts": traffic([], verifies=300, repeated=True),
    "stride": stride(),
    "tp1": left_alone(lm_head=NS(tp_rank=1)), "tree": left_alone(topk=4),
    "ngram": left_alone(spec=NS(topk=1)), "tree_worker": left_alone(work=worker(topk=4)),
    "error": error(), "uncounted": uncounted(), "no_drafts": no_drafts(), "other_forwards": other_forwards(),
    "shard_and_compiled": shard_and_compiled(),
    "read_backs": read_backs(), "v1_spec_info": v1_called_with_its_verify_input(),
    "rank_from_sglang": rank_from_sglang(),
}))
