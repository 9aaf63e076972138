"""The accept-length alarm's rule, message and wrapper, driven with SGLang-shaped objects (no SGLang needed here;
tests/patches/accept_length_alarm/test_accept_length_alarm_check.py drives the real TokenizerManager of 0.5.9 and
0.5.23)."""
from __future__ import annotations

import logging
import shlex
from types import SimpleNamespace as ns

import pytest

from sglang_pcie.runtime import baked
from sglang_pcie.patches.accept_length_alarm import payload as aa
from sglang_pcie.runtime.results import is_patched

MODULE = "sglang.srt.managers.tokenizer_manager"


def server_args(**overrides):
    values = dict(speculative_algorithm="EAGLE3", model_path="/models/target",
                  speculative_draft_model_path="/models/my draft", speculative_num_steps=3, speculative_eagle_topk=1,
                  speculative_num_draft_tokens=4, speculative_token_map=None, revision=None,
                  speculative_draft_model_revision=None, enable_metrics=False, served_model_name="m")
    return ns(**{**values, **overrides})


def batch(verifies, accepted, field="spec_num_correct_drafts"):
    """SGLang's output batch as the hook sees it: per-request verify counts and accepted drafts."""
    return ns(spec_verify_ct=list(verifies), completion_tokens=[1 + v + a for v, a in zip(verifies, accepted)],
              **{field: list(accepted)})


def feed(watch, manager, requests, field="spec_num_correct_drafts"):
    """``requests``: (verifies, accepted drafts) per finished request, each in its own output batch."""
    for verifies, accepted in requests:
        watch.add(manager, batch([verifies], [accepted], field), 0, MODULE)


@pytest.fixture
def manager():
    return ns(server_args=server_args())


@pytest.fixture
def caplog_module(caplog):
    caplog.set_level(logging.WARNING, logger=MODULE)
    return caplog


def warnings(caplog):
    return [r for r in caplog.records if r.name == MODULE and r.levelno == logging.WARNING]


# ------------------------------------------------------------------------------------------------- the rule


def test_a_broken_drafter_warns_exactly_once_after_enough_verifies(manager, caplog_module):
    watch = aa.AcceptWatch()
    feed(watch, manager, [(40, 0)] * 7)  # 280 verifies in 7 requests: not enough of either
    assert watch.state == aa.WATCHING and warnings(caplog_module) == []
    feed(watch, manager, [(40, 1)])  # the 8th request brings 320 verifies: judged, accept length 1.003
    assert watch.state == aa.ALARMED
    (record,) = warnings(caplog_module)
    first = record.getMessage().splitlines()[0]
    assert "EAGLE3 drafter /models/my draft looks broken: accept length 1.00 over 320 request-verifies" in first
    assert "(8 finished requests)" in first and "at 3 draft steps gives 1.42 or more" in first
    assert "fires below 1.10" in first
    feed(watch, manager, [(40, 0)] * 200)  # stays broken: nothing more
    assert len(warnings(caplog_module)) == 1 and watch.state == aa.ALARMED


def test_the_warning_names_causes_in_order_and_the_check_drafter_command(manager):
    watch = aa.AcceptWatch()
    feed(watch, manager, [(50, 0)] * 8)
    lines = watch.lines[0].splitlines()
    assert lines[1] == "  likely causes, most likely first:"
    assert lines[2].startswith("  1. the vocabulary map (d2t / t2d)")
    assert lines[3].startswith("  2. the captured target layers (eagle_aux_hidden_state_layer_ids")
    assert lines[4].startswith("  3. the drafter was trained for another target")
    assert lines[5].startswith("  4. this workload is one no drafter can predict")
    command = lines[6].split(": ", 1)[1]
    assert shlex.split(command) == [
        "sglang-pcie", "check-drafter", "--draft", "/models/my draft", "--target", "/models/target", "--",
        "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]
    assert lines[7] == "  (one warning per server; switch off: SGLANG_PCIE_DISABLE_PATCHES=accept-length-alarm)"


def test_the_command_carries_a_token_map_and_revisions_when_set():
    server = aa.describe_server(server_args(speculative_token_map="/maps/hot.pt", revision="abc123"))
    words = shlex.split(aa.check_command(server))
    assert words[words.index("--speculative-token-map") + 1] == "/maps/hot.pt"
    assert words[words.index("--revision") + 1] == "abc123"
    assert "--speculative-draft-model-revision" not in words


@pytest.mark.parametrize("label, accepted_per_request", [
    ("mixed pair at 3 steps, 2.5", 60),  # 40 verifies: 1 + 60/40
    ("poor but working drafter, 1.3", 12),
    ("just at the line, 1.10", 4),
])
def test_never_for_a_working_drafter(manager, caplog_module, label, accepted_per_request):
    watch = aa.AcceptWatch()
    feed(watch, manager, [(40, accepted_per_request)] * 500)
    assert watch.state == aa.WATCHING and warnings(caplog_module) == [], label


def test_just_below_the_line_warns(manager):
    watch = aa.AcceptWatch()
    feed(watch, manager, [(100, 9)] * 8)  # 1.09
    assert watch.state == aa.ALARMED


def test_many_verifies_from_few_requests_are_not_enough(manager, caplog_module):
    """One long request of random strings must not decide: MIN_REQUESTS finished requests are needed."""
    watch = aa.AcceptWatch()
    feed(watch, manager, [(5000, 0)] * (aa.MIN_REQUESTS - 1))
    assert watch.state == aa.WATCHING and warnings(caplog_module) == []


def test_requests_without_a_verify_are_not_counted(manager):
    watch = aa.AcceptWatch()
    feed(watch, manager, [(0, 0)] * 50 + [(100, 0)] * 3)
    assert (watch.requests, watch.verifies) == (3, 300) and watch.state == aa.WATCHING


def test_one_recovery_line_then_the_watch_ends(manager, caplog_module):
    watch = aa.AcceptWatch()
    feed(watch, manager, [(50, 0)] * 8)
    feed(watch, manager, [(50, 10)] * 8)  # 1.20 since the warning: not recovered yet
    assert watch.state == aa.ALARMED
    feed(watch, manager, [(50, 60)])  # now (80 + 60) / 450: 1.31 since the warning
    assert watch.state == aa.DONE
    alarm, recovered = warnings(caplog_module)
    assert recovered.getMessage() == (
        "sglang-pcie accept-length-alarm: recovered: EAGLE3 drafter /models/my draft: accept length 1.31 over the last"
        " 450 request-verifies (9 requests) since the warning (recovered at >= 1.25); no further checks")
    feed(watch, manager, [(50, 0)] * 50)
    assert len(warnings(caplog_module)) == 2


@pytest.mark.parametrize("field", aa.ACCEPTED_FIELDS)
def test_every_releases_name_for_the_accepted_drafts_is_read(manager, field):
    watch = aa.AcceptWatch()
    feed(watch, manager, [(40, 0)] * 8, field=field)
    assert watch.field == field and watch.state == aa.ALARMED


def test_one_output_batch_with_several_requests(manager):
    watch = aa.AcceptWatch()
    out = batch([40] * 8, [0, 1, 0, 0, 2, 0, 0, 0])
    for i in range(8):
        watch.add(manager, out, i, MODULE)
    assert (watch.state, watch.requests) == (aa.ALARMED, 0)  # counted from zero again after the warning


@pytest.mark.parametrize("algorithm", ["NGRAM", "STANDALONE", None])
def test_other_speculative_algorithms_are_not_watched(caplog_module, algorithm):
    watch = aa.AcceptWatch()
    feed(watch, ns(server_args=server_args(speculative_algorithm=algorithm)), [(40, 0)] * 20)
    assert watch.state == aa.OFF and warnings(caplog_module) == []


def test_adaptive_steps_turn_the_alarm_off_with_one_info_line_never_a_warning(caplog_module):
    """Step 0 of SGLang's adaptive steps verifies without drafts (accept length 1.00): a healthy drafter's server
    with a table of step 0 at batch 32 was told "looks broken" (H100, 0.5.16, tune-spec-lease4)."""
    watch = aa.AcceptWatch()
    caplog_module.set_level(logging.INFO, logger=MODULE)
    feed(watch, ns(server_args=server_args(speculative_adaptive=True)), [(40, 0)] * 20)
    assert watch.state == aa.OFF and warnings(caplog_module) == [] and watch.lines == [aa.ADAPTIVE_OFF]
    infos = [r.getMessage() for r in caplog_module.records if r.name == MODULE and r.levelno == logging.INFO]
    assert infos == [aa.ADAPTIVE_OFF]
    fixed = aa.AcceptWatch()  # the same traffic without adaptive steps: the alarm
    feed(fixed, ns(server_args=server_args(speculative_adaptive=False)), [(40, 0)] * 20)
    assert fixed.state == aa.ALARMED


def test_eagle_v1_drafters_warn_without_the_eagle3_check(caplog_module):
    watch = aa.AcceptWatch()
    feed(watch, ns(server_args=server_args(speculative_algorithm="EAGLE")), [(40, 0)] * 8)
    text = watch.lines[0]
    assert "EAGLE drafter /models/my draft looks broken" in text and "check-drafter" not in text
    assert "  1. the drafter was trained for another target model or revision" in text.splitlines()


def test_an_output_batch_without_the_counters_turns_the_watch_off_with_one_line(manager, caplog_module):
    watch = aa.AcceptWatch()
    for _ in range(3):
        watch.add(manager, ns(spec_verify_ct=[40]), 0, MODULE)
    assert watch.state == aa.OFF
    (record,) = warnings(caplog_module)
    assert "off: SGLang's output carries no spec_verify_ct or none of spec_accepted_tokens" in record.getMessage()


def test_an_error_turns_the_watch_off_and_never_raises(manager, caplog_module):
    watch = aa.AcceptWatch()
    watch.add(manager, ns(spec_verify_ct=None, spec_num_correct_drafts=[1]), 0, MODULE)
    assert watch.state == aa.OFF
    assert "off: TypeError" in warnings(caplog_module)[0].getMessage()


def test_working_floor_per_step_count():
    assert [round(aa.working_floor(k), 2) for k in (1, 2, 3, 5, None)] == [1.3, 1.39, 1.42, 1.43, 1.3]


# ---------------------------------------------------------------------------------------------- the wrapper


class Manager:
    """Stands in for TokenizerManager: SGLang's method fills meta_info as 0.5.23's does."""

    def __init__(self, args):
        self.server_args = args

    def _calculate_spec_decoding_metrics(self, meta_info, recv_obj, i):
        meta_info["spec_accept_length"] = recv_obj.completion_tokens[i] / recv_obj.spec_verify_ct[i]
        return "sglang's own result"


def test_the_wrapper_runs_sglangs_method_first_and_returns_its_result(monkeypatch):
    monkeypatch.setattr(aa, "_WATCH", None)
    wrapped = aa.wrap(Manager._calculate_spec_decoding_metrics)
    assert is_patched(wrapped, aa.PATCH_ID) and wrapped.__wrapped__ is Manager._calculate_spec_decoding_metrics
    manager, meta = Manager(server_args()), {}
    for _ in range(8):
        assert wrapped(manager, meta, batch([40], [0]), 0) == "sglang's own result"
    assert meta == {"spec_accept_length": 41 / 40}
    assert aa.get_watch().state == aa.ALARMED


def test_keyword_calls_reach_the_watch(monkeypatch):
    monkeypatch.setattr(aa, "_WATCH", aa.AcceptWatch(min_verifies=1, min_requests=1))
    wrapped = aa.wrap(Manager._calculate_spec_decoding_metrics)
    wrapped(Manager(server_args()), meta_info={}, recv_obj=batch([40], [0]), i=0)
    assert aa.get_watch().state == aa.ALARMED


def test_after_the_watch_ends_the_wrapper_only_calls_sglang(monkeypatch):
    watch = aa.AcceptWatch()
    watch.state = aa.DONE
    monkeypatch.setattr(aa, "_WATCH", watch)
    monkeypatch.setattr(watch, "add", lambda *a: pytest.fail("watched after the end"))
    aa.wrap(Manager._calculate_spec_decoding_metrics)(Manager(server_args()), {}, batch([40], [0]), 0)


@pytest.mark.parametrize("env, wrapped", [
    ({}, True),
    ({"SGLANG_PCIE_DISABLE_PATCHES": "accept-length-alarm"}, False),
    ({"SGLANG_PCIE_DISABLE_PATCHES": "eagle3-profile"}, True),
    ({"SGLANG_PCIE_DISABLE": "1"}, False),
])
def test_the_diffs_decorator_asks_the_registers_gate(monkeypatch, env, wrapped):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    function = Manager._calculate_spec_decoding_metrics
    assert (baked.guard(aa.PATCH_ID)()(function) is not function) is wrapped


def test_prometheus_export_off_without_the_client_and_the_alarm_still_fires(monkeypatch, caplog_module):
    monkeypatch.setitem(__import__("sys").modules, "prometheus_client", None)
    watch = aa.AcceptWatch()
    feed(watch, ns(server_args=server_args(enable_metrics=True)), [(40, 0)] * 8)
    texts = [r.getMessage() for r in warnings(caplog_module)]
    assert texts[0].startswith("sglang-pcie accept-length-alarm: Prometheus export off: ")
    assert "looks broken" in texts[1] and watch.state == aa.ALARMED


def test_a_failing_logger_never_reaches_sglang(manager, monkeypatch):
    watch = aa.AcceptWatch()

    def broken(text):
        raise OSError("log disk full")
    monkeypatch.setattr(watch, "_log", broken)
    feed(watch, manager, [(40, 0)] * 8)  # the warning's log call raises: the watch turns off, silently
    assert watch.state == aa.OFF


def test_the_diffs_decorator_leaves_sglangs_method_when_the_settings_cannot_be_read(monkeypatch):
    from sglang_pcie.runtime import settings

    def unreadable():
        raise RuntimeError("settings")
    monkeypatch.setattr(settings, "for_process", unreadable)
    function = Manager._calculate_spec_decoding_metrics
    assert baked.guard(aa.PATCH_ID)()(function) is function


def test_a_component_without_server_args_reads_sglangs_process_wide_record(monkeypatch, caplog_module):
    """Where SGLang moves the hook to a component class that does not hold the ServerArgs, the watch reads them
    from SGLang's runtime context (0.5.18+) instead of turning off."""
    import sys
    import types

    component = ns()  # no server_args of its own
    assert aa.server_args_of(component) is None
    context = types.ModuleType("sglang.srt.runtime_context")
    context.get_server_args = lambda: server_args()
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", context)
    assert aa.server_args_of(component).model_path == "/models/target"
    watch = aa.AcceptWatch()
    feed(watch, component, [(40, 0)] * 8)
    assert watch.state == aa.ALARMED and len(warnings(caplog_module)) == 1

    def unpublished():
        raise ValueError("server args not published")

    context.get_server_args = unpublished
    assert aa.server_args_of(component) is None
    watch = aa.AcceptWatch()
    feed(watch, component, [(40, 0)])
    assert watch.state == aa.OFF  # no EAGLE run it can tell: off, as without SGLang's server args


class Gauges:
    def __init__(self):
        self.calls = []

    def set_accept_length(self, value):
        self.calls.append(("accept_length", value))

    def set_alarm(self, value):
        self.calls.append(("alarm", value))


def test_recovery_at_exactly_the_recovered_line_ends_the_checks_and_the_gauges_move_only_on_change(manager):
    watch = aa.AcceptWatch(min_verifies=10, min_requests=1, alarm_below=1.1, recovered_at=1.5)
    watch.metrics = gauges = Gauges()
    feed(watch, manager, [(10, 0)])  # accept length 1.00: the alarm
    assert watch.state == aa.ALARMED and (watch.verifies, watch.requests) == (0, 0)  # counted afresh from here
    feed(watch, manager, [(10, 4)])  # 1.40: still below the recovered line
    assert watch.state == aa.ALARMED
    feed(watch, manager, [(10, 6)])  # 1 + 10/20 = 1.50, exactly the line: recovered
    assert watch.state == aa.DONE and watch.lines[-1].startswith(f"{aa.LOG_PREFIX}: recovered: EAGLE3 drafter")
    assert gauges.calls == [("accept_length", 1.0), ("alarm", 1), ("accept_length", 1.4), ("accept_length", 1.5),
                            ("alarm", 0)]
    watch = aa.AcceptWatch(min_verifies=10, min_requests=1)
    watch.metrics = gauges = Gauges()
    feed(watch, manager, [(10, 20), (10, 20), (10, 21)])  # 3.00, 3.00, 3.03
    assert gauges.calls == [("accept_length", 3.0), ("accept_length", 3.03)]  # written only when it changes


def test_a_request_past_the_end_of_either_list_is_skipped_not_an_error(manager):
    watch = aa.AcceptWatch(min_verifies=10, min_requests=1)
    watch.add(manager, ns(spec_verify_ct=[5, 5], spec_num_correct_drafts=[1]), 1, MODULE)
    watch.add(manager, ns(spec_verify_ct=[5], spec_num_correct_drafts=[1, 1]), 1, MODULE)
    assert watch.state == aa.WATCHING and watch.lines == [] and watch.requests == 0


@pytest.mark.parametrize("steps", [0, -2, None, "3"])
def test_the_working_floor_of_steps_that_are_not_a_positive_count_is_one_steps(steps):
    assert aa.working_floor(steps) == aa.working_floor(1) == pytest.approx(1 + aa.WORKING_FIRST_DRAFT)
