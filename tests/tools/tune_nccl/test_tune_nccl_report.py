"""What tune-nccl tells (sglang_pcie/tools/tune_nccl/report.py), on a constructed sweep judged by the real rule: the
latency table (the defaults' median, every other profile's slowest run, each profile's verdict), the communication
per forward pass it predicts, the PCIe-IPC row, the rule's text, and the tuned file's content."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_pcie.tools.tune_nccl import report
from sglang_pcie.tools.tune_nccl import verdict as rule
from sglang_pcie.tools.tune_nccl.sweep import Sweep

SIZES = [1, 8]
PROFILES = {"default": {}, "fast": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, "slow": {"NCCL_ALGO": "Tree"},
            "broken": {"NCCL_PROTO": "Simple"}, "never-run": {"NCCL_MAX_NCHANNELS": "2"}}
MEASURED = {"default": [{1: 10.0, 8: 20.0}, {1: 10.2, 8: 20.4}, {1: 9.9, 8: 19.8}],
            "fast": [{1: 8.0, 8: 16.0}, {1: 8.123, 8: 16.2}], "slow": [{1: 12.0, 8: 25.0}], "broken": [None]}
IPC = {"runs": [{}, {}], "worst": {"1": 5.0, "8": None}, "flashinfer": "0.7.2", "verdict": "beats NCCL up to 1 tok"}
ARGS = SimpleNamespace(nnodes=1, hidden=7168, dtype="bf16", backend="nccl", layers=61, tokens=SIZES, prefill_tokens=None)
SPEC = {"backend": "nccl", "tokens": SIZES, "hidden": 7168, "dtype": "bf16", "allreduces": 122}


def sweep(measured=None, errors=None) -> Sweep:
    measured = MEASURED if measured is None else measured
    made = Sweep(measured=measured, errors={"broken": "rank 1 exited with code 3"} if errors is None else errors,
                 info={"nccl": "2.21.5", "device": "NVIDIA H200"}, wall_s=12.345)
    made.verdict = rule.choose(measured, PROFILES, SIZES)
    return made


def rows(text: str) -> dict:
    """The latency table's rows: profile -> its cells."""
    table = text.split("\n\n")[1].splitlines()[2:]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table)}


def test_the_latency_table_shows_each_profile_that_ran_with_its_verdict():
    text = report.render_table(sweep(), PROFILES, SIZES, 61, IPC)
    assert text.startswith("All-reduce latency, microseconds (defaults: median of their 3 runs; others: slowest"
                           " run). Noise per size (the defaults' second-largest deviation from their median, at least"
                           " 3%; above 10% nothing is decided): 1:3% 8:3%\n")
    assert rows(text) == {
        "default": ["(none)", "10.0", "20.0", "baseline (3 runs)"],
        "fast": ["PROTO=LL ALGO=Ring", "8.1", "16.2", "winner: faster at 1, 8 tok (2 runs)"],
        "slow": ["ALGO=Tree", "12.0", "25.0", "slower than defaults at 1 tok (12.0 vs 10.0 us, +20.0%; the limit is"
                                              " 3%) and 1 more sizes"],
        "broken": ["PROTO=Simple", "-", "-", "dropped: rank 1 exited with code 3"],
        "pcie-ipc": ["FlashInfer 0.7.2", "5.0", "-", "beats NCCL up to 1 tok (2 runs)"]}
    assert "never-run" not in text  # a profile with no run has no row


def test_the_predicted_communication_is_two_all_reduces_per_layer():
    text = report.render_table(sweep(), PROFILES, SIZES, 61)
    assert "Predicted communication per forward pass (2 x 61 layers x latency), milliseconds" in text
    per_pass = text.split("\n\n")[3].splitlines()
    assert per_pass[2:] == ["| default | 1.22 | 2.44 |", "| fast | 0.99 | 1.98 |", "| slow | 1.46 | 3.05 |"]
    assert "pcie-ipc" not in rows(text)  # no IPC runs: no row


def test_the_defaults_win_when_nothing_qualifies_and_a_qualifier_that_was_not_chosen_says_so():
    measured = {"default": MEASURED["default"], "slow": MEASURED["slow"]}
    lone = sweep(measured, errors={})
    assert report.verdict_note(lone, "default") == "winner (NCCL defaults: nothing set)"
    noisy = {"default": [{1: 10.0, 8: 20.0}, {1: 13.0, 8: 20.0}, {1: 7.0, 8: 20.0}], "fast": MEASURED["fast"]}
    undecided = sweep(noisy, errors={})
    assert undecided.verdict.winner == "default" and undecided.verdict.undecided
    assert report.verdict_note(undecided, "default") == (f"winner (NCCL defaults: nothing set;"
                                                         f" {undecided.verdict.undecided})")
    assert report.verdict_note(undecided, "fast") == "qualified, not chosen (defaults kept)"
    plain = sweep()
    plain.verdict.winner = "slow"  # another winner: "fast" is a qualifier that was not chosen
    assert report.verdict_note(plain, "fast") == "qualified"
    plain.verdict.undecided = "too noisy"
    assert report.verdict_note(plain, "fast") == "qualified, not chosen (defaults kept)"


def test_a_dropped_profile_says_its_first_error_before_any_rejection():
    made = sweep()
    made.verdict.rejected["broken"] = "failed"
    assert report.verdict_note(made, "broken") == "dropped: rank 1 exited with code 3"


@pytest.mark.parametrize("nodes, named", [(1, "over 4 ranks in CUDA graphs"), (2, "over 4 ranks on 2 nodes in CUDA")])
def test_the_rule_text_names_what_was_measured_and_the_fixed_limits(nodes, named):
    text = report.rule_text(SIZES, SimpleNamespace(**dict(vars(ARGS), nnodes=nodes)), 4)
    assert text.startswith("measured at 1, 8 tokens x 7168 bf16 ") and named in text
    assert "NCCL's defaults run 3 times" in text and "more than 3% slower" in text and "above 10%" in text
    assert "confirmed by 2 runs" in text and "at least 3%" in text


def test_the_tuned_files_content_is_the_winner_every_run_and_its_own_digest():
    config = report.tuned_config(sweep(), PROFILES, SPEC, ARGS, 4, {"gpus": ["H200"] * 4}, {"tokens": SIZES}, 99.94)
    assert config["winner"] == "fast" and config["values"] == PROFILES["fast"]
    assert config["guarantee_sizes"] == SIZES and config["fingerprint"] == {"gpus": ["H200"] * 4}
    assert config["verdict"].startswith("fast: never slower than NCCL's defaults")
    measured = config["measured"]
    assert (measured["tp"], measured["hidden"], measured["layers"], measured["torch_nccl"], measured["device"]) == (
        4, 7168, 61, "2.21.5", "NVIDIA H200")
    assert measured["baseline"] == {"1": 10.0, "8": 20.0} and measured["noise"] == {"1": 0.03, "8": 0.03}
    assert measured["limits"] == {"defaults_runs": 3, "min_noise": 0.03, "max_noise": 0.1, "slower_tolerance": 0.03,
                                  "confirm_runs": 2}
    assert (measured["sweep_s"], measured["wall_s"]) == (12.3, 99.9)
    assert measured["allreduces_per_graph"] == {"1": 122, "8": 122}
    assert config["table"]["fast"]["runs"] == [{"1": 8.0, "8": 16.0}, {"1": 8.12, "8": 16.2}]  # to 0.01 us
    assert config["table"]["broken"]["runs"] == [None] and "worst_ratio" not in config["table"]["broken"]
    assert config["table"]["fast"]["worst_ratio"] == 0.8123  # its slowest run over the baseline, at its worst size
    assert config["table"]["fast"]["mean_gain"] == round(sweep().verdict.gain["fast"], 4)
    assert config["table"]["fast"]["verdict"] == "winner: faster at 1, 8 tok"
    assert "never-run" not in config["table"] and "nodes" not in measured
    assert config[report.CONTENT_DIGEST] == report.content_digest(config)


def test_a_run_keeps_only_figures_that_are_microseconds():
    assert report._rounded_run({1: 3.14159, 8: float("nan"), 64: -1.0, 512: True}) == {"1": 3.14, "8": None,
                                                                                       "64": None, "512": None}
    assert report._rounded_run(None) is None and report._rounded_run("failed") is None
