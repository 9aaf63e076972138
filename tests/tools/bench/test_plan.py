"""bench's plan: variants (built-in and user-defined), baseline first, counterbalanced order, the variables
it controls."""
from __future__ import annotations

import os
import re

import pytest

from sglang_pcie.tools.bench.plan import (CONTROLLED_VARS, PROFILE_FILE_NAME, Plan, Workload, counterbalanced,
                                          parse_env_pairs, parse_variant, resolve_variants)
from sglang_pcie.tools.command import UsageError


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


# ------------------------------------------------------------------------------------------------------------
# Each server's run, command and environment; the workload's prompts; bad variants named (the command line's
# own tests run them through the CLI: test_command.py).




def a_plan(tmp_path, variants=("overlay", "profile", "s2:args=--x 1;env=A=variant"), repeats=2, **fields):
    values = dict(variants=resolve_variants(list(variants)), workload=Workload(), launch_args=["--model-path", "m"],
                  server_cmd=["srv", "-m", "x"], extra_env={"A": "plan", "B": "plan"}, host="127.0.0.1", port=30000,
                  repeats=repeats, out=tmp_path / "out", start_timeout=60, stop_timeout=3, request_timeout=60)
    values.update(fields)
    return Plan(**values)


def test_a_run_gets_the_plans_env_then_the_variants_and_the_plans_args_then_the_variants(tmp_path):
    plan = a_plan(tmp_path)
    s2 = next(r for r in plan.schedule() if r["variant"] == "s2")
    assert s2["env"] == {"A": "variant", "B": "plan"}  # the variant's value wins
    assert s2["args"] == ["--model-path", "m", "--x", "1"]  # appended: argparse keeps the last value
    assert s2["folder"] == tmp_path / "out" / "runs" / f"{s2['index']:02d}-s2" and "label" not in s2
    profile = next(r for r in plan.schedule() if r["variant"] == "profile")
    assert profile["env"]["EAGLE3_PROFILE_FILE"] == str(profile["folder"] / PROFILE_FILE_NAME)
    assert "EAGLE3_PROFILE_FILE" not in next(r for r in plan.schedule() if r["variant"] == "overlay")["env"]


def test_make_run_takes_a_variant_by_name_a_folder_and_a_label(tmp_path):
    plan = a_plan(tmp_path)
    run = plan.make_run(7, 2, "profile", folder=tmp_path / "mine", label="mine")
    assert (run["index"], run["repeat"], run["variant"], run["label"]) == (7, 2, "profile", "mine")
    assert run["folder"] == tmp_path / "mine" and run["env"]["EAGLE3_PROFILE_FILE"] == str(tmp_path / "mine" /
                                                                                           PROFILE_FILE_NAME)
    with pytest.raises(ValueError, match=r"no variant 'nope' in this plan \(baseline, overlay, profile, s2\)"):
        plan.make_run(1, 1, "nope")


def test_the_schedule_numbers_servers_in_counterbalanced_order_and_can_stop_after_some_repeats(tmp_path):
    plan = a_plan(tmp_path, variants=("overlay", "x:env=A=1;repeats=1"), repeats=3)
    runs = plan.schedule()
    assert [(r["index"], r["repeat"], r["variant"]) for r in runs] == [
        (1, 1, "baseline"), (2, 1, "overlay"), (3, 2, "overlay"), (4, 2, "baseline"), (5, 3, "baseline"),
        (6, 3, "overlay"), (7, 3, "x")]
    assert [r["variant"] for r in plan.schedule(repeats=1)] == ["baseline", "overlay", "x"]  # its last repeat


def test_the_warm_up_run_is_server_0_of_the_first_runs_variant_in_its_own_folder(tmp_path):
    plan = a_plan(tmp_path, variants=("overlay", "profile"))
    run = plan.warmup_run()
    assert (run["index"], run["repeat"], run["variant"], run["label"]) == (0, 0, "baseline", "warm-up baseline")
    assert run["folder"] == tmp_path / "out" / "runs" / "00-warmup" and run["env"]["SGLANG_PCIE_DISABLE"] == "1"
    profiled = plan.warmup_run("profile")
    assert profiled["label"] == "warm-up profile"
    assert profiled["env"]["EAGLE3_PROFILE_FILE"] == str(tmp_path / "out" / "runs" / "00-warmup" / PROFILE_FILE_NAME)


def test_the_command_ends_with_bench_own_host_and_port(tmp_path):
    plan = a_plan(tmp_path, host="10.0.0.2")
    run = plan.make_run(1, 1, "s2")
    assert plan.command(run, 31234) == ["srv", "-m", "x", "--model-path", "m", "--x", "1", "--host", "10.0.0.2",
                                        "--port", "31234"]


def test_the_environment_drops_the_inherited_controlled_variables_and_adds_the_runs(tmp_path, monkeypatch):
    for name in CONTROLLED_VARS:
        monkeypatch.setenv(name, "inherited")
    monkeypatch.setenv("KEPT_BY_BENCH", "yes")
    plan = a_plan(tmp_path)
    overlay = plan.environment(plan.make_run(1, 1, "overlay"))
    assert not set(CONTROLLED_VARS) & set(overlay) and overlay["KEPT_BY_BENCH"] == "yes"
    assert overlay["PYTHONUNBUFFERED"] == "1" and overlay["A"] == "plan"
    baseline = plan.environment(plan.make_run(1, 1, "baseline"))
    assert baseline["SGLANG_PCIE_DISABLE"] == "1" and "EAGLE3_PROFILE" not in baseline
    assert set(CONTROLLED_VARS) == {"SGLANG_PCIE_DISABLE", "EAGLE3_PROFILE", "EAGLE3_PROFILE_FILE",
                                    "SGLANG_PCIE_NCCL_DECIDED"}
    assert os.environ["SGLANG_PCIE_DISABLE"] == "inherited"  # bench's own environment is left alone


def test_prompts_are_a_function_of_the_seed_only_drawn_from_the_token_range():
    work = Workload(seed=3, batch_requests=5, stream_requests=2, warmup_requests=4, input_len=50, token_low=10,
                    token_high=13)
    prompts = work.prompts()
    assert prompts == work.prompts() == Workload(**dict(work.as_dict())).prompts()
    assert [len(prompts[p]) for p in ("warmup", "batch", "stream")] == [4, 5, 2]
    tokens = {t for phase in prompts.values() for p in phase for t in p}
    assert tokens == {10, 11, 12} and all(len(p) == 50 for phase in prompts.values() for p in phase)
    assert Workload(seed=4, token_low=10, token_high=13).prompts() != Workload(seed=3, token_low=10,
                                                                                  token_high=13).prompts()


def test_a_base_alone_is_a_variant_and_the_base_keeps_its_env():
    aa = parse_variant("aa:base=overlay")
    assert (aa.env, aa.args, aa.base, aa.tokens, aa.spec) == ({}, (), "overlay", "must-match", "aa:base=overlay")
    off = parse_variant("p2:base=baseline;env=NCCL_P2P_DISABLE=1")
    assert off.env == {"SGLANG_PCIE_DISABLE": "1", "NCCL_P2P_DISABLE": "1"} and off.as_dict()["base"] == "baseline"
    assert parse_variant("overlay").as_dict() == {"name": "overlay", "base": None, "env": {}, "args": [],
                                                  "tokens": "must-match", "repeats": None, "spec": "overlay"}
    assert parse_variant("s:args=--a 1;tokens=must-match").tokens == "must-match"  # given, it wins over args=


@pytest.mark.parametrize("spec, message", [
    ("nonesuch", "unknown variant (built-ins: baseline, overlay, profile"),
    ("-x:env=A=1", "the name '-x' must be letters"),
    ("x:env=A=1;;", None),  # empty parts are skipped
    ("x:repeats=1.5;env=A=1", "repeats='1.5' is not a positive integer"),
    ("x:repeats=-1;env=A=1", "repeats='-1' is not a positive integer"),
    ("x:base=baseline;base=overlay", "base= given twice"),
    ("x:tokens=must-match", "gives no env=, args= or base="),
    ("x:env=A='1", "env= does not parse"),
    ("x:env=A-B=1", "'A-B=1' is not NAME=VALUE"),
    ("x:env=_A=1 b2=3", None),
    ("baseline:env=A=1", "'baseline' is a built-in; give your variant another name (NAME:base=baseline;...)"),
])
def test_variant_specs_are_parsed_or_refused_naming_the_part(spec, message):
    if message is None:
        assert parse_variant(spec).name == "x"
        return
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_variant(spec)


def test_a_repeats_field_is_kept_as_a_count():
    assert parse_variant("x:env=A=1;repeats=2").repeats == 2
    assert parse_variant("x:env=A=1").repeats is None


def test_env_pairs_keep_the_value_after_the_first_equals_sign():
    assert parse_env_pairs("A=1=2 B= C='x y'", "here") == {"A": "1=2", "B": "", "C": "x y"}
    with pytest.raises(UsageError, match=r"^here: 'A' is not NAME=VALUE$"):
        parse_env_pairs("A", "here")


def test_a_variant_named_twice_is_refused():
    with pytest.raises(UsageError, match="--variant 'overlay' given twice"):
        resolve_variants(["overlay", "profile", "overlay"])
    assert [v.name for v in resolve_variants(["profile"])] == ["baseline", "profile"]  # no overlay added
