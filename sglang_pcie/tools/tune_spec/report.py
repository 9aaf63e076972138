"""What tune-spec says: per concurrency level a table (candidate, predicted, measured median with its interval, n,
note), the verdict and the measured answer there; the tuned table and its proof; one recommendation and the launch
to paste. Every answer is a measured candidate's: a candidate the model rates higher but no server measured is
named beside the answer, with the servers it would take, never answered with."""
from __future__ import annotations

import statistics

from sglang_pcie.tools.bench.verdicts import t_quantile
from sglang_pcie.tools.tune_spec import table as tables
from sglang_pcie.tools.tune_spec.answer import analyse_proof, recommend
from sglang_pcie.tools.tune_spec.candidates import NONE
from sglang_pcie.tools.tune_spec.model import label, log_interval
from sglang_pcie.tools.tune_spec.search import (best_measured, compare, drift, estimates, failed, level_name,
                                                measured, models, plan_table, values)


def _num(value, digits=1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(ratio) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


def analyse(candidates: list, servers: list[dict], settings, mean_server_s: float | None = None) -> dict:
    """Per level: rows, the comparison of the two best measured, the verdict, the measured answer and what the model
    rates higher unmeasured; the proof; the recommendation."""
    run = measured(servers)
    fitted = models(run, settings.levels)
    out = {"levels": {}}
    for level in settings.levels:
        out["levels"][str(level)] = _level(candidates, run, settings, level, fitted[level], mean_server_s)
    out["proof"] = analyse_proof(candidates, run, settings)
    table = plan_table(candidates, run, settings) if out["proof"] is None else None
    out["table"] = None if table is None else {"buckets": {str(k): v for k, v in table.buckets.items()},
                                               "notes": table.notes, "fixed": table.fixed,
                                               "needed": "tuned" in table.members}
    out["recommendation"] = recommend(candidates, run, settings, out)
    out["servers_by_role"] = {role: sum(1 for s in run if s.get("role") == role)
                              for role in dict.fromkeys(s.get("role") for s in run)}
    return out


def _level(candidates, run, settings, level, model, mean_server_s) -> dict:
    rows = []
    for c in candidates:
        got = values(run, c.name, level)
        rows.append({"candidate": c.name, "steps": c.steps, "kind": c.kind,
                     "predicted": model.predict(c.steps) if c.modelled else None,
                     "measured": statistics.median(got) if got else None,
                     "interval": log_interval(got, t_quantile), "values": got, "n": len(got),
                     "failed": c.name in failed(run)})
    ranked = best_measured(run, [c.name for c in candidates], level)
    comparison = compare(run, level, ranked[0], ranked[1], settings.resolve) if len(ranked) >= 2 else None
    answer = ranked[0] if ranked else None
    if comparison and comparison["verdict"] == "within" and settings.current in ranked[:2]:
        answer = settings.current  # equal within the target: keep what the user runs
    best = statistics.median(values(run, ranked[0], level)) if ranked else None
    higher = {n: v for n, (v, how) in estimates(candidates, run, level, model).items()
              if how == "predicted" and best is not None and v > best}
    gone = failed(run)
    # what no server measured and the model cannot predict (SGLang's adaptive steps, the user's own table or
    # setting): it may lead by any amount, so the answer names it (the table written by this run is the proof's)
    unpredicted = [c.name for c in candidates if not c.modelled and c.kind != "tuned" and c.name not in gone
                   and not values(run, c.name, level)]
    return {"label": label(level), "rows": rows, "comparison": comparison, "answer": answer,
            "verdict": verdict_line(ranked, comparison, settings),
            "drift": drift(run, level, settings.resolve, len(settings.levels)),
            "model": model.as_dict([c.steps for c in candidates if c.modelled]),
            "unmeasured_higher": {n: {"predicted": v, "servers": 1,
                                      "minutes": None if mean_server_s is None else mean_server_s / 60}
                                  for n, v in sorted(higher.items(), key=lambda kv: -kv[1])},
            "unmeasured_unpredicted": {n: {"servers": 1, "minutes": None if mean_server_s is None
                                           else mean_server_s / 60} for n in unpredicted},
            "no_speculation_best": answer == NONE,
            "break_even": _break_even(model, candidates) if answer == NONE else None}


def verdict_line(ranked: list[str], comparison: dict | None, settings) -> str:
    target = f"{settings.resolve * 100:g}%"
    if not ranked:
        return "no candidate has a measured figure: every server failed"
    if comparison is None:
        return f"{ranked[0]} is the only candidate measured"
    lead, runner, n = comparison["leader"], comparison["runner_up"], comparison["pairs"]
    low_high = comparison["interval"]
    # the search's looks are at 99%, a proof's fixed design at 95%: the line says which, beside the 95% of each
    # candidate's own interval in the table above it
    level_of = f"{comparison['confidence'] * 100:g}% interval: " if comparison.get("confidence") else ""
    interval = (f" [{level_of}{_pct(low_high[0])} to {_pct(low_high[1])}]"
                if low_high and low_high[1] / low_high[0] <= 2
                else " [interval wider than 2x: nothing resolved]" if low_high else "")
    band = f", noise band +-{comparison['noise_margin'] * 100:.1f}%" if comparison["noise_margin"] else ""
    if comparison["verdict"] == "best":
        return f"{lead} is best by {_pct(comparison['median'])}{interval} over {runner} ({n} pairs{band})"
    if comparison["verdict"] == "within":
        return (f"{lead} and {runner} are within {target}: either ({_pct(comparison['median'])}{interval}, {n} pairs"
                f"{band})")
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


def _break_even(model, candidates) -> dict | None:
    """Where no speculation leads: for the chain the model rates best, the accept length it would need here."""
    chains = [c for c in candidates if c.modelled and model.predict(c.steps) is not None]
    if not chains:
        return None
    best = max(chains, key=lambda c: model.predict(c.steps))
    return {"candidate": best.name, "needed_tokens_per_verify": model.break_even(best.steps),
            "measured_tokens_per_verify": model.tokens(best.steps)}




# ---------------------------------------------------------------------------------------------------- the text

def format_report(candidates: list, servers: list[dict], settings, analysis: dict, stopped: str,
                  release: str | None = None, warmup: dict | None = None) -> str:
    """``warmup``: the run's warm-up server as the driver keeps it (``state["warmup"]``), None where none ran."""
    run = measured(servers)
    roles = ", ".join(f"{role} {n}" for role, n in analysis["servers_by_role"].items())
    warmed = ""
    if warmup:
        warmed = f" after one warm-up server ({warmup['candidate']}"
        warmed += f", FAILED: {warmup.get('failure')})" if not warmup.get("ok") else ")"
    lines = [f"tune-spec: {len(run)} server(s) measured ({roles}){warmed}; stopped: {stopped}"]
    if release:
        lines.append(f"release: {release}")
    lines += [f"  server {s['index']} ({s['candidate']}) FAILED: {s.get('failure')}" for s in run if not s.get("ok")]
    for level in settings.levels:
        lines += [""] + _level_lines(analysis["levels"][str(level)], level)
    if analysis["proof"]:
        lines += [""] + proof_lines(analysis["proof"])
    elif analysis.get("table"):
        table = analysis["table"]
        buckets = {int(k): v for k, v in table["buckets"].items()}
        if table["needed"]:
            lines += ["", f"the table for this box ({tables.TABLE_FILE} in the run's folder): "
                      + "; ".join(tables.bucket_ranges(buckets)) + "; NOT measured (no proof ran: --prove 0, the"
                      " budget, or SGLang's own table left out): prove it with --resume DIR --prove 2"]
        elif any(len(steps) > 1 for steps in buckets.values()):  # SGLang's own buckets everywhere (plan_table)
            lines += ["", "no table needed: SGLang's own table measured fastest of the speculative settings at every"
                      " level"]
        else:
            lines += ["", f"no table needed: {table['fixed']} is the best measured fixed setting at every level"]
        lines += [f"  note: {n}" for n in table["notes"]]
    pick = analysis["recommendation"]
    lines += ["", f"recommendation: {pick['candidate'] or 'none measured'} ({pick['why']})"]
    if pick["launch"]:
        lines.append(f"launch: {pick['launch']}")
    return "\n".join(lines)


def _level_lines(result: dict, level: int) -> list[str]:
    lines = [result["label"],
             f"  {'candidate':<10} {'predicted':>10} {'measured':>10} {'95% interval (n>=3)':>21} {'min-max':>19}"
             f" {'n':>3}  note"]
    unpredicted = result.get("unmeasured_unpredicted", {})
    for row in result["rows"]:
        if row["n"] == 0 and row["predicted"] is None and not row["failed"] and row["candidate"] not in unpredicted:
            continue
        interval = row["interval"]
        cell = "-" if not interval or row["n"] < 3 else f"[{interval[0]:.1f}-{interval[1]:.1f}]"
        spread = f"{min(row['values']):.1f}-{max(row['values']):.1f}" if row["n"] >= 2 else "-"
        note = "FAILED" if row["failed"] else ("answer" if row["candidate"] == result["answer"] else
                                               "NOT measured: the model cannot predict it"
                                               if row["candidate"] in unpredicted else "")
        if row["predicted"] is not None and row["measured"] is not None:
            note = (note + " " if note else "") + f"measured/predicted {row['measured'] / row['predicted']:.3f}"
        lines.append(f"  {row['candidate']:<10} {_num(row['predicted']):>10} {_num(row['measured']):>10}"
                     f" {cell:>21} {spread:>19} {row['n']:>3}  {note}")
    model = result["model"]
    if model["cannot_predict"]:
        lines.append(f"  the model cannot predict: {model['cannot_predict']}")
    else:
        shares = "  ".join(f"{j + 1}: {a * 100:.1f}%" for j, a in enumerate(model["accept_at_least"] or []))
        lines.append(f"  accepted at least j drafts, deepest chain ({model['acceptance_source']},"
                     f" {model['requests']} request(s)): {shares}")
        lines.append(f"  step time per request-verify: {model['tau_ms']['alpha']:.3f} + {model['tau_ms']['beta']:.3f}"
                     f" ms per draft step (chains measured at {', '.join(map(str, model['depths_measured']))} steps)")
    lines.append(f"  verdict: {result['verdict']}")
    moved = result.get("drift")
    if moved and moved["resolved"]:
        low, high = moved["interval"]
        lines.append(f"  drift: each candidate's last server ran {_pct(1 + moved['change'])} against its first on"
                     f" average [{moved['confidence'] * 100:.4g}% interval: {_pct(1 + low)} to {_pct(1 + high)};"
                     f" {moved['candidates']} candidates, from {_pct(1 + moved['smallest'])} to"
                     f" {_pct(1 + moved['largest'])}]: this host's speed changed during the run; pairs cancel a"
                     " steady drift, not a step: find what else ran here, rerun")
    among = f", among those measured; {', '.join(unpredicted)} not measured" if unpredicted and result["answer"] else ""
    lines.append(f"  answer at {level_name(level)}: {result['answer'] or '-'} (measured{among})")
    for name, more in unpredicted.items():
        cost = f", about {more['minutes']:.1f} min" if more["minutes"] else ""
        lines.append(f"  not measured: {name}, which the model cannot predict: it may lead by any amount; one server"
                     f"{cost} would tell (--resume DIR --max-servers N)")
    for name, more in result["unmeasured_higher"].items():
        cost = f", about {more['minutes']:.1f} min" if more["minutes"] else ""
        lines.append(f"  not measured: {name}, predicted {more['predicted']:.1f}, above the answer; one server"
                     f"{cost} would tell (the answer stays the measured one)")
    if result["no_speculation_best"] and result["break_even"]:
        be = result["break_even"]
        if be["needed_tokens_per_verify"] and be["measured_tokens_per_verify"]:
            lines.append(f"  speculation does not pay here: {be['candidate']} would need"
                         f" {be['needed_tokens_per_verify']:.2f} tokens per verify at this box's costs, its drafter"
                         f" gives {be['measured_tokens_per_verify']:.2f}")
    return lines


def proof_lines(proof: dict) -> list[str]:
    buckets = {int(k): v for k, v in proof["buckets"].items()}
    lines = [f"the table for this box: {'; '.join(tables.bucket_ranges(buckets))} (SGLang pads a batch to a"
             " CUDA-graph batch size before it picks the bucket)"]
    lines += [f"  note: {n}" for n in proof["notes"]]
    lines.append(f"proof: {', '.join(proof['members'])} ({proof['fixed']} is the best fixed setting: geometric mean"
                 f" {proof['fixed_share']:.3f} of the best per level); {proof['repeats_run']} of"
                 f" {proof['repeats_planned']} repeat(s) run; 95% intervals over the pairs, an effect called only"
                 " beyond the proof servers' own spread")
    if proof["failed"]:
        lines.append(f"  FAILED: {', '.join(proof['failed'])}: the proof is incomplete")
    for level, rows in proof["rows"].items():
        edge = "" if int(level) in proof["main_levels"] else " (edge)"
        cells = []
        for row in rows:
            interval = (f" [{_pct(row['interval'][0])} to {_pct(row['interval'][1])}]"
                        if row["interval"] and row["interval"][1] / row["interval"][0] <= 2 else "")
            ratio = _pct(row["median"]) if row["median"] else "-"
            cells.append(f"{row['a']}/{row['b']} {ratio}{interval} {row['verdict']}")
        lines.append(f"  c={level}{edge}: " + "; ".join(cells))
    return lines


def write_chart(analysis: dict, path) -> str:
    """Measured figures per candidate at each level (one panel per level); 'skipped: ...' without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "skipped (matplotlib is not installed)"
    levels = analysis["levels"]
    fig, axes = plt.subplots(1, len(levels), figsize=(5 * len(levels), 4), squeeze=False)
    for ax, (level, result) in zip(axes[0], levels.items()):
        rows = [r for r in result["rows"] if r["values"] or r["predicted"] is not None]
        for x, r in enumerate(rows):
            ax.plot([x] * len(r["values"]), r["values"], "x", color="tab:blue")
            if r["predicted"] is not None:
                ax.plot([x], [r["predicted"]], "o", color="grey", fillstyle="none")
        ax.set_xticks(range(len(rows)), [r["candidate"] for r in rows], rotation=45, fontsize=7)
        ax.set_ylabel(result["label"])
        ax.set_title(f"c={level}: answer {result['answer']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
