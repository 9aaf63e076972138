#!/usr/bin/env python3
"""Host cost of draft-token-watch per verify, on the CPU (torch CPU tensors: the GPU's kernel launches are not
here; the watch measures its own time on a GPU and samples by it).

Drives ``sglang_pcie.patches.draft_token_watch.payload.wrap`` around a verify that returns at once, with SGLang-shaped
inputs
(32 requests, 3-step chains, a 128k vocabulary), and reports the median host time per call over ROUNDS rounds of
CALLS calls: the verify alone, the watch counting every verify (stride 1), and the watch at the stride its own
measurement picks for a 10 ms verify interval (the looks left out of these), a verify it lets pass, and one look's
time apart.

usage: <SGLang env python> -m benchmarks.draft_watch_cost [--rounds 15] [--calls 2000]   (needs torch and numpy: a SGLang env)
"""
import argparse
import statistics
import sys
import time
from types import SimpleNamespace as NS


import torch  # noqa: E402

from sglang_pcie.patches.draft_token_watch import payload as dw  # noqa: E402

ROWS, STEPS, VOCAB = 32, 3, 128_256


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(0)
    worker = NS(tp_rank=0, topk=1, server_args=NS(speculative_algorithm="EAGLE3", model_path="t",
                                                   speculative_draft_model_path="d", speculative_num_steps=STEPS),
                target_worker=NS(model_config=NS(vocab_size=VOCAB)))
    batches = [NS(spec_info=NS(draft_token=torch.randint(0, VOCAB, (ROWS * (STEPS + 1),))),
                  accept=torch.randint(1, STEPS + 2, (ROWS,), dtype=torch.int32)) for _ in range(64)]
    result = {id(b): NS(accept_lens=b.accept) for b in batches}

    def verify(self, batch):
        return result[id(batch)]

    def per_call_us(fn, stride=None):
        times = []
        for _ in range(args.rounds):
            if stride is not None:
                watch = dw.DraftWatch(look_seconds=3600.0, first_stride=1)
                dw.set_watch(watch)
                fn(worker, batches[0])  # the one-time set-up, outside the timing
                watch.stride, watch._restride = stride, lambda: None
                watch._read_back = lambda now: None  # the looks are measured apart (below)
            start = time.perf_counter()
            for i in range(args.calls):
                fn(worker, batches[i % 64])
            times.append((time.perf_counter() - start) / args.calls * 1e6)
        return statistics.median(times), min(times), max(times)

    base = per_call_us(verify)
    wrapped = dw.wrap(verify, "v2")
    every = per_call_us(wrapped, stride=1)
    sampled_cost = every[0] - base[0]
    stride = max(1, -(-sampled_cost * 1e-6 // (dw.COST_SHARE * 0.010)))
    strided = per_call_us(wrapped, stride=int(stride))
    passing = per_call_us(wrapped, stride=10 ** 9)  # the verifies it lets pass: an increment and a modulo
    import numpy as np

    rng = np.random.default_rng(0)
    counts = np.zeros(3 * VOCAB, dtype=np.int64)  # [proposed | accepted | context buckets] per token
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
    for name, (median, lo, hi) in (("verify alone", base), ("watch, every verify counted", every),
                                   (f"watch, one verify in {int(stride)} counted", strided),
                                   ("watch, no verify counted", passing)):
        print(f"  {name:<34} {median:8.2f}  ({lo:.2f}-{hi:.2f})")
    print(f"counting one verify costs {sampled_cost:.1f} us here; at a 10 ms verify interval the watch's own "
          f"sampling rule (at most {dw.COST_SHARE:.2%} of the interval) counts one verify in {int(stride)}: "
          f"{strided[0] - base[0]:.2f} us per verify, {(strided[0] - base[0]) / 100:.4f}% of 10 ms; a verify it lets "
          f"pass costs {passing[0] - base[0]:.2f} us (not in the watch's own measurement: it reads no clock there)")
    print(f"one look (judging {VOCAB:,} tokens' counts, 200,000 first drafts): median {statistics.median(look_ms):.2f} "
          f"ms (min {min(look_ms):.2f}, max {max(look_ms):.2f}); the looks come as the counts double and every "
          f"{dw.LOOK_SECONDS:.0f} s: at one a 10 s, {statistics.median(look_ms) / 100:.3f}% of the time; counted in "
          "the watch's own measured time, so its sampling makes room for them")


if __name__ == "__main__":
    main()
