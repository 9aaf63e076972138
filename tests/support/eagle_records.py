"""EAGLE profile intervals built with the profiler's own statistics, for the profiler's and profile-report's tests."""
from __future__ import annotations

from sglang_pcie.runtime import eagle_profiler as ep

META = {"run_id": "20261130T100000Z-42", "run_started": 1796032800.0, "pid": 42, "tp_rank": 0, "pp_rank": 0,
        "dp_rank": None, "worker": "EAGLEWorkerV2", "timer": "cuda", "interval": 200}


def interval_stats(timed, decode_cycles, batch_size=2, tokens=4, wall_cycle_ms=25.0):
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
