"""sglang-pcie env: the NCCL decision and the all-reduce report, and its exit codes."""
from __future__ import annotations

import json


from support.cli import run_cli

PATCH_IDS = ["sm120-allreduce-fusion", "eagle3-profile", "drafter-delegation"]


def test_env_reports_the_decision(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PCIE_NCCL_PROFILE", "pcie")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    code, out, _ = run_cli(capsys, "env", "--json")
    decision = json.loads(out)
    assert code == 0 and decision["profile"] == "pcie"
    assert decision["user_set"] == {"NCCL_PROTO": "Simple"} and "NCCL_PROTO" not in decision["values"]


