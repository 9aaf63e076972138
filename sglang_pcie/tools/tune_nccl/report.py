"""What tune-nccl tells: the tables on stdout (latency per profile and size, with each profile's verdict, and the
communication per forward pass they predict) and the tuned file's content (the winner, every run, the rule)."""
from __future__ import annotations

import time

from sglang_pcie.runtime import tuned_file
from sglang_pcie.tools.tune_nccl import verdict as rule
from sglang_pcie.tools.tune_nccl.launch import format_us
from sglang_pcie.tools.tune_nccl.measure import IPC_NAME, allreduces_per_graph
from sglang_pcie.tools.tune_nccl.sweep import Sweep


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def verdict_note(sweep: Sweep, name: str) -> str:
    verdict = sweep.verdict
    if name == verdict.winner:
        if name == "default":
            return "winner (NCCL defaults: nothing set)"
        return f"winner: faster at {', '.join(map(str, verdict.faster.get(name, [])))} tok"
    if name == "default":
        return "baseline"
    if name in sweep.errors:  # a failure in any run drops the profile; its first error says why
        return f"dropped: {sweep.errors[name]}"
    return verdict.rejected.get(name) or "qualified"


def _variables(values: dict) -> str:
    return " ".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in values.items()) or "(none)"


def render_table(sweep: Sweep, profiles: dict, tokens: list[int], layers: int, ipc: dict | None = None) -> str:
    verdict = sweep.verdict
    header = ["profile", "variables", *[f"{t} tok" for t in tokens], "verdict"]
    latency, per_pass = [header], [["profile", *[f"{t} tok" for t in tokens]]]
    for name in profiles:
        runs = sweep.measured.get(name, [])
        if not runs:
            continue
        values = verdict.worst.get(name)
        note = verdict_note(sweep, name) + (f" ({len(runs)} runs)" if len(runs) > 1 else "")
        cells = [f"{values[t]:.1f}" if values else "-" for t in tokens]
        latency.append([name, _variables(profiles[name]), *cells, note])
        if values:
            per_pass.append([name, *[f"{2 * layers * values[t] / 1e3:.2f}" for t in tokens]])
    if ipc and ipc.get("runs"):
        worst = ipc.get("worst") or {}
        cells = [format_us(worst.get(str(t))) for t in tokens]
        latency.append([IPC_NAME, f"FlashInfer {ipc.get('flashinfer') or '?'}", *cells,
                        f"{ipc['verdict']} ({len(ipc['runs'])} runs)"])
    noise = " ".join(f"{t}:{verdict.noise[t]:.0%}" for t in tokens)
    return (f"All-reduce latency, microseconds (defaults: best run; others: worst run). Noise bound per size "
            f"(spread of the defaults' first and last run, at least {rule.MIN_NOISE:.0%}): {noise}\n\n"
            f"{markdown(latency)}\n\n"
            f"Predicted communication per forward pass (2 x {layers} layers x latency), milliseconds\n\n"
            f"{markdown(per_pass)}\n")


def rule_text(sizes: list[int], args, world: int) -> str:
    """The winner rule, as the tuned file records it."""
    return (f"measured at {', '.join(map(str, sizes))} tokens x {args.hidden} {args.dtype} over {world} ranks "
            f"in CUDA graphs; a candidate's slowest run is never slower than NCCL's defaults' fastest run "
            f"beyond the noise (the spread of the defaults' first and last run at that size, at least "
            f"{rule.MIN_NOISE:.0%}) at any of these sizes, and faster beyond it at one or more; the winner "
            f"has the largest mean relative gain and is confirmed by {rule.CONFIRM_RUNS} runs")


def tuned_config(sweep: Sweep, profiles: dict, spec: dict, args, world: int, fingerprint: dict, ipc: dict,
                 wall_s: float) -> dict:
    """The tuned file's content: the winner's variables, the fingerprint, the rule, every run and the IPC section."""
    verdict = sweep.verdict
    sizes = spec["tokens"]
    return {
        "format": tuned_file.FORMAT,
        "fingerprint": fingerprint,
        "winner": verdict.winner,
        "values": profiles[verdict.winner],
        "rule": rule_text(sizes, args, world),
        "guarantee_sizes": sizes,
        "measured": {"backend": args.backend, "tp": world, "hidden": args.hidden, "dtype": args.dtype,
                     "layers": args.layers, "tokens": args.tokens, "prefill_tokens": args.prefill_tokens,
                     "allreduces_per_graph": {str(t): allreduces_per_graph(spec, t) for t in sizes},
                     "torch_nccl": sweep.info.get("nccl"), "device": sweep.info.get("device"),
                     "noise": {str(t): round(verdict.noise[t], 4) for t in sizes},
                     "sweep_s": round(sweep.wall_s, 1), "wall_s": round(wall_s, 1),
                     "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "table": {name: {"values": profiles[name],
                         "runs": [{str(t): round(us, 2) for t, us in run.items()} if run else None
                                  for run in sweep.measured[name]],
                         "verdict": verdict_note(sweep, name)}
                  for name in sweep.measured},
        "ipc": ipc,
    }
