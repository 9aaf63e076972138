"""Hidden drift: copies of real releases whose patch targets were renamed, moved or reshaped, as SGLang does.

The danger of an overlay is a patch that silently stops fitting.  Each case edits a pristine release the way an
upstream refactor would, and the static check, ci/check-sglang-releases and ci/prepare-release-diffs must all
report that patch `drifted` (or name it for a human), while the other patches read exactly as on the release.
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from support.releases import release_copy

from sglang_pcie.patching.engine import DRIFTED
from sglang_pcie.patching.matrix import check_tree
from sglang_pcie.patching.releases import fetch_source

from support import REPO

pytestmark = pytest.mark.slow  # upstream tracking over every release tree: CI runs it, the fast loop leaves it out
# What the patches' static checks read, copied instead of a release's 4,700 files.  The control test below


# proves the copy reads exactly as the release, so a case cannot pass merely because a file was left out.
READ_BY_THE_CHECKS = (
    "sglang/__init__.py", "sglang/version.py", "sglang/_version.py",
    "sglang/srt/layers/communicator.py", "sglang/srt/layers/flashinfer_comm_fusion.py",
    "sglang/srt/layers/layer_boundary/residual/add_norm.py",
    "sglang/srt/speculative", "sglang/srt/models", "sglang/srt/model_executor",
    "sglang/srt/runtime_context.py", "sglang/srt/utils/__init__.py", "sglang/srt/utils/common.py",
    "sglang/srt/distributed",
    "sglang/srt/managers/tokenizer_manager.py", "sglang/srt/managers/utils.py",
)
COMMUNICATOR = "sglang/srt/layers/communicator.py"
FUSION = "sglang/srt/layers/flashinfer_comm_fusion.py"
ADD_NORM = "sglang/srt/layers/layer_boundary/residual/add_norm.py"
EAGLE_V1 = "sglang/srt/speculative/eagle_worker.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
KIMI = "sglang/srt/models/kimi_k25.py"
TOKENIZER_MANAGER = "sglang/srt/managers/tokenizer_manager.py"
PARALLEL_STATE = "sglang/srt/distributed/parallel_state.py"


def copy_release(version: str, dest: Path) -> Path:
    return release_copy(version, dest, only=list(READ_BY_THE_CHECKS))


def replace(rel: str, *pairs: tuple[str, str]) -> Callable[[Path], None]:
    """An edit of one file: every occurrence of each old text (which must be there) replaced."""
    def edit(root: Path) -> None:
        path = root / rel
        text = path.read_text(encoding="utf-8")
        for old, new in pairs:
            assert old in text, f"{rel} has no {old!r}: the case no longer matches the release"
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    return edit


def move_gate_to_its_own_module(root: Path) -> None:
    """0.5.23's gate moved from add_norm.py to a new module, which add_norm.py imports it from."""
    add_norm = root / ADD_NORM
    lines = add_norm.read_text(encoding="utf-8").splitlines(keepends=True)
    gate = next(node for node in ast.parse("".join(lines)).body
                if isinstance(node, ast.FunctionDef) and node.name == "flashinfer_ar_fusion_applies")
    body = "".join(lines[gate.lineno - 1:gate.end_lineno])
    (add_norm.parent / "fusion_gate.py").write_text(
        "from sglang.srt.layers.layer_boundary.residual.add_norm import *  # noqa\n\n\n" + body, encoding="utf-8")
    lines[gate.lineno - 1:gate.end_lineno] = [
        "from sglang.srt.layers.layer_boundary.residual.fusion_gate import flashinfer_ar_fusion_applies\n"]
    add_norm.write_text("".join(lines), encoding="utf-8")


@dataclass(frozen=True)
class Case:
    name: str
    version: str
    patch: str
    edit: Callable[[Path], None]
    detail: str  # what the drifted result must say
    also: tuple[str, ...] = ()  # other patches that hook the same code and must read drifted too

    def __str__(self):
        return self.name


CASES = [
    Case("fusion gate renamed", "0.5.9", "sm120-allreduce-fusion",
         replace(COMMUNICATOR, ("apply_flashinfer_allreduce_fusion(", "flashinfer_allreduce_fusion_enabled(")),
         "no fusion gate"),
    Case("fusion gate moved to another module", "0.5.23", "sm120-allreduce-fusion",
         move_gate_to_its_own_module, "no fusion gate"),
    Case("fusion gate's SM check reshaped", "0.5.9", "sm120-allreduce-fusion",
         replace(COMMUNICATOR, ("(_is_sm90_supported or _is_sm100_supported)", "_is_sm90_or_sm100_supported")),
         "apply_flashinfer_allreduce_fusion"),
    Case("backend resolver's SM check reshaped", "0.5.23", "sm120-allreduce-fusion",
         replace(FUSION, ("if not (get_platform().is_sm90 or get_platform().is_sm100):",
                          "if get_platform().device_capability_major not in (9, 10):")),
         "_resolve_backend"),
    Case("v1 EAGLE worker's re-extend method renamed", "0.5.9", "eagle3-profile",
         replace(EAGLE_V1, ("def forward_draft_extend_after_decode(", "def draft_extend_after_decode("),
                 ("self.forward_draft_extend_after_decode(", "self.draft_extend_after_decode(")),
         "forward_draft_extend_after_decode"),
    Case("v2 EAGLE draft worker's draft method renamed", "0.5.23", "eagle3-profile",
         replace(EAGLE_V2, ("    def draft(self", "    def draft_tokens(self"),
                 (".draft_worker.draft(", ".draft_worker.draft_tokens(")),
         "draft"),
    Case("v2 EAGLE worker class renamed", "0.5.23", "eagle3-profile",
         replace(EAGLE_V2, ("class EAGLEWorkerV2(", "class EagleWorkerV2(")),
         "EAGLEWorkerV2", also=("draft-token-watch",)),
    Case("verify input's draft tokens renamed", "0.5.23", "draft-token-watch",
         replace("sglang/srt/speculative/eagle_info.py", ("draft_token", "draft_ids")),
         "EagleVerifyInput no longer has draft_token"),
    Case("Kimi-K2.5 wrapper builds its language model through a factory", "0.5.9", "drafter-delegation",
         replace(KIMI, ("self.language_model = DeepseekV3ForCausalLM(", "self.language_model = build_text_model(")),
         "KimiK25ForConditionalGeneration no longer holds"),
    Case("EAGLE worker calls a new method on the target model", "0.5.9", "drafter-delegation",
         replace(EAGLE_V1, ("self.target_worker.model_runner.model.get_embed_and_head()",
                            "self.target_worker.model_runner.model.get_input_and_lm_head()")),
         "get_input_and_lm_head"),
    Case("tokenizer manager's accepted-draft counter renamed", "0.5.23", "accept-length-alarm",
         replace(TOKENIZER_MANAGER, ("recv_obj.spec_num_correct_drafts", "recv_obj.spec_num_accepted_drafts")),
         "reads none of recv_obj.spec_accepted_tokens"),
    Case("per-request spec metrics computed for every streamed chunk", "0.5.9", "accept-length-alarm",
         replace(TOKENIZER_MANAGER,
                 ("                if self.server_args.speculative_algorithm:\n"
                  "                    self._calculate_spec_decoding_metrics(meta_info, recv_obj, i)\n", ""),
                 ("            if getattr(state.obj, \"return_logprob\", False):\n",
                  "            if self.server_args.speculative_algorithm:\n"
                  "                self._calculate_spec_decoding_metrics(meta_info, recv_obj, i)\n"
                  "            if getattr(state.obj, \"return_logprob\", False):\n")),
         "is called outside the finished-request branch"),
    Case("world set-up function renamed", "0.5.23", "node-agreement",
         replace(PARALLEL_STATE, ("def init_distributed_environment(", "def init_distributed_env(")),
         "parallel_state has no module-level init_distributed_environment"),
    Case("world group builds a PyNccl communicator", "0.5.9", "node-agreement",
         replace(PARALLEL_STATE, ("use_pynccl=False,\n        use_pymscclpp", "use_pynccl=True,\n        use_pymscclpp")),
         "init_world_group no longer passes use_pynccl=False"),
]


# Changes a patch follows by design: the static check must still say it fits, not cry drift.
TOLERATED = [
    Case("Kimi-K2.5 wrapper's language model attribute renamed", "0.5.9", "drafter-delegation",
         replace(KIMI, ("self.language_model", "self.text_model")),
         "kimi_k25.KimiK25ForConditionalGeneration (.text_model)"),
]


@pytest.fixture(scope="module")
def pristine_results():
    """Each patch's static result on the pristine releases the cases start from."""
    return {version: check_tree(str(fetch_source(version)))[1] for version in sorted({c.version for c in CASES + TOLERATED})}


def drifted_copy(case: Case, dest: Path) -> Path:
    root = copy_release(case.version, dest)
    case.edit(root)
    return root


def test_every_patch_has_hidden_drift_cases():
    from sglang_pcie.patching.engine import all_patches

    assert {patch.id for patch in all_patches()} <= {case.patch for case in CASES}


@pytest.mark.parametrize("version", sorted({case.version for case in CASES}))
def test_the_trimmed_copy_reads_exactly_as_the_release(version, pristine_results, tmp_path):
    version_read, rows, _ = check_tree(str(copy_release(version, tmp_path)))
    assert version_read == version
    assert rows == pristine_results[version]
    assert all(row["status"] != DRIFTED for row in rows)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_static_check_reports_hidden_drift(case, pristine_results, tmp_path):
    _, rows, _ = check_tree(str(drifted_copy(case, tmp_path)))
    cell = next(row for row in rows if row["id"] == case.patch)
    assert cell["status"] == DRIFTED, cell
    assert case.detail in cell["detail"], cell
    for patch_id in case.also:
        assert next(row for row in rows if row["id"] == patch_id)["status"] == DRIFTED, patch_id
    hit = {case.patch, *case.also}
    others = [row for row in rows if row["id"] not in hit]
    assert others == [row for row in pristine_results[case.version] if row["id"] not in hit]


@pytest.mark.parametrize("case", TOLERATED, ids=str)
def test_a_change_the_patch_follows_is_not_drift(case, pristine_results, tmp_path):
    _, rows, _ = check_tree(str(drifted_copy(case, tmp_path)))
    cell = next(row for row in rows if row["id"] == case.patch)
    pristine = next(row for row in pristine_results[case.version] if row["id"] == case.patch)
    assert cell["status"] == pristine["status"], cell
    assert case.detail in cell["detail"] and case.detail not in pristine["detail"], cell


def test_check_sglang_releases_reports_every_drifted_copy(tmp_path):
    sources = [drifted_copy(case, tmp_path / f"case{i}") for i, case in enumerate(CASES)]
    cmd = [sys.executable, str(REPO / "ci" / "check-sglang-releases"), "--json"]
    for source in sources:
        cmd += ["--sglang-source", str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["releases"]
    assert [row["source"] for row in rows] == [str(source) for source in sources]
    for case, row in zip(CASES, rows):
        assert row["version"] == case.version
        cell = next(c for c in row["patches"] if c["id"] == case.patch)
        assert cell["status"] == DRIFTED, (case.name, cell)


def test_prepare_release_diffs_names_the_drifted_patch(tmp_path):
    """On the pristine 0.5.23 the 0.5.22 eagle3-profile diff carries over; with the draft method renamed it may not."""
    case = next(c for c in CASES if c.name == "v2 EAGLE draft worker's draft method renamed")
    source = drifted_copy(case, tmp_path / "sglang-0.5.23")
    shutil.copytree(REPO / "diffs" / "0.5.22", tmp_path / "diffs" / "0.5.22")
    proc = subprocess.run([sys.executable, str(REPO / "ci" / "prepare-release-diffs"), "0.5.23",
                           "--sglang-source", str(source), "--diffs-dir", str(tmp_path / "diffs")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NEEDS A HUMAN  eagle3-profile: static check says drifted:" in proc.stdout
    assert "fix sglang_pcie/patching/eagle3_profile.py for sglang 0.5.23" in proc.stderr
    assert (REPO / "sglang_pcie" / "patching" / "eagle3_profile.py").is_file()  # the path printed is the patch's
    assert not (tmp_path / "diffs" / "0.5.23" / "eagle3-profile.diff").exists()
