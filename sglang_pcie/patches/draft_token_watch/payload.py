"""draft-token-watch: one warning per server when some of an EAGLE chain drafter's first drafts are never accepted.

A wrong entry in a drafter's vocabulary map (d2t) sends one draft token to the wrong target token whatever the
context: that token is proposed and then rejected, every time.  A drafter with 10% of its map wrong served
token-identical text at accept length 2.51 instead of 2.76 and 0.89x batch throughput on one H200, far above the
accept-length alarm's 1.10.  This watch counts, per target token, how often the drafter proposed it at the first
draft position and how often the target accepted it, on the GPU, on a sample of verifies, and reads the counts
back rarely (a non-blocking copy, each time the counts have doubled and every ``LOOK_SECONDS``).  A counted verify
costs two copies into GPU buffers (no arithmetic); the counting itself runs once per ``BUFFER_ROWS`` first drafts.

The test (numbers and why: docs/draft-token-watch.md).  The trials are contexts, not proposals: greedy decoding
repeats a miss in a repeated context (the same prompt, or a text whose next token depends on the last one only),
so a healthy drafter's token proposed 40 times in 2 contexts can be rejected all 40 times; that gave false warnings
on one H200.  A context here is the verified token before the draft, hashed into ``CONTEXT_BUCKETS`` buckets; a
token's n is the number of buckets it was proposed in.  H0, a healthy drafter: in each context a token it proposes
first is accepted with probability at least ``FLOOR_SHARE`` times its first drafts' overall acceptance (p_bar),
independently across contexts.  Under H0 a token proposed in n contexts is never accepted with probability at most
q = (1 - FLOOR_SHARE * p_bar)^n.  A wrong map entry is rejected in every context; a frequent token is proposed
after many different tokens.  The tokens tested are those with
q <= ``Q_TESTED``; D of them were never accepted, where H0 expects at most mu = sum q.  The k-th look warns when
P(D >= d | H0) <= alpha_k (a Chernoff bound for a sum of independent Bernoulli trials), with alpha_k =
``ALPHA`` * 6 / (pi^2 k^2), so that all looks of one server together stay below ``ALPHA``; and only when the
never-accepted tokens took at least ``MIN_DEAD_SHARE`` of the first drafts (a loss worth a warning).

Cost: the watch times its own host work (the GPU counting, the rare read-back and the judging) and samples one
verify in ``stride``, with ``stride`` chosen so that its measured time stays below ``COST_SHARE`` of the measured
time between verifies; at looks 1, 2, 4, 8, ... it logs that time, as measured, at INFO.  Only chains (``--speculative-eagle-topk 1``) are watched; only TP rank 0 counts and logs.

This module imports neither sglang nor torch at import time.
"""
from __future__ import annotations

import functools
import logging
import math
import time

from sglang_pcie.runtime.results import mark

# The logger's name from before the patch had its own folder: log filters and handlers keep working.
LOGGER = "sglang_pcie.runtime.draft_watch"

PATCH_ID = "draft-token-watch"
LOG_PREFIX = "sglang-pcie draft-token-watch"

FLOOR_SHARE = 0.25  # H0: no first-draft token is accepted less than a quarter as often as the drafter's average
Q_TESTED = 0.01  # a token is tested once H0 gives it at most this chance of never being accepted
ALPHA = 1e-3  # false-warning probability per server under H0, over all its looks together
MIN_DEAD_SHARE = 0.02  # never-accepted tokens must have taken at least 2% of the first drafts
MIN_DEAD_TOKENS = 3
MIN_PROPOSALS = 1000  # first drafts counted before the first look
CONTEXT_BUCKETS = 64  # a token's contexts: the verified tokens before it, hashed (id & 63)
FIRST_STRIDE = 100  # count one verify in 100 until the watch has measured its own cost
MAX_STRIDE = 10_000
BUFFER_ROWS = 8192  # first drafts held on the GPU (token, accept length) before one bulk count
LOOK_SECONDS = 10.0  # between read-backs
COST_SHARE = 0.0005  # the watch's own host time: at most 0.05% of the time between verifies
SHOWN_TOKENS = 5

# v1's verify output: the accepted drafts per request, on the host (0.5.8-0.5.10.post1, 0.5.11, 0.5.12-0.5.12.post1)
V1_FIELDS = ("accept_length_per_req_cpu", "num_accepted_drafts_per_req_cpu", "num_correct_drafts_per_req_cpu")

WATCHING, WARNED, OFF = "watching", "warned", "off"


def wrap(function, kind: str = "v2", settings=None):
    """``function`` (an EAGLE worker's ``verify``; ``kind`` v1 or v2: what it returns) followed by the watch (which
    reads no setting); with ``kind`` load-v2 / load-v1, the worker's set-up step that follows the vocabulary map and
    the heads, with the map's check at load (``map_check``)."""
    if kind in ("load-v2", "load-v1"):
        from sglang_pcie.patches.draft_token_watch import map_check

        return mark(map_check.wrap_load(function, kind), PATCH_ID)

    @functools.wraps(function)
    def verify_watched(self, batch, *args, **kwargs):
        watch = _WATCH or get_watch()
        if watch.state != WATCHING:
            return function(self, batch, *args, **kwargs)
        watch.calls += 1
        if watch.calls % watch.stride:  # a verify not counted: no clock read, no work (docs: its measured cost)
            return function(self, batch, *args, **kwargs)
        verify_input = _verify_input(kind, batch, args, kwargs)  # before: verify rebinds batch.spec_info (v1)
        result = function(self, batch, *args, **kwargs)
        watch.after_verify(self, batch, verify_input, result, kind)
        return result
    return mark(verify_watched, PATCH_ID)


def _verify_input(kind: str, batch, args: tuple, kwargs: dict):
    """What the verify checks: v1 up to 0.5.11 is called as ``verify(batch, spec_info)`` while ``batch.spec_info``
    still holds the draft input; v1 from 0.5.12 and v2 read it from ``batch.spec_info`` (v2's other parameters are
    not the verify input)."""
    if kind == "v1":
        given = args[0] if args else kwargs.get("spec_info")
        if given is not None:
            return given
    return getattr(batch, "spec_info", None)


_WATCH: "DraftWatch | None" = None  # one per process: the process's EAGLE worker


def get_watch() -> "DraftWatch":
    global _WATCH
    if _WATCH is None:
        _WATCH = DraftWatch()
    return _WATCH


def set_watch(watch: "DraftWatch | None") -> None:
    """Replace the process's watch (tests, benchmarks); None: a fresh one at the next verify."""
    global _WATCH
    _WATCH = watch


class DraftWatch:
    def __init__(self, clock=time.perf_counter, look_seconds=LOOK_SECONDS, cost_share=COST_SHARE,
                 first_stride=FIRST_STRIDE):
        self.clock, self.look_seconds, self.cost_share = clock, look_seconds, cost_share
        self.state = WATCHING
        self.calls = 0  # verifies seen
        self.sampled = 0  # verifies counted
        self.stride = first_stride
        self.own_seconds = 0.0  # the watch's host time in the verifies it counted (the others: an increment)
        self.last_call = None  # when the last counted verify began
        self.calls_at_last = 0
        self.interval = None  # running mean of the time between verifies (s)
        self.counts = None  # GPU: [proposed | accepted | context buckets] per token, int64
        self.host = self.ready = None  # pinned copy of counts, and the event that says it is complete
        self.pending = False
        self.counted = 0  # first drafts counted (known on the host: the batch sizes)
        self.counted_at_read = 0
        self.at_look = None  # (counted, sampled, calls, own_seconds, interval) when the last look's counts were taken
        self.last_read = None
        self.looks = 0
        self.vocab = 0
        self.server: dict = {}
        self.logger = logging.getLogger(LOGGER)
        self.lines: list[str] = []
        self.finding: dict | None = None
        self.setup_seconds = 0.0  # the one-time set-up (buffers, each kernel's first launch), measured

    # ---------------------------------------------------------------- in the decode path

    def after_verify(self, worker, batch, verify_input, result, kind) -> None:
        """One counted verify. Never raises: an error turns the watch off, with one line saying so."""
        start = self.clock()
        if self.last_call is not None:  # the mean time between verifies, from the counted ones
            gap = (start - self.last_call) / max(1, self.calls - self.calls_at_last)
            self.interval = gap if self.interval is None else 0.9 * self.interval + 0.1 * gap
        self.last_call, self.calls_at_last = start, self.calls
        try:
            if self.counts is None:
                bound = self._bind(worker, batch, verify_input)
                self.setup_seconds += self.clock() - start
                if not bound:
                    return
                start = self.clock()  # the one-time set-up is no per-verify cost: the stride ignores it
            self._count(verify_input, result, kind)
            self._read_back(start)
        except Exception as exc:  # never in SGLang's way
            self._off(f"{type(exc).__name__}: {exc}")
        finally:
            if self.state == WATCHING:
                self.own_seconds += self.clock() - start
                self._restride()

    def _restride(self) -> None:
        """Count one verify in ``stride``: the watch's measured host time per counted verify, spread over
        ``stride`` verifies, at most ``cost_share`` of the measured time between verifies."""
        if self.sampled and self.interval:
            per_sample = self.own_seconds / self.sampled
            self.stride = min(MAX_STRIDE, max(1, math.ceil(per_sample / (self.cost_share * self.interval))))

    def _bind(self, worker, batch, verify_input) -> bool:
        import torch

        from sglang_pcie.runtime.server_facts import describe_server, tp_rank

        server_args = getattr(worker, "server_args", None)
        self.server = describe_server(server_args)
        self.logger = logging.getLogger(type(worker).__module__)
        topk = getattr(worker, "topk", getattr(server_args, "speculative_eagle_topk", 1))
        # The rank where each release keeps it (0.5.23's EAGLEWorkerV2 has no tp_rank: SGLang's parallel state).
        if tp_rank(worker) != 0 or (topk or 1) != 1 or verify_input is None:
            self.state = OFF  # other TP ranks see the same drafts; trees are not watched (docs)
            return False
        draft = getattr(verify_input, "draft_token", None)
        if not isinstance(draft, torch.Tensor):
            self._off("the verify input carries no draft_token tensor")
            return False
        if draft.is_cuda and torch.cuda.is_current_stream_capturing():
            return False  # inside a CUDA graph capture: bind at a later verify
        self.vocab = _vocab_size(worker, batch)
        if not self.vocab:
            self._off("no vocabulary size on the worker or the batch")
            return False
        self.counts = torch.zeros(3 * self.vocab, dtype=torch.int64, device=draft.device)
        self.contexts = torch.zeros((self.vocab, CONTEXT_BUCKETS), dtype=torch.uint8, device=draft.device)
        self.ones = torch.ones(BUFFER_ROWS, dtype=torch.int64, device=draft.device)
        self.ones_u8 = torch.ones(BUFFER_ROWS, dtype=torch.uint8, device=draft.device)
        self.chain_buffer = torch.zeros((BUFFER_ROWS, 2), dtype=torch.int64, device=draft.device)  # [verified, first]
        self.accept_buffer = torch.zeros(BUFFER_ROWS, dtype=torch.int64, device=draft.device)
        self.buffered = 0
        pin = draft.device.type == "cuda"
        self.host = torch.zeros(3 * self.vocab, dtype=torch.int64, pin_memory=pin)
        self._first_launches()
        return True

    def _first_launches(self) -> None:
        """Each kernel the watch launches, once, here in the set-up: a kernel's first launch loads its module (lazy
        CUDA loading, milliseconds), which the stride would otherwise take for a per-verify cost (one H200: 651 us
        per counted verify and 0.52% of the time between verifies at the first look without this)."""
        import torch

        self.accept_buffer[:1].copy_(self.chain_buffer[:1, 0].to(torch.int32))  # SGLang's accept_lens: int32
        self.chain_buffer[:2].copy_(self.accept_buffer[:8].view(2, 4)[:, :2])  # strided, as from the drafts
        self.buffered = 1
        self.count_buffered()
        torch.sum(self.contexts, dim=1, out=self.counts[2 * self.vocab:])
        self.host.copy_(self.counts, non_blocking=True)
        self.counts.zero_()
        self.contexts.zero_()

    def _count(self, verify_input, result, kind) -> None:
        """Two copies: each request's verified token and first draft, and its accept length (the bonus token
        included)."""
        import torch

        draft = verify_input.draft_token
        if draft.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # a verify inside a CUDA graph capture: counting there would be baked into the graph
        if kind == "v1":
            verify_output = next(r for r in result if any(hasattr(r, f) for f in V1_FIELDS))
            drafts = next(getattr(verify_output, f) for f in V1_FIELDS if hasattr(verify_output, f))
            accept_lens = torch.tensor([d + 1 for d in drafts], dtype=torch.int64, device=draft.device)
        else:
            accept_lens = result.accept_lens
        rows = accept_lens.shape[0]
        if rows == 0 or draft.numel() % rows or draft.numel() // rows < 2 or rows > BUFFER_ROWS:
            return  # an idle batch, no draft at all (adaptive steps at 0), a shape it does not know: not counted
        if self.buffered + rows > BUFFER_ROWS:
            self.count_buffered()
        end = self.buffered + rows
        # columns 0 and 1 of each chain: the verified token (the draft's context) and the first draft
        self.chain_buffer[self.buffered:end].copy_(draft.reshape(rows, -1)[:, :2])
        self.accept_buffer[self.buffered:end].copy_(accept_lens)
        self.buffered = end
        self.sampled += 1
        self.counted += rows

    def count_buffered(self) -> None:
        """The buffered first drafts into counts ([proposed | accepted] per token) and each token's context
        buckets."""
        if self.counts is None:
            return
        n, self.buffered = self.buffered, 0
        if n:
            first = self.chain_buffer[:n, 1].clamp(0, self.vocab - 1)
            self.counts.index_add_(0, first, self.ones[:n])
            self.counts.index_add_(0, first + self.vocab, (self.accept_buffer[:n] >= 2).long())
            bucket = self.chain_buffer[:n, 0].bitwise_and(CONTEXT_BUCKETS - 1)
            self.contexts.index_put_((first, bucket), self.ones_u8[:n])

    def _read_back(self, now) -> None:
        if self.pending:
            if not self.ready.query():
                return
            self.pending = False
            self.judge_counts(self.host.numpy())
        elif self.counted >= MIN_PROPOSALS and (self.counted >= 2 * self.counted_at_read or self.last_read is None
                                                 or now - self.last_read >= self.look_seconds):
            import torch

            # a look each time the counts double, and every look_seconds: a short burst of traffic is judged too
            self.last_read, self.counted_at_read = now, self.counted
            self.count_buffered()
            # the figures a look's lines give, as they are now: the counts read back are these first drafts
            self.at_look = (self.counted, self.sampled, self.calls, self.own_seconds, self.interval)
            torch.sum(self.contexts, dim=1, out=self.counts[2 * self.vocab:])
            self.host.copy_(self.counts, non_blocking=True)
            self.ready = torch.cuda.Event() if self.counts.is_cuda else _Done()
            if self.counts.is_cuda:
                self.ready.record()
            self.pending = True

    # ---------------------------------------------------------------- judging (host, numpy)

    def judge_counts(self, counts) -> None:
        """Judge a read-back of ``counts``: [proposed | accepted | context buckets] per token (``count_buffered``)."""
        vocab = len(counts) // 3
        proposed, accepted, contexts = counts[:vocab], counts[vocab:2 * vocab], counts[2 * vocab:]
        if int(proposed.sum()) < MIN_PROPOSALS:
            return  # not a look: spends none of ALPHA
        self.looks += 1
        finding = judge(proposed, accepted, self.looks, contexts)
        if finding is not None and finding["warn"] and self.state == WATCHING:
            self.finding = finding
            self._log(warning_message(self.server, finding, self))
            self.state = WARNED
        elif finding is not None and self.looks & (self.looks - 1) == 0:  # looks 1, 2, 4, 8, ...
            self.logger.info(f"{LOG_PREFIX}: look {self.looks}: {finding['tested']} tokens tested, {finding['dead']}"
                             f" never accepted (a healthy drafter: at most {finding['expected_dead']:.2g} expected),"
                             f" no warning; {self.cost_text(self.at_look)}")

    def cost_text(self, at=None) -> str:
        """The watch's own host time, as measured (the one-time set-up apart); ``at``: the figures as they were when
        a look's counts were taken (``at_look``), so that a look's lines give one count of first drafts, the one
        judged (the read-back completes verifies later, when more have been counted)."""
        counted, sampled, calls, own, interval = at or (self.counted, self.sampled, self.calls, self.own_seconds,
                                                        self.interval)
        per_verify = own / sampled if sampled else 0.0
        share = own / (calls * interval) if calls and interval else 0.0
        return (f"{counted:,} first drafts counted in {sampled:,} of {calls:,} verifies (1 in"
                f" {self.stride}); own host time {per_verify * 1e6:.1f} us per counted verify, {share:.3%} of the"
                f" time between verifies ({(interval or 0) * 1e3:.2f} ms); set-up {self.setup_seconds * 1e3:.1f}"
                " ms once")

    def _off(self, why: str) -> None:
        self.state = OFF
        try:
            self._log(f"{LOG_PREFIX}: off: {why}")
        except Exception:
            pass

    def _log(self, text: str) -> None:
        self.lines.append(text)
        self.logger.warning(text)


class _Done:
    @staticmethod
    def query():
        return True


def _vocab_size(worker, batch) -> int:
    for owner, names in ((worker, ("target_worker", "model_config", "vocab_size")),
                         (worker, ("target_worker", "model_runner", "model_config", "vocab_size")),
                         (worker, ("model_config", "vocab_size")),
                         (batch, ("sampling_info", "vocab_size"))):
        value = owner
        for name in names:
            value = getattr(value, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def chernoff_tail(mu: float, d: int) -> float:
    """An upper bound on P(D >= d) for D a sum of independent Bernoulli trials with mean at most mu."""
    if d <= mu:
        return 1.0
    if mu <= 0:
        return 0.0
    return min(1.0, math.exp(-mu + d - d * math.log(d / mu)))


def look_alpha(look: int) -> float:
    """The share of ALPHA the look-th look may spend (they sum to ALPHA over any number of looks)."""
    return ALPHA * 6 / (math.pi ** 2 * look ** 2)


def judge(proposed, accepted, look: int = 1, contexts=None) -> dict | None:
    """The test of the module docstring on per-token counts (numpy int arrays; ``contexts``: the context buckets
    each token was proposed in, None: every proposal in a context of its own); None before MIN_PROPOSALS."""
    import numpy as np

    total = int(proposed.sum())
    if total < MIN_PROPOSALS:
        return None
    p_bar = int(accepted.sum()) / total
    floor = FLOOR_SHARE * p_bar
    if floor <= 0:
        return None  # nothing accepted at all: the accept-length alarm's case
    seen = proposed > 0
    q = np.ones(len(proposed))
    trials = proposed if contexts is None else contexts
    q[seen] = np.exp(trials[seen] * math.log1p(-floor))
    tested = seen & (q <= Q_TESTED)
    dead = tested & (accepted == 0)
    mu, d = float(q[tested].sum()), int(dead.sum())
    tail = chernoff_tail(mu, d)
    share = int(proposed[dead].sum()) / total
    order = np.argsort(-proposed[dead])[:SHOWN_TOKENS]
    top = [(int(t), int(n)) for t, n in zip(np.flatnonzero(dead)[order], proposed[dead][order])]
    warn = tail <= look_alpha(look) and share >= MIN_DEAD_SHARE and d >= MIN_DEAD_TOKENS
    return {"warn": bool(warn), "proposals": total, "first_accept": p_bar, "tested": int(tested.sum()),
            "dead": d, "expected_dead": mu, "tail": tail, "alpha": look_alpha(look), "dead_share": share,
            "top": top, "look": look}


def warning_message(server: dict, finding: dict, watch: DraftWatch) -> str:
    from sglang_pcie.runtime.server_facts import check_command

    shown = ", ".join(f"{t} ({n}x)" for t, n in finding["top"])
    lines = [
        f"{LOG_PREFIX}: {server.get('algorithm') or 'EAGLE'} drafter {server.get('draft')} proposes "
        f"{finding['dead']} target tokens as first drafts that are never accepted in any of the many contexts it "
        f"proposed them in: {finding['dead_share']:.1%} of "
        f"its {finding['proposals']:,} counted first drafts, while its first drafts are accepted "
        f"{finding['first_accept']:.0%} of the time. Most proposed: {shown} (token id, times).",
        "  A healthy drafter's often-proposed tokens are accepted in some contexts; tokens rejected whatever the "
        "context point to a wrong vocabulary map (d2t / t2d), a drafter built for another target revision, or a "
        "drafter that is wrong about these tokens everywhere (its drafts of them are wasted either way).",
        f"  check the drafter against its target: {check_command(server)}" if server else "",
        f"  (test: {finding['tested']} tokens proposed in enough different contexts to test, {finding['expected_dead']:.2g} never "
        f"accepted expected at most for a healthy drafter, P <= {finding['tail']:.1e}; look {finding['look']}; "
        f"{watch.cost_text(watch.at_look)}; one warning per server;"
        f" switch off: SGLANG_PCIE_DISABLE_PATCHES={PATCH_ID})",
    ]
    return "\n".join(line for line in lines if line)
