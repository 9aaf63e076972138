"""The cost model: every EAGLE chain's batch throughput and single-request speed from two measured chains.

Acceptance, per request. For a chain of k draft steps (top-k 1), request r's verify emits its accepted drafts plus
one bonus token. With a_rj the share of r's verifies that accepted at least j drafts (SGLang's per-request
histogram, measured at the deepest chain: a chain of k steps proposes the same first k drafts, so its a_r1..a_rk
are the deepest chain's),

    t_r(k) = 1 + a_r1 + ... + a_rk                 decode tokens per verify of request r

and r's D_r decode tokens take D_r / t_r(k) verifies. Per request, not pooled: a drafter that is accepted on some
requests and not on others (the GPU test pair's `mixed` drafter: about half the requests accept every draft, the
rest one) gives a pooled histogram weighted by verifies, and the requests that accept less take more verifies at
every k; pooling at the deepest chain then predicted 2.38 tokens per verify at 3 steps where the server gave 2.64
(GPU run of 2026-12-03), per request 2.67.

Time, per concurrency level, a line through the measured chains:

    c > 1:  tau_c(k) = alpha + beta k   the batch phase's wall time per request-verify (T / V)
    c = 1:  c_1(k)   = alpha + beta k   the decode cycle of one request (TPOT_r x t_r, averaged)

Then, over the level's requests (the same prompts in every server),

    output tok/s at c (k)        = N / (tau_c(k) x sum_r D_r / t_r(k))      N: all output tokens
    one-request decode tok/s (k) = 1000 / (c_1(k) x mean_r 1 / t_r(k))     1000 / mean TPOT, TPOT in ms

The model never answers: it chooses which candidate to measure next (search.py), and the answer is always a
measured candidate. Without SGLang's histograms (and without a profile's) it cannot predict, and says so.

No speculation is measured, never modelled. Speculation with k steps pays when the tokens per verify over the
workload (D / V(k)) exceed tau(k) / tau_none: that quotient is the break-even accept length at this box's costs.
"""
from __future__ import annotations

import math
import statistics



def label(level: int) -> str:
    """What a level's figure is, for people."""
    return "one-request decode tok/s (c=1)" if level == 1 else f"output tok/s at c={level}"


def at_least(histogram: list | None, depth: int) -> list | None:
    """Shares of verifies that accepted at least j drafts, j = 1..depth, from a histogram indexed by accepted
    drafts (SGLang's ends at the most any verify accepted: deeper shares are zero)."""
    steps = sum(histogram or [])
    if not steps:
        return None
    return [sum(histogram[j:]) / steps if j < len(histogram) else 0.0 for j in range(1, depth + 1)]


def request_classes(figures: dict, depth: int) -> list[tuple[float, list]] | None:
    """[(decode tokens D_r, a_r1..a_r depth)] of each speculative request of a phase, from SGLang's per-request
    histograms; failing those, one pooled class (the phase's own at-least shares); None without either."""
    per_request = figures.get("requests_spec") or []
    classes = [(max(0, (c or 0) - 1), at_least(h, depth)) for c, _, h in per_request if h]
    if classes and all(a is not None for _, a in classes):
        return classes
    pooled = figures.get("accept_at_least")
    if pooled and figures.get("output_tokens") and figures.get("requests") is not None:
        shares = (list(pooled) + [0.0] * depth)[:depth]
        return [(figures["output_tokens"] - figures["requests"], shares)]
    return None


def verifies(figures: dict) -> float | None:
    """The phase's verifies: SGLang's spec_verify_ct summed, else its tokens over the accept length."""
    per_request = figures.get("requests_spec")
    if per_request:
        return float(sum(v for _, v, _ in per_request))
    accept, tokens = figures.get("accept_length"), figures.get("output_tokens")
    return tokens / accept if accept and tokens else None


def step_time(level: int, figures: dict) -> float | None:
    """c > 1: seconds of wall time per request-verify (T / V). c = 1: the decode cycle in seconds, each request's
    TPOT times its own tokens per verify, averaged (c_1 = mean TPOT / mean_r 1 / t_r)."""
    if level > 1:
        rate, tokens, count = figures.get("value"), figures.get("output_tokens"), verifies(figures)
        return tokens / rate / count if rate and tokens and count else None
    tpot_ms = figures.get("tpot_ms_mean")
    per_request = [(c - 1) / v for c, v, _ in figures.get("requests_spec") or [] if c and v and c > 1]
    if not tpot_ms or not per_request:
        return None
    return tpot_ms / 1e3 / statistics.fmean(1 / t for t in per_request)


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (alpha, beta) of y = alpha + beta x, or None with fewer than two distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x in xs)
    beta = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - beta * mx, beta


def level_figures(server: dict, level: int) -> dict | None:
    return (server.get("levels") or {}).get(str(level))


class Model:
    """The fitted model of one concurrency level: per-request acceptance from the deepest measured chain, the step
    time's line through every measured chain server (its repeats included), and no speculation's own step time."""

    def __init__(self, level: int, chain_servers: list[dict], none_servers: list[dict]):
        self.level = level
        seen = [(s["steps"], f) for s in chain_servers if (f := level_figures(s, level)) is not None]
        usable = [(k, f) for k, f in seen if step_time(level, f) is not None]
        self.seen_depths = sorted({k for k, _ in seen})
        self.depths = sorted({k for k, _ in usable})
        deepest = [f for k, f in usable if k == self.depths[-1]] if self.depths else []
        self.classes = request_classes(deepest[-1], self.depths[-1]) if deepest else None
        self.acceptance_source = (None if not self.classes else "per request (sglang meta info)"
                                  if len(self.classes) > 1 else deepest[-1].get("accept_source") or "pooled")
        self.output_tokens = deepest[-1].get("output_tokens") if deepest else None
        self.line = fit_line([(k, step_time(level, f)) for k, f in usable])
        none_taus = [t for s in none_servers if (f := level_figures(s, level)) and (t := _none_step(level, f))]
        self.none_tau = statistics.median(none_taus) if none_taus else None

    @property
    def at_least(self) -> list | None:
        """The pooled shares over the deepest chain's verifies (what the report prints)."""
        if not self.classes:
            return None
        weights = [d / (1 + sum(a)) for d, a in self.classes]  # each request's verifies at the deepest chain
        total = sum(weights)
        return [sum(w * a[j] for w, (_, a) in zip(weights, self.classes)) / total
                for j in range(len(self.classes[0][1]))] if total else None

    def _verifies(self, k: int) -> float | None:
        if not self.classes or k > len(self.classes[0][1]):
            return None
        return sum(d / (1 + sum(a[:k])) for d, a in self.classes)

    def tokens(self, k: int) -> float | None:
        """Decode tokens per verify over the workload's requests at k steps (D / V(k))."""
        count = self._verifies(k)
        return sum(d for d, _ in self.classes) / count if count else None

    def _inverse_tokens(self, k: int) -> float | None:
        """mean over requests of 1 / t_r(k): mean TPOT is the decode cycle times this."""
        if not self.classes or k > len(self.classes[0][1]):
            return None
        return statistics.fmean(1 / (1 + sum(a[:k])) for _, a in self.classes)

    def tau(self, k: int) -> float | None:
        if self.line is None:
            return None
        value = self.line[0] + self.line[1] * k
        return value if value > 0 else None

    def predict(self, k: int) -> float | None:
        """The workload's figure for a chain of k steps, or None where the model cannot say (no fit yet, k deeper
        than the measured acceptance)."""
        tau = self.tau(k)
        if tau is None:
            return None
        if self.level > 1:
            count = self._verifies(k)
            return self.output_tokens / (tau * count) if count and self.output_tokens else None
        inverse = self._inverse_tokens(k)
        return 1 / (tau * inverse) if inverse else None

    def break_even(self, k: int) -> float | None:
        """The decode tokens per verify a k-step chain needs to match no speculation here: tau(k) / tau_none."""
        tau = self.tau(k)
        return tau / self.none_tau if tau and self.none_tau else None

    @property
    def cannot_predict(self) -> str | None:
        """Why the model predicts nothing, or None where it does."""
        if len(self.depths) < 2 and len(self.seen_depths) < 2:
            return "it needs two chains of different depth measured"
        if len(self.depths) < 2 or not self.classes:
            return ("no acceptance histograms: SGLang's replies carried none (and no profile's); only measured"
                    " candidates compete")
        return None

    def as_dict(self, depths: list[int]) -> dict:
        return {"level": self.level, "cannot_predict": self.cannot_predict, "depths_measured": self.depths, "accept_at_least": self.at_least,
                "acceptance_source": self.acceptance_source, "requests": len(self.classes or []),
                "tau_ms": None if self.line is None else {"alpha": self.line[0] * 1e3, "beta": self.line[1] * 1e3},
                "none_tau_ms": None if self.none_tau is None else self.none_tau * 1e3,
                "predicted": {f"chain-{k}": self.predict(k) for k in depths},
                "tokens_per_verify": {f"chain-{k}": self.tokens(k) for k in depths},
                "break_even_accept": {f"chain-{k}": self.break_even(k) for k in depths}}


def _none_step(level: int, figures: dict) -> float | None:
    """No speculation: one token per request-step. c > 1: wall time per request-step (T / decode tokens); c = 1:
    the mean TPOT."""
    if level > 1:
        rate, tokens, requests = figures.get("value"), figures.get("output_tokens"), figures.get("requests")
        if not rate or not tokens or requests is None or tokens <= requests:
            return None
        return tokens / rate / (tokens - requests)
    tpot_ms = figures.get("tpot_ms_mean")
    return tpot_ms / 1e3 if tpot_ms else None


def log_interval(values: list[float], t_quantile, confidence: float = 0.95) -> tuple[float, float] | None:
    """The t interval (95% unless ``confidence`` says) of the mean of log values, as values (None under two positive
    values)."""
    values = [v for v in values if v and v > 0]
    if len(values) < 2:
        return None
    logs = [math.log(v) for v in values]
    half = t_quantile(confidence, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.fmean(logs)
    return math.exp(mean - half), math.exp(mean + half)
