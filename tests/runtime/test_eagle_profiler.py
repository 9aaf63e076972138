"""The EAGLE profiler (runtime payload of eagle3-profile): its statistics, the profiler driven through wrap(), the
CUDA clock with the CUDA API faked, the exit flush and its settings.

The four mutants of issue 10 each fail a test here or in tests/patching/test_eagle3_profile.py: the CUDA-graph
capture guard dropped (test_nothing_is_recorded_while_a_cuda_graph_is_being_captured), marks on the default stream
(test_cuda_marks_go_on_the_stream_current_at_each_mark), the TP rank read as 0 (test_only_tp_rank0_reports,
test_ranks_other_than_tp0_record_nothing), the pinned accepted-token copy skipped
(test_own_token_count_goes_through_the_pinned_copy)."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import types

import pytest

from sglang_pcie.runtime import settings

from support.eagle_records import META, interval_stats

from sglang_pcie.runtime import eagle_profiler as ep
from sglang_pcie.tools import profile_report
from sglang_pcie.patching.engine import MARKER_ATTR
from sglang_pcie.patching.eagle3_profile import PATCH
from sglang_pcie.runtime.settings import load_settings

from support import REPO
RECORD_KEYS = {"schema", "time", "run_id", "run_started", "pid", "tp_rank", "pp_rank", "dp_rank", "worker", "timer",
               "interval", "partial", "decode_cycles", "prefill_cycles", "idle_cycles", "timed_cycles",
               "sample_every", "decode_requests", "requests_all", "tokens", "accept_length", "accept_length_exact",
               "phases_ms", "phases_sum_ms", "cycle_ms", "wall_cycle_ms", "wall_cycles", "gpu_busy", "bound",
               "prefill_ms", "wall_s", "tokens_per_s_served", "tokens_per_s_gpu", "tokens_per_s_per_request",
               "profiler_host_us_per_cycle", "profiler_host_share", "baseline_ms", "break_even_accept_length",
               "projected_speedup", "syncs", "unfinished_at_exit"}


# ------------------------------------------------------------------------------------- statistics (pure)


def test_interval_statistics_means_percentiles_shares_and_projection():
    stats = interval_stats([(1.0, 18.0, 0.5, 20.0), (1.0, 19.0, 0.5, 21.0), (2.0, 20.0, 0.0, 22.5)], decode_cycles=30)
    stats.add_prefill(50.0)
    stats.prefill_cycles = 1
    stats.host_ns = 31 * 5_000  # 5 us per cycle
    record = stats.record(baseline_ms=12.0, **META)
    phases = record["phases_ms"]
    assert phases["cycle"]["mean"] == pytest.approx(21.1666666) == record["cycle_ms"]
    assert phases["cycle"]["p50"] == 21.0 and phases["cycle"]["p90"] == pytest.approx(22.2)
    assert phases["verify"]["mean"] == 19.0 and phases["verify"]["share"] == pytest.approx(19.0 / 21.1666666)
    assert phases["other"]["mean"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)  # the cycle minus its phases
    assert sum(phases[p]["share"] for p in ("draft", "verify", "draft_extend", "other")) == pytest.approx(1.0)
    assert record["phases_sum_ms"] == pytest.approx(1.3333333 + 19.0 + 0.3333333)
    # counts over every decode cycle, times over the timed ones
    assert (record["decode_cycles"], record["timed_cycles"]) == (30, 3)
    assert record["accept_length"] == 2.0 and record["accept_length_exact"]  # 120 tokens, 60 request-cycles
    # served throughput from the wall time, next to what the GPU time implies
    assert record["wall_s"] == pytest.approx(0.75) and record["wall_cycle_ms"] == pytest.approx(25.0)
    assert record["tokens_per_s_served"] == pytest.approx(120 / 0.75)
    assert record["tokens_per_s_gpu"] == pytest.approx(120 / (30 * 21.1666666 / 1e3))
    assert record["gpu_busy"] == pytest.approx(21.1666666 / 25.0) and record["bound"] == "host-bound"
    assert record["tokens_per_s_per_request"] == pytest.approx(2.0 * 1e3 / 25.0)
    assert record["profiler_host_us_per_cycle"] == pytest.approx(5.0)
    assert record["profiler_host_share"] == pytest.approx(31 * 5_000 / 0.75e9)
    # break-even and speedup against the wall-clock cycle
    assert record["break_even_accept_length"] == pytest.approx(25.0 / 12.0)
    assert record["projected_speedup"] == pytest.approx(2.0 * 12.0 / 25.0)
    assert record["prefill_ms"] == {"mean": 50.0, "p50": 50.0, "p90": 50.0, "timed": 1}
    assert set(record) == RECORD_KEYS and record["schema"] == "sglang-pcie.eagle3-profile/2"
    assert json.loads(ep.to_json(record)) == record


def test_unknown_accept_counts_and_missing_baseline_give_nulls_not_errors():
    stats = ep.IntervalStats()
    stats.add_timed({"verify": 5.0}, 6.0)
    stats.decode_cycles = 1
    stats.add_tokens(None, None)
    record = stats.record()
    assert record["accept_length"] is None and not record["accept_length_exact"]
    assert record["tokens_per_s_served"] is None and record["tokens_per_s_gpu"] is None
    assert record["gpu_busy"] is None and record["bound"] is None
    assert record["break_even_accept_length"] is None and record["projected_speedup"] is None
    line = ep.format_line({**record, **META})
    assert "accept_len=n/a" in line and "baseline" not in line and "GPU busy n/a" in line


def test_json_is_strict_non_finite_numbers_become_null():
    stats = interval_stats([(1.0, 2.0, 0.5, 4.0)], decode_cycles=2)
    record = stats.record(baseline_ms=float("inf"), **META)
    text = ep.to_json({**record, "odd": [float("nan"), {"x": float("-inf")}]})
    assert "Infinity" not in text and "NaN" not in text
    parsed = json.loads(text)
    assert parsed["baseline_ms"] is None and parsed["odd"] == [None, {"x": None}]


def test_percentiles_stay_bounded_over_long_intervals():
    series = ep.Series(__import__("random").Random(1))
    for value in range(100_000):
        series.add(float(value % 1000))
    assert len(series.samples) == ep.RESERVOIR and series.count == 100_000
    assert series.mean == pytest.approx(499.5)
    assert 400 < series.quantile(0.5) < 600  # a uniform sample's median


# ------------------------------------------------------------------ the profiler, driven through wrap()


class Mode:
    """The slice of SGLang's ForwardMode the profiler reads (the runtime tests below use the real enum)."""

    def __init__(self, name):
        self.name = name

    def is_extend(self):
        return self.name == "extend"

    def is_idle(self):
        return self.name == "idle"


class GpuTimeline:
    """A clock whose marks complete only when the test says the 'GPU' got there: shows when the profiler reads."""

    name = "test"

    def __init__(self, capturing=False):
        self.now = 0.0
        self.completed = 0  # marks [0, completed) are done
        self.recorded = 0
        self.waits = 0
        self.is_capturing = capturing

    def new_marks(self, count):
        return [None] * count

    def capturing(self):
        return self.is_capturing

    def record(self, marks, index):
        assert not self.is_capturing, "an event recorded while a CUDA graph is being captured"
        self.now += 1.0
        marks[index] = (self.recorded, self.now)
        self.recorded += 1

    def is_done(self, marks, index):
        assert not self.is_capturing, "an event query while a CUDA graph is being captured"
        return marks[index][0] < self.completed

    def wait(self, marks, index):
        assert not self.is_capturing, "an event wait while a CUDA graph is being captured"
        self.waits += 1
        self.completed = max(self.completed, marks[index][0] + 1)

    def elapsed_ms(self, marks, start, end):
        assert self.is_done(marks, start) and self.is_done(marks, end), "read before the GPU got there"
        return marks[end][1] - marks[start][1]

    def stage_tokens(self, slot_index, accept_lens):
        return sum(accept_lens)

    def read_tokens(self, slot_index, staged):
        return staged


class AcceptLens(list):
    """accept_lens in host memory (as on a machine without CUDA): counted at once."""

    shape = property(lambda self: (len(self),))
    is_cuda = False

    def sum(self):
        return sum(self)


class DeviceAcceptLens(AcceptLens):
    """accept_lens 'on the GPU': the profiler must not read it on the host."""

    is_cuda = True

    def tolist(self):
        raise AssertionError("a device tensor read on the host")

    def sum(self):
        raise AssertionError("a device tensor read on the host")


class HostCopy(list):
    """What SGLang's copy_to_cpu puts in result.accept_lens: a host tensor."""

    is_cuda = False

    def tolist(self):
        return list(self)


class Worker:
    """A worker shaped like SGLang's (cycle calls draft, verify, re-extend); its methods wrapped by ep.wrap."""

    tp_rank = 0
    accept = (2, 1, 3)
    result_lens = AcceptLens

    def __init__(self):
        self.calls = 0

    def forward_batch_generation(self, batch):
        self.calls += 1
        if batch.forward_mode.is_extend():
            return types.SimpleNamespace()
        self.draft(batch)
        self.verify(batch)
        self.draft_extend(batch)
        return types.SimpleNamespace(accept_lens=self.result_lens(self.accept))

    def draft(self, batch):
        return "drafted"

    def verify(self, batch):
        return "verified"

    def draft_extend(self, batch):
        return "extended"


for _name, _phase in (("forward_batch_generation", "cycle"), ("draft", "draft"), ("verify", "verify"),
                      ("draft_extend", "draft_extend")):
    setattr(Worker, _name, ep.wrap(getattr(Worker, _name), _phase))


class Scheduler:
    """What SGLang's scheduler does with each result, in order: copy accept_lens to the host right after the
    forward (copy_to_cpu, with a copy_done event), and read it after the next forward."""

    def __init__(self, worker, copies=True):
        self.worker = worker
        self.copies = copies

    def step(self, mode="decode"):
        result = self.worker.forward_batch_generation(batch(mode))
        if self.copies and getattr(result, "accept_lens", None) is not None:
            result.accept_lens = HostCopy(result.accept_lens)
            result.copy_done = types.SimpleNamespace(query=lambda: True)
        return result


def batch(mode="decode"):
    return types.SimpleNamespace(forward_mode=Mode(mode), is_extend_in_batch=False)


@pytest.fixture
def profiler_factory():
    def make(**kwargs):
        kwargs.setdefault("sample_every", 1)
        profiler = ep.Profiler(**kwargs)
        ep.set_profiler(profiler)
        return profiler
    yield make
    ep.set_profiler(None)


def test_cycles_are_read_only_once_the_gpu_passed_them(profiler_factory):
    clock = GpuTimeline()
    profiler = profiler_factory(interval=10, clock=clock, drain_batch=4, drain_lag=2, read_per_call=2)
    worker = Worker()
    for _ in range(5):
        worker.forward_batch_generation(batch())
    assert profiler.stats.decode_cycles == 5 and profiler.stats.series["cycle"].count == 0  # counted, none read
    clock.completed = clock.recorded  # the GPU catches up with cycles 1-5
    worker.forward_batch_generation(batch())
    assert profiler.stats.series["cycle"].count == 2 and clock.waits == 0  # a few per call, not the 4 it could
    worker.forward_batch_generation(batch())
    assert profiler.stats.series["cycle"].count == 4 and clock.waits == 0
    worker.forward_batch_generation(batch())
    assert profiler.stats.series["cycle"].count == 5 and clock.waits == 0  # cycle 6 is not finished: left unread
    # a GPU far behind: once batch 4 + lag 2 timed cycles are unread, the reader waits once for the batch's newest
    for _ in range(3):
        worker.forward_batch_generation(batch())
    assert clock.waits == 1 and len(profiler._pending) == 2
    assert not profiler.records  # the interval (10 cycles) is complete in count; cycle 10 is still unread
    clock.completed = clock.recorded
    worker.forward_batch_generation(batch())
    assert profiler.records[-1]["syncs"] == 1 and profiler.records[-1]["decode_cycles"] == 10
    assert profiler.records[-1]["timed_cycles"] == 10  # reported once every timed cycle of it was read
    assert profiler.stats.decode_cycles == 2


def test_read_per_call_zero_reads_only_in_batches(profiler_factory):
    clock = GpuTimeline()
    profiler = profiler_factory(interval=8, clock=clock, drain_batch=4, drain_lag=2, read_per_call=0)
    worker = Worker()
    for _ in range(5):
        worker.forward_batch_generation(batch())
        clock.completed = clock.recorded
    assert profiler.stats.series["cycle"].count == 0
    worker.forward_batch_generation(batch())
    assert profiler.stats.series["cycle"].count == 4 and clock.waits == 0  # the 4 oldest, finished: no wait


def test_phase_times_tokens_and_kinds_of_cycles(profiler_factory, tmp_path):
    out = tmp_path / "profile.jsonl"
    clock = GpuTimeline()
    profiler = profiler_factory(interval=3, clock=clock, path=str(out), baseline_ms=4.0)
    worker = Worker()
    for mode in ("extend", "decode", "idle", "decode", "decode", "decode"):
        worker.forward_batch_generation(batch(mode))
    clock.completed = clock.recorded
    assert profiler.flush()["decode_cycles"] == 1
    first, partial = profiler.records
    # marks 1 apart: each phase spans 1, the cycle spans 7 (start, 3 x (start, end), end): other = 4
    assert first["phases_ms"]["draft"]["mean"] == 1.0 and first["phases_ms"]["cycle"]["mean"] == 7.0
    assert first["phases_ms"]["other"]["mean"] == 4.0 and first["phases_sum_ms"] == 3.0
    assert (first["decode_cycles"], first["prefill_cycles"], first["idle_cycles"]) == (3, 1, 1)
    assert first["prefill_ms"]["mean"] == 1.0  # the prefill cycle: no phases timed inside it
    assert first["tokens"] == 18 and first["decode_requests"] == 9 and first["accept_length"] == 2.0
    assert first["accept_length_exact"] and not first["partial"] and partial["partial"]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["decode_cycles"] for line in lines] == [3, 1]
    assert all(line["schema"] == ep.SCHEMA and set(line) == RECORD_KEYS for line in lines)
    assert lines[0]["run_id"] == lines[1]["run_id"] == ep.run_identity()[0]
    assert lines[0]["run_id"].endswith(f"-{os.getpid()}") and lines[0]["tp_rank"] == 0
    assert worker.calls == 6


def test_sampled_timers_exact_counts(profiler_factory):
    """1 cycle in 4 timed (random gaps averaging 4), every cycle counted; the tokens come from SGLang's host
    copy of accept_lens, read two cycles later: no device tensor is ever read on the host."""
    clock = GpuTimeline()
    profiler = profiler_factory(interval=400, clock=clock, sample_every=4, seed=7)
    worker = Worker()
    worker.result_lens = DeviceAcceptLens
    scheduler = Scheduler(worker)
    for _ in range(400):
        scheduler.step()
        clock.completed = clock.recorded
    for _ in range(ep.DRAIN_LAG):  # the interval is reported once its last timed cycle and tokens are read
        scheduler.step("extend")
    record = profiler.records[-1]
    assert record["decode_cycles"] == 400 and 70 < record["timed_cycles"] < 130  # about 1 in 4
    assert record["timed_cycles"] == clock.recorded // 8  # 8 marks per timed cycle: the others recorded none
    assert record["tokens"] == 6 * 400 and record["decode_requests"] == 3 * 400
    assert record["accept_length"] == 2.0 and record["accept_length_exact"]
    assert record["phases_ms"]["cycle"]["mean"] == 7.0 and record["sample_every"] == 4
    assert profiler._token_mode == "sglang"


def test_one_cycle_without_sglangs_host_copy_leaves_later_intervals_exact(profiler_factory):
    clock = GpuTimeline()
    profiler = profiler_factory(interval=100, clock=clock, sample_every=4, seed=7)
    worker = Worker()
    worker.result_lens = DeviceAcceptLens
    scheduler = Scheduler(worker)
    for step in range(300):
        scheduler.copies = step != 50  # one cycle of the first interval goes without SGLang's copy
        scheduler.step()
        clock.completed = clock.recorded
    for _ in range(ep.DRAIN_LAG):
        scheduler.step("extend")
    first, second, third = list(profiler.records)[:3]
    assert profiler._token_mode == "sglang"
    assert not first["accept_length_exact"] and first["accept_length"] == 2.0  # estimated from the other 99
    assert second["accept_length_exact"] and third["accept_length_exact"]
    assert second["tokens"] == 6 * 100 and third["tokens"] == 6 * 100


def test_without_sglangs_host_copy_timed_cycles_count_their_own_tokens(profiler_factory):
    clock = GpuTimeline()
    profiler = profiler_factory(interval=50, clock=clock, sample_every=5, seed=3)
    worker = Worker()
    worker.result_lens = type("Staged", (DeviceAcceptLens,), {"sum": lambda self: sum(list.__iter__(self))})
    scheduler = Scheduler(worker, copies=False)
    for _ in range(60):
        scheduler.step()
        clock.completed = clock.recorded
    profiler.flush()
    record = profiler.records[0]
    assert profiler._token_mode == "own"
    assert not record["accept_length_exact"] and record["accept_length"] == 2.0
    assert record["decode_requests"] == 3 * (record["timed_cycles"] - (1 if record["timed_cycles"] else 0)) or \
        record["decode_requests"] <= 3 * record["timed_cycles"]
    assert record["requests_all"] == 3 * 50
    # served tokens: the (timed) accept length times every decode cycle's requests
    assert record["tokens_per_s_served"] == pytest.approx(2.0 * 150 / record["wall_s"])


def test_wall_time_tiles_back_to_back_intervals(profiler_factory, monkeypatch):
    """Each decode cycle takes 1 ms in the worker and the scheduler 0.5 ms between cycles: an interval's wall time
    runs to the start of the cycle after its last one, so back-to-back intervals tile the time."""
    now = [0]
    monkeypatch.setattr(ep, "_now", lambda: now[0])

    class Timed(Worker):
        def forward_batch_generation(self, batch):
            now[0] += 1_000_000
            return super().forward_batch_generation(batch)

    Timed.forward_batch_generation = ep.wrap(Timed.forward_batch_generation, "cycle")
    profiler = profiler_factory(interval=3, clock=GpuTimeline())
    worker = Timed()
    for _ in range(7):
        worker.forward_batch_generation(batch())
        profiler._clock.completed = profiler._clock.recorded
        now[0] += 500_000
    profiler.flush()
    assert [r["decode_cycles"] for r in profiler.records] == [3, 3, 1]
    assert [r["wall_s"] for r in profiler.records] == [pytest.approx(0.0045), pytest.approx(0.0045),
                                                       pytest.approx(0.001)]  # the last: flushed, no next cycle
    assert all(r["wall_cycle_ms"] == pytest.approx(1.5) for r in profiler.records)
    assert profiler.records[0]["tokens_per_s_served"] == pytest.approx(18 / 0.0045)


@pytest.mark.parametrize("field", ["accept_length_per_req_cpu", "num_accepted_drafts_per_req_cpu",
                                   "num_correct_drafts_per_req_cpu"])  # 0.5.8-0.5.10, 0.5.11, 0.5.12(.post1)
def test_v1_accepted_drafts_are_counted_under_each_releases_field_name(field):
    # v1 gives accepted drafts per request as a host list; each request also emits one bonus token.
    stats = ep.IntervalStats()
    ep.Profiler(sample_every=None)._count_tokens(types.SimpleNamespace(**{field: [1, 2, 0]}), None, stats)
    assert (stats.requests_all, stats.requests, stats.tokens) == (3, 3, 6)


def test_sample_every_adapts_to_the_host_budget():
    profiler = ep.Profiler(sample_every=None)
    assert profiler.sample_every == ep.SAMPLE_START
    stats = interval_stats([(1.0, 2.0, 0.5, 4.0)] * 10, decode_cycles=200, wall_cycle_ms=5.0)
    stats.host_ns, stats.host_timed_ns = 200 * 2_000 + 10 * 80_000, 10 * 80_000  # 2 us a cycle, 80 us a timed one
    profiler._adapt(stats)
    # budget 0.2% of 5 ms = 10 us; 8 us spare for the timed cycles: 80 / 8 = 1 in 10
    assert profiler.sample_every == 10
    stats.host_ns = 200 * 20_000 + 10 * 80_000  # a host slower than the whole budget: the least sampling
    profiler._adapt(stats)
    assert profiler.sample_every == ep.SAMPLE_MAX
    fixed = ep.Profiler(sample_every=3)
    fixed._adapt(stats)
    assert fixed.sample_every == 3


def test_nothing_is_recorded_while_a_cuda_graph_is_being_captured(profiler_factory):
    """Mutant 'capture guard dropped': an event recorded during capture would break SGLang's graph."""
    clock = GpuTimeline(capturing=True)
    profiler = profiler_factory(interval=5, clock=clock)
    worker = Worker()
    for _ in range(3):
        worker.forward_batch_generation(batch())
    assert clock.recorded == 0 and not profiler._pending and profiler._current is None
    assert worker.calls == 3 and profiler.active
    # timed cycles waiting to be read when a capture starts: not read (no event query) until it ends
    clock.is_capturing = False
    for _ in range(3):
        worker.forward_batch_generation(batch())
    clock.completed = clock.recorded
    clock.is_capturing = True
    for _ in range(6):
        worker.forward_batch_generation(batch())
    assert profiler.active and len(profiler._pending) == 3
    clock.is_capturing = False
    profiler.flush()
    assert profiler.active and sum(r["timed_cycles"] for r in profiler.records) == 3
    assert sum(r["decode_cycles"] for r in profiler.records) == 12


def test_an_exception_in_the_worker_passes_through_and_profiling_goes_on(profiler_factory):
    profiler = profiler_factory(interval=1, clock=GpuTimeline(), drain_lag=0)

    class Failing(Worker):
        def forward_batch_generation(self, batch):  # not wrapped: the subclass's own, calling the wrapped base
            if batch.forward_mode.name == "boom":
                raise KeyError("boom")
            return super().forward_batch_generation(batch)

    Failing.forward_batch_generation = ep.wrap(Failing.forward_batch_generation, "cycle")
    worker = Failing()
    with pytest.raises(KeyError):
        worker.forward_batch_generation(batch("boom"))
    worker.forward_batch_generation(batch())  # nested cycle (subclass -> base): timed once
    profiler._clock.completed = profiler._clock.recorded
    profiler.flush()
    assert profiler.active and [r["decode_cycles"] for r in profiler.records] == [1]
    assert len(profiler._free) == len(profiler._slots)  # every slot back in the ring


def test_memory_stays_bounded_over_many_intervals(profiler_factory):
    clock = GpuTimeline()
    profiler = profiler_factory(interval=50, clock=clock)
    worker = Worker()
    for _ in range(5000):
        worker.forward_batch_generation(batch())
        clock.completed = clock.recorded
    assert len(profiler._slots) == profiler.drain_batch + profiler.drain_lag + 1
    assert len(profiler.records) <= 16 and profiler.stats.decode_cycles < 50 and len(profiler._closing) <= 1
    assert sum(len(s.samples) for s in profiler.stats.series.values()) < 5 * 50


def test_ranks_other_than_tp0_record_nothing(profiler_factory, tmp_path, caplog):
    out = tmp_path / "rank1.jsonl"
    profiler = profiler_factory(interval=1, clock=GpuTimeline(), path=str(out))
    worker = Worker()
    worker.tp_rank = 1
    with caplog.at_level(logging.INFO):
        for _ in range(10):
            assert worker.forward_batch_generation(batch()).accept_lens == [2, 1, 3]
    assert not profiler.active and profiler.flush() is None
    assert not out.exists() and not profiler.records and not caplog.records


@pytest.mark.parametrize("holder, expected", [
    (types.SimpleNamespace(tp_rank=1, pp_rank=0, dp_rank=2), {"tp_rank": 1, "pp_rank": 0, "dp_rank": 2}),
    (types.SimpleNamespace(ps=types.SimpleNamespace(tp_rank=3, pp_rank=1, dp_rank=None)),  # 0.5.16's ParallelState
     {"tp_rank": 3, "pp_rank": 1, "dp_rank": None}),
    (types.SimpleNamespace(tp_rank=0, _target_worker=types.SimpleNamespace(pp_rank=2, dp_rank=1)),
     {"tp_rank": 0, "pp_rank": 2, "dp_rank": 1}),
    (types.SimpleNamespace(tp_rank=True), {"tp_rank": None, "pp_rank": None, "dp_rank": None}),
])
def test_worker_ranks_from_the_worker_its_parallel_state_or_target_worker(holder, expected):
    assert ep.worker_ranks(holder) == expected


def test_interval_line_goes_to_the_worker_modules_logger(profiler_factory, caplog):
    profiler_factory(interval=2, clock=GpuTimeline(), drain_lag=0)
    worker = Worker()
    with caplog.at_level(logging.INFO):
        worker.forward_batch_generation(batch())
        ep._PROFILER._clock.completed = ep._PROFILER._clock.recorded
        worker.forward_batch_generation(batch())
        ep._PROFILER._clock.completed = ep._PROFILER._clock.recorded
        ep._PROFILER.flush()
    lines = [r for r in caplog.records if ep.LOG_PREFIX in r.getMessage()]
    assert len(lines) == 1 and lines[0].name == __name__ and lines[0].levelno == logging.INFO
    message = lines[0].getMessage()
    parsed = profile_report.parse_log_line(message)
    record = ep._PROFILER.records[-1]
    assert parsed["decode_cycles"] == 2 and parsed["run_id"] == record["run_id"] and parsed["tp_rank"] == 0
    assert "GPU busy" in message and "served_tokens/s=" in message and "profiler host=" in message


def test_wrap_refuses_an_unknown_phase_and_marks_what_it_makes():
    with pytest.raises(ValueError, match="'drafting'"):
        ep.wrap(lambda self: None, "drafting")
    wrapped = ep.wrap(Worker.__dict__["draft"].__wrapped__, "draft")
    assert getattr(wrapped, MARKER_ATTR) == "eagle3-profile" and wrapped.sglang_pcie_phase == "draft"


# --------------------------------------------------------------------- CUDA clock (the CUDA API faked)


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
from sglang_pcie.runtime import eagle_profiler as ep
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


# ----------------------------------------------------------------------------------------- exit flush

EXIT = r'''
import os, signal, sys, types
sys.path.insert(0, {repo!r})
from sglang_pcie.runtime import eagle_profiler as ep
class Mode:
    def is_extend(self): return False
    def is_idle(self): return False
class Worker:
    tp_rank = 0
    def forward_batch_generation(self, batch):
        return types.SimpleNamespace(accept_lens=types.SimpleNamespace(shape=(2,), is_cuda=False, sum=lambda: 5))
Worker.forward_batch_generation = ep.wrap(Worker.forward_batch_generation, "cycle")
def run(cycles):
    worker = Worker()
    for _ in range(cycles):
        worker.forward_batch_generation(types.SimpleNamespace(forward_mode=Mode(), is_extend_in_batch=False))
def child():  # a spawned child, as SGLang's schedulers are, stopped by Ctrl-C
    run(7)
    raise KeyboardInterrupt
if __name__ == "__main__":
    how = sys.argv[1]
    if how == "child":
        import multiprocessing as mp
        mp.set_start_method("spawn")
        process = mp.Process(target=child)
        process.start()
        process.join()
        sys.exit(process.exitcode)
    if how == "sigterm-handled":  # a handler of the program's own, set before the profiler's: still called after
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
    run(7)
    if how.startswith("sigterm"):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    elif how == "os._exit":
        os._exit(3)
'''


@pytest.mark.parametrize("how, returncode, flushed", [
    ("normal", 0, True), ("sigterm", -signal.SIGTERM, True), ("sigterm-handled", 7, True), ("child", 1, True),
    ("os._exit", 3, False)])
def test_the_partial_interval_is_flushed_at_exit(tmp_path, how, returncode, flushed):
    out = tmp_path / "profile.jsonl"
    script = tmp_path / "run.py"
    script.write_text(EXIT.format(repo=str(REPO)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_", "SGLANG_PCIE_"))}
    env.update({"EAGLE3_PROFILE": "1", "EAGLE3_PROFILE_INTERVAL": "5", "EAGLE3_PROFILE_FILE": str(out)})
    proc = subprocess.run([sys.executable, str(script), how], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == returncode, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if flushed:
        assert [(r["decode_cycles"], r["partial"]) for r in records] == [(5, False), (2, True)]
    else:  # os._exit runs no Python at all: the partial interval (and maybe the first, if unread) is lost
        assert [(r["decode_cycles"], r["partial"]) for r in records] in ([], [(5, False)])
    assert all(r["tokens"] == 5 * r["decode_cycles"] for r in records)


# ----------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize("environ, reason", [
    ({}, "EAGLE3_PROFILE is not set to 1"),
    ({"EAGLE3_PROFILE": "0"}, "EAGLE3_PROFILE is not set to 1"),
    ({"EAGLE3_PROFILE": "maybe"}, "EAGLE3_PROFILE is not set to 1"),
    ({"EAGLE3_PROFILE": "1", "SGLANG_PCIE_DISABLE_PATCHES": "eagle3-profile"}, "SGLANG_PCIE_DISABLE_PATCHES"),
    ({"EAGLE3_PROFILE": "1", "SGLANG_PCIE_DISABLE": "1"}, "SGLANG_PCIE_DISABLE"),
    ({"EAGLE3_PROFILE": "1"}, None),
])
def test_disabled_reason(environ, reason):
    got = PATCH.disabled_reason(load_settings(environ))
    assert got == reason if reason is None else reason in got


def test_invalid_profile_value_is_named_in_the_settings_errors():
    settings = load_settings({"EAGLE3_PROFILE": "maybe"})
    assert any("EAGLE3_PROFILE='maybe'" in e for e in settings.errors)


def test_diff_decorator_is_identity_when_profiling_is_off(monkeypatch):
    monkeypatch.delenv("EAGLE3_PROFILE", raising=False)

    def method(self):
        return 1

    assert ep.profile_phase("draft")(method) is method
    monkeypatch.setenv("EAGLE3_PROFILE", "1")
    monkeypatch.setattr(settings, "_PROCESS_SETTINGS", None)  # another process: it reads its own environment
    assert ep.profile_phase("draft")(method).__wrapped__ is method


def test_the_overhead_benchmark_dry_run_still_runs(tmp_path):
    """benchmarks/eagle3_profile_overhead.py on the host only: its logic and the token invariants (no GPU)."""
    out = tmp_path / "overhead.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "eagle3_profile_overhead.py"), "--dry-run",
                           "--cycles", "40", "--warmup", "5", "--repeats", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["modes"]) == {"off", "eagle3-profile", "eagle3-profile-every-cycle", "host-synchronised"}
    checks = {c["name"]: c["ok"] for c in report["invariants"]}
    assert checks["eagle3-profile: accept length exact (scheduler host copy)"] is True
    assert checks["eagle3-profile-every-cycle: accept length sampled (own pinned copy)"] is True
    assert all(ok is not False for ok in checks.values()), checks
