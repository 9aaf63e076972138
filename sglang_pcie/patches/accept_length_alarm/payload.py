"""accept-length-alarm: one loud warning when an EAGLE drafter's drafts are almost never accepted.

Speculative decoding is lossless: a drafter with a wrong vocabulary map (d2t), wrong captured target layers or
written for another target loads, serves correct text and only makes the server slower (measured on one H200:
accept length 1.00 instead of 2.76, batch throughput 0.40x, no warning anywhere).  Nothing but speed says so.

The figures are SGLang's own per-request accounting: each finished request carries its verify count
(``spec_verify_ct``) and its accepted draft tokens (``spec_accepted_tokens`` 0.5.8-0.5.10.post1,
``spec_accepted_drafts`` 0.5.11, ``spec_num_correct_drafts`` 0.5.12+), the per-request parts of the scheduler's
``accept len:`` log line (accept length = 1 + accepted drafts / request-verifies).  ``wrap`` puts the watch around
``TokenizerManager._calculate_spec_decoding_metrics`` (or the component class SGLang moves it to), which SGLang
calls once per finished request of a speculative run in the one process that serves the HTTP API: at most one
warning per server, no TP rank to pick, nothing per decode step.

The rule (numbers and why: docs/accept-length-alarm.md): once ``MIN_REQUESTS`` requests with ``MIN_VERIFIES``
request-verifies between them have finished, an accept length below ``ALARM_BELOW`` (fewer than one accepted draft
token per ten verifies) logs one warning naming the drafter, the figures, the likely causes and the
``sglang-pcie check-drafter`` command for this drafter and target.  After it, the count starts again; if the
drafter then reaches ``RECOVERED_AT`` over as many verifies, one recovery line, and the watch ends.  With SGLang's
metrics on (``--enable-metrics``), the state and the judged accept length are Prometheus gauges.

This module imports neither sglang nor torch.
"""
from __future__ import annotations

import functools
import inspect
import logging
import sys
import types

from sglang_pcie.runtime.results import Drift, mark
from sglang_pcie.runtime.server_facts import (  # noqa: F401  (describe_server, check_command: its names too)
    check_command, describe_server, metrics_enabled, model_name)
from sglang_pcie.runtime.wrapping import member

# The logger's name from before the patch had its own folder: log filters and handlers keep working.
LOGGER = "sglang_pcie.runtime.accept_alarm"

PATCH_ID = "accept-length-alarm"
LOG_PREFIX = "sglang-pcie accept-length-alarm"
# The method watched (on TokenizerManager, every release 0.5.8-0.5.23) and what it reads on SGLang's output batch.
HOOK = "_calculate_spec_decoding_metrics"
VERIFY_FIELD = "spec_verify_ct"
ACCEPTED_FIELDS = ("spec_accepted_tokens", "spec_accepted_drafts", "spec_num_correct_drafts")
# Draft-model algorithms (SGLang turns NEXTN into EAGLE); NGRAM and STANDALONE are not watched.
WATCHED_ALGORITHMS = ("EAGLE", "EAGLE3")

ALARM_BELOW = 1.10  # accept length: fewer than one accepted draft token per ten request-verifies
RECOVERED_AT = 1.25  # after an alarm: one accepted draft per four verifies counts as working again
MIN_VERIFIES = 300  # request-verifies before anything is judged
MIN_REQUESTS = 8  # finished requests before anything is judged: one odd request never decides
WORKING_FIRST_DRAFT = 0.3  # first-draft acceptance of the poorest drafters that still pay (docs: the step table)

WATCHING, ALARMED, DONE, OFF = "watching", "alarmed", "done", "off"


def owner(tokenizer_manager: types.ModuleType, manager: type) -> type:
    """The class the hook (``runtime/patch_table.py``) wraps: TokenizerManager where attribute lookup finds
    ``HOOK`` on it; otherwise the one other class ``tokenizer_manager`` binds (imports or defines) that has it,
    where a split into component classes moved it (the static check follows the same way)."""
    if member(manager, HOOK) is not None:
        return manager
    components = []
    for value in vars(tokenizer_manager).values():
        if inspect.isclass(value) and value is not manager and value not in components \
                and inspect.isfunction(member(value, HOOK)):
            components.append(value)
    if len(components) > 1:
        raise Drift(f"{manager.__name__}.{HOOK} is missing; moved to more than one class "
                    f"{tokenizer_manager.__name__} uses: "
                    + ", ".join(f"{c.__module__}.{c.__qualname__}.{HOOK}" for c in components))
    return components[0] if components else manager


def wrap(function, settings=None):
    """``function`` (SGLang's per-finished-request spec metrics) followed by the watch (which reads no setting)."""
    @functools.wraps(function)
    def spec_decoding_metrics_watched(self, meta_info, recv_obj, i, *args, **kwargs):
        result = function(self, meta_info, recv_obj, i, *args, **kwargs)
        watch = _WATCH or get_watch()
        if watch.state in (WATCHING, ALARMED):
            watch.add(self, recv_obj, i, function.__module__)
        return result
    return mark(spec_decoding_metrics_watched, PATCH_ID)


ADAPTIVE_OFF = (f"{LOG_PREFIX}: off in this server: with --speculative-adaptive a verify may run 0 draft steps, "
                "which accept length cannot tell from a broken drafter (check it offline: sglang-pcie check-drafter)")


_WATCH: "AcceptWatch | None" = None  # one per process: the process's TokenizerManager


def get_watch() -> "AcceptWatch":
    global _WATCH
    if _WATCH is None:
        _WATCH = AcceptWatch()
    return _WATCH


def set_watch(watch: "AcceptWatch | None") -> None:
    """Replace the process's watch (tests, benchmarks); None: a fresh one at the next finished request."""
    global _WATCH
    _WATCH = watch


class AcceptWatch:
    """Sums the finished requests' verifies and accepted drafts and judges them (see the module docstring)."""

    def __init__(self, min_verifies=MIN_VERIFIES, min_requests=MIN_REQUESTS, alarm_below=ALARM_BELOW,
                 recovered_at=RECOVERED_AT):
        self.min_verifies, self.min_requests = min_verifies, min_requests
        self.alarm_below, self.recovered_at = alarm_below, recovered_at
        self.state = WATCHING
        self.verifies = self.accepted = self.requests = 0  # since the start, or since the alarm
        self.field = None  # the release's name for the accepted drafts, found at the first request
        self.server: dict = {}
        self.logger = logging.getLogger(LOGGER)
        self.metrics = None
        self._exported = None  # the accept length last set on the gauge, to 2 decimals
        self.lines: list[str] = []  # what it logged, for inspection

    @property
    def accept_length(self) -> float | None:
        return 1 + self.accepted / self.verifies if self.verifies else None

    def add(self, manager, recv_obj, i, module_name) -> None:
        """One finished request (index ``i`` of SGLang's output batch ``recv_obj``). Never raises: an error turns
        the watch off, with one line saying so."""
        if self.state not in (WATCHING, ALARMED):
            return
        try:
            if self.field is None and not self._bind(manager, recv_obj, module_name):
                return
            verifies, accepted = getattr(recv_obj, VERIFY_FIELD), getattr(recv_obj, self.field)
            if i >= len(verifies) or i >= len(accepted) or not verifies[i]:
                return  # finished without a verify (in its prefill, or aborted)
            self.verifies += int(verifies[i])
            self.accepted += int(accepted[i])
            self.requests += 1
            if self.verifies >= self.min_verifies and self.requests >= self.min_requests:
                self._judge()
        except Exception as exc:  # never in SGLang's way
            self.state = OFF
            try:
                self._log(f"{LOG_PREFIX}: off: {type(exc).__name__}: {exc}")
            except Exception:
                pass

    def _bind(self, manager, recv_obj, module_name) -> bool:
        self.logger = logging.getLogger(module_name)
        server_args = server_args_of(manager)
        self.server = describe_server(server_args)
        if self.server["algorithm"] not in WATCHED_ALGORITHMS:
            self.state = OFF  # NGRAM, STANDALONE: no drafter model of the kind this alarm knows
            return False
        if getattr(server_args, "speculative_adaptive", False) is True:
            # Adaptive steps may verify with 0 draft steps (SGLang's own table from 0.5.14 at 8 running requests and
            # up): accept length 1.00 by construction, which a finished request's counters cannot tell from rejected
            # drafts. A healthy drafter's server said "looks broken" so (tune-spec-lease4/NOTE.txt).
            self.state = OFF
            self.lines.append(ADAPTIVE_OFF)
            self.logger.info(ADAPTIVE_OFF)
            return False
        self.field = next((f for f in ACCEPTED_FIELDS if hasattr(recv_obj, f)), None)
        if self.field is None or not hasattr(recv_obj, VERIFY_FIELD):
            self.state = OFF
            self._log(f"{LOG_PREFIX}: off: SGLang's output carries no {VERIFY_FIELD} or none of "
                      f"{', '.join(ACCEPTED_FIELDS)}")
            return False
        holder = types.SimpleNamespace(server_args=server_args)
        if metrics_enabled(holder):
            self.metrics = PrometheusExport.create(model_name(holder), self.logger)
        return True

    def _judge(self) -> None:
        length = self.accept_length
        # a gauge write (prometheus_client's multiprocess mode) costs microseconds: only when the figure changes
        if self.metrics is not None and round(length, 2) != self._exported:
            self._exported = round(length, 2)
            self._export("set_accept_length", self._exported)
        if self.state == WATCHING and length < self.alarm_below:
            self._log(alarm_message(self.server, length, self.verifies, self.requests))
            self._export("set_alarm", 1)
            self.state = ALARMED
            self.verifies = self.accepted = self.requests = 0
        elif self.state == ALARMED and length >= self.recovered_at:
            self._log(f"{LOG_PREFIX}: recovered: {self.server['algorithm']} drafter {self.server['draft']}: accept "
                      f"length {length:.2f} over the last {self.verifies:,} request-verifies ({self.requests} "
                      f"requests) since the warning (recovered at >= {self.recovered_at:.2f}); no further checks")
            self._export("set_alarm", 0)
            self.state = DONE

    def _log(self, text: str) -> None:
        self.lines.append(text)
        self.logger.warning(text)

    def _export(self, method: str, value) -> None:
        if self.metrics is None:
            return
        try:
            getattr(self.metrics, method)(value)
        except Exception as exc:  # a broken metrics directory must not stop the watch
            self.metrics = None
            self.logger.warning(f"{LOG_PREFIX}: Prometheus export off: {type(exc).__name__}: {exc}")


# -------------------------------------------------------------------------------------------- the message

# (launch option, server_args attribute) that decide how a drafter is used; the check-drafter command carries them.
CAUSES = {
    "EAGLE3": (
        "the vocabulary map (d2t / t2d) does not belong to this drafter's lm_head or to the target's vocabulary",
        "the captured target layers (eagle_aux_hidden_state_layer_ids, as this SGLang release reads them) are not "
        "the ones the drafter was trained on",
        "the drafter was trained for another target model or revision",
        "this workload is one no drafter can predict (random token ids, high temperature)",
    ),
    "EAGLE": (
        "the drafter was trained for another target model or revision",
        "its weights do not load as trained (embedding / lm_head shared with the wrong target, a renamed tensor)",
        "this workload is one no drafter can predict (random token ids, high temperature)",
    ),
}


def server_args_of(owner):
    """SGLang's ServerArgs for the hook's ``self``: TokenizerManager's ``server_args``; where the hook moved to a
    component class that does not hold them, SGLang's process-wide record (``runtime_context.get_server_args()``,
    0.5.18 and later, if SGLang loaded it); None where neither is there."""
    server_args = getattr(owner, "server_args", None)
    context = sys.modules.get("sglang.srt.runtime_context")
    if server_args is None and callable(getattr(context, "get_server_args", None)):
        try:
            server_args = context.get_server_args()
        except Exception:  # not published in this process
            return None
    return server_args


def working_floor(steps) -> float:
    """The accept length of a chain drafter whose every draft is accepted with WORKING_FIRST_DRAFT (1.42 at 3
    steps): what the configured steps make likely for the poorest drafter that still pays."""
    k = steps if isinstance(steps, int) and steps > 0 else 1
    a = WORKING_FIRST_DRAFT
    return (1 - a ** (k + 1)) / (1 - a)


def alarm_message(server: dict, length: float, verifies: int, requests: int) -> str:
    steps = server["steps"]
    at_steps = f"at {steps} draft steps " if steps else ""
    causes = CAUSES.get(server["algorithm"], CAUSES["EAGLE"])
    lines = [
        f"{LOG_PREFIX}: {server['algorithm']} drafter {server['draft']} looks broken: accept length {length:.2f} "
        f"over {verifies:,} request-verifies ({requests} finished requests); a working drafter {at_steps}gives "
        f"{working_floor(steps):.2f} or more, this alarm fires below {ALARM_BELOW:.2f}. Drafts are almost never "
        "accepted: speculative decoding only costs time here (the output stays correct, so nothing else says so).",
        "  likely causes, most likely first:",
        *(f"  {n}. {cause}" for n, cause in enumerate(causes, 1)),
    ]
    if server["algorithm"] == "EAGLE3":
        lines.append(f"  check the drafter against its target: {check_command(server)}")
    lines.append(f"  (one warning per server; switch off: SGLANG_PCIE_DISABLE_PATCHES={PATCH_ID})")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- Prometheus

_GAUGES: dict = {}  # prometheus_client refuses to register one name twice per process


class PrometheusExport:
    """Two gauges in the registry SGLang serves (its multiprocess directory, set before the server's processes
    start when metrics are enabled), created with plain ``prometheus_client`` constructors as SGLang's are."""

    def __init__(self, alarm, accept_length, model):
        self.alarm, self.accept_length, self.model = alarm, accept_length, model

    @classmethod
    def create(cls, model, logger):
        try:
            from prometheus_client import Gauge

            if not _GAUGES:
                _GAUGES["alarm"] = Gauge(
                    "sglang_pcie_accept_alarm",
                    "1 while sglang-pcie's accept-length alarm stands (drafts almost never accepted), else 0",
                    labelnames=["model_name"], multiprocess_mode="mostrecent")
                _GAUGES["accept"] = Gauge(
                    "sglang_pcie_accept_alarm_accept_length",
                    "Accept length the alarm last judged (2 decimals): 1 + accepted drafts / request-verifies",
                    labelnames=["model_name"], multiprocess_mode="mostrecent")
            export = cls(_GAUGES["alarm"], _GAUGES["accept"], model)
            export.set_alarm(0)
            return export
        except Exception as exc:  # no prometheus_client, or an incompatible one: metrics off, the alarm on
            logger.warning(f"{LOG_PREFIX}: Prometheus export off: {type(exc).__name__}: {exc}")
            return None

    def set_alarm(self, value):
        self.alarm.labels(self.model).set(value)

    def set_accept_length(self, value):
        self.accept_length.labels(self.model).set(value)
