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

OUTPUT_TOKENS, REQUESTS = 128 * 256, 128
STREAM_TOKENS, STREAM_REQUESTS = 8 * 256, 8


class CostModelServer:
    def __init__(self, accept=(0.8, 0.6, 0.45, 0.33, 0.24, 0.17, 0.12), batch_tau=(0.30e-3, 0.05e-3),
                 latency_tau=(8e-3, 0.4e-3), none_batch_tau=0.28e-3, none_latency_tpot=9e-3, noise=0.0, seed=0,
                 fail=(), overrides=None):
        self.accept = list(accept)  # a_j: share of verifies with at least j drafts accepted
        self.batch_tau, self.latency_tau = batch_tau, latency_tau  # (alpha, beta) seconds per request-verify
        self.none_batch_tau, self.none_latency_tpot = none_batch_tau, none_latency_tpot
        self.noise, self.seed = noise, seed
        self.fail = set(fail)  # candidate names whose servers fail at start
        self.overrides = overrides or {}  # candidate -> {"batch": value, "latency": value}: true figures forced
        self.started = []

    def tokens(self, k):
        return 1 + sum(self.accept[:k])

    def truth(self, name, steps, workload):
        """The true figure of a candidate for a workload."""
        if name in self.overrides:
            return self.overrides[name][workload]
        share = OUTPUT_TOKENS / (OUTPUT_TOKENS - REQUESTS)
        if steps is None:
            return share / self.none_batch_tau if workload == "batch" else 1 / self.none_latency_tpot
        alpha, beta = self.batch_tau if workload == "batch" else self.latency_tau
        rate = self.tokens(steps) / (alpha + beta * steps)
        return rate * share if workload == "batch" else rate

    def best(self, names_steps, workload):
        return max(names_steps, key=lambda ns: self.truth(ns[0], ns[1], workload))[0]

    def measure(self, candidate, index, profiled):
        self.started.append((candidate.name, index, profiled))
        entry = {"candidate": candidate.name, "kind": candidate.kind, "steps": candidate.steps, "index": index,
                 "profiled": profiled, "duration_s": 60.0, "ready_s": 50.0, "log": None, "profile": None}
        if candidate.name in self.fail:
            return dict(entry, ok=False, failure="start: server exited with code 1 before /health answered",
                        batch={}, latency={})
        rng = random.Random(f"{self.seed}-{index}")
        k = candidate.steps if candidate.kind == "chain" else None
        at_least = self.accept[:k] if k else None
        batch = self.truth(candidate.name, k, "batch") * math.exp(rng.gauss(0, self.noise))
        latency = self.truth(candidate.name, k, "latency") * math.exp(rng.gauss(0, self.noise))
        accept = (self.tokens(k) if k else 1.0)
        entry["batch"] = {"value": batch, "output_tokens": OUTPUT_TOKENS, "requests": REQUESTS,
                          "accept_length": (accept * (OUTPUT_TOKENS - REQUESTS) + REQUESTS) / OUTPUT_TOKENS
                          if k else None,
                          "accept_at_least": at_least, "accept_source": "sglang meta info" if k else None}
        entry["latency"] = {"value": latency, "tpot_ms": 1e3 / latency, "output_tokens": STREAM_TOKENS,
                            "requests": STREAM_REQUESTS, "accept_length": None, "accept_at_least": at_least,
                            "accept_source": "sglang meta info" if k else None}
        return dict(entry, ok=True, failure=None)



def make_settings(launch=LAUNCH, max_steps=7, workloads=("batch", "latency"), resolve=0.02, budget_min=60.0,
                  max_servers=None):
    found = candidates(launch, max_steps, adaptive_available=False)
    settings = Settings(workloads=workloads, resolve=resolve, budget_s=budget_min * 60, max_steps=max_steps,
                        current=current_name(launch, found), max_servers=max_servers)
    return found, settings


def tune_with(server, tmp_path, launch=LAUNCH, warm=True, **kw):
    found, settings = make_settings(launch, **kw)
    state = driver.new_state(launch, settings, {}, found)
    warm_up = (lambda: {"candidate": "chain-7", "ok": True, "duration_s": 90.0}) if warm else None
    state = driver.tune(found, settings, state, tmp_path, server.measure, warm_up, lambda line: None)
    return found, settings, state
