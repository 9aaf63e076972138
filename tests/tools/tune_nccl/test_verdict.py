"""tune-nccl's winner rule: which measured profile beats NCCL's defaults, and where the PCIe-IPC path wins."""
from __future__ import annotations

import pytest

from sglang_pcie.runtime.tuned_file import CANDIDATES as PROFILES
from sglang_pcie.tools.tune_nccl import verdict as nccl_verdict
from sglang_pcie.tools.tune_nccl.verdict import choose


def runs(*sizes_us):
    """runs((10, 12), (11, 12)) -> two runs over sizes 1 and 8."""
    return [None if r is None else dict(zip((1, 8), r)) for r in sizes_us]


# ---------------------------------------------------------------------------------------------------------------
# Winner rule


def test_defaults_win_when_no_candidate_is_faster_everywhere():
    measured = {"default": runs((10, 20), (10, 20)), "proto-LL": runs((12, 25), (12, 25)),
                "pcie": runs((9, 21), (9, 21))}  # faster at 1 token, slower at 8 beyond the 3% noise floor
    verdict = choose(measured, PROFILES)
    assert verdict.winner == "default" and verdict.qualified == []
    assert verdict.rejected["pcie"].startswith("slower than defaults at 8 tok")


def test_much_faster_at_decode_but_slower_at_prefill_loses():
    # The seed's PCIe set on 2 x H200: a little faster at one token, many times slower at prefill sizes.
    measured = {"default": [{1: 28.1, 8: 36.6, 2048: 1043}] * 2, "pcie": [{1: 23.9, 8: 40.8, 2048: 6392}] * 2}
    verdict = choose(measured, PROFILES)
    assert verdict.winner == "default" and "slower than defaults at 8 tok" in verdict.rejected["pcie"]
    assert "and 1 more sizes" in verdict.rejected["pcie"]


def test_within_the_noise_is_neither_slower_nor_faster():
    measured = {"default": runs((10, 20), (10, 20)), "algo-Ring": runs((10.2, 19.8), (10.2, 19.8))}
    verdict = choose(measured, PROFILES)
    assert verdict.winner == "default"
    assert verdict.rejected["algo-Ring"] == "not faster than defaults beyond the noise at any size"


def test_a_gain_at_one_size_and_noise_elsewhere_wins():
    # Beats the defaults where it claims to (1 token), and is within the noise at 8.
    measured = {"default": runs((10, 20), (10, 20)), "proto-LL": runs((8, 20.4), (8, 20.4))}
    verdict = choose(measured, PROFILES)
    assert verdict.winner == "proto-LL" and verdict.faster["proto-LL"] == [1]


def test_noisy_defaults_widen_the_bound_per_size():
    # The defaults' runs differ by 10% at 1 token: a 5% gain there could be that noise, a 20% gain is not;
    # at 8 tokens they agree, so the 3% floor applies there.
    measured = {"default": runs((10, 20), (11, 20)), "proto-LL": runs((9.5, 20), (9.5, 20))}
    verdict = choose(measured, PROFILES)
    assert verdict.noise == {1: pytest.approx(0.10), 8: pytest.approx(0.03)} and verdict.winner == "default"
    measured["proto-LL"] = runs((8, 20), (8, 20))
    assert choose(measured, PROFILES).winner == "proto-LL"
    measured["proto-LL"] = runs((8, 20.8), (8, 20.8))  # 4% slower at 8 tokens: beyond the 3% there
    assert choose(measured, PROFILES).rejected["proto-LL"].startswith("slower than defaults at 8 tok")


def test_baseline_is_the_defaults_best_and_a_candidate_its_worst_run():
    measured = {"default": runs((10, 20), (12, 20)), "proto-LL": runs((8, 15), (12.5, 15))}
    verdict = choose(measured, PROFILES)
    assert verdict.baseline == {1: 10, 8: 20} and verdict.worst["proto-LL"] == {1: 12.5, 8: 15}
    assert verdict.winner == "default" and "slower than defaults at 1 tok" in verdict.rejected["proto-LL"]


def test_prefill_sizes_do_not_drown_a_decode_gain_in_the_ranking():
    # proto-LL: 20% faster at 1 token; algo-Ring: 5% faster at 8192 tokens (far more microseconds saved).
    measured = {"default": [{1: 10, 8192: 400}] * 2, "proto-LL": [{1: 8, 8192: 400}] * 2,
                "algo-Ring": [{1: 10, 8192: 380}] * 2}
    verdict = choose(measured, PROFILES)
    assert verdict.qualified == ["proto-LL", "algo-Ring"] and verdict.winner == "proto-LL"


def test_a_failed_repeat_run_drops_the_candidate():
    measured = {"default": runs((10, 20), (10, 20)), "algo-Tree": runs((5, 10), None), "proto-LL": [None]}
    verdict = choose(measured, PROFILES)
    assert verdict.rejected == {"algo-Tree": "failed in a repeat run", "proto-LL": "failed"}
    assert verdict.winner == "default"


def test_the_best_qualifier_needs_a_confirming_run():
    measured = {"default": runs((10, 20), (10, 20)), "proto-LL": runs((5, 10)), "algo-Ring": runs((8, 16), (8, 16))}
    verdict = choose(measured, PROFILES)
    assert verdict.qualified == ["proto-LL", "algo-Ring"]
    assert verdict.pending == "proto-LL" and verdict.winner == "algo-Ring"
    measured["proto-LL"] += runs((5.5, 11))
    verdict = choose(measured, PROFILES)
    assert verdict.pending is None and verdict.winner == "proto-LL"


def test_equal_qualifiers_go_to_the_one_that_sets_fewer_variables():
    measured = {"default": runs((10, 20), (10, 20)), "ring-LL": runs((8, 16), (8, 16)),
                "proto-LL": runs((8, 16), (8, 16))}
    assert choose(measured, PROFILES).winner == "proto-LL"


def test_no_successful_default_run_means_no_verdict():
    with pytest.raises(ValueError, match="defaults could not be measured"):
        choose({"default": [None], "proto-LL": runs((5, 10), (5, 10))}, PROFILES)


def test_ipc_wins_up_to_the_largest_size_it_wins_at_every_smaller_one():
    nccl_us, noise = {1: 18, 2: 18, 4: 18, 8: 18}, {1: 0.03, 2: 0.03, 4: 0.03, 8: 0.03}
    judged = nccl_verdict.ipc_verdict(nccl_us, noise, [{1: 7, 2: 7, 4: 17.8, 8: 9}, {1: 7.5, 2: 7, 4: 8, 8: 9}])
    # 4 tokens: its slower run (17.8) is within the noise of NCCL's 18, so no win there; 8 does not count then.
    assert judged["wins"] == {1: True, 2: True, 4: False, 8: True} and judged["max_tokens"] == 2
    assert nccl_verdict.ipc_verdict(nccl_us, noise, [{1: 20, 2: 7, 4: 7, 8: 7}])["max_tokens"] is None
    assert nccl_verdict.ipc_verdict(nccl_us, noise, [{1: 5, 2: 5, 4: 5, 8: 5}, None])["max_tokens"] is None
    assert nccl_verdict.ipc_verdict(nccl_us, noise, [{1: 5, 2: None, 4: 5, 8: 5}])["max_tokens"] == 1  # 2 refused
