"""The overlay inside the real SGLang releases: activation on ``import sglang``, spawned workers, the plugin entry
point, bad settings, the off switch, and ``verify-patches --runtime`` end to end."""
from __future__ import annotations

import json

import pytest

from support import PATCH_IDS

VERSIONS = ["0.5.9", "0.5.23"]



@pytest.mark.parametrize("version", VERSIONS)
def test_import_sglang_activates_launcher_and_spawned_workers(sglang_env, version):
    state = sglang_env(version).run_script_json("activation_state.py", env={"SGLANG_PCIE_NCCL_PROFILE": "pcie"})
    expected = {"activated": True, "decided": "pcie", "proto": "LL"}
    assert state["in_launcher"] == expected
    assert state["in_spawned_worker"] == expected
    assert "sglang_pcie.runtime.plugin:load" in state["entry_points"]
    assert state["plugin_framework"] is (version != "0.5.9")
    assert state["callbacks_unchanged_by_plugin_load"]



@pytest.mark.parametrize("version", VERSIONS)
def test_a_server_with_the_defaults_loads_nothing_of_patching(sglang_env, version):
    """runtime/ is everything that runs in a server: the default patches install from their hooks (data), so a
    process importing every target module of the defaults loads no ``sglang_pcie.patching`` module, and each default
    patch is applied there."""
    state = sglang_env(version).run_script_json("default_imports.py")
    assert [m for m in state["loaded"] if m.startswith("sglang_pcie.patching")] == []
    assert "sglang_pcie.runtime.hooks" in state["loaded"]
    assert state["switched_off"] == ["eagle3-profile", "sm120-allreduce-fusion"]  # the two opt-ins
    defaults = {"drafter-delegation", "accept-length-alarm", "node-agreement", "draft-token-watch"}
    assert set(state["results"]) == defaults
    assert all(status == "applied" for results in state["results"].values() for status in results.values()), state


@pytest.mark.parametrize("version", VERSIONS)
def test_every_opt_in_on_loads_nothing_of_patching_and_sm120_applies_the_shipped_diff(sglang_env, version):
    """The two patches without hooks install from their own server half (the row's ``install``): opted in to both, a
    process importing their targets loads no ``sglang_pcie.patching`` module and no check; sm120-allreduce-fusion
    applies the diff the wheel ships (``swap``) and eagle3-profile times the workers (``install``)."""
    state = sglang_env(version).run_script_json("default_imports.py",
                                                env={"SGLANG_PCIE_SM120_FUSION": "1", "EAGLE3_PROFILE": "1"})
    assert [m for m in state["loaded"] if m.startswith("sglang_pcie.patching") or m.endswith(".check")] == []
    assert {"sglang_pcie.patches.sm120_allreduce_fusion.swap", "sglang_pcie.patches.eagle3_profile.install"} \
        <= set(state["loaded"])
    assert state["switched_off"] == []
    for patch_id in ("sm120-allreduce-fusion", "eagle3-profile"):
        statuses = state["results"][patch_id]
        assert "applied" in statuses.values() and set(statuses.values()) <= {"applied", "not-applicable"}, statuses
    sm120 = state["details"]["sm120-allreduce-fusion"]
    applied = [sm120[m] for m, status in state["results"]["sm120-allreduce-fusion"].items() if status == "applied"]
    assert all(detail.endswith(f"(sglang {version}: its own diff)") for detail in applied), sm120


def test_invalid_profile_warns_once_and_applies_nothing(sglang_env):
    proc = sglang_env("0.5.23").run_script("nccl_environment.py", env={"SGLANG_PCIE_NCCL_PROFILE": "fastest"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {}
    warnings = [line for line in proc.stderr.splitlines() if "SGLANG_PCIE_NCCL_PROFILE" in line]
    assert len(warnings) == 1 and "'fastest'" in warnings[0]



@pytest.mark.parametrize("make", ["fifo", "device", "nested", "plugin"])
def test_a_hostile_tuned_file_neither_hangs_nor_turns_the_overlay_off(sglang_env, tmp_path, make):
    import os

    path = tmp_path / "nccl-tuned.json"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "device":
        path.symlink_to("/dev/zero")
    elif make == "nested":
        path.write_text("[" * 50_000 + "]" * 50_000)
    else:
        path.write_text(json.dumps({"format": 2, "winner": "default", "values": {"NCCL_NET_PLUGIN": "/tmp/x.so"},
                                    "fingerprint": {"gpus": [], "gpu_uuids": [], "nvlink": None, "p2p": None,
                                                    "nccl": None, "transport_env": {}}}))
    proc = sglang_env("0.5.23").run_script("activation_watchers.py", env={"SGLANG_PCIE_TUNED_FILE": str(path)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout.splitlines()[-1])
    assert state["activated"] is True and "sglang.srt.model_executor.model_runner" in state["watched"]
    assert state["nccl"] == {}  # nothing applied from it
    lines = [line for line in proc.stderr.splitlines() if "SGLANG_PCIE_TUNED_FILE" in line]
    assert len(lines) == 1 and str(path) in lines[0] and "nothing applied from it" in lines[0]



@pytest.mark.parametrize("version, expected", [
    ("0.5.9", {patch_id: "applied" for patch_id in PATCH_IDS}),
    # Kimi-K2.5 has the methods upstream from 0.5.10; 25 other wrapper classes of 0.5.23 still lack them.
    ("0.5.23", {patch_id: "applied" for patch_id in PATCH_IDS}),
])
def test_verify_patches_runtime_in_real_release(sglang_env, version, expected):
    from sglang_pcie.patching import register

    opt_ins = {entry.opt_in.variable: "1" for entry in register.REGISTER if entry.opt_in}  # every patch wanted
    out = sglang_env(version).run_script_json("verify_runtime.py", env=opt_ins)
    assert out["version"] == version
    assert out["statuses"] == expected, out["stderr"]
    assert out["rc"] == 0


def test_disable_switch_leaves_sglang_untouched(sglang_env):
    out = sglang_env("0.5.9").run_script_json("verify_runtime.py", env={"SGLANG_PCIE_DISABLE": "1", "EAGLE3_PROFILE": "1"})
    assert set(out["statuses"].values()) == {"disabled"} and out["rc"] == 0



@pytest.fixture(scope="module")
def drifted_0_5_23(sglang_env, tmp_path_factory):
    """A copy of the real 0.5.23 install (symlinks) whose fusion gate was renamed behind an alias:
    SGLang still works, the sm120 patch's target no longer has its shape."""
    import shutil
    import subprocess

    env = sglang_env("0.5.23")
    site = subprocess.run([str(env.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    root = tmp_path_factory.mktemp("drifted")
    subprocess.run(["cp", "-rs", f"{site}/sglang", str(root / "sglang")], check=True)
    gate = root / "sglang/srt/layers/layer_boundary/residual/add_norm.py"
    text = gate.read_text()
    gate.unlink()
    shutil.copyfile(f"{site}/sglang/srt/layers/layer_boundary/residual/add_norm.py", gate)
    assert "def flashinfer_ar_fusion_applies(" in text
    gate.write_text(text.replace("def flashinfer_ar_fusion_applies(", "def flashinfer_ar_fusion_gate(")
                    + "\nflashinfer_ar_fusion_applies = flashinfer_ar_fusion_gate\n")
    return env, root


def test_drifted_patch_is_skipped_with_one_line_and_the_others_apply(drifted_0_5_23):
    env, root = drifted_0_5_23
    proc = env.run_script("drift_state.py", env={"PYTHONPATH": str(root), "EAGLE3_PROFILE": "1", "SGLANG_PCIE_SM120_FUSION": "1"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["imported"] and out["sm120"] == ["drifted"]
    assert set(out["eagle"].values()) == {"applied"}
    lines = [line for line in proc.stderr.splitlines() if line.startswith("sglang-pcie:")]
    assert len(lines) == 1 and "patch sm120-allreduce-fusion skipped" in lines[0], proc.stderr


def test_strict_mode_stops_at_a_drifted_patch(drifted_0_5_23):
    env, root = drifted_0_5_23
    out = env.run_script_json("drift_state.py", env={"PYTHONPATH": str(root), "SGLANG_PCIE_STRICT": "1",
                                   "SGLANG_PCIE_SM120_FUSION": "1"})
    assert not out["imported"]
    assert out["error"].startswith("StrictModeError: sglang-pcie: SGLANG_PCIE_STRICT=1 and patch"
                                   " sm120-allreduce-fusion skipped")


# ------------------------------------------------------------------------------------------------------------
# Every activation path in real SGLang 0.5.23: the start-up hook on import sglang, then SGLang's own plugin
# loader (load_plugins(), which the launcher, scheduler and detokenizer call), and the plugin loader alone.


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_unreadable_kill_switch_is_off_on_every_path_with_one_line(sglang_env, value):
    proc = sglang_env("0.5.23").run_script("plugin_loader.py", env={"SGLANG_PCIE_DISABLE": value,
                                                         "SGLANG_PCIE_NCCL_PROFILE": "pcie"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    # The hook watched (the value is not "on"), activation read it as off, and the plugin loader agreed:
    # no NCCL variable written, no AttributeError from a missing watcher, no plugin failure logged.
    assert out == {"hooked": True, "after_import": False, "after_plugins": False, "written": []}
    ours = [line for line in proc.stderr.splitlines() if "sglang-pcie" in line or "plugin" in line.lower()]
    assert ours == [f"sglang-pcie: SGLANG_PCIE_DISABLE={value!r} is not a boolean (use 1 or 0);"
                    " read as 1: the overlay is off"], proc.stderr


def test_plugin_loader_alone_activates_real_sglang(sglang_env):
    """``python -S`` (no site, so no .pth hook; site-packages through PYTHONPATH): SGLang's load_plugins() is
    what activates the overlay. SGLang logs its plugin list at INFO before any server configures logging, so
    nothing of it reaches stderr, and the overlay adds nothing either."""
    import subprocess

    env = sglang_env("0.5.23")
    site = subprocess.run([str(env.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    proc = env.run_script("plugin_loader.py", flags=("-S",),
                          env={"PYTHONPATH": site, "SGLANG_PCIE_NCCL_PROFILE": "pcie"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["hooked"] is False and out["after_import"] is None and out["after_plugins"] is True
    assert {"NCCL_PROTO", "NCCL_ALGO", "SGLANG_PCIE_NCCL_DECIDED"} <= set(out["written"])
    assert "sglang-pcie" not in proc.stderr and "Available plugins" not in proc.stderr, proc.stderr


class _Watcher:
    def __init__(self):
        self.watched = []

    def watch(self, name, callback):
        self.watched.append(name)


@pytest.mark.parametrize("listed, registered", [
    ("accept-length-alarm", True),  # a list of patch ids: those off, the rest registered
    ("accept-length-alarm,no-such-patch", False),  # an id that is no patch: every patch off, one line naming it
])
def test_activation_never_half_applies_the_disable_list(monkeypatch, capsys, listed, registered):
    import sglang_pcie_startup

    from sglang_pcie.runtime import activate, nccl, patch_table

    watcher = _Watcher()
    monkeypatch.setattr(sglang_pcie_startup, "get_watcher", lambda: watcher)
    monkeypatch.setattr(nccl, "apply_for_process", lambda settings: None)
    for name, value in (("_activated", None), ("SETTINGS", None), ("SWITCHED_OFF", {}), ("RESULTS", {})):
        monkeypatch.setattr(activate, name, value)
    monkeypatch.setenv("SGLANG_PCIE_DISABLE_PATCHES", listed)
    assert activate.activate() is True
    err = capsys.readouterr().err.strip().splitlines()
    defaults = [row for row in patch_table.TABLE if row.opt_in is None and row.id != "accept-length-alarm"]
    if registered:
        assert err == [] and set(activate.SWITCHED_OFF) == {"accept-length-alarm"} | {
            row.id for row in patch_table.TABLE if row.opt_in}
        assert set(watcher.watched) == {target for row in defaults for target in row.targets}
    else:
        assert watcher.watched == [] and activate.SWITCHED_OFF == dict.fromkeys(patch_table.ids(),
                                                                                  patch_table.UNKNOWN_ID_REASON)
        assert len(err) == 1 and err[0].startswith("sglang-pcie: SGLANG_PCIE_DISABLE_PATCHES=")
        assert "names no patch 'no-such-patch'" in err[0] and err[0].endswith("every patch is off until it names "
                                                                               "only patch ids")
