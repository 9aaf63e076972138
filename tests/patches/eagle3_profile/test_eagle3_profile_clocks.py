"""The clocks (sglang_pcie.patches.eagle3_profile.clocks) with the CUDA API faked.

Mutants of issue 10 caught here: marks on the default stream (test_cuda_marks_go_on_the_stream_current_at_each_mark),
the pinned accepted-token copy skipped (test_own_token_count_goes_through_the_pinned_copy)."""
from __future__ import annotations

import types

from sglang_pcie.patches.eagle3_profile import payload as ep


class FakeStream:
    def __init__(self, key):
        self.key = key


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.stream = None

    def record(self, stream=None):
        self.stream = stream if stream is not None else FAKE_CUDA.current


class FakeCuda:
    """torch.cuda's stream API as the clock uses it: a current stream that the test switches."""

    def __init__(self):
        self.default = FakeStream(0)
        self.current = self.default
        self.Event = FakeEvent

    def current_stream(self):
        return self.current

    def default_stream(self):
        return self.default

    def is_current_stream_capturing(self):
        return False


FAKE_CUDA = FakeCuda()


def fake_torch(zeros):
    c_api = types.SimpleNamespace(_cuda_getDevice=lambda: 0,
                                  _cuda_getCurrentStream=lambda device: FAKE_CUDA.current.key)
    return types.SimpleNamespace(cuda=FAKE_CUDA, _C=c_api, int64="int64", zeros=zeros)


def test_cuda_marks_go_on_the_stream_current_at_each_mark():
    """Mutant 'marks on the default stream': SGLang launches a cycle on its forward stream, so marks recorded on
    the default stream would time nothing of it."""
    clock = ep.CudaClock(fake_torch(lambda n, **kw: types.SimpleNamespace(unbind=lambda: [None] * n)), 4)
    marks = clock.new_marks(4)
    forward, side = FakeStream(7), FakeStream(9)
    FAKE_CUDA.current = forward
    clock.record(marks, 0)
    clock.record(marks, 1)
    FAKE_CUDA.current = side
    clock.record(marks, 2)
    FAKE_CUDA.current = FAKE_CUDA.default
    clock.record(marks, 3)
    assert [m.stream for m in marks] == [forward, forward, side, FAKE_CUDA.default]


# The pinned path needs torch's tensors: run in the real SGLang 0.5.23 install (torch CPU), CUDA API faked.
PINNED = r'''
import json, types, torch
from sglang_pcie.patches.eagle3_profile import payload as ep
class Device:  # accept_lens 'on the GPU': a real tensor the clock may only reduce and copy on the stream
    is_cuda = True
    def __init__(self, values):
        self.values = torch.tensor(values, dtype=torch.int32)
    def sum(self, dtype=None):
        return self.values.sum(dtype=dtype)
zeros = lambda n, dtype=None, pin_memory=False: torch.zeros(n, dtype=dtype)  # no CUDA here: pageable stands in
fake = types.SimpleNamespace(cuda=types.SimpleNamespace(), _C=types.SimpleNamespace(), int64=torch.int64, zeros=zeros)
clock = ep.CudaClock(fake, 3)
staged = [clock.stage_tokens(i, Device(v)) for i, v in enumerate([[2, 1, 3], [4, 4], [1]])]
print(json.dumps({"staged": staged, "read": [clock.read_tokens(i, s) for i, s in enumerate(staged)]}))
'''


def test_own_token_count_goes_through_the_pinned_copy(sglang_env):
    """Mutant 'pinned accepted-token copy skipped': the count would read the slot's stale zero."""
    out = sglang_env("0.5.23").run_json(PINNED)
    assert out == {"staged": [None, None, None], "read": [6, 8, 1]}



# SGLang's host copies of accept_lens are torch tensors: summed together with torch, in the real 0.5.23 install.
HOST_SUM = r'''
import json, torch
from sglang_pcie.patches.eagle3_profile.tokens import _host_sum
ones = [torch.tensor([2, 1, 3], dtype=torch.int32), torch.tensor([4], dtype=torch.int32)]
mixed = [torch.tensor(5, dtype=torch.int32), torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)]
print(json.dumps({"one_d": _host_sum(ones), "mixed": _host_sum(mixed), "single": _host_sum(ones[:1])}))
'''


def test_host_copies_summed_with_torch_whatever_their_shape(sglang_env):
    """1-D copies are concatenated as they are; a 0-d or 2-D one falls back to flattening each (mutant 'fallback
    dropped' raises, 'only the first copy summed' gives 6)."""
    assert sglang_env("0.5.23").run_json(HOST_SUM) == {"one_d": 10, "mixed": 15, "single": 6}
