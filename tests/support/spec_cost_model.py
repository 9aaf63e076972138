"""A speculative server whose figures follow a known cost model, with noise you set: what tune-spec's search is
tested against (tests/tools/tune_spec) without starting processes or reading a clock.

Each measured server returns the entry ``tune_spec.servers.summarise`` makes of a real one: batch output tok/s
and the one-request decode speed from the true per-depth acceptance and step times, times a log-normal factor per
server and workload (``noise``: its standard deviation on the log scale), drawn from ``(seed, server index)`` so a
resumed run sees the same draws as an uninterrupted one.
"""
from __future__ import annotations

import math
import random

from sglang_pcie.tools.tune_spec import driver
from sglang_pcie.tools.tune_spec.candidates import candidates, current_name
from sglang_pcie.tools.tune_spec.search import Settings

LAUNCH = ["--model-path", "/m/target", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
          "/m/draft", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "4", "--tp-size", "1"]

OUTPUT_LEN = 256
BATCH_REQUESTS, STREAM_REQUESTS = 128, 8


def histogram(shares: list, k: int, verifies: float) -> list:
    """A request's histogram at k steps (index n: verifies that accepted n drafts) from its at-least shares, as
    float counts so that the model reads the shares back exactly."""
    a = [1.0] + list(shares[:k]) + [0.0]
    return [(a[n] - a[n + 1]) * verifies for n in range(k)] + [a[k] * verifies]


class CostModelServer:
    """``accept``: a_j for every request; ``classes``: [(share of requests, a_j list)] instead (requests that
    differ, as the GPU pair's `mixed` drafter: about half accept every draft)."""

    def __init__(self, accept=(0.8, 0.6, 0.45, 0.33, 0.24, 0.17, 0.12), batch_tau=(0.30e-3, 0.05e-3),
                 latency_tau=(8e-3, 0.4e-3), none_batch_tau=0.28e-3, none_latency_tpot=9e-3, noise=0.0, seed=0,
                 fail=(), overrides=None, classes=None):
        self.classes = classes or [(1.0, list(accept))]
        self.batch_tau, self.latency_tau = batch_tau, latency_tau  # (alpha, beta) seconds per request-verify
        self.none_batch_tau, self.none_latency_tpot = none_batch_tau, none_latency_tpot
        self.noise, self.seed = noise, seed
        self.fail = set(fail)  # candidate names whose servers fail at start
        self.overrides = overrides or {}  # candidate -> {"batch": value, "latency": value}: true figures forced
        self.started = []

    def requests(self, count):
        """Each request's a_j: the classes in order, by their shares."""
        out = []
        for share, shares in self.classes:
            out.extend([shares] * round(share * count))
        return (out + [self.classes[-1][1]] * count)[:count]

    @staticmethod
    def t(shares, k):
        return 1 + sum(shares[:k])

    def truth(self, name, steps, workload):
        """The true figure of a candidate for a workload."""
        if name in self.overrides:
            return self.overrides[name][workload]
        decode = OUTPUT_LEN - 1
        if workload == "batch":
            tokens = BATCH_REQUESTS * OUTPUT_LEN
            if steps is None:
                return tokens / (self.none_batch_tau * BATCH_REQUESTS * decode)
            alpha, beta = self.batch_tau
            count = sum(decode / self.t(a, steps) for a in self.requests(BATCH_REQUESTS))
            return tokens / ((alpha + beta * steps) * count)
        if steps is None:
            return 1 / self.none_latency_tpot
        alpha, beta = self.latency_tau
        inverse = sum(1 / self.t(a, steps) for a in self.requests(STREAM_REQUESTS)) / STREAM_REQUESTS
        return 1 / ((alpha + beta * steps) * inverse)

    def best(self, names_steps, workload):
        return max(names_steps, key=lambda ns: self.truth(ns[0], ns[1], workload))[0]

    def phase(self, count, k, value, workload):
        decode = OUTPUT_LEN - 1
        per_request = ([[OUTPUT_LEN, decode / self.t(a, k), histogram(a, k, decode / self.t(a, k))]
                        for a in self.requests(count)] if k else None)
        figures = {"value": value, "output_tokens": count * OUTPUT_LEN, "requests": count,
                   "accept_length": None, "accept_at_least": None, "requests_spec": per_request,
                   "accept_source": "sglang meta info" if k else None}
        if workload == "latency":
            figures.update(tpot_ms_mean=1e3 / value, tpot_ms_p50=1e3 / value, output_tok_s=None)
        return figures

    def measure(self, candidate, index, profiled):
        self.started.append((candidate.name, index, profiled))
        entry = {"candidate": candidate.name, "kind": candidate.kind, "steps": candidate.steps, "index": index,
                 "profiled": profiled, "duration_s": 60.0, "ready_s": 50.0, "log": None, "profile": None}
        if candidate.name in self.fail:
            return dict(entry, ok=False, failure="start: server exited with code 1 before /health answered",
                        batch={}, latency={})
        rng = random.Random(f"{self.seed}-{index}")
        k = candidate.steps if candidate.kind == "chain" else None
        batch = self.truth(candidate.name, k, "batch") * math.exp(rng.gauss(0, self.noise))
        latency = self.truth(candidate.name, k, "latency") * math.exp(rng.gauss(0, self.noise))
        entry["batch"] = self.phase(BATCH_REQUESTS, k, batch, "batch")
        entry["latency"] = self.phase(STREAM_REQUESTS, k, latency, "latency")
        return dict(entry, ok=True, failure=None)


def make_settings(launch=LAUNCH, max_steps=7, workloads=("batch", "latency"), resolve=0.02, budget_min=60.0,
                  max_servers=None, profile=False):
    found = candidates(launch, max_steps, adaptive_available=False)
    settings = Settings(workloads=workloads, resolve=resolve, budget_s=budget_min * 60, max_steps=max_steps,
                        current=current_name(launch, found), max_servers=max_servers, profile=profile)
    return found, settings


def tune_with(server, tmp_path, launch=LAUNCH, warm=True, **kw):
    found, settings = make_settings(launch, **kw)
    state = driver.new_state(launch, settings, {}, found)
    warm_up = (lambda: {"candidate": "chain-7", "ok": True, "duration_s": 90.0}) if warm else None
    state = driver.tune(found, settings, state, tmp_path, server.measure, warm_up, lambda line: None)
    return found, settings, state
