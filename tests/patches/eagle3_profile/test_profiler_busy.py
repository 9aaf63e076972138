"""GPU busy and the invariants phases <= cycle <= wall cycle, for the same timed cycles, in a simulated GPU-bound
and a simulated host-bound server (SGLang's overlap scheduler over one CUDA stream, cycle lengths that vary).

Issue: in a GPU-bound server (verify ~11 ms of a ~12 ms cycle) "GPU busy" read 98-108% and the GPU cycle exceeded
the wall cycle.  The old figure divided the mean GPU time of the 2-12 timed cycles of an interval by the mean host
time between all of its decode cycles: different cycles, so sampling alone pushed it past 100%.  The wall time is
now that of the timed cycles themselves, each from its start to the next decode cycle's start on the same stream,
which its GPU time cannot exceed."""
from __future__ import annotations

import random

import pytest

from sglang_pcie.patches.eagle3_profile import payload as ep
from sglang_pcie.patches.eagle3_profile import profiler as profiler_module

from support.eagle_records import SimulatedStream, SimulatedWorker, run_overlap_scheduler

EPSILON = 1e-9


def _run(monkeypatch, gpu_ms, host_ms, sample_every=None, cycles=2000, seed=3):
    stream = SimulatedStream()
    monkeypatch.setattr(profiler_module, "_now", stream.host_ns)
    monkeypatch.setattr(profiler_module, "HOST_BUDGET", 0.0)  # sampling at the floor, as in a real server
    rng = random.Random(seed)
    scale = gpu_ms / 12.0

    def durations():  # draft, verify, re-extend (ms): ~0.5 + ~11 + ~0.5 at scale 1, varying from cycle to cycle
        return 0.5 * scale, rng.uniform(8.0, 14.0) * scale, 0.5 * scale

    profiler = ep.Profiler(interval=200, clock=stream, sample_every=sample_every, seed=seed)
    ep.set_profiler(profiler)
    try:
        run_overlap_scheduler(stream, SimulatedWorker(stream, durations), cycles, host_ms)
        profiler.flush()
    finally:
        ep.set_profiler(None)
    return [r for r in profiler.records if r["timed_cycles"]]


@pytest.mark.parametrize("regime, gpu_ms, host_ms, busy", [("GPU-bound", 12.0, 1.0, (0.95, 1.0)),
                                                           ("host-bound", 3.0, 4.0, (0.6, 0.85))])
def test_phases_le_cycle_le_wall_cycle_and_busy_at_most_100_percent(monkeypatch, regime, gpu_ms, host_ms, busy):
    records = _run(monkeypatch, gpu_ms, host_ms)
    assert len(records) == 10
    for r in records:
        assert r["phases_sum_ms"] <= r["cycle_ms"] + EPSILON <= r["timed_wall_cycle_ms"] + 2 * EPSILON, r
        assert busy[0] <= r["gpu_busy"] <= busy[1] and r["bound"] == regime, r["gpu_busy"]
        assert ep.QUANTILE_MIN <= r["phases_ms"]["cycle"]["n"] <= r["timed_cycles"] <= 25
        assert r["phases_ms"]["cycle"]["p90"] is not None


def test_the_old_division_passed_100_percent_where_the_new_one_cannot(monkeypatch):
    """With the old sampling (1 in 32: ~6 timed cycles per interval), the old figure - the timed cycles' mean GPU
    time over the mean host time between all decode cycles - exceeds 100% in some intervals of a GPU-bound run;
    the timed cycles' GPU time over their own wall time never does."""
    records = _run(monkeypatch, 12.0, 1.0, sample_every=32)
    old = [r["cycle_ms"] / r["wall_cycle_ms"] for r in records]
    assert max(old) > 1.02
    assert all(r["gpu_busy"] <= 1.0 + EPSILON for r in records)
