"""draft-token-watch: one warning per server when some of an EAGLE chain drafter's first drafts are never accepted.

A wrong entry in a drafter's vocabulary map (d2t) sends one draft token to the wrong target token whatever the
context: that token is proposed and then rejected, every time.  A drafter with 10% of its map wrong served
token-identical text at accept length 2.51 instead of 2.76 and 0.89x batch throughput on one H200, far above the
accept-length alarm's 1.10.  This watch counts, per target token, how often the drafter proposed it at the first
draft position and how often it agreed with the target there (the token greedy decoding takes: the target's
argmax), on the GPU, and reads the counts back rarely (a non-blocking copy at 1, 2, 4, 8 s after the first verify,
then every ``LOOK_SECONDS``).

Where it counts: in SGLang's logits processor during the target's verify forward (``verify_count``: one Triton
kernel, no host synchronisation).  SGLang captures that forward in a CUDA graph for each batch size it captures, and
the kernel is captured with it: every such verify is counted at no host cost.  A verify run eagerly (a batch
larger than the graphs, or graphs off) is counted on the watch's turn only.

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

Cost: the watch's host work happens on its turn, one verify in ``stride`` (a clock read, the look's read-back and
judging when due, the kernel's launch when that verify runs eagerly); every other verify costs an increment and a
modulo.  It times its turns and chooses ``stride`` so that their measured time stays below ``COST_SHARE`` of the
measured time between verifies; it measures its kernel's GPU time once at set-up; at looks 1, 2, 4, 8, ... it logs
both, as measured, at INFO.  Only chains (``--speculative-eagle-topk 1``) are watched; only TP rank 0 counts and
logs.

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
FIRST_STRIDE = 100  # the watch's turn: one verify in 100 until it has measured its own cost
MAX_STRIDE = 10_000
FIRST_LOOK = 1.0  # seconds after the first verify; the looks' spacing then doubles up to LOOK_SECONDS
LOOK_SECONDS = 10.0  # between read-backs, at most
COST_SHARE = 0.0005  # the watch's own host time: at most 0.05% of the time between verifies
TIMED_LAUNCHES = 20  # the kernel's GPU time, measured once at set-up over this many launches
SHOWN_TOKENS = 5
# SGLang's verify input of an EAGLE chain or tree (EAGLE, EAGLE-3, STANDALONE); others (NGRAM) are not drafters
VERIFY_INPUT = "EagleVerifyInput"

WATCHING, WARNED, OFF = "watching", "warned", "off"


def wrap(function, kind: str = "v2", settings=None):
    """``function`` with the watch (which reads no setting), by ``kind``:

    - ``v2`` / ``v1``: an EAGLE worker's ``verify``, where the watch takes its turn (binds to the server at the first
      verify, reads the clock, reads the counts back and judges them);
    - ``verify-logits``: SGLang's ``LogitsProcessor.forward``, where a target verify's first drafts are counted;
    - ``load-v2`` / ``load-v1``: the worker's set-up step that follows the vocabulary map and the heads, with the
      map's check at load (``map_check``)."""
    if kind in ("load-v2", "load-v1"):
        from sglang_pcie.patches.draft_token_watch import map_check

        return mark(map_check.wrap_load(function, kind), PATCH_ID)
    if kind == "verify-logits":
        return mark(_logits_watched(function), PATCH_ID)

    @functools.wraps(function)
    def verify_watched(self, batch, *args, **kwargs):
        watch = _WATCH or get_watch()
        if watch.state != WATCHING:
            return function(self, batch, *args, **kwargs)
        watch.calls += 1
        if watch.bound and watch.calls % watch.stride:  # not its turn (the first verify is): no clock read, no work
            return function(self, batch, *args, **kwargs)
        watch.turn_begins(self)
        try:
            return function(self, batch, *args, **kwargs)
        finally:
            watch.turn_ends()
    return mark(verify_watched, PATCH_ID)


def _logits_watched(function):
    @functools.wraps(function)
    def logits_watched(self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        output = function(self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs)
        is_target_verify = getattr(getattr(logits_metadata, "forward_mode", None), "is_target_verify", None)
        if is_target_verify is not None and is_target_verify() and not _compiling():
            watch = _WATCH or get_watch()
            if watch.state == WATCHING:
                watch.on_verify_logits(self, lm_head, logits_metadata, output)
        return output
    return logits_watched


_WATCH: "DraftWatch | None" = None  # one per process: the process's EAGLE worker and target model


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
        self.bound = False  # the first verify's turn has read the server (rank, chain, names)
        self.calls = 0  # verifies seen
        self.turns = 0  # verifies that were the watch's turn
        self.stride = first_stride
        self.own_seconds = 0.0  # the watch's host time in its turns (the other verifies: an increment)
        self.last_turn = None  # when the last turn began
        self.calls_at_last = 0
        self.interval = None  # running mean of the time between verifies (s)
        self.counts = None  # GPU: [first drafts | agreeing ones | context buckets] per token, int64
        self.contexts = None  # GPU: uint8 [vocab, CONTEXT_BUCKETS], 1 where the token was proposed in the bucket
        self.vocab = 0
        self.host = self.ready = None  # pinned copy of counts, and the event that says it is complete
        self.pending = False
        self.count_next = False  # the verify under way is the watch's turn: count it if it runs eagerly
        self.graphs = 0  # CUDA graph captures that took the count
        self.graphs_missed = 0  # captures before the counts could be set up (not counted there)
        self.eager_verifies = 0  # target verifies run eagerly since the first verify
        self.eager_counted = 0  # ... of them counted (the watch's turn)
        self.kernel_seconds = None  # the kernel's GPU time per launch, measured at set-up
        self.kernel_rows = 0  # ... on a batch of this many requests
        self.started = self.last_read = None
        self.said_uncounted = False  # the one line saying that nothing reaches the count
        self.at_look = None  # the figures when the last look's counts were taken (``figures``)
        self.looks = 0
        self.server: dict = {}
        self.logger = logging.getLogger(LOGGER)
        self.lines: list[str] = []
        self.finding: dict | None = None
        self.setup_seconds = 0.0  # the one-time set-up (buffers, the kernel's first launches), measured

    # ---------------------------------------------------------------- the verify: the watch's turn

    def turn_begins(self, worker) -> None:
        """Before SGLang's verify, on the watch's turn. Never raises: an error turns the watch off, with one line."""
        start = self.clock()
        if self.last_turn is not None:  # the mean time between verifies, from the turns
            gap = (start - self.last_turn) / max(1, self.calls - self.calls_at_last)
            self.interval = gap if self.interval is None else 0.9 * self.interval + 0.1 * gap
        self.last_turn, self.calls_at_last = start, self.calls
        try:
            if not self.bound:
                self._bind(worker)
                self.started = self.last_read = start
            self.count_next = self.state == WATCHING
        except Exception as exc:  # never in SGLang's way
            self._off(f"{type(exc).__name__}: {exc}")
        self.own_seconds += self.clock() - start

    def turn_ends(self) -> None:
        """After SGLang's verify, on the watch's turn: a look's read-back, when due, and the stride."""
        start = self.clock()
        self.count_next = False
        try:
            if self.state == WATCHING and self.counts is not None:
                self._read_back(start)
            elif self.state == WATCHING and not self.said_uncounted and start - self.started >= FIRST_LOOK:
                self.said_uncounted = True  # silence must not read as a healthy drafter
                self.logger.info(f"{LOG_PREFIX}: counts nothing in this server: no target verify forward reached the"
                                 f" count ({self.graphs_missed} CUDA graphs captured before it could count; forwards"
                                 " traced by torch.compile or without SGLang's ForwardBatch are not counted)")
        except Exception as exc:
            self._off(f"{type(exc).__name__}: {exc}")
        finally:
            self.turns += 1
            self.own_seconds += self.clock() - start
            if self.state == WATCHING:
                self._restride()

    def _restride(self) -> None:
        """A turn in ``stride`` verifies: the watch's measured host time per turn, spread over ``stride``
        verifies, at most ``cost_share`` of the measured time between verifies."""
        if self.turns and self.interval:
            per_turn = self.own_seconds / self.turns
            self.stride = min(MAX_STRIDE, max(1, math.ceil(per_turn / (self.cost_share * self.interval))))

    def _bind(self, worker) -> None:
        from sglang_pcie.runtime.server_facts import describe_server, tp_rank

        self.bound = True
        server_args = getattr(worker, "server_args", None)
        self.server = describe_server(server_args)
        self.logger = logging.getLogger(type(worker).__module__)
        topk = getattr(worker, "topk", getattr(server_args, "speculative_eagle_topk", 1))
        # The rank where each release keeps it (0.5.23's EAGLEWorkerV2 has no tp_rank: SGLang's parallel state).
        if tp_rank(worker) != 0 or (topk or 1) != 1:
            self.state = OFF  # other TP ranks see the same drafts; trees are not watched (docs)

    # ---------------------------------------------------------------- the target's verify forward: the count

    def on_verify_logits(self, processor, lm_head, batch, output) -> None:
        """A target verify's logits (``processor``: SGLang's LogitsProcessor, ``batch``: its ForwardBatch): counted
        where SGLang captures the forward in a CUDA graph (then on every verify that graph runs), and on the watch's
        turn where it runs eagerly. Never raises: an error turns the watch off, with one line."""
        try:
            logits = getattr(output, "next_token_logits", None)
            capturing = _capturing(logits)
            if not capturing and self.calls:
                self.eager_verifies += 1
            if self.counts is None:
                if capturing:
                    self.graphs_missed += 1  # buffers made in a capture belong to the graph: none made there
                    return
                start = self.clock()
                ready = self._set_up(processor, lm_head, batch, logits)
                self.setup_seconds += self.clock() - start
                if not ready:
                    return
            if capturing:
                if self._count(batch, logits):
                    self.graphs += 1
            elif self.count_next:
                self.count_next = False
                start = self.clock()
                if self._count(batch, logits):
                    self.eager_counted += 1
                self.own_seconds += self.clock() - start
        except Exception as exc:  # never in SGLang's way
            self._off(f"{type(exc).__name__}: {exc}")

    def _set_up(self, processor, lm_head, batch, logits) -> bool:
        """The buffers, at the first target verify forward that is not captured (SGLang runs each graph's forward
        eagerly before capturing it): TP rank 0, chains, on a CUDA device (tests: Triton's interpreter)."""
        import os

        import torch

        from sglang_pcie.runtime.server_facts import tp_rank

        spec_info = getattr(batch, "spec_info", None)
        if spec_info is None:
            return False  # a model that hands the processor no ForwardBatch: nothing to read here, not counted
        if type(spec_info).__name__ != VERIFY_INPUT or (getattr(spec_info, "topk", 1) or 1) != 1:
            self.state = OFF  # not an EAGLE drafter's verify, or a tree: not watched (docs)
            return False
        if tp_rank(lm_head) != 0:
            self.state = OFF  # other TP ranks see the same drafts
            return False
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
            self._off("the target verify's logits are not a 2-D tensor")
            return False
        vocab = getattr(processor, "vocab_size", None)
        if isinstance(vocab, int) and logits.shape[1] < vocab:
            self._off(f"the target verify's logits hold {logits.shape[1]} of the {vocab} tokens (a vocabulary shard)")
            return False
        if not logits.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            self._off(f"counts on CUDA devices only (the target's logits are on {logits.device})")
            return False
        from sglang_pcie.patches.draft_token_watch import verify_count

        self.vocab = int(logits.shape[1])
        self.counts = torch.zeros(3 * self.vocab, dtype=torch.int64, device=logits.device)
        self.contexts = torch.zeros((self.vocab, CONTEXT_BUCKETS), dtype=torch.uint8, device=logits.device)
        self.host = torch.zeros(3 * self.vocab, dtype=torch.int64, pin_memory=logits.is_cuda)
        self._launch, self._inputs = verify_count.launch, verify_count.verify_inputs
        # the read-back's own kernels once here: a first launch loads its module (lazy CUDA loading), which would
        # otherwise fall into the first look's turn (the sampled watch: 651 us per turn and 0.52% at look 1, H200)
        self._copy_counts()
        self._time_kernel(batch, logits)
        return True

    def _time_kernel(self, batch, logits) -> None:
        """The kernel's GPU time per launch, measured once on this forward's shapes with every row left uncounted
        (its scan of the logits runs all the same); its first launch (compiling, loading) is set-up."""
        import torch

        inputs = self._inputs(batch, logits)
        if inputs is None:
            return
        input_ids, seq_lens = inputs
        uncounted = torch.zeros_like(seq_lens)
        self._launch(logits, input_ids, uncounted, self.counts, self.contexts)
        if not logits.is_cuda:
            return
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(TIMED_LAUNCHES):
            self._launch(logits, input_ids, uncounted, self.counts, self.contexts)
        end.record()
        end.synchronize()
        self.kernel_seconds = begin.elapsed_time(end) / 1e3 / TIMED_LAUNCHES
        self.kernel_rows = int(seq_lens.shape[0])

    def _count(self, batch, logits) -> bool:
        inputs = self._inputs(batch, logits)
        if inputs is None:
            return False  # no draft (adaptive steps at 0), a shape it does not know: not counted
        self._launch(logits, *inputs, self.counts, self.contexts)
        return True

    def _read_back(self, now) -> None:
        if self.pending:
            if not self.ready.query():
                return
            self.pending = False
            self.judge_counts(self.host.numpy())
        elif now - self.last_read >= min(self.look_seconds, max(FIRST_LOOK, self.last_read - self.started)):
            import torch

            # looks 1, 2, 4, 8 s after the first verify, then every look_seconds: a short burst is judged too
            self.last_read = now
            self.at_look = self.figures()
            self._copy_counts()
            self.ready = torch.cuda.Event() if self.counts.is_cuda else _Done()
            if self.counts.is_cuda:
                self.ready.record()
            self.pending = True

    def _copy_counts(self) -> None:
        """Contexts per token summed into the counts' last third, all of it copied to the pinned host buffer."""
        import torch

        torch.sum(self.contexts, dim=1, out=self.counts[2 * self.vocab:])
        self.host.copy_(self.counts, non_blocking=True)

    def figures(self) -> dict:
        """What the cost line gives, as it is now."""
        return {"calls": self.calls, "turns": self.turns, "own": self.own_seconds, "interval": self.interval,
                "eager": self.eager_verifies, "eager_counted": self.eager_counted, "stride": self.stride}

# ---------------------------------------------------------------- judging (host, numpy)

    def judge_counts(self, counts) -> None:
        """Judge a read-back of ``counts``: [first drafts | agreeing | context buckets] per token (``_read_back``)."""
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
        """Where the watch counts and what it costs, as measured (the one-time set-up apart); ``at``: the figures as
        they were when a look's counts were taken (``at_look``), so that a look's lines describe the counts judged
        (the read-back completes verifies later)."""
        at = at or self.figures()
        calls, turns, own, interval = at["calls"], at["turns"], at["own"], at["interval"]
        per_turn = own / turns if turns else 0.0
        share = own / (calls * interval) if calls and interval else 0.0
        missed = f", {self.graphs_missed} captured before it could count" if self.graphs_missed else ""
        kernel = (f"kernel {self.kernel_seconds * 1e6:.1f} us of GPU time per verify of {self.kernel_rows} requests"
                  " (measured at set-up)" if self.kernel_seconds is not None else "kernel time not measured")
        return (f"counted: the {calls - at['eager']:,} of {calls:,} verifies run in CUDA graphs ({self.graphs} graphs"
                f" took the count{missed}) and {at['eager_counted']:,} of {at['eager']:,} run eagerly; own host time"
                f" {per_turn * 1e6:.1f} us per turn (1 verify in {at['stride']}), {share:.3%} of the time between"
                f" verifies ({(interval or 0) * 1e3:.2f} ms); {kernel}; set-up {self.setup_seconds * 1e3:.1f} ms once")

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


def _compiling() -> bool:
    """Whether torch.compile is tracing this forward (--enable-torch-compile): not counted there (docs)."""
    import torch

    return torch.compiler.is_compiling()


def _capturing(logits) -> bool:
    """Whether this forward is being captured in a CUDA graph (then the kernel is captured with it)."""
    import torch

    return isinstance(logits, torch.Tensor) and logits.is_cuda and torch.cuda.is_current_stream_capturing()


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
