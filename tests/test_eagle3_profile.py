"""eagle3-profile: the per-phase timers, their statistics and outputs, the report, the patch against the pristine
sources of every covered release, and the real SGLang 0.5.9 (v1 and v2 workers) and 0.5.23 (v2) with the overlay
installed: wrapped only when EAGLE3_PROFILE=1, the release's own methods otherwise.

The four mutants of issue 10 each fail a test here: the CUDA-graph capture guard dropped
(test_nothing_is_recorded_while_a_cuda_graph_is_being_captured), marks on the default stream
(test_cuda_marks_go_on_the_stream_current_at_each_mark), the TP rank read as 0
(test_the_tp_rank_of_a_real_0_5_23_worker_comes_from_sglangs_runtime_context, test_only_tp_rank0_reports,
test_ranks_other_than_tp0_record_nothing), the pinned accepted-token copy skipped
(test_own_token_count_goes_through_the_pinned_copy)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from sglang_pcie import eagle_profiler as ep
from sglang_pcie import profile_report
from sglang_pcie.base import APPLICABLE, APPLIED, DRIFTED, MARKER_ATTR, NOT_APPLICABLE, Result, SourceTree
from sglang_pcie.diffgen import diff_for
from sglang_pcie.patches.eagle3_profile import PATCH, SPEC_INFO, TARGETS, V1, V2
from sglang_pcie.releases import COVERED_RELEASES
from sglang_pcie.settings import load_settings

REPO = Path(__file__).resolve().parent.parent
RECORD_KEYS = {"schema", "time", "run_id", "run_started", "pid", "tp_rank", "pp_rank", "dp_rank", "worker", "timer",
               "interval", "partial", "decode_cycles", "prefill_cycles", "idle_cycles", "timed_cycles",
               "sample_every", "decode_requests", "requests_all", "tokens", "accept_length", "accept_length_exact",
               "phases_ms", "phases_sum_ms", "cycle_ms", "wall_cycle_ms", "wall_cycles", "gpu_busy", "bound",
               "prefill_ms", "wall_s", "tokens_per_s_served", "tokens_per_s_gpu", "tokens_per_s_per_request",
               "profiler_host_us_per_cycle", "profiler_host_share", "baseline_ms", "break_even_accept_length",
               "projected_speedup", "syncs", "unfinished_at_exit"}
META = {"run_id": "20261130T100000Z-42", "run_started": 1796032800.0, "pid": 42, "tp_rank": 0, "pp_rank": 0,
        "dp_rank": None, "worker": "EAGLEWorkerV2", "timer": "cuda", "interval": 200}


# ------------------------------------------------------------------------------------- statistics (pure)


def _stats(timed, decode_cycles, batch_size=2, tokens=4, wall_cycle_ms=25.0):
    """An interval with ``decode_cycles`` counted (tokens known for each) and the ``timed`` (draft, verify,
    draft_extend, cycle) ms samples."""
    stats = ep.IntervalStats()
    for draft, verify, extend, cycle in timed:
        stats.add_timed({"draft": draft, "verify": verify, "draft_extend": extend}, cycle)
    for _ in range(decode_cycles):
        stats.decode_cycles += 1
        stats.requests_all += batch_size
        stats.add_tokens(batch_size, tokens)
    stats.wall_start, stats.wall_end = 0, int(decode_cycles * wall_cycle_ms * 1e6)
    stats.wall_cycle_ns, stats.wall_cycles = int((decode_cycles - 1) * wall_cycle_ms * 1e6), decode_cycles - 1
    return stats


def test_interval_statistics_means_percentiles_shares_and_projection():
    stats = _stats([(1.0, 18.0, 0.5, 20.0), (1.0, 19.0, 0.5, 21.0), (2.0, 20.0, 0.0, 22.5)], decode_cycles=30)
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
    stats = _stats([(1.0, 2.0, 0.5, 4.0)], decode_cycles=2)
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
    stats = _stats([(1.0, 2.0, 0.5, 4.0)] * 10, decode_cycles=200, wall_cycle_ms=5.0)
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
from sglang_pcie import eagle_profiler as ep
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
from sglang_pcie import eagle_profiler as ep
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
    assert ep.profile_phase("draft")(method).__wrapped__ is method


# ------------------------------------------------------------------------------------------- report


def _write_run(path, records):
    path.write_text("".join(ep.to_json(r) + "\n" for r in records))


def _interval(cycle, verify, accept, cycles, baseline=None, run="20261130T100000Z-42", started=1796032800.0,
              timed=None, wall_cycle_ms=None):
    timed = cycles if timed is None else timed
    stats = _stats([(1.0, verify, 0.25, cycle)] * timed, decode_cycles=cycles, batch_size=1, tokens=accept,
                   wall_cycle_ms=wall_cycle_ms or cycle * 1.25)
    return stats.record(baseline_ms=baseline, **{**META, "run_id": run, "run_started": started})


def test_report_from_json_lines(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    _write_run(run, [_interval(20.0, 18.0, 2, 100, baseline=12.0, timed=10, wall_cycle_ms=25.0),
                     _interval(24.0, 22.0, 1, 300, baseline=12.0, timed=30, wall_cycle_ms=25.0)])
    assert profile_report.main([str(run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["decode_cycles"] == 400 and summary["intervals"] == 2 and summary["timed_cycles"] == 40
    assert summary["phases_ms"]["cycle"]["mean"] == pytest.approx(23.0)  # weighted by timed cycles
    assert summary["accept_length"] == pytest.approx(500 / 400) and summary["accept_length_exact"]
    assert summary["wall_cycle_ms"] == pytest.approx(25.0) and summary["gpu_busy"] == pytest.approx(23.0 / 25.0)
    assert summary["tokens_per_s_served"] == pytest.approx(500 / (400 * 0.025))
    assert summary["phases_sum_ms"] <= summary["cycle_ms"] <= summary["wall_cycle_ms"]
    assert summary["break_even_accept_length"] == pytest.approx(25.0 / 12.0)
    assert summary["projected_speedup"] == pytest.approx(1.25 * 12.0 / 25.0)
    assert summary["run_id"] == "20261130T100000Z-42" and summary["ranks"]["tp_rank"] == [0]
    assert profile_report.main([str(run), "--baseline-ms", "20"]) == 0
    table = capsys.readouterr().out
    assert "verify" in table and "break-even accept length 1.25" in table
    assert "speedup over the baseline: 1.00x" in table
    assert "GPU busy 92%: GPU-bound" in table and "tokens/s served (wall time): 50.0" in table


def test_report_separates_runs_newest_by_default(tmp_path, capsys):
    path = tmp_path / "appended.jsonl"
    old = [_interval(20.0, 18.0, 2, 100, run="20261129T080000Z-7", started=1795939200.0)] * 2
    new = [_interval(30.0, 28.0, 3, 50, run="20261130T090000Z-9", started=1796029200.0)]
    other_rank = [_interval(40.0, 38.0, 1, 10, run="20261130T085959Z-8", started=1796029199.0)]
    _write_run(path, new + old + other_rank)  # file order is not age order
    assert profile_report.main([str(path), "--json"]) == 0
    newest = json.loads(capsys.readouterr().out)
    assert newest["run_id"] == "20261130T090000Z-9" and newest["decode_cycles"] == 50
    assert profile_report.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert "newest of 3 runs" in text and "20261129T080000Z-7" in text
    assert profile_report.main([str(path), "--run", "20261129T080000Z-7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decode_cycles"] == 200
    assert profile_report.main([str(path), "--all", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["run_id"] for r in runs] == ["20261129T080000Z-7", "20261130T085959Z-8", "20261130T090000Z-9"]
    assert profile_report.main([str(path), "--run", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_report_from_a_server_log_matches_the_json_lines(tmp_path, capsys):
    records = [_interval(19.85, 18.67, 2, 200, baseline=13.0, timed=13), _interval(20.0, 18.8, 1, 200, baseline=13.0)]
    log = tmp_path / "server.log"
    log.write_text("[2026-01-01 10:00:00 TP0] Decode batch. #running-req: 1\n"
                   + "".join(f"[2026-01-01 10:00:0{i} TP0] {ep.format_line(r)}\n" for i, r in enumerate(records))
                   + f"[2026-01-01 10:00:09 TP0] {ep.LOG_PREFIX}: Prometheus export off: ImportError: x\n")
    jsonl = tmp_path / "run.jsonl"
    _write_run(jsonl, records)
    skipped = []
    from_log = profile_report.summarise(profile_report.read_records(log.read_text().splitlines(), skipped))
    from_json = profile_report.summarise(profile_report.read_records(jsonl.read_text().splitlines()))
    assert skipped == []  # the warning line is not a record, and not malformed either
    for key in ("decode_cycles", "timed_cycles", "tokens", "decode_requests", "baseline_ms", "run_id"):
        assert from_log[key] == from_json[key], key
    for key in ("tokens_per_s_served", "wall_cycle_ms", "gpu_busy", "projected_speedup"):
        assert from_log[key] == pytest.approx(from_json[key], rel=2e-3), key
    for name in ep.REPORTED:
        assert from_log["phases_ms"][name]["mean"] == pytest.approx(from_json["phases_ms"][name]["mean"], abs=1e-3)


def test_report_reads_schema_1_records_and_log_lines(tmp_path, capsys):
    v1 = {"schema": "sglang-pcie.eagle3-profile/1", "time": 1.0, "pid": 5, "tp_rank": 0, "worker": "EAGLEWorker",
          "timer": "cuda", "interval": 200, "decode_cycles": 200, "prefill_cycles": 3, "idle_cycles": 0,
          "decode_requests": 200, "tokens": 346, "accept_length": 1.73,
          "phases_ms": {n: {"mean": m, "p50": m, "p90": m, "share": None} for n, m in
                        (("draft", 0.89), ("verify", 18.67), ("draft_extend", 0.28), ("other", 0.01),
                         ("cycle", 19.85))},
          "prefill_ms": None, "tokens_per_s": 87.2, "tokens_per_s_per_request": 87.2, "wall_s": 4.0,
          "baseline_ms": None, "break_even_accept_length": None, "projected_speedup": None, "syncs": 0}
    means = (("draft", 0.89), ("verify", 18.67), ("draft_extend", 0.28), ("other", 0.01), ("cycle", 19.85))
    line = ("sglang-pcie eagle3-profile [timer=cuda syncs=0]: decode_cycles=200 prefill_cycles=3 idle_cycles=0 | "
            + " | ".join(f"{n} mean={m:.3f} p50={m:.3f} p90={m:.3f} ms share=n/a" for n, m in means)
            + " | accept_len=1.73 tokens=346 | tokens/s=87.2 per_request=87.2")
    path = tmp_path / "old.txt"
    path.write_text(json.dumps(v1) + "\n" + line + "\n")
    assert profile_report.main([str(path), "--all", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["run_id"], r["decode_cycles"], r["timed_cycles"]) for r in runs] == [("pid-5", 200, 200),
                                                                                     ("log", 200, 200)]
    assert all(r["accept_length"] == pytest.approx(1.73) for r in runs)


MALFORMED = [
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": 5}', "no phases_ms.cycle"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "phases_ms": {"cycle": {"mean": 1}}}', "no decode_cycles"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": "many", "phases_ms": {"cycle": {}}}',
     "decode_cycles='many' is not a number"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": 5, "phases_ms": {"cycle": {"mean": "x"}}}',
     "mean='x' is not a number"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": 5, "phases_ms": {"cycle": 3}}',
     "no phases_ms.cycle"),
    ('{"schema": "sglang-pcie.eagle3-profile/3", "decode_cycles": 5, "phases_ms": {"cycle": {"mean": 1}}}',
     "schema sglang-pcie.eagle3-profile/3 is newer than this sglang-pcie reads"),
    ('{"schema": "sglang-pcie.eagle3-profile/x"}', "has no major number"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": 5', "not valid JSON"),
    ("[TP0] sglang-pcie eagle3-profile [timer=cuda syncs=0]: decode_cycles=5 | accept_len=2.00",
     "without decode_cycles or the cycle phase"),
]


def test_a_malformed_or_newer_record_is_named_in_one_line_and_skipped(tmp_path, capsys):
    good = _interval(20.0, 18.0, 2, 100)
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(line + "\n" for line, _ in MALFORMED) + ep.to_json(good) + "\n")
    assert profile_report.main([str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["decode_cycles"] == 100
    lines = captured.err.splitlines()
    assert len(lines) == len(MALFORMED) and "Traceback" not in captured.err
    for number, (line, reason) in enumerate(MALFORMED, 1):
        assert f"skipped {path}:{number}: " in lines[number - 1] and reason in lines[number - 1], lines[number - 1]
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("".join(line + "\n" for line, _ in MALFORMED * 2))
    assert profile_report.main([str(only_bad)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == profile_report.MAX_SKIP_LINES + 2 and "skipped 8 more records" in err[-2]


def test_report_bad_input(tmp_path, capsys):
    assert profile_report.main([str(tmp_path / "missing.log")]) == 2
    assert "missing.log" in capsys.readouterr().err
    empty = tmp_path / "other.log"
    empty.write_text("nothing about eagle here\n{\"schema\": \"someone-else/1\"}\n")
    assert profile_report.main([str(empty)]) == 1
    assert "no EAGLE3_PROFILE intervals" in capsys.readouterr().err
    assert profile_report.main([str(empty), "--baseline-ms", "0"]) == 2
    assert "--baseline-ms 0.0 is not a positive number" in capsys.readouterr().err
    assert profile_report.main([str(empty), "--baseline-ms", "inf"]) == 2


def test_report_help_has_no_raw_markup_and_every_option_is_explained(capsys):
    assert profile_report.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "`" not in text and "--run ID" in text and "--all" in text
    for action in profile_report._parser()._actions:
        assert action.help, action.option_strings


# ------------------------------------------------------------------ static: the pristine sources, the diffs


def test_every_covered_release_is_applicable(pristine_source):
    for version in COVERED_RELEASES:
        result = PATCH.check_source(SourceTree(pristine_source(version)))
        assert result.status == APPLICABLE, (version, result)
        has_v1 = version in ("0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12",
                             "0.5.12.post1")
        assert ("v1 EAGLEWorker.forward_batch_generation (cycle)" in result.detail) is has_v1, version
        assert "v2 EAGLEWorkerV2.forward_batch_generation (cycle)" in result.detail, version


def test_committed_diffs_are_what_the_patch_generates(pristine_source):
    for version in COVERED_RELEASES:
        committed = REPO / "patches" / version / "eagle3-profile.diff"
        assert committed.read_text() == diff_for(PATCH, SourceTree(pristine_source(version))), version


def _copy_targets(source_root: Path, dest: Path):
    for name in ["sglang/__init__.py", "sglang/version.py", "sglang/_version.py",
                 "sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py"]:
        if (source_root / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source_root / name, dest / name)
    return SourceTree(dest)


@pytest.mark.parametrize("version", ["0.5.8", "0.5.12.post1", "0.5.13", "0.5.23"])
def test_diff_applies_with_patch_and_the_result_reads_as_applied(pristine_source, tmp_path, version):
    tree = _copy_targets(pristine_source(version), tmp_path)
    diff = REPO / "patches" / version / "eagle3-profile.diff"
    subprocess.run(["patch", "-p1", "--quiet", "-i", str(diff)], cwd=tmp_path, check=True)
    assert PATCH.check_source(tree) == Result(APPLIED, "source carries the sglang-pcie diff")
    assert PATCH.rewrite(tree) == {}
    added = [line for line in diff.read_text().splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert all("sglang-pcie: eagle3-profile" in line for line in added if not line.startswith(("+    from",
               "+        return")))
    decorated = [line for line in added if "@_sglang_pcie_profile_phase(" in line]
    assert len(decorated) == sum(len(m) for module in TARGETS for m in TARGETS[module].values()
                                 if tree.source(module) is not None)


def test_renamed_phase_method_is_drifted(pristine_source, tmp_path):
    tree = _copy_targets(pristine_source("0.5.23"), tmp_path)
    path = tree.path(V2)
    path.write_text(path.read_text().replace("def _draft_extend_for_decode(", "def _draft_extend_decode("))
    result = PATCH.check_source(tree)
    assert result.status == DRIFTED and "EagleDraftWorker._draft_extend_for_decode missing" in result.detail
    assert PATCH.rewrite(tree) == {}


def test_cycle_that_no_longer_calls_a_phase_is_drifted(pristine_source, tmp_path):
    tree = _copy_targets(pristine_source("0.5.9"), tmp_path)
    path = tree.path(V1)
    path.write_text(path.read_text().replace("self.forward_draft_extend_after_decode(batch)", "pass"))
    result = PATCH.check_source(tree)
    assert result.status == DRIFTED
    assert "forward_batch_generation no longer calls forward_draft_extend_after_decode()" in result.detail


def test_release_without_eagle_workers_is_not_applicable(pristine_source, tmp_path):
    tree = _copy_targets(pristine_source("0.5.23"), tmp_path)
    tree.path(V2).unlink()
    # Issue 11: a worker module that every covered release has is missing: moved or renamed, so drifted.
    assert PATCH.check_source(tree).status == DRIFTED


# -------------------------------------------------------------------- runtime: the real SGLang releases

# The child imports the real worker modules (the overlay activated by the real .pth hook), reports how their
# methods look, then drives the real wrapped cycle methods: SGLang's own forward_batch_generation bodies, run on
# instances made without __init__ (no GPU, no model).  The phase methods they call are set on the instance as
# ep.wrap(...) around stand-ins that return what SGLang's would (the class attributes are checked to be the
# same wrap() around SGLang's functions), so the real control flow decides what is a prefill, idle or decode
# cycle and builds the real GenerationBatchResult the tokens are counted from.
CHILD = r'''
import contextlib, importlib, importlib.util, json, logging, os, sys, types
import sglang
import torch
import sglang_pcie.activate as activate
from sglang_pcie import eagle_profiler as ep
from sglang_pcie.base import MARKER_ATTR
from sglang_pcie.patches.eagle3_profile import PATCH, TARGETS, V1, V2
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.managers.utils import GenerationBatchResult

out = {"settings_errors": [], "methods": {}, "diffed": {}}
modules = {}
for name in TARGETS:
    try:
        modules[name] = importlib.import_module(name)
    except ModuleNotFoundError:
        pass
out["modules"] = sorted(modules)
for name, module in modules.items():
    for cls_name, methods in TARGETS[name].items():
        for method in methods:
            fn = getattr(module, cls_name).__dict__[method]
            inner = getattr(fn, "__wrapped__", None)
            out["methods"][f"{cls_name}.{method}"] = {
                "marker": getattr(fn, MARKER_ATTR, None), "phase": getattr(fn, "sglang_pcie_phase", None),
                "own_file": fn.__code__.co_filename == module.__file__,
                "inner_own_file": inner is not None and inner.__code__.co_filename == module.__file__}
out["activation"] = {key: r.status for key, r in activate.RESULTS.get("eagle3-profile", {}).items()}
out["switched_off"] = activate.SWITCHED_OFF.get("eagle3-profile")
out["check_runtime"] = PATCH.check_runtime(modules).status
out["decorator_is_identity"] = ep.profile_phase("draft")(len) is len

# The versioned diff's source, executed as a module next to the real one.
for name, path in DIFFED.items():
    spec = importlib.util.spec_from_file_location(name, path)  # same name, not put in sys.modules
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = {f"{c}.{m}": getattr(module, c).__dict__[m] for c, ms in TARGETS[name].items() for m in ms}
    result = PATCH.apply(module) if PROFILING else None
    out["diffed"][name] = {
        "phases": {k: getattr(f, "sglang_pcie_phase", None) for k, f in before.items()},
        "apply": [result.status, result.detail] if result else None,
        "unchanged_by_apply": all(getattr(module, k.split(".")[0]).__dict__[k.split(".")[1]] is f
                                  for k, f in before.items())}

captured = []
class Capture(logging.Handler):
    def emit(self, record):
        captured.append({"logger": record.name, "level": record.levelname, "message": record.getMessage()})
logging.getLogger("sglang.srt.speculative").addHandler(Capture())  # the worker modules' loggers propagate to it
for name in modules:
    logging.getLogger(name).setLevel(logging.INFO)

def stand_in(phase, returns=None):
    return ep.wrap(lambda self, *args, **kwargs: returns(*args) if returns else None, phase)

def ns(**kw):
    return types.SimpleNamespace(**kw)

def v1_worker(rank, server_args):
    m = modules[V1]
    w = object.__new__(m.EAGLEWorker)
    w.tp_rank = rank
    w.server_args = server_args
    w.draft_tp_context = lambda group: contextlib.nullcontext()
    w._model_runner = ns(tp_group=None)
    verify_output = ns(verified_id=torch.tensor([5, 6, 7]), accept_length_per_req_cpu=[1, 2, 0],
                       num_accepted_drafts_per_req_cpu=[1, 2, 0])
    w.draft = types.MethodType(stand_in("draft"), w)
    w.verify = types.MethodType(stand_in("verify", lambda b, s: (None, verify_output, None, True)), w)
    w.forward_draft_extend_after_decode = types.MethodType(stand_in("draft_extend"), w)
    # (logits, next token ids, seq lens) as in 0.5.9; 0.5.11 added can_run_cuda_graph
    w.forward_target_extend = lambda b: (ns(hidden_states=None, mm_input_embeds=None), torch.tensor([1]), None)
    w.forward_draft_extend = lambda *a: None
    def batch(mode):
        return ns(forward_mode=mode, is_extend_in_batch=False, reqs=[],
                  spec_info=ns(verified_id=torch.tensor([] if mode == ForwardMode.IDLE else [5, 6, 7])))
    return w, batch

def v2_worker(rank, server_args):
    m = modules[V2]
    w = object.__new__(m.EAGLEWorkerV2)
    d = object.__new__(m.EagleDraftWorker)
    if rank is not None:
        w.tp_rank = rank
    w.server_args = server_args
    w._draft_worker = d
    w.adaptive_controller = None
    w.speculative_num_steps = 3
    w.enable_dp_spec_prefill_coordination = False
    w.speculative_algorithm = ns(is_standalone=lambda: False)
    d.draft_tp_context = lambda group: contextlib.nullcontext()
    d.draft_runner = ns(tp_group=None)
    d.parallel_layout = ns(tp_group=None)
    d.draft = types.MethodType(stand_in("draft", lambda b: ns(is_verify_input=lambda: True, kv_loc_plan=None)), d)
    d._draft_extend_for_decode = types.MethodType(stand_in("draft_extend"), d)
    d._draft_extend_for_prefill = lambda *a, **k: None
    w.verify = types.MethodType(stand_in("verify", lambda b: GenerationBatchResult(
        accept_lens=torch.tensor([2, 3, 1], dtype=torch.int32))), w)
    w._target_worker = ns(forward_batch_generation=lambda *a, **k: GenerationBatchResult(
        logits_output=ns(hidden_states=None, mm_input_embeds=None), next_token_ids=torch.tensor([1])))
    def batch(mode):
        return ns(forward_mode=mode, is_extend_in_batch=False, seq_lens=torch.zeros(3), reqs=[],
                  spec_info=ns(is_verify_input=lambda: False))
    return w, batch

try:  # 0.5.16+: the cycle reads the pipeline-parallel size from SGLang's runtime context
    from sglang.srt.runtime_context import get_parallel
    get_parallel().override_permanently(pp_size=1)
except ImportError:
    pass

SCHEDULE = [ForwardMode.EXTEND] + [ForwardMode.DECODE] * 3 + [ForwardMode.IDLE] + [ForwardMode.DECODE] * 5

def drive(make, rank=0, metrics=False, schedule=SCHEDULE, flush=True):
    ep.set_profiler(None)
    profiler = ep.get_profiler()  # made from the environment, as in a server
    profiler.fixed_sample_every = profiler.sample_every = profiler._countdown = 1  # every cycle timed: exact figures
    del captured[:]
    server_args = ns(enable_dp_attention=False, enable_metrics=metrics, served_model_name="m")
    worker, batch = make(rank, server_args)
    results = [type(worker).forward_batch_generation(worker, batch(mode)).__class__.__name__ for mode in schedule]
    flushed = profiler.flush() if profiler.active and flush else None
    return {"results": results, "active": profiler.active, "records": list(profiler.records),
            "flushed": flushed is not None, "log": list(captured), "tp_rank_attr": hasattr(worker, "tp_rank")}

if PROFILING:
    makers = {"v1": v1_worker} if V1 in modules else {}
    makers["v2"] = v2_worker
    out["runs"] = {kind: drive(make) for kind, make in makers.items()}
    out["rank1"] = drive(lambda rank, args: v2_worker(1, args))
    saved = sys.modules.pop("prometheus_client", None)
    sys.modules["prometheus_client"] = None  # as if it were not installed
    out["no_prometheus"] = drive(v2_worker, metrics=True)
    del sys.modules["prometheus_client"]
    if saved is not None:
        sys.modules["prometheus_client"] = saved
    out["prometheus_run"] = drive(v2_worker, metrics=True)
    import prometheus_client
    out["prometheus"] = [line for line in prometheus_client.generate_latest().decode().splitlines()
                         if line.startswith("sglang_pcie_eagle_") and "_count" in line]
    try:  # 0.5.16+: v2 workers have no tp_rank; the rank is SGLang's runtime context's (its launcher publishes it)
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        get_parallel = None
    if get_parallel is not None:
        out["class_has_tp_rank"] = hasattr(modules[V2].EAGLEWorkerV2, "tp_rank")
        with get_parallel().override(tp_rank=1, tp_size=2):
            out["context_rank1"] = drive(lambda rank, args: v2_worker(None, args))
        with get_parallel().override(tp_rank=0, tp_size=2):
            out["context_rank0"] = drive(lambda rank, args: v2_worker(None, args))

    # EAGLE-family workers whose cycle the patch does not time warn once, naming the class, at their first cycle.
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    out["create_worker_marker"] = getattr(SpeculativeAlgorithm.__dict__["create_worker"], MARKER_ATTR, None)
    out["untimed"] = {}
    if hasattr(SpeculativeAlgorithm, "FROZEN_KV_MTP"):
        for label, algorithm, args in (("multi_layer", SpeculativeAlgorithm.EAGLE3, ns(enable_multi_layer_eagle=True)),
                                       ("frozen_kv_mtp", SpeculativeAlgorithm.FROZEN_KV_MTP, ns()),
                                       ("eagle3", SpeculativeAlgorithm.EAGLE3, ns(enable_multi_layer_eagle=False)),
                                       ("standalone", SpeculativeAlgorithm.STANDALONE, ns())):
            del captured[:]
            cls = algorithm.create_worker(args)
            timed = getattr(cls.forward_batch_generation, MARKER_ATTR, None) == "eagle3-profile"
            if not timed:  # run two cycles on a bare instance: SGLang's own method fails on it, after the flag
                worker = object.__new__(cls)
                for _ in range(2):
                    try:
                        cls.forward_batch_generation(worker, ns(forward_mode=ForwardMode.DECODE,
                                                                is_extend_in_batch=False))
                    except Exception:
                        pass
            function = cls.forward_batch_generation
            out["untimed"][label] = {
                "class": cls.__name__, "timed": timed,
                "warnings": [(e["logger"], e["level"], e["message"]) for e in captured
                             if "is not timed" in e["message"]],
                "own_method_back": function.__code__.co_filename == sys.modules[cls.__module__].__file__}

    # The last run stops mid-interval and is not flushed: the exit flush writes its partial interval.
    out["file_lines_before_exit"] = len(open(os.environ["EAGLE3_PROFILE_FILE"]).read().splitlines())
    out["exit_run"] = drive(v2_worker, schedule=[ForwardMode.DECODE] * 6, flush=False)
print(json.dumps(out))
'''


def _diffed_sources(pristine: Path, version: str, folder: Path) -> dict:
    tree = _copy_targets(pristine, folder)
    subprocess.run(["patch", "-p1", "--quiet", "-i", str(REPO / "patches" / version / "eagle3-profile.diff")],
                   cwd=folder, check=True)
    return {name: str(tree.path(name)) for name in TARGETS if tree.path(name) is not None}


def _run_child(sglang_env, pristine_source, tmp_path, version, env, profiling):
    diffed = _diffed_sources(pristine_source(version), version, tmp_path / "diffed")
    code = f"DIFFED = {diffed!r}\nPROFILING = {profiling!r}\n{CHILD}"
    proc = sglang_env(version).run(code, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


EXPECTED_MODULES = {"0.5.9": [V1, V2], "0.5.23": [V2]}


@pytest.fixture(scope="module", params=sorted(EXPECTED_MODULES))
def profiling_on(request, sglang_env, pristine_source, tmp_path_factory):
    version = request.param
    tmp = tmp_path_factory.mktemp(f"eagle-on-{version}")
    env = {"EAGLE3_PROFILE": "1", "EAGLE3_PROFILE_INTERVAL": "4", "EAGLE3_PROFILE_BASELINE_MS": "10",
           "EAGLE3_PROFILE_FILE": str(tmp / "profile.jsonl")}
    out, stderr = _run_child(sglang_env, pristine_source, tmp, version, env, profiling=True)
    return version, out, tmp / "profile.jsonl", stderr


def test_profiling_on_wraps_every_phase_method_of_the_real_workers(profiling_on):
    version, out, _, _ = profiling_on
    assert out["modules"] == EXPECTED_MODULES[version]
    for name in out["modules"]:
        for cls_name, methods in TARGETS[name].items():
            for method, phase in methods.items():
                state = out["methods"][f"{cls_name}.{method}"]
                assert state == {"marker": "eagle3-profile", "phase": phase, "own_file": False,
                                 "inner_own_file": True}, (version, cls_name, method)
    assert out["activation"] == {**{name: APPLIED for name in out["modules"]}, SPEC_INFO: APPLIED}
    assert out["check_runtime"] == APPLIED and out["create_worker_marker"] == "eagle3-profile"


def test_the_real_cycles_are_counted_by_kind_with_their_tokens(profiling_on):
    version, out, _, _ = profiling_on
    assert set(out["runs"]) == ({"v1", "v2"} if version == "0.5.9" else {"v2"})
    for kind, run in out["runs"].items():
        assert run["results"] == ["GenerationBatchResult"] * 10, kind  # SGLang's own result, passed through
        first, second = run["records"]
        assert (first["decode_cycles"], first["prefill_cycles"], first["idle_cycles"]) == (4, 1, 1), kind
        assert (second["decode_cycles"], second["prefill_cycles"]) == (4, 0), kind
        for record in (first, second):
            # v1: accepted drafts [1, 2, 0] + a bonus token each; v2: accept_lens [2, 3, 1]: 6 tokens, 3 requests
            assert (record["tokens"], record["decode_requests"], record["accept_length"]) == (24, 12, 2.0), kind
            phases = record["phases_ms"]
            parts = sum(phases[p]["mean"] for p in ("draft", "verify", "draft_extend", "other"))
            assert parts == pytest.approx(phases["cycle"]["mean"]), kind
            assert record["projected_speedup"] == pytest.approx(2.0 * 10 / record["wall_cycle_ms"])
            assert record["phases_sum_ms"] <= record["cycle_ms"] <= record["wall_cycle_ms"], kind
            assert record["accept_length_exact"] and record["timed_cycles"] == 4
            assert record["timer"] == "host" and record["tp_rank"] == 0 and record["baseline_ms"] == 10.0
        assert not any(r["partial"] for r in run["records"])  # 8 decode cycles: exactly two intervals


def test_one_log_line_per_interval_through_the_worker_modules_logger(profiling_on):
    version, out, _, _ = profiling_on
    for kind, run in out["runs"].items():
        module = V1 if kind == "v1" else V2
        assert [(e["logger"], e["level"]) for e in run["log"]] == [(module, "INFO")] * 2, kind
        parsed = [profile_report.parse_log_line(e["message"]) for e in run["log"]]
        assert [p["decode_cycles"] for p in parsed] == [4, 4] and parsed[0]["accept_length"] == 2.0


def test_only_tp_rank0_reports(profiling_on):
    _, out, _, _ = profiling_on
    rank1 = out["rank1"]
    assert rank1["results"] == ["GenerationBatchResult"] * 10
    assert not rank1["active"] and not rank1["records"] and not rank1["log"]


def test_only_tp_rank0_of_a_real_0_5_23_worker_reports_its_rank_from_sglangs_runtime_context(profiling_on):
    """0.5.16+ v2 workers have no tp_rank: the rank comes from SGLang's runtime context (mutant: read as 0)."""
    version, out, _, _ = profiling_on
    if version != "0.5.23":
        assert "context_rank1" not in out  # 0.5.9 has no runtime context: its workers carry tp_rank
        return
    assert out["class_has_tp_rank"] is False
    rank1, rank0 = out["context_rank1"], out["context_rank0"]
    assert rank1["tp_rank_attr"] is False and rank0["tp_rank_attr"] is False
    assert rank1["results"] == rank0["results"] == ["GenerationBatchResult"] * 10
    assert not rank1["active"] and not rank1["records"] and not rank1["log"]
    assert rank0["active"] and [r["tp_rank"] for r in rank0["records"]] == [0, 0]


def test_eagle_family_workers_that_are_not_timed_warn_once_naming_the_class(profiling_on):
    version, out, _, _ = profiling_on
    if version != "0.5.23":  # 0.5.9's multi-layer EAGLE modules do not import without a GPU
        return
    untimed = out["untimed"]
    assert {label: (u["class"], u["timed"]) for label, u in untimed.items()} == {
        "multi_layer": ("MultiLayerEagleWorkerV2", False), "frozen_kv_mtp": ("FrozenKVMTPWorkerV2", False),
        "eagle3": ("EAGLEWorkerV2", True), "standalone": ("StandaloneWorkerV2", True)}
    for label, module in (("multi_layer", "multi_layer_eagle_worker_v2"), ("frozen_kv_mtp", "frozen_kv_mtp_worker_v2")):
        (logger, level, message), = untimed[label]["warnings"]  # two cycles, one warning
        assert logger == f"sglang.srt.speculative.{module}" and level == "WARNING"
        assert f"{untimed[label]['class']} (sglang.srt.speculative.{module}) is not timed" in message
        assert untimed[label]["own_method_back"]  # after the first cycle the class runs SGLang's method untouched
    assert untimed["eagle3"]["warnings"] == [] and untimed["standalone"]["warnings"] == []


def test_json_lines_file_holds_one_object_per_interval_and_the_partial_one_at_exit(profiling_on):
    _, out, path, _ = profiling_on
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(set(line) == RECORD_KEYS and line["schema"] == ep.SCHEMA for line in lines)
    before_exit = out["file_lines_before_exit"]
    drives = [*out["runs"].values(), out["no_prometheus"], out["prometheus_run"]] + \
        [out[key] for key in ("context_rank0",) if key in out]
    assert before_exit == 2 * len(drives)
    # the last run: 6 decode cycles at interval 4, not flushed by the test: the exit flush wrote the last 2
    assert [(r["decode_cycles"], r["partial"]) for r in lines[before_exit:]] == [(4, False), (2, True)]
    assert len({line["run_id"] for line in lines}) == 1 and lines[0]["run_id"].endswith(f"-{lines[0]['pid']}")
    summary = profile_report.summarise(profile_report.read_records(path.read_text().splitlines()))
    assert summary["decode_cycles"] == 8 * len(drives) + 6 and summary["accept_length"] == 2.0


def test_prometheus_metrics_when_sglang_metrics_are_on_and_nothing_breaks_without_the_client(profiling_on):
    _, out, _, _ = profiling_on
    assert len(out["no_prometheus"]["records"]) == 2
    assert any("Prometheus export off" in e["message"] for e in out["no_prometheus"]["log"])
    assert len(out["prometheus_run"]["records"]) == 2
    counts = set(out["prometheus"])
    for phase in ("draft", "verify", "draft_extend", "cycle"):
        assert f'sglang_pcie_eagle_phase_seconds_count{{model_name="m",phase="{phase}"}} 8.0' in counts
    assert 'sglang_pcie_eagle_phase_seconds_count{model_name="m",phase="prefill"} 1.0' in counts
    assert 'sglang_pcie_eagle_accept_length_count{model_name="m"} 8.0' in counts


def test_the_diffed_source_times_the_same_methods_and_the_runtime_patch_stands_aside(profiling_on):
    _, out, _, _ = profiling_on
    for name, diffed in out["diffed"].items():
        assert diffed["phases"] == {f"{c}.{m}": p for c, ms in TARGETS[name].items() for m, p in ms.items()}
        assert diffed["apply"] == [APPLIED, "source carries the sglang-pcie diff"]
        assert diffed["unchanged_by_apply"]


# Off: 0.5.9 with EAGLE3_PROFILE unset, 0.5.23 with an invalid value (a warning naming it, then off).
OFF_ENV = {"0.5.9": {}, "0.5.23": {"EAGLE3_PROFILE": "maybe"}}


@pytest.mark.parametrize("version", sorted(OFF_ENV))
def test_profiling_off_leaves_the_release_methods_its_own(sglang_env, pristine_source, tmp_path, version):
    out, stderr = _run_child(sglang_env, pristine_source, tmp_path, version, OFF_ENV[version], profiling=False)
    assert out["modules"] == EXPECTED_MODULES[version]
    for key, state in out["methods"].items():
        assert state == {"marker": None, "phase": None, "own_file": True, "inner_own_file": False}, key
    assert out["activation"] == {} and "EAGLE3_PROFILE" in out["switched_off"]
    assert out["check_runtime"] == "disabled" and out["decorator_is_identity"]
    for name, diffed in out["diffed"].items():  # the diff's decorator is the identity too
        assert set(diffed["phases"].values()) == {None}, name
    warnings = [line for line in stderr.splitlines() if "EAGLE3_PROFILE=" in line]
    if OFF_ENV[version]:
        assert len(warnings) == 1 and "EAGLE3_PROFILE='maybe'" in warnings[0]
    else:
        assert warnings == []


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
