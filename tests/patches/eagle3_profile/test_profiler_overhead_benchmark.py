"""The profiler's benchmarks, run as programs on the host only (no GPU): eagle3_profile_overhead.py --dry-run (its
logic, the invariants of every record, the token paths), eagle3_profile_host_time.py (the A/B's bookkeeping) and
eagle3_profile_invariants.py (a server's file checked record by record)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from sglang_pcie.patches.eagle3_profile import payload as ep

from support import REPO, run_benchmark
from support.eagle_records import META, interval_stats


def test_the_overhead_benchmark_dry_run_still_runs(tmp_path):
    out = tmp_path / "overhead.json"
    proc = run_benchmark("eagle3_profile_overhead", "--dry-run", "--cycles", "250", "--interval", "200", "--warmup",
                         "5", "--repeats", "1", "--out", out)
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
    proc = run_benchmark("eagle3_profile_host_time", "--cycles", "50", "--rounds", "3", "--out", out)
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
    proc = run_benchmark("eagle3_profile_invariants", path, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].endswith("ok") and "cycle 10.0000 > timed wall cycle 9.5000 ms" in lines[2]
    assert "GPU busy 105.26%" in lines[2] and lines[-1] == "1 of 2 records hold every invariant"
    path.write_text(ep.to_json(good) + "\n")
    assert run_benchmark("eagle3_profile_invariants", path, timeout=120).returncode == 0


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
    proc = run_benchmark("eagle3_profile_invariants", path, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].endswith("ok") and lines[2].endswith("ok")
    assert "accept_hist: 400 request-verifies, 799 tokens against 400, 800" in lines[3]
    assert "accept_hist: 4 entries for 2 draft tokens" in lines[4]
    assert lines[-1] == "2 of 4 records hold every invariant"


# A process as benchmarks/gpu_profile_host_cost.sh makes one: the breakdown imported first (there by a .pth line in
# site-packages, here from the folder it was copied to), then the program: the host-time benchmark, as ``-m`` runs it.
LOADED_FIRST = ("import sys, runpy, eagle3_profile_server_breakdown; sys.argv[1:] = {args!r};"
                " runpy.run_module('benchmarks.eagle3_profile_host_time', run_name='__main__', alter_sys=True)")


def test_the_server_breakdown_times_the_profilers_methods_where_it_is_loaded(tmp_path):
    """benchmarks/eagle3_profile_server_breakdown.py, loaded as a .pth line loads it in a server's processes: it wraps
    the profiler's methods and writes what each cost per cycle; without EAGLE3_BREAKDOWN_OUT it does nothing."""
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(REPO / "benchmarks" / "eagle3_profile_server_breakdown.py", site)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "EAGLE3_BREAKDOWN_OUT": str(tmp_path / "out")}
    code = LOADED_FIRST.format(args=["--cycles", "300", "--rounds", "1"])
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (written,) = (tmp_path / "out").glob("breakdown-*.json")  # at exit
    figures = json.loads(written.read_text())
    methods = figures["methods"]
    assert figures["cycles"] == methods["Profiler.end_cycle"]["calls"] >= 600
    assert methods["Profiler.begin_cycle"]["calls"] == figures["cycles"] and methods["Profiler._open_slot"]["calls"] > 0
    assert methods["Profiler.begin_cycle"]["us_per_cycle"] > 0 and figures["threads"] and figures["gc"]["threshold"]
    off = subprocess.run([sys.executable, "-c", "import eagle3_profile_server_breakdown; from sglang_pcie.patches"
                          ".eagle3_profile.payload import Profiler; print(Profiler.begin_cycle.__module__)"],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in env.items() if k != "EAGLE3_BREAKDOWN_OUT"})
    assert off.stdout.strip() == "sglang_pcie.patches.eagle3_profile.profiler", off.stderr[-2000:]
