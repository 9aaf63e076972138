"""The overlay inside the real SGLang releases: activation on ``import sglang``, spawned workers, the plugin entry
point, bad settings, the off switch, and ``verify-patches --runtime`` end to end."""
from __future__ import annotations

import json

import pytest

VERSIONS = ["0.5.9", "0.5.23"]

SPAWN_HELPER = '''
import os, sys

def overlay_state():
    import sglang
    import sglang_pcie.activate as act
    return {"activated": act._activated, "decided": os.environ.get("SGLANG_PCIE_NCCL_DECIDED"),
            "proto": os.environ.get("NCCL_PROTO")}
'''

ACTIVATION = '''
import importlib.metadata as md, json, multiprocessing, os, sys
import sglang
import sglang_pcie.activate as act
import spawn_helper
state = {"in_launcher": spawn_helper.overlay_state()}
with multiprocessing.get_context("spawn").Pool(1) as pool:  # as SGLang starts its scheduler / TP workers
    state["in_spawned_worker"] = pool.apply(spawn_helper.overlay_state)
state["entry_points"] = [ep.value for ep in md.entry_points(group="sglang.srt.plugins")]
watcher = next(f for f in sys.meta_path if type(f).__name__ == "ImportWatcher")
before = {name: len(cbs) for name, cbs in watcher.callbacks.items()}
try:
    from sglang.srt.plugins import load_plugins
except ImportError:
    load_plugins = None
if load_plugins:
    load_plugins()
state["plugin_framework"] = load_plugins is not None
state["callbacks_unchanged_by_plugin_load"] = before == {n: len(c) for n, c in watcher.callbacks.items()}
print(json.dumps(state))
'''


@pytest.mark.parametrize("version", VERSIONS)
def test_import_sglang_activates_launcher_and_spawned_workers(sglang_env, version, tmp_path):
    (tmp_path / "spawn_helper.py").write_text(SPAWN_HELPER)
    state = sglang_env(version).run_json(ACTIVATION, env={"PYTHONPATH": str(tmp_path),
                                                          "SGLANG_PCIE_NCCL_PROFILE": "pcie"})
    expected = {"activated": True, "decided": "pcie", "proto": "LL"}
    assert state["in_launcher"] == expected
    assert state["in_spawned_worker"] == expected
    assert "sglang_pcie.plugin:load" in state["entry_points"]
    assert state["plugin_framework"] is (version != "0.5.9")
    assert state["callbacks_unchanged_by_plugin_load"]


BAD_SETTING = '''
import json, os
import sglang
print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("NCCL_")}))
'''


def test_invalid_profile_warns_once_and_applies_nothing(sglang_env):
    proc = sglang_env("0.5.23").run(BAD_SETTING, env={"SGLANG_PCIE_NCCL_PROFILE": "fastest"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {}
    warnings = [line for line in proc.stderr.splitlines() if "SGLANG_PCIE_NCCL_PROFILE" in line]
    assert len(warnings) == 1 and "'fastest'" in warnings[0]


VERIFY = '''
import json, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "sglang_pcie", "verify-patches", "--runtime", "--json"],
                      capture_output=True, text=True)
report = json.loads(proc.stdout)
print(json.dumps({"rc": proc.returncode, "version": report["sglang_version"],
                  "statuses": {row["id"]: row["status"] for row in report["patches"]},
                  "stderr": proc.stderr[-2000:]}))
'''


@pytest.mark.parametrize("version, expected", [
    ("0.5.9", {"sm120-allreduce-fusion": "applied", "eagle3-profile": "applied", "drafter-delegation": "applied"}),
    # Kimi-K2.5 has the methods upstream from 0.5.10; 25 other wrapper classes of 0.5.23 still lack them.
    ("0.5.23", {"sm120-allreduce-fusion": "applied", "eagle3-profile": "applied",
                "drafter-delegation": "applied"}),
])
def test_verify_patches_runtime_in_real_release(sglang_env, version, expected):
    out = sglang_env(version).run_json(VERIFY, env={"EAGLE3_PROFILE": "1"})
    assert out["version"] == version
    assert out["statuses"] == expected, out["stderr"]
    assert out["rc"] == 0


def test_disable_switch_leaves_sglang_untouched(sglang_env):
    out = sglang_env("0.5.9").run_json(VERIFY, env={"SGLANG_PCIE_DISABLE": "1", "EAGLE3_PROFILE": "1"})
    assert set(out["statuses"].values()) == {"disabled"} and out["rc"] == 0
