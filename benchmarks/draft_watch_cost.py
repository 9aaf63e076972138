#!/usr/bin/env python3
"""Host cost of draft-token-watch per verify and per forward, on the CPU (torch CPU tensors).

The watch counts in the target's verify forward, where SGLang's CUDA graph runs its kernel with no host work; what
remains on the host is measured here: the verify wrapper (a verify that is not the watch's turn: an increment and a
modulo; a turn: the clock, the interval, the read-back check), and the logits-processor wrapper on every forward
that runs eagerly (prefill, decode and verify forwards outside CUDA graphs): a mode check, and nothing more unless
it is a target verify on the watch's turn.  Not here: the kernel's launch on an eager verify's turn and its GPU time
(the watch measures both on a GPU and logs them), the looks' judging (measured apart, below).

Drives ``sglang_pcie.patches.draft_token_watch.payload.wrap`` around functions that return at once, with
SGLang-shaped inputs (32 requests, 3-step chains, a 128k vocabulary), and reports the median time per call over
ROUNDS rounds of CALLS calls.

usage: <SGLang env python> -m benchmarks.draft_watch_cost [--rounds 15] [--calls 20000]   (needs torch, numpy and
SGLang's ForwardMode: a SGLang env)
"""
import argparse
import statistics
import sys
import time
from types import SimpleNamespace as NS

import numpy as np
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_pcie.patches.draft_token_watch import payload as dw

ROWS, STEPS, VOCAB = 32, 3, 128_256


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    worker = NS(tp_rank=0, topk=1, server_args=NS(speculative_algorithm="EAGLE3", model_path="t",
                                                   speculative_draft_model_path="d", speculative_num_steps=STEPS))
    batch = NS(seq_lens=torch.full((ROWS,), 40))
    output = NS(next_token_logits=None)

    def verify(self, b):
        return "result"

    def logits_forward(self, input_ids, hidden_states, lm_head, logits_metadata):
        return output

    def per_call_us(fn, *call_args, stride=None):
        times = []
        for _ in range(args.rounds):
            watch = dw.DraftWatch(look_seconds=3600.0, first_stride=1)
            dw.set_watch(watch)
            if stride is not None:
                fn(*call_args)  # the first verify binds the watch, outside the timing
                watch.counts = torch.zeros(1)  # as set up by the first verify forward (no read-back is due)
                watch.stride, watch._restride = stride, lambda: None
            start = time.perf_counter()
            for _ in range(args.calls):
                fn(*call_args)
            times.append((time.perf_counter() - start) / args.calls * 1e6)
        return statistics.median(times), min(times), max(times)

    verify_alone = per_call_us(verify, worker, batch)
    verify_wrapped = dw.wrap(verify, "v2")
    turns = per_call_us(verify_wrapped, worker, batch, stride=1)
    passing = per_call_us(verify_wrapped, worker, batch, stride=10 ** 9)
    forward_alone = per_call_us(logits_forward, None, None, None, None, NS(forward_mode=ForwardMode.DECODE))
    forward_wrapped = dw.wrap(logits_forward, "verify-logits")
    decode = per_call_us(forward_wrapped, None, None, None, None, NS(forward_mode=ForwardMode.DECODE))
    rng = np.random.default_rng(0)
    counts = np.zeros(3 * VOCAB, dtype=np.int64)  # [first drafts | agreeing | context buckets] per token
    counts[:VOCAB] = rng.multinomial(200_000, 1.0 / np.arange(1, VOCAB + 1) / np.sum(1.0 / np.arange(1, VOCAB + 1)))
    counts[VOCAB:2 * VOCAB] = rng.binomial(counts[:VOCAB], 0.6)
    counts[2 * VOCAB:] = np.minimum(counts[:VOCAB], dw.CONTEXT_BUCKETS)
    look_ms = []
    for _ in range(args.rounds):
        watch = dw.DraftWatch()
        start = time.perf_counter()
        watch.judge_counts(counts)
        look_ms.append((time.perf_counter() - start) * 1e3)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CPU tensors), {ROWS} requests x {STEPS} steps, "
          f"vocabulary {VOCAB}; {args.rounds} rounds x {args.calls} calls; us per call: median (min-max)")
    for name, (median, lo, hi) in (("verify alone", verify_alone), ("verify, every one the watch's turn", turns),
                                   ("verify, not the watch's turn", passing),
                                   ("logits forward alone", forward_alone),
                                   ("logits forward (decode) wrapped", decode)):
        print(f"  {name:<36} {median:8.3f}  ({lo:.3f}-{hi:.3f})")
    turn_cost = turns[0] - verify_alone[0]
    stride = max(1, -(-turn_cost * 1e-6 // (dw.COST_SHARE * 0.010)))
    print(f"a turn costs {turn_cost:.2f} us here (no read-back due); at a 10 ms verify interval the watch's rule "
          f"(at most {dw.COST_SHARE:.2%} of the interval) takes one turn in {int(stride)}; a verify that is not its "
          f"turn costs {passing[0] - verify_alone[0]:.3f} us, an eager forward's mode check "
          f"{decode[0] - forward_alone[0]:.3f} us (neither in the watch's own measurement: no clock read there)")
    print(f"one look (judging {VOCAB:,} tokens' counts, 200,000 first drafts): median {statistics.median(look_ms):.2f} "
          f"ms (min {min(look_ms):.2f}, max {max(look_ms):.2f}); looks at 1, 2, 4, 8 s after the first verify, then "
          f"every {dw.LOOK_SECONDS:.0f} s: at one a 10 s, {statistics.median(look_ms) / 100:.3f}% of the time; in "
          "the watch's own measured time, so its turns make room for them")


if __name__ == "__main__":
    main()
