"""The cost model: every EAGLE chain's batch throughput and single-request speed from two measured chains.

For a chain of k draft steps (top-k 1), each verify emits the accepted drafts plus one bonus token. With a_j the
share of verifies that accepted at least j drafts (the per-depth acceptance, measured at the deepest chain: a
chain of k steps proposes the same first k drafts, so its a_1..a_k are the deepest chain's),

    tokens(k) = 1 + a_1 + ... + a_k                      decode tokens per verify of one request

and the time of one request's verify step grows with the steps (k draft forwards, a verify over k + 1 tokens, a
re-extend over them), taken as a line fitted through the measured chains, per workload:

    tau(k) = alpha + beta * k

(batch: the batch phase's wall time per request-verify; one request: its decode cycle, TPOT x tokens per verify).
Then

    batch output tok/s (k)  = tokens(k) / tau_batch(k) x N / (N - R)     (N tokens of R requests: the first
                                                                           token of each comes from prefill)
    one-request tok/s (k)   = tokens(k) / tau_one(k)                     (1 / TPOT)

No speculation is measured, never modelled. Speculation with k steps pays when tokens(k) > tau(k) / tau_none:
that quotient is the break-even accept length at this box's measured costs.
"""
from __future__ import annotations

import math
import statistics

WORKLOADS = ("batch", "latency")
LABELS = {"batch": "batch output tok/s", "latency": "one-request decode tok/s"}


def decode_accept(figures: dict) -> float | None:
    """Decode tokens per verify of one measured phase: from its per-depth acceptance where SGLang gave it,
    else from the accept length (N / V, the first token of each request included) less the prefill tokens."""
    at_least = figures.get("accept_at_least")
    if at_least:
        return 1.0 + sum(at_least)
    accept, tokens, requests = figures.get("accept_length"), figures.get("output_tokens"), figures.get("requests")
    if not accept or not tokens or requests is None or tokens <= requests:
        return None
    return accept * (tokens - requests) / tokens


def step_time(workload: str, figures: dict) -> float | None:
    """tau: seconds of one request's verify step in this phase (see the module docstring), or None."""
    accept = decode_accept(figures)
    if accept is None:
        return None
    if workload == "batch":
        rate, tokens, requests = figures.get("value"), figures.get("output_tokens"), figures.get("requests")
        if not rate or not tokens or requests is None or tokens <= requests:
            return None
        return accept * tokens / ((tokens - requests) * rate)
    tpot_ms = figures.get("tpot_ms")
    return accept * tpot_ms / 1e3 if tpot_ms else None


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (alpha, beta) of y = alpha + beta x, or None with fewer than two distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x in xs)
    beta = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - beta * mx, beta


class Model:
    """The fitted model of one workload: per-depth acceptance from the deepest measured chain, tau's line through
    every measured chain server (its repeats included), and no speculation's own step time."""

    def __init__(self, workload: str, chain_servers: list[dict], none_servers: list[dict]):
        self.workload = workload
        usable = [(s["steps"], s[workload]) for s in chain_servers if step_time(workload, s[workload]) is not None]
        self.depths = sorted({k for k, _ in usable})
        deepest = [f for k, f in usable if self.depths and k == self.depths[-1] and f.get("accept_at_least")]
        # SGLang's histograms end at the most drafts any verify accepted: deeper shares are zero, not unknown
        self.at_least = (list(deepest[-1]["accept_at_least"]) + [0.0] * self.depths[-1])[:self.depths[-1]] \
            if deepest else None
        self.acceptance_source = deepest[-1].get("accept_source") if deepest else None
        self.line = fit_line([(k, step_time(workload, f)) for k, f in usable])
        shape = [f for _, f in usable]
        self.tokens_share = (statistics.fmean(f["output_tokens"] / (f["output_tokens"] - f["requests"])
                                              for f in shape) if workload == "batch" and shape else 1.0)
        none_taus = [_none_step(workload, s[workload]) for s in none_servers]
        none_taus = [t for t in none_taus if t]
        self.none_tau = statistics.median(none_taus) if none_taus else None

    @property
    def ready(self) -> bool:
        return self.line is not None and self.at_least is not None

    def tokens(self, k: int) -> float | None:
        if self.at_least is None or k > len(self.at_least):
            return None
        return 1.0 + sum(self.at_least[:k])

    def tau(self, k: int) -> float | None:
        if self.line is None:
            return None
        alpha, beta = self.line
        value = alpha + beta * k
        return value if value > 0 else None

    def predict(self, k: int) -> float | None:
        """The workload's figure for a chain of k steps, or None where the model cannot say (no fit yet, k deeper
        than the measured acceptance)."""
        tokens, tau = self.tokens(k), self.tau(k)
        if tokens is None or tau is None:
            return None
        return tokens / tau * (self.tokens_share if self.workload == "batch" else 1.0)

    def break_even(self, k: int) -> float | None:
        """The decode tokens per verify a k-step chain needs to match no speculation here: tau(k) / tau_none."""
        tau = self.tau(k)
        return tau / self.none_tau if tau and self.none_tau else None

    def as_dict(self, max_steps: int) -> dict:
        return {"workload": self.workload, "depths_measured": self.depths, "accept_at_least": self.at_least,
                "acceptance_source": self.acceptance_source,
                "tau_ms": None if self.line is None else {"alpha": self.line[0] * 1e3, "beta": self.line[1] * 1e3},
                "none_tau_ms": None if self.none_tau is None else self.none_tau * 1e3,
                "predicted": {f"chain-{k}": self.predict(k) for k in range(1, max_steps + 1)},
                "tokens_per_verify": {f"chain-{k}": self.tokens(k) for k in range(1, max_steps + 1)},
                "break_even_accept": {f"chain-{k}": self.break_even(k) for k in range(1, max_steps + 1)}}


def _none_step(workload: str, figures: dict) -> float | None:
    """No speculation: one token per request-step, so tau is the time per token of one request."""
    if workload == "batch":
        rate, tokens, requests = figures.get("value"), figures.get("output_tokens"), figures.get("requests")
        if not rate or not tokens or requests is None or tokens <= requests:
            return None
        return tokens / ((tokens - requests) * rate)
    tpot_ms = figures.get("tpot_ms")
    return tpot_ms / 1e3 if tpot_ms else None


def log_interval(values: list[float], t_quantile) -> tuple[float, float] | None:
    """The 95% t interval of the mean of log values, as values (None under two positive values)."""
    values = [v for v in values if v and v > 0]
    if len(values) < 2:
        return None
    logs = [math.log(v) for v in values]
    half = t_quantile(0.95, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.fmean(logs)
    return math.exp(mean - half), math.exp(mean + half)
