"""When bench may call a ratio higher or lower: only when the counterbalanced pairs resolve it.

A pair is one repeat's variant run over the same repeat's baseline run. Over the n pairs' log ratios, a Student-t
interval (95%, n - 1 degrees of freedom) for their mean: exact for normal noise, no resampling, so the same numbers
always give the same verdict. The ratio is called higher or lower only when that interval clears the noise band,
1 +- the baseline servers' own spread (how far identical servers landed from their median in this run), on one
side; otherwise "within noise", or "cannot resolve" where the interval is too wide to tell a 10x effect from none
(the smallest resolvable effect over 999%, which the table cannot print: c=1 TTFT over two pairs can span
[0.01-100]). Beside every verdict: the smallest effect this run could have resolved, the
interval's half-width plus that band (a ratio beyond 1 + x or below 1 / (1 + x)).

``--repeats auto`` adds repeats until that smallest resolvable effect is under a target (``auto_stop``): it stops on
the intervals' width, never on where they lie, so stopping cannot wait for a lucky draw.

Why not the min-max of the pairs (bench before): three pairs of an A/A run all land on one side of 1.0 one time
in four. Why not a bootstrap: with three to five pairs its intervals are about the min-max again.
"""
from __future__ import annotations

import functools
import math
import statistics

from sglang_pcie.tools.bench.plan import AUTO_MAX_REPEATS, BASELINE, Resolve

CONFIDENCE = 0.95
UNRESOLVABLE = 9.99  # a smallest resolvable effect beyond this (the table's "±>999%") resolves nothing of use
CANNOT_RESOLVE = "cannot resolve: this interval cannot tell a 10x effect from none"
_LARGE_DF = 1000  # beyond this many degrees of freedom the normal quantile is the t quantile to 4 digits


def t_probability_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom: the closed forms for integer df (Abramowitz and
    Stegun 26.7.3, 26.7.4), a finite sum in powers of cos(theta), theta = atan(t / sqrt(df))."""
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    if df % 2 == 1:
        total, term = 0.0, cos
        for k in range(1, (df - 1) // 2 + 1):  # cos + 2/3 cos^3 + 2*4/(3*5) cos^5 + ... up to cos^(df-2)
            total += term
            term *= cos * cos * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + sin * total) if df > 1 else 2 * theta / math.pi
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):  # 1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... up to cos^(df-2)
        total += term
        term *= cos * cos * (2 * k - 1) / (2 * k)
    return sin * total


@functools.lru_cache(maxsize=None)
def t_quantile(confidence: float, df: int) -> float:
    """The t with P(|T| <= t) = ``confidence`` (two-sided): 4.303 for 95% and 2 degrees of freedom."""
    if df > _LARGE_DF:
        return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    low, high = 0.0, 1e4
    for _ in range(200):  # bisection: P(|T| <= t) increases with t
        middle = (low + high) / 2
        low, high = (middle, high) if t_probability_within(middle, df) < confidence else (low, middle)
    return (low + high) / 2


def noise_margin(spread) -> float:
    """The baseline servers' own spread [min, max] over their median as a margin on the log scale (0 without one):
    how far from 1 a ratio between identical servers went in this run, on its wider side."""
    if not spread:
        return 0.0
    low, high = spread
    return max(math.log(high) if high > 0 else 0.0, -math.log(low) if low > 0 else 0.0, 0.0)


def ratio_summary(ratios: list[float], higher_is_better: bool, spread=None) -> dict:
    """Median ratio, the 95% interval of the pairs, the verdict and the smallest effect the pairs could resolve."""
    margin = noise_margin(spread)
    if not ratios:
        return {"n": 0, "median": None, "min": None, "max": None, "verdict": "no pairs"}
    row = {"n": len(ratios), "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
           "ratios": ratios, "interval": None, "resolvable": None, "noise_margin": math.exp(margin) - 1,
           "confidence": CONFIDENCE}
    if len(ratios) == 1:
        return dict(row, verdict="one pair: no interval")
    if any(r <= 0 for r in ratios):
        return dict(row, verdict="a ratio <= 0: no interval")
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = t_quantile(CONFIDENCE, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    row["interval"] = [math.exp(mean - half), math.exp(mean + half)]
    row["resolvable"] = math.exp(half + margin) - 1
    if all(r == 1.0 for r in ratios):
        verdict = "equal in every pair"
    elif mean - half > margin or mean + half < -margin:
        higher = mean > 0
        better = higher == higher_is_better
        verdict = f"{'higher' if higher else 'lower'} ({'better' if better else 'worse'})"
    elif row["resolvable"] > UNRESOLVABLE:
        verdict = CANNOT_RESOLVE
    else:
        verdict = "within noise"
    return dict(row, verdict=verdict)


def auto_stop(ratios: dict, resolve: Resolve, repeats: int, elapsed_s: float, failed: bool,
              fixed_s: float = 0.0) -> dict | None:
    """Why ``--repeats auto`` stops after ``repeats`` repeats, or None to run another: a server failed; every
    variant's metric could now resolve the target; the baseline servers' own spread is already wider than the target
    (more repeats narrow the interval, not that band); the repeat cap; or another repeat would pass the budget.
    ``elapsed_s`` counts everything so far; ``fixed_s`` of it (the warm-up server) was spent once, not per repeat."""
    widths = resolvable_widths(ratios, resolve.metric)
    floor = (ratios.get(BASELINE, {}).get(resolve.metric) or {}).get("noise_margin")
    if failed:
        reason = "failure"
    elif all(width is not None and width <= resolve.target for width in widths.values()):
        reason = "resolved"
    elif floor is not None and floor > resolve.target:
        reason = "noise floor"
    elif repeats >= AUTO_MAX_REPEATS:
        reason = "max repeats"
    elif elapsed_s + max(0.0, elapsed_s - fixed_s) / repeats > resolve.budget_s:  # the mean repeat, once more
        reason = "budget"
    else:
        return None
    return dict(resolve.as_dict(), stopped=reason, resolvable=widths, noise_margin=floor)


def resolvable_widths(ratios: dict, metric: str) -> dict:
    """variant -> the smallest effect its pairs could resolve on ``metric`` (None: fewer than two pairs)."""
    return {name: (rows.get(metric) or {}).get("resolvable") for name, rows in ratios.items() if name != BASELINE}
