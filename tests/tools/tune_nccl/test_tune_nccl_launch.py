"""One run's ranks: reports read whole, a silent rank named with the end of its stderr, stderr tails read from the
end of large files."""
from __future__ import annotations

import json

from sglang_pcie.tools.tune_nccl import launch


# What a failed, hung or silent run brings back: the ranks' stderr tails, the workers' progress lines, the stacks of
# hung ranks (the first GPU run had only "rank 0 exited without a report" and "timed out after 90 s").


def test_a_report_is_read_whole_even_after_stray_output(tmp_path):
    report = {"rank": 0, "ok": True, "us": {"1": 5.0}, "fabric": "x" * 500}
    out = tmp_path / "rank0.out"
    out.write_text("NCCL INFO init\n[flashinfer] no newline" + json.dumps(report) + "\n\n")
    assert launch.read_report(out) == report
    out.write_text(json.dumps(report)[:300] + "\n")  # cut short: no report
    assert launch.read_report(out) is None


def test_a_rank_without_a_report_is_named_with_the_end_of_its_stderr(fake_worker, monkeypatch):
    command, _ = fake_worker
    monkeypatch.setenv("FAKE_WORKER_NO_REPORT", "1")
    spec = {"backend": "gloo", "tokens": [1], "hidden": 16, "dtype": "bf16", "allreduces": 2}
    outcome = launch.run_profile({}, spec, 2, 60, command)
    assert outcome.us is None
    assert outcome.error == "rank 0 exited without a report; its stderr ends: stderr line 49 of rank 0"
    assert outcome.stderr_tails[1] == [f"stderr line {i} of rank 1" for i in range(10, 50)]  # the last 40


def test_a_ranks_stderr_tail_reads_only_the_end_of_a_large_file(tmp_path):
    # NCCL_DEBUG=INFO can make a rank's stderr large: the tail comes from its last 64 KiB, blank lines dropped.
    err = tmp_path / "rank0.err"
    err.write_text("x" * 200_000 + "\n" + "".join(f"line {i}\n\n" for i in range(50)))
    assert launch.tail(err, lines=3) == ["line 47", "line 48", "line 49"]
    assert launch.tail(tmp_path / "missing.err") == []
