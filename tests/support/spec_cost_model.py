"""A speculative server whose figures follow a known cost model, with noise you set: what tune-spec's search is
tested against (tests/tools/tune_spec) without starting processes or reading a clock.

Each measured server returns the entry ``tune_spec.servers.summarise`` makes of a real one, at every level the step
asks for: at c > 1 the batch output tok/s, at c = 1 the one-request decode speed, from the true per-depth acceptance
and the level's step times, times a log-normal factor per server and level (``noise``: its standard deviation on the
log scale), drawn from ``(seed, server index, level)`` so a resumed run sees the same draws as an uninterrupted one.

Step times (seconds): at c = 1 the decode cycle is ``alpha + beta k`` (default 8 + 0.4 k ms; no speculation 9 ms a
token); at c > 1 the wall time per request-verify is ``8e-3 / c + 0.05e-3 + (0.4e-3 / c + 0.04e-3) k`` (no
speculation ``9e-3 / c + 0.04e-3`` a request-step): a GPU that batches better at higher c, where speculation pays
less. ``tau`` overrides a level's (alpha, beta) and ``none_tau`` its no-speculation step.

Adaptive candidates run, at each level, a step of their table: ``tuned`` and ``table`` read their file (the bucket
with the largest key not above the level), ``adaptive`` (SGLang's own table, ``default_table``) the best of its
bucket's steps times ``adaptive_factor`` (an EMA never matches the best fixed step exactly).
"""
from __future__ import annotations

import json
import math
import random

from sglang_pcie.tools.tune_spec import driver
from sglang_pcie.tools.tune_spec.candidates import ADAPTIVE_CONFIG, candidates, current_name
from sglang_pcie.tools.tune_spec.release import AdaptiveFacts
from sglang_pcie.tools.tune_spec.search import Settings, Step

LAUNCH = ["--model-path", "/m/target", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
          "/m/draft", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "4", "--tp-size", "1"]

OUTPUT_LEN = 256
STREAM_REQUESTS = 8
SGLANG_0_5_16_TABLE = {1: [1, 3, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
FACTS_0_5_16 = AdaptiveFacts(True, "sglang.srt.server_args.ServerArgs", per_batch=True, zero_steps=True,
                             default_table=SGLANG_0_5_16_TABLE, version="0.5.16")


def histogram(shares: list, k: int, verifies: float) -> list:
    """A request's histogram at k steps (index n: verifies that accepted n drafts) from its at-least shares, as
    float counts so that the model reads the shares back exactly."""
    a = [1.0] + list(shares[:k]) + [0.0]
    return [(a[n] - a[n + 1]) * verifies for n in range(k)] + [a[k] * verifies]


def bucket_of(table: dict, level: int) -> list:
    keys = sorted(table)
    fitting = [k for k in keys if k <= level]
    return table[fitting[-1] if fitting else keys[0]]


class CostModelServer:
    """``accept``: a_j for every request; ``classes``: [(share of requests, a_j list)] instead (requests that
    differ, as the GPU pair's `mixed` drafter: about half accept every draft). ``overrides``: candidate ->
    {level: true figure}."""

    def __init__(self, accept=(0.8, 0.6, 0.45, 0.33, 0.24, 0.17, 0.12), tau=None, none_tau=None, noise=0.0, seed=0,
                 fail=(), overrides=None, classes=None, default_table=None, adaptive_factor=0.97, duration_s=60.0):
        self.classes = classes or [(1.0, list(accept))]
        self.tau, self.none_tau = dict(tau or {}), dict(none_tau or {})
        self.noise, self.seed = noise, seed
        self.fail = set(fail)  # candidate names whose servers fail at start
        self.overrides = overrides or {}
        self.default_table = default_table or SGLANG_0_5_16_TABLE
        self.adaptive_factor = adaptive_factor
        self.duration_s = duration_s
        self.started = []  # (name, index, profiled, role)

    def requests(self, count):
        """Each request's a_j: the classes in order, by their shares."""
        out = []
        for share, shares in self.classes:
            out.extend([shares] * round(share * count))
        return (out + [self.classes[-1][1]] * count)[:count]

    @staticmethod
    def t(shares, k):
        return 1 + sum(shares[:k])

    def step_time(self, level, k):
        if k == 0:
            return self.none_tau.get(level, 9e-3 if level == 1 else 9e-3 / level + 0.04e-3)
        alpha, beta = self.tau.get(level, (8e-3, 0.4e-3) if level == 1 else
                                   (8e-3 / level + 0.05e-3, 0.4e-3 / level + 0.04e-3))
        return alpha + beta * k

    @staticmethod
    def count(level):
        return STREAM_REQUESTS if level == 1 else 4 * level

    def fixed_truth(self, k, level):
        """The true figure of a fixed setting of k steps (0: no speculation) at a level."""
        decode = OUTPUT_LEN - 1
        requests = self.requests(self.count(level))
        if level == 1:
            if k == 0:
                return 1 / self.step_time(1, 0)
            return 1 / (self.step_time(1, k) * sum(1 / self.t(a, k) for a in requests) / len(requests))
        tokens = len(requests) * OUTPUT_LEN
        if k == 0:
            return tokens / (self.step_time(level, 0) * len(requests) * decode)
        return tokens / (self.step_time(level, k) * sum(decode / self.t(a, k) for a in requests))

    def steps_at(self, candidate, level):
        """The steps a candidate runs at a level (None: the adaptive EMA's own mix)."""
        if candidate.kind == "none":
            return 0
        if candidate.kind in ("chain", "current"):
            return candidate.steps
        if candidate.kind in ("tuned", "table"):
            path = candidate.args[candidate.args.index(ADAPTIVE_CONFIG) + 1]
            table = {int(k): v["candidate_steps"] for k, v in json.loads(open(path).read()).items()}
            return bucket_of(table, level)[0]
        return None

    def truth(self, candidate, level):
        if candidate.name in self.overrides and level in self.overrides[candidate.name]:
            return self.overrides[candidate.name][level]
        k = self.steps_at(candidate, level)
        if k is None:  # SGLang's own table
            return self.adaptive_factor * max(self.fixed_truth(s, level) for s in bucket_of(self.default_table,
                                                                                            level))
        return self.fixed_truth(k, level)

    def phase(self, level, k, value):
        decode = OUTPUT_LEN - 1
        count = self.count(level)
        per_request = ([[OUTPUT_LEN, decode / self.t(a, k), histogram(a, k, decode / self.t(a, k))]
                        for a in self.requests(count)] if k else None)
        figures = {"value": value, "output_tokens": count * OUTPUT_LEN, "requests": count,
                   "accept_length": None, "accept_at_least": None, "requests_spec": per_request,
                   "accept_source": "sglang meta info" if k else None}
        if level == 1:
            figures.update(tpot_ms_mean=1e3 / value, tpot_ms_p50=1e3 / value, output_tok_s=None)
        return figures

    def measure(self, candidate, index, step):
        self.started.append((candidate.name, index, step.profiled, step.role))
        entry = {"candidate": candidate.name, "kind": candidate.kind, "steps": candidate.steps, "index": index,
                 "role": step.role, "profiled": step.profiled, "duration_s": self.duration_s, "ready_s": 50.0,
                 "log": None, "profile": None}
        if candidate.name in self.fail:
            return dict(entry, ok=False, failure="start: server exited with code 1 before /health answered",
                        levels={})
        figures = {}
        for level in step.levels:
            rng = random.Random(f"{self.seed}-{index}-{level}")
            value = self.truth(candidate, level) * math.exp(rng.gauss(0, self.noise))
            k = self.steps_at(candidate, level)
            figures[str(level)] = self.phase(level, k or 0, value)
        return dict(entry, ok=True, failure=None, levels=figures)


def make_settings(launch=LAUNCH, max_steps=7, levels=(1, 32), resolve=0.02, budget_min=60.0, max_servers=None,
                  profile=False, facts=None, prove=2, edges=True, sweep=0, steps=None, table=None):
    found = candidates(launch, max_steps, facts, steps, table)
    settings = Settings(levels=tuple(levels), resolve=resolve, budget_s=budget_min * 60, max_steps=max_steps,
                        current=current_name(launch, found), max_servers=max_servers, profile=profile,
                        prove=prove, edges=edges, sweep=sweep, per_batch=bool(facts and facts.per_batch),
                        zero_steps=bool(facts and facts.zero_steps))
    return found, settings


def tune_with(server, tmp_path, launch=LAUNCH, warm=True, **kw):
    found, settings = make_settings(launch, **kw)
    state = driver.new_state(launch, settings, {}, found)
    warm_up = (lambda: {"candidate": "chain-7", "ok": True, "duration_s": 90.0}) if warm else None
    state = driver.tune(found, settings, state, tmp_path, server.measure, warm_up, lambda line: None)
    return found, settings, state


def step(levels=(1, 32), role="model", profiled=False):
    return Step("x", profiled=profiled, role=role, levels=tuple(levels))
