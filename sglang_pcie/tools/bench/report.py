"""What bench prints and writes: the table, the chart, the schedule (``--dry-run``) and results.json."""
from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

from sglang_pcie.tools.bench.analysis import METRICS
from sglang_pcie.tools.bench.plan import AUTO_MAX_REPEATS, BASELINE, CONTROLLED_VARS, Plan
from sglang_pcie.tools.bench.verdicts import CANNOT_RESOLVE, noise_margin


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def save(results: dict, out: Path) -> None:
    partial = out / "results.json.partial"
    from sglang_pcie.patches.eagle3_profile.payload import finite  # the helper profile_report uses too

    # Strict JSON: a NaN/Infinity (a zero-length phase, a broken profile) becomes null, not a bare NaN token.
    partial.write_text(json.dumps(finite(results), indent=1, default=str, allow_nan=False))
    partial.replace(out / "results.json")


# ------------------------------------------------------------------------------------------------------- table

def format_table(results: dict) -> str:
    runs = results["runs"]
    failed = [r for r in runs if not r.get("ok")]
    w = results["workload"]
    lines = [f"sglang-pcie bench: {len(runs)} servers ({len(runs) - len(failed)} ran, {len(failed)} failed),"
             f" {results['repeats']} repeat(s), order {' '.join(r['variant'] for r in runs)}",
             f"workload: batch {w['batch_requests']} requests at concurrency {w['concurrency']}, stream"
             f" {w['stream_requests']} at concurrency 1; {w['input_len']} prompt / {w['output_len']} output"
             f" tokens, greedy, seed {w['seed']}"]
    if results.get("warmup"):
        lines.append(_warmup_line(results["warmup"]))
    lines += _ratio_lines(results["ratios"])
    if (results.get("auto") or {}).get("stopped"):
        lines.append(auto_text(results["auto"]))
    lines += _output_lines(results["outputs"])
    lines += [_profile_line(r) for r in runs if r.get("profile")]
    for r in runs:
        if r.get("profile") is None and r["env"].get("EAGLE3_PROFILE") == "1" and r.get("ok"):
            lines.append(f"profile run {r['index']} ({r['variant']}): no EAGLE3 profile intervals were written")
    lines += [_nccl_line(r) for r in runs if r.get("nccl_env") or r.get("nccl_check")]
    for r in runs:
        stop = r.get("stop") or {}
        if stop.get("survivors"):
            lines.append(f"run {r['index']} ({r['variant']}): {len(stop['survivors'])} process(es) SURVIVED the stop:"
                         f" {stop['survivors']}")
    for r in failed:
        f = r.get("failure") or {}
        lines.append(f"run {r['index']} ({r['variant']}, repeat {r['repeat']}) FAILED at {f.get('stage')}:"
                     f" {f.get('message')}")
        if f.get("stage") != "outputs":  # the server answered: the message says what was wrong
            tail = f.get("log_tail") or "(empty log)"
            lines.extend("    | " + line for line in tail.splitlines())
    if results.get("chart"):
        lines.append(f"chart: {results['chart']}")
    lines.append(f"results: {results['out']}/results.json")
    return "\n".join(lines)


def _warmup_line(warmup: dict) -> str:
    """The unmeasured warm-up server in one line: ready time, or why it failed (the run went on)."""
    stop = warmup.get("stop") or {}
    survivors = (f"; {len(stop['survivors'])} process(es) SURVIVED the stop: {stop['survivors']}"
                 if stop.get("survivors") else "")
    if warmup.get("ok"):
        return (f"warm-up ({warmup['variant']}, not measured): ready in {fmt(warmup.get('ready_s'))} s,"
                f" {fmt(warmup.get('wall_s'))} s in all{survivors}")
    failure = warmup.get("failure") or {}
    return (f"warm-up ({warmup['variant']}, not measured) FAILED at {failure.get('stage')}: {failure.get('message')}"
            f" (log {warmup.get('log')}); the measured servers ran without it{survivors}")


def _ratio_cell(row):
    if row.get("median") is None:
        return f"{'-':>8} {'':15}"
    interval = row.get("interval")
    cell = f"[{interval[0]:.3f}-{interval[1]:.3f}]" if interval else "-"
    if row.get("verdict") == CANNOT_RESOLVE:  # no figure a reader could use: results.json keeps the interval
        cell = "too wide"
    return f"{row['median']:8.3f} {cell:<15}"


def percent(fraction) -> str:
    """A relative effect as the table prints it: +-4.2%."""
    if fraction is None:
        return "-"
    return "±>999%" if fraction > 9.99 else f"±{fraction * 100:.1f}%"


def _ratio_lines(ratios: dict) -> list[str]:
    """Per variant and metric: the median value, the median ratio to baseline with its 95% interval, the pairs,
    the smallest effect those pairs could resolve, the verdict. The baseline's own rows: its servers' spread."""
    lines = [f"{'variant':<14}{'metric':<24}{'median':>10}{'ratio':>9} {'95% interval':<15}{'n':>3}"
             f"{'resolvable':>11}  verdict"]
    for name, rows in ratios.items():
        for label, row in rows.items():
            value = row.get("value_median")
            if name == BASELINE:
                spread = row.get("spread")
                cell, note = (f"[{spread[0]:.3f}-{spread[1]:.3f}]", f"  its own servers' spread: noise floor"
                              f" {percent(math.exp(noise_margin(spread)) - 1)}") if spread else ("", "")
                lines.append(f"{name:<14}{label:<24}{fmt(value, 2):>10}{'1':>9} {cell:<15}{row['n']:>3}"
                             f"{'':>11}{note}".rstrip())
            else:
                lines.append(f"{name:<14}{label:<24}{fmt(value, 2):>10} {_ratio_cell(row):<24}"
                             f"{row['n']:>3}{percent(row.get('resolvable')):>11}  {row['verdict']}")
    return lines


def auto_text(auto: dict) -> str:
    """Why --repeats auto stopped, and what the run can resolve now."""
    what = f"{auto['metric']} to {percent(auto['target'])}"
    widths = ", ".join(f"{name} {percent(width)}" for name, width in auto["resolvable"].items()) or "no variant"
    after = f"after {auto['repeats']} repeats ({auto['elapsed_s'] / 60:.1f} minutes)"
    if auto["stopped"] == "resolved":
        return f"repeats auto: resolved {what} {after}: every variant can see {widths}"
    if auto["stopped"] == "failure":
        return f"repeats auto: stopped {after}: a server failed (below)"
    if auto["stopped"] == "noise floor":
        return (f"repeats auto: NOT RESOLVABLE {what}: the baseline servers' own spread is"
                f" {percent(auto['noise_margin'])} {after}; more repeats narrow the interval, not that")
    limit = (f"in {auto['budget_s'] / 60:g} minutes" if auto["stopped"] == "budget"
             else f"in {auto['repeats']} repeats")
    return f"repeats auto: NOT RESOLVABLE {what} {limit}: {after} the smallest resolvable effects are {widths}"


def _output_lines(outputs: dict) -> list[str]:
    lines = ["outputs (request by request against the first baseline run):"]
    for name, entry in outputs.items():
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
    return lines


def _profile_line(r: dict) -> str:
    p, c = r["profile"], r.get("profile_checks") or {}
    served = (r.get("metrics") or {}).get("accept_length_served")
    busy = p.get("gpu_busy")
    cycles = p.get("decode_cycles")
    return (f"profile run {r['index']} ({r['variant']}): "
            + (f"{cycles} decode cycles;" if cycles is not None else "no readable record;")
            + f" phases {fmt(c.get('phases_sum_ms'), 3)} <= cycle {fmt(c.get('cycle_ms'), 3)} <= "
            + (f"timed wall cycle {fmt(c['timed_wall_cycle_ms'], 3)} ms (all cycles: {fmt(c.get('wall_cycle_ms'), 3)})"
               if c.get("timed_wall_cycle_ms") is not None else f"wall cycle {fmt(c.get('wall_cycle_ms'), 3)} ms")
            + ("" if busy is None else f" (GPU busy {busy * 100:.0f}%)")
            + f"; accept length {fmt(p.get('accept_length'), 3)} vs SGLang's {fmt(served, 3)}"
            + ("" if c.get("accept_ratio") is None else f" (ratio {c['accept_ratio']:.4f})")
            + (f"; profiler host {p['profiler_host_us_per_cycle']:.1f} us/cycle"
               if p.get("profiler_host_us_per_cycle") is not None else "")
            + ("; INVARIANT FAILED: " + ", ".join(c["failed"])
               + (f" ({p['first_skipped']})" if p.get("first_skipped") else "") if c.get("failed") else
               "; invariants hold" if any(c.get(k) is not None for k in
                                          ("phases_le_cycle", "cycle_le_wall", "accept_within_1pct"))
               else ""))


def _nccl_line(r: dict) -> str:
    check = r.get("nccl_check")
    text = f"NCCL read (run {r['index']}, {r['variant']}): " + (", ".join(
        f"{k}={'/'.join(v)}" for k, v in r["nccl_env"].items()) or "no variable")
    if check:
        text += (f" [{check['processes']} process(es)]; expected (user + overlay) "
                 + (", ".join(f"{k}={v}" for k, v in check["expected"].items()) or "nothing"))
        text += ": all read" if check["ok"] else (f": MISSING {check['missing']}" * bool(check["missing"])
                                                  + f" MISMATCHED {check['mismatched']}"
                                                  * bool(check["mismatched"]))
    return text


# ------------------------------------------------------------------------------------------------------- chart

def write_chart(results: dict, path: Path) -> str:
    """A PNG bar chart of the median ratios with their 95% intervals; the reason when skipped."""
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
            interval = row.get("interval") or [row["median"], row["median"]]  # one pair: no interval
            xs.append(j + (i - (len(names) - 1) / 2) * width)
            ys.append(row["median"])
            lo.append(max(0.0, row["median"] - interval[0]))
            hi.append(max(0.0, interval[1] - row["median"]))
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=name)
    _noise_bands(ax, results["ratios"].get(BASELINE, {}), labels)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("ratio to baseline (median, 95% interval)")
    ax.set_title(f"sglang-pcie bench: {results['repeats']} counterbalanced repeat(s)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def _noise_bands(ax, baseline: dict, labels: list) -> None:
    """The baseline servers' own spread per metric, a grey band behind its bars."""
    bands = [(j, spread) for j, label in enumerate(labels) if (spread := (baseline.get(label) or {}).get("spread"))]
    for n, (j, (low, high)) in enumerate(bands):
        ax.fill_between([j - 0.45, j + 0.45], low, high, color="grey", alpha=0.2, linewidth=0,
                        label="baseline servers' spread" if n == 0 else None)


# ---------------------------------------------------------------------------------------------------- schedule

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
    if not plan.warmup:
        lines.insert(1, "warm-up server: none (--no-warmup)")
    if plan.resolve is not None:
        lines.insert(1, f"--repeats auto: then one more repeat at a time until every variant's"
                        f" {plan.resolve.metric} could resolve {percent(plan.resolve.target)}; no repeat started that"
                        f" would end past {plan.resolve.budget_s / 60:g} minutes; at most {AUTO_MAX_REPEATS} repeats")
    for v in plan.variants:
        lines.append(f"variant {v.name}: tokens {v.tokens}; env {_env_text(v.env) or '-'}; extra args"
                     f" {shlex.join(v.args) or '-'}")
    if plan.warmup:
        run = plan.warmup_run()
        lines.append(f"  0. warm-up: {run['variant']}, not measured (warm-up requests, one batch, one streamed"
                     f" request; stopped) -> {run['folder']}")
        lines.append(f"     env: {_env_text(run['env']) or '-'}")
        lines.append(f"     cmd: {shlex.join(plan.command(run, plan.port))}")
    for run in runs:
        lines.append(f"{run['index']:3d}. {run['variant']} (repeat {run['repeat']}) -> {run['folder']}")
        lines.append(f"     env: {_env_text(run['env']) or '-'}")
        lines.append(f"     cmd: {shlex.join(plan.command(run, plan.port))}")
    lines.append(f"(ports: the first free one from {plan.port}; results in {plan.out}/results.json)")
    return "\n".join(lines)


def _env_text(env: dict) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
