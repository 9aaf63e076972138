"""drafter-delegation: static checks on the 21 pristine releases, the versioned diffs, and the real SGLang 0.5.9 /
0.5.23 (the wrapped ModelRunner.load_model run for real, with only the weight loading replaced).
"""
from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DRIFTED
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patching.diffs import diff_for
from sglang_pcie.patches.drafter_delegation import check as dd
from sglang_pcie.patches.drafter_delegation.check import PATCH
from sglang_pcie.patching.releases import COVERED_RELEASES

from support import REPO
KIMI = "kimi_k25.KimiK25ForConditionalGeneration"
TRIO = ("set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head")
RUNNER_FILE = "sglang/srt/model_executor/model_runner.py"


def released_before(version: str, other: str) -> bool:
    return COVERED_RELEASES.index(version) < COVERED_RELEASES.index(other)


# What the EAGLE code path calls on the target model, read off each release by hand:
# (methods called, names only probed with hasattr/getattr first).
def expected_target_calls(version: str) -> tuple[set, set]:
    called = {"get_embed_and_head", "set_eagle3_layers_to_capture"}
    probed = set()
    if not released_before(version, "0.5.15"):
        probed.add("lm_head")  # eagle_worker_v2.init_lm_head: getattr(target, "lm_head", None)
    if not released_before(version, "0.5.21"):
        called.add("named_modules")  # pp_draft_embedding: PPMissingLayer check (nn.Module's own)
    if not released_before(version, "0.5.22"):
        called.add("get_embed_and_head_for_draft")  # pp_draft_embedding, after hasattr
        probed.add("get_embed_and_head_for_draft")
    return called, probed


@pytest.fixture(scope="module")
def trees(pristine_source):
    return {version: SourceTree(pristine_source(version)) for version in COVERED_RELEASES}


@pytest.fixture(scope="module")
def wrappers(trees):
    return {version: {w.label: w for w in dd.model_wrappers(tree)} for version, tree in trees.items()}


# -- static, every release

@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_eagle_path_calls_only_what_the_patch_forwards(trees, version):
    called, probed = dd.eagle_target_methods(trees[version])
    assert (called, probed) == expected_target_calls(version)
    assert not called - set(dd.DELEGATED_METHODS) - dd.MODULE_API - probed


@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_every_name_the_wrapper_relies_on_is_there(trees, version):
    assert dd.hook_problems(trees[version]) == []


@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_kimi_k25_wrapper(wrappers, version):
    kimi = wrappers[version].get(KIMI)
    if released_before(version, "0.5.9"):
        assert kimi is None  # no kimi_k25.py before 0.5.9
    elif version == "0.5.9":
        assert (kimi.attr, kimi.inner, kimi.missing) == ("language_model", ("DeepseekV3ForCausalLM",), TRIO)
    else:  # upstream from 0.5.10: recognised as a wrapper, nothing to add
        assert (kimi.attr, kimi.missing) == ("language_model", ())


@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_check_source_names_the_classes_that_would_gain_methods(trees, wrappers, version):
    result = PATCH.check_source(trees[version])
    qualifying = [label for label, w in wrappers[version].items() if set(w.missing) & set(dd.CAPABLE)]
    # Other wrappers (llava, internvl, qwen2_audio...) lack the methods in every release, so it always applies.
    assert result.status == APPLICABLE and qualifying
    assert all(f"{label} (." in result.detail for label in qualifying)
    assert (KIMI in result.detail) == (version == "0.5.9")


def test_rule_keeps_out_what_delegation_would_break(wrappers):
    found = wrappers["0.5.9"]
    # Runs self.llm.model (the backbone) and its own logits processor: capture would hand it a tuple.
    assert "sarashina2_vision.Sarashina2VisionForCausalLM" not in found
    # Its language model (NemotronHForCausalLM) cannot capture EAGLE-3 hidden states.
    assert "nano_nemotron_vl.NemotronH_Nano_VL_V2" not in found
    # forward inherited from LlavaBaseForCausalLM, language_model assigned in the subclass.
    assert found["llava.LlavaQwenForCausalLM"].missing == TRIO
    # Holds the language model as .model and already has get_embed_and_head: only the rest is added.
    assert found["dots_ocr.DotsOCRForCausalLM"].missing == ("set_eagle3_layers_to_capture", "set_embed_and_head")
    assert found["internvl.InternVLChatModel"].inner == (
        "Qwen2ForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM", "Qwen3ForCausalLM")


def reference_wrappers(root: Path) -> dict:
    """The same rule, with every file of srt/models parsed by ast (slow): checks the text filters lose nothing."""
    trees = {p.stem: ast.parse(p.read_bytes()) for p in sorted((root / "sglang/srt/models").glob("*.py"))}
    classes = {(m, n.name): n for m, t in trees.items() for n in t.body if isinstance(n, ast.ClassDef)}
    imports = {m: {a.asname or a.name: (node.module.rsplit(".", 1)[-1], a.name)
                   for node in t.body if isinstance(node, ast.ImportFrom) and node.module
                   and (node.level == 1 or node.module.startswith("sglang.srt.models."))
                   for a in node.names} for m, t in trees.items()}

    def resolve(module, name, depth=0):
        if (module, name) in classes:
            return module, name
        target = imports[module].get(name)
        return resolve(*target, depth + 1) if target and target[0] in trees and depth < 5 else None

    def members(node):
        names = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        names |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        names |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and n.value is not None
                  and isinstance(n.target, ast.Name)}
        return names

    def base_keys(key):
        return [k for b in classes[key].bases if (k := resolve(key[0], ast.unparse(b).rsplit(".", 1)[-1]))]

    def offers(key, member, depth=0):
        return key is not None and depth < 20 and (
            member in members(classes[key]) or any(offers(k, member, depth + 1) for k in base_keys(key)))

    def forward(key, depth=0):
        own = [n for n in classes[key].body if isinstance(n, ast.FunctionDef) and n.name == "forward"]
        return own[0] if own else next((f for k in base_keys(key) if depth < 20
                                        and (f := forward(k, depth + 1)) is not None), None)

    def capable(module, name):
        return all(offers(resolve(module, name), m) for m in dd.CAPABLE)

    found = {}
    for key, node in classes.items():
        module, name = key
        assignments = [pair for f in node.body if isinstance(f, ast.FunctionDef) for pair in dd.inner_model_assignments(f)]
        wrapper = dd.classify(f"{dd.MODELS}.{module}", name, assignments, forward(key),
                              is_capable=lambda callee: capable(module, callee),
                              inner_offers=lambda callee, m: offers(resolve(module, callee), m),
                              lacks=lambda m: not offers(key, m))
        if wrapper:
            found[wrapper.label] = wrapper
    return found


@pytest.mark.parametrize("version", ["0.5.8", "0.5.9", "0.5.16", "0.5.23"])
def test_text_filters_lose_nothing(trees, wrappers, version):
    assert wrappers[version] == reference_wrappers(trees[version].root)


def copy_tree(source: SourceTree, destination: Path) -> SourceTree:
    """The parts of a release check_source reads, copied so that a test can edit them."""
    (destination / "sglang").mkdir(parents=True)
    shutil.copy(source.root / "sglang" / "__init__.py", destination / "sglang")
    for folder in ("models", "speculative", "model_executor"):
        shutil.copytree(source.root / "sglang" / "srt" / folder, destination / "sglang" / "srt" / folder)
    return SourceTree(destination)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def test_drifted_when_the_eagle_worker_calls_something_new(trees, tmp_path):
    tree = copy_tree(trees["0.5.9"], tmp_path)
    edit(tree.path("sglang.srt.speculative.eagle_worker"),
         "embed, head = self.target_worker.model_runner.model.get_embed_and_head()",
         "embed, head = self.target_worker.model_runner.model.get_shared_embed_and_head()")
    result = PATCH.check_source(tree)
    assert result.status == DRIFTED and "get_shared_embed_and_head" in result.detail


def test_drifted_when_kimi_k25_no_longer_hands_over_its_language_model(trees, tmp_path):
    tree = copy_tree(trees["0.5.9"], tmp_path)
    edit(tree.path("sglang.srt.models.kimi_k25"), "language_model=self.language_model,",
         "language_model=self.language_model.model,")
    result = PATCH.check_source(tree)
    assert result.status == DRIFTED and dd.KIMI_CLASS in result.detail
    assert PATCH.rewrite(tree) == {}  # no diff for a release the patch does not fit


def test_kimi_given_the_methods_by_a_mixin_elsewhere_is_not_listed(trees, tmp_path):
    """0.5.9 with upstream's 0.5.10 fix written as a mixin in sglang/srt/layers: inherited methods count."""
    tree = copy_tree(trees["0.5.9"], tmp_path)
    mixin = tmp_path / "sglang/srt/layers/eagle_delegation.py"
    mixin.parent.mkdir(parents=True)
    mixin.write_text("class ForwardsEagle3ToLanguageModel:\n" + "".join(
        f"    def {m}(self, *args):\n        return self.language_model.{m}(*args)\n\n" for m in TRIO))
    edit(tree.path(dd.KIMI_MODULE), "class KimiK25ForConditionalGeneration(nn.Module):",
         "class KimiK25ForConditionalGeneration(ForwardsEagle3ToLanguageModel, nn.Module):")
    edit(tree.path(dd.KIMI_MODULE), "from sglang.srt.utils import add_prefix",
         "from sglang.srt.utils import add_prefix\n"
         "from sglang.srt.layers.eagle_delegation import ForwardsEagle3ToLanguageModel")
    result = PATCH.check_source(tree)
    assert result.status == APPLICABLE and KIMI not in result.detail
    assert "internvl.InternVLChatModel (.language_model)" in result.detail


def test_kimi_with_upstreams_methods_is_not_listed_and_the_diff_leaves_models_alone(trees, tmp_path):
    """0.5.9 with the three methods added to Kimi-K2.5 as 0.5.10 did: nothing is added to it a second time."""
    tree = copy_tree(trees["0.5.9"], tmp_path)
    methods = "".join(f"\n    def {m}(self, *args):\n        return self.language_model.{m}(*args)\n" for m in TRIO)
    edit(tree.path(dd.KIMI_MODULE), "    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]):",
         methods.lstrip("\n") + "\n    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]):")
    result = PATCH.check_source(tree)
    assert result.status == APPLICABLE and KIMI not in result.detail
    assert list(PATCH.rewrite(tree)) == [dd.MODEL_RUNNER]  # the diff never touches a model class


@pytest.mark.parametrize("old, new, named", [
    ("self.is_draft_worker = is_draft_worker", "self.is_draft = is_draft_worker", "self.is_draft_worker"),
    ("    def load_model(self):", "    def load_weights_and_model(self):", "ModelRunner.load_model"),
    ("logger = logging.getLogger(__name__)", "_log = logging.getLogger(__name__)", "logger"),
    ("        self.load_model()", "        self.load_weights_and_model()", "self.load_model()"),
])
def test_drifted_when_a_name_the_wrapper_relies_on_goes(trees, tmp_path, old, new, named):
    tree = copy_tree(trees["0.5.9"], tmp_path)
    edit(tree.path(dd.MODEL_RUNNER), old, new)
    result = PATCH.check_source(tree)
    assert result.status == DRIFTED and named in result.detail


# -- versioned diffs

@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_committed_diff_is_what_rewrite_generates(trees, version):
    committed = REPO / "diffs" / version / f"{PATCH.id}.diff"
    generated = diff_for(PATCH, trees[version])
    assert generated, "the patch applies to every covered release"
    assert committed.is_file() and committed.read_text() == generated, "run ci/generate-diffs"


def added_text(diff: str) -> str:
    return "".join(line[1:] + "\n" for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))


@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_diff_adds_the_guard_and_its_install_line_to_the_model_runner_only(version):
    """The diff carries the guard every diff binds and the line that applies it to load_model, nothing else (the
    wrapper itself is sglang_pcie.patches.drafter_delegation.payload)."""
    diff = (REPO / "diffs" / version / f"{PATCH.id}.diff").read_text()
    assert [line for line in diff.splitlines() if line.startswith("+++ ")] == [f"+++ b/{RUNNER_FILE}"]
    lines = [line.strip() for line in added_text(diff).splitlines() if line.strip()]
    assert lines == [line.strip() for line in (dd.GUARD + dd.INSTALL_LINE).splitlines() if line.strip()]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.16", "0.5.23"])
def test_diff_applies_and_then_reads_applied(trees, version, tmp_path):
    tree = copy_tree(trees[version], tmp_path)
    diff = REPO / "diffs" / version / f"{PATCH.id}.diff"
    proc = subprocess.run(["patch", "-p1", "--batch", "--forward", "-i", str(diff)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    patched = (tmp_path / RUNNER_FILE).read_text()
    module = ast.parse(patched)  # still Python; the install line follows the class it patches
    install = next(i for i, n in enumerate(module.body) if ast.unparse(n) == dd.INSTALL_LINE.split("  #")[0])
    runner = next(i for i, n in enumerate(module.body) if isinstance(n, ast.ClassDef) and n.name == "ModelRunner")
    assert runner < install
    assert PATCH.check_source(tree).status == APPLIED and PATCH.rewrite(tree) == {}


# -- the real SGLang

# Run in the real install, overlay active: the real ModelRunner.load_model, wrapped by the patch, is called with
# only its weight loading replaced (the closure's original is swapped for a loader that sets self.model).
RUNTIME_PROBE = r"""
import json, logging
import torch
import sglang
import sglang.srt.model_executor.model_runner as mr
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang_pcie.runtime.activate import RESULTS
from sglang_pcie.runtime.settings import for_process
from sglang_pcie.patches.drafter_delegation import check as dd

records = []
class Collect(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
mr.logger.addHandler(Collect())

class StandIn(torch.nn.Module):
    # The far end of the delegation (records what it is asked), not a language model.
    def __init__(self):
        super().__init__()
        self.calls = []
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.calls.append(["set_eagle3_layers_to_capture", layer_ids])
    def get_embed_and_head(self):
        self.calls.append(["get_embed_and_head"])
        return "embed", "head"
    def set_embed_and_head(self, embed, head):
        self.calls.append(["set_embed_and_head", embed, head])

wrapped = mr.ModelRunner.load_model
original = next(c for c in wrapped.__closure__ if c.cell_contents is wrapped.__wrapped__)

def load(cls, attr, algorithm="EAGLE3", draft=False):
    model = object.__new__(cls)
    torch.nn.Module.__init__(model)
    setattr(model, attr, StandIn())
    def load_weights_only(self):
        self.model = model
    original.cell_contents = load_weights_only
    runner = object.__new__(mr.ModelRunner)
    runner.is_draft_worker = draft
    runner.spec_algorithm = SpeculativeAlgorithm.from_string(algorithm)
    mr.ModelRunner.load_model(runner)
    return model

def gained(cls):
    return {m: getattr(vars(cls)[m], "__sglang_pcie_patch__", None) for m in dd.DELEGATED_METHODS if m in vars(cls)}

TRIO = ("set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head")
result = RESULTS["drafter-delegation"][mr.__name__]
report = {"result": [result.status, result.detail], "check_runtime": dd.PATCH.check_runtime({mr.__name__: mr}, for_process()).status,
          "wrapped_is_marked": getattr(wrapped, "__sglang_pcie_patch__", None)}
"""

KIMI_PROBE = r"""
from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as Kimi
report["kimi_before"] = gained(Kimi)
load(Kimi, "language_model", "NONE")
report["kimi_no_speculative"] = gained(Kimi)
load(Kimi, "language_model", "EAGLE3", draft=True)
report["kimi_draft_runner"] = gained(Kimi)
model = load(Kimi, "language_model", "EAGLE3")
report["kimi_eagle3"] = gained(Kimi)
model.set_eagle3_layers_to_capture([2, 30, 57])
model.set_eagle3_layers_to_capture()
returned = model.get_embed_and_head()
model.set_embed_and_head("e", "h")
report.update(calls=model.language_model.calls, returned=list(returned), log=list(records))
first = {m: vars(Kimi)[m] for m in TRIO}
load(Kimi, "language_model", "EAGLE3")  # a second load (e.g. weights reloaded): nothing more
report.update(kimi_again=gained(Kimi), same_functions=all(vars(Kimi)[m] is f for m, f in first.items()),
              qualnames=[vars(Kimi)[m].__qualname__ for m in TRIO])
"""

REFUSAL_PROBE = r"""
# 0.5.23 refuses EAGLE-3 on a model lacking set_eagle3_layers_to_capture (attention_backend_setup.py).
from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
    configure_aux_hidden_state_capture)
from sglang.srt.models.qwen2_audio import Qwen2AudioForConditionalGeneration as Audio
from sglang.srt.models.sarashina2_vision import Sarashina2VisionForCausalLM as Sarashina
from sglang.srt.models.internvl import InternVLChatModel as InternVL

def configure(model):
    try:
        configure_aux_hidden_state_capture(model=model, eagle_use_aux_hidden_state=True,
                                           eagle_aux_hidden_state_layer_ids=[1, 2], dflash_use_aux_hidden_state=False,
                                           dflash_target_layer_ids=None, is_dspark=False)
        return None
    except ValueError as exc:
        return str(exc)

del records[:]
load(InternVL, "language_model", "NONE")  # no speculative decoding: untouched, SGLang's refusal stands
report["internvl_no_speculative"] = [gained(InternVL), configure(load(InternVL, "language_model", "NONE"))]
audio = load(Audio, "language_model", "EAGLE3")
report["audio"] = [gained(Audio), configure(audio), list(audio.language_model.calls)]
audio.get_embed_and_head()
sarashina = load(Sarashina, "llm", "EAGLE3")  # forward runs only self.llm.model: left to SGLang's refusal
report["sarashina"] = [gained(Sarashina), configure(sarashina)]
report["refusal_log"] = list(records)
# Imports its language model inside __init__ (the static reading cannot follow it); the live rule serves it.
from sglang.srt.models.llava import LlavaMistralForCausalLM as LlavaMistral
load(LlavaMistral, "language_model", "EAGLE3")
report["llava_mistral"] = gained(LlavaMistral)
"""


def runtime_report(env, *probes: str, overrides: dict | None = None) -> dict:
    return env.run_json("".join((RUNTIME_PROBE, *probes, "print(json.dumps(report))\n")), env=overrides)


LOG_LINE = ("sglang-pcie drafter-delegation: KimiK25ForConditionalGeneration lacks set_eagle3_layers_to_capture, "
            "get_embed_and_head, set_embed_and_head; forwarding to its language_model (StandIn)")


def test_sglang_0_5_9_kimi_k25_gains_the_methods_only_as_an_eagle_target(sglang_env):
    report = runtime_report(sglang_env("0.5.9"), KIMI_PROBE)
    assert report["result"][0] == "applied" and report["check_runtime"] == "applied"
    assert report["wrapped_is_marked"] == PATCH.id
    # Nothing before the target model of an EAGLE run is loaded, nor for a plain run or the draft model.
    assert report["kimi_before"] == report["kimi_no_speculative"] == report["kimi_draft_runner"] == {}
    assert report["kimi_eagle3"] == {m: PATCH.id for m in TRIO}
    assert report["calls"] == [["set_eagle3_layers_to_capture", [2, 30, 57]], ["set_eagle3_layers_to_capture", None],
                               ["get_embed_and_head"], ["set_embed_and_head", "e", "h"]]
    assert report["returned"] == ["embed", "head"]
    assert report["log"] == [LOG_LINE]  # one line, at the first call
    assert report["kimi_again"] == report["kimi_eagle3"] and report["same_functions"]
    assert report["qualnames"] == [f"{dd.KIMI_CLASS}.{m}" for m in TRIO]


def test_sglang_0_5_9_patch_switched_off(sglang_env):
    code = ("import json\nimport sglang.srt.model_executor.model_runner as mr\n"
            "from sglang_pcie.runtime.activate import RESULTS, SWITCHED_OFF\n"
            "print(json.dumps({'wrapped': hasattr(mr.ModelRunner.load_model, '__wrapped__'),"
            " 'results': {k: v.status for k, v in RESULTS.get('drafter-delegation', {}).items()},"
            " 'switched_off': SWITCHED_OFF.get('drafter-delegation')}))\n")
    report = sglang_env("0.5.9").run_json(code, env={"SGLANG_PCIE_DISABLE_PATCHES": PATCH.id})
    assert report == {"wrapped": False, "results": {}, "switched_off": "listed in SGLANG_PCIE_DISABLE_PATCHES"}


def test_sglang_0_5_23_upstream_kimi_untouched_and_refusal_passed_only_where_it_can_run(sglang_env):
    report = runtime_report(sglang_env("0.5.23"), KIMI_PROBE.split("model.set_eagle3")[0], REFUSAL_PROBE)
    assert report["result"][0] == "applied" and report["check_runtime"] == "applied"
    # Kimi-K2.5 has the methods upstream (since 0.5.10): never a second set.
    assert report["kimi_before"] == report["kimi_eagle3"] == {m: None for m in TRIO}
    refusal = "does not implement set_eagle3_layers_to_capture"
    internvl_gained, internvl_refused = report["internvl_no_speculative"]
    assert internvl_gained == {} and refusal in internvl_refused
    audio_gained, audio_refused, audio_calls = report["audio"]
    assert audio_gained == {m: PATCH.id for m in TRIO} and audio_refused is None
    assert audio_calls == [["set_eagle3_layers_to_capture", [1, 2]]]
    sarashina_gained, sarashina_refused = report["sarashina"]
    assert sarashina_gained == {} and refusal in sarashina_refused
    assert report["llava_mistral"] == {"set_eagle3_layers_to_capture": PATCH.id}
    assert report["refusal_log"] == [
        "sglang-pcie drafter-delegation: Qwen2AudioForConditionalGeneration lacks set_eagle3_layers_to_capture, "
        "get_embed_and_head, set_embed_and_head; forwarding to its language_model (StandIn)"]
