"""drafter-delegation: static checks on the 21 pristine releases, the versioned diffs, and the real SGLang 0.5.9 / 0.5.23.
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from sglang_pcie.base import APPLICABLE, APPLIED, DRIFTED, SourceTree
from sglang_pcie.diffgen import diff_for
from sglang_pcie.patches import drafter_delegation as dd
from sglang_pcie.patches.drafter_delegation import PATCH
from sglang_pcie.releases import COVERED_RELEASES

REPO = Path(__file__).resolve().parent.parent
KIMI = "kimi_k25.KimiK25ForConditionalGeneration"
TRIO = ("set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head")


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
    return {version: {w.label: w for w in dd.SourceModels(tree).wrappers()} for version, tree in trees.items()}


# -- static, every release

@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_eagle_path_calls_only_what_the_patch_forwards(trees, version):
    called, probed = dd.eagle_target_methods(trees[version])
    assert (called, probed) == expected_target_calls(version)
    assert not called - set(dd.DELEGATED_METHODS) - dd.MODULE_API - probed


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
def test_check_source_names_the_classes_to_patch(trees, wrappers, version):
    result = PATCH.check_source(trees[version])
    qualifying = [label for label, w in wrappers[version].items() if w.missing]
    # Other wrappers (llava, internvl, qwen2_audio...) lack the methods in every release, so it always applies.
    assert result.status == APPLICABLE and qualifying
    assert all(label in result.detail for label in qualifying)
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


# -- versioned diffs

@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_committed_diff_is_what_rewrite_generates(trees, version):
    committed = REPO / "patches" / version / f"{PATCH.id}.diff"
    generated = diff_for(PATCH, trees[version])
    assert generated, "the patch applies to every covered release"
    assert committed.is_file() and committed.read_text() == generated, "run ci/generate-diffs"


@pytest.mark.parametrize("version", COVERED_RELEASES)
def test_diff_applies_and_adds_the_methods(trees, wrappers, version, tmp_path):
    diff = REPO / "patches" / version / f"{PATCH.id}.diff"
    touched = sorted({line[len("+++ b/"):].strip() for line in diff.read_text().splitlines()
                      if line.startswith("+++ b/")})
    for rel in touched:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(trees[version].root / rel, tmp_path / rel)
    proc = subprocess.run(["patch", "-p1", "--batch", "--forward", "-i", str(diff)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for wrapper in (w for w in wrappers[version].values() if w.missing):
        path = tmp_path / "sglang/srt/models" / f"{wrapper.module.rsplit('.', 1)[-1]}.py"
        node = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == wrapper.name)
        methods = {n.name: ast.get_source_segment(path.read_text(), n) for n in node.body
                   if isinstance(n, ast.FunctionDef)}
        for method in wrapper.missing:
            assert f"self.{wrapper.attr}" in methods[method] and dd.MARKER in methods[method]


def test_patched_source_reports_applied(trees, tmp_path):
    tree = copy_tree(trees["0.5.9"], tmp_path)
    diff = REPO / "patches" / "0.5.9" / f"{PATCH.id}.diff"
    subprocess.run(["patch", "-p1", "--batch", "-i", str(diff)], cwd=tmp_path, check=True, capture_output=True)
    assert PATCH.check_source(tree).status == APPLIED
    assert PATCH.rewrite(tree) == {}


def test_added_method_is_the_template_text(trees):
    """The diff carries the very text the runtime compiles (METHOD_TEMPLATE)."""
    diff = (REPO / "patches" / "0.5.9" / f"{PATCH.id}.diff").read_text()
    added = "".join(line[1:] + "\n" for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))
    assert textwrap.indent(dd.method_source("get_embed_and_head", "language_model"), "    ") in added


# -- the real SGLang

# Run in the real install, overlay active: imports every model module through SGLang's registry (as a server
# does), then reports what the patch did.
RUNTIME_PROBE = r"""
import json, sys
from pathlib import Path
import torch
import sglang
import sglang.srt.models.registry
from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as Kimi
from sglang_pcie.activate import RESULTS
from sglang_pcie.base import MARKER_ATTR, SourceTree
from sglang_pcie.patches import drafter_delegation as dd

tree = SourceTree(Path(sglang.__path__[0]).parent)
models = {n: m for n, m in sys.modules.items() if n.startswith("sglang.srt.models.") and n.count(".") == 3}
files = {p.stem for p in Path(sglang.__path__[0], "srt", "models").glob("*.py")}
patched = sorted({f"{m.__name__.rsplit('.', 1)[1]}.{c.__name__}" for m in models.values() for c in vars(m).values()
                 if isinstance(c, type) and c.__module__ == m.__name__
                 and any(getattr(vars(c).get(x), MARKER_ATTR, None) == dd.PATCH_ID for x in dd.DELEGATED_METHODS)})
called, probed = dd.eagle_target_methods(tree)
result = dd.PATCH.check_runtime(models)
report = {
    "static_qualifying": sorted(w.label for w in dd.SourceModels(tree).wrappers() if w.missing),
    "patched": patched,
    "not_imported": sorted(files - {n.rsplit(".", 1)[1] for n in models}),
    "kimi_result": [RESULTS[dd.PATCH_ID]["sglang.srt.models.kimi_k25"].status,
                    RESULTS[dd.PATCH_ID]["sglang.srt.models.kimi_k25"].detail],
    "check_runtime": [result.status, result.detail],
    "eagle_names": sorted(called | probed),
    "eagle_names_on_kimi": sorted(n for n in called | probed if hasattr(Kimi, n)),
    "kimi_methods": {m: [getattr(vars(Kimi).get(m), MARKER_ATTR, None), vars(Kimi)[m].__code__.co_filename]
                     for m in dd.DELEGATED_METHODS if m in vars(Kimi)},
}
"""

DELEGATION_PROBE = r"""
class StandIn(torch.nn.Module):
    # Records what the wrapper forwards: only the far end of the delegation, not a language model.
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

wrapper = object.__new__(Kimi)
torch.nn.Module.__init__(wrapper)
TRIO = ("set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head")
inner = wrapper.language_model = StandIn()
wrapper.set_eagle3_layers_to_capture([2, 30, 57])
wrapper.set_eagle3_layers_to_capture()
returned = wrapper.get_embed_and_head()
wrapper.set_embed_and_head("e", "h")
wrapper.language_model = torch.nn.Identity()  # an inner model without the methods
try:
    wrapper.get_embed_and_head()
    error = None
except AttributeError as exc:
    error = str(exc)
report.update(calls=inner.calls, returned=list(returned), error=error)

# Idempotent: applying again changes nothing.
import sglang.srt.models.kimi_k25 as kimi_module
before = {m: vars(Kimi)[m] for m in report["kimi_methods"]}
again = dd.PATCH.apply(kimi_module)
report.update(again=again.status, unchanged=all(vars(Kimi)[m] is f for m, f in before.items()))

# Drift: the real kimi_k25 source, edited so that forward runs only the inner backbone.
import inspect, linecache, types
from sglang_pcie.base import Drift
source = inspect.getsource(kimi_module).replace("language_model=self.language_model,",
                                                "language_model=self.language_model.model,")
linecache.cache["<edited kimi_k25>"] = (len(source), None, source.splitlines(True), "<edited kimi_k25>")
edited = types.ModuleType(kimi_module.__name__)
exec(compile(source, "<edited kimi_k25>", "exec"), vars(edited))
try:
    dd.PATCH.apply(edited)
    drift = None
except Drift as exc:
    drift = str(exc)
report.update(drift=drift, edited_untouched=not any(hasattr(edited.KimiK25ForConditionalGeneration, m) for m in TRIO))
"""


def runtime_report(env, *probes: str, overrides: dict | None = None) -> dict:
    return env.run_json("".join((RUNTIME_PROBE, *probes, "print(json.dumps(report))\n")), env=overrides)


def test_sglang_0_5_9_wrappers_delegate(sglang_env):
    report = runtime_report(sglang_env("0.5.9"), DELEGATION_PROBE)
    # Every class the static rule names is patched, in every model module the real registry could import.
    imported = [label for label in report["static_qualifying"] if label.split(".")[0] not in report["not_imported"]]
    assert report["patched"] == imported and KIMI in imported
    assert report["kimi_result"][0] == "applied" and report["check_runtime"][0] == "applied"
    # Each name the 0.5.9 EAGLE path uses on a target resolves on the wrapper.
    assert report["eagle_names"] == ["get_embed_and_head", "set_eagle3_layers_to_capture"]
    assert report["eagle_names_on_kimi"] == report["eagle_names"]
    assert sorted(report["kimi_methods"]) == sorted(TRIO)
    assert all(marker == PATCH.id for marker, _ in report["kimi_methods"].values())
    assert report["calls"] == [["set_eagle3_layers_to_capture", [2, 30, 57]], ["set_eagle3_layers_to_capture", None],
                               ["get_embed_and_head"], ["set_embed_and_head", "e", "h"]]
    assert report["returned"] == ["embed", "head"]
    assert report["error"] == ("KimiK25ForConditionalGeneration.get_embed_and_head: "
                               "its language_model (Identity) has no get_embed_and_head")
    assert report["again"] == "applied" and report["unchanged"]
    assert dd.KIMI_CLASS in report["drift"] and report["edited_untouched"]


def test_sglang_0_5_9_patch_switched_off(sglang_env):
    code = ("import json\nfrom sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as Kimi\n"
            "from sglang_pcie.activate import RESULTS, SWITCHED_OFF\n"
            "print(json.dumps({'has': [m for m in %r if hasattr(Kimi, m)],"
            " 'results': {k: v.status for k, v in RESULTS.get('drafter-delegation', {}).items()},"
            " 'switched_off': SWITCHED_OFF.get('drafter-delegation')}))\n" % (TRIO,))
    report = sglang_env("0.5.9").run_json(code, env={"SGLANG_PCIE_DISABLE_PATCHES": PATCH.id})
    assert report == {"has": [], "results": {}, "switched_off": "listed in SGLANG_PCIE_DISABLE_PATCHES"}


def test_sglang_0_5_23_upstream_methods_left_alone(sglang_env):
    report = runtime_report(sglang_env("0.5.23"))
    # Kimi-K2.5's own methods (upstream since 0.5.10) are untouched: not ours, defined in kimi_k25.py.
    assert sorted(report["kimi_methods"]) == sorted(TRIO)
    assert all(marker is None and path.endswith("sglang/srt/models/kimi_k25.py")
               for marker, path in report["kimi_methods"].values())
    assert report["kimi_result"][0] == "upstream"
    imported = [label for label in report["static_qualifying"] if label.split(".")[0] not in report["not_imported"]]
    assert report["patched"] == imported and KIMI not in imported
    assert report["check_runtime"][0] == "applied"
    assert report["eagle_names"] == sorted(set().union(*expected_target_calls("0.5.23")))
