"""What each decode cycle emitted (accepted drafts + one bonus token per request), counted without a kernel or a wait
of the profiler's own where SGLang already copies ``accept_lens`` to the host (see the package docstring), and how
many request-verifies emitted each number of tokens (the acceptance per depth: ``accept_hist``)."""
from __future__ import annotations

import itertools
import sys
from collections import Counter

# The v1 worker's per-request accepted-draft counts (host lists), by release: 0.5.8-0.5.10, 0.5.11, 0.5.12-0.5.12.post1.
V1_ACCEPT_FIELDS = ("accept_length_per_req_cpu", "num_accepted_drafts_per_req_cpu", "num_correct_drafts_per_req_cpu")
TOKEN_BATCH = 128  # SGLang's host copies of accept_lens summed together, once the newest one's copy_done has passed
NO_TOKENS = object()  # a timed slot that carries no token count of its own
HIST_MAX_TOKENS = 1 << 22  # a batch's histogram is taken only below this many tokens (its largest value is at most
# the sum: bounds what the count allocates, whatever a damaged copy held)


class TokenCounter:
    """The profiler's token counts: SGLang's host copies of v2 ``accept_lens`` (exact, every cycle), the v1 host
    lists, or, where SGLang makes no host copy, each timed cycle's own count staged by the clock.

    ``observe``: the accept-length observation of a timed cycle (Prometheus), or None."""

    def __init__(self):
        self.mode = None  # "sglang": SGLang's host copy is read; "own": timed cycles stage their own
        self.stash = None  # the last decode cycle's result, until SGLang has made its host copy of accept_lens
        self.copies = []  # SGLang's host copies of accept_lens, not summed yet
        self.copy_meta = []  # (stats, batch size, timed, copy_done event) of each
        self.observe = None

    def count(self, result, slot, stats, clock):
        """Count a decode cycle's tokens into ``stats`` now, or arrange for them to be counted (``slot``: the
        cycle's timed slot, or None)."""
        accept_lens = getattr(result, "accept_lens", None)  # v2: per request, bonus included, on the GPU
        if accept_lens is not None and hasattr(accept_lens, "shape"):
            on_gpu = getattr(accept_lens, "is_cuda", False)
            if on_gpu and self.mode != "own":
                # SGLang replaces result.accept_lens by its host copy right after this call returns (copy_to_cpu, in
                # overlap and non-overlap scheduling alike): take that at the start of the next cycle (the batch
                # size too: the copy has as many elements as accept_lens).
                self.stash = (result, accept_lens, stats, slot is not None)
                stats.outstanding += 1
                return
            batch_size = int(accept_lens.shape[0])
            stats.requests_all += batch_size
            if not on_gpu:  # host memory already (no CUDA): read it now
                tokens, hist = host_counts([accept_lens])
                stats.add_tokens(batch_size, tokens, hist)
                if slot is not None and self.observe and batch_size:
                    self.observe(tokens / batch_size)
                return
            if slot is not None:  # mode "own", a timed cycle: sum on the stream, copy to pinned memory, read with
                slot.batch_size = batch_size  # the slot
                slot.staged = clock.stage_tokens(slot.index, accept_lens)
            return
        for name in V1_ACCEPT_FIELDS:  # v1: drafts only
            per_request = getattr(result, name, None)
            if per_request is not None:
                tokens = sum(per_request) + len(per_request)
                stats.requests_all += len(per_request)
                stats.add_tokens(len(per_request), tokens, histogram(Counter(per_request), shift=1))
                if slot is not None and self.observe and per_request:
                    self.observe(tokens / len(per_request))
                return

    def collect_stash(self):
        """The previous decode cycle's host copy of accept_lens, made by SGLang after that cycle returned."""
        result, device_lens, stats, timed = self.stash
        self.stash = None
        copied = getattr(result, "accept_lens", None)
        if copied is not device_lens and copied is not None and getattr(copied, "is_cuda", True) is False:
            self.mode = "sglang"
            self.copies.append(copied)
            self.copy_meta.append((stats, len(copied), timed, getattr(result, "copy_done", None)))
            stats.requests_all += len(copied)
            return
        stats.requests_all += int(device_lens.shape[0])
        # No host copy: this cycle's tokens stay unknown (its interval reports an estimated accept length). Where
        # SGLang has never copied, timed cycles stage their own from now on; where it has, one cycle that went
        # another way must not make every later interval inexact.
        if self.mode is None:
            self.mode = "own"
        stats.outstanding -= 1

    def sum_copies(self, wait, clock):
        """Sum the collected host copies, all at once, once SGLang's copies have landed: they run in order on one
        stream, so the newest one's copy_done stands for all.  ``wait``: None (normal: try again after a later
        cycle if it has not passed), True (wait for it), False (at exit: drop the copies not finished)."""
        copies, meta = self.copies, self.copy_meta
        newest = meta[-1][3]
        if wait is None and newest is not None and clock.capturing():
            return  # an event query is not allowed while a CUDA graph is being captured
        if newest is not None and not newest.query():
            if wait is None:
                return
            if wait:
                newest.synchronize()
            elif not self._drop_unfinished():
                return
        start = 0
        while start < len(copies):  # runs of copies of one interval (all of them, but at an interval's end)
            stats = meta[start][0]
            end = start
            while end < len(copies) and meta[end][0] is stats:
                end += 1
            tokens, hist = host_counts(copies[start:end])
            stats.tokens += tokens
            stats.add_hist(hist)
            stats.requests += sum(m[1] for m in meta[start:end])
            stats.token_cycles += end - start
            stats.outstanding -= end - start
            start = end
        if self.observe:  # the accept length of each timed cycle, as its own observation
            for lens, (_, batch_size, timed, _) in zip(copies, meta):
                if timed and batch_size:
                    self.observe(sum(lens.tolist()) / batch_size)
        copies.clear()
        meta.clear()

    def _drop_unfinished(self) -> bool:
        """At exit: forget the copies the GPU has not finished (counted as unfinished); True if any are left."""
        copies, meta = self.copies, self.copy_meta
        finished = [i for i, m in enumerate(meta) if m[3] is None or m[3].query()]
        for i, (stats, _, _, _) in enumerate(meta):
            if i not in finished:
                stats.unfinished += 1
                stats.outstanding -= 1
        copies[:] = [copies[i] for i in finished]
        meta[:] = [meta[i] for i in finished]
        return bool(copies)


def host_counts(tensors) -> tuple[int, list | None]:
    """(the sum of every element of host tensors, their histogram: how many elements hold each value, or None where
    they are not all non-negative integers).  For a batch of torch tensors one concatenation, one sum and one
    bincount of the concatenation; for host lists one C-level count."""
    torch = sys.modules.get("torch")
    if torch is not None and all(isinstance(t, torch.Tensor) for t in tensors):
        try:  # SGLang's accept_lens are 1-D: concatenated as they are (a reshape each costs as much as the sum)
            flat = torch.cat(tensors) if len(tensors) > 1 else tensors[0]
            tokens = int(flat.sum())
        except RuntimeError:  # 0-d or mixed dimensions: the sum, no histogram
            return _host_sum(tensors), None
        if not 0 <= tokens <= HIST_MAX_TOKENS:
            return tokens, None
        try:
            return tokens, torch.bincount(flat).tolist()
        except RuntimeError:  # not 1-D, a negative or a non-integral value
            return tokens, None
    try:
        values = [_values(t) for t in tensors]
        packed = bytes(itertools.chain.from_iterable(values))  # values 0-255 (accept lengths are): counted in C
    except TypeError:  # 0-d values, objects that only sum, non-integral values
        try:
            values = [_values(t) for t in tensors]
            counts = Counter(itertools.chain.from_iterable(values))
        except TypeError:
            return sum(_sum(t) for t in tensors), None
        return sum(value * count for value, count in counts.items()), histogram(counts)
    except ValueError:  # a value outside 0-255
        counts = Counter(itertools.chain.from_iterable(values))
        return sum(value * count for value, count in counts.items()), histogram(counts)
    hist = [packed.count(value) for value in range(max(packed) + 1)] if packed else []
    return sum(n * count for n, count in enumerate(hist)), hist


def histogram(counts: Counter, shift=0) -> list | None:
    """``counts`` (value -> how many) as a list indexed by value + ``shift``; None where a value is not a
    non-negative integer (or a huge one)."""
    if not counts:
        return []
    try:
        if not all(type(v) is int and 0 <= v <= HIST_MAX_TOKENS for v in counts):
            if not all(int(v) == v and 0 <= v <= HIST_MAX_TOKENS for v in counts):
                return None
        hist = [0] * (int(max(counts)) + 1 + shift)
        for value, count in counts.items():
            hist[int(value) + shift] += count
    except (TypeError, ValueError, OverflowError):
        return None
    return hist


def _sum(tensor) -> int:
    add = getattr(tensor, "sum", None)
    return int(add()) if add is not None else sum(_values(tensor))


def _values(tensor):
    """A host tensor's (or list's) elements as a list."""
    tolist = getattr(tensor, "tolist", None)
    return tolist() if tolist is not None else tensor


def _host_sum(tensors) -> int:
    """The sum of every element of host tensors: one concatenation and one sum for a batch of torch tensors."""
    if len(tensors) > 1:
        torch = sys.modules.get("torch")
        if torch is not None and all(isinstance(t, torch.Tensor) for t in tensors):
            try:  # SGLang's accept_lens are 1-D: concatenated as they are (a reshape each costs as much as the sum)
                return int(torch.cat(tensors).sum())
            except RuntimeError:  # 0-d or mixed dimensions
                return int(torch.cat([t.reshape(-1) for t in tensors]).sum())
    return sum(sum(_values(t)) for t in tensors)
