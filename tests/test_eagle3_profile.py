"""eagle3-profile: the per-phase timers, their statistics and outputs, the report, the patch against the pristine
sources of every covered release, and the real SGLang 0.5.9 (v1 and v2 workers) and 0.5.23 (v2) with the overlay
installed: wrapped only when EAGLE3_PROFILE=1, the release's own methods otherwise."""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import types
from pathlib import Path

import pytest

from sglang_pcie import eagle_profiler as ep
from sglang_pcie import profile_report
from sglang_pcie.base import APPLICABLE, APPLIED, DRIFTED, MARKER_ATTR, NOT_APPLICABLE, Result, SourceTree
from sglang_pcie.diffgen import diff_for
from sglang_pcie.patches.eagle3_profile import PATCH, TARGETS, V1, V2
from sglang_pcie.releases import COVERED_RELEASES
from sglang_pcie.settings import load_settings

REPO = Path(__file__).resolve().parent.parent
RECORD_KEYS = {"schema", "time", "pid", "tp_rank", "worker", "timer", "interval", "decode_cycles", "prefill_cycles",
               "idle_cycles", "decode_requests", "tokens", "accept_length", "phases_ms", "prefill_ms",
               "tokens_per_s", "tokens_per_s_per_request", "wall_s", "baseline_ms", "break_even_accept_length",
               "projected_speedup", "syncs"}


# ------------------------------------------------------------------------------------- statistics (pure)


def test_interval_statistics_means_percentiles_shares_and_projection():
    stats = ep.IntervalStats()
    for draft, verify, extend, cycle in [(1.0, 18.0, 0.5, 20.0), (1.0, 19.0, 0.5, 21.0), (2.0, 20.0, 0.0, 22.5)]:
        stats.add_decode({"draft": draft, "verify": verify, "draft_extend": extend}, cycle, batch_size=2, tokens=4)
    stats.add_prefill(50.0)
    record = stats.record(baseline_ms=12.0, tp_rank=0, worker="W", timer="host", interval=3)
    phases = record["phases_ms"]
    assert phases["cycle"]["mean"] == pytest.approx(21.1666666)
    assert phases["cycle"]["p50"] == 21.0 and phases["cycle"]["p90"] == pytest.approx(22.2)
    assert phases["verify"]["mean"] == 19.0 and phases["verify"]["share"] == pytest.approx(19.0 / 21.1666666)
    assert phases["other"]["mean"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)  # the cycle minus its phases
    assert sum(phases[p]["share"] for p in ("draft", "verify", "draft_extend", "other")) == pytest.approx(1.0)
    assert record["accept_length"] == 2.0  # 12 tokens over 6 request-cycles
    assert record["tokens_per_s"] == pytest.approx(12 / (63.5 / 1e3))
    assert record["tokens_per_s_per_request"] == pytest.approx(2.0 * 1e3 / 21.1666666)
    assert record["break_even_accept_length"] == pytest.approx(21.1666666 / 12.0)
    assert record["projected_speedup"] == pytest.approx(2.0 * 12.0 / 21.1666666)
    assert record["prefill_ms"] == {"mean": 50.0, "p50": 50.0, "p90": 50.0}
    assert set(record) == RECORD_KEYS and record["schema"] == "sglang-pcie.eagle3-profile/1"
    json.dumps(record)  # a JSON-lines object as is


def test_unknown_accept_counts_and_missing_baseline_give_nulls_not_errors():
    stats = ep.IntervalStats()
    stats.add_decode({"verify": 5.0}, 6.0, batch_size=None, tokens=None)
    record = stats.record()
    assert record["accept_length"] is None and record["tokens_per_s"] is None
    assert record["break_even_accept_length"] is None and record["projected_speedup"] is None
    assert "accept_len=n/a" in ep.format_line(record) and "baseline" not in ep.format_line(record)


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

    def __init__(self):
        self.now = 0.0
        self.completed = 0  # marks [0, completed) are done
        self.recorded = 0
        self.waits = 0

    def new_marks(self, count):
        return [None] * count

    def capturing(self):
        return False

    def record(self, marks, index):
        self.now += 1.0
        marks[index] = (self.recorded, self.now)
        self.recorded += 1

    def is_done(self, marks, index):
        return marks[index][0] < self.completed

    def wait(self, marks, index):
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
    shape = property(lambda self: (len(self),))

    def sum(self):
        return sum(self)


class Worker:
    """A worker shaped like SGLang's (cycle calls draft, verify, re-extend); its methods wrapped by ep.wrap."""

    tp_rank = 0

    def __init__(self):
        self.calls = 0

    def forward_batch_generation(self, batch):
        self.calls += 1
        if batch.forward_mode.is_extend():
            return types.SimpleNamespace()
        self.draft(batch)
        self.verify(batch)
        self.draft_extend(batch)
        return types.SimpleNamespace(accept_lens=AcceptLens([2, 1, 3]))

    def draft(self, batch):
        return "drafted"

    def verify(self, batch):
        return "verified"

    def draft_extend(self, batch):
        return "extended"


for _name, _phase in (("forward_batch_generation", "cycle"), ("draft", "draft"), ("verify", "verify"),
                      ("draft_extend", "draft_extend")):
    setattr(Worker, _name, ep.wrap(getattr(Worker, _name), _phase))


def batch(mode="decode"):
    return types.SimpleNamespace(forward_mode=Mode(mode), is_extend_in_batch=False)


@pytest.fixture
def profiler_factory():
    def make(**kwargs):
        profiler = ep.Profiler(**kwargs)
        ep.set_profiler(profiler)
        return profiler
    yield make
    ep.set_profiler(None)


def test_cycles_are_read_only_once_the_gpu_passed_them(profiler_factory):
    clock = GpuTimeline()
    profiler = profiler_factory(interval=8, clock=clock, drain_batch=4, drain_lag=2, read_per_call=2)
    worker = Worker()
    for _ in range(5):
        worker.forward_batch_generation(batch())
    assert profiler.stats.decode_cycles == 0  # the GPU has passed none: nothing read, nothing waited for
    clock.completed = clock.recorded  # the GPU catches up with cycles 1-5
    worker.forward_batch_generation(batch())
    assert profiler.stats.decode_cycles == 2 and clock.waits == 0  # a few per call, not the 4 it could
    worker.forward_batch_generation(batch())
    assert profiler.stats.decode_cycles == 4 and clock.waits == 0
    worker.forward_batch_generation(batch())
    assert profiler.stats.decode_cycles == 5 and clock.waits == 0  # cycle 6 is not finished: left unread
    # a GPU far behind: once batch 4 + lag 2 cycles are unread, the reader waits once for the batch's newest
    for _ in range(3):
        worker.forward_batch_generation(batch())
    assert clock.waits == 1 and profiler.stats.syncs == 0  # the interval (8) was reported: its record has it
    assert profiler.records[-1]["syncs"] == 1 and profiler.records[-1]["decode_cycles"] == 8
    assert profiler.stats.decode_cycles == 1 and len(profiler._pending) == 2


def test_read_per_call_zero_reads_only_in_batches(profiler_factory):
    clock = GpuTimeline()
    profiler = profiler_factory(interval=8, clock=clock, drain_batch=4, drain_lag=2, read_per_call=0)
    worker = Worker()
    for _ in range(5):
        worker.forward_batch_generation(batch())
        clock.completed = clock.recorded
    assert profiler.stats.decode_cycles == 0
    worker.forward_batch_generation(batch())
    assert profiler.stats.decode_cycles == 4 and clock.waits == 0  # the 4 oldest, finished: no wait


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
    assert first["phases_ms"]["other"]["mean"] == 4.0
    assert (first["decode_cycles"], first["prefill_cycles"], first["idle_cycles"]) == (3, 1, 1)
    assert first["prefill_ms"]["mean"] == 1.0  # the prefill cycle: no phases timed inside it
    assert first["tokens"] == 18 and first["decode_requests"] == 9 and first["accept_length"] == 2.0
    assert first["projected_speedup"] == pytest.approx(2.0 * 4.0 / 7.0)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["decode_cycles"] for line in lines] == [3, 1]
    assert all(line["schema"] == ep.SCHEMA and set(line) == RECORD_KEYS for line in lines)
    assert worker.calls == 6


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
    assert len(profiler.records) <= 16 and profiler.stats.decode_cycles < 50
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
    lines = [r for r in caplog.records if ep.LOG_PREFIX in r.getMessage()]
    assert len(lines) == 1 and lines[0].name == __name__ and lines[0].levelno == logging.INFO
    assert profile_report.parse_log_line(lines[0].getMessage())["decode_cycles"] == 2


def test_wrap_refuses_an_unknown_phase_and_marks_what_it_makes():
    with pytest.raises(ValueError, match="'drafting'"):
        ep.wrap(lambda self: None, "drafting")
    wrapped = ep.wrap(Worker.__dict__["draft"].__wrapped__, "draft")
    assert getattr(wrapped, MARKER_ATTR) == "eagle3-profile" and wrapped.sglang_pcie_phase == "draft"


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
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _interval(cycle, verify, accept, cycles, baseline=None):
    stats = ep.IntervalStats()
    for _ in range(cycles):
        stats.add_decode({"draft": 1.0, "verify": verify, "draft_extend": 0.25}, cycle, batch_size=1,
                         tokens=accept)
    return stats.record(baseline_ms=baseline, tp_rank=0, worker="EAGLEWorkerV2", timer="cuda", interval=cycles)


def test_report_from_json_lines(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    _write_run(run, [_interval(20.0, 18.0, 2, 100, baseline=12.0), _interval(24.0, 22.0, 1, 300, baseline=12.0)])
    assert profile_report.main([str(run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["decode_cycles"] == 400 and summary["intervals"] == 2
    assert summary["phases_ms"]["cycle"]["mean"] == pytest.approx(23.0)  # weighted by cycles
    assert summary["accept_length"] == pytest.approx(500 / 400)
    assert summary["break_even_accept_length"] == pytest.approx(23.0 / 12.0)
    assert summary["projected_speedup"] == pytest.approx(1.25 * 12.0 / 23.0)
    assert profile_report.main([str(run), "--baseline-ms", "20"]) == 0
    table = capsys.readouterr().out
    assert "verify" in table and "break-even accept length 1.15" in table and "speedup over the baseline: 1.09x" in table


def test_report_from_a_server_log_matches_the_json_lines(tmp_path, capsys):
    records = [_interval(19.85, 18.67, 2, 200, baseline=13.0), _interval(20.0, 18.8, 1, 200, baseline=13.0)]
    log = tmp_path / "server.log"
    log.write_text("[2026-01-01 10:00:00 TP0] Decode batch. #running-req: 1\n"
                   + "".join(f"[2026-01-01 10:00:0{i} TP0] {ep.format_line(r)}\n" for i, r in enumerate(records)))
    jsonl = tmp_path / "run.jsonl"
    _write_run(jsonl, records)
    from_log = profile_report.summarise(profile_report.read_records(log.read_text().splitlines()))
    from_json = profile_report.summarise(profile_report.read_records(jsonl.read_text().splitlines()))
    for key in ("decode_cycles", "tokens", "decode_requests", "baseline_ms"):
        assert from_log[key] == from_json[key]
    for name in ep.REPORTED:
        assert from_log["phases_ms"][name]["mean"] == pytest.approx(from_json["phases_ms"][name]["mean"], abs=1e-3)
    assert from_log["projected_speedup"] == pytest.approx(from_json["projected_speedup"], rel=1e-3)


def test_report_bad_input(tmp_path, capsys):
    assert profile_report.main([str(tmp_path / "missing.log")]) == 2
    assert "missing.log" in capsys.readouterr().err
    empty = tmp_path / "other.log"
    empty.write_text("nothing about eagle here\n{\"schema\": \"someone-else/1\"}\n")
    assert profile_report.main([str(empty)]) == 1
    assert "no EAGLE3_PROFILE intervals" in capsys.readouterr().err
    assert profile_report.main([str(empty), "--baseline-ms", "0"]) == 2
    assert "--baseline-ms 0.0 is not a positive number" in capsys.readouterr().err


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
for name in modules:
    logging.getLogger(name).addHandler(Capture())
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

def drive(make, rank=0, metrics=False):
    ep.set_profiler(None)  # made again from the environment at the first cycle, as in a server
    del captured[:]
    server_args = ns(enable_dp_attention=False, enable_metrics=metrics, served_model_name="m")
    worker, batch = make(rank, server_args)
    results = [type(worker).forward_batch_generation(worker, batch(mode)).__class__.__name__ for mode in SCHEDULE]
    profiler = ep._PROFILER
    flushed = profiler.flush() if profiler.active else None
    return {"results": results, "active": profiler.active, "records": list(profiler.records),
            "flushed": flushed is not None, "log": list(captured)}

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
    assert out["activation"] == {name: APPLIED for name in out["modules"]}
    assert out["check_runtime"] == APPLIED


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
            assert record["projected_speedup"] == pytest.approx(2.0 * 10 / phases["cycle"]["mean"])
            assert record["timer"] == "host" and record["tp_rank"] == 0 and record["baseline_ms"] == 10.0
        assert not run["flushed"]  # 8 decode cycles: exactly two intervals, nothing partial


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


def test_json_lines_file_holds_one_object_per_interval(profiling_on):
    _, out, path, _ = profiling_on
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    runs = len(out["runs"]) + 2  # the runs above, then the two with metrics on
    assert len(lines) == 2 * runs
    assert all(set(line) == RECORD_KEYS and line["schema"] == ep.SCHEMA for line in lines)
    summary = profile_report.summarise(profile_report.read_records(path.read_text().splitlines()))
    assert summary["decode_cycles"] == 8 * runs and summary["accept_length"] == 2.0


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
