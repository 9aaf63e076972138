"""The process's profiler at exit (sglang_pcie.patches.eagle3_profile.process): the partial interval flushed at a
normal exit, SIGTERM (with and without a handler of the program's own), Ctrl-C in a spawned child; lost only to
os._exit."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from support import REPO

EXIT = r'''
import os, signal, sys, types
sys.path.insert(0, {repo!r})
from sglang_pcie.patches.eagle3_profile import payload as ep
class Mode:
    def is_extend(self): return False
    def is_idle(self): return False
class Worker:
    tp_rank = 0
    def forward_batch_generation(self, batch):
        return types.SimpleNamespace(accept_lens=types.SimpleNamespace(shape=(2,), is_cuda=False, sum=lambda: 5))
Worker.forward_batch_generation = ep.wrap(Worker.forward_batch_generation, "cycle")
def run(cycles):
    worker = Worker()
    for _ in range(cycles):
        worker.forward_batch_generation(types.SimpleNamespace(forward_mode=Mode(), is_extend_in_batch=False))
def child():  # a spawned child, as SGLang's schedulers are, stopped by Ctrl-C
    run(7)
    raise KeyboardInterrupt
if __name__ == "__main__":
    how = sys.argv[1]
    if how == "child":
        import multiprocessing as mp
        mp.set_start_method("spawn")
        process = mp.Process(target=child)
        process.start()
        process.join()
        sys.exit(process.exitcode)
    if how == "sigterm-handled":  # a handler of the program's own, set before the profiler's: still called after
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
    run(7)
    if how.startswith("sigterm"):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    elif how == "os._exit":
        os._exit(3)
'''


@pytest.mark.parametrize("how, returncode, flushed", [
    ("normal", 0, True), ("sigterm", -signal.SIGTERM, True), ("sigterm-handled", 7, True), ("child", 1, True),
    ("os._exit", 3, False)])
def test_the_partial_interval_is_flushed_at_exit(tmp_path, how, returncode, flushed):
    out = tmp_path / "profile.jsonl"
    script = tmp_path / "run.py"
    script.write_text(EXIT.format(repo=str(REPO)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_", "SGLANG_PCIE_"))}
    env.update({"EAGLE3_PROFILE": "1", "EAGLE3_PROFILE_INTERVAL": "5", "EAGLE3_PROFILE_FILE": str(out)})
    proc = subprocess.run([sys.executable, str(script), how], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == returncode, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if flushed:
        assert [(r["decode_cycles"], r["partial"]) for r in records] == [(5, False), (2, True)]
    else:  # os._exit runs no Python at all: the partial interval (and maybe the first, if unread) is lost
        assert [(r["decode_cycles"], r["partial"]) for r in records] in ([], [(5, False)])
    assert all(r["tokens"] == 5 * r["decode_cycles"] for r in records)

