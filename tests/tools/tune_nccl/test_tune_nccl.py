"""sglang-pcie tune-nccl end to end: the sweep's orchestration (real subprocesses, time bounds, dropped profiles)
with the scripted fake worker standing in for NCCL, usage errors, and the real worker on CPU tensors (gloo) in a real
SGLang env."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from sglang_pcie.runtime import gpus
from sglang_pcie.runtime import tuned_file as tuning
from sglang_pcie.runtime.gpus import Topology
from sglang_pcie.runtime.nccl import PCIE_PROFILE
from sglang_pcie.tools import tune_nccl
from sglang_pcie.tools.cli import main as cli_main

from support import REPO

PROFILES = tune_nccl.CANDIDATES


def tune_nccl_main(argv: list) -> int:
    return cli_main(["tune-nccl", *argv])


def test_candidates_include_defaults_and_pcie_and_never_touch_nvls():
    assert PROFILES["default"] == {} and PROFILES["pcie"] == PCIE_PROFILE
    assert all("NCCL_NVLS_ENABLE" not in values for values in PROFILES.values())
    assert all(name.startswith("NCCL_") for values in PROFILES.values() for name in values)


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
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2", "--prefill-tokens", "none",
                           "--timeout", "3", "--out", str(out),
                           "--profiles", "algo-Tree,proto-Simple,proto-LL128,proto-LL,algo-Ring"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = json.loads(out.read_text())
    assert config["winner"] == "proto-LL" and config["values"] == {"NCCL_PROTO": "LL"}
    table = config["table"]
    assert len(table["default"]["runs"]) == 3 and len(table["proto-LL"]["runs"]) == 2  # noise check, confirmation
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
    assert sorted(e["rank"] for e in environments if e["nccl"] == {"NCCL_NVLS_ENABLE": "0"}) == [0, 0, 0, 1, 1, 1]
    # The defaults first, in the middle of the candidates (CANDIDATES' order) and last; then the confirmation.
    order = re.findall(r"^tune-nccl: \[\d+/\d+\] (\S+) +(?:\(none\)|NCCL_)", captured.err, re.M)
    assert order == ["default", "proto-LL", "proto-LL128", "default", "proto-Simple", "algo-Ring", "algo-Tree",
                     "default", "proto-LL"], captured.err
    assert "| default | (none) | 11.0 | 21.0 | baseline (3 runs) |" in captured.out
    assert "| proto-LL | PROTO=LL | 9.0 | 17.0 | winner: faster at 1, 2 tok (2 runs) |" in captured.out
    assert "Predicted communication per forward pass (2 x 61 layers" in captured.out
    assert "NCCL winner: proto-LL: NCCL_PROTO=LL\nNCCL verdict: proto-LL: never slower than NCCL's defaults" in (
        captured.out)
    assert config["verdict"] == ("proto-LL: never slower than NCCL's defaults at the 2 sizes (worst 0.818 x their "
                                 "median), faster beyond the noise at 1, 2 tok, mean gain 18.6%, 2 runs")
    assert config["measured"]["baseline"] == {"1": 11.0, "2": 21.0}
    assert config["measured"]["noise"] == {"1": 0.03, "2": 0.03} and config["measured"]["spread"] == {"1": 0, "2": 0}
    assert table["proto-LL"]["worst_ratio"] == 0.8182 and "mean_gain" in table["proto-LL"]
    assert config["guarantee_sizes"] == [1, 2] and config["ipc"]["verdict"].startswith("not measured")
    assert "measuring without your NCCL_PROTO" in captured.err
    assert tuning.read_config(out) == (config, None)  # the launcher's reader takes the new fields


def test_the_sweep_measures_every_candidate_with_exactly_its_variables(fake_worker, isolated, monkeypatch, capsys):
    # CANDIDATES (runtime/tuned_file.py, which the launcher validates a file against) is the one list: without
    # --profiles every entry runs, each rank with exactly that entry's variables and no other tunable one.
    command, log = fake_worker
    monkeypatch.setenv("FAKE_WORKER_PLAIN", "1")
    for name in tune_nccl.TUNABLE_VARS:
        monkeypatch.setenv(name, "from-the-user")  # stripped from every run
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--tokens", "1", "--prefill-tokens", "none",
                           "--out", str(isolated)])
    assert code == 0, capsys.readouterr().err
    config = json.loads(isolated.read_text())
    assert sorted(config["table"]) == sorted(tuning.CANDIDATES)
    assert all(config["table"][name]["values"] == values for name, values in tuning.CANDIDATES.items())
    assert config["values"] == tuning.CANDIDATES[config["winner"]]
    seen = Counter(frozenset(json.loads(p.read_text())["nccl"].items()) for p in log.glob("*.json"))
    assert seen == {frozenset(values.items()): 2 * len(config["table"][name]["runs"])
                    for name, values in tuning.CANDIDATES.items()}
    assert set(tune_nccl.TUNABLE_VARS) == {k for values in tuning.CANDIDATES.values() for k in values}
    assert tune_nccl.CANDIDATES is tuning.CANDIDATES


def test_the_docs_and_the_gpu_script_name_only_candidates_and_the_docs_all_of_them():
    table = (REPO / "docs" / "tune-nccl.md").read_text().split("| profile | variables |", 1)[1].split("\n\n", 1)[0]
    documented = {name.strip() for row in table.splitlines()[2:] for name in row.split("|")[1].split("/")}
    assert documented == set(tuning.CANDIDATES)
    script = (REPO / "benchmarks" / "gpu_nccl_ipc.sh").read_text()
    named = {n for listed in re.findall(r"--profiles ([\w,-]+)", script) for n in listed.split(",")}
    assert named and named <= set(tuning.CANDIDATES)


def test_sweep_stops_and_writes_nothing_when_defaults_fail(fake_worker, isolated, monkeypatch, capsys):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_WORKER_ALL_FAIL", "1")
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--out", str(isolated)])
    assert code == 1 and not isolated.exists()
    assert "NCCL defaults could not be measured (rank " in capsys.readouterr().err
    started = [json.loads(p.read_text()) for p in log.glob("*.json")]
    # Only the defaults' ranks started (the second may have been killed before it began): no candidate ran.
    assert 1 <= len(started) <= 2 and all(e["nccl"] == {} for e in started)


def test_defaults_too_noisy_to_decide_keep_nccls_defaults_and_say_why(fake_worker, isolated, monkeypatch, capsys):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_DEFAULT_SCALES", "1.5,2,1.2")  # a robust spread near 19%: beyond the 10% limit
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2", "--prefill-tokens", "none",
                           "--profiles", "proto-LL", "--out", str(isolated)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = json.loads(isolated.read_text())
    assert config["winner"] == "default" and config["values"] == {}
    why = "NCCL's defaults kept: too noisy to decide: the defaults' 3 runs spread 19.4% at 2 tok (and more than 10%"
    assert config["verdict"].startswith(why) and f"\nNCCL verdict: {why}" in captured.out
    assert config["measured"]["spread"] == {"1": 0.1875, "2": 0.1935}
    # proto-LL beats even the defaults' fastest run beyond that noise, but nothing is decided: no confirmation run,
    # the defaults stay.
    assert config["table"]["proto-LL"]["verdict"] == "qualified, not chosen (defaults kept)"
    assert len(config["table"]["proto-LL"]["runs"]) == 1 and "confirming" not in captured.err
    assert "| default | (none) | 16.0 | 31.0 | winner (NCCL defaults: nothing set; too noisy to decide" in captured.out


def test_a_defaults_run_with_a_figure_that_is_none_writes_nothing(fake_worker, isolated, monkeypatch, capsys):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_DEFAULT_NAN", "1")
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2", "--prefill-tokens", "none",
                           "--out", str(isolated)])
    assert code == 1 and not isolated.exists()
    err = capsys.readouterr().err
    assert "NCCL defaults could not be measured (nan us at 2 tok); nothing written" in err
    assert len(list(log.glob("*.json"))) == 2  # the first defaults run only


def test_stopping_the_sweep_stops_its_workers(fake_worker, isolated, monkeypatch):
    command, log = fake_worker
    monkeypatch.setenv("FAKE_WORKER_HANG", "1")
    code = (f"import sys; from sglang_pcie.tools import cli, tune_nccl; tune_nccl.WORKER_COMMAND = {command!r}; "
            f"sys.exit(cli.main(['tune-nccl', '--backend', 'gloo', '--tp', '2', '--out', {str(isolated)!r}]))")
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
        code = tune_nccl_main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err


NO_GPU = Topology(detail="no NVIDIA driver, or it lists none")


def test_nccl_backend_needs_the_gpus(fake_worker, monkeypatch, capsys):
    # (A fake worker needs no torch, so the GPUs are what is missing here.)
    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: NO_GPU)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert tune_nccl_main(["--tp", "2"]) == 2
    assert capsys.readouterr().err == ("sglang-pcie tune-nccl: error: --tp 2: only 0 GPU(s) visible (no NVIDIA driver, "
                                       "or it lists none); --dry-run previews without them\n")
    assert tune_nccl_main([]) == 2
    assert "0 GPU(s) visible (no NVIDIA driver, or it lists none): an all-reduce needs at least 2 ranks; --dry-run" in (
        capsys.readouterr().err)


@pytest.mark.parametrize("tp", [None, 4])
def test_dry_run_without_a_gpu_is_a_preview_that_says_so(tp, fake_worker, monkeypatch, capsys):
    command, log = fake_worker
    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: NO_GPU)
    assert tune_nccl_main(["--dry-run", *(["--tp", str(tp)] if tp else [])]) == 0
    captured = capsys.readouterr()
    listed = [line.split()[0] for line in captured.out.splitlines()]
    assert listed == [*PROFILES, "pcie-ipc"] and not list(log.iterdir())
    world = tp or 2
    assert (f"tune-nccl: note: a preview: 0 GPU(s) visible (no NVIDIA driver, or it lists none); showing what would run "
            f"over {world} ranks" + ("" if tp else " (without --tp: 2 where fewer than 2 GPUs are visible)")
            + f"; a real run needs {world} GPUs\n") in captured.err
    assert f"tune-nccl: {world} ranks on 0 x no GPU" in captured.err and "; would write " in captured.err
    assert tune_nccl_main(["--dry-run", "--tp", "1"]) == 2 and "at least 2 ranks" in capsys.readouterr().err


def no_torch(monkeypatch):
    """torch unimportable here, as Python marks a blocked module (find_spec answers None), whatever is installed;
    the real worker command, which runs in this Python."""
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(tune_nccl, "WORKER_COMMAND", list(tune_nccl.REAL_WORKER))


def test_without_torch_a_real_run_says_so_in_one_line_before_probing_the_gpus(monkeypatch, capsys, isolated):
    no_torch(monkeypatch)

    def probe(environ=None):
        raise AssertionError("the GPUs were probed")

    monkeypatch.setattr(gpus, "probe_topology", probe)
    assert tune_nccl_main(["--tp", "2"]) == 1 and not isolated.exists()
    assert capsys.readouterr().err == (
        f"sglang-pcie tune-nccl: error: needs torch, which is not installed for {sys.executable}: pip install torch, "
        f"or pip install 'sglang-pcie[serve]' for SGLang and FlashInfer too\n")


def test_without_torch_a_dry_run_previews_and_notes_it(monkeypatch, capsys):
    no_torch(monkeypatch)
    monkeypatch.setattr(gpus, "probe_topology", lambda environ=None: NO_GPU)
    assert tune_nccl_main(["--dry-run"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("default        (NCCL defaults)\n")
    assert "tune-nccl: note: a real run needs torch, which is not installed for " in captured.err


def test_help_says_a_real_run_needs_torch_and_gpus(capsys):
    assert tune_nccl_main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("A real run needs torch (pip install torch, or pip install 'sglang-pcie[serve]' for SGLang and FlashInfer "
            "too) and 2 or more NVIDIA GPUs; --dry-run previews what would run without either.") in text


def test_dry_run_lists_the_profiles_and_runs_nothing(fake_worker, capsys):
    command, log = fake_worker
    assert tune_nccl_main(["--backend", "gloo", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pcie" in out and "NCCL_PROTO=LL NCCL_ALGO=Ring" in out and not list(log.iterdir())


def test_real_worker_checks_sums_and_the_fingerprint_names_torchs_nccl(torch_python, tmp_path):
    out = tmp_path / "tuned.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([str(torch_python), "-m", "sglang_pcie", "tune-nccl", "--backend", "gloo", "--tp", "3",
                           "--tokens", "1,3", "--prefill-tokens", "40", "--hidden", "512", "--layers", "2",
                           "--profiles", "default", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    config = json.loads(out.read_text())
    assert config["winner"] == "default" and config["values"] == {}
    assert [sorted(run) for run in config["table"]["default"]["runs"]] == [["1", "3", "40"]] * 3
    assert config["measured"]["allreduces_per_graph"] == {"1": 4, "3": 4, "40": 4}
    # The launcher's cheap reading (the pip distribution) names the NCCL that torch actually links.
    assert config["fingerprint"]["nccl"] == f"nvidia-nccl-cu12=={config['measured']['torch_nccl']}"


def test_an_unwritable_out_is_refused_before_the_sweep(fake_worker, isolated, capsys):
    command, log = fake_worker
    blocker = isolated.parent / "a-file"
    blocker.write_text("")
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--out", str(blocker / "tuned.json")])
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
    code = tune_nccl_main(["--backend", "gloo", "--tp", "2", "--tokens", "1,2", "--prefill-tokens", "none",
                           "--profiles", "proto-LL", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and not out.exists()
    assert f"could not write {out}: refusing to write an unusable tuned file: test" in err
    config = json.loads(err[err.index("\n{") + 1:])
    assert config["winner"] in ("default", "proto-LL") and "table" in config
