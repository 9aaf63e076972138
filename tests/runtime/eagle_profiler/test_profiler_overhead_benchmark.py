"""benchmarks/eagle3_profile_overhead.py, run on the host only (no GPU): its logic and the token invariants."""
from __future__ import annotations

import json
import subprocess
import sys

from support import REPO


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
