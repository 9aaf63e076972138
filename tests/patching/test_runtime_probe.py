"""The child of ``verify-patches --runtime`` (patching/runtime_probe.py), on stand-in patches and activation results:
which status each patch's row gets, in which order of precedence, and what a target that does not import says.
The child in real SGLang installs: tests/runtime/test_activate.py."""
from __future__ import annotations

import sys
import types

import pytest

from sglang_pcie.patching import engine, runtime_probe
from sglang_pcie.runtime import activate as activation
from sglang_pcie.runtime.results import APPLIED, DISABLED, DRIFTED, ERROR, Result


class StandIn:
    def __init__(self, patch_id, targets=("json",), may_fail=False, check=Result(APPLIED, "in effect")):
        self.id, self.targets, self.targets_may_fail_to_import, self.check = patch_id, targets, may_fail, check
        self.asked = None

    def check_runtime(self, modules, settings):
        self.asked = (sorted(modules), settings)
        if isinstance(self.check, Exception):
            raise self.check
        return self.check


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(__version__="0.5.99"))
    monkeypatch.setattr(activation, "RESULTS", {})
    monkeypatch.setattr(activation, "SWITCHED_OFF", {})
    monkeypatch.setattr(activation, "SETTINGS", "the settings activation used")

    def run(patches, active=True):
        monkeypatch.setattr(activation, "activate", lambda: active)
        monkeypatch.setattr(engine, "all_patches", lambda: patches)
        report = runtime_probe.probe()
        assert report["sglang_version"] == "0.5.99"
        return {row["id"]: (row["status"], row["detail"]) for row in report["patches"]}
    return run


def test_the_overlay_off_disables_every_row(probe):
    assert probe([StandIn("a"), StandIn("b")], active=False) == {
        "a": (DISABLED, "SGLANG_PCIE_DISABLE is set"), "b": (DISABLED, "SGLANG_PCIE_DISABLE is set")}


def test_switched_off_then_a_failed_install_then_the_runtime_check(probe):
    activation.SWITCHED_OFF["off"] = "listed in SGLANG_PCIE_DISABLE_PATCHES"
    activation.RESULTS["failed"] = {"m1": Result(APPLIED, "fine"), "m2": Result(DRIFTED, "moved"),
                                    "m3": Result(ERROR, "broke")}
    checked = StandIn("checked", targets=("json", "no_such_module_here"), may_fail=True)
    rows = probe([StandIn("off"), StandIn("failed"), checked])
    assert rows["off"] == (DISABLED, "listed in SGLANG_PCIE_DISABLE_PATCHES")
    assert rows["failed"] == (DRIFTED, "moved")  # the first failing one, as recorded
    assert rows["checked"] == (APPLIED, "in effect")  # a target the release lacks is no error
    assert checked.asked == (["json"], "the settings activation used")


def test_a_target_that_fails_to_import_is_an_error_unless_the_patch_allows_it(probe, tmp_path, monkeypatch):
    (tmp_path / "broken_target.py").write_text("import no_such_dependency_anywhere\n")
    (tmp_path / "also_broken.py").write_text("raise RuntimeError('no GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    missing = "importing broken_target: ModuleNotFoundError: No module named 'no_such_dependency_anywhere'"
    rows = probe([StandIn("strict", targets=("broken_target",)),
                  StandIn("lenient", targets=("broken_target", "also_broken"), may_fail=True)])
    assert rows["strict"] == (ERROR, missing)
    assert rows["lenient"] == (APPLIED, f"in effect (2 target module(s) do not import here, as for SGLang: {missing}"
                                        " ...)")
    rows = probe([StandIn("lenient", targets=("also_broken", "json"), may_fail=True)])
    assert rows["lenient"] == (APPLIED, "in effect (1 target module(s) do not import here, as for SGLang: importing"
                                        " also_broken: RuntimeError: no GPU)")


def test_a_runtime_check_that_raises_is_an_error_row(probe):
    rows = probe([StandIn("raises", check=KeyError("x"))])
    assert rows["raises"] == (ERROR, "runtime check failed: KeyError: 'x'")


def test_import_target_tells_a_missing_module_from_a_broken_one(tmp_path, monkeypatch):
    assert runtime_probe._import_target("no_such_package_anywhere.sub") == (None, None)
    (tmp_path / "pkg_with_bad_import").mkdir()
    (tmp_path / "pkg_with_bad_import" / "__init__.py").write_text("import no_such_dependency_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module, error = runtime_probe._import_target("pkg_with_bad_import.sub")
    assert module is None and error == ("importing pkg_with_bad_import.sub: ModuleNotFoundError: No module named "
                                        "'no_such_dependency_anywhere'")
    assert runtime_probe._import_target("json")[0] is sys.modules["json"]
