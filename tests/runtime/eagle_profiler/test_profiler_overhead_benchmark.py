"""The profiler's benchmarks run on the host only (no GPU): eagle3_profile_overhead.py --dry-run (its logic, the
invariants of every record, the token paths), eagle3_profile_host_time.py (the A/B's bookkeeping) and
eagle3_profile_invariants.py (a server's file checked record by record)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from sglang_pcie.runtime import eagle_profiler as ep

from support import REPO
from support.eagle_records import META, interval_stats


def test_the_overhead_benchmark_dry_run_still_runs(tmp_path):
    out = tmp_path / "overhead.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "eagle3_profile_overhead.py"), "--dry-run",
                           "--cycles", "250", "--interval", "200", "--warmup", "5", "--repeats", "1",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["regimes"]) == {"gpu-bound", "host-bound"}
    for regime in report["regimes"].values():
        assert set(regime["modes"]) == {"off", "eagle3-profile", "eagle3-profile-every-cycle", "host-synchronised"}
        checks = {c["name"]: c["ok"] for c in regime["invariants"]}
        assert checks["eagle3-profile: accept length exact (scheduler host copy)"] is True
        assert checks["eagle3-profile-every-cycle: accept length sampled (own pinned copy)"] is True
        assert checks[f"eagle3-profile: every full interval has {20} timed cycles with a wall time (p50/p90 given)"]
        assert all(ok for name, ok in checks.items() if "phases <= cycle <= wall cycle" in name)
        assert all(ok is not False for ok in checks.values()), checks


def test_the_host_time_benchmark_runs(tmp_path):
    out = tmp_path / "host.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "eagle3_profile_host_time.py"), "--cycles", "50",
                           "--rounds", "3", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert set(results["samplings"]) == {"as shipped", "every cycle timed"}
    for sampling in results["samplings"].values():
        assert len(sampling["rounds"]["a_us"]) == len(sampling["rounds"]["b_us"]) == 3
        assert sampling["added_us"] > 0 and sampling["reported_us"] > 0
    assert "reported" in proc.stdout and "added" in proc.stdout


def test_the_invariants_checker_names_a_record_that_breaks_one(tmp_path):
    good = interval_stats([(1.0, 8.0, 0.5, 10.0, 10.5)] * 24, decode_cycles=200).record(**META)
    broken = interval_stats([(1.0, 8.0, 0.5, 10.0, 9.5)] * 24, decode_cycles=200).record(**META)
    path = tmp_path / "profile.jsonl"
    path.write_text(ep.to_json(good) + "\n" + ep.to_json(broken) + "\n")
    script = str(REPO / "benchmarks" / "eagle3_profile_invariants.py")
    proc = subprocess.run([sys.executable, script, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].endswith("ok") and "cycle 10.0000 > timed wall cycle 9.5000 ms" in lines[2]
    assert "GPU busy 105.26%" in lines[2] and lines[-1] == "1 of 2 records hold every invariant"
    path.write_text(ep.to_json(good) + "\n")
    assert subprocess.run([sys.executable, script, str(path)], capture_output=True, timeout=120).returncode == 0


def test_the_invariants_checker_reads_schema_3_and_checks_schema_4s_histogram(tmp_path):
    good = interval_stats([(1.0, 8.0, 0.5, 10.0, 10.5)] * 24, decode_cycles=200).record(**META, spec_draft_tokens=2)
    assert good["accept_hist"] == [0, 0, 400]
    old = {key: value for key, value in good.items() if key not in {
        "spec_steps", "spec_topk", "spec_draft_tokens", "accept_hist", "accept_at_least", "draft_step_ms"}}
    old["schema"] = "sglang-pcie.eagle3-profile/3"
    off = {**good, "accept_hist": [0, 1, 399]}  # one request-verify moved: one token short of the record's
    short = {**good, "accept_hist": [0, 0, 400, 0]}  # an entry more than spec_draft_tokens + 1
    path = tmp_path / "profile.jsonl"
    path.write_text("".join(ep.to_json(r) + "\n" for r in (good, old, off, short)))
    script = str(REPO / "benchmarks" / "eagle3_profile_invariants.py")
    proc = subprocess.run([sys.executable, script, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].endswith("ok") and lines[2].endswith("ok")
    assert "accept_hist: 400 request-verifies, 799 tokens against 400, 800" in lines[3]
    assert "accept_hist: 4 entries for 2 draft tokens" in lines[4]
    assert lines[-1] == "2 of 4 records hold every invariant"


BREAKDOWN = r'''
import json, os, runpy, sys
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
import eagle3_profile_server_breakdown as breakdown  # installs itself: EAGLE3_BREAKDOWN_OUT is set
host_time = runpy.run_path(os.path.join(sys.argv[1], "benchmarks", "eagle3_profile_host_time.py"))
host_time["measure"](4, 300, 1)
breakdown._write()
'''


def test_the_server_breakdown_times_the_profilers_methods_where_it_is_loaded(tmp_path):
    """benchmarks/eagle3_profile_server_breakdown.py, as a .pth line loads it in a server's processes: it wraps the
    profiler's methods and writes what each cost per cycle; without EAGLE3_BREAKDOWN_OUT it does nothing."""
    env = {**os.environ, "EAGLE3_BREAKDOWN_OUT": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", BREAKDOWN, str(REPO)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (written,) = tmp_path.glob("breakdown-*.json")
    figures = json.loads(written.read_text())
    methods = figures["methods"]
    assert figures["cycles"] == methods["Profiler.end_cycle"]["calls"] >= 600
    assert methods["Profiler.begin_cycle"]["calls"] == figures["cycles"] and methods["Profiler._open_slot"]["calls"] > 0
    assert methods["Profiler.begin_cycle"]["us_per_cycle"] > 0 and figures["threads"] and figures["gc"]["threshold"]
    off = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1] + '/benchmarks');"
                          " import eagle3_profile_server_breakdown as b; from sglang_pcie.runtime.eagle_profiler"
                          " import Profiler; print(Profiler.begin_cycle.__module__)", str(REPO)],
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "EAGLE3_BREAKDOWN_OUT"})
    assert off.stdout.strip() == "sglang_pcie.runtime.eagle_profiler.profiler", off.stderr[-2000:]
