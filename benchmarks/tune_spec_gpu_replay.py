"""The figures of tune-spec's GPU evidence (docs/evidence.md section 5), recomputed from the committed raw files of
benchmarks/gpu_tune_spec.sh's run on one H200 (2026-12-03, commit ac17efc's tune-spec):

    python3 -m benchmarks.tune_spec_gpu_replay > benchmarks/results/2026-12-03-h200/tune-spec/replay.txt

1. the exhaustive sweep (none, chains 1, 2, 3, 5, 7; two servers each, counterbalanced): medians per workload;
2. tune-spec's pick per workload, its ratio to the sweep's best (both by the sweep's own medians), server starts;
3. tune-spec's predictions (as it ran: one pooled histogram) beside the sweep's medians;
4. tokens per verify at each chain: measured (the sweep's batch phase, SGLang's meta info), as the pooled model
   predicted them from chain-7, and per request. The run kept pooled histograms only, so the per-request figure
   uses the two request kinds the pooled chain-7 histogram shows (a verify accepted one draft or all seven): the
   share g of requests that accept all solves  a_2 = (g / 8) / (g / 8 + (1 - g) / 2).
5. the profiled servers against the sweep's unprofiled ones: bench's batch tok/s, and the median of SGLang's own
   "gen throughput" log lines at 32 running requests (its metrics reporter, every 40 decode steps).
The one-request figure of that run is 1000 / TPOT p50 (the version since uses the mean TPOT).
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

RAW = Path(__file__).resolve().parent / "results" / "2026-12-03-h200" / "tune-spec"
WORKLOADS = {"batch": "batch output tok/s (c=32)", "latency": "one-request decode tok/s (1000 / TPOT p50)"}


def main() -> None:
    sweep = json.loads((RAW / "sweep" / "state.json").read_text())
    tune = json.loads((RAW / "tune" / "state.json").read_text())
    result = json.loads((RAW / "tune" / "result.json").read_text())
    names = [c["name"] for c in sweep["candidates"]]
    medians = {}
    print("1. sweep: every candidate twice, order", " ".join(s["candidate"] for s in sweep["servers"]))
    for workload, label in WORKLOADS.items():
        print(f"   {label}")
        medians[workload] = {}
        for name in names:
            got = [s[workload]["value"] for s in sweep["servers"] if s["candidate"] == name and s["ok"]]
            medians[workload][name] = statistics.median(got)
            print(f"     {name:<8} {' '.join(f'{v:8.1f}' for v in got)}   median {medians[workload][name]:8.1f}"
                  f"   spread {(max(got) / min(got) - 1) * 100:4.1f}%")
    print("\n2. tune-spec's pick against the sweep's best (the sweep's medians)")
    for workload, label in WORKLOADS.items():
        best = max(medians[workload], key=medians[workload].get)
        pick = result["analysis"][workload]["recommended"]
        print(f"   {label}: pick {pick}, sweep best {best}: ratio {medians[workload][pick] / medians[workload][best]:.3f};"
              f" tune-spec said: {result['analysis'][workload]['verdict']}")
    measured = [s for s in tune["servers"] if not s.get("warmup")]
    print(f"   server starts: tune-spec {len(measured)} measured + 1 warm-up; sweep {len(sweep['servers'])} measured"
          f" (after the same warm-up): {len(measured) / len(sweep['servers']) * 100:.0f}%"
          f" ({(len(measured) + 1) / (len(sweep['servers']) + 1) * 100:.0f}% counting a warm-up each)")
    print(f"   tune-spec's servers, in order: {', '.join(s['candidate'] for s in measured)};"
          f" wall {sum(s['duration_s'] for s in measured) + tune['warmup']['duration_s']:.0f} s with its warm-up")
    print("\n3. predicted (tune-spec as it ran) beside the sweep's median")
    for workload, label in WORKLOADS.items():
        print(f"   {label}")
        for row in result["analysis"][workload]["rows"]:
            if row["predicted"] is not None:
                sweep_median = medians[workload][row["candidate"]]
                print(f"     {row['candidate']:<8} predicted {row['predicted']:8.1f}  sweep {sweep_median:8.1f}"
                      f"  predicted/sweep {row['predicted'] / sweep_median:.3f}")
    print("\n4. decode tokens per verify, batch phase: measured / pooled model (as run) / per request (two kinds)")
    deep = next(s for s in sweep["servers"] if s["candidate"] == "chain-7")["batch"]["accept_at_least"]
    a2 = deep[1]
    g = 4 * a2 / (1 + 3 * a2)  # from a2 = (g/8) / (g/8 + (1-g)/2)
    print(f"   chain-7's pooled shares at least j drafts: {', '.join(f'{a:.3f}' for a in deep)};"
          f" requests that accept all: g = {g:.3f}")
    for name in names[1:]:
        k = int(name.split("-")[1])
        server = next(s for s in sweep["servers"] if s["candidate"] == name)["batch"]
        tokens, requests = server["output_tokens"], server["requests"]
        measured_tokens = server["accept_length"] * (tokens - requests) / tokens  # decode tokens per verify
        pooled = 1 + sum(deep[:k])
        per_request = 1 / (g / (k + 1) + (1 - g) / 2)
        print(f"   {name:<8} measured {measured_tokens:.3f}   pooled {pooled:.3f} ({pooled / measured_tokens - 1:+.1%})"
              f"   per request {per_request:.3f} ({per_request / measured_tokens - 1:+.1%})")

    print("\n5. profiled (tune-spec's model servers) against unprofiled (the sweep) of the same setting")
    for name in ("chain-7", "chain-3"):
        rows = [("profiled", s, "tune") for s in tune["servers"] if s["candidate"] == name]
        rows += [("unprofiled", s, "sweep") for s in sweep["servers"] if s["candidate"] == name]
        for kind, server, run in rows:
            log = RAW / run / "runs" / f"{server['index']:02d}-{name}{'-profiled' if server['profiled'] else ''}" \
                / "server.log"
            lines = [float(x) for x in re.findall(r"#running-req: 32,.*?gen throughput \(token/s\): ([\d.]+)",
                                                     log.read_text(errors="replace"))]
            print(f"   {name} {kind:<10} server {run} {server['index']:>2}: batch {server['batch']['value']:7.1f} tok/s;"
                  f" SGLang's gen throughput at 32 running, median of {len(lines)} lines:"
                  f" {statistics.median(lines):7.1f}")


if __name__ == "__main__":
    main()
