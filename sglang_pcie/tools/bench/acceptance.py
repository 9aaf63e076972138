"""The acceptance figures of a phase, from SGLang's meta info per request: the accept length (tokens per verify
cycle), the histogram of drafts accepted per verify step (under either of SGLang's names for it) and the share of
verify steps that accepted at least j drafts."""
from __future__ import annotations

from sglang_pcie.tools.common import summed_counts


def accept_length(results, decode_only: bool = False) -> float | None:
    """Tokens per verify cycle over the requests, from SGLang's meta info: completion_tokens / spec_verify_ct
    (SGLang's own spec_accept_length, summed over requests) or, ``decode_only``, without each request's first
    token, which prefill produced (what an EAGLE3 profile counts)."""
    speculative = [r["meta_info"] for r in results if r["meta_info"].get("spec_verify_ct")]
    verify = sum(m["spec_verify_ct"] for m in speculative)
    tokens = sum((m.get("completion_tokens") or 0) - (1 if decode_only else 0) for m in speculative)
    return tokens / verify if verify else None


# SGLang's meta info: per request, how many of its verify steps accepted n drafts, at index n. 0.5.9 names it
# spec_accept_histogram, 0.5.16 both, 0.5.23 spec_correct_drafts_histogram only (docs/bench.md).
HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def request_histogram(meta: dict) -> list | None:
    """One request's acceptance histogram from its meta info, under either name; None without one."""
    for key in HISTOGRAM_KEYS:
        if meta.get(key) is not None:
            return meta[key]
    return None


def accept_histogram(results) -> list | None:
    """Index n: the verify steps that accepted n drafts, summed over the requests; None when no request carries
    SGLang's histogram (a release without it, no speculation)."""
    return summed_counts([h for r in results if (h := request_histogram(r["meta_info"])) is not None])


def accept_at_least(histogram: list | None) -> list | None:
    """For j = 1 .. len - 1 (list index j - 1): the share of verify steps that accepted at least j drafts."""
    steps = sum(histogram or [])
    if not steps:
        return None
    return [sum(histogram[j:]) / steps for j in range(1, len(histogram))]


def acceptance(results) -> dict:
    """The acceptance figures of a phase: accept length, histogram, at-least shares, and per speculative request
    [completion_tokens, spec_verify_ct, its histogram or None] (tune-spec's model needs each request's own: a
    drafter accepted on some requests and not others is not one pooled histogram)."""
    histogram = accept_histogram(results)
    per_request = [[m.get("completion_tokens"), m["spec_verify_ct"], request_histogram(m)]
                   for m in (r["meta_info"] for r in results) if m.get("spec_verify_ct")]
    return {"accept_length": accept_length(results), "accept_hist": histogram,
            "accept_at_least": accept_at_least(histogram), "requests_spec": per_request or None}
