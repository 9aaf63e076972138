"""draft-token-watch's map check at load, run through SGLang's own set-up step in a real install (torch on the CPU):
0.5.23's ``EagleDraftWorker.init_lm_head`` (v2) or 0.5.9's ``EAGLEWorker.init_cuda_graphs`` (v1), wrapped by the
patch's payload, on an object of SGLang's class holding small target and drafter models; prints one JSON object:
scenario -> what the check logged and found."""
import json
import logging
import sys
from types import SimpleNamespace as NS

import torch

from sglang_pcie.patches.draft_token_watch import map_check, payload as dw

VOCAB, DRAFT_VOCAB, HIDDEN = 4096, 1024, 64
LOGGER = "sglang.srt.speculative"  # the worker modules' parent: the check logs under the worker's module
logging.getLogger().setLevel(logging.INFO)  # as SGLang's server configures it (--log-level info)


class Head(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)


def rank_0_shard(module, rows: int):
    """``module`` as TP rank 0 of 2 holds it: the first ``rows`` vocabulary rows, with SGLang's ``shard_indices``
    (VocabParallelEmbedding / ParallelLMHead: absolute ids org_vocab_start_index..org_vocab_end_index), and 64
    zero padding rows after them, as SGLang pads a shard."""
    weight = module.weight.data
    module.weight = torch.nn.Parameter(torch.cat([weight[:rows], torch.zeros(64, weight.shape[1])]),
                                       requires_grad=False)
    module.shard_indices = NS(org_vocab_start_index=0, org_vocab_end_index=rows)
    return module


class Target(torch.nn.Module):
    """A Llama-shaped target: ``model.embed_tokens``, ``lm_head`` and ``get_embed_and_head`` as SGLang's have."""

    def __init__(self, embed, head):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding.from_pretrained(embed)
        self.lm_head = Head(head)

    def get_embed_and_head(self):
        return self.model.embed_tokens.weight, self.lm_head.weight


class Draft(torch.nn.Module):
    """An EAGLE-3 drafter with a reduced vocabulary: its own lm_head, the absolute map ``hot_token_id`` (on the CPU,
    as SGLang's loader leaves it), the target's embedding bound by ``set_embed``."""

    def __init__(self, head, hot):
        super().__init__()
        self.lm_head = Head(head)
        self.hot_token_id = hot
        self.load_lm_head_from_target = False

    def set_embed(self, embed):
        self.embed = embed


def pair(seed=0, related=True, duplicates=0):
    """Target rows, a hot set, and a drafter whose rows are the target's embedding rows of its hot tokens with
    noise (cos about 0.7: a head trained on from the target's), or unrelated (``related`` False). ``duplicates``:
    target tokens whose embedding rows are near copies of a hot token's (the same word spelt twice)."""
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(VOCAB, HIDDEN, generator=g)
    head = torch.randn(VOCAB, HIDDEN, generator=g)
    hot = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values
    for k in range(duplicates):
        copy = int(hot[k * 7 % DRAFT_VOCAB])
        twin = int(torch.randint(VOCAB, (1,), generator=g))
        embed[twin] = embed[copy] + 0.05 * torch.randn(HIDDEN, generator=g)
    rows = embed[hot] + 0.7 * torch.randn(DRAFT_VOCAB, HIDDEN, generator=g) if related else \
        torch.randn(DRAFT_VOCAB, HIDDEN, generator=g)
    return Target(embed, head), rows, hot


def permuted(hot, share, seed=1):
    """The map with ``share`` of its entries sent round one random cycle (each to the next chosen one's target)."""
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(hot.numel(), generator=g)[:int(share * hot.numel())]
    out = hot.clone()
    out[chosen] = hot[chosen.roll(-1)]
    return out


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage()))


def server_args(**overrides):
    args = dict(speculative_algorithm="EAGLE3", model_path="/m/target", speculative_draft_model_path="/m/draft",
                speculative_num_steps=3, speculative_eagle_topk=1, disable_cuda_graph=True,
                startup_weight_load_mode="serial")
    args.update(overrides)
    return NS(**args)


def v2_worker(target, draft_rows, hot, **args):
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    worker = object.__new__(EagleDraftWorker)
    worker.server_args = server_args(**args)
    worker.speculative_algorithm = SpeculativeAlgorithm.from_string(worker.server_args.speculative_algorithm)
    worker.hot_token_id = None
    worker.target_worker = NS(model_runner=NS(model=target, model_config=NS(model_path="/m/target", revision=None),
                                              load_config=None))
    worker.draft_runner = NS(model=Draft(draft_rows, hot))
    return worker


def run_v2(target, draft_rows, hot, rank=0, draft_shard=False, **args):
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    map_check._DONE = False
    capture = Capture()
    logging.getLogger(LOGGER).addHandler(capture)
    worker = v2_worker(target, draft_rows, hot, **args)
    if draft_shard:  # the drafter's lm_head split too: rank 0 holds the first draft ids
        rank_0_shard(worker.draft_runner.model.lm_head, draft_rows.shape[0])
    checked = dw.wrap(EagleDraftWorker.init_lm_head, "load-v2")
    found = {}
    original_check = map_check.check_worker

    def keep(*a):
        found["finding"] = original_check(*a)
        return found["finding"]
    map_check.check_worker = keep
    try:
        with get_parallel().override(tp_rank=rank):
            checked(worker)
            checked(worker)  # a second call (v1's adaptive set-up runs again): no second check
    finally:
        map_check.check_worker = original_check
        logging.getLogger(LOGGER).removeHandler(capture)
    finding = found.get("finding") or {}
    return {"records": capture.records, "verdict": finding.get("verdict"), "lined": finding.get("lined"),
            "rows": finding.get("rows"), "fits": finding.get("fits"), "shift": finding.get("shift"),
            "hot_on_worker": worker.hot_token_id is not None, "embed_bound": hasattr(worker.draft_runner.model, "embed"),
            "checks": int("finding" in found)}


def v2_scenarios():
    target, rows, hot = pair()
    wrong10, wrong40 = permuted(hot, 0.1), permuted(hot, 0.4)
    out = {
        "healthy": run_v2(target, rows, hot),
        "d2t_10": run_v2(target, rows, wrong10),
        "d2t_40": run_v2(target, rows, wrong40),
        "head_rotated": run_v2(target, rows.roll(-1, 0), hot),
        "unrelated": run_v2(*pair(related=False)),
        "rank_1": run_v2(target, rows, wrong40, rank=1),
        "overlap_load": run_v2(target, rows, wrong40, startup_weight_load_mode="overlap"),
        "twins_healthy": run_v2(*pair(seed=3, duplicates=200)),
        "truth_10": sorted([int(i) for i in torch.nonzero(wrong10 != hot).flatten()]),
        "hot": [int(t) for t in hot],
    }
    # TP rank 0 of 2: half of each head's vocabulary rows; only draft rows whose mapped target rows it holds compared
    sharded_target, sharded_rows, sharded_hot = pair(seed=11)
    rank_0_shard(sharded_target.lm_head, VOCAB // 2)
    rank_0_shard(sharded_target.model.embed_tokens, VOCAB // 2)
    worker_rows = sharded_rows[:DRAFT_VOCAB // 2]
    out["tp2_rank0_wrong"] = run_v2(sharded_target, worker_rows, permuted(sharded_hot, 0.4), draft_shard=True)
    out["tp2_rank0_healthy"] = run_v2(sharded_target, worker_rows, sharded_hot, draft_shard=True)
    out["tp2_hot"] = [int(t) for t in sharded_hot]
    for seed in range(4, 10):  # more healthy pairs: never a warning
        out[f"healthy_seed_{seed}"] = run_v2(*pair(seed=seed, duplicates=50))
    return out


def v1_scenario():
    """0.5.9's v1 EAGLEWorker: the check runs before its init_cuda_graphs (here with CUDA graphs off, so the
    original returns at once), on the worker's own hot_token_id and draft_model_runner."""
    from sglang.srt.speculative.eagle_worker import EAGLEWorker

    target, rows, hot = pair()
    map_check._DONE = False
    capture = Capture()
    logging.getLogger(LOGGER).addHandler(capture)
    worker = object.__new__(EAGLEWorker)
    worker.server_args = server_args()
    worker.tp_rank = 0
    worker.hot_token_id = permuted(hot, 0.4)
    worker.target_worker = NS(model_runner=NS(model=target))
    worker._model_runner = NS(model=Draft(rows, hot))  # draft_model_runner -> model_runner -> _model_runner
    checked = dw.wrap(EAGLEWorker.init_cuda_graphs, "load-v1")
    try:
        checked(worker)
    finally:
        logging.getLogger(LOGGER).removeHandler(capture)
    return {"records": capture.records, "graph_runner": worker.cuda_graph_runner}


print(json.dumps(v1_scenario() if sys.argv[1:] == ["v1"] else v2_scenarios()))
