"""What tune-spec keeps of one server: each level's figure (c=1: 1000 / mean TPOT, not the median; c>1: output
tok/s) with the per-request histograms the model reads, the EAGLE profile's acceptance only where SGLang gave none,
a failure as one line ending with the log's last error line, EAGLE3_PROFILE=1 only on a profiled server, and each
server's time (the warm-up's too) for the budget (bench's execute_run and the clock replaced: no server)."""
from __future__ import annotations

from types import SimpleNamespace

from sglang_pcie.tools.tune_spec import servers
from sglang_pcie.tools.tune_spec.candidates import Candidate
from sglang_pcie.tools.tune_spec.search import Step
from sglang_pcie.tools.tune_spec.servers import failure_line, phase_figures, variant

PER_REQUEST = [[256, 100, [20, 30, 50]], [256, 200, [150, 40, 10]]]
STREAM = {"output_tokens": 512, "requests": 2, "tpot_ms_mean": 4.0, "tpot_ms_p50": 5.0, "output_tok_s": 150.0,
          "accept_length": 2.3, "accept_at_least": [0.6, 0.2], "requests_spec": PER_REQUEST}
BATCH = dict(STREAM, output_tok_s=5000.0)
CHAIN = Candidate("chain-3", ("--model-path", "/m", "--speculative-num-steps", "3"), 3, "chain")


def test_c1_is_1000_over_the_mean_tpot_and_c_above_1_the_output_tok_s_with_each_requests_histogram():
    got = phase_figures(STREAM, 1, None)
    assert got["value"] == 250.0  # 1000 / mean TPOT: the mean, not the median (5.0 ms) nor the phase's tok/s
    assert (got["requests_spec"], got["accept_at_least"], got["accept_source"]) == (
        PER_REQUEST, [0.6, 0.2], "sglang meta info")
    assert (got["output_tokens"], got["requests"], got["accept_length"]) == (512, 2, 2.3)
    assert phase_figures(BATCH, 32, None)["value"] == 5000.0
    assert phase_figures({"tpot_ms_mean": None}, 1, None)["value"] is None


def test_the_profiles_acceptance_stands_in_only_where_sglang_gave_none():
    profile = {"accept_at_least": [0.9, 0.8]}
    own = phase_figures({"output_tok_s": 1.0, "accept_at_least": [0.6, 0.2]}, 32, profile)
    assert (own["accept_at_least"], own["accept_source"]) == ([0.6, 0.2], "sglang meta info")
    none = phase_figures({"output_tok_s": 1.0, "accept_at_least": None}, 32, profile)
    assert (none["accept_at_least"], none["accept_source"]) == ([0.9, 0.8], "eagle3 profile (all traffic)")
    assert phase_figures({"output_tok_s": 1.0}, 32, None)["accept_source"] is None


def test_a_failure_is_one_line_ending_with_the_logs_last_error_line():
    tail = ("loading weights\nValueError: first, not why it stopped\n  File \"x.py\", line 3\n"
            "torch.OutOfMemoryError: CUDA out of memory\nscheduler exited\n")
    assert failure_line({"stage": "start", "message": "server exited with code 1", "log_tail": tail}) == (
        "start: server exited with code 1 (torch.OutOfMemoryError: CUDA out of memory)")
    assert failure_line({"stage": "start", "message": "no /health", "log_tail": "nothing wrong here\n"}) == (
        "start: no /health")


def test_only_a_profiled_server_runs_with_eagle3_profile():
    plain, profiled = variant(CHAIN), variant(CHAIN, profiled=True)
    assert (plain.name, plain.env, plain.args) == ("chain-3", {}, CHAIN.args)
    assert (profiled.name, profiled.env, profiled.args) == ("chain-3-profiled", {"EAGLE3_PROFILE": "1"}, CHAIN.args)


PLAN = SimpleNamespace(make_run=lambda index, repeat, variant, label=None: {"index": index, "variant": variant},
                       warmup_run=lambda variant: {"index": 0, "variant": variant})


def fake_bench(monkeypatch, record: dict) -> list:
    """bench's execute_run returns ``record`` (and keeps the runs it was given); the clock reads 100 s when the
    server starts and 190.04 s when it is stopped."""
    clock = iter([100.0, 190.04])
    monkeypatch.setattr(servers, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    runs = []
    monkeypatch.setattr(servers, "execute_run",
                        lambda plan, run, sent, progress, drive: runs.append(run) or dict(record, index=run["index"]))
    return runs


def test_a_measured_server_keeps_each_levels_figure_its_role_and_its_time(monkeypatch):
    runs = fake_bench(monkeypatch, {"ok": True, "ready_s": 50.0, "log": "server.log",
                                    "metrics": {"levels": {"1": STREAM, "32": BATCH}}})
    got = servers.measure(PLAN, CHAIN, 4, Step("chain-3", profiled=True, role="leader", levels=(1, 32)), {}, None,
                          print)
    assert runs == [{"index": 4, "variant": variant(CHAIN, profiled=True)}]
    assert ({k: got[k] for k in ("candidate", "kind", "steps", "index", "role", "profiled", "ok", "duration_s",
                                 "failure")}
            == {"candidate": "chain-3", "kind": "chain", "steps": 3, "index": 4, "role": "leader", "profiled": True,
                "ok": True, "duration_s": 90.0, "failure": None})
    assert {level: figures["value"] for level, figures in got["levels"].items()} == {"1": 250.0, "32": 5000.0}


def test_the_warm_up_server_is_timed_for_the_budget_and_a_failure_does_not_stop_the_run(monkeypatch):
    runs = fake_bench(monkeypatch, {"ok": True, "ready_s": 151.0, "log": "00-warmup/server.log"})
    assert servers.warm(PLAN, CHAIN, (1, 32), {}, print) == {
        "candidate": "chain-3", "ok": True, "ready_s": 151.0, "duration_s": 90.0, "failure": None,
        "log": "00-warmup/server.log"}
    assert runs == [{"index": 0, "variant": variant(CHAIN)}]  # never profiled
    fake_bench(monkeypatch, {"ok": False, "failure": {"stage": "start", "message": "exit 1"}})
    said = []
    assert servers.warm(PLAN, CHAIN, (1, 32), {}, said.append)["failure"] == "start: exit 1"
    assert said == ["warm-up chain-3 FAILED at start: exit 1; the measured servers go on"]
