"""What bench writes: the chart, and results.json as strict JSON."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.tools.bench.analysis import METRICS, ratio_summary
from sglang_pcie.tools.bench.report import save, write_chart


def test_chart_when_matplotlib_is_importable(tmp_path):
    pytest.importorskip("matplotlib")
    results = {"repeats": 2, "ratios": {"baseline": {}, "overlay": {label: ratio_summary([0.98, 1.01], True)
                                                                    for _, _, label, _ in METRICS}}}
    path = write_chart(results, tmp_path / "r.png")
    assert path == str(tmp_path / "r.png") and (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_results_json_is_strict_json(tmp_path):
    save({"ratio": float("nan"), "runs": [{"tok_s": float("inf"), "ok": True, "n": 3, "log": tmp_path}]},
               tmp_path)
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    saved = json.loads(text, parse_constant=lambda name: pytest.fail(f"non-strict JSON constant {name}"))
    assert saved == {"ratio": None, "runs": [{"tok_s": None, "ok": True, "n": 3, "log": str(tmp_path)}]}
