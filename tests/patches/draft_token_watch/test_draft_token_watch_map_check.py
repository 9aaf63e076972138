"""draft-token-watch's map check at load, through SGLang's own set-up step of real releases (torch on the CPU):
0.5.23's ``EagleDraftWorker.init_lm_head`` (v2) and 0.5.9's ``EAGLEWorker.init_cuda_graphs`` (v1), each wrapped by
the patch's payload as the runtime install and the baked diff wrap it
(``tests/support/scripts/map_check_scenarios.py``: small targets and drafters whose lm_head rows are the target's
embedding rows of their hot tokens plus noise, cos about 0.8, as a head trained on from the target's)."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.release


@pytest.fixture(scope="module")
def v2(sglang_env):
    return sglang_env("0.5.23").run_script_json("map_check_scenarios.py")


@pytest.fixture(scope="module")
def v1(sglang_env):
    return sglang_env("0.5.9").run_script_json("map_check_scenarios.py", "v1")


def levels(scenario) -> list[str]:
    return [level for level, _ in scenario["records"]]


def test_sglangs_own_set_up_runs_and_the_check_runs_once(v2):
    for name in ("healthy", "d2t_10", "head_rotated", "unrelated"):
        scenario = v2[name]
        assert scenario["hot_on_worker"] and scenario["embed_bound"]  # init_lm_head itself ran
        assert scenario["checks"] == 1 and len(scenario["records"]) == 1  # called twice, checked once


def test_healthy_drafters_are_silent_in_every_pair(v2):
    """Eight healthy pairs (seeds), two of them with target tokens whose embedding rows are near copies of a hot
    token's: one INFO line each, no warning."""
    healthy = [v2["healthy"], v2["twins_healthy"]] + [v2[f"healthy_seed_{s}"] for s in range(4, 10)]
    for scenario in healthy:
        assert scenario["verdict"] == "ok" and levels(scenario) == ["INFO"]
        assert "the map looks right at load" in scenario["records"][0][1]


@pytest.mark.parametrize("name, share", [("d2t_10", 0.1), ("d2t_40", 0.4)])
def test_a_partly_permuted_map_is_named_with_its_entries(v2, name, share):
    scenario = v2[name]
    assert scenario["verdict"] == "wrong" and levels(scenario) == ["WARNING"]
    text = scenario["records"][0][1]
    estimate = float(re.search(r"rows checked \(([\d.]+)%\)", text).group(1)) / 100
    assert share * 0.75 <= estimate <= share * 1.05  # the share of the map that is wrong, about
    named = [tuple(map(int, m)) for m in re.findall(r"draft id (\d+) -> target (\d+) \(cos [-\d.]+\), its row is "
                                                    r"target (\d+)'s", text)]
    assert len(named) == 5
    hot = v2["hot"]
    for draft_id, mapped, fits in named:
        assert fits == hot[draft_id] != mapped  # the entry is wrong, and the row's own token is found
    if name == "d2t_10":
        assert all(draft_id in v2["truth_10"] for draft_id, _, _ in named)
        assert all(f["draft_id"] in v2["truth_10"] for f in scenario["fits"])  # no healthy entry is named


def test_a_head_rotated_by_one_row_is_named_as_shifted(v2):
    scenario = v2["head_rotated"]
    assert scenario["verdict"] == "wrong" and scenario["shift"] == 1 and levels(scenario) == ["WARNING"]
    assert "the map (or the head) is shifted by one position" in scenario["records"][0][1]


def test_an_unrelated_head_cannot_tell_and_says_so_at_info(v2):
    scenario = v2["unrelated"]
    assert scenario["verdict"] == "cannot tell" and levels(scenario) == ["INFO"]
    assert "the map cannot be checked at load" in scenario["records"][0][1]


def test_rank_1_is_silent_and_an_overlapped_weight_load_is_not_checked(v2):
    assert v2["rank_1"]["records"] == [] and v2["rank_1"]["verdict"] is None
    assert v2["overlap_load"]["verdict"] is None
    assert v2["overlap_load"]["records"] == [
        ["INFO", "sglang-pcie draft-token-watch: the map is not checked at load: --startup-weight-load-mode is not "
                 "serial: the target's weights are not loaded yet here"]]


def test_v1_checks_before_its_cuda_graphs_and_names_the_map(v1):
    assert v1["graph_runner"] is None  # 0.5.9's init_cuda_graphs ran after the check (graphs off: none made)
    assert [level for level, _ in v1["records"]] == ["WARNING"]
    assert "its vocabulary map sends draft ids to the wrong target tokens" in v1["records"][0][1]


def test_tp_rank_0_compares_the_rows_its_shards_hold(v2):
    """TP rank 0 of 2 (SGLang's shard_indices on both heads and the drafter's lm_head, padding rows after them):
    only draft rows of its shard whose mapped target rows it holds are compared, and a 40%-permuted map is still
    named with correct entries; the healthy map is not."""
    wrong, healthy, hot = v2["tp2_rank0_wrong"], v2["tp2_rank0_healthy"], v2["tp2_hot"]
    assert healthy["verdict"] == "ok" and levels(healthy) == ["INFO"]
    assert 0 < wrong["rows"] <= healthy["rows"] <= 512  # draft ids 0..511, mapped rows below 2048
    assert wrong["verdict"] == "wrong" and levels(wrong) == ["WARNING"]
    assert all(f["draft_id"] < 512 and f["fits"] < 2048 and f["fits"] == hot[f["draft_id"]] for f in wrong["fits"])
