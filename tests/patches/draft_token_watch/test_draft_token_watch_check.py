"""The draft-token-watch patch against the pristine sources of every covered release: the static check, the committed
diffs equal to ``rewrite``, the diff applied beside eagle3-profile's (the same methods; they must not collide) and
compiled, the install on stand-in modules.  The watch itself:
tests/patches/draft_token_watch/test_draft_token_watch_payload.py."""
from __future__ import annotations

import re
import shutil
import subprocess
import types

import pytest

from sglang_pcie.patching.diffs import diff_for
from sglang_pcie.patches.draft_token_watch.check import LOGITS, PATCH, V1, V2
from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DRIFTED, Drift, Result, is_patched
from sglang_pcie.patching.releases import COVERED_RELEASES
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patches.draft_token_watch import payload as draft_watch

from support import REPO

V1_RELEASES = COVERED_RELEASES[:COVERED_RELEASES.index("0.5.12.post1") + 1]


def test_every_covered_release_is_applicable_on_the_workers_it_has(pristine_source):
    for version in COVERED_RELEASES:
        result = PATCH.check_source(SourceTree(pristine_source(version)))
        assert result.status == APPLICABLE, (version, result)
        assert ("v1 EAGLEWorker.verify" in result.detail) == (version in V1_RELEASES), version
        assert "v2 EAGLEWorkerV2.verify" in result.detail, version
        assert result.detail.startswith("counts every verify in LogitsProcessor.forward"), version


def test_committed_diffs_are_what_the_patch_generates(pristine_source):
    for version in COVERED_RELEASES:
        committed = REPO / "diffs" / version / "draft-token-watch.diff"
        assert committed.read_text() == diff_for(PATCH, SourceTree(pristine_source(version))), version


@pytest.mark.parametrize("version", ["0.5.8", "0.5.11", "0.5.16", "0.5.23"])
def test_the_diff_applies_beside_eagle3_profiles_compiles_and_reads_as_applied(pristine_source, tmp_path, version):
    root = pristine_source(version)
    for module in (V1, V2, LOGITS):
        rel = module.replace(".", "/") + ".py"
        if (root / rel).is_file():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / rel, tmp_path / rel)
    for name in ("sglang/__init__.py", "sglang/version.py", "sglang/srt/speculative/eagle_info.py"):
        if (root / name).is_file():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / name, tmp_path / name)
    for patch_id in ("eagle3-profile", "draft-token-watch"):  # both diffs, in apply-diffs' (the register's) order
        diff = REPO / "diffs" / version / f"{patch_id}.diff"
        subprocess.run(["patch", "-p1", "--quiet", "--forward", "-F0", "-i", str(diff)], cwd=tmp_path, check=True)
    tree = SourceTree(tmp_path)
    assert PATCH.check_source(tree) == Result(APPLIED, "source carries the sglang-pcie diff")
    for module in (V1, V2):
        if tree.source(module) is not None:
            compile(tree.source(module), module, "exec", dont_inherit=True)
            assert ".verify)  # sglang-pcie: draft-token-watch\n" in tree.source(module)
            load_step = "EagleDraftWorker.init_lm_head" if module == V2 else "EAGLEWorker.init_cuda_graphs"
            assert tree.source(module).rstrip().endswith(f"({load_step})  # sglang-pcie: draft-token-watch")
    compile(tree.source(LOGITS), LOGITS, "exec", dont_inherit=True)
    assert tree.source(LOGITS).rstrip().endswith(
        "LogitsProcessor.forward = _sglang_pcie_draft_token_watch('verify-logits')(LogitsProcessor.forward)  "
        "# sglang-pcie: draft-token-watch")


@pytest.mark.parametrize("module, old, new, detail", [
    (LOGITS, "next_token_logits", "token_logits", f"{LOGITS} no longer names next_token_logits (what the count reads)"),
    ("sglang.srt.model_executor.forward_batch_info", "is_target_verify", "is_verify",
     "forward_batch_info no longer names is_target_verify (what the count reads)"),
    (LOGITS, "lm_head", "head",
     "LogitsProcessor.forward takes (self, input_ids, hidden_states, head, logits_metadata)"),
])
def test_what_the_count_reads_renamed_is_drift_naming_it(pristine_source, tmp_path, module, old, new, detail):
    root = pristine_source("0.5.23")
    shutil.copytree(root / "sglang", tmp_path / "sglang")
    path = tmp_path / (module.replace(".", "/") + ".py")
    path.write_text(re.sub(rf"\b{old}\b", new, path.read_text()))
    result = PATCH.check_source(SourceTree(tmp_path))
    assert result.status == DRIFTED and detail in result.detail, result.detail


def test_the_verify_results_fields_are_no_longer_read(pristine_source, tmp_path):
    """The turn reads no accepted lengths: the count reads the target's verify forward."""
    root = pristine_source("0.5.23")
    shutil.copytree(root / "sglang", tmp_path / "sglang")
    path = tmp_path / "sglang/srt/managers/utils.py"  # GenerationBatchResult, what v2's verify returns
    path.write_text(path.read_text().replace("accept_lens", "accepted_lengths"))
    assert PATCH.check_source(SourceTree(tmp_path)).status == APPLICABLE


def _module(name, verify):
    """A worker module as SGLang's: the worker class with ``verify`` and the set-up step the map check follows (v2:
    ``EagleDraftWorker.init_lm_head``, v1: ``EAGLEWorker.init_cuda_graphs``)."""
    module = types.ModuleType(name)

    def set_up(self):
        return None
    if name == V2:
        cls = type("EAGLEWorkerV2", (), {"verify": verify})
        module.EagleDraftWorker = type("EagleDraftWorker", (), {"init_lm_head": set_up})
    else:
        cls = type("EAGLEWorker", (), {"verify": verify, "init_cuda_graphs": set_up})
    setattr(module, cls.__name__, cls)
    return module, cls


def test_install_wraps_verify_once_and_refuses_a_wrong_shape_changing_nothing():
    def verify(self, batch):
        return "result"
    module, cls = _module(V2, verify)
    assert PATCH.install(module, None).status == APPLIED
    first = cls.verify
    assert is_patched(first, draft_watch.PATCH_ID)
    PATCH.install(module, None)
    assert cls.verify is first  # idempotent

    def wrong(self, forward_batch, spec_info):
        return None
    module, cls = _module(V1, wrong)
    with pytest.raises(Drift, match=r"takes \(self, forward_batch\), not \(self, batch\)"):
        PATCH.install(module, None)
    assert cls.verify is wrong


def _logits_module():
    module = types.ModuleType(LOGITS)
    module.LogitsProcessor = type("LogitsProcessor", (), {
        "forward": lambda self, input_ids, hidden_states, lm_head, logits_metadata: None})
    return module


def test_check_runtime_says_disabled_when_switched_off_and_names_what_is_not_watched():
    from sglang_pcie.runtime.settings import load_settings
    from sglang_pcie.patching.engine import DISABLED, NOT_APPLICABLE

    module, cls = _module(V2, lambda self, batch: None)
    logits = _logits_module()
    switched_off = PATCH.check_runtime({V2: module}, load_settings({"SGLANG_PCIE_DISABLE_PATCHES": PATCH.id}))
    assert switched_off == Result(DISABLED, "listed in SGLANG_PCIE_DISABLE_PATCHES")
    assert PATCH.check_runtime({V2: module}, load_settings({"SGLANG_PCIE_DISABLE": "1"})) == \
        Result(DISABLED, "SGLANG_PCIE_DISABLE is set")
    on = load_settings({})
    assert PATCH.check_runtime({}, on) == Result(NOT_APPLICABLE, f"none of {V2}, {V1}, {LOGITS} in this release")
    old, _ = _module(V1, lambda self, batch: None)
    assert PATCH.check_runtime({V1: old, V2: module, LOGITS: logits}, on) == Result(DRIFTED, (
        "not in effect in this process: EAGLEWorkerV2.verify is not wrapped; EAGLEWorker.verify is not wrapped; "
        "LogitsProcessor.forward is not wrapped; EagleDraftWorker.init_lm_head is not wrapped; "
        "EAGLEWorker.init_cuda_graphs is not wrapped"))
    PATCH.install(module, on)
    PATCH.install(logits, on)
    assert PATCH.check_runtime({V1: old, V2: module, LOGITS: logits}, on) == Result(DRIFTED, (
        "not in effect in this process: EAGLEWorker.verify is not wrapped; EAGLEWorker.init_cuda_graphs is not "
        "wrapped"))
    assert PATCH.check_runtime({V2: module, LOGITS: logits}, on) == Result(APPLIED, (
        "watching v2 EAGLEWorkerV2.verify (its turn: the looks at the first drafts counted); counting each target "
        "verify's first drafts per token in LogitsProcessor.forward (captured in SGLang's CUDA graphs: every "
        "verify); checking the vocabulary map at load (the drafter's lm_head rows against the target's) after v2 "
        "EagleDraftWorker.init_lm_head"))
    assert PATCH.check_runtime({V2: module}, load_settings({"SGLANG_PCIE_DISABLE_PATCHES": PATCH.id})).status == \
        DISABLED  # switched off in this process: disabled, however the class looks


def test_the_static_check_drifts_on_a_coroutine_verify_or_verify_input_gone_and_reads_half_baked_as_unbaked(
        pristine_source, tmp_path):
    root = pristine_source("0.5.9")  # both workers
    shutil.copytree(root / "sglang", tmp_path / "sglang")
    v1, v2 = (tmp_path / (m.replace(".", "/") + ".py") for m in (V1, V2))
    v2_text = v2.read_text()
    v2.write_text(v2_text + "\n# sglang-pcie: draft-token-watch\n")  # one of the two modules baked
    assert PATCH.check_source(SourceTree(tmp_path)).status == APPLICABLE
    v1.write_text(v1.read_text() + "\n# sglang-pcie: draft-token-watch\n")
    assert PATCH.check_source(SourceTree(tmp_path)).status == APPLICABLE  # the logits processor not baked
    logits = tmp_path / (LOGITS.replace(".", "/") + ".py")
    logits_text = logits.read_text()
    logits.write_text(logits_text + "\n# sglang-pcie: draft-token-watch\n")
    assert PATCH.check_source(SourceTree(tmp_path)) == Result(APPLIED, "source carries the sglang-pcie diff")
    logits.write_text(logits_text)
    v1.write_text(v1.read_text().replace("\n# sglang-pcie: draft-token-watch\n", ""))
    v2.write_text(v2_text.replace("    def verify(self, batch", "    async def verify(self, batch"))
    result = PATCH.check_source(SourceTree(tmp_path))
    assert result == Result(DRIFTED, f"{V2}: EAGLEWorkerV2.verify is a coroutine function now")
    v2.write_text(v2_text)
    info = tmp_path / "sglang/srt/speculative/eagle_info.py"
    info.write_text(info.read_text().replace("class EagleVerifyInput", "class EagleVerifyBatch"))
    result = PATCH.check_source(SourceTree(tmp_path))
    assert result == Result(DRIFTED, "sglang.srt.speculative.eagle_info: class EagleVerifyInput missing (the verify "
                                     "input the count knows)")
