"""The accept-length-alarm patch: against the pristine sources of every covered release (static, diffs), its
install on stand-in modules, and in the real SGLang 0.5.9 and 0.5.23 with the overlay installed: the hook wrapped
on import, and the real TokenizerManager method, driven with SGLang-shaped output batches, warning exactly once for
a broken drafter and never for a working one.  Drift and harmless upstream changes:
mutations/accept-length-alarm.yaml."""
from __future__ import annotations

import importlib.util
import shlex
import shutil
import subprocess
import types
from pathlib import Path

import pytest

from sglang_pcie.patches.accept_length_alarm.check import CLASS, HOOK, MODULE, PATCH
from sglang_pcie.patching.diffs import diff_for
from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DISABLED, DRIFTED, Drift, Result, is_patched
from sglang_pcie.patching.releases import COVERED_RELEASES
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patches.accept_length_alarm import payload as aa
from sglang_pcie.runtime.settings import load_settings

from support import REPO, run_benchmark

TOKENIZER_MANAGER = "sglang/srt/managers/tokenizer_manager.py"
# The release's name for the accepted drafts on SGLang's output batch.
FIELD_FROM = {"0.5.8": "spec_accepted_tokens", "0.5.11": "spec_accepted_drafts", "0.5.12": "spec_num_correct_drafts"}


def field_of(version: str) -> str:
    from packaging.version import Version

    return [f for first, f in FIELD_FROM.items() if Version(version) >= Version(first)][-1]


# ------------------------------------------------------------------ static: the pristine sources, the diffs


def test_every_covered_release_is_applicable_and_names_its_counters(pristine_source):
    assert len(COVERED_RELEASES) == 21
    for version in COVERED_RELEASES:
        result = PATCH.check_source(SourceTree(pristine_source(version)))
        assert result == Result(APPLICABLE, f"watches {CLASS}.{HOOK} (once per finished request; reads "
                                            f"spec_verify_ct, {field_of(version)})"), version


def test_committed_diffs_are_what_the_patch_generates(pristine_source):
    for version in COVERED_RELEASES:
        committed = REPO / "diffs" / version / "accept-length-alarm.diff"
        assert committed.read_text() == diff_for(PATCH, SourceTree(pristine_source(version))), version


def _copy_target(source_root: Path, dest: Path) -> SourceTree:
    for name in ["sglang/__init__.py", "sglang/version.py", "sglang/_version.py", TOKENIZER_MANAGER]:
        if (source_root / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source_root / name, dest / name)
    return SourceTree(dest)


def _patched_copy(pristine: Path, version: str, dest: Path) -> SourceTree:
    tree = _copy_target(pristine, dest)
    diff = REPO / "diffs" / version / "accept-length-alarm.diff"
    subprocess.run(["patch", "-p1", "--quiet", "-i", str(diff)], cwd=dest, check=True)
    return tree


@pytest.mark.parametrize("version", ["0.5.8", "0.5.11", "0.5.12", "0.5.18", "0.5.23"])
def test_diff_applies_with_patch_compiles_and_reads_as_applied(pristine_source, tmp_path, version):
    tree = _patched_copy(pristine_source(version), version, tmp_path)
    assert PATCH.check_source(tree) == Result(APPLIED, "source carries the sglang-pcie diff")
    assert PATCH.rewrite(tree) == {}
    text = tree.path(MODULE).read_text()
    compile(text, str(tree.path(MODULE)), "exec", dont_inherit=True)
    added = [line for line in (REPO / "diffs" / version / "accept-length-alarm.diff").read_text().splitlines()
             if line.startswith("+") and not line.startswith("+++") and line.strip("+ ")]
    unmarked = [line for line in added if "sglang-pcie: accept-length-alarm" not in line]
    assert unmarked == []  # every line the diff adds carries the marker (the guard's too)
    assert [line.strip() for line in added if line.lstrip("+ ").startswith("@")] == [
        "+    @_sglang_pcie_accept_length_alarm()  # sglang-pcie: accept-length-alarm"]
    # the decorator sits right above the hook's def
    lines = text.splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith(f"    def {HOOK}("))
    assert lines[at - 1] == "    @_sglang_pcie_accept_length_alarm()  # sglang-pcie: accept-length-alarm"


def test_a_call_through_the_class_counts_as_a_call(pristine_source, tmp_path):
    """``TokenizerManager._calculate_spec_decoding_metrics(self, ...)`` is the call ``self.<hook>(...)`` is."""
    tree = _copy_target(pristine_source("0.5.23"), tmp_path)
    path = tree.path(MODULE)
    text = path.read_text()
    assert text.count(f"self.{HOOK}(meta_info, recv_obj, i)") == 1
    path.write_text(text.replace(f"self.{HOOK}(meta_info, recv_obj, i)", f"{CLASS}.{HOOK}(self, meta_info, recv_obj, i)"))
    assert PATCH.check_source(SourceTree(tmp_path)).status == APPLICABLE


COMPONENT_MODULE = "sglang.srt.managers.tokenizer_components.spec_metrics"
COMPONENT = "SpecDecodingMetrics"
COMPONENT_HOOK = f"{COMPONENT_MODULE}.{COMPONENT}.{HOOK}"


def _split_into_component(root: Path, imported: bool = True, call: str = f"self.spec_metrics.{HOOK}(") -> Path:
    """A simulated split of TokenizerManager into a component class (as SGLang split its scheduler and model runner
    in 0.5.23): the hook's method moves to ``SpecDecodingMetrics`` in a module of its own, which the manager's module
    imports (``imported``) and calls through an attribute (``call``). Returns the component's file."""
    tree = SourceTree(root)
    path = tree.path(MODULE)
    text = path.read_text()
    method = tree.method(MODULE, CLASS, HOOK)[2]
    lines = text.splitlines(keepends=True)
    first = min([method.lineno] + [d.lineno for d in method.decorator_list])
    body = "".join(lines[first - 1:method.end_lineno])
    component = root / (COMPONENT_MODULE.replace(".", "/") + ".py")
    component.parent.mkdir(parents=True)
    component.write_text(f"from __future__ import annotations\n\nfrom typing import Any, Dict\n\n\nclass {COMPONENT}:\n"
                         + body)
    moved = "".join(lines[:first - 1] + lines[method.end_lineno:])
    assert moved.count(f"self.{HOOK}(meta_info, recv_obj, i)") == 1
    moved = moved.replace(f"self.{HOOK}(meta_info, recv_obj, i)", f"{call}meta_info, recv_obj, i)")
    if imported:
        moved = moved.replace(f"\nclass {CLASS}", f"\nfrom {COMPONENT_MODULE} import {COMPONENT}\n\n\nclass {CLASS}", 1)
    path.write_text(moved)
    return component


def test_a_hook_moved_into_a_component_class_is_followed(pristine_source, tmp_path):
    """The static check finds the hook on the component class the manager's module imports, and the diff decorates
    it there (the manager's module untouched)."""
    _copy_target(pristine_source("0.5.23"), tmp_path)
    component = _split_into_component(tmp_path)
    tree = SourceTree(tmp_path)
    assert PATCH.check_source(tree) == Result(APPLICABLE, (
        f"watches {COMPONENT_MODULE}.{COMPONENT}.{HOOK} (moved from {CLASS} to a component class; once per finished "
        "request; reads spec_verify_ct, spec_num_correct_drafts)"))
    rewritten = PATCH.rewrite(tree)
    assert list(rewritten) == [COMPONENT_MODULE]
    compile(rewritten[COMPONENT_MODULE], str(component), "exec", dont_inherit=True)
    lines = rewritten[COMPONENT_MODULE].splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith(f"    def {HOOK}("))
    assert lines[at - 1] == "    @_sglang_pcie_accept_length_alarm()  # sglang-pcie: accept-length-alarm"
    component.write_text(rewritten[COMPONENT_MODULE])
    assert PATCH.check_source(SourceTree(tmp_path)) == Result(APPLIED, "source carries the sglang-pcie diff")


@pytest.mark.parametrize("call", [f"{COMPONENT}.{HOOK}(self.spec_metrics, ", f"self.components.spec.{HOOK}("])
def test_a_call_through_the_component_class_or_an_attribute_path_counts_as_a_call(pristine_source, tmp_path, call):
    _copy_target(pristine_source("0.5.23"), tmp_path)
    _split_into_component(tmp_path, call=call)
    assert PATCH.check_source(SourceTree(tmp_path)).status == APPLICABLE


def test_a_component_hook_called_for_every_chunk_is_drifted(pristine_source, tmp_path):
    _copy_target(pristine_source("0.5.23"), tmp_path)
    _split_into_component(tmp_path)
    path = SourceTree(tmp_path).path(MODULE)
    text = path.read_text()
    path.write_text(text + f"\n\ndef every_chunk(self, meta_info, recv_obj, i):\n"
                           f"    self.spec_metrics.{HOOK}(meta_info, recv_obj, i)\n")
    result = PATCH.check_source(SourceTree(tmp_path))
    assert result.status == DRIFTED and f"{HOOK} is called outside the finished-request branch (line " in result.detail


def test_a_hook_moved_to_a_class_the_manager_does_not_import_is_named_where_it_went(pristine_source, tmp_path):
    _copy_target(pristine_source("0.5.23"), tmp_path)
    _split_into_component(tmp_path, imported=False)
    result = PATCH.check_source(SourceTree(tmp_path))
    assert result == Result(DRIFTED, (
        f"{CLASS}.{HOOK} missing (SGLang's per-request speculative metrics moved?); moved to {COMPONENT_HOOK}, which "
        f"{MODULE} does not import (the runtime hook cannot follow it there)"))


def test_a_hook_on_two_component_classes_names_both(pristine_source, tmp_path):
    _copy_target(pristine_source("0.5.23"), tmp_path)
    component = _split_into_component(tmp_path)
    component.write_text(component.read_text() + f"\n\nclass Other{COMPONENT}({COMPONENT}):\n    pass\n")
    path = SourceTree(tmp_path).path(MODULE)
    path.write_text(path.read_text().replace(f"import {COMPONENT}\n", f"import {COMPONENT}, Other{COMPONENT}\n", 1))
    result = PATCH.check_source(SourceTree(tmp_path))
    assert result == Result(DRIFTED, (
        f"{CLASS}.{HOOK} missing; moved to more than one class {MODULE} uses: {COMPONENT_HOOK}, "
        f"{COMPONENT_MODULE}.Other{COMPONENT}.{HOOK} (which one runs per finished request is not known)"))


def test_a_release_without_the_module_is_drifted_naming_where_the_class_went(pristine_source, tmp_path):
    tree = _copy_target(pristine_source("0.5.23"), tmp_path)
    moved = tmp_path / "sglang/srt/managers/tokenizer/manager.py"
    moved.parent.mkdir()
    tree.path(MODULE).rename(moved)
    result = PATCH.check_source(SourceTree(tmp_path))
    assert result.status == DRIFTED
    assert "is missing (every covered release 0.5.8-0.5.23 has it: moved or renamed?)" in result.detail
    assert "TokenizerManager is now defined in sglang/srt/managers/tokenizer/manager.py" in result.detail


# ------------------------------------------------------------------------- install, on stand-in modules


def _module(body: str) -> types.ModuleType:
    module = types.ModuleType(MODULE)
    exec(body, module.__dict__)
    return module


OWN = f"""
class {CLASS}:
    def {HOOK}(self, meta_info, recv_obj, i):
        return "own"
"""
INHERITED = f"""
class Mixin:
    def {HOOK}(self, meta_info, recv_obj, i):
        return "inherited"
class {CLASS}(Mixin):
    pass
"""


SAYS = " (one warning per server when EAGLE drafts are almost never accepted)"


@pytest.mark.parametrize("body, result", [(OWN, "own"), (INHERITED, "inherited")])
def test_install_wraps_the_hook_on_the_class_once(body, result):
    module = _module(body)
    cls = getattr(module, CLASS)
    original = next(c.__dict__[HOOK] for c in cls.__mro__ if HOOK in c.__dict__)
    assert PATCH.install(module, None) == Result(APPLIED, f"watching {CLASS}.{HOOK}{SAYS}")
    wrapped = cls.__dict__[HOOK]
    assert is_patched(wrapped, PATCH.id) and wrapped.__wrapped__ is original
    assert PATCH.install(module, None).status == APPLIED and cls.__dict__[HOOK] is wrapped  # idempotent
    assert PATCH.check_runtime({MODULE: module}, load_settings({})).status == APPLIED
    watch = aa.AcceptWatch()
    watch.state = aa.DONE
    aa.set_watch(watch)
    try:
        assert cls()._calculate_spec_decoding_metrics({}, None, 0) == result
    finally:
        aa.set_watch(None)


@pytest.mark.parametrize("body, message", [
    ("x = 1", f"{MODULE}.{CLASS} is missing"),
    (f"class {CLASS}:\n    pass", f"{CLASS}.{HOOK} is missing or not a plain function"),
    (f"class {CLASS}:\n    def {HOOK}(self, state, meta_info, recv_obj, i):\n        pass",
     f"{CLASS}.{HOOK} takes (self, state, meta_info, recv_obj), not (self, meta_info, recv_obj, i)"),
])
def test_install_refuses_a_wrong_shape_changing_nothing(body, message):
    module = _module(body)
    before = dict(getattr(module, CLASS, type("X", (), {})).__dict__)
    with pytest.raises(Drift, match=message.replace("(", r"\(").replace(")", r"\)")):
        PATCH.install(module, None)
    assert dict(getattr(module, CLASS, type("X", (), {})).__dict__).keys() == before.keys()


def test_check_runtime_says_disabled_or_not_watched():
    assert PATCH.check_runtime({}, load_settings({"SGLANG_PCIE_DISABLE_PATCHES": "accept-length-alarm"})) == \
        Result(DISABLED, "listed in SGLANG_PCIE_DISABLE_PATCHES")
    assert PATCH.check_runtime({MODULE: _module(OWN)}, load_settings({})) == \
        Result(DRIFTED, f"not in effect in this process: {CLASS}.{HOOK} is not wrapped")


class Recording:
    """A watch that records what the wrapper hands it."""
    state = aa.WATCHING

    def __init__(self):
        self.added = []

    def add(self, owner, recv_obj, i, module_name):
        self.added.append((type(owner).__name__, i, module_name))


def _split_modules():
    """Stand-in modules of a split: the component class in its own module, imported by the manager's module."""
    component = types.ModuleType(COMPONENT_MODULE)
    exec(f"class {COMPONENT}:\n    def {HOOK}(self, meta_info, recv_obj, i):\n        return 'component'\n",
         component.__dict__)
    manager = types.ModuleType(MODULE)
    manager.__dict__[COMPONENT] = component.__dict__[COMPONENT]
    exec(f"class {CLASS}:\n    def __init__(self):\n        self.spec_metrics = {COMPONENT}()\n"
         f"    def finished(self, i):\n        return self.spec_metrics.{HOOK}({{}}, None, i)\n", manager.__dict__)
    return manager, component.__dict__[COMPONENT]


def test_install_follows_the_hook_to_the_component_class():
    manager, component = _split_modules()
    original = component.__dict__[HOOK]
    assert PATCH.install(manager, None) == Result(APPLIED, f"watching {COMPONENT_HOOK}{SAYS}")
    assert is_patched(component.__dict__[HOOK], PATCH.id) and component.__dict__[HOOK].__wrapped__ is original
    assert HOOK not in vars(getattr(manager, CLASS))
    assert PATCH.check_runtime({MODULE: manager}, load_settings({})) == Result(APPLIED, f"watching {COMPONENT_HOOK}{SAYS}")
    watch = Recording()
    aa.set_watch(watch)
    try:  # through an attribute of the manager, and through the class: both are the watched call
        assert getattr(manager, CLASS)().finished(3) == "component"
        assert component._calculate_spec_decoding_metrics(component(), {}, None, 4) == "component"
    finally:
        aa.set_watch(None)
    assert watch.added == [(COMPONENT, 3, COMPONENT_MODULE), (COMPONENT, 4, COMPONENT_MODULE)]


def test_a_call_through_tokenizer_managers_class_is_watched_at_runtime():
    module = _module(OWN)
    PATCH.install(module, None)
    watch = Recording()
    aa.set_watch(watch)
    try:
        cls = getattr(module, CLASS)
        assert cls._calculate_spec_decoding_metrics(cls(), {}, None, 2) == "own"
    finally:
        aa.set_watch(None)
    assert watch.added == [(CLASS, 2, MODULE)]


def test_install_refuses_a_hook_on_two_component_classes():
    manager, component = _split_modules()
    manager.__dict__["Other"] = type("Other", (component,), {})
    with pytest.raises(Drift, match="moved to more than one class"):
        PATCH.install(manager, None)
    assert not is_patched(component.__dict__[HOOK], PATCH.id)
    assert PATCH.check_runtime({MODULE: manager}, load_settings({})).status == DRIFTED


# -------------------------------------------------------------------- runtime: the real SGLang releases

# The child imports the real tokenizer manager (the overlay activated by the real .pth hook), reports how its hook
# looks, then calls it as SGLang does (``manager._calculate_spec_decoding_metrics(meta_info, recv_obj, i)``) on a
# TokenizerManager made without __init__ (no server), holding a real ServerArgs.  Each output batch is a
# SimpleNamespace carrying the fields SGLang's BatchTokenIDOutput carries for this; SGLang's own method body runs
# and fills meta_info.  0.5.18+ read the draft token count from SGLang's runtime context, which only a launched
# server publishes: the module's get_spec is stood in for.
CHILD = r'''
import importlib.util, json, logging, shlex, types
import sglang
import sglang.srt.managers.tokenizer_manager as tm
import sglang_pcie.runtime.activate as activate
from sglang_pcie.runtime import baked
from sglang_pcie.patches.accept_length_alarm import payload as aa
from sglang_pcie.patching.engine import MARKER_ATTR
from sglang_pcie.patches.accept_length_alarm.check import PATCH, MODULE, CLASS, HOOK
from sglang_pcie.runtime.settings import for_process
from sglang.srt.server_args import ServerArgs

out = {}
method = tm.TokenizerManager.__dict__[HOOK]
out["marker"] = getattr(method, MARKER_ATTR, None)
out["inner_own_file"] = getattr(method, "__wrapped__", method).__code__.co_filename == tm.__file__
out["activation"] = {key: [r.status, r.detail] for key, r in activate.RESULTS.get(PATCH.id, {}).items()}
out["switched_off"] = activate.SWITCHED_OFF.get(PATCH.id)
out["check_runtime"] = PATCH.check_runtime({MODULE: tm}, for_process()).status
out["decorator_is_identity"] = baked.guard(PATCH.id)()(len) is len

spec = importlib.util.spec_from_file_location(MODULE, DIFFED)  # the diffed source, beside the real module
diffed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(diffed)
before = diffed.TokenizerManager.__dict__[HOOK]
result = PATCH.apply(diffed, for_process())
out["diffed"] = {"marker": getattr(before, MARKER_ATTR, None), "apply": [result.status, result.detail],
                 "unchanged_by_apply": diffed.TokenizerManager.__dict__[HOOK] is before}
if not WATCHING:
    print(json.dumps(out))
    raise SystemExit

captured = []
class Capture(logging.Handler):
    def emit(self, record):
        captured.append({"logger": record.name, "level": record.levelname, "message": record.getMessage()})
logging.getLogger(MODULE).addHandler(Capture())

if hasattr(tm, "get_spec"):
    tm.get_spec = lambda: types.SimpleNamespace(speculative_algorithm="EAGLE3", speculative_num_draft_tokens=4)

LAUNCH = dict(model_path="/srv/models/target", speculative_algorithm="EAGLE3",
              speculative_draft_model_path="/srv/models/draft v2", speculative_num_steps=3,
              speculative_eagle_topk=1, speculative_num_draft_tokens=4, served_model_name="alarm-test")

def server_args(**values):
    if sglang.__version__ == "0.5.9":  # its __post_init__ needs an accelerator: the real class, filled as a launch
        args = object.__new__(ServerArgs)
        vars(args).update({**LAUNCH, **values})
        return args
    return ServerArgs(**{**LAUNCH, **values})  # 0.5.23 resolves later, in the launcher

def output_batch(verifies, accepted):
    return types.SimpleNamespace(
        spec_verify_ct=[verifies], completion_tokens=[1 + verifies + accepted], **{FIELD: [accepted]},
        spec_acceptance_histogram=[[verifies - accepted, accepted]],
        spec_correct_drafts_histogram=[[verifies - accepted, accepted]],
        spec_num_cap_tokens=None, spec_num_block_accept_tokens=None)

def drive(requests, **launch):
    aa.set_watch(None)
    del captured[:]
    manager = object.__new__(tm.TokenizerManager)
    manager.server_args = server_args(**launch)
    meta = {}
    for verifies, accepted in requests:
        meta = {}
        manager._calculate_spec_decoding_metrics(meta, output_batch(verifies, accepted), 0)
    return {"state": aa.get_watch().state, "log": list(captured), "meta": meta}

BROKEN, HEALTHY = (40, 0), (40, 60)  # accept length 1.00 and 2.50 (SGLang's own: completion / verifies)
out["broken"] = drive([BROKEN] * 8 + [BROKEN] * 200)
out["too_few_requests"] = drive([(5000, 0)] * 7)
out["too_few_verifies"] = drive([(30, 0)] * 9)
out["healthy"] = drive([HEALTHY] * 300)
out["recovers"] = drive([BROKEN] * 8 + [HEALTHY] * 8 + [BROKEN] * 50)
out["ngram"] = drive([BROKEN] * 50, speculative_algorithm="NGRAM")
out["metrics"] = drive([BROKEN] * 8, enable_metrics=True)
import prometheus_client
out["prometheus"] = [line for line in prometheus_client.generate_latest().decode().splitlines()
                     if line.startswith("sglang_pcie_accept_alarm")]
print(json.dumps(out))
'''


def _run_child(sglang_env, pristine_source, tmp_path, version, env, watching):
    diffed = _patched_copy(pristine_source(version), version, tmp_path / "diffed").path(MODULE)
    code = f"DIFFED = {str(diffed)!r}\nWATCHING = {watching!r}\nFIELD = {field_of(version)!r}\n{CHILD}"
    return sglang_env(version).run_json(code, env=env)


@pytest.fixture(scope="module", params=["0.5.9", "0.5.23"])
def watching(request, sglang_env, pristine_source, tmp_path_factory):
    version = request.param
    return version, _run_child(sglang_env, pristine_source, tmp_path_factory.mktemp(f"alarm-{version}"), version,
                               {}, watching=True)


def test_the_hook_is_wrapped_on_import_with_nothing_opted_in(watching):
    version, out = watching
    assert out["marker"] == "accept-length-alarm" and out["inner_own_file"], version
    assert out["activation"] == {MODULE: [APPLIED, f"watching {CLASS}.{HOOK}{SAYS}"]}
    assert out["switched_off"] is None and out["check_runtime"] == APPLIED


def test_a_broken_drafter_warns_exactly_once_through_sglangs_logger(watching):
    version, out = watching
    broken = out["broken"]
    assert broken["state"] == "alarmed"
    (entry,) = broken["log"]  # 208 finished requests, one warning
    assert (entry["logger"], entry["level"]) == (MODULE, "WARNING")
    first = entry["message"].splitlines()[0]
    assert first.startswith("sglang-pcie accept-length-alarm: EAGLE3 drafter /srv/models/draft v2 looks broken: "
                            "accept length 1.00 over 320 request-verifies (8 finished requests)"), first
    assert broken["meta"]["spec_accept_length"] == 41 / 40  # SGLang's own figure, still computed


def test_the_check_drafter_command_names_the_real_paths_from_server_args(watching):
    _, out = watching
    line = next(line for line in out["broken"]["log"][0]["message"].splitlines() if "check-drafter" in line)
    words = shlex.split(line.split(": ", 1)[1])
    assert words[:7] == ["sglang-pcie", "check-drafter", "--draft", "/srv/models/draft v2", "--target",
                         "/srv/models/target", "--"]
    assert words[7:] == ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_never_before_enough_requests_and_verifies_and_never_for_a_working_drafter(watching):
    _, out = watching
    for case in ("too_few_requests", "too_few_verifies", "healthy", "ngram"):
        assert out[case]["log"] == [], case
    assert out["healthy"]["state"] == "watching" and out["ngram"]["state"] == "off"


def test_one_recovery_line_when_drafts_are_accepted_again(watching):
    _, out = watching
    recovers = out["recovers"]
    assert recovers["state"] == "done"
    alarm, recovered = (entry["message"] for entry in recovers["log"])
    assert "looks broken" in alarm
    assert recovered.startswith("sglang-pcie accept-length-alarm: recovered: EAGLE3 drafter /srv/models/draft v2: "
                                "accept length 2.50 over the last 320 request-verifies (8 requests) since the warning")


def test_prometheus_gauges_when_sglangs_metrics_are_on(watching):
    _, out = watching
    assert out["metrics"]["state"] == "alarmed"
    assert 'sglang_pcie_accept_alarm{model_name="alarm-test"} 1.0' in out["prometheus"]
    assert 'sglang_pcie_accept_alarm_accept_length{model_name="alarm-test"} 1.0' in out["prometheus"]


def test_the_diffed_source_watches_the_same_method_and_the_runtime_patch_stands_aside(watching):
    _, out = watching
    assert out["diffed"] == {"marker": "accept-length-alarm",
                             "apply": [APPLIED, "source carries the sglang-pcie diff"], "unchanged_by_apply": True}


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_switched_off_leaves_the_release_method_its_own(sglang_env, pristine_source, tmp_path, version):
    out = _run_child(sglang_env, pristine_source, tmp_path, version,
                     {"SGLANG_PCIE_DISABLE_PATCHES": "accept-length-alarm"}, watching=False)
    assert out["marker"] is None and out["inner_own_file"]
    assert out["activation"] == {} and out["switched_off"] == "listed in SGLANG_PCIE_DISABLE_PATCHES"
    assert out["check_runtime"] == DISABLED and out["decorator_is_identity"]
    assert out["diffed"]["marker"] is None  # the diff's decorator is the identity too


# ------------------------------------------------------- the GPU evidence's broken drafters, replayed on the CPU


def _acceptance_probe() -> str:
    """tests/tools/test_make_test_models.py's replay of SGLang's EAGLE-3 chain: transformers' own Llama decodes
    greedily, the drafter's tensors draft 3 steps per verify; prints each request's tokens and accept lengths."""
    path = REPO / "tests" / "tools" / "test_make_test_models.py"
    spec = importlib.util.spec_from_file_location("make_test_models_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ACCEPTANCE_PROBE


def test_break_drafter_writes_drafters_that_serve_the_same_tokens_and_are_never_accepted(sglang_env, tmp_path):
    from sglang_pcie.tools.make_test_models import PRESETS, make_models
    from sglang_pcie.tools.safetensors_io import read_tensor

    make_models(tmp_path / "m", PRESETS["tiny"], seed=1, acceptance="mixed")
    assert run_benchmark("break_drafter", tmp_path / "m" / "draft").returncode == 0
    roots = {}
    for name in ("draft", "draft-d2t-shifted", "draft-head-shifted"):
        root = roots[name] = tmp_path / f"pair-{name}"
        root.mkdir()
        (root / "target").symlink_to(tmp_path / "m" / "target")
        (root / "draft").symlink_to(tmp_path / "m" / name)
    pairs = [(name, str(root)) for name, root in roots.items()]
    code = (f"import contextlib, io, json\nouts = {{}}\nfor name, root in {pairs!r}:\n"
            "    buf = io.StringIO()\n    with contextlib.redirect_stdout(buf):\n"
            f"        exec({_acceptance_probe()!r}.replace('sys.argv[1]', repr(root)), {{'__name__': '__main__'}})\n"
            "    outs[name] = json.loads(buf.getvalue())\nprint(json.dumps(outs))")
    outs = sglang_env("0.5.23").run_json(code)
    accept = {name: sum(sum(r["accept_lengths"]) for r in rs) / sum(len(r["accept_lengths"]) for r in rs)
              for name, rs in outs.items()}
    assert accept["draft"] > 2.5, accept  # the mixed pair at 3 steps
    assert accept["draft-d2t-shifted"] == accept["draft-head-shifted"] == 1.0, accept  # no draft ever accepted
    tokens = {name: [r["tokens"] for r in rs] for name, rs in outs.items()}
    assert tokens["draft-d2t-shifted"] == tokens["draft-head-shifted"] == tokens["draft"]  # lossless: same text
    # what changed: d2t within the same hot set, or only the lm_head rows
    hot = {}
    for name in roots:
        _, _, d2t = read_tensor(tmp_path / "m" / name / "model.safetensors", "d2t")
        hot[name] = [d + i for i, d in enumerate(d2t)]
    assert hot["draft-d2t-shifted"] == hot["draft"][1:] + hot["draft"][:1]
    assert hot["draft-head-shifted"] == hot["draft"]
    for name in ("draft-d2t-shifted", "draft-head-shifted"):
        assert (tmp_path / "m" / name / "config.json").read_bytes() == \
            (tmp_path / "m" / "draft" / "config.json").read_bytes()
