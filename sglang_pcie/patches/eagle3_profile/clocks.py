"""The timers of a timed cycle: CUDA events on the current stream (``CudaClock``), or ``time.perf_counter`` where
there is no CUDA (``HostClock``: on an asynchronous device that times launches, not device work).

A clock records marks into a slot's list (``record``), says whether the device has passed one (``is_done``, never
waiting), waits for one (``wait``: only when a backlog forces it), and gives the time between two (``elapsed_ms``).
It also stages a timed cycle's accepted-token count where SGLang makes no host copy (``stage_tokens``)."""
from __future__ import annotations

import time


class HostClock:
    """``time.perf_counter`` marks: the host's view of the phases, where there is no CUDA."""

    name = "host"

    def new_marks(self, count):
        return [0.0] * count

    def capturing(self):
        return False

    def record(self, marks, index):
        marks[index] = time.perf_counter()

    def is_done(self, marks, index):
        return True

    def wait(self, marks, index):
        pass

    def elapsed_ms(self, marks, start, end):
        return (marks[end] - marks[start]) * 1e3

    def stage_tokens(self, slot_index, accept_lens):
        return int(accept_lens.sum())

    def read_tokens(self, slot_index, staged):
        return staged


class CudaClock:
    """CUDA events on the current stream; read only once the GPU has passed them (see the package docstring)."""

    name = "cuda"

    def __init__(self, torch, slots):
        self.torch = torch
        # Accepted-token sums of timed cycles where SGLang makes no host copy, copied here on the stream: readable
        # once the cycle's events are.  One 0-d view per slot, made once: indexing would build a tensor per cycle.
        self.pinned_tokens = torch.zeros(slots, dtype=torch.int64, pin_memory=True)
        self.pinned_slots = self.pinned_tokens.unbind()
        # torch.cuda.current_stream() (what Event.record() calls) runs ~15 Python calls to build a Stream; the current
        # (device, stream) from torch's C API is two calls.  The Stream is rebuilt only when that key changes, so
        # every mark is still recorded on the stream current at that moment.  Without those C functions: Event.record().
        get_device = getattr(torch._C, "_cuda_getDevice", None)
        get_stream = getattr(torch._C, "_cuda_getCurrentStream", None)
        self._stream_key_now = (lambda: get_stream(get_device())) if get_device and get_stream else None
        self._stream_key = self._stream = None

    def new_marks(self, count):
        return [self.torch.cuda.Event(enable_timing=True) for _ in range(count)]

    def capturing(self):
        return self.torch.cuda.is_current_stream_capturing()

    def record(self, marks, index):
        if self._stream_key_now is None:
            marks[index].record()
            return
        key = self._stream_key_now()
        if key != self._stream_key:
            self._stream = self.torch.cuda.current_stream()
            self._stream_key = key
        marks[index].record(self._stream)

    def is_done(self, marks, index):
        return marks[index].query()

    def wait(self, marks, index):
        marks[index].synchronize()

    def elapsed_ms(self, marks, start, end):
        return marks[start].elapsed_time(marks[end])

    def stage_tokens(self, slot_index, accept_lens):
        if not accept_lens.is_cuda:
            return int(accept_lens.sum())
        total = accept_lens.sum(dtype=self.torch.int64)
        self.pinned_slots[slot_index].copy_(total, non_blocking=True)
        return None  # read from pinned memory once the cycle's end event has completed

    def read_tokens(self, slot_index, staged):
        return int(self.pinned_slots[slot_index]) if staged is None else staged


def default_clock(slots):
    try:
        import torch
    except ImportError:
        return HostClock()
    if torch.cuda.is_available():
        return CudaClock(torch, slots)
    return HostClock()

