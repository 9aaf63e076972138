"""The tuned NCCL file as the launcher reads it: path, fingerprint, reading, matching, and its precedence in the
NCCL decision."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from sglang_pcie.runtime.settings import load_settings

from sglang_pcie.tools import tune_nccl
from sglang_pcie.runtime import tuned_file as tuning
from sglang_pcie.runtime.nccl import apply_for_process, decide
from sglang_pcie.runtime.gpus import Topology

PCIE_BOX = Topology(["NVIDIA RTX PRO 6000 Blackwell"] * 8, nvlink=False, p2p=False, source="nvml")
NVLINK_BOX = Topology(["NVIDIA H200"] * 2, nvlink=True, p2p=True, source="nvml", detail="36 active NVLink links")
PROFILES = tune_nccl.CANDIDATES


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A private tuned-file path, and none of the developer's NCCL switches leaking into fingerprints."""
    monkeypatch.setenv(tuning.TUNED_FILE_VAR, str(tmp_path / "nccl-tuned.json"))
    for name in (*tuning.TRANSPORT_VARS, *tune_nccl.TUNABLE_VARS):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "nccl-tuned.json"


def runs(*sizes_us):
    """runs((10, 12), (11, 12)) -> two runs over sizes 1 and 8."""
    return [None if r is None else dict(zip((1, 8), r)) for r in sizes_us]


# ---------------------------------------------------------------------------------------------------------------
# Fingerprint and the tuned file


def tuned_profile(topology, explicit: bool, environ=None):
    """(NCCL variables, reason) from a matching tuned file, or (None, reason): the file read once, as decide() does."""
    config, reason = tuning.matching_config(topology, tuning.read_named(environ), explicit, environ)
    return (dict(config["values"]) if config is not None else None), reason


def write_tuned(path: Path, topology: Topology, values: dict, winner=None, ipc=None, **fingerprint_changes):
    """A tuned file as tune-nccl writes it; ``winner`` defaults to the candidate whose values these are."""
    winner = winner or next(name for name, profile in tuning.CANDIDATES.items() if profile == values)
    fingerprint = dict(tuning.fingerprint(topology), **fingerprint_changes)
    config = {"format": tuning.FORMAT, "fingerprint": fingerprint, "winner": winner, "values": values}
    if ipc is not None:
        config["ipc"] = ipc
    tuning.write_config(path, config)


def test_config_path_default_xdg_and_override(tmp_path):
    assert tuning.config_path({"HOME": "/h"}) == Path(os.path.expanduser("~")) / ".config/sglang-pcie/nccl-tuned.json"
    assert tuning.config_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/sglang-pcie/nccl-tuned.json")
    assert tuning.config_path({"XDG_CONFIG_HOME": "/x", tuning.TUNED_FILE_VAR: "/y/t.json"}) == Path("/y/t.json")


def test_installed_nccl_reads_the_distribution_from_sys_path(tmp_path, monkeypatch):
    (tmp_path / "nvidia_nccl_cu12-2.27.5.dist-info").mkdir()
    (tmp_path / "nvidia_nccl_cu12").mkdir()  # the package folder itself is not a version
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path)])
    assert tuning.installed_nccl() == "nvidia-nccl-cu12==2.27.5"
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing")])
    assert tuning.installed_nccl() is None


def test_two_nccl_distributions_are_named_in_one_order_whatever_sys_path_says(tmp_path, monkeypatch):
    """A fingerprint compares this text between runs: the same installs give the same text."""
    for folder, dist in (("a", "nvidia_nccl_cu13-2.30.7"), ("b", "nvidia_nccl_cu12-2.27.5")):
        (tmp_path / folder / f"{dist}.dist-info").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b")])
    both = "nvidia-nccl-cu12==2.27.5,nvidia-nccl-cu13==2.30.7"
    assert tuning.installed_nccl() == both
    monkeypatch.setattr(sys, "path", [str(tmp_path / "b"), str(tmp_path / "a")])
    assert tuning.installed_nccl() == both


def test_the_infiniband_devices_are_listed_sorted_and_at_most_64(tmp_path, monkeypatch):
    for n in range(70):
        (tmp_path / f"mlx5_{n:02d}").mkdir()
    monkeypatch.setattr(tuning, "IB_DEVICES", str(tmp_path))
    assert tuning.ib_devices() == [f"mlx5_{n:02d}" for n in range(64)]
    monkeypatch.setattr(tuning, "IB_DEVICES", str(tmp_path / "none"))
    assert tuning.ib_devices() == []


def test_fingerprint_differences_name_each_field():
    here = tuning.fingerprint(NVLINK_BOX, {}, nccl="nvidia-nccl-cu13==2.30.7")
    assert tuning.fingerprint_differences(here, dict(here)) == []
    other = dict(here, gpus=["NVIDIA H100"] * 2, nccl="nvidia-nccl-cu12==2.27.5",
                 transport_env={"NCCL_P2P_DISABLE": "1"})
    assert [d.split()[0] for d in tuning.fingerprint_differences(other, here)] == ["gpus", "nccl", "transport_env"]
    assert tuning.fingerprint(NVLINK_BOX, {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO"},
                              nccl="x")["transport_env"] == {"NCCL_P2P_DISABLE": "1"}


def test_matching_file_gives_its_values(isolated):
    write_tuned(isolated, PCIE_BOX, {"NCCL_PROTO": "LL"})
    values, reason = tuned_profile(PCIE_BOX, explicit=False)
    assert values == {"NCCL_PROTO": "LL"} and "matches these GPUs" in reason and str(isolated) in reason


def test_defaults_won_is_an_empty_profile_not_a_missing_one(isolated):
    write_tuned(isolated, PCIE_BOX, {}, winner="default")
    values, reason = tuned_profile(PCIE_BOX, explicit=False)
    assert values == {} and "NCCL defaults were fastest" in reason


def test_missing_file(isolated, capsys):
    assert tuned_profile(PCIE_BOX, explicit=False)[0] is None
    assert capsys.readouterr().err == ""  # auto falls back to its rule quietly
    values, reason = tuned_profile(PCIE_BOX, explicit=True)
    assert values is None and "no tuned NCCL file" in reason
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("content", [
    "{not json", '["a list"]', '{"format": 99}',
    json.dumps({"format": 2, "fingerprint": {}, "values": {}}),
    json.dumps({"format": 1, "fingerprint": {}, "values": {}}),  # an older tune-nccl: decode sizes only
    json.dumps({"format": 2, "fingerprint": {k: None for k in tuning.FINGERPRINT_FIELDS}, "values": {},
                "ipc": {"max_numel": -5}}),
])
@pytest.mark.parametrize("explicit", [False, True])
def test_corrupt_file_is_one_warning_naming_it_and_nothing_applied(isolated, capsys, content, explicit):
    # The read says it (one line naming the variable and the file, which the deciding process warns and the CLI
    # prints); the matching only gives the reason, so that `import sglang` and the CLI print the problem once.
    isolated.write_text(content)
    error = tuning.read_named({tuning.TUNED_FILE_VAR: str(isolated)}).error
    values, reason = tuned_profile(PCIE_BOX, explicit=explicit)
    assert capsys.readouterr().err == ""
    assert values is None and str(isolated) in reason
    assert tuning.TUNED_FILE_VAR in error and str(isolated) in error


@pytest.mark.parametrize("values, winner, named", [
    ({"NCCL_NVLS_ENABLE": "1"}, "default", "'NCCL_NVLS_ENABLE' is not a variable tune-nccl sets"),
    ({"LD_PRELOAD": "x.so"}, "default", "'LD_PRELOAD' is not a variable tune-nccl sets"),
    ({"NCCL_NET_PLUGIN": "/tmp/evil.so"}, "default", "'NCCL_NET_PLUGIN' is not a variable tune-nccl sets"),
    ({"NCCL_P2P_DISABLE": "1"}, "default", "'NCCL_P2P_DISABLE' is not a variable tune-nccl sets"),
    ({"NCCL_PRO\x00TO": "LL"}, "proto-LL", "'NCCL_PRO\\x00TO' is not a variable tune-nccl sets"),
    ({"NCCL_PROTO": 1}, "proto-LL", "NCCL_PROTO=1 is not a string"),
    ({"NCCL_BUFFSIZE": "1e30"}, "buffsize-128k", "values (NCCL_BUFFSIZE=1e30) are not those of its winner"),
    ({"NCCL_PROTO": "LL"}, "pcie", "are not those of its winner pcie"),
    ({"NCCL_PROTO": "LL"}, "turbo", "winner 'turbo' is not a profile tune-nccl measures"),
])
def test_a_file_may_set_only_the_values_of_the_profile_it_measured(isolated, capsys, values, winner, named):
    fingerprint = tuning.fingerprint(PCIE_BOX)
    isolated.write_text(json.dumps({"format": 2, "fingerprint": fingerprint, "winner": winner, "values": values}))
    got, reason = tuned_profile(PCIE_BOX, explicit=False)
    assert got is None and named in reason and str(isolated) in reason
    env = {tuning.TUNED_FILE_VAR: str(isolated)}
    decision = decide("auto", env, probe=lambda: PCIE_BOX)
    assert decision.values == {} and named in decision.file_error  # nothing half-applied, the file named


@pytest.mark.parametrize("ipc, named", [
    ({"max_numel": 8192 * 7168, "max_tokens": 8192, "hidden": 7168, "tokens": [1, 2, 4, 8], "flashinfer": "0.7.2"},
     "ipc.max_tokens 8192 is not one of the measured decode sizes"),  # a prefill-sized bound
    ({"max_numel": 10 ** 9, "max_tokens": 8, "hidden": 7168, "tokens": [1, 2, 4, 8], "flashinfer": "0.7.2"},
     "is not the measured bound ipc.max_tokens x ipc.hidden"),
    ({"max_numel": 8 * 7168, "max_tokens": 8, "hidden": 7168, "tokens": [1, 2, 4, 8]}, "ipc.flashinfer must name"),
    ({"max_numel": -5}, "ipc.max_numel -5 is not a positive integer"),
])
def test_the_ipc_bound_is_a_measured_decode_size(isolated, ipc, named):
    config = {"format": 2, "fingerprint": tuning.fingerprint(PCIE_BOX), "winner": "default", "values": {}, "ipc": ipc}
    assert named in tuning.validate_config(config)


@pytest.mark.parametrize("fingerprint_change, named", [
    ({"transport_env": {"LD_PRELOAD": "x"}}, "is not a transport switch tune-nccl records"),
    ({"nvlink": "yes"}, "fingerprint.nvlink 'yes' is not true, false or null"),
    ({"gpus": "8 x H200"}, "must be lists of names"),
])
def test_the_fingerprint_holds_the_types_tune_nccl_writes(fingerprint_change, named):
    config = {"format": 2, "fingerprint": {**tuning.fingerprint(PCIE_BOX), **fingerprint_change},
              "winner": "default", "values": {}}
    assert named in tuning.validate_config(config)


def test_unreadable_file_is_a_warning(isolated, capsys):
    isolated.mkdir()  # a directory where the file should be
    values, reason = tuned_profile(PCIE_BOX, explicit=False)
    assert values is None and "is a folder, not a regular file" in reason


@pytest.mark.parametrize("change", [
    {"gpus": ["NVIDIA RTX PRO 6000 Blackwell"] * 4},  # another count
    {"gpus": ["NVIDIA L40S"] * 8},  # another model
    {"nvlink": True}, {"p2p": True},
    {"gpu_uuids": ["GPU-0000"] * 8},  # the same models on another machine, or another CUDA_VISIBLE_DEVICES
    {"nccl": "nvidia-nccl-cu12==0.0.1"},
    {"transport_env": {"NCCL_P2P_DISABLE": "1"}},  # measured without peer-to-peer, run with it
])
def test_a_file_from_another_setup_is_not_applied(isolated, change):
    write_tuned(isolated, PCIE_BOX, {"NCCL_PROTO": "LL"}, **change)
    values, reason = tuned_profile(PCIE_BOX, explicit=False)
    assert values is None and "measured on another setup" in reason and next(iter(change)) in reason


def test_transport_switches_are_matched_against_the_environment(isolated, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    write_tuned(isolated, PCIE_BOX, {"NCCL_PROTO": "LL"})
    assert tuned_profile(PCIE_BOX, explicit=False)[0] == {"NCCL_PROTO": "LL"}
    monkeypatch.delenv("NCCL_P2P_DISABLE")
    assert tuned_profile(PCIE_BOX, explicit=False)[0] is None


def test_write_config_refuses_unusable_content(tmp_path):
    with pytest.raises(ValueError, match="unusable"):
        tuning.write_config(tmp_path / "t.json", {"format": 2, "fingerprint": {}, "values": {}})
    assert not (tmp_path / "t.json").exists()


# ---------------------------------------------------------------------------------------------------------------
# Precedence through nccl.decide: user environment > tuned file > auto rule


def test_auto_prefers_a_matching_tuned_file_to_its_rule(isolated):
    channels = {"NCCL_PROTO": "LL", "NCCL_MIN_NCHANNELS": "2", "NCCL_MAX_NCHANNELS": "2"}
    write_tuned(isolated, PCIE_BOX, channels)
    decision = decide("auto", dict(os.environ), probe=lambda: PCIE_BOX)
    assert decision.profile == "tuned" and decision.values == channels


def test_auto_keeps_defaults_when_the_sweep_found_them_fastest(isolated):
    write_tuned(isolated, PCIE_BOX, {}, winner="default")
    decision = decide("auto", dict(os.environ), probe=lambda: PCIE_BOX)  # the rule alone would apply pcie here
    assert decision.profile == "tuned" and decision.values == {}


@pytest.mark.parametrize("topology", [PCIE_BOX, NVLINK_BOX])
def test_auto_keeps_nccl_defaults_on_a_mismatch(isolated, topology):
    write_tuned(isolated, topology, {"NCCL_PROTO": "Simple"}, nccl="nvidia-nccl-cu12==0.0.1")
    decision = decide("auto", dict(os.environ), probe=lambda: topology)
    assert decision.values == {} and "measured on another setup" in decision.reason


def test_user_variables_beat_the_tuned_file(isolated):
    write_tuned(isolated, NVLINK_BOX, {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"})
    decision = decide("auto", {**os.environ, "NCCL_PROTO": "Simple"}, probe=lambda: NVLINK_BOX)
    assert decision.values == {"NCCL_ALGO": "Ring"} and decision.user_set == {"NCCL_PROTO": "Simple"}


@pytest.mark.parametrize("content", [None, "{broken", "mismatch"])
def test_explicit_tuned_without_a_usable_file_applies_nothing(isolated, capsys, content):
    if content == "mismatch":
        write_tuned(isolated, PCIE_BOX, {"NCCL_PROTO": "LL"}, gpus=["NVIDIA A100"] * 8)
    elif content:
        isolated.write_text(content)
    decision = decide("tuned", dict(os.environ), probe=lambda: PCIE_BOX)  # neither the file's values nor the PCIe rule
    assert decision.profile == "none" and decision.values == {}
    assert "SGLANG_PCIE_NCCL_PROFILE=tuned" in decision.reason or str(isolated) in decision.reason
    # A broken file is the settings check's one line (naming SGLANG_PCIE_TUNED_FILE), not the decision's.
    assert capsys.readouterr().err.count("\n") == (0 if content == "{broken" else 1)


def test_explicit_tuned_with_a_matching_file(isolated):
    write_tuned(isolated, NVLINK_BOX, {"NCCL_PROTO": "LL"})
    decision = decide("tuned", dict(os.environ), probe=lambda: NVLINK_BOX)
    assert decision.profile == "tuned" and decision.values == {"NCCL_PROTO": "LL"}


# ---------------------------------------------------------------------------------------------------------------
# A tuned file that cannot be used: one line naming it, from the NCCL decision that reads it (once)


def file_error(environ, profile="auto"):
    return decide(profile, environ, probe=lambda: PCIE_BOX).file_error


def test_tuned_file_that_does_not_exist_is_named(tmp_path):
    missing = str(tmp_path / "nccl-tuned.json")
    assert file_error({"SGLANG_PCIE_TUNED_FILE": missing}) == (f"SGLANG_PCIE_TUNED_FILE={missing!r}: no such file {missing}; nothing applied from it")


@pytest.mark.parametrize("content, problem", [
    ("{not json", "is not valid JSON"),
    ('{"format": 1}', "is not usable"),
    (b"\xff\xfe", "is not UTF-8 text"),
])
def test_tuned_file_that_cannot_be_used_is_named(tmp_path, content, problem):
    path = tmp_path / "nccl-tuned.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    error = file_error({"SGLANG_PCIE_TUNED_FILE": str(path)})
    assert error.startswith(f"SGLANG_PCIE_TUNED_FILE={str(path)!r}: ") and problem in error


def test_default_tuned_file_is_checked_too_and_its_absence_is_fine(tmp_path):
    assert file_error({"XDG_CONFIG_HOME": str(tmp_path)}) is None
    default = tmp_path / "sglang-pcie" / "nccl-tuned.json"
    default.parent.mkdir()
    default.write_text("[]")
    assert file_error({"XDG_CONFIG_HOME": str(tmp_path)}).startswith(
        f"SGLANG_PCIE_TUNED_FILE (unset: the default {default})")


def test_tuned_file_is_checked_only_where_the_nccl_decision_reads_it(tmp_path, capsys):
    # off / pcie never read it; a spawned worker inherits the launcher's decision (and its one warning), so a
    # TP8 server does not print the same line nine times.
    broken = tmp_path / "nccl-tuned.json"
    broken.write_text("{not json")
    environ = {"SGLANG_PCIE_TUNED_FILE": str(broken)}
    assert file_error(environ, "off") is None and file_error(environ, "pcie") is None
    assert file_error(environ) is not None
    worker = dict(environ, SGLANG_PCIE_NCCL_DECIDED="none")
    assert apply_for_process(load_settings(worker), worker) is None and capsys.readouterr().err == ""
    launcher = dict(environ)
    apply_for_process(load_settings(launcher), launcher)
    assert capsys.readouterr().err.count("SGLANG_PCIE_TUNED_FILE=") == 1


def test_a_measurement_across_nodes_says_what_holds_in_every_node_and_names_the_closest_node():
    def node(uuid, nvlink, p2p, nccl="2.27.3"):
        return {"gpus": ["NVIDIA H200"] * 2, "gpu_uuids": [f"{uuid}-0", f"{uuid}-1"], "nvlink": nvlink, "p2p": p2p,
                "nccl": nccl, "transport_env": {}, "net_env": {}, "ib_devices": []}

    both = tuning.multi_node_fingerprint([node("a", False, True, "2.27.3"), node("b", False, None, "2.26.2")])
    assert both["nodes"] == 2 and both["gpu_uuids"] == ["a-0", "a-1", "b-0", "b-1"]
    assert both["nvlink"] is False  # false on one node: false
    assert both["p2p"] is None  # true on one, unknown on the other: unknown, never true
    assert both["nccl"] == "2.27.3"  # node 0's
    assert tuning.multi_node_fingerprint([node("a", True, True), node("b", True, True)])["p2p"] is True
    assert tuning._all_or_none([]) is None  # nobody said: unknown
    here = node("b", False, None, "2.26.2")
    assert tuning.fingerprint_differences(both, {"nodes": 2}, here) == []
    other = dict(here, nccl="2.28.0")
    assert tuning.fingerprint_differences(both, {"nodes": 2}, other) == [
        "this node is none of the 2 nodes measured (closest, node 1: nccl '2.26.2' here '2.28.0')"]
    assert tuning.fingerprint_differences(both, {"nodes": 3}, here) == ["measured on 2 node(s), launched on 3"]
