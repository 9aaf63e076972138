"""The eagle3-profile patch: against the pristine sources of every covered release (static, diffs), and in the
real SGLang 0.5.9 (v1 and v2 workers) and 0.5.23 (v2) with the overlay installed: wrapped only when
EAGLE3_PROFILE=1, the release's own methods otherwise."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.eagle_records import RECORD_KEYS

from support.releases import release_copy

from sglang_pcie.patches.eagle3_profile import payload as ep
from sglang_pcie.tools import profile_report
from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DRIFTED, Result
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patching.diffs import diff_for
from sglang_pcie.patches.eagle3_profile.check import PATCH, TARGETS, V1, V2
from sglang_pcie.patches.eagle3_profile.install import SPEC_INFO
from sglang_pcie.patching.releases import COVERED_RELEASES

from support import REPO


# ------------------------------------------------------------------ static: the pristine sources, the diffs


def test_every_covered_release_is_applicable(pristine_source):
    for version in COVERED_RELEASES:
        result = PATCH.check_source(SourceTree(pristine_source(version)))
        assert result.status == APPLICABLE, (version, result)
        has_v1 = version in ("0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12",
                             "0.5.12.post1")
        assert ("v1 EAGLEWorker.forward_batch_generation (cycle)" in result.detail) is has_v1, version
        assert "v2 EAGLEWorkerV2.forward_batch_generation (cycle)" in result.detail, version


def test_committed_diffs_are_what_the_patch_generates(pristine_source):
    for version in COVERED_RELEASES:
        committed = REPO / "diffs" / version / "eagle3-profile.diff"
        assert committed.read_text() == diff_for(PATCH, SourceTree(pristine_source(version))), version


def _copy_targets(source_root: Path, dest: Path):
    """The worker modules of the release in ``source_root`` (a pristine release folder), copied to ``dest``."""
    version = SourceTree(source_root).version
    return SourceTree(release_copy(version, dest, only=[
        "sglang/__init__.py", "sglang/version.py", "sglang/_version.py", "sglang/srt/speculative/eagle_worker.py",
        "sglang/srt/speculative/eagle_worker_v2.py"]))


@pytest.mark.parametrize("version", ["0.5.8", "0.5.12.post1", "0.5.13", "0.5.23"])
def test_diff_applies_with_patch_and_the_result_reads_as_applied(pristine_source, tmp_path, version):
    tree = _copy_targets(pristine_source(version), tmp_path)
    diff = REPO / "diffs" / version / "eagle3-profile.diff"
    subprocess.run(["patch", "-p1", "--quiet", "-i", str(diff)], cwd=tmp_path, check=True)
    assert PATCH.check_source(tree) == Result(APPLIED, "source carries the sglang-pcie diff")
    assert PATCH.rewrite(tree) == {}
    added = [line for line in diff.read_text().splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert all("sglang-pcie: eagle3-profile" in line for line in added if line.strip("+ "))
    decorated = [line for line in added if "@_sglang_pcie_eagle3_profile(" in line]
    assert len(decorated) == sum(len(m) for module in TARGETS for m in TARGETS[module].values()
                                 if tree.source(module) is not None)


def test_renamed_phase_method_is_drifted(pristine_source, tmp_path):
    tree = _copy_targets(pristine_source("0.5.23"), tmp_path)
    path = tree.path(V2)
    path.write_text(path.read_text().replace("def _draft_extend_for_decode(", "def _draft_extend_decode("))
    result = PATCH.check_source(tree)
    assert result.status == DRIFTED and "EagleDraftWorker._draft_extend_for_decode missing" in result.detail
    assert PATCH.rewrite(tree) == {}


def test_cycle_that_no_longer_calls_a_phase_is_drifted(pristine_source, tmp_path):
    tree = _copy_targets(pristine_source("0.5.9"), tmp_path)
    path = tree.path(V1)
    path.write_text(path.read_text().replace("self.forward_draft_extend_after_decode(batch)", "pass"))
    result = PATCH.check_source(tree)
    assert result.status == DRIFTED
    assert "forward_batch_generation no longer calls forward_draft_extend_after_decode()" in result.detail


def test_release_without_eagle_workers_is_not_applicable(pristine_source, tmp_path):
    tree = _copy_targets(pristine_source("0.5.23"), tmp_path)
    tree.path(V2).unlink()
    # Issue 11: a worker module that every covered release has is missing: moved or renamed, so drifted.
    assert PATCH.check_source(tree).status == DRIFTED


# -------------------------------------------------------------------- runtime: the real SGLang releases

# The child imports the real worker modules (the overlay activated by the real .pth hook), reports how their
# methods look, then drives the real wrapped cycle methods: SGLang's own forward_batch_generation bodies, run on
# instances made without __init__ (no GPU, no model).  The phase methods they call are set on the instance as
# ep.wrap(...) around stand-ins that return what SGLang's would (the class attributes are checked to be the
# same wrap() around SGLang's functions), so the real control flow decides what is a prefill, idle or decode
# cycle and builds the real GenerationBatchResult the tokens are counted from.


def _diffed_sources(pristine: Path, version: str, folder: Path) -> dict:
    tree = _copy_targets(pristine, folder)
    subprocess.run(["patch", "-p1", "--quiet", "-i", str(REPO / "diffs" / version / "eagle3-profile.diff")],
                   cwd=folder, check=True)
    return {name: str(tree.path(name)) for name in TARGETS if tree.path(name) is not None}


def _run_child(sglang_env, pristine_source, tmp_path, version, env, profiling):
    diffed = _diffed_sources(pristine_source(version), version, tmp_path / "diffed")
    proc = sglang_env(version).run_script("eagle3_profile_child.py", json.dumps(diffed), "1" if profiling else "0",
                                          env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


EXPECTED_MODULES = {"0.5.9": [V1, V2], "0.5.23": [V2]}


@pytest.fixture(scope="module", params=sorted(EXPECTED_MODULES))
def profiling_on(request, sglang_env, pristine_source, tmp_path_factory):
    version = request.param
    tmp = tmp_path_factory.mktemp(f"eagle-on-{version}")
    env = {"EAGLE3_PROFILE": "1", "EAGLE3_PROFILE_INTERVAL": "4", "EAGLE3_PROFILE_BASELINE_MS": "10",
           "EAGLE3_PROFILE_FILE": str(tmp / "profile.jsonl")}
    out, stderr = _run_child(sglang_env, pristine_source, tmp, version, env, profiling=True)
    return version, out, tmp / "profile.jsonl", stderr


def test_profiling_on_wraps_every_phase_method_of_the_real_workers(profiling_on):
    version, out, _, _ = profiling_on
    assert out["modules"] == EXPECTED_MODULES[version]
    for name in out["modules"]:
        for cls_name, methods in TARGETS[name].items():
            for method, phase in methods.items():
                state = out["methods"][f"{cls_name}.{method}"]
                assert state == {"marker": "eagle3-profile", "phase": phase, "own_file": False,
                                 "inner_own_file": True}, (version, cls_name, method)
    assert out["activation"] == {**{name: APPLIED for name in out["modules"]}, SPEC_INFO: APPLIED}
    assert out["check_runtime"] == APPLIED and out["create_worker_marker"] == "eagle3-profile"


def test_the_real_cycles_are_counted_by_kind_with_their_tokens(profiling_on):
    version, out, _, _ = profiling_on
    assert set(out["runs"]) == ({"v1", "v2"} if version == "0.5.9" else {"v2"})
    for kind, run in out["runs"].items():
        assert run["results"] == ["GenerationBatchResult"] * 10, kind  # SGLang's own result, passed through
        first, second = run["records"]
        assert (first["decode_cycles"], first["prefill_cycles"], first["idle_cycles"]) == (4, 1, 1), kind
        assert (second["decode_cycles"], second["prefill_cycles"]) == (4, 0), kind
        for record in (first, second):
            # v1: accepted drafts [1, 2, 0] + a bonus token each; v2: accept_lens [2, 3, 1]: 6 tokens, 3 requests
            assert (record["tokens"], record["decode_requests"], record["accept_length"]) == (24, 12, 2.0), kind
            phases = record["phases_ms"]
            parts = sum(phases[p]["mean"] for p in ("draft", "verify", "draft_extend", "other"))
            assert parts == pytest.approx(phases["cycle"]["mean"]), kind
            assert record["projected_speedup"] == pytest.approx(2.0 * 10 / record["wall_cycle_ms"])
            # the invariant is over the same cycles (the timed ones); the all-cycle wall mean is another sample
            assert record["phases_sum_ms"] <= record["cycle_ms"] <= record["timed_wall_cycle_ms"], kind
            assert record["accept_length_exact"] and record["timed_cycles"] == 4
            assert record["timer"] == "host" and record["tp_rank"] == 0 and record["baseline_ms"] == 10.0
        assert not any(r["partial"] for r in run["records"])  # 8 decode cycles: exactly two intervals


def test_one_log_line_per_interval_through_the_worker_modules_logger(profiling_on):
    version, out, _, _ = profiling_on
    for kind, run in out["runs"].items():
        module = V1 if kind == "v1" else V2
        setup, intervals = run["log"][:1], run["log"][1:]  # the set-up line at the first cycle, then the intervals
        assert [(e["logger"], e["level"]) for e in run["log"]] == [(module, "INFO")] * 3, kind
        assert "set up in" in setup[0]["message"] and profile_report.parse_log_line(setup[0]["message"]) is None
        parsed = [profile_report.parse_log_line(e["message"]) for e in intervals]
        assert [p["decode_cycles"] for p in parsed] == [4, 4] and parsed[0]["accept_length"] == 2.0


def test_only_tp_rank0_reports(profiling_on):
    _, out, _, _ = profiling_on
    rank1 = out["rank1"]
    assert rank1["results"] == ["GenerationBatchResult"] * 10
    assert not rank1["active"] and not rank1["records"] and not rank1["log"]


def test_only_tp_rank0_of_a_real_0_5_23_worker_reports_its_rank_from_sglangs_runtime_context(profiling_on):
    """0.5.16+ v2 workers have no tp_rank: the rank comes from SGLang's runtime context (mutant: read as 0)."""
    version, out, _, _ = profiling_on
    if version != "0.5.23":
        assert "context_rank1" not in out  # 0.5.9 has no runtime context: its workers carry tp_rank
        return
    assert out["class_has_tp_rank"] is False
    rank1, rank0 = out["context_rank1"], out["context_rank0"]
    assert rank1["tp_rank_attr"] is False and rank0["tp_rank_attr"] is False
    assert rank1["results"] == rank0["results"] == ["GenerationBatchResult"] * 10
    assert not rank1["active"] and not rank1["records"] and not rank1["log"]
    assert rank0["active"] and [r["tp_rank"] for r in rank0["records"]] == [0, 0]


def test_eagle_family_workers_that_are_not_timed_warn_once_naming_the_class(profiling_on):
    version, out, _, _ = profiling_on
    if version != "0.5.23":  # 0.5.9's multi-layer EAGLE modules do not import without a GPU
        return
    untimed = out["untimed"]
    assert {label: (u["class"], u["timed"]) for label, u in untimed.items()} == {
        "multi_layer": ("MultiLayerEagleWorkerV2", False), "frozen_kv_mtp": ("FrozenKVMTPWorkerV2", False),
        "eagle3": ("EAGLEWorkerV2", True), "standalone": ("StandaloneWorkerV2", True)}
    for label, module in (("multi_layer", "multi_layer_eagle_worker_v2"), ("frozen_kv_mtp", "frozen_kv_mtp_worker_v2")):
        (logger, level, message), = untimed[label]["warnings"]  # two cycles, one warning
        assert logger == f"sglang.srt.speculative.{module}" and level == "WARNING"
        assert f"{untimed[label]['class']} (sglang.srt.speculative.{module}) is not timed" in message
        assert untimed[label]["own_method_back"]  # after the first cycle the class runs SGLang's method untouched
    assert untimed["eagle3"]["warnings"] == [] and untimed["standalone"]["warnings"] == []


def test_json_lines_file_holds_one_object_per_interval_and_the_partial_one_at_exit(profiling_on):
    _, out, path, _ = profiling_on
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(set(line) == RECORD_KEYS and line["schema"] == ep.SCHEMA for line in lines)
    before_exit = out["file_lines_before_exit"]
    drives = [*out["runs"].values(), out["no_prometheus"], out["prometheus_run"]] + \
        [out[key] for key in ("context_rank0",) if key in out]
    assert before_exit == 2 * len(drives)
    # the last run: 6 decode cycles at interval 4, not flushed by the test: the exit flush wrote the last 2
    assert [(r["decode_cycles"], r["partial"]) for r in lines[before_exit:]] == [(4, False), (2, True)]
    assert len({line["run_id"] for line in lines}) == 1 and lines[0]["run_id"].endswith(f"-{lines[0]['pid']}")
    summary = profile_report.summarise(profile_report.read_records(path.read_text().splitlines()))
    assert summary["decode_cycles"] == 8 * len(drives) + 6 and summary["accept_length"] == 2.0


def test_prometheus_metrics_when_sglang_metrics_are_on_and_nothing_breaks_without_the_client(profiling_on):
    _, out, _, _ = profiling_on
    assert len(out["no_prometheus"]["records"]) == 2
    assert any("Prometheus export off" in e["message"] for e in out["no_prometheus"]["log"])
    assert len(out["prometheus_run"]["records"]) == 2
    counts = set(out["prometheus"])
    for phase in ("draft", "verify", "draft_extend", "cycle"):
        assert f'sglang_pcie_eagle_phase_seconds_count{{model_name="m",phase="{phase}"}} 8.0' in counts
    assert 'sglang_pcie_eagle_phase_seconds_count{model_name="m",phase="prefill"} 1.0' in counts
    assert 'sglang_pcie_eagle_accept_length_count{model_name="m"} 8.0' in counts


def test_the_diffed_source_times_the_same_methods_and_the_runtime_patch_stands_aside(profiling_on):
    _, out, _, _ = profiling_on
    for name, diffed in out["diffed"].items():
        assert diffed["phases"] == {f"{c}.{m}": p for c, ms in TARGETS[name].items() for m, p in ms.items()}
        assert diffed["apply"] == [APPLIED, "source carries the sglang-pcie diff"]
        assert diffed["unchanged_by_apply"]


# Off: 0.5.9 with EAGLE3_PROFILE unset, 0.5.23 with an invalid value (a warning naming it, then off).
OFF_ENV = {"0.5.9": {}, "0.5.23": {"EAGLE3_PROFILE": "maybe"}}


@pytest.mark.parametrize("version", sorted(OFF_ENV))
def test_profiling_off_leaves_the_release_methods_its_own(sglang_env, pristine_source, tmp_path, version):
    out, stderr = _run_child(sglang_env, pristine_source, tmp_path, version, OFF_ENV[version], profiling=False)
    assert out["modules"] == EXPECTED_MODULES[version]
    for key, state in out["methods"].items():
        assert state == {"marker": None, "phase": None, "own_file": True, "inner_own_file": False}, key
    assert out["activation"] == {} and "EAGLE3_PROFILE" in out["switched_off"]
    assert out["check_runtime"] == "disabled" and out["decorator_is_identity"]
    for name, diffed in out["diffed"].items():  # the diff's decorator is the identity too
        assert set(diffed["phases"].values()) == {None}, name
    warnings = [line for line in stderr.splitlines() if "EAGLE3_PROFILE=" in line]
    if OFF_ENV[version]:
        assert len(warnings) == 1 and "EAGLE3_PROFILE='maybe'" in warnings[0]
    else:
        assert warnings == []
