"""One rank's NCCL measurement: graph sizes, and the sum check of the real worker (torch on CPU tensors)."""
from __future__ import annotations

import os
import subprocess
import textwrap

from sglang_pcie.tools.tune_nccl import measure

from support import REPO


def test_prefill_graphs_hold_fewer_all_reduces():
    spec = {"hidden": 7168, "dtype": "bf16", "allreduces": 122}
    assert [measure.allreduces_per_graph(spec, t) for t in (1, 8, 512, 2048, 8192)] == [122, 122, 36, 9, 4]


def test_real_worker_sum_check_catches_a_broken_all_reduce(torch_python):
    # An all-reduce that leaves each rank's data as it was: the check must say so.
    code = textwrap.dedent("""
        import torch
        from types import SimpleNamespace
        from sglang_pcie.tools.tune_nccl import measure
        spec = {"backend": "gloo", "tokens": [2], "hidden": 16, "dtype": "bf16", "allreduces": 3}
        try:
            measure.measure_nccl(torch, SimpleNamespace(all_reduce=lambda t: None), spec, 0, 2, torch.device("cpu"))
        except RuntimeError as exc:
            print(exc)
    """)
    done = subprocess.run([str(torch_python), "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "wrong sums after all-reduce at 2 tokens (3 of 3 buffers)", done.stderr
