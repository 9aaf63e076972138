"""``sglang-pcie bench [options] -- <launch_server arguments>``: the overlay's effect on a real server, side by side.

Each variant runs as its own real server (``python -m sglang.launch_server`` plus the arguments after ``--``), in
a fresh process tree, one at a time. Bench waits for ``/health``, reads ``/model_info``, warms the server up,
drives a fixed deterministic workload (token ids, greedy, ``ignore_eos``: a batch at ``--concurrency`` and a
concurrency-1 stream), then stops the whole tree and waits until no process of it remains.

Variants: ``baseline`` (``SGLANG_PCIE_DISABLE=1``), ``overlay``, ``profile`` (``EAGLE3_PROFILE=1``, its JSON lines
in the run folder) and user variants ``NAME:FIELD=VALUE[;FIELD=VALUE...]`` with the fields ``env`` (``K=V``
pairs, space-separated), ``args`` (launch arguments appended after the common ones, so they override them),
``base`` (``baseline``, ``overlay`` or ``profile``: what the variant starts from; ``overlay`` by default),
``tokens`` (``must-match`` or ``may-differ``; ``may-differ`` by default when ``args`` is given) and ``repeats``
(K: run only in the last K repeats, e.g. one point of a sweep).

Repeats are interleaved in counterbalanced order (A B C, C B A, A B C, ...); each metric is the median of the
per-repeat ratios to ``baseline``, with their min-max spread, "within noise" when the spread crosses 1.0.

Outputs of every run are compared request by request with the first baseline run (servers, not repeats within
one server: prefix-cache hits change kernels inside one server).

Why not SGLang's ``bench_serving``: it builds prompts through a tokenizer (a ``--skip-tokenizer-init`` server has
none), keeps aggregate figures rather than each request's output ids (needed for the token-by-token comparison),
and must import SGLang in the client process. The client here is the standard library's ``http.client``.
"""
from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.common import tail_lines
from sglang_pcie.tools.processes import free_port, stop_tree, tree_members

PROG = "sglang-pcie bench"
SCHEMA = "sglang-pcie.bench/1"
USAGE_ERROR = 2
BASELINE = "baseline"
PROFILE_FILE_NAME = "eagle3-profile.jsonl"
# Variables the built-in variants control: removed from the inherited environment so each variant gets exactly
# what it says (an exported EAGLE3_PROFILE=1 would otherwise profile the baseline too).
# SGLANG_PCIE_NCCL_DECIDED (nccl.DECIDED_VAR) too: inherited, it would make every server skip its own NCCL decision.
CONTROLLED_VARS = ("SGLANG_PCIE_DISABLE", "EAGLE3_PROFILE", "EAGLE3_PROFILE_FILE", "SGLANG_PCIE_NCCL_DECIDED")
LOG_TAIL_LINES = 40
MUST_MATCH, MAY_DIFFER = "must-match", "may-differ"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# NCCL_DEBUG_SUBSYS=ENV prints e.g. "NCCL INFO NCCL_PROTO set by environment to LL" in each rank.
# SGLang's scheduler log line every 40 decode steps (0.5.16 / 0.5.23 metrics_reporter), e.g. "Decode batch,
# #running-req: 32, ... accept len: 1.02, ... gen throughput (token/s): 5123.45, #queue-req: 0".
_DECODE_LINE = re.compile(r"Decode batch.*?#running-req: (\d+),(?:.*?accept len: ([\d.]+),)?"
                          r".*?gen throughput \(token/s\): ([\d.]+)")
_NCCL_ENV_LINE = re.compile(r"(?:\S+?:(\d+):\d+ \[\d+\] )?NCCL INFO (\w+) set by environment to (\S*)")


class ReportOnly(Exception):
    """``--report DIR``: re-read a finished (or partial) run instead of starting one."""


# ---------------------------------------------------------------------------------------------------- variants

@dataclass(frozen=True)
class Variant:
    name: str
    env: dict = field(default_factory=dict)
    args: tuple = ()
    base: str = ""  # the built-in it starts from ("" for the built-ins themselves)
    tokens: str = MUST_MATCH
    repeats: int | None = None  # run only in the last K repeats (None: every repeat)
    spec: str = ""  # as given on the command line

    @property
    def profiling(self) -> bool:
        return self.env.get("EAGLE3_PROFILE") == "1"

    def as_dict(self) -> dict:
        return {"name": self.name, "base": self.base or None, "env": dict(self.env), "args": list(self.args),
                "tokens": self.tokens, "repeats": self.repeats, "spec": self.spec or self.name}


BUILTINS = {
    "baseline": Variant("baseline", env={"SGLANG_PCIE_DISABLE": "1"}),
    "overlay": Variant("overlay"),
    "profile": Variant("profile", env={"EAGLE3_PROFILE": "1"}),
}
FIELDS = ("base", "env", "args", "tokens", "repeats")


def parse_variant(spec: str) -> Variant:
    """``NAME`` (a built-in) or ``NAME:FIELD=VALUE[;FIELD=VALUE...]``; UsageError names the bad part."""
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not _NAME.match(name):
        raise UsageError(f"--variant {spec!r}: the name {name!r} must be letters, digits, '_', '.', '+' or '-'")
    if not sep:
        if name in BUILTINS:
            return BUILTINS[name]
        raise UsageError(f"--variant {spec!r}: unknown variant (built-ins: {', '.join(BUILTINS)}; define one"
                         " as NAME:env=K=V or NAME:args=...)")
    if name in BUILTINS:
        raise UsageError(f"--variant {spec!r}: {name!r} is a built-in; give your variant another name"
                         f" (NAME:base={name};...)")
    fields: dict = {}
    for part in rest.split(";"):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in FIELDS:
            raise UsageError(f"--variant {spec!r}: {part.strip()!r} is not FIELD=VALUE with FIELD one of"
                             f" {', '.join(FIELDS)}")
        if key in fields:
            raise UsageError(f"--variant {spec!r}: {key}= given twice")
        fields[key] = value.strip()
    repeats = fields.get("repeats")
    if repeats is not None and not (repeats.isdigit() and int(repeats) >= 1):
        raise UsageError(f"--variant {spec!r}: repeats={repeats!r} is not a positive integer")
    base = fields.get("base", "overlay")
    if base not in BUILTINS:
        raise UsageError(f"--variant {spec!r}: base={base!r} (choose {', '.join(BUILTINS)})")
    env = dict(BUILTINS[base].env)
    env.update(parse_env_pairs(fields.get("env", ""), f"--variant {spec!r}"))
    try:
        args = tuple(shlex.split(fields.get("args", "")))
    except ValueError as exc:
        raise UsageError(f"--variant {spec!r}: args= does not parse ({exc})") from None
    tokens = fields.get("tokens") or (MAY_DIFFER if args else MUST_MATCH)
    if tokens not in (MUST_MATCH, MAY_DIFFER):
        raise UsageError(f"--variant {spec!r}: tokens={tokens!r} (choose {MUST_MATCH} or {MAY_DIFFER})")
    if not fields.get("env") and not fields.get("args") and "base" not in fields:
        raise UsageError(f"--variant {spec!r}: gives no env=, args= or base=")
    return Variant(name, env=env, args=args, base=base, tokens=tokens,
                   repeats=int(repeats) if repeats is not None else None, spec=spec)


def parse_env_pairs(text: str, where: str) -> dict:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{where}: env= does not parse ({exc})") from None
    env = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not _ENV_NAME.match(key):
            raise UsageError(f"{where}: {word!r} is not NAME=VALUE")
        env[key] = value
    return env


def resolve_variants(specs: list[str]) -> list[Variant]:
    """The variants to run, baseline first (added when not named: every ratio is to it)."""
    variants = [parse_variant(spec) for spec in specs] or [BUILTINS["baseline"], BUILTINS["overlay"]]
    names = [v.name for v in variants]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"--variant {name!r} given twice")
    if BASELINE not in names:
        variants.insert(0, BUILTINS[BASELINE])
    else:
        variants.insert(0, variants.pop(names.index(BASELINE)))
    return variants


def counterbalanced(names: list[str], repeats: int, counts: dict | None = None) -> list[tuple[int, str]]:
    """(repeat, name) in A B C, C B A, A B C ... order: a linear drift over time hits every variant alike.
    ``counts[name] = K`` runs that variant only in the last K repeats: the variants that run in every repeat
    complete their pairs first, should a long run be cut short."""
    counts = counts or {}
    order = []
    for repeat in range(repeats):
        sequence = names if repeat % 2 == 0 else list(reversed(names))
        order.extend((repeat, name) for name in sequence if repeat >= repeats - counts.get(name, repeats))
    return order


# ---------------------------------------------------------------------------------------------------- workload

@dataclass(frozen=True)
class Workload:
    seed: int = 0
    concurrency: int = 32
    batch_requests: int = 128
    stream_requests: int = 8
    input_len: int = 128
    output_len: int = 256
    warmup_requests: int = 32
    warmup_output_len: int = 16
    token_low: int = 10
    token_high: int = 30000  # exclusive; below any vocabulary this is used with (32000 for Llama-2 sizes)

    def prompts(self) -> dict:
        """Token-id prompts per phase, the same for every server: a function of the seed only."""
        rng = random.Random(self.seed)

        def make(count):
            return [[rng.randrange(self.token_low, self.token_high) for _ in range(self.input_len)]
                    for _ in range(count)]
        return {"warmup": make(self.warmup_requests), "batch": make(self.batch_requests),
                "stream": make(self.stream_requests)}

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def sampling_params(max_new_tokens: int) -> dict:
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}


class RequestError(Exception):
    pass


def _post(host, port, payload, timeout):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    body = json.dumps(payload).encode()
    conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        text = response.read()[:300].decode("utf-8", "replace")
        conn.close()
        raise RequestError(f"/generate answered HTTP {response.status}: {text}")
    return conn, response


def generate(host, port, input_ids, max_new_tokens, timeout) -> dict:
    """One non-streaming request: {"output_ids", "meta_info", "latency_s"}."""
    start = time.perf_counter()
    conn, response = _post(host, port, {"input_ids": input_ids, "sampling_params": sampling_params(max_new_tokens)},
                           timeout)
    try:
        data = json.loads(response.read())
    finally:
        conn.close()
    if not isinstance(data, dict) or "output_ids" not in data:
        raise RequestError(f"/generate answered without output_ids: {str(data)[:200]}")
    ids, meta = checked_reply(data, "/generate", ids_required=True)
    return {"output_ids": ids, "meta_info": meta or {}, "latency_s": time.perf_counter() - start}


_COUNTS = ("completion_tokens", "spec_verify_ct")  # the meta_info fields bench does arithmetic with


def checked_reply(data, where: str, ids_required: bool = False) -> tuple[list, dict | None]:
    """(output ids, meta_info) of one reply or stream chunk; RequestError when their shapes are not SGLang's,
    so that a malformed reply fails the run instead of escaping as a TypeError."""
    if not isinstance(data, dict):
        raise RequestError(f"{where} answered {type(data).__name__}, not an object: {str(data)[:200]}")
    ids, meta = data.get("output_ids"), data.get("meta_info")
    if ids is None and not ids_required:  # a stream chunk may carry meta info only
        ids = []
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise RequestError(f"{where} answered output_ids that are not a list of integers: {str(ids)[:200]}")
    if meta is not None and not isinstance(meta, dict):
        raise RequestError(f"{where} answered meta_info that is not an object: {str(meta)[:200]}")
    for key in _COUNTS:
        value = (meta or {}).get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise RequestError(f"{where} answered meta_info {key}={value!r}, not an integer")
    return ids, meta


def generate_stream(host, port, input_ids, max_new_tokens, timeout) -> dict:
    """One streaming request: output ids, meta info, and the arrival time of every chunk that carried tokens."""
    start = time.perf_counter()
    conn, response = _post(host, port, {"input_ids": input_ids, "sampling_params": sampling_params(max_new_tokens),
                                        "stream": True}, timeout)
    tokens: list = []
    meta: dict = {}
    arrivals = []  # (seconds since start, tokens so far)
    try:
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if isinstance(chunk, dict) and "error" in chunk:
                raise RequestError(f"stream error: {str(chunk['error'])[:200]}")
            ids, chunk_meta = checked_reply(chunk, "/generate stream")
            meta = chunk_meta or meta
            # SGLang streams cumulative ids by default and deltas with --incremental-streaming-output;
            # completion_tokens tells which one this chunk is.
            if meta.get("completion_tokens") == len(ids) and len(ids) >= len(tokens):
                new = len(ids) - len(tokens)
                tokens = ids
            else:
                new = len(ids)
                tokens.extend(ids)
            if new > 0:
                arrivals.append((time.perf_counter() - start, len(tokens)))
    finally:
        conn.close()
    return {"output_ids": tokens, "meta_info": meta, "latency_s": time.perf_counter() - start,
            "arrivals": arrivals}


def _percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    index = (len(ordered) - 1) * q
    low = int(index)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def accept_length(results, decode_only: bool = False) -> float | None:
    """Tokens per verify cycle over the requests, from SGLang's meta info: completion_tokens / spec_verify_ct
    (SGLang's own spec_accept_length, summed over requests) or, ``decode_only``, without each request's first
    token, which prefill produced (what an EAGLE3 profile counts)."""
    speculative = [r["meta_info"] for r in results if r["meta_info"].get("spec_verify_ct")]
    verify = sum(m["spec_verify_ct"] for m in speculative)
    tokens = sum((m.get("completion_tokens") or 0) - (1 if decode_only else 0) for m in speculative)
    return tokens / verify if verify else None


def run_batch(host, port, prompts, max_new_tokens, concurrency, timeout) -> tuple[dict, list]:
    """All prompts with at most ``concurrency`` in flight (submitted in order); wall-clock output throughput."""
    start = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=concurrency)
    try:
        futures = [pool.submit(generate, host, port, p, max_new_tokens, timeout) for p in prompts]
        results = [f.result() for f in futures]
    finally:
        # On a failure or Ctrl-C, do not wait for requests in flight: stopping the server ends them.
        pool.shutdown(wait=False, cancel_futures=True)
    wall = time.perf_counter() - start
    tokens = sum(len(r["output_ids"]) for r in results)
    latencies = [r["latency_s"] * 1e3 for r in results]
    metrics = {"requests": len(results), "output_tokens": tokens, "wall_s": wall,
               "output_tok_s": tokens / wall if wall > 0 else None,
               "latency_ms_p50": _percentile(latencies, 0.5), "latency_ms_mean": statistics.fmean(latencies),
               "accept_length": accept_length(results),
               "short_outputs": sum(1 for r in results if len(r["output_ids"]) != max_new_tokens)}
    return metrics, results


def run_stream(host, port, prompts, max_new_tokens, timeout) -> tuple[dict, list]:
    """One streaming request at a time: TTFT, TPOT (per request, after the first token) and ITL (chunk gaps)."""
    start = time.perf_counter()
    results = [generate_stream(host, port, p, max_new_tokens, timeout) for p in prompts]
    wall = time.perf_counter() - start
    ttft, tpot, itl = [], [], []
    for r in results:
        arrivals = r["arrivals"]
        if not arrivals:
            continue
        ttft.append(arrivals[0][0] * 1e3)
        n = len(r["output_ids"])
        if n > 1:
            tpot.append((r["latency_s"] - arrivals[0][0]) * 1e3 / (n - 1))
        itl.extend((b[0] - a[0]) * 1e3 for a, b in zip(arrivals, arrivals[1:]))
    tokens = sum(len(r["output_ids"]) for r in results)
    metrics = {"requests": len(results), "output_tokens": tokens, "wall_s": wall,
               "output_tok_s": tokens / wall if wall > 0 else None,
               "ttft_ms_p50": _percentile(ttft, 0.5), "ttft_ms_mean": statistics.fmean(ttft) if ttft else None,
               "tpot_ms_p50": _percentile(tpot, 0.5), "tpot_ms_mean": statistics.fmean(tpot) if tpot else None,
               "itl_ms_p50": _percentile(itl, 0.5), "itl_ms_p90": _percentile(itl, 0.9),
               "tokens_per_chunk": (tokens / sum(len(r["arrivals"]) for r in results)
                                    if any(r["arrivals"] for r in results) else None),
               "accept_length": accept_length(results),
               "short_outputs": sum(1 for r in results if len(r["output_ids"]) != max_new_tokens)}
    for r in results:
        del r["arrivals"]
    return metrics, results


def gpu_processes() -> list | None:
    """PIDs holding a GPU context (nvidia-smi), or None where nvidia-smi is not available."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------- one run

def http_get(host, port, path, timeout=5.0):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(tail_lines(path)[-lines:])


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


def server_decode_stats(log: Path, start: int, end: int, running: int) -> dict:
    """SGLang's own decode figures logged between two offsets of the server log, from the lines with ``running``
    requests in the batch: the issue's first measurement used their gen throughput median."""
    try:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read(max(0, end - start)).decode("utf-8", "replace")
    except OSError:
        return {"lines": 0, "gen_tok_s_p50": None, "accept_len_mean": None}
    found = [m for m in _DECODE_LINE.finditer(text) if int(m.group(1)) == running]
    accepts = [float(m.group(2)) for m in found if m.group(2)]
    return {"lines": len(found), "gen_tok_s_p50": _percentile([float(m.group(3)) for m in found], 0.5),
            "accept_len_mean": statistics.fmean(accepts) if accepts else None}


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


def read_profile(path: Path) -> dict | None:
    """The EAGLE3 profile summary of a server (sglang-pcie profile-report's, of the newest profiled process in
    the file: the TP rank 0 scheduler), or None without intervals."""
    from sglang_pcie.tools import profile_report

    if not path.is_file():
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        records = profile_report.read_records(f)
    if not records:
        return None
    runs = profile_report.runs_of(records)
    summary = profile_report.summarise(list(runs.values())[-1])
    summary["runs_in_file"] = len(runs)
    return summary


ACCEPT_TOLERANCE = 0.01
# cycle_ms is the mean over the sampled cycles, wall_cycle_ms over all of them (docs/eagle3-profile.md)
WALL_TOLERANCE = 0.05


def profile_checks(profile: dict, sglang_accept: float | None) -> dict:
    """The invariants a profiled server must hold (docs/eagle3-profile.md; None: not reported by this profile):
    the timed phases fit in the cycle, the cycle's GPU time fits in the wall-clock cycle, no forced GPU waits, one
    profiled process (TP rank 0) per server, and the accept length equals SGLang's (decode tokens per verify
    cycle from its meta info) within 1%."""
    phases, cycle, wall = profile.get("phases_sum_ms"), profile.get("cycle_ms"), profile.get("wall_cycle_ms")
    accept = profile.get("accept_length")
    ratio = accept / sglang_accept if accept and sglang_accept else None
    ranks = (profile.get("ranks") or {}).get("tp_rank")
    checks = {
        "phases_le_cycle": None if phases is None or cycle is None else phases <= cycle * (1 + 1e-6),
        "cycle_le_wall": None if cycle is None or wall is None else cycle <= wall * (1 + WALL_TOLERANCE),
        "no_forced_waits": None if profile.get("syncs") is None else profile["syncs"] == 0,
        "one_run_tp_rank_0": (None if profile.get("runs_in_file") is None or ranks is None
                              else profile["runs_in_file"] == 1 and list(ranks) in ([0], [])),
        "accept_within_1pct": None if ratio is None else abs(ratio - 1) <= ACCEPT_TOLERANCE,
    }
    failed = [name for name, ok in checks.items() if ok is False]
    return dict(checks, accept_ratio=ratio, phases_sum_ms=phases, cycle_ms=cycle, wall_cycle_ms=wall,
                failed=failed)


@dataclass
class Plan:
    variants: list
    workload: Workload
    launch_args: list
    server_cmd: list
    extra_env: dict
    host: str
    port: int
    repeats: int
    out: Path
    start_timeout: float
    stop_timeout: float
    request_timeout: float
    dry_run: bool = False
    argv: list = field(default_factory=list)

    def schedule(self) -> list[dict]:
        runs = []
        by_name = {v.name: v for v in self.variants}
        counts = {v.name: v.repeats for v in self.variants if v.repeats is not None}
        for index, (repeat, name) in enumerate(counterbalanced(list(by_name), self.repeats, counts)):
            variant = by_name[name]
            folder = self.out / "runs" / f"{index + 1:02d}-{name}"
            env = dict(self.extra_env)
            env.update(variant.env)
            if variant.profiling:
                env["EAGLE3_PROFILE_FILE"] = str(folder / PROFILE_FILE_NAME)
            runs.append({"index": index + 1, "repeat": repeat + 1, "variant": name, "folder": folder,
                         "env": env, "args": list(self.launch_args) + list(variant.args)})
        return runs

    def command(self, run: dict, port: int) -> list[str]:
        return list(self.server_cmd) + run["args"] + ["--host", self.host, "--port", str(port)]

    def environment(self, run: dict) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in CONTROLLED_VARS}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(run["env"])
        return env


class Progress:
    def __init__(self, log_path: Path | None):
        self.log_path = log_path
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        line = f"[bench {time.monotonic() - self.started:7.1f}s] {message}"
        print(line, file=sys.stderr, flush=True)
        if self.log_path is not None:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")


def wait_ready(plan: Plan, proc, port: int, log: Path) -> tuple[float, dict]:
    """Seconds until /health answered 200, and /model_info; RuntimeError if the server exits or times out."""
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before /health answered")
        if time.monotonic() - start > plan.start_timeout:
            raise RuntimeError(f"/health did not answer 200 within {plan.start_timeout:.0f} s")
        try:
            status, _ = http_get(plan.host, port, "/health")
            if status == 200:
                break
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    ready_s = time.monotonic() - start
    info = {}
    for path in ("/model_info", "/get_model_info"):
        try:
            status, body = http_get(plan.host, port, path)
        except (OSError, http.client.HTTPException):
            continue
        if status == 200:
            try:
                info = json.loads(body)
            except json.JSONDecodeError:
                info = {}
            break
    return ready_s, info


def execute_run(plan: Plan, run: dict, prompts: dict, progress: Progress) -> dict:
    """Start the variant's server, drive the workload, stop the tree. Never raises for a server's failure."""
    folder: Path = run["folder"]
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "server.log"
    port = free_port(plan.host, plan.port)
    cmd = plan.command(run, port)
    record = {"index": run["index"], "repeat": run["repeat"], "variant": run["variant"], "port": port,
              "command": cmd, "env": run["env"], "log": str(log), "ok": False}
    w = plan.workload
    label = f"{run['index']}/{len(plan.schedule())} {run['variant']} (repeat {run['repeat']})"
    progress(f"{label}: starting on port {port}: {shlex.join(cmd)}")
    server_env = plan.environment(run)
    try:
        record["nccl_expected"] = expected_nccl(server_env)
    except Exception as exc:  # the check is a by-product: it must not cost the measurement
        record["nccl_expected"] = {}
        record["nccl_expected_error"] = f"{type(exc).__name__}: {exc}"
    handle = open(log, "wb")
    try:
        proc = subprocess.Popen(cmd, env=server_env, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        handle.close()
        record["failure"] = {"stage": "start", "message": f"cannot start {cmd[0]!r}: {exc}", "log_tail": ""}
        progress(f"{label}: FAILED to start: {exc}")
        return record
    known: dict = {}
    stage = "start"
    try:
        record["ready_s"], record["model_info"] = wait_ready(plan, proc, port, log)
        known = tree_members(proc.pid)
        progress(f"{label}: ready in {record['ready_s']:.1f} s ({len(known)} processes); warm-up")
        stage = "workload"
        _, warmup_results = run_batch(plan.host, port, prompts["warmup"], w.warmup_output_len, w.concurrency,
                                      plan.request_timeout)
        log_start = log.stat().st_size
        batch, batch_results = run_batch(plan.host, port, prompts["batch"], w.output_len, w.concurrency,
                                         plan.request_timeout)
        server = server_decode_stats(log, log_start, log.stat().st_size, w.concurrency)
        batch["server_gen_tok_s_p50"], batch["server_log_lines"] = server["gen_tok_s_p50"], server["lines"]
        progress(f"{label}: batch {batch['requests']} x {w.output_len} tokens at concurrency {w.concurrency}:"
                 f" {batch['output_tok_s']:.1f} tok/s" + _accept_note(batch))
        stream, stream_results = run_stream(plan.host, port, prompts["stream"], w.output_len, plan.request_timeout)
        progress(f"{label}: stream {stream['requests']} x {w.output_len} tokens at concurrency 1:"
                 f" {stream['output_tok_s']:.1f} tok/s, TTFT p50 {_fmt(stream['ttft_ms_p50'])} ms,"
                 f" TPOT p50 {_fmt(stream['tpot_ms_p50'], 3)} ms" + _accept_note(stream))
        record["metrics"] = {"batch": batch, "stream": stream,
                             "accept_length": accept_length(batch_results + stream_results),
                             # what an EAGLE3 profile of this server saw: the warm-up too, decode tokens only
                             "accept_length_served": accept_length(warmup_results + batch_results + stream_results,
                                                                   decode_only=True)}
        outputs = {"batch": [r["output_ids"] for r in batch_results],
                   "stream": [r["output_ids"] for r in stream_results]}
        (folder / "outputs.json").write_text(json.dumps(outputs))
        record["outputs_file"] = str(folder / "outputs.json")
        record["ok"] = True
    except (RuntimeError, OSError, http.client.HTTPException, RequestError, ValueError) as exc:
        record["failure"] = {"stage": stage, "message": str(exc)}
        progress(f"{label}: FAILED ({stage}): {exc}")
    finally:
        stop = stop_tree(proc, known, plan.stop_timeout)
        handle.close()
        gpu = gpu_processes()
        if gpu is not None:
            stop["gpu_processes_after"] = gpu
        record["stop"] = stop
        survivors = f", {len(stop['survivors'])} SURVIVED: {stop['survivors']}" if stop["survivors"] else ""
        progress(f"{label}: stopped {stop['processes']} processes in {stop['stop_s']} s"
                 f"{' (SIGKILL needed)' if stop['sigkilled'] else ''}{survivors}")
    if "failure" in record:
        record["failure"]["log_tail"] = log_tail(log)
    record["nccl_env"], processes = nccl_env_lines(log)
    if nccl_debug_env(server_env):
        record["nccl_check"] = nccl_check(record["nccl_expected"], record["nccl_env"], processes)
    profile_path = Path(run["env"].get("EAGLE3_PROFILE_FILE", folder / PROFILE_FILE_NAME))
    if run["env"].get("EAGLE3_PROFILE") == "1":
        record["profile"] = read_profile(profile_path) or read_profile(log)
    if record["ok"]:
        record["outputs"] = outputs
    return record


def _fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def _accept_note(metrics):
    note = f", accept length {metrics['accept_length']:.2f}" if metrics.get("accept_length") else ""
    if metrics.get("short_outputs"):
        note += f"; {metrics['short_outputs']} request(s) returned fewer tokens than asked (context limit?)"
    return note


# ---------------------------------------------------------------------------------------------------- analysis

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


def metric_value(record: dict, phase: str, key: str):
    metrics = record.get("metrics") or {}
    value = (metrics.get(phase) or {}).get(key) if phase else metrics.get(key)
    return value if isinstance(value, (int, float)) else None


def ratio_summary(ratios: list[float], higher_is_better: bool) -> dict:
    """Median ratio with its min-max spread; "within noise" when the spread crosses 1.0."""
    if not ratios:
        return {"n": 0, "median": None, "min": None, "max": None, "verdict": "no pairs"}
    median, low, high = statistics.median(ratios), min(ratios), max(ratios)
    if len(ratios) == 1:
        verdict = "one pair: no spread"
    elif low <= 1.0 <= high:
        verdict = "within noise"
    else:
        better = (median > 1.0) == higher_is_better
        verdict = f"{'higher' if median > 1.0 else 'lower'} ({'better' if better else 'worse'})"
    return {"n": len(ratios), "median": median, "min": low, "max": high, "verdict": verdict,
            "ratios": ratios}


def compute_ratios(records: list[dict], variants: list[Variant]) -> dict:
    """variant -> metric label -> ratio summary; a pair is one repeat's variant run over its baseline run."""
    by_repeat: dict = {}
    for record in records:
        if record.get("ok"):
            by_repeat.setdefault(record["repeat"], {})[record["variant"]] = record
    table = {}
    for variant in variants:
        rows = {}
        for phase, key, label, higher in METRICS:
            ratios, values = [], []
            for runs in by_repeat.values():
                value = metric_value(runs[variant.name], phase, key) if variant.name in runs else None
                if value is not None:
                    values.append(value)
                base = metric_value(runs[BASELINE], phase, key) if BASELINE in runs else None
                if value is not None and base:
                    ratios.append(value / base)
            row = ratio_summary(ratios, higher) if variant.name != BASELINE else {"n": len(values)}
            row["value_median"] = statistics.median(values) if values else None
            if variant.name == BASELINE and len(values) > 1 and row["value_median"]:
                # the noise floor: how far identical servers land from their median (an effect inside it needs
                # more repeats before it means anything)
                row["spread"] = [min(values) / row["value_median"], max(values) / row["value_median"]]
            rows[label] = row
        table[variant.name] = rows
    return table


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


# ------------------------------------------------------------------------------------------------------ report

def _ratio_cell(row):
    if row.get("median") is None:
        return f"{'-':>8} {'':15}"
    return f"{row['median']:8.3f} [{row['min']:.3f}-{row['max']:.3f}]"


def format_table(results: dict) -> str:
    lines = []
    runs = results["runs"]
    failed = [r for r in runs if not r.get("ok")]
    w = results["workload"]
    lines.append(f"sglang-pcie bench: {len(runs)} servers ({len(runs) - len(failed)} ran, {len(failed)} failed),"
                 f" {results['repeats']} repeat(s), order {' '.join(r['variant'] for r in runs)}")
    lines.append(f"workload: batch {w['batch_requests']} requests at concurrency {w['concurrency']}, stream"
                 f" {w['stream_requests']} at concurrency 1; {w['input_len']} prompt / {w['output_len']} output"
                 f" tokens, greedy, seed {w['seed']}")
    lines.append(f"{'variant':<14}{'metric':<24}{'median':>10}{'ratio':>9} {'[min-max]':<15}{'n':>3}  verdict")
    for name, rows in results["ratios"].items():
        for label, row in rows.items():
            value = row.get("value_median")
            if name == BASELINE:
                spread = row.get("spread")
                cell, note = (f"[{spread[0]:.3f}-{spread[1]:.3f}]", "  its own servers' spread (noise floor)") \
                    if spread else ("", "")
                lines.append(f"{name:<14}{label:<24}{_fmt(value, 2):>10}{'1':>9} {cell:<15}{row['n']:>3}{note}")
            else:
                lines.append(f"{name:<14}{label:<24}{_fmt(value, 2):>10} {_ratio_cell(row):<24}"
                             f"{row['n']:>3}  {row['verdict']}")
    lines.append("outputs (request by request against the first baseline run):")
    for name, entry in results["outputs"].items():
        vs = entry.get("vs_baseline") or {}
        text = f"  {name:<14}{entry['verdict']}"
        if vs.get("compared"):
            text += f": {vs['differing']}/{vs['compared']} requests differ"
            if vs.get("first"):
                f = vs["first"]
                text += (f"; first: run {f['run']}, {f['phase']} request {f['request']}, token {f['token']}"
                         f" ({f.get('reference')} vs {f.get('got')})")
        if entry.get("within_variant"):
            wv = entry["within_variant"]
            text += f"; its own repeats: {wv['differing']}/{wv['compared']} differ"
        lines.append(text)
    for r in (r for r in runs if r.get("profile")):
        p, c = r["profile"], r.get("profile_checks") or {}
        served = (r.get("metrics") or {}).get("accept_length_served")
        busy = p.get("gpu_busy")
        lines.append(f"profile run {r['index']} ({r['variant']}): {p.get('decode_cycles')} decode cycles;"
                     f" phases {_fmt(c.get('phases_sum_ms'), 3)} <= cycle {_fmt(c.get('cycle_ms'), 3)} <= wall cycle"
                     f" {_fmt(c.get('wall_cycle_ms'), 3)} ms"
                     + ("" if busy is None else f" (GPU busy {busy * 100:.0f}%)")
                     + f"; accept length {_fmt(p.get('accept_length'), 3)} vs SGLang's {_fmt(served, 3)}"
                     + ("" if c.get("accept_ratio") is None else f" (ratio {c['accept_ratio']:.4f})")
                     + (f"; profiler host {p['profiler_host_us_per_cycle']:.1f} us/cycle"
                        if p.get("profiler_host_us_per_cycle") is not None else "")
                     + ("; INVARIANT FAILED: " + ", ".join(c["failed"]) if c.get("failed") else
                        "; invariants hold" if any(c.get(k) is not None for k in
                                                   ("phases_le_cycle", "cycle_le_wall", "accept_within_1pct"))
                        else ""))
    for r in runs:
        if r.get("profile") is None and r["env"].get("EAGLE3_PROFILE") == "1" and r.get("ok"):
            lines.append(f"profile run {r['index']} ({r['variant']}): no EAGLE3 profile intervals were written")
    for r in runs:
        check = r.get("nccl_check")
        if r.get("nccl_env") or check:
            text = f"NCCL read (run {r['index']}, {r['variant']}): " + (", ".join(
                f"{k}={'/'.join(v)}" for k, v in r["nccl_env"].items()) or "no variable")
            if check:
                text += (f" [{check['processes']} process(es)]; expected (user + overlay) "
                         + (", ".join(f"{k}={v}" for k, v in check["expected"].items()) or "nothing"))
                text += ": all read" if check["ok"] else (f": MISSING {check['missing']}" * bool(check["missing"])
                                                          + f" MISMATCHED {check['mismatched']}"
                                                          * bool(check["mismatched"]))
            lines.append(text)
    for r in runs:
        stop = r.get("stop") or {}
        if stop.get("survivors"):
            lines.append(f"run {r['index']} ({r['variant']}): {len(stop['survivors'])} process(es) SURVIVED the stop:"
                         f" {stop['survivors']}")
    for r in failed:
        f = r.get("failure") or {}
        lines.append(f"run {r['index']} ({r['variant']}, repeat {r['repeat']}) FAILED at {f.get('stage')}:"
                     f" {f.get('message')}")
        tail = f.get("log_tail") or "(empty log)"
        lines.extend("    | " + line for line in tail.splitlines())
    if results.get("chart"):
        lines.append(f"chart: {results['chart']}")
    lines.append(f"results: {results['out']}/results.json")
    return "\n".join(lines)


def write_chart(results: dict, path: Path) -> str:
    """A PNG bar chart of the median ratios with min-max spreads; the reason when skipped."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # not installed, or broken: the chart is optional
        return f"skipped: matplotlib not importable ({type(exc).__name__})"
    names = [n for n in results["ratios"] if n != BASELINE]
    labels = [m[2] for m in METRICS]
    if not names:
        return "skipped: no variant besides baseline"
    fig, ax = plt.subplots(figsize=(max(8.0, 1.6 * len(labels)), 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        rows = results["ratios"][name]
        xs, ys, lo, hi = [], [], [], []
        for j, label in enumerate(labels):
            row = rows.get(label) or {}
            if row.get("median") is None:
                continue
            xs.append(j + (i - (len(names) - 1) / 2) * width)
            ys.append(row["median"])
            lo.append(row["median"] - row["min"])
            hi.append(row["max"] - row["median"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=name)
    baseline = results["ratios"].get(BASELINE, {})
    bands = [(j, spread) for j, label in enumerate(labels) if (spread := (baseline.get(label) or {}).get("spread"))]
    for n, (j, (low, high)) in enumerate(bands):
        ax.fill_between([j - 0.45, j + 0.45], low, high, color="grey", alpha=0.2, linewidth=0,
                        label="baseline servers' spread" if n == 0 else None)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("ratio to baseline (median, min-max)")
    ax.set_title(f"sglang-pcie bench: {results['repeats']} counterbalanced repeat(s)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def assemble(plan: Plan, records: list[dict], started: str, complete: bool) -> dict:
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
    return results


def save(results: dict, out: Path) -> None:
    partial = out / "results.json.partial"
    from sglang_pcie.runtime.eagle_profiler import finite  # the helper profile_report uses too

    # Strict JSON: a NaN/Infinity (a zero-length phase, a broken profile) becomes null, not a bare NaN token.
    partial.write_text(json.dumps(finite(results), indent=1, default=str, allow_nan=False))
    partial.replace(out / "results.json")


def format_schedule(plan: Plan) -> str:
    runs = plan.schedule()
    w = plan.workload
    lines = [f"schedule: {len(plan.variants)} variant(s) x {plan.repeats} repeat(s) = {len(runs)} servers,"
             f" one at a time, order {' '.join(r['variant'] for r in runs)}",
             f"workload per server: warm-up {w.warmup_requests} x {w.warmup_output_len} tokens, batch"
             f" {w.batch_requests} x {w.output_len} at concurrency {w.concurrency}, stream {w.stream_requests} x"
             f" {w.output_len} at concurrency 1; prompts {w.input_len} token ids in [{w.token_low}, {w.token_high}),"
             f" seed {w.seed}; greedy, ignore_eos",
             f"inherited variables removed: {', '.join(CONTROLLED_VARS)}"]
    for v in plan.variants:
        lines.append(f"variant {v.name}: tokens {v.tokens}; env {_env_text(v.env) or '-'}; extra args"
                     f" {shlex.join(v.args) or '-'}")
    for run in runs:
        lines.append(f"{run['index']:3d}. {run['variant']} (repeat {run['repeat']}) -> {run['folder']}")
        lines.append(f"     env: {_env_text(run['env']) or '-'}")
        lines.append(f"     cmd: {shlex.join(plan.command(run, plan.port))}")
    lines.append(f"(ports: the first free one from {plan.port}; results in {plan.out}/results.json)")
    return "\n".join(lines)


def _env_text(env: dict) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())


# --------------------------------------------------------------------------------------------------------- CLI

DESCRIPTION = ("Start one real SGLang server per variant (fresh process tree each), drive a fixed greedy"
               " workload, compare throughput, latency, accept length and outputs against baseline.")
EPILOG = ("Variants: baseline (SGLANG_PCIE_DISABLE=1), overlay, profile (EAGLE3_PROFILE=1), or"
          " NAME:FIELD=VALUE[;FIELD=VALUE...] with FIELD env ('K=V K2=V2'), args (launch arguments added"
          " after the common ones), base (baseline|overlay|profile, default overlay), tokens"
          " (must-match|may-differ), repeats (K: only in the last K repeats). Example: --variant 'steps2:args=--speculative-num-steps 2"
          " --speculative-num-draft-tokens 3' --variant nccl-pcie:env=SGLANG_PCIE_NCCL_PROFILE=pcie")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", action="append", default=[], metavar="SPEC",
                   help="a variant to run (repeatable; default: baseline and overlay; baseline is always run)")
    p.add_argument("--repeats", type=int, default=3, help="counterbalanced repeats of every variant (default 3)")
    p.add_argument("--concurrency", type=int, default=32, help="batch phase concurrency (default 32)")
    p.add_argument("--batch-requests", type=int, default=None,
                   help="requests in the batch phase (default 4 x concurrency)")
    p.add_argument("--stream-requests", type=int, default=8, help="requests in the concurrency-1 stream (default 8)")
    p.add_argument("--input-len", type=int, default=128, help="prompt length in tokens (default 128)")
    p.add_argument("--output-len", type=int, default=256, help="max_new_tokens, with ignore_eos (default 256)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
    p.add_argument("--token-range", default="10:30000", metavar="LO:HI",
                   help="prompt token ids are drawn from [LO, HI) (default 10:30000; HI at most the vocabulary)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="a variable for every variant's server (repeatable), e.g. NCCL_DEBUG=INFO")
    p.add_argument("--out", metavar="DIR", help="results folder (default ./bench-YYYYmmdd-HHMMSS)")
    p.add_argument("--host", default="127.0.0.1", help="address the servers listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="first port to try (default 30000)")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds for /health (default 900)")
    p.add_argument("--stop-timeout", type=float, default=30.0,
                   help="seconds between SIGTERM and SIGKILL of the server's tree (default 30)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--server-cmd", metavar="CMD",
                   help="the server command before the launch arguments (default: this python -m"
                        " sglang.launch_server); for tests or another interpreter")
    p.add_argument("--dry-run", action="store_true", help="print the schedule and commands; start nothing")
    p.add_argument("--report", metavar="DIR",
                   help="print the table of an earlier run's DIR/results.json (and draw its chart); start nothing")


def make_plan(args: argparse.Namespace) -> Plan:
    launch_args = list(args.passthrough or [])
    if args.report:
        raise ReportOnly(Path(args.report))
    for flag in ("--port", "--host"):
        if any(a == flag or a.startswith(flag + "=") for a in launch_args):
            raise UsageError(f"launch argument {flag}: give it to bench ({PROG} {flag} ...), it sets it per server")
    if not launch_args and not args.server_cmd:
        raise UsageError("no launch_server arguments after '--' (e.g. -- --model-path /models/target --tp-size 2)")
    for name in ("repeats", "concurrency", "stream_requests", "input_len", "output_len"):
        if name == "stream_requests" and args.stream_requests < 0:
            raise UsageError(f"--stream-requests {args.stream_requests}: must be an integer >= 0")
        if name != "stream_requests" and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be a positive integer")
    # free_port tries port..port+199; past 65535 socket.bind raises OverflowError, not OSError.
    if not 1 <= args.port <= 65535 - 199:
        raise UsageError(f"--port {args.port}: must be between 1 and {65535 - 199}")
    for name in ("start_timeout", "stop_timeout", "request_timeout"):
        value = getattr(args, name)
        if not value > 0 or value == float("inf"):
            raise UsageError(f"--{name.replace('_', '-')} {value}: must be a positive number of seconds")
    variants = resolve_variants(args.variant)
    for v in variants:
        if v.repeats is not None and v.repeats > args.repeats:
            raise UsageError(f"--variant {v.spec!r}: repeats={v.repeats} is more than --repeats {args.repeats}")
    if args.batch_requests is not None and args.batch_requests < 1:
        raise UsageError(f"--batch-requests {args.batch_requests}: must be a positive integer")
    m = re.match(r"^(\d+):(\d+)$", args.token_range)
    if not m or int(m.group(1)) >= int(m.group(2)):
        raise UsageError(f"--token-range {args.token_range!r}: give LO:HI with 0 <= LO < HI")
    extra_env = {}
    for pair in args.env:
        extra_env.update(parse_env_pairs(shlex.quote(pair), f"--env {pair!r}"))
    for key in extra_env:
        if key in CONTROLLED_VARS:
            raise UsageError(f"--env {key}: set by the variants themselves (use a variant's env= field)")
    try:
        server_cmd = shlex.split(args.server_cmd) if args.server_cmd else [sys.executable, "-m",
                                                                           "sglang.launch_server"]
    except ValueError as exc:
        raise UsageError(f"--server-cmd {args.server_cmd!r}: does not parse ({exc})") from None
    if not server_cmd:
        raise UsageError("--server-cmd '': empty command")
    workload = Workload(seed=args.seed, concurrency=args.concurrency,
                        batch_requests=args.batch_requests or 4 * args.concurrency,
                        stream_requests=args.stream_requests, input_len=args.input_len, output_len=args.output_len,
                        warmup_requests=args.concurrency, token_low=int(m.group(1)), token_high=int(m.group(2)))
    out = Path(args.out or time.strftime("bench-%Y%m%d-%H%M%S")).resolve()
    plan = Plan(variants=variants, workload=workload, launch_args=launch_args,
                server_cmd=server_cmd, extra_env=extra_env, host=args.host, port=args.port, repeats=args.repeats,
                out=out, start_timeout=args.start_timeout, stop_timeout=args.stop_timeout,
                request_timeout=args.request_timeout, dry_run=args.dry_run, argv=args.argv)
    return plan


def run_plan(plan: Plan) -> dict:
    plan.out.mkdir(parents=True, exist_ok=True)
    progress = Progress(plan.out / "progress.log")
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    prompts = plan.workload.prompts()
    (plan.out / "schedule.txt").write_text(format_schedule(plan) + "\n")
    records: list[dict] = []
    runs = plan.schedule()
    progress(f"{len(runs)} servers, order {' '.join(r['variant'] for r in runs)}; results in {plan.out}")
    for run in runs:
        try:
            records.append(execute_run(plan, run, prompts, progress))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: execute_run stopped the server; keep what was measured
            records.append({"index": run["index"], "repeat": run["repeat"], "variant": run["variant"],
                            "env": run["env"], "ok": False,
                            "failure": {"stage": "interrupted", "message": "bench was interrupted (Ctrl-C or SIGTERM)",
                                        "log_tail": ""}})
            save(assemble(plan, records, started, complete=False), plan.out)
            raise
        save(assemble(plan, records, started, complete=False), plan.out)
    results = assemble(plan, records, started, complete=True)
    results["chart"] = write_chart(results, plan.out / "ratios.png")
    save(results, plan.out)
    progress(f"done: {plan.out}/results.json; chart {results['chart']}")
    return results


def exit_code(results: dict) -> int:
    """0: every server ran and stopped, no must-match variant changed tokens, every profile invariant held;
    1 otherwise."""
    if any(not r.get("ok") or (r.get("stop") or {}).get("survivors") for r in results["runs"]):
        return 1
    if any(e.get("verdict") == "DIFFERENT" for e in results["outputs"].values()):
        return 1
    if any((r.get("profile_checks") or {}).get("failed") for r in results["runs"]):
        return 1
    return 0


def _interrupt(signum, frame):
    # A SIGTERM to bench (the kill of a background run) unwinds like Ctrl-C: the server tree is stopped.
    raise KeyboardInterrupt


def show_report(folder: Path) -> int:
    """The table (and chart, where matplotlib is importable here) of a run collected from another machine."""
    path = folder / "results.json"
    try:
        results = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"{PROG}: error: --report {str(folder)!r}: cannot read {path.name} ({exc})", file=sys.stderr)
        return USAGE_ERROR
    if results.get("schema") != SCHEMA:
        print(f"{PROG}: error: --report {str(folder)!r}: {path.name} is not a bench result ({SCHEMA})",
              file=sys.stderr)
        return USAGE_ERROR
    if not (folder / "ratios.png").is_file():
        chart = write_chart(results, folder / "ratios.png")
        if not chart.startswith("skipped"):
            results["chart"] = chart
    partial = "" if results.get("complete") else f"(partial: {len(results['runs'])} run(s) so far)\n"
    return _print(partial + format_table(results), exit_code(results))


def run(args: argparse.Namespace) -> int:
    try:
        plan = make_plan(args)
    except ReportOnly as report:
        return show_report(report.args[0])
    if plan.dry_run:
        return _print(format_schedule(plan), 0)
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = run_plan(plan)
    except KeyboardInterrupt:
        saved = plan.out / "results.json"
        print(f"{PROG}: interrupted; " + (f"partial results in {saved}" if saved.is_file() else "no results written"),
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _print(format_table(results), exit_code(results))


def _print(text: str, code: int) -> int:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `... | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code



COMMAND = Command("bench", "one real server per variant (baseline, overlay, profile, yours), side by side",
                  add_arguments, run, description=DESCRIPTION, epilog=EPILOG,
                  usage=f"{PROG} [options] -- <launch_server arguments>", passthrough=True)
