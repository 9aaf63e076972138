"""The acceptance per depth (schema 4): ``accept_hist`` (request-verifies by the tokens each emitted) counted over
the same request-verifies as ``tokens`` / ``decode_requests`` from SGLang's host copies (batched), v1's host lists
and host-memory accept_lens; null where the profiler stages its own sums; the speculative settings read from the
worker; ``accept_at_least`` and ``draft_step_ms`` in the record."""
from __future__ import annotations

import types
from collections import Counter

import pytest

from sglang_pcie.patches.eagle3_profile import payload as ep
from sglang_pcie.patches.eagle3_profile import tokens as tokens_module

from support.eagle_records import DeviceAcceptLens, GpuTimeline, HostCopy, Scheduler, Worker

PATTERN = ((1, 2, 3), (3, 3), (1,), (2, 2, 2, 3), (3, 1))  # tokens per request of consecutive decode cycles


class Varying(Worker):
    """The test worker (2 steps, topk 1, 3 draft tokens) whose decode cycles emit PATTERN in turn."""

    @property
    def accept(self):
        return PATTERN[(self.calls - 1) % len(PATTERN)]


@pytest.fixture
def profiler_factory():
    def make(**kwargs):
        profiler = ep.Profiler(**kwargs)
        ep.set_profiler(profiler)
        return profiler
    yield make
    ep.set_profiler(None)


def _expected(first_cycle, cycles, shift=0):
    counts = Counter(v + shift for index in range(first_cycle, first_cycle + cycles)
                     for v in PATTERN[index % len(PATTERN)])
    return [counts.get(n, 0) for n in range(max(4, max(counts) + 1))]


def _holds_invariants(record):
    hist = record["accept_hist"]
    assert sum(hist) == record["decode_requests"] and sum(n * c for n, c in enumerate(hist)) == record["tokens"]
    assert hist[0] == 0


def _run(profiler, worker, scheduler, cycles):
    clock = profiler._clock
    for _ in range(cycles):
        scheduler.step()
        clock.completed = clock.recorded
    profiler.flush()
    return list(profiler.records)


def test_sglangs_host_copies_counted_a_batch_at_a_time_over_several_intervals(profiler_factory, monkeypatch):
    """v2 on a GPU: the histogram comes from SGLang's host copies, one count per batch of TOKEN_BATCH copies (or per
    interval's run of them at an interval's end), never one per cycle; each interval's histogram adds up to its own
    tokens and request-verifies."""
    calls = []
    real = tokens_module.host_counts
    monkeypatch.setattr(tokens_module, "host_counts", lambda tensors: calls.append(len(tensors)) or real(tensors))
    profiler = profiler_factory(interval=300, clock=GpuTimeline(), sample_every=16, seed=2)
    worker = Varying()
    worker.result_lens = DeviceAcceptLens
    records = _run(profiler, worker, Scheduler(worker), 700)
    assert profiler.tokens.mode == "sglang"
    assert [r["decode_cycles"] for r in records] == [300, 300, 100] and all(r["accept_length_exact"] for r in records)
    for index, record in enumerate(records):
        _holds_invariants(record)
        assert record["accept_hist"] == _expected(300 * index, record["decode_cycles"])
        assert (record["spec_steps"], record["spec_topk"], record["spec_draft_tokens"]) == (2, 1, 3)
        assert len(record["accept_hist"]) == 3 + 1  # spec_draft_tokens + 1
    assert sum(calls) == 700 and max(calls) == ep.TOKEN_BATCH and len(calls) <= 700 // ep.TOKEN_BATCH + 2 * 3
    # request-verifies that accepted at least 1 and 2 drafts (emitted at least 2 and 3 tokens)
    hist = records[0]["accept_hist"]
    assert records[0]["accept_at_least"] == pytest.approx([(hist[2] + hist[3]) / sum(hist), hist[3] / sum(hist)])


def test_host_memory_accept_lens_and_a_value_past_the_draft_tokens(profiler_factory):
    """No CUDA (accept_lens in host memory): counted at once, with the histogram; a value above spec_draft_tokens
    (not a chain's) widens it to the largest value seen + 1 instead of dropping it."""
    profiler = profiler_factory(interval=50, clock=GpuTimeline(), sample_every=5, seed=3)
    worker = Varying()
    records = _run(profiler, worker, Scheduler(worker, copies=False), 120)
    assert [r["decode_cycles"] for r in records] == [50, 50, 20]
    for index, record in enumerate(records):
        _holds_invariants(record)
        assert record["accept_hist"] == _expected(50 * index, record["decode_cycles"])
    worker = type("Wide", (Worker,), {"accept": (1, 6)})()
    profiler = profiler_factory(interval=10, clock=GpuTimeline(), sample_every=5, seed=3)
    record, = _run(profiler, worker, Scheduler(worker, copies=False), 10)
    assert record["accept_hist"] == [0, 10, 0, 0, 0, 0, 10] and record["accept_at_least"] == [0.5] * 5


def test_without_sglangs_host_copy_the_histogram_is_null(profiler_factory):
    """Mode "own": the timed cycles stage their own sums on the stream; no per-request value is read, so there is no
    histogram (null, not a histogram of the wrong request-verifies)."""
    profiler = profiler_factory(interval=50, clock=GpuTimeline(), sample_every=5, seed=3)
    worker = Worker()
    worker.result_lens = type("Staged", (DeviceAcceptLens,), {"sum": lambda self: sum(list.__iter__(self))})
    records = _run(profiler, worker, Scheduler(worker, copies=False), 60)
    assert profiler.tokens.mode == "own" and records[0]["tokens"] > 0
    assert all(r["accept_hist"] is None and r["accept_at_least"] is None for r in records)
    assert records[0]["spec_draft_tokens"] == 3  # the settings still come from the worker
    assert "accept_hist=- spec=2/1/3" in ep.format_line(records[0])


def test_one_cycle_without_sglangs_copy_leaves_the_histogram_over_the_counted_request_verifies(profiler_factory):
    profiler = profiler_factory(interval=100, clock=GpuTimeline(), sample_every=4, seed=7)
    worker = Varying()
    worker.result_lens = DeviceAcceptLens
    scheduler = Scheduler(worker)
    clock = profiler._clock
    for step in range(200):
        scheduler.copies = step != 50
        scheduler.step()
        clock.completed = clock.recorded
    profiler.flush()
    first, second = list(profiler.records)
    assert not first["accept_length_exact"] and second["accept_length_exact"]
    _holds_invariants(first)
    _holds_invariants(second)
    assert sum(first["accept_hist"]) == first["requests_all"] - len(PATTERN[50 % len(PATTERN)])


@pytest.mark.parametrize("field", ["accept_length_per_req_cpu", "num_accepted_drafts_per_req_cpu",
                                   "num_correct_drafts_per_req_cpu"])
def test_v1_host_lists_give_accepted_drafts_plus_the_bonus_token(field):
    stats = ep.IntervalStats()
    counter = ep.TokenCounter()
    for drafts in ([1, 2, 0], [2, 2], [0]):
        counter.count(types.SimpleNamespace(**{field: drafts}), None, stats, None)
    stats.decode_cycles = 3
    record = stats.record(spec_steps=2, spec_topk=1, spec_draft_tokens=3)
    assert (record["decode_requests"], record["tokens"]) == (6, 13)
    assert record["accept_hist"] == [0, 2, 1, 3] and record["accept_at_least"] == pytest.approx([4 / 6, 3 / 6])
    _holds_invariants(record)


def test_host_counts_of_lists_and_of_what_has_no_histogram():
    assert ep.host_counts([HostCopy([2, 1, 3]), HostCopy([3, 3])]) == (12, [0, 1, 1, 3])
    assert ep.host_counts([HostCopy([])]) == (0, [])
    assert ep.host_counts([HostCopy([2, -1])]) == (1, None)  # a negative value: the sum, no histogram
    assert ep.host_counts([HostCopy([1.5, 2])]) == (3.5, None)
    only_sum = types.SimpleNamespace(sum=lambda: 5)  # an object that only sums (no elements to count)
    assert ep.host_counts([only_sum]) == (5, None)


def test_host_counts_of_torch_tensors_is_one_concatenation_sum_and_bincount():
    torch = pytest.importorskip("torch")
    copies = [torch.tensor(values, dtype=torch.int32) for values in ([2, 1, 3], [3, 3], [1])]
    assert ep.host_counts(copies) == (13, [0, 2, 1, 3])
    assert ep.host_counts([torch.tensor([2, -1])]) == (1, None)
    assert ep.host_counts([torch.tensor(3)]) == (3, None)  # 0-d
    assert ep.host_counts([torch.tensor([[1, 2], [3, 3]])]) == (9, None)  # not 1-D


def test_the_record_keys_from_the_settings_and_the_draft_phase():
    stats = ep.IntervalStats()
    for draft in (0.9, 1.2):
        stats.add_timed({"draft": draft, "verify": 3.0, "draft_extend": 0.3}, 5.0, 6.0)
    stats.decode_cycles = 2
    stats.add_tokens(4, 10, [0, 0, 2, 2])
    stats.add_tokens(2, 4, [0, 1, 0, 1])
    record = stats.record(spec_steps=3, spec_topk=1, spec_draft_tokens=4, run_id="r")
    assert record["schema"] == "sglang-pcie.eagle3-profile/4" == ep.SCHEMA
    assert record["accept_hist"] == [0, 1, 2, 3, 0]  # spec_draft_tokens + 1 entries
    assert record["accept_at_least"] == pytest.approx([5 / 6, 3 / 6, 0.0])
    assert record["draft_step_ms"] == pytest.approx(1.05 / 3)
    assert list(record).index("spec_steps") > list(record).index("accept_length_exact")
    unknown = stats.record()  # no settings: nulls, the histogram as counted
    assert (unknown["spec_steps"], unknown["spec_topk"], unknown["spec_draft_tokens"]) == (None, None, None)
    assert unknown["accept_hist"] == [0, 1, 2, 3] and unknown["draft_step_ms"] is None
    assert ep.IntervalStats().record()["accept_hist"] == [] and ep.IntervalStats().record()["accept_at_least"] is None
    assert ep.accept_at_least([0, 0, 0]) is None and ep.accept_at_least(None) is None
    assert ep.accept_at_least([0, 4]) == []  # one token per verify: no depth to accept at


def test_the_settings_come_from_server_args_else_the_workers_attributes():
    args = types.SimpleNamespace(speculative_num_steps=5, speculative_eagle_topk=1, speculative_num_draft_tokens=6)
    assert ep.spec_settings(types.SimpleNamespace(server_args=args)) == {
        "spec_steps": 5, "spec_topk": 1, "spec_draft_tokens": 6}
    own = types.SimpleNamespace(speculative_num_steps=3, topk=4, speculative_num_draft_tokens=8)
    assert ep.spec_settings(own) == {"spec_steps": 3, "spec_topk": 4, "spec_draft_tokens": 8}
    odd = types.SimpleNamespace(server_args=types.SimpleNamespace(speculative_num_steps=None), topk=True)
    assert ep.spec_settings(odd) == {"spec_steps": None, "spec_topk": None, "spec_draft_tokens": None}
