"""The per-phase acceptance histogram from SGLang's meta info (``spec_correct_drafts_histogram``, in 0.5.9
``spec_accept_histogram``, in 0.5.16 both): ``accept_hist`` (index n: verify steps that accepted n drafts, summed
over the phase's requests) and ``accept_at_least`` (j = 1 ..: the share of verify steps with at least j)."""
from __future__ import annotations

import pytest

from sglang_pcie.tools.bench.acceptance import (accept_at_least, accept_histogram, accept_length, acceptance,
                                                 request_histogram)


def replies(*metas):
    return [{"meta_info": meta} for meta in metas]


def test_histograms_are_summed_over_requests_under_either_name():
    served = replies({"spec_correct_drafts_histogram": [1, 2, 3], "spec_accept_histogram": [1, 2, 3]},  # 0.5.16
                     {"spec_accept_histogram": [0, 1]},  # 0.5.9
                     {"spec_correct_drafts_histogram": [2, 0, 0, 4]},  # 0.5.23: a longer one
                     {"completion_tokens": 5})  # no speculation, or a release without it: left out
    assert accept_histogram(served) == [3, 3, 3, 4]  # the 0.5.16 alias counted once
    assert accept_at_least([3, 3, 3, 4]) == pytest.approx([10 / 13, 7 / 13, 4 / 13])
    assert accept_histogram(served[3:]) is None and accept_at_least(None) is None
    assert accept_at_least([0, 0]) is None  # no verify step
    assert accept_at_least([5]) == []  # only ever zero drafts proposed: nothing to be at least
    assert acceptance(replies({"completion_tokens": 9, "spec_verify_ct": 3, "spec_accept_histogram": [1, 1, 1]})) == {
        "accept_length": 3.0, "accept_hist": [1, 1, 1], "accept_at_least": pytest.approx([2 / 3, 1 / 3]),
        "requests_spec": [[9, 3, [1, 1, 1]]]}  # each request's own, for tune-spec's per-request model
    assert acceptance(replies({"completion_tokens": 9}))["requests_spec"] is None  # no speculation


@pytest.mark.parametrize("keys", ["spec_correct_drafts_histogram,spec_accept_histogram", "spec_accept_histogram",
                                  "spec_correct_drafts_histogram"])
def test_batch_and_stream_carry_the_histogram_of_the_fake_speculative_server(run_bench, keys):
    code, out, err, results = run_bench("--repeats", "1", "--env", "FAKE_ACCEPT=3", "--env", f"FAKE_HISTOGRAM={keys}")
    assert code == 0, out + err
    for run in results["runs"]:
        batch, stream = run["metrics"]["batch"], run["metrics"]["stream"]
        # each request of 12 tokens: the prefill token, then 3 cycles of 3 (2 drafts accepted) and one of 2 (1)
        assert batch["accept_hist"] == [0, 8, 24] and stream["accept_hist"] == [0, 2, 6]
        assert batch["accept_at_least"] == [1.0, 0.75] and stream["accept_at_least"] == [1.0, 0.75]
        # consistent with SGLang's other counts: drafts accepted + one token per verify + the prefill token
        hist = batch["accept_hist"]
        assert sum(n * c for n, c in enumerate(hist)) + sum(hist) + batch["requests"] == batch["output_tokens"]
        assert batch["output_tokens"] / sum(hist) == pytest.approx(batch["accept_length"])


def test_without_the_key_the_figures_are_null(run_bench):
    code, _, _, results = run_bench("--repeats", "1", "--env", "FAKE_HISTOGRAM=none")
    assert code == 0
    for run in results["runs"]:
        for phase in ("batch", "stream"):
            assert run["metrics"][phase]["accept_hist"] is None and run["metrics"][phase]["accept_at_least"] is None
        assert run["metrics"]["accept_length"] == pytest.approx(12 / 6)  # the accept length as before


def test_each_speculative_request_keeps_its_own_histogram_in_order():
    """tune-spec's per-request model: a drafter accepted on some requests and not others is not one pooled
    histogram, so each request's row carries its own counts (under either name), never the phase's sum."""
    served = replies({"completion_tokens": 9, "spec_verify_ct": 3, "spec_correct_drafts_histogram": [0, 0, 3]},
                     {"completion_tokens": 4},  # not speculative: no row
                     {"completion_tokens": 5, "spec_verify_ct": 4, "spec_accept_histogram": [3, 1]},
                     {"completion_tokens": 6, "spec_verify_ct": 2})  # speculative, without a histogram
    figures = acceptance(served)
    assert figures["requests_spec"] == [[9, 3, [0, 0, 3]], [5, 4, [3, 1]], [6, 2, None]]
    assert figures["accept_hist"] == [3, 1, 3]  # the phase's sum, apart
    assert figures["accept_length"] == pytest.approx((9 + 5 + 6) / (3 + 4 + 2))


def test_accept_length_is_sglangs_ratio_over_the_speculative_requests_or_without_the_prefill_token():
    served = replies({"completion_tokens": 16, "spec_verify_ct": 5}, {"completion_tokens": 7, "spec_verify_ct": 2},
                     {"completion_tokens": 9}, {"completion_tokens": 3, "spec_verify_ct": 0})  # the last two: left out
    assert accept_length(served) == pytest.approx(23 / 7)
    assert accept_length(served, decode_only=True) == pytest.approx(21 / 7)  # one prefill token per request
    assert accept_length(served[2:]) is None and accept_length([]) is None
    assert accept_length(replies({"spec_verify_ct": 2})) == 0.0  # completion_tokens missing: no tokens counted


def test_request_histogram_prefers_the_current_name_and_has_none_without_either():
    assert request_histogram({"spec_correct_drafts_histogram": [1, 2], "spec_accept_histogram": [9]}) == [1, 2]
    assert request_histogram({"spec_correct_drafts_histogram": None, "spec_accept_histogram": [9]}) == [9]
    assert request_histogram({"completion_tokens": 3}) is None
