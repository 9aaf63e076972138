"""sglang-pcie profile-report: JSON lines and server logs, runs, malformed records."""
from __future__ import annotations

import json

import pytest
from sglang_pcie.tools.cli import main as cli_main

from support.eagle_records import META, interval_stats

from sglang_pcie.patches.eagle3_profile import payload as ep
from sglang_pcie.tools import profile_report
from sglang_pcie.tools.profile_report import records as profile_records


# ------------------------------------------------------------------------------------------- report


def _write_run(path, records):
    path.write_text("".join(ep.to_json(r) + "\n" for r in records))


def _interval(cycle, verify, accept, cycles, baseline=None, run="20261130T100000Z-42", started=1796032800.0,
              timed=None, wall_cycle_ms=None):
    timed = cycles if timed is None else timed
    stats = interval_stats([(1.0, verify, 0.25, cycle)] * timed, decode_cycles=cycles, batch_size=1, tokens=accept,
                   wall_cycle_ms=wall_cycle_ms or cycle * 1.25)
    return stats.record(baseline_ms=baseline, **{**META, "run_id": run, "run_started": started})


def test_report_from_json_lines(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    _write_run(run, [_interval(20.0, 18.0, 2, 100, baseline=12.0, timed=10, wall_cycle_ms=25.0),
                     _interval(24.0, 22.0, 1, 300, baseline=12.0, timed=30, wall_cycle_ms=25.0)])
    assert cli_main(["profile-report", str(run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["decode_cycles"] == 400 and summary["intervals"] == 2 and summary["timed_cycles"] == 40
    assert summary["phases_ms"]["cycle"]["mean"] == pytest.approx(23.0)  # weighted by timed cycles
    assert summary["accept_length"] == pytest.approx(500 / 400) and summary["accept_length_exact"]
    assert summary["wall_cycle_ms"] == pytest.approx(25.0) and summary["gpu_busy"] == pytest.approx(23.0 / 25.0)
    assert summary["timed_wall_cycle_ms"] == pytest.approx(25.0) and summary["gpu_busy_over"] == "timed cycles"
    # percentiles only from the interval with at least QUANTILE_MIN timed cycles (30), with that count
    cycle = summary["phases_ms"]["cycle"]
    assert (cycle["n"], cycle["percentile_n"], cycle["p50"]) == (40, 30, pytest.approx(24.0))
    assert summary["tokens_per_s_served"] == pytest.approx(500 / (400 * 0.025))
    assert summary["phases_sum_ms"] <= summary["cycle_ms"] <= summary["wall_cycle_ms"]
    assert summary["break_even_accept_length"] == pytest.approx(25.0 / 12.0)
    assert summary["projected_speedup"] == pytest.approx(1.25 * 12.0 / 25.0)
    assert summary["run_id"] == "20261130T100000Z-42" and summary["ranks"]["tp_rank"] == [0]
    assert cli_main(["profile-report", str(run), "--baseline-ms", "20"]) == 0
    table = capsys.readouterr().out
    assert "verify" in table and "break-even accept length 1.25" in table
    assert "speedup over the baseline: 1.00x" in table
    assert "GPU busy 92%: GPU-bound" in table and "tokens/s served (wall time): 50.0" in table
    assert "(the same timed cycles)" in table and "at least 20 timed cycles, 30 cycles" in table
    assert [line.split()[:2] for line in table.splitlines() if line.startswith("cycle ")] == [["cycle", "40"]]


def test_report_separates_runs_newest_by_default(tmp_path, capsys):
    path = tmp_path / "appended.jsonl"
    old = [_interval(20.0, 18.0, 2, 100, run="20261129T080000Z-7", started=1795939200.0)] * 2
    new = [_interval(30.0, 28.0, 3, 50, run="20261130T090000Z-9", started=1796029200.0)]
    other_rank = [_interval(40.0, 38.0, 1, 10, run="20261130T085959Z-8", started=1796029199.0)]
    _write_run(path, new + old + other_rank)  # file order is not age order
    assert cli_main(["profile-report", str(path), "--json"]) == 0
    newest = json.loads(capsys.readouterr().out)
    assert newest["run_id"] == "20261130T090000Z-9" and newest["decode_cycles"] == 50
    assert cli_main(["profile-report", str(path)]) == 0
    text = capsys.readouterr().out
    assert "newest of 3 runs" in text and "20261129T080000Z-7" in text
    assert cli_main(["profile-report", str(path), "--run", "20261129T080000Z-7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decode_cycles"] == 200
    assert cli_main(["profile-report", str(path), "--all", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["run_id"] for r in runs] == ["20261129T080000Z-7", "20261130T085959Z-8", "20261130T090000Z-9"]
    assert cli_main(["profile-report", str(path), "--run", "nope"]) == 2
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
    assert cli_main(["profile-report", str(path), "--all", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["run_id"], r["decode_cycles"], r["timed_cycles"]) for r in runs] == [("pid-5", 200, 200),
                                                                                     ("log", 200, 200)]
    assert all(r["accept_length"] == pytest.approx(1.73) for r in runs)


def test_report_reads_schema_2_records_with_their_gpu_busy_over_every_cycle(tmp_path, capsys):
    """Schema 2 had no wall time of the timed cycles: GPU busy stays the old division, and says so; its intervals'
    percentiles from fewer than QUANTILE_MIN timed cycles are not used."""
    record = _interval(20.0, 18.0, 2, 200, timed=8, wall_cycle_ms=19.0)
    record["schema"] = "sglang-pcie.eagle3-profile/2"
    del record["timed_wall_cycle_ms"]
    for entry in record["phases_ms"].values():
        entry.pop("n")
        entry["p50"] = entry["p90"] = entry["mean"]
    path = tmp_path / "v2.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert cli_main(["profile-report", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["gpu_busy"] == pytest.approx(20.0 / 19.0) and summary["gpu_busy_over"] == "every cycle"
    assert summary["timed_wall_cycle_ms"] is None and summary["phases_ms"]["cycle"]["n"] == 8
    assert summary["phases_ms"]["cycle"]["p50"] is None and summary["phases_ms"]["cycle"]["percentile_n"] == 0
    assert cli_main(["profile-report", str(path)]) == 0
    text = capsys.readouterr().out
    assert "GPU busy 105%" in text and "not the same cycles; may exceed 100%" in text


MALFORMED = [
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": 5}', "no phases_ms.cycle"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "phases_ms": {"cycle": {"mean": 1}}}', "no decode_cycles"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": "many", "phases_ms": {"cycle": {}}}',
     "decode_cycles='many' is not a number"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": 5, "phases_ms": {"cycle": {"mean": "x"}}}',
     "mean='x' is not a number"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": 5, "phases_ms": {"cycle": 3}}',
     "no phases_ms.cycle"),
    ('{"schema": "sglang-pcie.eagle3-profile/5", "decode_cycles": 5, "phases_ms": {"cycle": {"mean": 1}}}',
     "schema sglang-pcie.eagle3-profile/5 is newer than this sglang-pcie reads"),
    ('{"schema": "sglang-pcie.eagle3-profile/4", "decode_cycles": 5, "phases_ms": {"cycle": {"mean": 1}},'
     ' "accept_hist": [0, -2]}', "accept_hist=[0, -2] is not a list of counts"),
    ('{"schema": "sglang-pcie.eagle3-profile/x"}', "has no major number"),
    ('{"schema": "sglang-pcie.eagle3-profile/2", "decode_cycles": 5', "not valid JSON"),
    ("[TP0] sglang-pcie eagle3-profile [timer=cuda syncs=0]: decode_cycles=5 | accept_len=2.00",
     "without decode_cycles or the cycle phase"),
]


def test_a_malformed_or_newer_record_is_named_in_one_line_and_skipped(tmp_path, capsys):
    good = _interval(20.0, 18.0, 2, 100)
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(line + "\n" for line, _ in MALFORMED) + ep.to_json(good) + "\n")
    assert cli_main(["profile-report", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["decode_cycles"] == 100
    lines = captured.err.splitlines()
    assert len(lines) == len(MALFORMED) and "Traceback" not in captured.err
    for number, (line, reason) in enumerate(MALFORMED, 1):
        assert f"skipped {path}:{number}: " in lines[number - 1] and reason in lines[number - 1], lines[number - 1]
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("".join(line + "\n" for line, _ in MALFORMED * 2))
    assert cli_main(["profile-report", str(only_bad)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == profile_report.MAX_SKIP_LINES + 2
    assert f"skipped {2 * len(MALFORMED) - profile_report.MAX_SKIP_LINES} more records" in err[-2]


def _counted(cycles, batch_size, tokens_per_cycle, known_cycles=None, wall_cycle_ms=10.0, cycle_ms=8.0):
    """An interval of ``cycles`` decode cycles of ``batch_size`` requests each, 20 of them timed; the tokens of
    ``known_cycles`` of them known (all by default: exact)."""
    stats = interval_stats([(1.0, cycle_ms - 2.0, 0.5, cycle_ms)] * 20, decode_cycles=0,
                           wall_cycle_ms=wall_cycle_ms)
    known = cycles if known_cycles is None else known_cycles
    for index in range(cycles):
        stats.decode_cycles += 1
        stats.requests_all += batch_size
        if index < known:
            stats.add_tokens(batch_size, tokens_per_cycle)
    stats.wall_start, stats.wall_end = 0, int(cycles * wall_cycle_ms * 1e6)
    stats.wall_cycle_ns, stats.wall_cycles = int((cycles - 1) * wall_cycle_ms * 1e6), cycles - 1
    return stats.record(**META)


def _summary(tmp_path, records):
    path = tmp_path / "run.jsonl"
    _write_run(path, records)
    return profile_report.summarise(profile_report.read_records(path.read_text().splitlines()))


def test_the_accept_length_is_over_every_request_cycle_not_a_mean_of_the_intervals(tmp_path):
    """A decision pinned: the run's accept length is all tokens over all request-cycles, so a busy interval weighs
    by its requests: 100 cycles of 1 request at 4 tokens and 100 of 9 requests at 2 tokens each give 2.2, not the
    intervals' mean of 3.0."""
    summary = _summary(tmp_path, [_counted(100, 1, 4), _counted(100, 9, 18)])
    assert (summary["tokens"], summary["decode_requests"]) == (2200, 1000)
    assert summary["accept_length"] == pytest.approx(2.2) and summary["accept_length_exact"]


def test_an_inexact_interval_is_scaled_to_all_its_requests(tmp_path):
    """A decision pinned: where only some cycles' tokens are known (no host copy from SGLang: the timed cycles count
    their own), the accept length uses the known request-cycles only, and the served and GPU-time tokens/s scale
    that interval's accept length to all its requests: 20 known cycles of 2 requests at 3 tokens each (accept 3.0)
    stand for 100 x 2 requests, 600 tokens."""
    exact, inexact = _counted(100, 2, 4), _counted(100, 2, 6, known_cycles=20)
    assert not inexact["accept_length_exact"] and inexact["tokens_per_s_served"] == pytest.approx(600 / 1.0)
    summary = _summary(tmp_path, [exact, inexact])
    assert summary["accept_length"] == pytest.approx((400 + 120) / (200 + 40)) and not summary["accept_length_exact"]
    assert (summary["tokens"], summary["decode_requests"], summary["requests_all"]) == (520, 240, 400)
    assert summary["wall_s"] == pytest.approx(2.0)
    assert summary["tokens_per_s_served"] == pytest.approx((400 + 600) / 2.0)  # not the 520 tokens counted
    assert summary["tokens_per_s_gpu"] == pytest.approx((400 + 600) / (200 * 8.0 / 1e3))


def _good(cycle_ms=2.91, timed=20):
    return _interval(cycle_ms, cycle_ms - 1.5, 2, 200, timed=timed, wall_cycle_ms=4.7)


def _altered(path, value):
    record = json.loads(ep.to_json(_good()))
    *parents, key = path.split(".")
    holder = record
    for parent in parents:
        holder = holder[parent]
    holder[key] = value
    return json.dumps(record)


IMPOSSIBLE = [  # one field of a good record (cycle 2.91 ms, verify 1.41, draft 1.0, re-extend 0.25) made impossible
    ("phases_ms.cycle.mean", -1.94, "phases_ms.cycle.mean = -1.94 ms is negative"),
    ("phases_ms.verify.p90", -0.5, "phases_ms.verify.p90 = -0.5 ms is negative"),
    ("phases_ms.cycle.p50", 5.0, "phases_ms.cycle: p50 5.0 ms above p90 2.91 ms"),
    ("phases_ms.verify.mean", 9.0, "phases sum to 10.250 ms, above the 2.910 ms cycle they ran in"),
    ("timed_wall_cycle_ms", 1.5, "the 2.910 ms cycle is longer than its own 1.500 ms wall time"),
    ("wall_cycle_ms", -4.7, "wall_cycle_ms = -4.7 is negative"),
    ("wall_s", -0.9, "wall_s = -0.9 is negative"),
    ("profiler_host_us_per_cycle", -3.0, "profiler_host_us_per_cycle = -3.0 is negative"),
    ("timed_cycles", 201, "201 timed cycles of 200"),
    ("tokens", 100, "100 tokens for 200 request-cycles"),
]


def test_records_with_impossible_times_are_skipped_and_named(tmp_path, capsys):
    """Issue: a record with a negative cycle time was summed in: the run's cycle mean came out 1.94 ms instead of
    2.91.  Each record below breaks one thing a measurement cannot; each is skipped with one line naming it."""
    path = tmp_path / "run.jsonl"
    lines = [ep.to_json(_good()), ep.to_json(_good())] + [_altered(p, v) for p, v, _ in IMPOSSIBLE]
    lines.append(_altered("phases_ms.cycle.mean", float("nan")))  # NaN: Python's JSON reads it
    lines.append(ep.format_line(_good()).replace("cycle n=20 mean=2.910", "cycle n=20 mean=-1.940"))
    path.write_text("\n".join(lines) + "\n")
    assert cli_main(["profile-report", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["intervals"] == 2 and summary["phases_ms"]["cycle"]["mean"] == pytest.approx(2.91)
    err = captured.err.splitlines()
    reasons = [reason for _, _, reason in IMPOSSIBLE] + ["mean=nan is not a number", "is negative"]
    assert len(err) == profile_report.MAX_SKIP_LINES + 1 and "skipped 2 more records" in err[-1]
    for number, (line, reason) in enumerate(zip(err[:-1], reasons), 3):
        assert f"skipped {path}:{number}: " in line and reason in line, (line, reason)


def test_the_issues_run_cycle_mean_2_91_not_1_94(tmp_path, capsys, monkeypatch):
    """Two intervals of 20 timed cycles at 2.91 ms and one of 10 whose cycle mean came out -1.94 ms: summed in, the
    run's mean cycle would be 1.94 ms (as the issue saw; shown with the check removed); skipped, it is 2.91."""
    path = tmp_path / "run.jsonl"
    bad = json.loads(_altered("phases_ms.cycle.mean", -1.94))
    bad["phases_ms"]["cycle"]["n"] = 10
    path.write_text("\n".join([ep.to_json(_good()), ep.to_json(_good()), json.dumps(bad)]) + "\n")
    assert cli_main(["profile-report", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["phases_ms"]["cycle"]["mean"] == pytest.approx(2.91)
    monkeypatch.setattr(profile_records, "impossible", lambda record: None)
    assert cli_main(["profile-report", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["phases_ms"]["cycle"]["mean"] == pytest.approx(1.94)


def test_report_bad_input(tmp_path, capsys):
    assert cli_main(["profile-report", str(tmp_path / "missing.log")]) == 2
    assert "missing.log" in capsys.readouterr().err
    empty = tmp_path / "other.log"
    empty.write_text("nothing about eagle here\n{\"schema\": \"someone-else/1\"}\n")
    assert cli_main(["profile-report", str(empty)]) == 1
    assert "no EAGLE3_PROFILE intervals" in capsys.readouterr().err
    assert cli_main(["profile-report", str(empty), "--baseline-ms", "0"]) == 2
    assert "--baseline-ms 0.0 is not a positive number" in capsys.readouterr().err
    assert cli_main(["profile-report", str(empty), "--baseline-ms", "inf"]) == 2


def test_report_help_has_no_raw_markup_and_every_option_is_explained(capsys):
    assert cli_main(["profile-report", "--help"]) == 0
    text = capsys.readouterr().out
    assert "`" not in text and "--run ID" in text and "--all" in text
    for action in subparser("profile-report")._actions:
        assert action.help, action.option_strings


def subparser(name):
    import argparse

    from sglang_pcie.tools import cli

    action = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


# ------------------------------------------------------------------- schema 4: acceptance per depth, settings


def _spec_interval(hist, draft_ms=0.9, cycles=100, timed=20, spec=(3, 1, 4), run="20261130T100000Z-42"):
    """An interval of ``cycles`` decode cycles whose request-verifies emitted ``hist`` (index: tokens), with
    ``timed`` timed cycles of a ``draft_ms`` draft phase and the speculative settings ``spec``."""
    stats = interval_stats([(draft_ms, 6.0, 0.5, 8.0)] * timed, decode_cycles=0, wall_cycle_ms=10.0)
    stats.decode_cycles = cycles
    requests, tokens = sum(hist), sum(n * c for n, c in enumerate(hist))
    stats.requests_all = requests
    stats.add_tokens(requests, tokens, hist)
    stats.token_cycles = cycles
    stats.wall_start, stats.wall_end = 0, int(cycles * 10.0 * 1e6)
    stats.wall_cycle_ns, stats.wall_cycles = int((cycles - 1) * 10.0 * 1e6), cycles - 1
    settings = dict(zip(("spec_steps", "spec_topk", "spec_draft_tokens"), spec))
    return stats.record(**{**META, "run_id": run}, **settings)


def test_the_run_pools_the_histograms_and_shows_the_acceptance_per_depth(tmp_path, capsys):
    """The run's accept_hist is the sum of its intervals' counts and accept_at_least is recomputed from it (not a
    mean of the intervals' shares); the settings and the draft step (the draft phase's mean over the timed cycles /
    the steps) come with it, in the JSON (bench's read_profile hands on this summary) and in the text."""
    first = _spec_interval([0, 10, 20, 30, 40], draft_ms=0.9, timed=20)
    second = _spec_interval([0, 90, 5, 3, 2], draft_ms=1.5, timed=10)
    assert first["accept_at_least"] == pytest.approx([0.9, 0.7, 0.4])
    path = tmp_path / "run.jsonl"
    _write_run(path, [first, second])
    assert cli_main(["profile-report", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["accept_hist"] == [0, 100, 25, 33, 42]
    assert summary["accept_at_least"] == pytest.approx([100 / 200, 75 / 200, 42 / 200])
    assert (summary["spec_steps"], summary["spec_topk"], summary["spec_draft_tokens"]) == (3, 1, 4)
    assert summary["draft_step_ms"] == pytest.approx((0.9 * 20 + 1.5 * 10) / 30 / 3)
    assert summary["draft_step_ms"] == pytest.approx(summary["phases_ms"]["draft"]["mean"] / 3)
    assert summary["tokens"] == sum(n * c for n, c in enumerate(summary["accept_hist"]))
    assert summary["decode_requests"] == sum(summary["accept_hist"])
    assert cli_main(["profile-report", str(path)]) == 0
    text = capsys.readouterr().out
    assert "speculative settings: 3 steps, topk 1, 4 draft tokens; draft step 0.367 ms" in text
    assert "accept at least j drafts: 1: 50.0%  2: 37.5%  3: 21.0% (n=200 request-verifies)" in text
    from sglang_pcie.tools.bench import analysis  # bench reads the profile through profile-report: same keys
    profile = analysis.read_profile(path)
    for key in ("accept_hist", "accept_at_least", "spec_steps", "spec_topk", "spec_draft_tokens", "draft_step_ms"):
        assert profile[key] == pytest.approx(summary[key]), key


def test_schema_3_records_and_nulls_read_as_no_histogram(tmp_path, capsys):
    """A schema 3 record (no accept_hist, no settings) still reads: its histogram and settings are null, so the run
    has none and the text says nothing of them; a schema 4 record whose histogram is null (the profiler's own sums)
    adds nothing to the pooled one."""
    old = json.loads(ep.to_json(_interval(20.0, 18.0, 2, 100)))
    old["schema"] = "sglang-pcie.eagle3-profile/3"
    for key in ("spec_steps", "spec_topk", "spec_draft_tokens", "accept_hist", "accept_at_least", "draft_step_ms"):
        del old[key]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    assert cli_main(["profile-report", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["decode_cycles"] == 100 and summary["accept_length"] == 2.0
    assert all(summary[key] is None for key in ("accept_hist", "accept_at_least", "spec_steps", "spec_topk",
                                                 "spec_draft_tokens", "draft_step_ms"))
    assert cli_main(["profile-report", str(path)]) == 0
    text = capsys.readouterr().out
    assert "accept at least" not in text and "speculative settings" not in text
    own = _spec_interval([0, 10, 20, 30, 40])
    own["accept_hist"] = own["accept_at_least"] = None
    _write_run(path, [own, _spec_interval([0, 1, 2, 3, 4])])
    summary = profile_report.summarise(profile_report.read_records(path.read_text().splitlines()))
    assert summary["accept_hist"] == [0, 1, 2, 3, 4] and summary["decode_requests"] == 110


def test_the_log_line_carries_the_histogram_and_the_settings(tmp_path):
    records = [_spec_interval([0, 10, 20, 30, 40]), _spec_interval([0, 90, 5, 3, 2], spec=(None, None, None))]
    line = ep.format_line(records[0])
    assert "accept_hist=0,10,20,30,40 spec=3/1/4" in line
    assert "accept_hist=0,90,5,3,2 spec=-/-/-" in ep.format_line(records[1])
    parsed = [profile_report.parse_log_line(ep.format_line(r)) for r in records]
    assert parsed[0]["schema"] == "sglang-pcie.eagle3-profile/4" and parsed[0]["accept_hist"] == [0, 10, 20, 30, 40]
    assert (parsed[0]["spec_steps"], parsed[0]["spec_topk"], parsed[0]["spec_draft_tokens"]) == (3, 1, 4)
    assert parsed[1]["spec_steps"] is None and parsed[1]["accept_hist"] == [0, 90, 5, 3, 2]
    log = tmp_path / "server.log"
    log.write_text("".join(f"[TP0] {ep.format_line(r)}\n" for r in records))
    summary = profile_report.summarise(profile_report.read_records(log.read_text().splitlines()))
    assert summary["accept_hist"] == [0, 100, 25, 33, 42] and summary["spec_steps"] == 3
    null = {**records[0], "accept_hist": None}
    assert profile_report.parse_log_line(ep.format_line(null))["accept_hist"] is None


def test_a_histogram_that_does_not_add_up_to_the_records_counts_is_impossible(tmp_path, capsys):
    """It counts the same request-verifies as tokens and decode_requests: a record where it does not is skipped."""
    good = _spec_interval([0, 10, 20, 30, 40])
    path = tmp_path / "run.jsonl"
    lines = [ep.to_json(good), ep.to_json({**good, "accept_hist": [0, 10, 20, 30, 41]}),
             ep.to_json({**good, "accept_hist": [0, 11, 20, 29, 40]}),
             ep.to_json({**good, "accept_hist": [0, 1.5]}), ep.to_json({**good, "accept_hist": "0,1"})]
    path.write_text("\n".join(lines) + "\n")
    assert cli_main(["profile-report", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["intervals"] == 1
    err = captured.err.splitlines()
    assert "accept_hist counts 101 request-verifies and 304 tokens, not the record's 100 and 300" in err[0]
    assert "accept_hist counts 100 request-verifies and 298 tokens" in err[1]
    assert "is not a list of counts" in err[2] and "is not a list of counts" in err[3] and len(err) == 4
