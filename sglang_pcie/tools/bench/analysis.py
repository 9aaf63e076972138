"""What bench concludes from the runs: ratios to baseline, outputs compared request by request, a profiled server's
invariants, what NCCL read against what it should have, the results document and the exit status."""
from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from sglang_pcie.tools.bench.plan import BASELINE, MAY_DIFFER, MUST_MATCH, Plan, Variant
from sglang_pcie.tools.bench.verdicts import noise_margin, ratio_summary

SCHEMA = "sglang-pcie.bench/1"
# NCCL_DEBUG_SUBSYS=ENV prints e.g. "NCCL INFO NCCL_PROTO set by environment to LL" in each rank.
_NCCL_ENV_LINE = re.compile(r"(?:\S+?:(\d+):\d+ \[\d+\] )?NCCL INFO (\w+) set by environment to (\S*)")


# ------------------------------------------------------------------------------------------------------ ratios

# (phase, key, label, higher_is_better)
METRICS = (
    ("batch", "output_tok_s", "batch output tok/s", True),
    ("batch", "server_gen_tok_s_p50", "batch gen tok/s (log)", True),
    ("batch", "latency_ms_p50", "batch latency p50 ms", False),
    ("stream", "output_tok_s", "c=1 output tok/s", True),
    ("stream", "ttft_ms_p50", "c=1 TTFT p50 ms", False),
    ("stream", "tpot_ms_p50", "c=1 TPOT p50 ms", False),
    ("stream", "itl_ms_p50", "c=1 ITL p50 ms", False),
    ("", "accept_length", "accept length", True),
)


def metric_names() -> dict:
    """How an option names a metric (``batch.output_tok_s``, ``accept_length``) -> its label in the table."""
    return {f"{phase}.{key}" if phase else key: label for phase, key, label, _ in METRICS}


def metric_value(record: dict, phase: str, key: str):
    metrics = record.get("metrics") or {}
    value = (metrics.get(phase) or {}).get(key) if phase else metrics.get(key)
    return value if isinstance(value, (int, float)) else None


def compute_ratios(records: list[dict], variants: list[Variant]) -> dict:
    """variant -> metric label -> ratio summary; a pair is one repeat's variant run over its baseline run. The
    baseline's rows carry its own servers' spread, the noise band every verdict must clear (verdicts.py)."""
    by_repeat: dict = {}
    for record in records:
        if record.get("ok"):
            by_repeat.setdefault(record["repeat"], {})[record["variant"]] = record
    table: dict = {variant.name: {} for variant in variants}
    for phase, key, label, higher in METRICS:
        baseline = baseline_row([metric_value(runs[BASELINE], phase, key) for runs in by_repeat.values()
                                 if BASELINE in runs])
        for variant in variants:
            if variant.name == BASELINE:
                table[BASELINE][label] = baseline
                continue
            ratios, values = [], []
            for runs in by_repeat.values():
                value = metric_value(runs[variant.name], phase, key) if variant.name in runs else None
                if value is not None:
                    values.append(value)
                base = metric_value(runs[BASELINE], phase, key) if BASELINE in runs else None
                if value is not None and base:
                    ratios.append(value / base)
            row = ratio_summary(ratios, higher, baseline.get("spread"))
            row["value_median"] = statistics.median(values) if values else None
            table[variant.name][label] = row
    return table


def baseline_row(values: list) -> dict:
    """The baseline's figures for one metric: its median and, with two servers or more, the noise floor: how far
    identical servers landed from their median (an effect inside it is not called, however many repeats)."""
    values = [v for v in values if v is not None]
    row = {"n": len(values), "value_median": statistics.median(values) if values else None}
    if len(values) > 1 and row["value_median"]:
        row["spread"] = [min(values) / row["value_median"], max(values) / row["value_median"]]
        row["noise_margin"] = math.exp(noise_margin(row["spread"])) - 1
    return row


# ----------------------------------------------------------------------------------------------------- outputs

def first_difference(reference: dict, outputs: dict) -> tuple[int, int, dict | None]:
    """(requests compared, requests that differ, the first difference) between two runs' outputs."""
    compared = differing = 0
    first = None
    for phase in ("batch", "stream"):
        ref, got = reference.get(phase, []), outputs.get(phase, [])
        for i in range(max(len(ref), len(got))):
            compared += 1
            a = ref[i] if i < len(ref) else None
            b = got[i] if i < len(got) else None
            if a == b:
                continue
            differing += 1
            if first is None:
                if a is None or b is None:
                    first = {"phase": phase, "request": i, "token": None, "detail": "missing output"}
                else:
                    pos = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    first = {"phase": phase, "request": i, "token": pos,
                             "reference": a[pos] if pos < len(a) else None, "got": b[pos] if pos < len(b) else None}
    return compared, differing, first


def compare_outputs(records: list[dict], variants: list[Variant]) -> dict:
    """Each variant's runs against the first baseline run (and, for may-differ variants, against their own
    first run: a repeat that changes tokens by itself shows near-ties, not the variant)."""
    ok = [r for r in records if r.get("ok") and r.get("outputs") is not None]
    reference = next((r for r in ok if r["variant"] == BASELINE), None)
    result = {}
    for variant in variants:
        runs = [r for r in ok if r["variant"] == variant.name]
        entry = {"tokens": variant.tokens, "runs": len(runs)}
        if reference is None:
            entry["verdict"] = "not compared: no baseline run succeeded"
            result[variant.name] = entry
            continue
        others = [r for r in runs if r is not reference]
        compared = differing = 0
        first = None
        for r in others:
            c, d, f = first_difference(reference["outputs"], r["outputs"])
            compared, differing = compared + c, differing + d
            if f is not None and first is None:
                first = dict(f, run=r["index"])
        entry.update({"vs_baseline": {"reference_run": reference["index"], "compared": compared,
                                      "differing": differing, "first": first}})
        if variant.tokens == MAY_DIFFER and len(runs) > 1:
            c = d = 0
            for r in runs[1:]:
                cc, dd, _ = first_difference(runs[0]["outputs"], r["outputs"])
                c, d = c + cc, d + dd
            entry["within_variant"] = {"compared": c, "differing": d}
        if not others:
            entry["verdict"] = "reference" if variant.name == BASELINE else "not compared: no run succeeded"
        elif differing == 0:
            entry["verdict"] = "identical"
        elif variant.tokens == MUST_MATCH:
            entry["verdict"] = "DIFFERENT"
        else:
            entry["verdict"] = "differs (allowed: launch arguments change decoding)"
        result[variant.name] = entry
    return result


# -------------------------------------------------------------------------------------------------------- NCCL

def nccl_env_lines(path: Path) -> tuple[dict, int]:
    """(NCCL variable -> sorted distinct values NCCL reported reading, "set by environment to", in the log;
    how many processes printed such lines)."""
    found: dict = {}
    pids = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = _NCCL_ENV_LINE.search(line)
                if m:
                    pids.add(m.group(1))
                    found.setdefault(m.group(2), set()).add(m.group(3).rstrip("."))
    except OSError:
        pass
    return {key: sorted(values) for key, values in sorted(found.items())}, len(pids - {None})


def nccl_debug_env(env: dict) -> bool:
    """Whether NCCL will print the variables it reads (NCCL_DEBUG=INFO or TRACE, NCCL_DEBUG_SUBSYS with ENV)."""
    subsys = env.get("NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV").upper().split(",")
    return env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE") and ("ENV" in subsys or "ALL" in subsys)


NOT_NCCL_SETTINGS = ("NCCL_VERSION",)


def expected_nccl(env: dict) -> dict:
    """The NCCL variables a server started with ``env`` hands NCCL: the user's, plus what the overlay chooses
    (the same decision its launcher makes, on this machine, from this environment)."""
    from sglang_pcie.runtime import nccl
    from sglang_pcie.runtime.settings import load_settings

    # NCCL_VERSION is what container images (NVIDIA's among them) export to name the installed NCCL: not a
    # setting NCCL reads, so NCCL never reports it (seen on the 2 x H200 machine).
    expected = {k: v for k, v in env.items()
                if k.startswith("NCCL_") and not k.startswith("NCCL_DEBUG") and k not in NOT_NCCL_SETTINGS}
    settings = load_settings(env)
    if not settings.disabled and settings.nccl_profile is not None:
        chosen = nccl.decide(settings.nccl_profile, dict(env)).values
        expected.update({k: v for k, v in chosen.items() if k.startswith("NCCL_")})
    return expected


def nccl_check(expected: dict, read: dict, processes: int) -> dict:
    missing = sorted(k for k in expected if k not in read)
    mismatched = sorted(k for k in expected if k in read and read[k] != [expected[k]])
    return {"ok": not missing and not mismatched, "expected": expected, "missing": missing,
            "mismatched": mismatched, "processes": processes}


# ----------------------------------------------------------------------------------------------------- profile

def read_profile(path: Path) -> dict | None:
    """The EAGLE3 profile summary of a server (sglang-pcie profile-report's, of the newest profiled process in
    the file: the TP rank 0 scheduler), or None without intervals. Records profile-report skips (malformed, or
    holding impossible times) are counted and the first named: a profile that broke its own invariants must fail
    the run, not vanish from it."""
    from sglang_pcie.tools import profile_report

    if not path.is_file():
        return None
    skipped: list = []
    with open(path, encoding="utf-8", errors="replace") as f:
        records = profile_report.read_records(f, skipped)
    if not records and not skipped:
        return None
    summary = {}
    if records:
        runs = profile_report.runs_of(records)
        summary = profile_report.summarise(list(runs.values())[-1])
        summary["runs_in_file"] = len(runs)
    summary["skipped_records"] = len(skipped)
    if skipped:
        summary["first_skipped"] = f"{path.name}:{skipped[0][0]}: {skipped[0][1]}"
    return summary


ACCEPT_TOLERANCE = 0.01
# Schema 3 gives the wall time of exactly the timed cycles (timed_wall_cycle_ms): cycle <= it holds by construction,
# no tolerance. Older profiles give only wall_cycle_ms, the mean over every cycle, compared with 5% tolerance.
WALL_TOLERANCE = 0.05


def profile_checks(profile: dict, sglang_accept: float | None) -> dict:
    """The invariants a profiled server must hold (docs/eagle3-profile.md; None: not reported by this profile):
    the timed phases fit in the cycle, the cycle's GPU time fits in the wall-clock cycle, no forced GPU waits, one
    profiled process (TP rank 0) per server, the accept length equals SGLang's (decode tokens per verify
    cycle from its meta info) within 1%, and no record of the file was skipped as malformed or impossible."""
    phases, cycle = profile.get("phases_sum_ms"), profile.get("cycle_ms")
    timed_wall = profile.get("timed_wall_cycle_ms")
    wall, tolerance = (timed_wall, 0.0) if timed_wall is not None else (profile.get("wall_cycle_ms"), WALL_TOLERANCE)
    accept = profile.get("accept_length")
    ratio = accept / sglang_accept if accept and sglang_accept else None
    ranks = (profile.get("ranks") or {}).get("tp_rank")
    checks = {
        "phases_le_cycle": None if phases is None or cycle is None else phases <= cycle * (1 + 1e-6),
        "cycle_le_wall": None if cycle is None or wall is None else cycle <= wall * (1 + tolerance) + 1e-9,
        "no_forced_waits": None if profile.get("syncs") is None else profile["syncs"] == 0,
        "one_run_tp_rank_0": (None if profile.get("runs_in_file") is None or ranks is None
                              else profile["runs_in_file"] == 1 and list(ranks) in ([0], [])),
        "accept_within_1pct": None if ratio is None else abs(ratio - 1) <= ACCEPT_TOLERANCE,
        "no_impossible_records": (None if profile.get("skipped_records") is None
                                  else profile["skipped_records"] == 0),
    }
    failed = [name for name, ok in checks.items() if ok is False]
    return dict(checks, accept_ratio=ratio, phases_sum_ms=phases, cycle_ms=cycle,
                wall_cycle_ms=profile.get("wall_cycle_ms"), timed_wall_cycle_ms=timed_wall, failed=failed)


# ----------------------------------------------------------------------------------------------------- results

def assemble(plan: Plan, records: list[dict], started: str, complete: bool, auto: dict | None = None,
             warmup: dict | None = None) -> dict:
    """The results document (schema sglang-pcie.bench/1); ``auto``: why --repeats auto stopped, once it did;
    ``warmup``: the unmeasured warm-up server's summary (``runs.warm_up``), never in ``runs`` nor in a ratio."""
    for r in records:
        if r.get("profile"):
            r["profile_checks"] = profile_checks(r["profile"], (r.get("metrics") or {}).get("accept_length_served"))
    results = {
        "schema": SCHEMA, "started": started, "complete": complete, "out": str(plan.out),
        "argv": plan.argv, "server_cmd": plan.server_cmd, "launch_args": plan.launch_args,
        "extra_env": plan.extra_env, "repeats": plan.repeats, "workload": plan.workload.as_dict(),
        "variants": [v.as_dict() for v in plan.variants],
        "runs": [{k: v for k, v in r.items() if k != "outputs"} for r in records],
        "ratios": compute_ratios(records, plan.variants),
        "outputs": compare_outputs(records, plan.variants),
    }
    if warmup is not None:
        results["warmup"] = warmup
    if plan.resolve is not None:
        results["auto"] = auto or dict(plan.resolve.as_dict(), stopped=None)  # None: still running
    return results


def exit_code(results: dict) -> int:
    """0: every server ran and stopped, no must-match variant changed tokens, every profile invariant held;
    1 otherwise. A warm-up server that failed does not count (it measures nothing); one that left a process does."""
    if any(not r.get("ok") or (r.get("stop") or {}).get("survivors") for r in results["runs"]):
        return 1
    if ((results.get("warmup") or {}).get("stop") or {}).get("survivors"):
        return 1
    if any(e.get("verdict") == "DIFFERENT" for e in results["outputs"].values()):
        return 1
    if any((r.get("profile_checks") or {}).get("failed") for r in results["runs"]):
        return 1
    return 0
