"""The Profiler (sglang_pcie.patches.eagle3_profile.profiler) driven through wrap() by a worker shaped like
SGLang's, on a GPU timeline the test advances: when timed cycles are read, what each interval reports, sampling,
tokens, wall time, CUDA-graph capture, errors, memory and ranks.

Mutants of issue 10 caught here: the CUDA-graph capture guard dropped
(test_nothing_is_recorded_while_a_cuda_graph_is_being_captured), the TP rank read as 0
(test_ranks_other_than_tp0_record_nothing; also tests/patches/eagle3_profile/test_eagle3_profile_check.py)."""
from __future__ import annotations

import json
import logging
import os
import random
import types

import pytest

from sglang_pcie.patches.eagle3_profile import payload as ep
from sglang_pcie.patches.eagle3_profile import profiler as profiler_module
from sglang_pcie.patching.engine import MARKER_ATTR
from sglang_pcie.tools import profile_report

from support.eagle_records import (RECORD_KEYS, DeviceAcceptLens, GpuTimeline, Scheduler, Worker, batch,
                                   interval_stats)


@pytest.fixture
def profiler_factory():
    """``make(**kwargs)``: a Profiler (every cycle timed unless ``sample_every`` says otherwise) installed as the
    process's; removed after the test."""
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
    # cycle 5's wall time ends at cycle 6's start, which the GPU has not passed: left unread
    assert profiler.stats.series["cycle"].count == 4 and clock.waits == 0
    # a GPU far behind: once batch 4 + lag 2 timed cycles are unread, the reader waits once for the batch's newest
    for _ in range(2):
        worker.forward_batch_generation(batch())
    assert clock.waits == 1 and len(profiler._pending) == 2
    assert not profiler.records  # the interval (10 cycles) is complete in count; cycles 9 and 10 are unread
    for _ in range(2):
        clock.completed = clock.recorded
        worker.forward_batch_generation(batch())
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
    # the first decode cycle (an idle one follows) and the last (the end follows) have no wall time of their own:
    # the GPU figures are over the other two, each 8 marks from its start to the next decode cycle's
    assert (first["timed_cycles"], first["phases_ms"]["cycle"]["n"]) == (3, 2)
    assert (partial["timed_cycles"], partial["phases_ms"]["cycle"]["n"], partial["gpu_busy"]) == (1, 0, None)
    assert first["timed_wall_cycle_ms"] == 8.0 and first["gpu_busy"] == 7.0 / 8.0
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
    """1 decode cycle in each block of 4 timed, every cycle counted; the tokens come from SGLang's host copy of
    accept_lens, read two cycles later: no device tensor is ever read on the host."""
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
    # one in each block of 4; the last one's next cycle may be the prefill, which leaves it without a wall time
    assert record["decode_cycles"] == 400 and record["timed_cycles"] == 100
    assert record["phases_ms"]["cycle"]["n"] in (99, 100)
    assert record["tokens"] == 6 * 400 and record["decode_requests"] == 3 * 400
    assert record["accept_length"] == 2.0 and record["accept_length_exact"]
    assert record["phases_ms"]["cycle"]["mean"] == 7.0 and record["sample_every"] == 4
    assert profiler.tokens.mode == "sglang"


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
    assert profiler.tokens.mode == "sglang"
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
    assert profiler.tokens.mode == "own"
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
    monkeypatch.setattr(profiler_module, "_now", lambda: now[0])

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


def test_the_wall_cycle_does_not_span_a_prefill_or_an_idle_cycle_but_the_wall_time_does(profiler_factory,
                                                                                        monkeypatch):
    """A decision pinned: the wall-clock decode cycle is the host time from a decode cycle's start to the next
    one's, decode followed by decode only: a prefill (here 10 ms, after a 20 ms pause with no request) or an idle
    cycle in between starts the chain again, so wall_cycle_ms stays the decode rhythm (1.5 ms).  The interval's
    wall time (served tokens/s) counts everything, the gap included.  (The subclass's cycle calls the wrapped base
    one, a nested call: every cycle, the idle one too, counts once.)"""
    now = [0]
    monkeypatch.setattr(profiler_module, "_now", lambda: now[0])
    cost_ms = {"decode": 1.0, "extend": 10.0, "idle": 0.2}

    class Timed(Worker):
        def forward_batch_generation(self, batch):
            now[0] += int(cost_ms[batch.forward_mode.name] * 1e6)
            return super().forward_batch_generation(batch)

    Timed.forward_batch_generation = ep.wrap(Timed.forward_batch_generation, "cycle")
    profiler = profiler_factory(interval=100, clock=GpuTimeline())
    worker = Timed()
    for mode in ["decode"] * 3 + ["pause", "extend"] + ["decode"] * 3 + ["idle"] + ["decode"] * 2:
        if mode == "pause":
            now[0] += 20_000_000
            continue
        worker.forward_batch_generation(batch(mode))
        profiler._clock.completed = profiler._clock.recorded
        now[0] += 500_000
    record = profiler.flush()
    assert (record["decode_cycles"], record["prefill_cycles"], record["idle_cycles"]) == (8, 1, 1)
    # decode -> decode gaps: 2 + 2 + 1 (the prefill and the idle cycle each break the chain), each 1.5 ms
    assert record["wall_cycles"] == 5 and record["wall_cycle_ms"] == pytest.approx(1.5)
    # from the first decode cycle's start to the last one's end: 8 decode, 1 prefill and 1 idle cycle, 9 host gaps
    # of 0.5 ms, the 20 ms pause
    assert record["wall_s"] == pytest.approx((8 * 1.0 + 10.0 + 0.2 + 9 * 0.5 + 20.0) / 1e3)
    assert record["tokens_per_s_served"] == pytest.approx(8 * 6 / record["wall_s"])


@pytest.mark.parametrize("field", ["accept_length_per_req_cpu", "num_accepted_drafts_per_req_cpu",
                                   "num_correct_drafts_per_req_cpu"])  # 0.5.8-0.5.10, 0.5.11, 0.5.12(.post1)
def test_v1_accepted_drafts_are_counted_under_each_releases_field_name(field):
    # v1 gives accepted drafts per request as a host list; each request also emits one bonus token.
    stats = ep.IntervalStats()
    ep.TokenCounter().count(types.SimpleNamespace(**{field: [1, 2, 0]}), None, stats, None)
    assert (stats.requests_all, stats.requests, stats.tokens) == (3, 3, 6)


def test_sample_every_adapts_to_the_host_budget_within_the_floor():
    profiler = ep.Profiler(interval=2000, sample_every=None)
    assert profiler.sample_every == ep.SAMPLE_START
    stats = interval_stats([(1.0, 2.0, 0.5, 4.0)] * 10, decode_cycles=200, wall_cycle_ms=5.0)
    stats.host_ns, stats.host_timed_ns = 200 * 2_000 + 10 * 80_000, 10 * 80_000  # 2 us a cycle, 80 us a timed one
    profiler._adapt(stats)
    # budget 0.2% of 5 ms = 10 us; 8 us spare for the timed cycles: 80 / 8 = 1 in 10
    assert profiler.sample_every == 10
    stats.host_ns = 200 * 20_000 + 10 * 80_000  # a host slower than the whole budget: the least sampling
    profiler._adapt(stats)
    assert profiler.sample_every == ep.SAMPLE_MAX
    # at the default interval of 200 the floor of TIMED_PER_INTERVAL timed cycles wins over the budget
    floored = ep.Profiler(interval=200, sample_every=None)
    assert floored.sample_every == 200 // ep.TIMED_PER_INTERVAL
    floored._adapt(stats)
    assert floored.sample_every == 200 // ep.TIMED_PER_INTERVAL
    fixed = ep.Profiler(sample_every=3)
    fixed._adapt(stats)
    assert fixed.sample_every == 3


def test_every_full_interval_has_enough_timed_cycles_for_its_percentiles(profiler_factory, monkeypatch):
    """The host budget asks for the least sampling (1 in 64) and a prefill follows every sixth decode cycle (a timed
    cycle it follows has no wall time and is dropped): the floor still leaves QUANTILE_MIN timed cycles, with
    their percentiles, in every full interval."""
    monkeypatch.setattr(profiler_module, "HOST_BUDGET", 0.0)
    clock = GpuTimeline()
    profiler = profiler_factory(interval=200, clock=clock, sample_every=None, seed=11)
    scheduler = Scheduler(Worker())
    for step in range(1400):
        scheduler.step("extend" if step % 7 == 6 else "decode")
        clock.completed = clock.recorded
    profiler.flush()
    full = [r for r in profiler.records if not r["partial"]]
    assert len(full) == 6 and all(r["sample_every"] == 200 // ep.TIMED_PER_INTERVAL for r in full)
    for record in full:
        cycle = record["phases_ms"]["cycle"]
        assert record["timed_cycles"] >= cycle["n"] >= ep.QUANTILE_MIN, record["timed_cycles"]
        assert cycle["p50"] is not None and cycle["p90"] is not None


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
    # the three timed before the capture; the last of them has no wall time (the next cycle ran in the capture)
    assert profiler.active and sum(r["timed_cycles"] for r in profiler.records) == 3
    assert sum(r["phases_ms"]["cycle"]["n"] for r in profiler.records) == 2
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


def test_interval_line_goes_to_the_worker_modules_logger(profiler_factory, caplog):
    profiler_factory(interval=2, clock=GpuTimeline(), drain_lag=0)
    worker = Worker()
    with caplog.at_level(logging.INFO):
        worker.forward_batch_generation(batch())
        ep._PROFILER._clock.completed = ep._PROFILER._clock.recorded
        worker.forward_batch_generation(batch())
        ep._PROFILER._clock.completed = ep._PROFILER._clock.recorded
        ep._PROFILER.flush()
    lines = [r for r in caplog.records if ep.LOG_PREFIX + " [" in r.getMessage()]
    assert len(lines) == 1 and lines[0].name == Worker.__module__ and lines[0].levelno == logging.INFO
    setup = [r.getMessage() for r in caplog.records if r.getMessage().startswith(ep.LOG_PREFIX + ": set up in")]
    assert len(setup) == 1 and profile_report.parse_log_line(setup[0]) is None
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



def test_a_timed_cycle_is_read_once_it_is_drain_lag_cycles_old(profiler_factory):
    # DRAIN_LAG: a timed cycle is left unread for drain_lag cycles, then read (the GPU has passed it here)
    clock = GpuTimeline()
    profiler = profiler_factory(interval=100, clock=clock, drain_batch=4, drain_lag=2, read_per_call=2)
    worker = Worker()
    read = []
    for _ in range(6):
        worker.forward_batch_generation(batch())
        read.append(profiler.stats.series["cycle"].count)
        clock.completed = clock.recorded
    assert read == [0, 0, 1, 2, 3, 4]


def test_prefill_cycles_are_timed_after_random_gaps_of_mean_sample_every(profiler_factory):
    # _gap: uniform over 1 .. 2 * sample_every - 1 (mean sample_every); the gap-th prefill cycle is the timed one
    profiler = profiler_factory(interval=100, clock=GpuTimeline(), sample_every=4, seed=7, drain_lag=1000)
    rng = random.Random(7)
    expected, at = [], 0
    for _ in range(5):
        at += rng.randint(1, 2 * 4 - 1)
        expected.append(at)
    worker = Worker()
    timed = []
    for cycle in range(1, expected[-1] + 1):
        before = len(profiler._pending)
        worker.forward_batch_generation(batch("extend"))
        if len(profiler._pending) > before:
            timed.append(cycle)
    assert timed == expected
    gaps = {ep.Profiler(sample_every=4, seed=seed)._countdown for seed in range(200)}
    assert gaps == set(range(1, 8))  # never 0 (the next cycle), never 2 * sample_every


def test_at_exit_the_finished_timed_cycles_are_read_and_the_rest_counted_unfinished(profiler_factory):
    clock = GpuTimeline()
    profiler = profiler_factory(interval=100, clock=clock, drain_lag=1000)
    worker = Worker()
    worker.forward_batch_generation(batch())
    worker.forward_batch_generation(batch())
    through_second = clock.recorded  # the marks of cycles 1 and 2; cycle 2's wall ends at cycle 3's start: + 1
    worker.forward_batch_generation(batch())
    worker.forward_batch_generation(batch())
    clock.completed = through_second + 1
    record = profiler.flush(wait=False)
    assert clock.waits == 0
    assert record["timed_cycles"] == 2 and record["unfinished_at_exit"] == 2 and record["decode_cycles"] == 4


def test_idle_cycles_share_the_host_time_the_adaptation_spreads_per_cycle():
    profiler = ep.Profiler(interval=2000, sample_every=None)
    stats = interval_stats([(1.0, 2.0, 0.5, 4.0)] * 10, decode_cycles=100, wall_cycle_ms=5.0)
    stats.idle_cycles = 100
    # 2 us per cycle over all 200 cycles, idle ones included; 80 us per timed cycle: 8 us spare, 1 in 10
    stats.host_ns, stats.host_timed_ns = 200 * 2_000 + 10 * 80_000, 10 * 80_000
    profiler._adapt(stats)
    assert profiler.sample_every == 10


def test_a_worker_without_a_tp_rank_is_profiled_as_rank_0(profiler_factory):
    profiler = profiler_factory(interval=2, clock=GpuTimeline())
    worker = Worker()
    worker.tp_rank = None
    for _ in range(3):
        worker.forward_batch_generation(batch())
    profiler.flush()
    assert profiler.active and profiler.records[0]["tp_rank"] == 0


def test_a_batch_read_never_takes_the_cycle_still_awaiting_its_wall_times_end(profiler_factory):
    # drain_lag 0: a batch read right after each cycle; the newest decode cycle's wall time ends at the next
    # cycle's start, so it stays unread until then, and every cycle but the last keeps its wall time
    clock = GpuTimeline()
    profiler = profiler_factory(interval=100, clock=clock, drain_batch=2, drain_lag=0, read_per_call=0)
    worker = Worker()
    for _ in range(6):
        worker.forward_batch_generation(batch())
    record = profiler.flush()
    assert record["timed_cycles"] == 6 and record["wall_cycles"] == 5
    assert profiler.records[-1]["phases_ms"]["verify"]["n"] == 5
    # every wait for the GPU is a forced sync the record counts, once each
    assert clock.waits > 0 and record["syncs"] == clock.waits


def test_a_batch_that_extends_in_any_request_is_a_prefill_cycle():
    decode_with_extend = batch()
    decode_with_extend.is_extend_in_batch = True
    assert profiler_module.cycle_kind(decode_with_extend) == "prefill"
    assert profiler_module.cycle_kind(batch()) == "decode"
    idle = batch("idle")
    assert profiler_module.cycle_kind(idle) == "idle"


def test_after_profiling_stopped_on_an_error_flush_reports_nothing(profiler_factory, tmp_path):
    out = tmp_path / "profile.jsonl"
    clock = GpuTimeline()
    profiler = profiler_factory(interval=100, clock=clock, path=str(out))
    worker = Worker()
    worker.forward_batch_generation(batch())

    def broken(marks, index):
        raise RuntimeError("event record failed")

    clock.record = broken
    worker.forward_batch_generation(batch())
    assert not profiler.active
    assert profiler.flush() is None and not profiler.records and not out.exists()


def test_an_interval_without_two_decode_cycles_in_a_row_leaves_the_sampling_as_it_was():
    # no wall cycle (a prefill between every two decode cycles): nothing to measure the budget against
    profiler = ep.Profiler(interval=2000, sample_every=None)
    stats = interval_stats([(1.0, 2.0, 0.5, 4.0)] * 10, decode_cycles=200, wall_cycle_ms=5.0)
    stats.host_ns, stats.host_timed_ns = 200 * 2_000 + 10 * 80_000, 10 * 80_000
    stats.wall_cycle_ns = stats.wall_cycles = 0
    profiler._adapt(stats)
    assert profiler.sample_every == ep.SAMPLE_START


def timed_decode_cycles(seed, cycles=24, capture_at=(), prefill_after=()):
    """The interval's decode cycle index of each timed decode cycle, sample_every 8: ``capture_at``, the cycles run
    inside a CUDA graph capture; ``prefill_after``, the cycles a prefill cycle follows."""
    clock = GpuTimeline()
    profiler = ep.Profiler(interval=1000, clock=clock, sample_every=8, seed=seed)
    ep.set_profiler(profiler)
    opened, open_slot = [], profiler._open_slot

    def spy(kind):
        opened.append(profiler.stats.decode_cycles if kind == "decode" else kind)
        return open_slot(kind)
    profiler._open_slot = spy
    worker = Worker()
    try:
        for index in range(cycles):
            clock.is_capturing = index in capture_at
            worker.forward_batch_generation(batch())
            clock.is_capturing = False
            if index in prefill_after:
                worker.forward_batch_generation(batch("extend"))
            clock.completed = clock.recorded
    finally:
        ep.set_profiler(None)
    return opened


def test_a_missed_sample_slot_is_taken_later_in_the_block_and_only_once():
    """One decode cycle in each block of 8 at a random offset (seed 5: cycles 4, 13, 16); where that cycle cannot be
    timed (a CUDA graph capture) a later cycle of its block is, and the next block keeps its own offset."""
    assert timed_decode_cycles(5) == [4, 13, 16]
    assert timed_decode_cycles(5, capture_at={4}) == [5, 13, 16]
    assert timed_decode_cycles(5, capture_at={4, 5, 6, 7}) == [13, 16]  # the block's cycles all missed: none
    assert timed_decode_cycles(5, capture_at={7}) == [4, 13, 16]


def test_a_timed_cycle_a_prefill_follows_is_dropped_and_its_block_times_the_next_decode_cycle():
    assert timed_decode_cycles(5, prefill_after={4}) == [4, 5, 13, 16]
    assert timed_decode_cycles(5, prefill_after={5}) == [4, 13, 16]  # an untimed cycle's prefill changes nothing
