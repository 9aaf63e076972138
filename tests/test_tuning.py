"""sglang-pcie tune-nccl and the tuned NCCL file: winner rule, fingerprint, reading, precedence, and the sweep's
orchestration (real subprocesses, time bounds, dropped profiles). No GPU: a scripted fake worker stands in for
NCCL where the orchestration is under test, and the real worker runs on CPU tensors (gloo) in a real SGLang env.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglang_pcie import nccl, tune_nccl, tuning
from sglang_pcie.nccl import PCIE_PROFILE, Topology, decide
from sglang_pcie.tuning import choose

REPO = Path(__file__).resolve().parent.parent
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
# Winner rule


def test_defaults_win_when_no_candidate_is_faster_everywhere():
    measured = {"default": runs((10, 20), (10, 20)), "proto-LL": runs((12, 25), (12, 25)),
                "pcie": runs((9, 21), (9, 21))}  # faster at 1 token, slower at 8 beyond the 3% noise floor
    verdict = choose(measured, PROFILES)
    assert verdict.winner == "default" and verdict.qualified == []
    assert verdict.rejected["pcie"].startswith("slower than defaults at 8 tok")


def test_much_faster_at_decode_but_slower_at_prefill_loses():
    # The seed's PCIe set on 2 x H200: a little faster at one token, many times slower at prefill sizes.
    measured = {"default": [{1: 28.1, 8: 36.6, 2048: 1043}] * 2, "pcie": [{1: 23.9, 8: 40.8, 2048: 6392}] * 2}
    verdict = choose(measured, PROFILES)
    assert verdict.winner == "default" and "slower than defaults at 8 tok" in verdict.rejected["pcie"]
    assert "and 1 more sizes" in verdict.rejected["pcie"]


def test_within_the_noise_is_neither_slower_nor_faster():
    measured = {"default": runs((10, 20), (10, 20)), "algo-Ring": runs((10.2, 19.8), (10.2, 19.8))}
    verdict = choose(measured, PROFILES)
    assert verdict.winner == "default"
    assert verdict.rejected["algo-Ring"] == "not faster than defaults beyond the noise at any size"


def test_a_gain_at_one_size_and_noise_elsewhere_wins():
    # Beats the defaults where it claims to (1 token), and is within the noise at 8.
    measured = {"default": runs((10, 20), (10, 20)), "proto-LL": runs((8, 20.4), (8, 20.4))}
    verdict = choose(measured, PROFILES)
    assert verdict.winner == "proto-LL" and verdict.faster["proto-LL"] == [1]


def test_noisy_defaults_widen_the_bound_per_size():
    # The defaults' runs differ by 10% at 1 token: a 5% gain there could be that noise, a 20% gain is not;
    # at 8 tokens they agree, so the 3% floor applies there.
    measured = {"default": runs((10, 20), (11, 20)), "proto-LL": runs((9.5, 20), (9.5, 20))}
    verdict = choose(measured, PROFILES)
    assert verdict.noise == {1: pytest.approx(0.10), 8: pytest.approx(0.03)} and verdict.winner == "default"
    measured["proto-LL"] = runs((8, 20), (8, 20))
    assert choose(measured, PROFILES).winner == "proto-LL"
    measured["proto-LL"] = runs((8, 20.8), (8, 20.8))  # 4% slower at 8 tokens: beyond the 3% there
    assert choose(measured, PROFILES).rejected["proto-LL"].startswith("slower than defaults at 8 tok")


def test_baseline_is_the_defaults_best_and_a_candidate_its_worst_run():
    measured = {"default": runs((10, 20), (12, 20)), "proto-LL": runs((8, 15), (12.5, 15))}
    verdict = choose(measured, PROFILES)
    assert verdict.baseline == {1: 10, 8: 20} and verdict.worst["proto-LL"] == {1: 12.5, 8: 15}
    assert verdict.winner == "default" and "slower than defaults at 1 tok" in verdict.rejected["proto-LL"]


def test_prefill_sizes_do_not_drown_a_decode_gain_in_the_ranking():
    # proto-LL: 20% faster at 1 token; algo-Ring: 5% faster at 8192 tokens (far more microseconds saved).
    measured = {"default": [{1: 10, 8192: 400}] * 2, "proto-LL": [{1: 8, 8192: 400}] * 2,
                "algo-Ring": [{1: 10, 8192: 380}] * 2}
    verdict = choose(measured, PROFILES)
    assert verdict.qualified == ["proto-LL", "algo-Ring"] and verdict.winner == "proto-LL"


def test_a_failed_repeat_run_drops_the_candidate():
    measured = {"default": runs((10, 20), (10, 20)), "algo-Tree": runs((5, 10), None), "proto-LL": [None]}
    verdict = choose(measured, PROFILES)
    assert verdict.rejected == {"algo-Tree": "failed in a repeat run", "proto-LL": "failed"}
    assert verdict.winner == "default"


def test_the_best_qualifier_needs_a_confirming_run():
    measured = {"default": runs((10, 20), (10, 20)), "proto-LL": runs((5, 10)), "algo-Ring": runs((8, 16), (8, 16))}
    verdict = choose(measured, PROFILES)
    assert verdict.qualified == ["proto-LL", "algo-Ring"]
    assert verdict.pending == "proto-LL" and verdict.winner == "algo-Ring"
    measured["proto-LL"] += runs((5.5, 11))
    verdict = choose(measured, PROFILES)
    assert verdict.pending is None and verdict.winner == "proto-LL"


def test_equal_qualifiers_go_to_the_one_that_sets_fewer_variables():
    measured = {"default": runs((10, 20), (10, 20)), "ring-LL": runs((8, 16), (8, 16)),
                "proto-LL": runs((8, 16), (8, 16))}
    assert choose(measured, PROFILES).winner == "proto-LL"


def test_no_successful_default_run_means_no_verdict():
    with pytest.raises(ValueError, match="defaults could not be measured"):
        choose({"default": [None], "proto-LL": runs((5, 10), (5, 10))}, PROFILES)


def test_ipc_wins_up_to_the_largest_size_it_wins_at_every_smaller_one():
    nccl_us, noise = {1: 18, 2: 18, 4: 18, 8: 18}, {1: 0.03, 2: 0.03, 4: 0.03, 8: 0.03}
    judged = tuning.ipc_verdict(nccl_us, noise, [{1: 7, 2: 7, 4: 17.8, 8: 9}, {1: 7.5, 2: 7, 4: 8, 8: 9}])
    # 4 tokens: its slower run (17.8) is within the noise of NCCL's 18, so no win there; 8 does not count then.
    assert judged["wins"] == {1: True, 2: True, 4: False, 8: True} and judged["max_tokens"] == 2
    assert tuning.ipc_verdict(nccl_us, noise, [{1: 20, 2: 7, 4: 7, 8: 7}])["max_tokens"] is None
    assert tuning.ipc_verdict(nccl_us, noise, [{1: 5, 2: 5, 4: 5, 8: 5}, None])["max_tokens"] is None
    assert tuning.ipc_verdict(nccl_us, noise, [{1: 5, 2: None, 4: 5, 8: 5}])["max_tokens"] == 1  # 2 refused


def test_candidates_include_defaults_and_pcie_and_never_touch_nvls():
    assert PROFILES["default"] == {} and PROFILES["pcie"] == PCIE_PROFILE
    assert all("NCCL_NVLS_ENABLE" not in values for values in PROFILES.values())
    assert all(name.startswith("NCCL_") for values in PROFILES.values() for name in values)


# ---------------------------------------------------------------------------------------------------------------
# Fingerprint and the tuned file


def write_tuned(path: Path, topology: Topology, values: dict, winner="proto-LL", ipc=None, **fingerprint_changes):
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
    values, reason = tuning.tuned_profile(PCIE_BOX, explicit=False)
    assert values == {"NCCL_PROTO": "LL"} and "matches these GPUs" in reason and str(isolated) in reason


def test_defaults_won_is_an_empty_profile_not_a_missing_one(isolated):
    write_tuned(isolated, PCIE_BOX, {}, winner="default")
    values, reason = tuning.tuned_profile(PCIE_BOX, explicit=False)
    assert values == {} and "NCCL defaults were fastest" in reason


def test_missing_file(isolated, capsys):
    assert tuning.tuned_profile(PCIE_BOX, explicit=False)[0] is None
    assert capsys.readouterr().err == ""  # auto falls back to its rule quietly
    values, reason = tuning.tuned_profile(PCIE_BOX, explicit=True)
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
    # The settings check says it (one line naming the variable and the file); the NCCL decision only gives the
    # reason, so that `import sglang` and the CLI print the problem once, not twice.
    from sglang_pcie.settings import load_settings

    isolated.write_text(content)
    errors = load_settings({tuning.TUNED_FILE_VAR: str(isolated)}).errors
    values, reason = tuning.tuned_profile(PCIE_BOX, explicit=explicit)
    assert capsys.readouterr().err == ""
    assert values is None and str(isolated) in reason
    assert len(errors) == 1 and tuning.TUNED_FILE_VAR in errors[0] and str(isolated) in errors[0]


def test_file_setting_nvls_or_non_nccl_variables_is_refused(isolated, capsys):
    for values in ({"NCCL_NVLS_ENABLE": "1"}, {"LD_PRELOAD": "x.so"}, {"NCCL_PROTO": 1}):
        fingerprint = tuning.fingerprint(PCIE_BOX)
        isolated.write_text(json.dumps({"format": 2, "fingerprint": fingerprint, "values": values}))
        values, reason = tuning.tuned_profile(PCIE_BOX, explicit=False)
        assert values is None and "not an NCCL variable the tuner sets" in reason


def test_unreadable_file_is_a_warning(isolated, capsys):
    isolated.mkdir()  # a directory where the file should be
    values, reason = tuning.tuned_profile(PCIE_BOX, explicit=False)
    assert values is None and "cannot read tuned NCCL file" in reason


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
    values, reason = tuning.tuned_profile(PCIE_BOX, explicit=False)
    assert values is None and "measured on another setup" in reason and next(iter(change)) in reason


def test_transport_switches_are_matched_against_the_environment(isolated, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    write_tuned(isolated, PCIE_BOX, {"NCCL_PROTO": "LL"})
    assert tuning.tuned_profile(PCIE_BOX, explicit=False)[0] == {"NCCL_PROTO": "LL"}
    monkeypatch.delenv("NCCL_P2P_DISABLE")
    assert tuning.tuned_profile(PCIE_BOX, explicit=False)[0] is None


def test_write_config_refuses_unusable_content(tmp_path):
    with pytest.raises(ValueError, match="unusable"):
        tuning.write_config(tmp_path / "t.json", {"format": 2, "fingerprint": {}, "values": {}})
    assert not (tmp_path / "t.json").exists()


# ---------------------------------------------------------------------------------------------------------------
# Precedence through nccl.decide: user environment > tuned file > auto rule


def test_auto_prefers_a_matching_tuned_file_to_its_rule(isolated):
    write_tuned(isolated, PCIE_BOX, {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4"})
    decision = decide("auto", dict(os.environ), probe=lambda: PCIE_BOX)
    assert decision.profile == "tuned" and decision.values == {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4"}


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
# The sweep's orchestration, with real subprocesses. The fake worker speaks the real worker's protocol and
# misbehaves the ways NCCL profiles do: hanging (with a child of its own), one rank crashing while the other
# waits, failing capture, running slower or faster.

FAKE_WORKER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    spec = json.loads(sys.argv[sys.argv.index("--worker") + 1])
    rank = int(os.environ["RANK"])
    nccl = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    with open(os.path.join(os.environ["FAKE_WORKER_LOG"], f"{os.getpid()}.json"), "w") as log:
        json.dump({"rank": rank, "nccl": nccl, "world": os.environ["WORLD_SIZE"], "spec": spec}, log)
    if os.environ.get("FAKE_WORKER_ALL_FAIL"):
        sys.exit("no GPU")
    if os.environ.get("FAKE_WORKER_HANG"):
        time.sleep(300)
    if os.environ.get("FAKE_WORKER_NO_REPORT"):  # exits 0 with no report, after 50 lines of stderr
        sys.stderr.write("".join(f"stderr line {i} of rank {rank}\\n" for i in range(50)))
        sys.exit(0)
    if spec.get("path") == "pcie-ipc":  # 5 us up to FAKE_IPC_FAST tokens, then slower than NCCL's 10 us per token
        fast = int(os.environ.get("FAKE_IPC_FAST", "0"))
        us = {str(t): 5.0 if t <= fast else 50.0 * t for t in spec["tokens"]}
        print(json.dumps({"rank": rank, "ok": True, "us": us, "flashinfer": "0.7.2", "tune_cache": "/c/ws2.json",
                          "tuned_shapes": len(spec["tune_batches"]) if spec["tune"] else 0}))
        sys.exit(0)
    algo, proto = nccl.get("NCCL_ALGO"), nccl.get("NCCL_PROTO")
    if algo == "Tree":  # hangs, with a child that must die with it
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open(os.path.join(os.environ["FAKE_WORKER_LOG"], f"grandchild-{rank}"), "w").write(str(child.pid))
        time.sleep(300)
    if proto == "Simple":  # rank 1 crashes; rank 0 would wait for it forever
        if rank == 1:
            sys.stderr.write("boom\\n")
            sys.exit(3)
        time.sleep(300)
    if proto == "LL128":
        print(json.dumps({"rank": rank, "ok": False, "error": "RuntimeError: CUDA graph capture failed"}))
        sys.exit(1)
    speed = {"LL": 0.8}.get(proto, 1.0) if algo is None else 1.1
    us = {str(t): 10.0 * t * speed + rank for t in spec["tokens"]}
    print(json.dumps({"rank": rank, "ok": True, "us": us, "nccl": "2.27.5", "device": "Fake GPU"}))
""")


@pytest.fixture
def fake_worker(tmp_path, monkeypatch):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv("FAKE_WORKER_LOG", str(log))
    return [sys.executable, str(script)], log


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in state  # killed, waiting for init to reap it


def test_sweep_drops_hanging_crashing_and_failing_profiles_and_writes_the_winner(fake_worker, isolated, capsys,
                                                                                  monkeypatch):
    command, log = fake_worker
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # kept as the environment has it
    monkeypatch.setenv("NCCL_PROTO", "Simple")  # the user's own: not part of any measurement
    out = isolated.parent / "out" / "tuned.json"
    code = tune_nccl.main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2", "--prefill-tokens", "none",
                           "--timeout", "3", "--out", str(out),
                           "--profiles", "algo-Tree,proto-Simple,proto-LL128,proto-LL,algo-Ring"],
                          worker_command=command)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = json.loads(out.read_text())
    assert config["winner"] == "proto-LL" and config["values"] == {"NCCL_PROTO": "LL"}
    table = config["table"]
    assert len(table["default"]["runs"]) == 2 and len(table["proto-LL"]["runs"]) == 2  # noise check, confirmation
    assert table["default"]["runs"][0] == {"1": 11.0, "2": 21.0}  # the slower rank's time
    assert table["algo-Tree"]["runs"] == [None]
    assert table["algo-Tree"]["verdict"] == "dropped: timed out after 3 s (killed)"
    # The crash ended the run at once (the waiting rank was killed), reported as the crash, not a timeout.
    assert table["proto-Simple"]["verdict"] == "dropped: rank 1 exited with 3: boom"
    assert "CUDA graph capture failed" in table["proto-LL128"]["verdict"]
    assert table["algo-Ring"]["verdict"].startswith("slower than defaults")
    assert config["fingerprint"]["transport_env"] == {"NCCL_NVLS_ENABLE": "0"}
    assert config["measured"]["torch_nccl"] == "2.27.5" and config["measured"]["tp"] == 2

    grandchildren = [int(p.read_text()) for p in log.glob("grandchild-*")]
    assert grandchildren and all(_dead(pid) for pid in grandchildren)
    environments = [json.loads(p.read_text()) for p in log.glob("*.json")]
    assert all(e["nccl"].get("NCCL_NVLS_ENABLE") == "0" and e["world"] == "2" for e in environments)
    assert sorted(e["rank"] for e in environments if e["nccl"] == {"NCCL_NVLS_ENABLE": "0"}) == [0, 0, 1, 1]
    assert "| proto-LL | PROTO=LL | 9.0 | 17.0 | winner: faster at 1, 2 tok (2 runs) |" in captured.out
    assert "Predicted communication per forward pass (2 x 61 layers" in captured.out
    assert config["guarantee_sizes"] == [1, 2] and config["ipc"]["verdict"].startswith("not measured")
    assert "measuring without your NCCL_PROTO" in captured.err and "[3/" in captured.err


def run_ipc_sweep(command, out, *extra):
    return tune_nccl.main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2,4,8", "--prefill-tokens", "64",
                           "--hidden", "16", "--profiles", "proto-LL", "--ipc", "on", "--out", str(out), *extra],
                          worker_command=command)


def test_the_ipc_path_is_measured_next_to_nccl_and_tuned_for_the_servers_workspace(fake_worker, isolated,
                                                                                   monkeypatch, capsys):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_IPC_FAST", "2")  # faster than NCCL at 1 and 2 tokens only
    assert run_ipc_sweep(command, isolated) == 0, capsys.readouterr().err
    ipc = json.loads(isolated.read_text())["ipc"]
    assert ipc["wins"] == {"1": True, "2": True, "4": False, "8": False}
    assert ipc["max_tokens"] == 2 and ipc["max_numel"] == 2 * 16 and ipc["flashinfer"] == "0.7.2"
    assert len(ipc["runs"]) == 2 and ipc["tune_cache"] == "/c/ws2.json"
    specs = [json.loads(p.read_text())["spec"] for p in sorted(log.glob("*.json"), key=lambda p: p.stat().st_mtime)]
    ipc_specs = [s for s in specs if s.get("path") == "pcie-ipc"]
    # Run 1 tunes (measured workspace: 8 x hidden), run 2 reads the cache, run 3 tunes the server's 2 x hidden.
    assert [(s["tune"], s["max_numel"], s["tune_batches"]) for s in ipc_specs[::2]] == [
        (True, 8 * 16, [1, 2, 4, 8]), (False, 8 * 16, [1, 2, 4, 8]), (True, 2 * 16, [1, 2])]
    assert all(s["tokens"] == [1, 2, 4, 8] for s in ipc_specs[:4])  # decode sizes only, never 64
    assert ipc["tuned_max_numel"] == 2 * 16
    assert "| pcie-ipc | FlashInfer 0.7.2 | 5.0 | 5.0 | 200.0 | 400.0 | - |" in capsys.readouterr().out


def test_an_ipc_path_slower_everywhere_is_recorded_as_such(fake_worker, isolated, capsys):
    command, log = fake_worker
    assert run_ipc_sweep(command, isolated) == 0
    ipc = json.loads(isolated.read_text())["ipc"]
    assert ipc["max_numel"] is None and "not faster than NCCL" in ipc["verdict"]
    assert len([p for p in log.glob("*.json") if json.loads(p.read_text())["spec"].get("path")]) == 4  # 2 runs


@pytest.mark.parametrize("world, dtype, ipc, why", [
    (2, "bf16", "off", "--ipc off"), (3, "bf16", "auto", "not 3"), (2, "fp16", "auto", "bf16 only"),
])
def test_where_the_ipc_path_is_not_measured(world, dtype, ipc, why):
    args = tune_nccl.build_parser().parse_args(["--dtype", dtype, "--ipc", ipc])
    assert why in tune_nccl.ipc_unavailable(world, args)


def test_ipc_needs_flashinfer_with_the_kernels(monkeypatch):
    from sglang_pcie import allreduce_paths

    args = tune_nccl.build_parser().parse_args([])
    old = allreduce_paths.FlashinferInstall("0.6.18", False, "/site/flashinfer")
    assert "FlashInfer 0.6.18 has no PCIe-IPC" in tune_nccl.ipc_unavailable(2, args, old)
    assert tune_nccl.ipc_unavailable(4, args, allreduce_paths.FlashinferInstall("0.7.2", True, "/x")) is None


def test_prefill_graphs_hold_fewer_all_reduces():
    spec = {"hidden": 7168, "dtype": "bf16", "allreduces": 122}
    assert [tune_nccl.allreduces_per_graph(spec, t) for t in (1, 8, 512, 2048, 8192)] == [122, 122, 36, 9, 4]
    assert tune_nccl.sglang_tune_ladder(8) == [1, 2, 4, 8] and tune_nccl.sglang_tune_ladder(24) == [1, 2, 4, 8, 16, 24]


def test_sweep_stops_and_writes_nothing_when_defaults_fail(fake_worker, isolated, monkeypatch, capsys):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_WORKER_ALL_FAIL", "1")
    code = tune_nccl.main(["--backend", "gloo", "--tp", "2", "--out", str(isolated)], worker_command=command)
    assert code == 1 and not isolated.exists()
    assert "NCCL defaults could not be measured (rank " in capsys.readouterr().err
    started = [json.loads(p.read_text()) for p in log.glob("*.json")]
    # Only the defaults' ranks started (the second may have been killed before it began): no candidate ran.
    assert 1 <= len(started) <= 2 and all(e["nccl"] == {} for e in started)


def test_stopping_the_sweep_stops_its_workers(fake_worker, isolated, monkeypatch):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_WORKER_HANG", "1")
    code = (f"import sys; from sglang_pcie import tune_nccl; sys.exit(tune_nccl.main("
            f"['--backend', 'gloo', '--tp', '2', '--out', {str(isolated)!r}], worker_command={command!r}))")
    sweep = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                             stderr=subprocess.DEVNULL)
    for _ in range(400):  # until both ranks have started
        if len(list(log.glob("*.json"))) == 2:
            break
        time.sleep(0.05)
    workers = [int(p.stem) for p in log.glob("*.json")]
    assert len(workers) == 2 and sweep.poll() is None
    sweep.terminate()  # SIGTERM, as `timeout` sends
    assert sweep.wait(timeout=30) == 128 + 15
    assert all(_dead(pid) for pid in workers) and not isolated.exists()


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "0"], "positive integers"),
    (["--tokens", "a,b"], "positive integers"),
    (["--timeout", "-1"], "positive number"),
    (["--dtype", "int8"], "invalid choice"),
    (["--profiles", "default,turbo"], "unknown profile 'turbo'"),
    (["--tp", "1"], "at least 2 ranks"),
    (["--backend", "gloo", "--tp", "2"], "give --out"),
])
def test_bad_usage_exits_2_naming_the_value(argv, message, capsys):
    try:
        code = tune_nccl.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err


def test_nccl_backend_needs_the_gpus(monkeypatch, capsys):
    monkeypatch.setattr(nccl, "probe_topology", lambda: Topology(detail="no NVIDIA driver or GPU visible"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert tune_nccl.main(["--tp", "2"]) == 2 and "only 0 GPU(s) visible" in capsys.readouterr().err


def test_dry_run_lists_the_profiles_and_runs_nothing(fake_worker, capsys):
    command, log = fake_worker
    assert tune_nccl.main(["--backend", "gloo", "--dry-run"], worker_command=command) == 0
    out = capsys.readouterr().out
    assert "pcie" in out and "NCCL_PROTO=LL NCCL_ALGO=Ring" in out and not list(log.iterdir())


# ---------------------------------------------------------------------------------------------------------------
# The real worker, on CPU tensors, in a real SGLang environment (torch is there, not in the test interpreter)


@pytest.fixture(scope="module")
def torch_python():
    cache = Path(os.environ.get("SGLANG_PCIE_CACHE") or Path.home() / ".cache" / "sglang-pcie")
    python = cache / "envs" / "sglang-0.5.9" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} missing (ci/sglang-env 0.5.9 builds it)")
    return python


def test_real_worker_checks_sums_and_the_fingerprint_names_torchs_nccl(torch_python, tmp_path):
    out = tmp_path / "tuned.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([str(torch_python), "-m", "sglang_pcie.tune_nccl", "--backend", "gloo", "--tp", "3",
                           "--tokens", "1,3", "--prefill-tokens", "40", "--hidden", "512", "--layers", "2",
                           "--profiles", "default", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    config = json.loads(out.read_text())
    assert config["winner"] == "default" and config["values"] == {}
    assert [sorted(run) for run in config["table"]["default"]["runs"]] == [["1", "3", "40"], ["1", "3", "40"]]
    assert config["measured"]["allreduces_per_graph"] == {"1": 4, "3": 4, "40": 4}
    # The launcher's cheap reading (the pip distribution) names the NCCL that torch actually links.
    assert config["fingerprint"]["nccl"] == f"nvidia-nccl-cu12=={config['measured']['torch_nccl']}"


def test_real_worker_sum_check_catches_a_broken_all_reduce(torch_python):
    # An all-reduce that leaves each rank's data as it was: the check must say so.
    code = textwrap.dedent("""
        import torch
        from types import SimpleNamespace
        from sglang_pcie import tune_nccl
        spec = {"backend": "gloo", "tokens": [2], "hidden": 16, "dtype": "bf16", "allreduces": 3}
        try:
            tune_nccl._measure(torch, SimpleNamespace(all_reduce=lambda t: None), spec, 0, 2, torch.device("cpu"))
        except RuntimeError as exc:
            print(exc)
    """)
    done = subprocess.run([str(torch_python), "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "wrong sums after all-reduce at 2 tokens (3 of 3 buffers)", done.stderr


def test_ipc_benchmark_script_tabulates_both_paths_per_hidden_size(fake_worker, tmp_path, monkeypatch, capsys):
    import importlib.util

    command, log = fake_worker
    monkeypatch.setenv("FAKE_IPC_FAST", "2")
    monkeypatch.setattr(nccl, "probe_topology", lambda environ=None: NVLINK_BOX)
    spec = importlib.util.spec_from_file_location("ipc_allreduce", REPO / "benchmarks" / "ipc_allreduce.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--hidden", "16,32", "--tokens", "1,2,4", "--out", str(tmp_path / "r")],
                      worker_command=command) == 0
    out = capsys.readouterr().out
    assert "| 16 | nccl | 11.0 | 21.0 | 41.0 |" in out and "| 16 | pcie-ipc | 5.0 | 5.0 | 200.0 |" in out
    assert "| 32 | NCCL / IPC | 2.20x | 4.20x | 0.20x |" in out
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert [(r["hidden"], r["path"]) for r in results["runs"]] == [(16, "nccl"), (16, "pcie-ipc"), (32, "nccl"),
                                                                   (32, "pcie-ipc")]
    specs = [json.loads(p.read_text())["spec"] for p in log.glob("*.json")]
    assert {s["max_numel"] for s in specs if s.get("path")} == {4 * 16, 4 * 32}


# The real IPC worker (tune_nccl._measure_ipc) on CPU: gloo, torch.cuda stand-ins, and a FlashInfer workspace
# stand-in that enforces the collective contract of PcieIpcAllReduceWorkspace (tests/ipc_fake_worker.py).

IPC_SPEC = {"backend": "nccl", "path": "pcie-ipc", "tokens": [1, 2, 4], "hidden": 16, "dtype": "bf16",
            "allreduces": 3, "tune": True, "max_numel": 4 * 16, "tune_batches": [1, 2, 4]}


def run_fake_ipc(torch_python, spec, env=None):
    command = [str(torch_python), str(REPO / "tests" / "ipc_fake_worker.py")]
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        return tune_nccl.run_profile({}, spec, 2, 300, command)
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_ipc_worker_keeps_the_collective_contract_and_checks_sums(torch_python):
    outcome = run_fake_ipc(torch_python, IPC_SPEC)
    assert outcome.error is None and sorted(outcome.us) == [1, 2, 4] and all(v > 0 for v in outcome.us.values())
    calls = [c[0] for c in outcome.info["calls"]]
    assert calls == ["jit", "jit", "init", "tune", "prepare", "destroy"]
    assert outcome.info["calls"][2] == ["init", 64, [1, 2, 4], "/stand-in/autotune/pcie_ipc_all_reduce_ws2.json"]
    assert outcome.info["tuned_shapes"] == 3 and outcome.info["flashinfer"] == "0.7.2-stand-in"


def test_ipc_worker_reports_sizes_beyond_the_workspace_as_refused(torch_python):
    outcome = run_fake_ipc(torch_python, dict(IPC_SPEC, max_numel=2 * 16, tune=False))
    assert outcome.error is None and outcome.us[4] is None and outcome.us[2] > 0
    # No tune(): only the kernels' module is loaded, not the autotuner's delay kernel.
    assert outcome.info["calls"][:2] == [["jit", "pcie_ipc_comm"], ["init", 32, [1, 2, 4], outcome.info["tune_cache"]]]
    assert [c[0] for c in outcome.info["calls"]] == ["jit", "init", "prepare", "destroy"]


# The second 2 x H200 run: both ranks built FlashInfer's trtllm_utils inside tune() at once, and a rank polled its
# JIT file lock while its peer waited in the autotuner's timing all-reduce. The worker now loads every JIT module
# tune() needs before any FlashInfer collective, one rank at a time.

def test_ipc_worker_loads_the_jit_modules_one_rank_at_a_time_before_any_collective(torch_python, tmp_path):
    log = tmp_path / "jit.log"
    outcome = run_fake_ipc(torch_python, IPC_SPEC, {"FAKE_IPC_JIT_LOG": str(log)})
    assert outcome.error is None
    # Each load takes 0.2 s: ranks loading at the same time would interleave here.
    assert log.read_text().splitlines() == [f"{rank} {name} {what}" for rank in ("0", "1")
                                            for name in ("pcie_ipc_comm", "trtllm_utils") for what in ("start", "end")]
    assert outcome.info["calls"][:3] == [["jit", "pcie_ipc_comm"], ["jit", "trtllm_utils"],
                                         ["init", 64, [1, 2, 4], outcome.info["tune_cache"]]]


def test_an_autotuner_delay_kernel_that_cannot_be_built_fails_the_run_before_tune(torch_python, tmp_path):
    log = tmp_path / "jit.log"
    outcome = run_fake_ipc(torch_python, IPC_SPEC, {"FAKE_IPC_JIT_FAIL": "trtllm_utils", "FAKE_IPC_JIT_LOG": str(log)})
    assert outcome.us is None and outcome.error.startswith(
        "rank 0: RuntimeError: FlashInfer's autotuner cannot load its JIT module trtllm_utils"), outcome.error
    assert "ninja: error: '/tmp/fi/flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/delayStream.cu'" in (
        outcome.error)
    # Rank 1 never started its turn: it waited at the barrier until rank 0's failure ended the run.
    assert log.read_text().splitlines() == ["0 pcie_ipc_comm start", "0 pcie_ipc_comm end", "0 trtllm_utils start",
                                            "0 trtllm_utils failed"]


def test_a_tune_that_saves_no_configuration_fails_the_run(torch_python, tmp_path):
    env = {"FLASHINFER_AUTOTUNE_DIR": str(tmp_path / "autotune")}
    outcome = run_fake_ipc(torch_python, IPC_SPEC, env)
    assert outcome.error is None and outcome.info["tune_saved"] == 3
    outcome = run_fake_ipc(torch_python, IPC_SPEC, dict(env, FAKE_IPC_TUNE_SAVES_NOTHING="1"))
    assert outcome.us is None and "tune() saved no configuration to " in outcome.error, outcome.error
    assert str(tmp_path / "autotune" / "pcie_ipc_all_reduce_ws2.json") in outcome.error


def test_ipc_worker_catches_wrong_sums(torch_python):
    outcome = run_fake_ipc(torch_python, IPC_SPEC, {"FAKE_IPC_BROKEN": "1"})
    assert outcome.us is None and "wrong sums after eager all-reduce at 1 tokens (3 of 3 buffers)" in outcome.error


def test_run_ipc_with_the_real_worker_measures_judges_and_tunes_for_the_servers_workspace(torch_python):
    command = [str(torch_python), str(REPO / "tests" / "ipc_fake_worker.py")]
    spec = {"backend": "nccl", "tokens": [1, 2, 4, 64], "hidden": 16, "dtype": "bf16", "allreduces": 3}
    # NCCL figures that IPC (CPU gloo here: hundreds of microseconds) beats at 1 and 2 tokens, not at 4.
    nccl_us, noise = {1: 1e6, 2: 1e6, 4: 1.0}, {1: 0.03, 2: 0.03, 4: 0.03}
    result = tune_nccl.run_ipc(spec, 2, [1, 2, 4], nccl_us, noise, 300, command)
    assert result["wins"] == {"1": True, "2": True, "4": False} and result["max_tokens"] == 2
    assert result["max_numel"] == 32 and result["tuned_max_numel"] == 32 and len(result["runs"]) == 2
    assert result["tune_cache"] == "/stand-in/autotune/pcie_ipc_all_reduce_ws2.json" and "error" not in result
    assert result["verdict"] == "the PCIe-IPC all-reduce beats NCCL at every measured size up to 2 tok (not at 4 tok)"


# What a failed, hung or silent run brings back: the ranks' stderr tails, the workers' progress lines, the stacks of
# hung ranks (the first GPU run had only "rank 0 exited without a report" and "timed out after 90 s").


def load_ipc_bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ipc_allreduce", REPO / "benchmarks" / "ipc_allreduce.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_a_report_is_read_whole_even_after_stray_output(tmp_path):
    report = {"rank": 0, "ok": True, "us": {"1": 5.0}, "fabric": "x" * 500}
    out = tmp_path / "rank0.out"
    out.write_text("NCCL INFO init\n[flashinfer] no newline" + json.dumps(report) + "\n\n")
    assert tune_nccl._read_report(out) == report
    out.write_text(json.dumps(report)[:300] + "\n")  # cut short: no report
    assert tune_nccl._read_report(out) is None


def test_a_rank_without_a_report_is_named_with_the_end_of_its_stderr(fake_worker, monkeypatch):
    command, _ = fake_worker
    monkeypatch.setenv("FAKE_WORKER_NO_REPORT", "1")
    spec = {"backend": "gloo", "tokens": [1], "hidden": 16, "dtype": "bf16", "allreduces": 2}
    outcome = tune_nccl.run_profile({}, spec, 2, 60, command)
    assert outcome.us is None
    assert outcome.error == "rank 0 exited without a report; its stderr ends: stderr line 49 of rank 0"
    assert outcome.stderr_tails[1] == [f"stderr line {i} of rank 1" for i in range(10, 50)]  # the last 40


def test_a_failed_ipc_run_in_tune_nccl_reports_each_ranks_stderr(torch_python, capsys):
    command = [str(torch_python), str(REPO / "tests" / "ipc_fake_worker.py")]
    spec = {"backend": "nccl", "tokens": [1, 2], "hidden": 16, "dtype": "bf16", "allreduces": 3}
    old = dict(os.environ)
    os.environ["FAKE_IPC_BROKEN"] = "1"
    try:
        result = tune_nccl.run_ipc(spec, 2, [1, 2], {1: 1.0, 2: 1.0}, {1: 0.03, 2: 0.03}, 300, command)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert "wrong sums after eager all-reduce at 1 tokens" in result["error"]
    # The worker's progress up to where it failed, as written to the tuned file. The broken stand-in needs no peer
    # after init, so the first rank to fail can end its run while the other is still starting: one rank suffices.
    assert sorted(result["stderr_tails"]) == ["0", "1"]
    phases = [[line.split("phase: ", 1)[1] for line in tail if "phase: " in line]
              for tail in result["stderr_tails"].values()]
    failed = next(p for p in phases if p and p[-1] == "prepared")
    assert failed[0] == "importing flashinfer" and failed[-4] == (
        "tune() for hidden 16 (collective; FlashInfer builds its gloo group, rank 0 writes the cache)"), failed
    err = capsys.readouterr().err
    assert "[pcie-ipc] the ranks' stderr ends:\n  rank " in err and " phase: prepared\n" in err


def test_ipc_benchmark_names_where_each_hung_rank_stopped_and_prints_their_stacks(torch_python, tmp_path, capsys,
                                                                                  monkeypatch):
    monkeypatch.setattr(nccl, "probe_topology", lambda environ=None: NVLINK_BOX)
    monkeypatch.setenv("FAKE_IPC_HANG", "tune")
    command = [str(torch_python), str(REPO / "tests" / "ipc_fake_worker.py")]
    argv = ["--paths", "pcie-ipc", "--hidden", "16", "--tokens", "1,2", "--layers", "2", "--timeout", "25",
            "--out", str(tmp_path / "r")]
    assert load_ipc_bench().main(argv, worker_command=command) == 0
    out = capsys.readouterr().out
    stuck = "tune() for hidden 16 (collective; FlashInfer builds its gloo group, rank 0 writes the cache)"
    assert f"FAILED: timed out after 25 s (killed); last phase: rank 0: {stuck}, rank 1: {stuck}" in out
    # Each rank's Python stack, dumped on SIGUSR1 before the kill: it hung inside the workspace's tune().
    for rank in (0, 1):
        assert re.search(rf"^#   rank {rank} \| .*ipc_fake_worker.py\", line \d+ in tune$", out, re.M), out
    row = json.loads((tmp_path / "r" / "results.json").read_text())["runs"][0]
    assert row["path"] == "pcie-ipc" and row["error"].startswith("timed out") and len(row["stderr_tails"]) == 2
    assert "| 16 | pcie-ipc (failed: timed out after 25 s (killed); last phase" in out


def test_ipc_benchmark_show_stderr_prints_the_workers_progress_of_a_good_run(torch_python, tmp_path, capsys,
                                                                            monkeypatch):
    monkeypatch.setattr(nccl, "probe_topology", lambda environ=None: NVLINK_BOX)
    monkeypatch.setenv("FAKE_IPC_STDOUT_JUNK", "1")  # and the report is still found
    command = [str(torch_python), str(REPO / "tests" / "ipc_fake_worker.py")]
    argv = ["--paths", "pcie-ipc", "--hidden", "16", "--tokens", "1,2", "--layers", "2", "--show-stderr",
            "--out", str(tmp_path / "r")]
    assert load_ipc_bench().main(argv, worker_command=command) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and "| 16 | nccl |" not in out and re.search(r"^\| 16 \| pcie-ipc \| \d", out, re.M)
    rank0 = [line.split("phase: ", 1)[1] for line in out.splitlines()
             if line.startswith("#   rank 0 | ") and "phase: " in line]
    assert rank0[0] == "importing flashinfer" and rank0[-2:] == ["destroy() (collective)", "done"], rank0
    assert "tune() done: 2 shapes in 0.0 s; the cache holds 2 configurations" in rank0, rank0
    assert "1 tok: captured; first replay" in rank0


def test_ipc_benchmark_paths_option():
    bench = load_ipc_bench()
    assert bench.parse_args(["--paths", "pcie-ipc,nccl"]).paths == ["nccl", "pcie-ipc"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--paths", "nvls"])


def test_an_unwritable_out_is_refused_before_the_sweep(fake_worker, isolated, capsys):
    command, log = fake_worker
    blocker = isolated.parent / "a-file"
    blocker.write_text("")
    code = tune_nccl.main(["--backend", "gloo", "--tp", "2", "--out", str(blocker / "tuned.json")],
                          worker_command=command)
    err = capsys.readouterr().err
    assert code == 2 and f"--out {blocker / 'tuned.json'}: {blocker} is not a folder" in err
    assert not list(log.glob("*.json"))  # no worker started
    assert tune_nccl.unwritable(isolated.parent / "new" / "deeper" / "tuned.json") is None  # created on write
    assert "is a folder" in tune_nccl.unwritable(isolated.parent)


def test_a_failed_write_keeps_the_measurements_on_stderr(fake_worker, isolated, capsys, monkeypatch):
    command, _ = fake_worker

    def refuse(path, config):
        raise ValueError("refusing to write an unusable tuned file: test")

    monkeypatch.setattr(tuning, "write_config", refuse)
    out = isolated.parent / "out" / "tuned.json"
    code = tune_nccl.main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2", "--prefill-tokens", "none",
                           "--profiles", "proto-LL", "--out", str(out)], worker_command=command)
    err = capsys.readouterr().err
    assert code == 1 and not out.exists()
    assert f"could not write {out}: refusing to write an unusable tuned file: test" in err
    config = json.loads(err[err.index("\n{") + 1:])
    assert config["winner"] in ("default", "proto-LL") and "table" in config


def test_a_ranks_stderr_tail_reads_only_the_end_of_a_large_file(tmp_path):
    # NCCL_DEBUG=INFO can make a rank's stderr large: the tail comes from its last 64 KiB, blank lines dropped.
    err = tmp_path / "rank0.err"
    err.write_text("x" * 200_000 + "\n" + "".join(f"line {i}\n\n" for i in range(50)))
    assert tune_nccl._tail(err, lines=3) == ["line 47", "line 48", "line 49"]
    assert tune_nccl._tail(tmp_path / "missing.err") == []
