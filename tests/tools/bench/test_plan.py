"""bench's plan: variants (built-in and user-defined), baseline first, counterbalanced order, the variables
it controls."""
from __future__ import annotations

from sglang_pcie.tools.bench.plan import CONTROLLED_VARS, counterbalanced, parse_variant, resolve_variants


def test_builtin_variants():
    assert parse_variant("baseline").env == {"SGLANG_PCIE_DISABLE": "1"}
    assert parse_variant("overlay").env == {}
    assert parse_variant("profile").env == {"EAGLE3_PROFILE": "1"}


def test_user_variants_env_args_base_tokens_repeats():
    steps = parse_variant("steps2:args=--speculative-num-steps 2 --speculative-num-draft-tokens 3")
    assert steps.args == ("--speculative-num-steps", "2", "--speculative-num-draft-tokens", "3")
    assert (steps.env, steps.base, steps.tokens, steps.repeats) == ({}, "overlay", "may-differ", None)
    nccl = parse_variant("nccl-pcie:env=SGLANG_PCIE_NCCL_PROFILE=pcie NCCL_DEBUG=INFO")
    assert nccl.env == {"SGLANG_PCIE_NCCL_PROFILE": "pcie", "NCCL_DEBUG": "INFO"}
    assert (nccl.args, nccl.tokens) == ((), "must-match")
    both = parse_variant("p5:base=profile;env=A='x y';args=--speculative-num-steps 5;tokens=must-match;"
                               "repeats=1")
    assert both.env == {"EAGLE3_PROFILE": "1", "A": "x y"} and both.profiling
    assert (both.args, both.tokens, both.repeats) == (("--speculative-num-steps", "5"), "must-match", 1)
    off = parse_variant("off-nccl:base=baseline;env=SGLANG_PCIE_NCCL_PROFILE=off")
    assert off.env == {"SGLANG_PCIE_DISABLE": "1", "SGLANG_PCIE_NCCL_PROFILE": "off"}


def test_baseline_always_first():
    names = [v.name for v in resolve_variants(["profile", "overlay"])]
    assert names == ["baseline", "profile", "overlay"]
    assert [v.name for v in resolve_variants(["overlay", "baseline"])] == ["baseline", "overlay"]
    assert [v.name for v in resolve_variants([])] == ["baseline", "overlay"]


def test_counterbalanced_order():
    order = counterbalanced(["A", "B", "C"], 3)
    assert [n for _, n in order] == list("ABCCBAABC")
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # every variant's mean position is the same over an even number of repeats: a linear drift cancels
    order = counterbalanced(["A", "B", "C"], 4)
    positions = {n: [i for i, (_, m) in enumerate(order) if m == n] for n in "ABC"}
    assert len({sum(p) for p in positions.values()}) == 1


def test_variant_with_fewer_repeats_runs_in_the_last_ones():
    order = counterbalanced(["A", "B", "S"], 3, {"S": 1})
    assert [n for _, n in order] == list("ABBAABS")
    assert [r for r, n in order if n == "S"] == [2]


def test_inherited_decision_marker_is_not_passed_on():
    from sglang_pcie.runtime.nccl import DECIDED_VAR

    assert DECIDED_VAR in CONTROLLED_VARS
