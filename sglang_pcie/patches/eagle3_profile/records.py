"""An interval's statistics and the record they become: ``IntervalStats`` (what one interval accumulates), ``Series``
(exact mean, percentiles from a bounded sample), the JSON-lines object (``record``, ``to_json``; the fields are
documented in docs/eagle3-profile.md) and its one log line (``format_line``, which ``profile-report`` parses back)."""
from __future__ import annotations

import json
import math
import random
import time

SCHEMA_FAMILY = "sglang-pcie.eagle3-profile/"
# 2: sampled timers, run id and ranks, wall-clock and served figures, profiler host time.  3: GPU busy over the
# timed cycles' own wall time (timed_wall_cycle_ms), a sample count per phase, no percentile from too few samples.
# 4: 3 plus the worker's speculative settings (spec_steps, spec_topk, spec_draft_tokens), the acceptance per depth
# (accept_hist, accept_at_least) and the draft step's time (draft_step_ms): what a cost model needs to predict other
# step counts from one profiled server.
SCHEMA_MAJOR = 4
SCHEMA = f"{SCHEMA_FAMILY}{SCHEMA_MAJOR}"
LOG_PREFIX = "sglang-pcie eagle3-profile"
CYCLE = "cycle"
PHASES = ("draft", "verify", "draft_extend")  # a decode cycle's phases, in cycle order
REPORTED = PHASES + ("other", CYCLE)  # "other": the cycle minus its phases (host gaps, bookkeeping kernels)
DECODE, PREFILL, IDLE = "decode", "prefill", "idle"
# the worker's speculative settings in each record: its key, SGLang's server_args name, the worker's attribute
SPEC_SETTINGS = (("spec_steps", "speculative_num_steps", "speculative_num_steps"),
                 ("spec_topk", "speculative_eagle_topk", "topk"),
                 ("spec_draft_tokens", "speculative_num_draft_tokens", "speculative_num_draft_tokens"))

RESERVOIR = 4096  # samples kept per series per interval for p50/p90
QUANTILE_MIN = 20  # p50 / p90 are given from this many samples (p90 of 20: two samples above it); n/a below
HOST_BOUND_BELOW = 0.9  # GPU busy for less than this share of the wall-clock cycle: host-bound


class Series:
    """Exact count and mean; percentiles from a bounded reservoir sample (exact up to ``RESERVOIR`` values)."""

    def __init__(self, rng):
        self.count = 0
        self.total = 0.0
        self.samples = []
        self._rng = rng

    def add(self, value):
        self.count += 1
        self.total += value
        if len(self.samples) < RESERVOIR:
            self.samples.append(value)
        else:
            keep = self._rng.randrange(self.count)
            if keep < RESERVOIR:
                self.samples[keep] = value

    @property
    def mean(self):
        return self.total / self.count if self.count else None

    def quantile(self, q):
        """The q-quantile of the sample, or None from fewer than ``QUANTILE_MIN`` values."""
        return quantile(sorted(self.samples), q) if self.count >= QUANTILE_MIN else None

    def summary(self) -> dict:
        """{n, mean, p50, p90}: the sample count next to the figures it gives."""
        ordered = sorted(self.samples) if self.count >= QUANTILE_MIN else ()
        return {"n": self.count, "mean": self.mean, "p50": quantile(ordered, 0.5), "p90": quantile(ordered, 0.9)}


def quantile(ordered, q):
    """Linear interpolation between the closest ranks (numpy's default); None for no data."""
    if not ordered:
        return None
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class IntervalStats:
    """What one interval accumulates; ``record()`` turns it into the JSON-lines object.

    Counts are taken when a cycle runs; GPU times and token counts arrive a few cycles later and go to the
    interval their cycle began in (``outstanding`` counts what is still on its way; the interval is reported once
    it is closed and nothing is outstanding)."""

    def __init__(self):
        rng = random.Random(0)
        self.series = {name: Series(rng) for name in REPORTED}
        self.prefill = Series(rng)
        self.decode_cycles = self.prefill_cycles = self.idle_cycles = 0
        self.requests_all = 0  # sum of batch sizes over all decode cycles (where the worker gives them)
        self.requests = 0  # ... over the decode cycles whose tokens are known
        self.tokens = 0
        self.token_cycles = 0  # decode cycles whose tokens are known
        self.accept_hist = []  # request-verifies by the tokens each emitted (index), over the same ones as tokens
        self.hist_missing = False  # some tokens were counted without their per-request values (own staged sums)
        self.wall_start = self.wall_end = None  # perf_counter_ns: first decode cycle's start, the next cycle's start
        # after the last decode cycle (that cycle's end until then)
        self.wall_cycle_ns = 0  # summed host time from one decode cycle's start to the next's (decode -> decode)
        self.wall_cycles = 0
        self.timed = 0  # decode cycles timed (those without a wall time of their own included)
        self.timed_wall_ms = 0.0  # summed wall time of the timed decode cycles, each to the next one's start
        self.host_ns = 0  # profiler hooks, all of them
        self.host_timed_ns = 0  # ... the part spent on timed cycles (marks, reading them)
        self.syncs = 0
        self.outstanding = 0
        self.unfinished = 0  # timed cycles / token counts the GPU had not finished when the process exited
        self.sample_every = None
        self.partial = False

    def add_timed(self, phase_ms: dict, cycle_ms: float, wall_ms: float):
        """A timed decode cycle: its phases and cycle (GPU time) and its wall time, from its start to the next
        decode cycle's start, on the same clock."""
        self.timed += 1
        for phase in PHASES:
            self.series[phase].add(phase_ms.get(phase, 0.0))
        self.series["other"].add(max(0.0, cycle_ms - sum(phase_ms.values())))
        self.series[CYCLE].add(cycle_ms)
        self.timed_wall_ms += wall_ms

    def add_timed_without_wall(self):
        """A timed decode cycle that a prefill, an idle cycle or the end followed: no wall time of its own, so it
        stays out of the GPU figures (they are all over the same cycles)."""
        self.timed += 1

    def add_tokens(self, batch_size, tokens, hist=None):
        """A decode cycle's tokens and, where its per-request values were read, their histogram."""
        if batch_size and tokens is not None:
            self.requests += batch_size
            self.tokens += tokens
            self.token_cycles += 1
            self.add_hist(hist)

    def add_hist(self, hist):
        """Add a histogram of tokens per request-verify (None: those requests' values were not read)."""
        if hist is None:
            self.hist_missing = True
            return
        mine = self.accept_hist
        if len(hist) > len(mine):
            mine.extend([0] * (len(hist) - len(mine)))
        for index, count in enumerate(hist):
            if count:
                mine[index] += count

    def add_prefill(self, cycle_ms: float):
        self.prefill.add(cycle_ms)

    def record(self, baseline_ms=None, **meta) -> dict:
        cycle_mean = self.series[CYCLE].mean
        phases = {}
        for name, series in self.series.items():
            phases[name] = series.summary()
            mean = phases[name]["mean"]
            phases[name]["share"] = (mean / cycle_mean) if mean is not None and cycle_mean else None
        with_wall = self.series[CYCLE].count
        timed_wall_ms = self.timed_wall_ms / with_wall if with_wall else None
        accept = self.tokens / self.requests if self.requests else None
        exact = accept is not None and self.token_cycles == self.decode_cycles
        # tokens emitted by all decode cycles: counted where exact, else the accept length x their requests
        emitted = self.tokens if exact else (accept * self.requests_all if accept is not None else None)
        wall_s = (self.wall_end - self.wall_start) / 1e9 if self.wall_start is not None else None
        wall_cycle_ms = self.wall_cycle_ns / self.wall_cycles / 1e6 if self.wall_cycles else None
        gpu_busy = cycle_mean / timed_wall_ms if cycle_mean is not None and timed_wall_ms else None
        all_cycles = self.decode_cycles + self.prefill_cycles + self.idle_cycles
        gpu_s = cycle_mean * self.decode_cycles / 1e3 if cycle_mean else None
        spec = {key: meta.pop(key, None) for key, _, _ in SPEC_SETTINGS}
        hist = None if self.hist_missing else padded(self.accept_hist, spec["spec_draft_tokens"])
        draft_mean = phases["draft"]["mean"]
        record = {
            "schema": SCHEMA, "time": time.time(), **meta, "partial": self.partial,
            "decode_cycles": self.decode_cycles, "prefill_cycles": self.prefill_cycles,
            "idle_cycles": self.idle_cycles, "timed_cycles": self.timed, "sample_every": self.sample_every,
            "decode_requests": self.requests, "requests_all": self.requests_all, "tokens": self.tokens,
            "accept_length": accept, "accept_length_exact": exact,
            **spec, "accept_hist": hist, "accept_at_least": accept_at_least(hist),
            "draft_step_ms": draft_mean / spec["spec_steps"] if draft_mean is not None and spec["spec_steps"] else None,
            "phases_ms": phases,
            "phases_sum_ms": (sum(phases[p]["mean"] for p in PHASES) if with_wall else None),
            "cycle_ms": cycle_mean, "timed_wall_cycle_ms": timed_wall_ms,
            "wall_cycle_ms": wall_cycle_ms, "wall_cycles": self.wall_cycles,
            "gpu_busy": gpu_busy, "bound": bound(gpu_busy),
            "prefill_ms": _prefill(self.prefill),
            "wall_s": wall_s,
            "tokens_per_s_served": emitted / wall_s if emitted is not None and wall_s else None,
            "tokens_per_s_gpu": emitted / gpu_s if emitted is not None and gpu_s else None,
            "tokens_per_s_per_request": accept * 1e3 / wall_cycle_ms if accept and wall_cycle_ms else None,
            "profiler_host_us_per_cycle": self.host_ns / 1e3 / all_cycles if all_cycles else None,
            "profiler_host_share": (self.host_ns / (self.wall_end - self.wall_start)
                                    if self.wall_start is not None and self.wall_end > self.wall_start else None),
        }
        record.update(projection(wall_cycle_ms or cycle_mean, accept, baseline_ms))
        record["syncs"] = self.syncs
        record["unfinished_at_exit"] = self.unfinished
        return finite(record)


def padded(hist, draft_tokens):
    """``hist`` with spec_draft_tokens + 1 entries where the draft tokens are known (more where a larger value was
    seen), else as counted (the largest value seen + 1)."""
    hist = list(hist)
    if isinstance(draft_tokens, int) and draft_tokens >= 0 and len(hist) < draft_tokens + 1:
        hist.extend([0] * (draft_tokens + 1 - len(hist)))
    return hist


def accept_at_least(hist):
    """For j = 1 .. len(hist) - 2: the share of request-verifies that accepted at least j drafts (emitted at least
    j + 1 tokens); None without a histogram or a request-verify in it."""
    if not hist:
        return None
    total = sum(hist)
    if not total:
        return None
    shares, above = [], total - sum(hist[:2])  # emitted >= 2 tokens: accepted >= 1 draft
    for j in range(1, len(hist) - 1):
        shares.append(above / total)
        above -= hist[j + 1]
    return shares


def _prefill(series):
    if not series.count:
        return None
    figures = series.summary()
    return {"mean": figures["mean"], "p50": figures["p50"], "p90": figures["p90"], "timed": figures["n"]}


def bound(gpu_busy) -> str | None:
    if gpu_busy is None:
        return None
    return "host-bound" if gpu_busy < HOST_BOUND_BELOW else "GPU-bound"


def projection(cycle_ms, accept_length, baseline_ms) -> dict:
    """Break-even accept length (cycle / baseline) and projected speedup (accept x baseline / cycle)."""
    if not baseline_ms or not cycle_ms:
        return {"baseline_ms": baseline_ms, "break_even_accept_length": None, "projected_speedup": None}
    return {"baseline_ms": baseline_ms, "break_even_accept_length": cycle_ms / baseline_ms,
            "projected_speedup": (accept_length * baseline_ms / cycle_ms) if accept_length else None}


def finite(value):
    """``value`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def to_json(record: dict) -> str:
    """Strict JSON: non-finite numbers become null."""
    return json.dumps(finite(record), allow_nan=False)


def _num(value, digits=3):
    return "n/a" if value is None else f"{value:.{digits}f}"


def _rank_text(value):
    return "-" if value is None else str(value)


def _hist_text(hist):
    return "-" if hist is None else ",".join(map(str, hist)) or "-"


def format_line(record: dict) -> str:
    """The one log line of an interval; ``profile_report`` parses it back."""
    parts = [f"{LOG_PREFIX} [run={record.get('run_id')} tp={_rank_text(record.get('tp_rank'))}"
             f" pp={_rank_text(record.get('pp_rank'))} dp={_rank_text(record.get('dp_rank'))}"
             f" timer={record.get('timer')} timed={record['timed_cycles']}/{record['decode_cycles']}"
             f" sample=1/{record.get('sample_every') or '-'} syncs={record['syncs']}"
             f"{' partial' if record.get('partial') else ''}]:"
             f" decode_cycles={record['decode_cycles']} prefill_cycles={record['prefill_cycles']}"
             f" idle_cycles={record['idle_cycles']}"]
    for name in REPORTED:
        p = record["phases_ms"][name]
        share = "n/a" if p["share"] is None else f"{p['share'] * 100:.1f}%"
        parts.append(f"{name} n={p['n']} mean={_num(p['mean'])} p50={_num(p['p50'])} p90={_num(p['p90'])} ms"
                     f" share={share}")
    parts.append(f"accept_len={_num(record['accept_length'], 2)}"
                 f" {'exact' if record['accept_length_exact'] else 'sampled'}"
                 f" tokens={record['tokens']} requests={record['decode_requests']}"
                 f" requests_all={record['requests_all']}"
                 f" accept_hist={_hist_text(record.get('accept_hist'))}"
                 f" spec={'/'.join(_rank_text(record.get(key)) for key, _, _ in SPEC_SETTINGS)}")
    busy = record.get("gpu_busy")
    parts.append(f"served_tokens/s={_num(record['tokens_per_s_served'], 1)}"
                 f" gpu_tokens/s={_num(record['tokens_per_s_gpu'], 1)}"
                 f" per_request={_num(record['tokens_per_s_per_request'], 1)} wall={_num(record['wall_s'])} s")
    parts.append(f"wall_cycle={_num(record['wall_cycle_ms'])} ms timed_wall_cycle={_num(record['timed_wall_cycle_ms'])}"
                 " ms GPU busy "
                 + ("n/a" if busy is None else f"{busy * 100:.0f}%: {record['bound']}"))
    host, share = record.get("profiler_host_us_per_cycle"), record.get("profiler_host_share")
    parts.append(f"profiler host={_num(host, 1)} us/cycle"
                 f" ({'n/a' if share is None else f'{share * 100:.2f}%'} of wall)")
    if record.get("baseline_ms"):
        speedup = record["projected_speedup"]
        parts.append(f"baseline={_num(record['baseline_ms'])} ms"
                     f" break_even_accept_len={_num(record['break_even_accept_length'], 2)}"
                     f" projected_speedup={'n/a' if speedup is None else f'{speedup:.2f}x'}")
    return " | ".join(parts)

