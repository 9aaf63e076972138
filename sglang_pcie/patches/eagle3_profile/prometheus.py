"""The profiler's figures as Prometheus histograms, in the registry SGLang serves on ``/metrics``."""
from __future__ import annotations

from sglang_pcie.patches.eagle3_profile.records import CYCLE, LOG_PREFIX, PHASES

# Prometheus histogram buckets (seconds) spanning a sub-millisecond draft step to a slow prefill.
PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.010, 0.0125, 0.015, 0.0175,
                 0.020, 0.025, 0.030, 0.040, 0.050, 0.075, 0.100, 0.250, 0.500, 1.0, 2.5)
ACCEPT_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)


_METRICS_BY_NAME: dict = {}  # prometheus_client refuses to register one name twice per process


class PrometheusExport:
    """The figures as Prometheus metrics, in the registry SGLang serves (its multiprocess directory).

    SGLang sets ``PROMETHEUS_MULTIPROC_DIR`` before starting the scheduler processes when metrics are enabled and
    creates its collectors in those processes with plain ``prometheus_client`` constructors; these do the same.
    Observations come from the timed cycles only.
    """

    def __init__(self, phase_seconds, accept_length, model, logger):
        self.phase_seconds = phase_seconds
        self.accept_length = accept_length
        self.model = model
        self.logger = logger

    @classmethod
    def create(cls, model, logger):
        try:
            from prometheus_client import Histogram

            if "phase" not in _METRICS_BY_NAME:
                _METRICS_BY_NAME["phase"] = Histogram(
                    "sglang_pcie_eagle_phase_seconds",
                    "Time of one EAGLE speculative decoding phase per timed cycle (sglang-pcie EAGLE3_PROFILE)",
                    labelnames=["model_name", "phase"], buckets=PHASE_BUCKETS)
                _METRICS_BY_NAME["accept"] = Histogram(
                    "sglang_pcie_eagle_accept_length",
                    "Tokens emitted per request per timed EAGLE decode cycle (sglang-pcie EAGLE3_PROFILE)",
                    labelnames=["model_name"], buckets=ACCEPT_BUCKETS)
            return cls(_METRICS_BY_NAME["phase"], _METRICS_BY_NAME["accept"], model, logger)
        except Exception as exc:  # no prometheus_client, or an incompatible one: metrics off, serving on
            logger.warning(f"{LOG_PREFIX}: Prometheus export off: {type(exc).__name__}: {exc}")
            return None

    def observe_phase(self, phase, ms):
        self.phase_seconds.labels(self.model, phase).observe(ms / 1e3)

    def observe_cycle(self, phase_ms, cycle_ms):
        for phase in PHASES:
            self.observe_phase(phase, phase_ms.get(phase, 0.0))
        self.observe_phase(CYCLE, cycle_ms)

    def observe_accept(self, accept_length):
        self.accept_length.labels(self.model).observe(accept_length)
