"""What bench writes: the chart, and results.json as strict JSON."""
from __future__ import annotations

import json

import pytest

from sglang_pcie.tools.bench.analysis import METRICS, ratio_summary
from sglang_pcie.tools.bench.report import auto_text, percent, save, write_chart


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


def test_auto_text_for_every_reason():
    auto = {"target": 0.02, "metric": "batch output tok/s", "budget_s": 1800.0, "repeats": 7, "elapsed_s": 1500.0,
            "resolvable": {"overlay": 0.031, "aa": 0.0125}, "noise_margin": 0.004}
    assert auto_text(dict(auto, stopped="resolved")) == (
        "repeats auto: resolved batch output tok/s to ±2.0% after 7 repeats (25.0 minutes): every variant can see"
        " overlay ±3.1%, aa ±1.2%")
    assert auto_text(dict(auto, stopped="budget")) == (
        "repeats auto: NOT RESOLVABLE batch output tok/s to ±2.0% in 30 minutes: after 7 repeats (25.0 minutes) the"
        " smallest resolvable effects are overlay ±3.1%, aa ±1.2%")
    assert auto_text(dict(auto, stopped="max repeats")).startswith(
        "repeats auto: NOT RESOLVABLE batch output tok/s to ±2.0% in 7 repeats: ")
    assert "own spread is ±0.4% after 7 repeats" in auto_text(dict(auto, stopped="noise floor"))
    assert percent(None) == "-" and percent(12.0) == "±>999%"


def test_an_interval_that_cannot_resolve_is_not_printed_as_a_figure():
    from sglang_pcie.tools.bench.report import _ratio_lines
    from sglang_pcie.tools.bench.verdicts import ratio_summary

    row = dict(ratio_summary([0.1, 10.0], higher_is_better=False), value_median=12.5)
    (line,) = [l for l in _ratio_lines({"x": {"stream TTFT p50 (ms)": row}}) if l.startswith("x ")]
    assert "too wide" in line and "[0.0" not in line and "100." not in line, line
    assert line.endswith("  cannot resolve: this interval cannot tell a 10x effect from none"), line
