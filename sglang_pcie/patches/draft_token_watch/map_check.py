"""draft-token-watch at load: the drafter's vocabulary map checked against the heads, once, before any traffic.

An EAGLE-3 drafter with a reduced vocabulary scores draft id ``i`` with row ``i`` of its own ``lm_head`` and SGLang
serves that draft as target id ``hot_token_id[i]`` (``i + d2t[i]``). Where the drafter's rows were made from the
target's (copied from its embedding or lm_head rows, or trained on from them), row ``i`` resembles the target's row
of that id, and a wrong map entry (d2t permuted, regenerated after training, a head exported in another order) pairs
the row with another token's. At load the server holds all of it on the GPU: the map, the drafter's rows and the
target's ``lm_head`` and embedding. This check, on every draft row this rank holds (``MAX_ROWS`` at most):

1. each row's cosine with its mapped target row, against the same rows paired with a shuffled map (the null);
   a row **lines up** where its cosine is ``LINE_UP_Z`` SDs above the null's mean;
2. the head is **related** to a target matrix where at least ``RELATED_SHARE`` of the rows line up with it; where
   none is, it cannot tell (a head trained in a basis of its own, or a random one): it says so once, at INFO;
3. rows that do not line up (``MAX_SCANNED`` at most) are scanned against every target row this rank holds; a row
   **fits another token** where its best target row is not the mapped one, stands ``SEARCH_Z`` SDs above the rows
   scanned, clears the line-up threshold and beats the mapped row by ``MARGIN``;
4. a warning, naming entries, where ``MIN_WRONG`` rows or more fit another token; else one INFO line.

It runs in the EAGLE worker's set-up, after ``init_lm_head`` (the map on the GPU, the heads loaded) and before any
draft CUDA graph is captured, on TP rank 0 only, with what that rank holds (under TP the heads are split by
vocabulary rows; the map is whole). Its time is measured and logged. This module imports torch only when it runs.
"""
from __future__ import annotations

import functools
import logging
import time

from sglang_pcie.runtime.server_facts import check_command, describe_server, tp_rank

PREFIX = "sglang-pcie draft-token-watch"

LINE_UP_Z = 5.0  # a row lines up: its cosine with its mapped target row this many null SDs above the null mean
RELATED_SHARE = 0.25  # rows lining up that show the head is related to a target matrix
SEARCH_Z = 6.0  # a row's best target row stands this many SDs above every row scanned (~1e-9 by chance per row)
MARGIN = 0.1  # ... and beats the mapped row's cosine by this much
SHIFTED_SHARE = 0.9  # rows lining up with the map read one position on or back: the map (or the head) shifted
MIN_WRONG = 3  # rows fitting another token before a warning
MIN_ROWS = 64  # rows to compare at least
MAX_ROWS = 1 << 18  # draft rows compared at most (a draft vocabulary is 32k ids or fewer)
MAX_SCANNED = 1024  # rows not lining up scanned against every target row
MAX_TARGET_ROWS = 1 << 20  # target rows scanned at most
CHUNK = 2048  # rows per step (a few tens of MB of temporaries at hidden 7168)
SHOWN = 5
SEED = 0

OK, WRONG, CANNOT_TELL, SKIPPED = "ok", "wrong", "cannot tell", "skipped"


class Matrix:
    """Rows of one vocabulary-parallel matrix this rank holds: absolute ids ``start``..``end`` are local rows
    0..end-start of ``weight`` (the padding rows after them are not read)."""

    def __init__(self, label: str, weight, start: int, end: int):
        self.label, self.weight, self.start, self.end = label, weight, start, end


def rows_of(label: str, module) -> Matrix | None:
    """The matrix of an embedding or lm_head module (SGLang's VocabParallelEmbedding / ParallelLMHead, or a plain
    torch module), with the vocabulary rows this rank holds; None where it has no 2-D weight."""
    module = getattr(module, "base_layer", module)  # a LoRA wrapper holds the layer
    weight = getattr(module, "weight", None)
    if weight is None or getattr(weight, "dim", lambda: 0)() != 2:
        return None
    shard = getattr(module, "shard_indices", None)
    if shard is not None:
        start, end = int(shard.org_vocab_start_index), int(shard.org_vocab_end_index)
    else:
        start, end = 0, int(weight.shape[0])
    return Matrix(label, weight, start, min(end, start + int(weight.shape[0])))


def compare(draft: Matrix, hot, references: list[Matrix]) -> dict:
    """Steps 1-3 of the module docstring: ``draft`` the drafter's lm_head rows (draft ids), ``hot`` the whole map
    (target id per draft id, on the rows' device), ``references`` the target matrices. Pure torch; returns the
    finding (``verdict`` one of OK, WRONG, CANNOT_TELL) with its figures."""
    if hot.dim() != 1 or hot.numel() < draft.end:
        return {"verdict": CANNOT_TELL, "why": f"the map has {hot.numel()} entries, the lm_head {draft.end} rows"}
    best = None
    for ref in references:
        if ref.weight.shape[1] != draft.weight.shape[1]:
            continue  # another width: rows cannot be compared value by value
        draft_ids, targets = _held(draft, hot, ref)
        if draft_ids.numel() < MIN_ROWS:
            continue
        found = _line_up(draft, ref, draft_ids, targets)
        if found is not None and (best is None or found["share"] > best["share"]):
            best = found
    if best is None:
        return {"verdict": CANNOT_TELL, "why": f"fewer than {MIN_ROWS} draft rows whose mapped target rows this rank "
                                                "holds at the drafter's width, or their rows are zero"}
    if best["share"] < RELATED_SHARE:
        shifted = _shifted(draft, hot, references)
        if shifted is not None:
            return {"verdict": WRONG, **shifted}
        return {"verdict": CANNOT_TELL, **best,
                "why": "the drafter's lm_head rows resemble no target row under the map (a head trained in a basis "
                       "of its own, or a random one): the map cannot be checked against the heads"}
    if best["not_lined"].numel() == 0:
        return {"verdict": OK, **best}
    best["fits"] = _scan(draft, best)
    return {"verdict": WRONG if len(best["fits"]) >= MIN_WRONG else OK, **best}


def _held(draft: Matrix, hot, ref: Matrix, shift: int = 0):
    """(draft ids, their mapped target ids) where this rank holds both rows; ``shift``: the map read ``shift``
    positions on (draft id i paired with the target id of draft id i + shift)."""
    import torch

    device = draft.weight.device
    draft_ids = torch.arange(max(draft.start, -shift), min(draft.end, draft.start + MAX_ROWS, hot.numel() - shift),
                             device=device)
    targets = hot[draft_ids + shift].to(device)
    held = (targets >= ref.start) & (targets < ref.end)
    return draft_ids[held], targets[held]


def _shifted(draft: Matrix, hot, references: list[Matrix]) -> dict | None:
    """The finding where nearly every row lines up with the map read one position on or back (a head exported in
    another order, a map regenerated off by one), else None."""
    for shift in (-1, 1):
        for ref in references:
            if ref.weight.shape[1] != draft.weight.shape[1]:
                continue
            draft_ids, targets = _held(draft, hot, ref, shift)
            if draft_ids.numel() < MIN_ROWS:
                continue
            found = _line_up(draft, ref, draft_ids, targets)
            if found is not None and found["share"] >= SHIFTED_SHARE:
                return {**found, "shift": shift, "fits": []}
    return None


def _unit(rows):
    import torch

    rows = rows.float()
    return rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True).clamp_min(1e-30)


def _line_up(draft: Matrix, ref: Matrix, draft_ids, targets) -> dict | None:
    import torch

    n = draft_ids.numel()
    generator = torch.Generator(device="cpu").manual_seed(SEED)
    shuffled = torch.randperm(n, generator=generator).to(draft_ids.device)
    own = torch.empty(n, device=draft_ids.device)
    null = torch.empty(n, device=draft_ids.device)
    zero = 0
    for s in range(0, n, CHUNK):
        rows = draft.weight[draft_ids[s:s + CHUNK] - draft.start]
        zero += int((rows.abs().amax(dim=1) == 0).sum())
        mine = _unit(rows)
        own[s:s + CHUNK] = (mine * _unit(ref.weight[targets[s:s + CHUNK] - ref.start])).sum(dim=1)
        null[s:s + CHUNK] = (mine * _unit(ref.weight[targets[shuffled[s:s + CHUNK]] - ref.start])).sum(dim=1)
    if zero > n // 2:
        return None  # a placeholder head
    mean, sd = float(null.mean()), float(null.std())
    threshold = mean + LINE_UP_Z * sd
    lined = own >= threshold
    return {"reference": ref.label, "ref": ref, "rows": n, "lined": int(lined.sum()),
            "share": float(lined.float().mean()), "threshold": threshold, "null_mean": mean, "null_sd": sd,
            "own_median": float(own.median()), "own": own, "draft_ids": draft_ids, "targets": targets,
            "not_lined": torch.nonzero(~lined).flatten()}


def _scan(draft: Matrix, found: dict) -> list[dict]:
    """Rows that do not line up, each against every target row this rank holds: those that fit another token."""
    import torch

    ref: Matrix = found["ref"]
    positions = found["not_lined"]
    if positions.numel() > MAX_SCANNED:  # spread over the rows, in id order
        positions = positions[torch.linspace(0, positions.numel() - 1, MAX_SCANNED).round().long().to(
            positions.device)]
    found["scanned"] = int(positions.numel())
    draft_ids, targets, own = found["draft_ids"][positions], found["targets"][positions], found["own"][positions]
    queries = _unit(draft.weight[draft_ids - draft.start])
    m = queries.shape[0]
    best = torch.full((m,), -2.0, device=queries.device)
    best_id = torch.zeros(m, dtype=torch.long, device=queries.device)
    total = torch.zeros(m, device=queries.device)
    squares = torch.zeros(m, device=queries.device)
    end = min(ref.end, ref.start + MAX_TARGET_ROWS)
    for s in range(ref.start, end, CHUNK):
        scores = queries @ _unit(ref.weight[s - ref.start:min(end, s + CHUNK) - ref.start]).T
        total += scores.sum(dim=1)
        squares += (scores * scores).sum(dim=1)
        top, where = scores.max(dim=1)
        better = top > best
        best = torch.where(better, top, best)
        best_id = torch.where(better, where + s, best_id)
    count = end - ref.start
    found["target_rows"] = count
    mean = total / count
    sd = (squares / count - mean * mean).clamp_min(0).sqrt()
    fits = ((best_id != targets) & (best >= found["threshold"]) & (best >= own + MARGIN)
            & ((best - mean) >= SEARCH_Z * sd) & (sd > 0))
    rows = torch.nonzero(fits).flatten().tolist()
    return [{"draft_id": int(draft_ids[k]), "d2t": int(targets[k]), "fits": int(best_id[k]),
             "cos": round(float(best[k]), 3), "mapped_cos": round(float(own[k]), 3)} for k in rows]


# ---------------------------------------------------------------- in the server


_DONE = False  # one check per process (v1's set-up may run again for adaptive steps)


def wrap_load(function, kind: str):
    """``function``, the EAGLE worker's set-up step that follows the map and the heads (v2
    ``EagleDraftWorker.init_lm_head``: after it; v1 ``EAGLEWorker.init_cuda_graphs``: before it), followed or
    preceded by the check. Never raises into SGLang."""
    if kind == "load-v2":
        @functools.wraps(function)
        def init_lm_head_checked(self, *args, **kwargs):
            result = function(self, *args, **kwargs)
            run_once(self, drafter_of(self, "draft_runner"))
            return result
        return init_lm_head_checked

    @functools.wraps(function)
    def init_cuda_graphs_checked(self, *args, **kwargs):
        run_once(self, drafter_of(self, "draft_model_runner"))
        return function(self, *args, **kwargs)
    return init_cuda_graphs_checked


def drafter_of(worker, runner: str):
    """The drafter model the worker's runner holds (v2 ``draft_runner``, v1 ``draft_model_runner``)."""
    return getattr(getattr(worker, runner, None), "model", None)


def run_once(worker, draft_model) -> dict | None:
    global _DONE
    if _DONE:
        return None
    _DONE = True
    logger = logging.getLogger(type(worker).__module__)  # SGLang's worker module: its log lines carry the rank
    try:
        return check_worker(worker, draft_model, logger)
    except Exception as exc:  # never in SGLang's way
        logger.warning(f"{PREFIX}: the map check at load is off: {type(exc).__name__}: {exc}")
        return None


def skip_reason(worker, draft_model) -> str | None:
    """Why the map is not checked in this process, or None."""
    server_args = getattr(worker, "server_args", None)
    algorithm = str(getattr(server_args, "speculative_algorithm", "") or "").upper()
    if algorithm and algorithm != "EAGLE3":
        return f"--speculative-algorithm {algorithm} (a drafter that takes the target's rows for its map)"
    if str(getattr(server_args, "startup_weight_load_mode", "serial") or "serial") != "serial":
        return "--startup-weight-load-mode is not serial: the target's weights are not loaded yet here"
    if getattr(worker, "hot_token_id", None) is None:
        return "the drafter has no vocabulary map (full vocabulary)"
    if getattr(draft_model, "load_lm_head_from_target", False):
        return "the drafter takes the target's lm_head"
    return None


def check_worker(worker, draft_model, logger) -> dict | None:
    """The check on a set-up EAGLE worker (v1 or v2): logs one line (or a warning) and returns the finding."""
    import torch

    if tp_rank(worker) != 0:
        return None  # the other ranks hold other rows of the same heads: rank 0 speaks for the server
    why = skip_reason(worker, draft_model)
    if why is not None:
        logger.info(f"{PREFIX}: the map is not checked at load: {why}")
        return None
    start = time.perf_counter()
    target = getattr(getattr(getattr(worker, "target_worker", None), "model_runner", None), "model", None)
    draft = rows_of("lm_head", getattr(draft_model, "lm_head", None))
    references = [m for m in (rows_of("lm_head", getattr(target, "lm_head", None)),
                              rows_of("embed_tokens", getattr(getattr(target, "model", None), "embed_tokens", None)))
                  if m is not None]
    if draft is None or not references:
        logger.info(f"{PREFIX}: the map is not checked at load: no lm_head rows on the drafter or the target")
        return None
    with torch.no_grad():
        finding = compare(draft, worker.hot_token_id, references)
    if draft.weight.is_cuda:
        torch.cuda.synchronize(draft.weight.device)
    finding["seconds"] = time.perf_counter() - start
    finding["draft_vocab"] = int(worker.hot_token_id.numel())
    server = describe_server(getattr(worker, "server_args", None))
    if finding["verdict"] == WRONG:
        logger.warning(warning_message(server, finding))
    else:
        logger.info(info_message(finding))
    for key in ("ref", "own", "draft_ids", "targets", "not_lined"):  # GPU tensors: not kept
        finding.pop(key, None)
    if draft.weight.is_cuda:
        torch.cuda.empty_cache()
    return finding


def figures(finding: dict) -> str:
    return (f"{finding['lined']:,} of {finding['rows']:,} draft rows line up with the target's {finding['reference']} "
            f"rows of the ids the map names (cos median {finding['own_median']:.2f}; a row needs > "
            f"{finding['threshold']:.2f}: {LINE_UP_Z:g} SDs above {finding['null_mean']:.2f} +- "
            f"{finding['null_sd']:.2f} with the map shuffled)")


def cost(finding: dict) -> str:
    return f"checked at load in {finding['seconds'] * 1e3:.0f} ms, once"


def info_message(finding: dict) -> str:
    if finding["verdict"] == CANNOT_TELL:
        shown = f"; {figures(finding)}" if "lined" in finding else ""
        return f"{PREFIX}: the map cannot be checked at load: {finding['why']}{shown}; {cost(finding)}"
    scanned = finding.get("scanned")
    rest = (f"; the other {scanned:,} scanned against {finding['target_rows']:,} target rows: "
            f"{len(finding.get('fits', []))} fit another token" if scanned else "")
    return f"{PREFIX}: the map looks right at load: {figures(finding)}{rest}; {cost(finding)}"


def warning_message(server: dict, finding: dict) -> str:
    if "shift" in finding:
        what = (f"{finding['lined']:,} of {finding['rows']:,} of its lm_head rows are the target's "
                f"{finding['reference']} rows of the ids the map gives draft id i{finding['shift']:+d}: the map (or the "
                "head) is shifted by one position, and SGLang serves every draft as its neighbour's token")
        return "\n".join(line for line in (
            f"{PREFIX}: at load, {server.get('algorithm') or 'EAGLE3'} drafter {server.get('draft')}: {what}.",
            f"  check the drafter against its target: {check_command(server)}" if server else "",
            f"  ({cost(finding)}; one warning per server; switch off: SGLANG_PCIE_DISABLE_PATCHES=draft-token-watch)",
        ) if line)
    fits = finding["fits"]
    scanned, not_lined = finding["scanned"], finding["rows"] - finding["lined"]
    estimate = not_lined * len(fits) / scanned
    shown = "; ".join(f"draft id {f['draft_id']} -> target {f['d2t']} (cos {f['mapped_cos']:.2f}), its row is "
                      f"target {f['fits']}'s (cos {f['cos']:.2f})" for f in fits[:SHOWN])
    lines = [
        f"{PREFIX}: at load, {server.get('algorithm') or 'EAGLE3'} drafter {server.get('draft')}: its vocabulary map sends "
        f"draft ids to the wrong target tokens: {len(fits)} of {scanned:,} rows scanned are other target tokens' "
        f"{finding['reference']} rows, about {estimate:,.0f} of the {finding['rows']:,} rows checked "
        f"({estimate / finding['rows']:.1%}). SGLang serves each such draft as the mapped token, which the target "
        "then rejects, whatever the traffic.",
        f"  e.g. {shown}",
        f"  check the drafter against its target: {check_command(server)}" if server else "",
        f"  ({figures(finding)}; {cost(finding)}; one warning per server; switch off: "
        "SGLANG_PCIE_DISABLE_PATCHES=draft-token-watch)",
    ]
    return "\n".join(line for line in lines if line)
