"""Where the EAGLE profiler's host time goes inside a real SGLang server (a benchmark aid for GPU machines, never
installed by sglang-pcie).

Loaded by a ``.pth`` line that a GPU script drops into the server's site-packages (``import
eagle3_profile_server_breakdown``); it does nothing unless ``EAGLE3_BREAKDOWN_OUT`` names a folder.  Then, in every
process of that server, it wraps the profiler's methods (and its clock's and token counter's) at class level, times
each call with ``perf_counter_ns`` (inclusive: end_cycle includes the reads it makes), counts the garbage
collections and their time that fall inside each call, and every 256 cycles (and at exit) writes
``breakdown-PID.json`` there: per method calls / total us / GC inside, the process's GC totals, the profiler's own
figures (its reported host time, its calibrated glue) and each thread's CPU time from /proc (is another Python thread
competing for the GIL when a CUDA call releases it?).

The wrappers cost host time of their own: a run with this loaded is for the breakdown, not for an A/B."""
from __future__ import annotations

import atexit
import gc
import json
import os
import threading
import time

_now = time.perf_counter_ns
OUT = os.environ.get("EAGLE3_BREAKDOWN_OUT")
WRITE_EVERY = 256  # end_cycle calls between two writes

METHODS = {
    "sglang_pcie.patches.eagle3_profile.profiler:Profiler": (
        "begin_cycle", "end_cycle", "begin_phase", "end_phase", "_read_finished", "_drain", "_take", "_close",
        "_report", "_open_slot", "_end_timed_wall", "_decode_turn"),
    "sglang_pcie.patches.eagle3_profile.tokens:TokenCounter": ("count", "collect_stash", "sum_copies"),
    "sglang_pcie.patches.eagle3_profile.clocks:CudaClock": ("record", "is_done", "elapsed_ms", "capturing", "wait"),
    "sglang_pcie.patches.eagle3_profile.slots:Slot": ("times", "reset"),
    "sglang_pcie.patches.eagle3_profile.records:IntervalStats": ("add_timed", "record"),
}

_stats = {}  # "Class.method" -> [calls, ns, gc collections inside, gc ns inside]
_gc = {"collections": [0, 0, 0], "ns": [0, 0, 0], "start": 0, "total_ns": 0}
_state = {"cycles": 0, "first": None, "last": None, "written": 0}


def _gc_callback(phase, info):
    if phase == "start":
        _gc["start"] = _now()
    else:
        spent = _now() - _gc["start"]
        generation = info.get("generation", 0)
        _gc["collections"][generation] += 1
        _gc["ns"][generation] += spent
        _gc["total_ns"] += spent


def _timed(name, method):
    entry = _stats.setdefault(name, [0, 0, 0, 0])

    def call(*args, **kwargs):
        gc_before, collections_before = _gc["total_ns"], sum(_gc["collections"])
        start = _now()
        try:
            return method(*args, **kwargs)
        finally:
            entry[0] += 1
            entry[1] += _now() - start
            entry[2] += sum(_gc["collections"]) - collections_before
            entry[3] += _gc["total_ns"] - gc_before
            if name == "Profiler.end_cycle":
                _cycle_done(args[0])
    call.__name__ = method.__name__
    call.__qualname__ = getattr(method, "__qualname__", method.__name__)
    return call


def _cycle_done(profiler):
    now = _now()
    _state["cycles"] += 1
    _state["first"] = _state["first"] or now
    _state["last"] = now
    _state["profiler"] = profiler
    if _state["cycles"] % WRITE_EVERY == 0:
        _write()


def _threads() -> list:
    rows = []
    tick = os.sysconf("SC_CLK_TCK")
    for tid in sorted(os.listdir("/proc/self/task")):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            rows.append({"tid": int(tid), "comm": comm, "state": fields[0],
                         "cpu_s": (int(fields[11]) + int(fields[12])) / tick})
        except OSError:
            continue
    return rows


def _write():
    if not _state["cycles"]:
        return
    profiler = _state.get("profiler")
    figures = {}
    if profiler is not None:
        figures = {"host_ns_so_far": profiler.host_ns_so_far(), "cycle_glue_ns": profiler.cycle_glue_ns,
                   "phase_glue_ns": profiler.phase_glue_ns, "hook_glue_ns": profiler.hook_glue_ns,
                   "sample_every": profiler.sample_every, "interval": profiler.interval}
    cycles = _state["cycles"]
    out = {"pid": os.getpid(), "cycles": cycles, "span_s": (_state["last"] - _state["first"]) / 1e9,
           "python_threads": [t.name for t in threading.enumerate()],
           "methods": {name: {"calls": s[0], "us_total": s[1] / 1e3, "us_per_cycle": s[1] / 1e3 / cycles,
                              "us_per_call": s[1] / 1e3 / s[0] if s[0] else None, "gc_inside": s[2],
                              "gc_us_inside": s[3] / 1e3}
                       for name, s in sorted(_stats.items())},
           "gc": {"collections": _gc["collections"], "us": [n / 1e3 for n in _gc["ns"]],
                  "threshold": gc.get_threshold(), "count": gc.get_count(), "frozen": gc.get_freeze_count()},
           "profiler": figures, "threads": _threads()}
    path = os.path.join(OUT, f"breakdown-{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(path + ".tmp", path)


def install():
    import importlib

    os.makedirs(OUT, exist_ok=True)
    for target, names in METHODS.items():
        module_name, class_name = target.split(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        for name in names:
            setattr(cls, name, _timed(f"{class_name}.{name}", getattr(cls, name)))
    gc.callbacks.append(_gc_callback)
    atexit.register(_write)


if OUT:
    install()
