"""What tune-spec says: per workload a table (candidate, predicted, measured median with its interval, n, note),
the verdict, the launch to paste, and the break-even accept length where speculation does not pay."""
from __future__ import annotations

import shlex
import statistics

from sglang_pcie.tools.bench.verdicts import t_quantile
from sglang_pcie.tools.tune_spec.candidates import NONE
from sglang_pcie.tools.tune_spec.model import LABELS, log_interval
from sglang_pcie.tools.tune_spec.search import (compare, estimates, failed, leaders, measured, models, values)


def _num(value, digits=1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(ratio) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


def analyse(candidates: list, servers: list[dict], settings) -> dict:
    """Per workload: rows, the comparison of leader and runner-up, the verdict line and the recommendation."""
    run = measured(servers)
    fitted = models(candidates, run, settings.workloads)
    out = {}
    for workload in settings.workloads:
        model = fitted[workload]
        rows = []
        for c in candidates:
            got = values(run, c.name, workload)
            rows.append({"candidate": c.name, "steps": c.steps, "kind": c.kind,
                         "predicted": model.predict(c.steps) if c.modelled else None,
                         "measured": statistics.median(got) if got else None,
                         "interval": log_interval(got, t_quantile), "values": got, "n": len(got),
                         "failed": c.name in failed(run)})
        top = leaders(candidates, run, workload, model)
        comparison = (compare(run, workload, top[0], top[1], settings.resolve)
                      if len(top) == 2 and all(values(run, n, workload) for n in top) else None)
        pick = _pick(top, comparison, settings.current)
        out[workload] = {"label": LABELS[workload], "rows": rows, "model": model.as_dict([c.steps for c in candidates if c.modelled]),
                         "comparison": comparison, "verdict": verdict_line(top, comparison, settings, run, workload),
                         "recommended": pick,
                         "no_speculation_best": bool(top) and top[0] == NONE,
                         "break_even": _break_even(model, candidates, run, workload) if top and top[0] == NONE
                         else None,
                         "estimates": {k: {"value": v, "source": s}
                                       for k, (v, s) in estimates(candidates, run, workload, model).items()}}
    return out


def _pick(top: list[str], comparison: dict | None, current: str) -> str | None:
    if not top:
        return None
    if comparison and comparison["verdict"] == "within" and current in top:
        return current  # equal within the target: keep what the user runs
    return top[0]


def verdict_line(top, comparison, settings, servers, workload) -> str:
    target = f"{settings.resolve * 100:g}%"
    if not top:
        return "no candidate has a figure: every server failed"
    if len(top) == 1:
        return f"{top[0]} is the only candidate with a figure"
    if comparison is None:
        missing = [n for n in top if not values(servers, n, workload)]
        return (f"cannot tell within the budget: {top[0]} leads {top[1]} by prediction only"
                f" ({', '.join(missing)} not measured)")
    lead, runner, n = comparison["leader"], comparison["runner_up"], comparison["pairs"]
    low_high = comparison["interval"]
    interval = (f" [{_pct(low_high[0])} to {_pct(low_high[1])}]" if low_high and low_high[1] / low_high[0] <= 2
                else " [interval wider than 2x: nothing resolved]" if low_high else "")
    band = f", noise band +-{comparison['noise_margin'] * 100:.1f}%" if comparison["noise_margin"] else ""
    if comparison["verdict"] == "best":
        return f"{lead} is best by {_pct(comparison['median'])}{interval} over {runner} ({n} pairs{band})"
    if comparison["verdict"] == "within":
        return f"{lead} and {runner} are within {target}: either ({_pct(comparison['median'])}{interval}, {n} pairs)"
    figures = f"{lead} leads {runner} by {_pct(comparison['median'])}{interval} over {n} pair{'s' * (n != 1)}{band}"
    if comparison["verdict"] == "noise floor":
        return (f"cannot tell: servers of one candidate spread +-{comparison['noise_margin'] * 100:.1f}% here,"
                f" wider than {target}, and the lead does not clear that spread; {figures}")
    if comparison["verdict"] == "at the band":
        return f"cannot tell: the lead is about the servers' own spread, more pairs do not settle it; {figures}"
    need = comparison["pairs_needed"]
    more = (f"; about {need} pairs would resolve {target}" if need else
            f"; resolving {target} needs more than 50 pairs at this spread" if n >= 2 else "")
    return f"cannot tell within the budget: {figures}{more}"


def _break_even(model, candidates, servers, workload) -> dict | None:
    """Where no speculation leads: for the chain the model rates best, the accept length it would need here."""
    chains = [c for c in candidates if c.modelled and model.predict(c.steps) is not None]
    if not chains:
        return None
    best = max(chains, key=lambda c: model.predict(c.steps))
    return {"candidate": best.name, "needed_tokens_per_verify": model.break_even(best.steps),
            "measured_tokens_per_verify": model.tokens(best.steps)}


def launch_line(candidates: list, name: str | None) -> str | None:
    for c in candidates:
        if c.name == name:
            return "python -m sglang.launch_server " + shlex.join(c.args)
    return None


def format_report(candidates: list, servers: list[dict], settings, analysis: dict, stopped: str,
                  concurrency: int) -> str:
    lines = []
    run = measured(servers)
    lines.append(f"tune-spec: {len(run)} server(s) measured"
                 f"{' after one warm-up server' if any(s.get('warmup') for s in servers) else ''};"
                 f" stopped: {stopped}")
    for s in run:
        if not s.get("ok"):
            lines.append(f"  server {s['index']} ({s['candidate']}) FAILED: {s.get('failure')}")
    for workload, result in analysis.items():
        where = f" at concurrency {concurrency}" if workload == "batch" else " at concurrency 1 (1000 / mean TPOT)"
        lines.append("")
        lines.append(f"{result['label']}{where}")
        lines.append(f"  {'candidate':<10} {'predicted':>10} {'measured':>10} {'95% interval (n>=3)':>21}"
                     f" {'min-max':>19} {'n':>3}  note")
        for row in result["rows"]:
            interval = row["interval"]
            cell = "-" if not interval or row["n"] < 3 else f"[{interval[0]:.1f}-{interval[1]:.1f}]"
            spread = f"{min(row['values']):.1f}-{max(row['values']):.1f}" if row["n"] >= 2 else "-"
            note = "FAILED" if row["failed"] else ("leader" if row["candidate"] == _top(result) else "")
            if row["predicted"] is not None and row["measured"] is not None:
                note = (note + " " if note else "") + f"measured/predicted {row['measured'] / row['predicted']:.3f}"
            lines.append(f"  {row['candidate']:<10} {_num(row['predicted']):>10} {_num(row['measured']):>10}"
                         f" {cell:>21} {spread:>19} {row['n']:>3}  {note}")
        model = result["model"]
        if model["accept_at_least"]:
            shares = "  ".join(f"{j + 1}: {a * 100:.1f}%" for j, a in enumerate(model["accept_at_least"]))
            lines.append(f"  accepted at least j drafts, over the deepest chain's verifies ({model['acceptance_source']},"
                         f" {model['requests']} request(s)): {shares}")
        if model["tau_ms"]:
            lines.append(f"  step time per request-verify: {model['tau_ms']['alpha']:.3f} +"
                         f" {model['tau_ms']['beta']:.3f} ms per draft step (chains measured at"
                         f" {', '.join(map(str, model['depths_measured']))} steps)")
        else:
            lines.append("  no model: it needs two chains of different depth measured")
        lines.append(f"  verdict: {result['verdict']}")
        if result["no_speculation_best"]:
            be = result["break_even"]
            detail = (f"; {be['candidate']} would need {be['needed_tokens_per_verify']:.2f} tokens per verify at"
                      f" this box's costs, its drafter gives {be['measured_tokens_per_verify']:.2f}"
                      if be and be["needed_tokens_per_verify"] and be["measured_tokens_per_verify"] else "")
            lines.append(f"  speculation does not pay here: no speculative candidate beat no speculation{detail}")
        line = launch_line(candidates, result["recommended"])
        if line:
            lines.append(f"  launch ({result['recommended']}): {line}")
    return "\n".join(lines)


def _top(result: dict) -> str | None:
    ranked = sorted(result["estimates"].items(), key=lambda kv: -kv[1]["value"])
    return ranked[0][0] if ranked else None


def write_chart(analysis: dict, path) -> str:
    """Predicted and measured figure against the steps, one panel per workload; 'skipped: ...' without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "skipped (matplotlib is not installed)"
    fig, axes = plt.subplots(1, len(analysis), figsize=(6 * len(analysis), 4), squeeze=False)
    for ax, (workload, result) in zip(axes[0], analysis.items()):
        rows = [r for r in result["rows"] if r["kind"] in ("none", "chain")]
        xs = [r["steps"] or 0 for r in rows]
        predicted = [(x, r["predicted"]) for x, r in zip(xs, rows) if r["predicted"] is not None]
        if predicted:
            ax.plot(*zip(*predicted), "o--", color="grey", label="predicted")
        for x, r in zip(xs, rows):
            for v in r["values"]:
                ax.plot([x], [v], "x", color="tab:blue")
        ax.set_xlabel("draft steps (0: no speculation)")
        ax.set_ylabel(result["label"])
        ax.set_title(result["verdict"][:70], fontsize=8)
        ax.legend(["predicted", "measured"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
