"""EAGLE3_PROFILE=1: per-phase timers for SGLang's EAGLE speculative decoding cycle.

One decode cycle of an EAGLE worker is: draft (the draft model proposes tokens), verify (the target model scores
them and the acceptance rule keeps a prefix), draft re-extend (the draft model catches up on the accepted tokens).
``wrap(function, phase)`` times a worker method as one of those phases ("cycle" for the whole
``forward_batch_generation``); the runtime patch (``sglang_pcie.patches.eagle3_profile.check``) and the versioned diffs
(through their guard, ``runtime/baked.py``; ``profile_phase`` for diffs baked by older versions) both install
exactly these wrappers, handing down the settings the patch was gated with.  This module holds those hooks and the
process's profiler; the rest of the package:

* ``profiler``: the Profiler (counts every cycle, times a sample, closes and reports intervals);
* ``readback``: how the Profiler reads its timed cycles back (when the GPU has passed them, or waiting once);
* ``clocks``: CUDA events on the current stream, or the host clock;
* ``tokens``: the accepted-token counts and their histogram per request-verify, from SGLang's own host copies;
* ``records``: an interval's statistics, its JSON-lines record and its log line;
* ``process``: the run id, and the flush of the last partial interval at exit and on SIGTERM;
* ``ranks``: the worker's ranks (only TP rank 0 reports), its speculative settings, SGLang's metrics switch and the
  model name;
* ``prometheus``: the Prometheus histograms.

What it costs, and why the figures stay honest:

* **Counted every cycle, timed on a sample.**  Every cycle is classified (decode / prefill / idle) and counted, and
  the wall-clock time between consecutive decode cycles is taken from the host clock: a few attribute reads and one
  ``perf_counter_ns``.  One decode cycle in each block of ``sample_every`` (at a random place in the block, so no
  period of the workload aliases with it) gets GPU timers.  After each interval ``sample_every`` is set so that the
  profiler's own host time stays near ``HOST_BUDGET`` of the wall-clock cycle (at most ``SAMPLE_MAX``), but never
  so that a full interval has fewer than ``TIMED_PER_INTERVAL`` timed decode cycles: its percentiles need them.
  Phase means and percentiles are therefore over the timed cycles (the record says how many); the counts, the
  tokens, the accept length and the wall-clock figures are over every cycle.
* **GPU busy over the same cycles.**  A timed decode cycle's wall time runs from its start to the next decode
  cycle's start, marked on the same clock and stream as its GPU time, so GPU busy (GPU time over that wall time,
  summed over the timed cycles) cannot pass 100% and ``phases <= cycle <= wall cycle`` holds for each record.
* **Accept length exact, without a kernel.**  SGLang itself copies each v2 cycle's ``accept_lens`` into pinned host
  memory right after the cycle (``copy_to_cpu``, on its copy stream, with a ``copy_done`` event).  The profiler picks
  up that host copy at the start of the next cycle and sums ``TOKEN_BATCH`` of them at once (one concatenation, one
  sum, one bincount for the acceptance per depth), once the newest one's ``copy_done`` has passed: no kernel, no
  copy and no wait of its own.  Only where SGLang
  does not copy (the synthetic benchmark, a future scheduler) does it fall back to summing on the stream and copying
  into its own pinned slot, on the timed cycles only; the record then says ``accept_length_exact: false``.  v1
  cycles report per-request host lists.
* **GPU time on the current stream.**  On a timed cycle every phase boundary is a ``torch.cuda.Event`` recorded on
  the stream current at that moment, the stream the worker launches that phase on (SGLang's forward stream under
  the overlap scheduler).  Events sit outside any CUDA graph: they bracket the replay on the stream.  Nothing is
  recorded while a graph is being captured.
* **Reading without synchronising.**  Timed cycles live in a fixed ring of slots.  After each cycle the reader
  takes at most ``READ_PER_CALL`` timed cycles that are ``DRAIN_LAG`` cycles old and that the GPU has passed (an
  event query, which never waits).  Only if ``DRAIN_BATCH + DRAIN_LAG`` timed cycles pile up unread does it wait,
  once, for a batch (counted as ``syncs``).
* **Bounded memory.**  The ring has ``DRAIN_BATCH + DRAIN_LAG + 1`` slots; per interval at most ``RESERVOIR``
  samples per phase; the last 16 records.
* **Own host time measured.**  ``time.perf_counter_ns`` around every hook, plus what the clock reads cannot see:
  the wrapper frames (per cycle, per phase call) and each hook's entry and exit, measured once per process by
  ``calibrate`` and charged per call.  Each record gives the profiler's host time per cycle and its share of the
  wall time; an A/B of the same loop with and without the profiler gives the same figure (docs/eagle3-profile.md).
* **Nothing lost at exit.**  The process's profiler flushes its last partial interval at interpreter exit
  (``atexit``: normal exit, ``sys.exit``, Ctrl-C) and on SIGTERM (a handler that flushes, then lets the signal do
  what it did before).  At exit it reads only what the GPU has finished; it never waits for it.  SIGKILL (SGLang's
  ``kill_process_tree``, the parent-death signal, the OOM killer) and ``os._exit`` cannot be handled.

Every ``EAGLE3_PROFILE_INTERVAL`` decode cycles TP rank 0 logs one line through the worker module's logger,
appends one JSON object to ``EAGLE3_PROFILE_FILE`` (strict JSON, the fields are documented in
docs/eagle3-profile.md) and, when SGLang's metrics are enabled, feeds the Prometheus histograms
``sglang_pcie_eagle_phase_seconds{phase=...}`` and ``sglang_pcie_eagle_accept_length`` (timed cycles).
Other ranks do nothing beyond one attribute check per call.

This package imports neither sglang nor torch at import time.
"""
from __future__ import annotations

import functools
import logging

from sglang_pcie.patches.eagle3_profile.clocks import CudaClock, HostClock, default_clock
from sglang_pcie.patches.eagle3_profile import profiler as profiler_module
from sglang_pcie.patches.eagle3_profile.process import install_exit_flush, process_start_time, run_identity
from sglang_pcie.patches.eagle3_profile.profiler import (DEFAULT_INTERVAL, DRAIN_BATCH, DRAIN_LAG, HOST_BUDGET,
                                                         READ_PER_CALL, SAMPLE_MAX, SAMPLE_START, TIMED_PER_INTERVAL,
                                                         Profiler, cycle_kind)
from sglang_pcie.patches.eagle3_profile.prometheus import ACCEPT_BUCKETS, PHASE_BUCKETS, PrometheusExport
from sglang_pcie.patches.eagle3_profile.ranks import spec_settings
from sglang_pcie.runtime.server_facts import tp_rank, worker_ranks
from sglang_pcie.runtime.server_facts import metrics_enabled, model_name
from sglang_pcie.patches.eagle3_profile.slots import MAX_SPANS, NEXT_MARK, Slot
from sglang_pcie.patches.eagle3_profile.records import (CYCLE, DECODE, HOST_BOUND_BELOW, IDLE, LOG_PREFIX, PHASES,
                                                        PREFILL, QUANTILE_MIN, REPORTED, RESERVOIR, SCHEMA,
                                                        SCHEMA_FAMILY, SCHEMA_MAJOR, SPEC_SETTINGS, IntervalStats,
                                                        Series, accept_at_least, bound, finite, format_line,
                                                        projection, quantile, to_json)
from sglang_pcie.patches.eagle3_profile.tokens import TOKEN_BATCH, V1_ACCEPT_FIELDS, TokenCounter, host_counts
from sglang_pcie.runtime.results import is_patched, mark

__all__ = [
    # the hooks (this module)
    "PATCH_ID", "disabled_reason", "profile_phase", "wrap", "get_profiler", "set_profiler", "flag_untimed_workers",
    # profiler
    "DEFAULT_INTERVAL", "DRAIN_BATCH", "DRAIN_LAG", "HOST_BUDGET", "MAX_SPANS", "NEXT_MARK", "READ_PER_CALL",
    "SAMPLE_MAX", "SAMPLE_START", "TIMED_PER_INTERVAL", "Profiler", "cycle_kind", "Slot",
    # clocks, tokens, process, ranks, prometheus
    "CudaClock", "HostClock", "default_clock", "TOKEN_BATCH", "V1_ACCEPT_FIELDS", "TokenCounter", "host_counts",
    "install_exit_flush", "process_start_time", "run_identity", "metrics_enabled", "model_name", "spec_settings",
    "tp_rank", "worker_ranks", "ACCEPT_BUCKETS", "PHASE_BUCKETS", "PrometheusExport",
    # records
    "CYCLE", "DECODE", "HOST_BOUND_BELOW", "IDLE", "LOG_PREFIX", "PHASES", "PREFILL", "QUANTILE_MIN", "REPORTED",
    "RESERVOIR", "SCHEMA", "SCHEMA_FAMILY", "SCHEMA_MAJOR", "SPEC_SETTINGS", "IntervalStats", "Series",
    "accept_at_least", "bound", "finite", "format_line", "projection", "quantile", "to_json",
]

PATCH_ID = "eagle3-profile"


def disabled_reason(settings) -> str | None:
    """Why profiling is off under ``settings`` (a ``sglang_pcie.runtime.settings.Settings``), or None when it is on:
    the gate of the eagle3-profile patch, which the diffs' guard asks too."""
    from sglang_pcie.runtime import patch_table

    return patch_table.disabled_reason(patch_table.row(PATCH_ID), settings)


def profile_phase(phase: str):
    """Decorator diffs baked by older versions put on the worker methods: what the one guard of the baked diffs
    gives (``wrap`` when profiling is on, else the method itself)."""
    from sglang_pcie.runtime import baked

    return lambda function: baked.guarded(PATCH_ID, function, (phase,))


# --------------------------------------------------------------------------------------------- the wrappers


def wrap(function, phase: str, settings=None):
    """``function`` (a worker method) timed as ``phase`` ("cycle" or one of ``PHASES``); the process's profiler, made
    at the first cycle, from ``settings`` (those the patch was gated with; None: the process's).

    The wrappers take ``*args`` whole (the worker first) and hand them on unchanged: one frame and no tuple built
    per call.  What they cost outside the profiler's own timed spans (their frames, the checks below, handing the
    call on) is measured once by ``calibrate`` and charged per call (see the package docstring)."""
    if phase == CYCLE:
        @functools.wraps(function)
        def timed_cycle(*args, **kwargs):
            profiler = _PROFILER or get_profiler(settings)
            token = profiler.begin_cycle(function, args, kwargs) if profiler.active else None
            if token is None:
                return function(*args, **kwargs)
            try:
                result = function(*args, **kwargs)
            except BaseException:
                profiler.abort_cycle(token)
                raise
            profiler.end_cycle(token, result)
            return result
        wrapper = timed_cycle
    elif phase in PHASES:
        @functools.wraps(function)
        def timed_phase(*args, **kwargs):
            profiler = _PROFILER
            if profiler is None:
                return function(*args, **kwargs)
            profiler.phase_calls += 1  # each call is charged the calibrated cost of this frame
            if profiler._current is None:  # not a timed cycle: nothing more to do
                return function(*args, **kwargs)
            span = profiler.begin_phase(phase)
            if span is None:
                return function(*args, **kwargs)
            try:
                return function(*args, **kwargs)
            finally:
                profiler.end_phase(span)
        wrapper = timed_phase
    else:
        raise ValueError(f"unknown EAGLE phase {phase!r}; expected {CYCLE!r} or one of {', '.join(PHASES)}")
    wrapper.sglang_pcie_phase = phase
    return mark(wrapper, PATCH_ID)


# ----------------------------------------------------------------------------- the wrappers' own host time

CALIBRATION_ROUNDS = 15  # the fastest of these rounds counts (a loaded host only slows a round down)
CALIBRATION_CALLS = 100  # calls per round and kind: well under 1 ms in all on a server CPU, once per process


def _calibration_target(*args, **kwargs):
    return None


def calibrate(profiler: "Profiler") -> None:
    """Measure what the profiler's frames cost outside its timed spans, so that it can charge them: the fastest of
    CALIBRATION_ROUNDS rounds, each CALIBRATION_CALLS calls of
    * the cycle wrapper around a function that does nothing, past an inactive profiler (its frame, the look-up and
      the check, handing the call on), against calling that function directly: charged per cycle;
    * a phase wrapper around it on an untimed cycle (its frame, the checks, the call count, handing the call on):
      charged per phase call;
    * an empty hook of the Profiler (``_hook_probe``), less what its own clock reads see, against an empty loop:
      entering and leaving a hook, charged per hook call.
    Run where the profiler becomes the process's, before its first cycle."""
    clock = profiler_module  # its _now, looked up at each call: the clock the profiler's spans use
    cycle, phase, probe = wrap(_calibration_target, CYCLE), wrap(_calibration_target, PHASES[0]), profiler._hook_probe
    loops = {"empty": None, "direct": _calibration_target, "cycle": cycle, "phase": phase, "probe": probe}
    saved = profiler.active, profiler.phase_calls, profiler._current
    profiler.active, profiler._current = False, None  # the wrappers take their untimed ways
    best = dict.fromkeys(loops, float("inf"))
    try:
        for _ in range(CALIBRATION_ROUNDS):
            for name, function in loops.items():
                profiler._probe_ns = 0
                start = clock._now()
                if function is None:
                    for _ in range(CALIBRATION_CALLS):
                        pass
                else:
                    for _ in range(CALIBRATION_CALLS):
                        function(profiler, None)
                best[name] = min(best[name], clock._now() - start - profiler._probe_ns)
    finally:
        profiler.active, profiler.phase_calls, profiler._current = saved
    profiler.cycle_glue_ns = max(0.0, (best["cycle"] - best["direct"]) / CALIBRATION_CALLS)
    profiler.phase_glue_ns = max(0.0, (best["phase"] - best["direct"]) / CALIBRATION_CALLS)
    profiler.hook_glue_ns = max(0.0, (best["probe"] - best["empty"]) / CALIBRATION_CALLS)


_PROFILER: "Profiler | None" = None  # one per process: SGLang runs one EAGLE worker per scheduler process


def get_profiler(settings=None) -> "Profiler":
    """The process's profiler, made at the first cycle from ``settings`` (``EAGLE3_PROFILE_INTERVAL``,
    ``..._BASELINE_MS``, ``..._FILE``; None: the process's); it flushes at exit."""
    global _PROFILER
    if _PROFILER is None:
        if settings is None:
            from sglang_pcie.runtime.settings import for_process

            settings = for_process()
        _PROFILER = Profiler(interval=settings.eagle3_profile_interval,
                             baseline_ms=settings.eagle3_profile_baseline_ms,
                             path=settings.eagle3_profile_file, exit_flush=True)
        calibrate(_PROFILER)
    return _PROFILER


def set_profiler(profiler: "Profiler | None") -> None:
    """Replace the process's profiler (tests, benchmarks); None: made again from the environment when next needed."""
    global _PROFILER
    _PROFILER = profiler
    if profiler is not None:
        calibrate(profiler)


# ---------------------------------------------------------------------- EAGLE-family workers that are not timed

UNTIMED_FLAG = "sglang_pcie_untimed_warning"


def flag_untimed_workers(create_worker):
    """Wrap ``SpeculativeAlgorithm.create_worker``: an EAGLE-family worker class whose cycle is not timed (multi-layer
    EAGLE, frozen-KV MTP: they override ``forward_batch_generation``) warns once, naming it, at its first cycle."""
    @functools.wraps(create_worker)
    def create_worker_flagging_untimed(self, *args, **kwargs):
        cls = create_worker(self, *args, **kwargs)
        try:
            if isinstance(cls, type) and _eagle_family(self) and not is_patched(
                    getattr(cls, "forward_batch_generation", None), PATCH_ID):
                _warn_at_first_cycle(cls)
        except Exception:  # a flag is a courtesy: never in SGLang's way
            pass
        return cls
    return mark(create_worker_flagging_untimed, PATCH_ID)


def _eagle_family(algorithm) -> bool:
    return any(callable(getattr(algorithm, test, None)) and getattr(algorithm, test)()
               for test in ("is_eagle", "is_eagle3", "is_standalone", "is_frozen_kv_mtp"))


def _warn_at_first_cycle(cls):
    name = "forward_batch_generation"
    own = cls.__dict__.get(name)
    if getattr(own, UNTIMED_FLAG, False):
        return
    cycle = getattr(cls, name)

    @functools.wraps(cycle)
    def first_cycle(self, *args, **kwargs):
        if cls.__dict__.get(name) is first_cycle:  # put the class back first: this runs once
            if own is None:
                delattr(cls, name)
            else:
                setattr(cls, name, own)
            try:
                if worker_ranks(self)["tp_rank"] in (0, None):
                    logging.getLogger(cls.__module__).warning(
                        f"{LOG_PREFIX}: {cls.__name__} ({cls.__module__}) is not timed: EAGLE3_PROFILE times the"
                        " cycle of EAGLEWorker / EAGLEWorkerV2 and of the workers that run it (standalone); this"
                        " worker runs its own, so this server reports no EAGLE profile")
            except Exception:
                pass
        return cycle(self, *args, **kwargs)

    setattr(first_cycle, UNTIMED_FLAG, True)
    setattr(cls, name, first_cycle)
