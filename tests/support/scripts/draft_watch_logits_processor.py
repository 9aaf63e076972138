"""draft-token-watch's count through SGLang's own LogitsProcessor.forward, as the overlay's start-up hook wrapped it
in this install (torch on the CPU, the count's Triton kernel in Triton's interpreter): a target verify forward with
SGLang's ForwardBatch and EagleVerifyInput, the logits computed by SGLang from a head and hidden states. Only the
processor's parallel and feature settings are given here (no server published them). Prints one JSON object."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernel runs on the CPU

import json  # noqa: E402
from types import SimpleNamespace as NS  # noqa: E402

import torch  # noqa: E402
from sglang.srt.layers import logits_processor as lp  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode  # noqa: E402
from sglang.srt.speculative.eagle_info import EagleVerifyInput  # noqa: E402

from sglang_pcie.patches.draft_token_watch import payload as dw  # noqa: E402
from sglang_pcie.runtime.results import is_patched  # noqa: E402

VOCAB, HIDDEN, REQUESTS, PER_REQUEST = 96, 16, 5, 4
SEQ_LENS = [30, 31, 1, 45, 2]  # the third row as SGLang pads a captured batch (seq_lens at the fill value)

# The settings the processor reads where no server published them: 0.5.23's runtime context, 0.5.9's server args
if hasattr(lp, "get_parallel"):
    features = NS(enable_fp32_lm_head=False, enable_mis=False, aux_hidden_state_capture=None,
                  return_aux_hidden_state_layer_ids=None)
    lp.get_parallel = lambda: NS(enable_dp_lm_head=False, enable_tp_lm_head_all_to_all=False, tp_size=1,
                                 attn_dp_size=1)
    lp.get_exec = lambda: NS(features=features, deterministic=NS(rl_on_policy_target=None))
else:
    lp.get_global_server_args = lambda: NS(enable_dp_lm_head=False, enable_fp32_lm_head=False,
                                           multi_item_scoring_delimiter=None, rl_on_policy_target=None,
                                           enable_deterministic_inference=False)
    lp.get_tensor_model_parallel_world_size = lambda: 1
    lp.get_attention_dp_size = lambda: 1

torch.manual_seed(0)
processor = lp.LogitsProcessor(NS(vocab_size=VOCAB, hidden_size=HIDDEN))
head = torch.nn.Embedding(VOCAB, HIDDEN)  # the target's lm_head (a plain module: rank 0 by SGLang's state)
hidden_states = torch.randn(REQUESTS * PER_REQUEST, HIDDEN)
original = lp.LogitsProcessor.forward.__wrapped__  # SGLang's own forward, under the overlay's wrapper


def batch(ids, mode=ForwardMode.TARGET_VERIFY):
    spec = object.__new__(EagleVerifyInput)
    spec.topk = 1
    return ForwardBatch(forward_mode=mode, batch_size=REQUESTS, input_ids=ids, req_pool_indices=torch.arange(REQUESTS),
                        seq_lens=torch.tensor(SEQ_LENS), out_cache_loc=torch.arange(REQUESTS * PER_REQUEST),
                        seq_lens_sum=sum(SEQ_LENS), spec_info=spec, capture_hidden_mode=CaptureHiddenMode.NULL)


ids = torch.randint(0, VOCAB, (REQUESTS * PER_REQUEST,))
plain = original(processor, ids, hidden_states, head, batch(ids)).next_token_logits
choice = plain.view(REQUESTS, PER_REQUEST, VOCAB)[:, 0].argmax(-1)
ids.view(REQUESTS, PER_REQUEST)[[0, 3, 4], 1] = choice[[0, 3, 4]]  # these requests' first drafts agree

watch = dw.DraftWatch(first_stride=1)
dw.set_watch(watch)
first = processor(ids, hidden_states, head, batch(ids))  # not the watch's turn: sets up, counts nothing
set_up = {"counts": watch.counts is not None, "counted": int(watch.counts.sum())}
watch.calls, watch.count_next = 1, True  # the watch's turn (the verify wrapper sets it), an eager verify
counted = processor(ids, hidden_states, head, batch(ids))
processor(ids, hidden_states, head, batch(ids, ForwardMode.DECODE))  # another forward: passes untouched

rows = ids.view(REQUESTS, PER_REQUEST)
want = {"proposed": [0] * VOCAB, "agreed": [0] * VOCAB}
for r in range(REQUESTS):
    if SEQ_LENS[r] >= 2:
        want["proposed"][int(rows[r, 1])] += 1
        want["agreed"][int(rows[r, 1])] += int(choice[r] == rows[r, 1])
print(json.dumps({
    "patched": is_patched(lp.LogitsProcessor.forward, dw.PATCH_ID),
    "set_up": set_up,
    "same_logits": bool(torch.equal(first.next_token_logits, plain) and torch.equal(counted.next_token_logits, plain)),
    "proposed": watch.counts[:VOCAB].tolist() == want["proposed"],
    "agreed": watch.counts[VOCAB:2 * VOCAB].tolist() == want["agreed"],
    "total": int(watch.counts[:VOCAB].sum()), "agreeing": int(watch.counts[VOCAB:2 * VOCAB].sum()),
    "eager_counted": watch.eager_counted, "state": watch.state, "lines": watch.lines,
}))
