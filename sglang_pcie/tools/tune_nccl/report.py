"""What tune-nccl tells: the tables on stdout (latency per profile and size, with each profile's verdict, and the
communication per forward pass they predict) and the tuned file's content (the winner, every run, the rule)."""
from __future__ import annotations

import hashlib
import json
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
            kept = f"; {verdict.undecided}" if verdict.undecided else ""
            return f"winner (NCCL defaults: nothing set{kept})"
        return f"winner: faster at {', '.join(map(str, verdict.faster.get(name, [])))} tok"
    if name == "default":
        return "baseline"
    if name in sweep.errors:  # a failure in any run drops the profile; its first error says why
        return f"dropped: {sweep.errors[name]}"
    if name in verdict.rejected:
        return verdict.rejected[name]
    return "qualified, not chosen (defaults kept)" if verdict.undecided else "qualified"


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
    noise = " ".join(f"{t}:" + ("?" if verdict.noise.get(t) is None else f"{verdict.noise[t]:.0%}") for t in tokens)
    runs = len(sweep.measured.get("default", []))
    return (f"All-reduce latency, microseconds (defaults: median of their {runs} runs; others: slowest run). Noise "
            f"per size (the defaults' second-largest deviation from their median, at least {rule.MIN_NOISE:.0%}; "
            f"above {rule.MAX_NOISE:.0%} nothing is decided): {noise}\n\n"
            f"{markdown(latency)}\n\n"
            f"Predicted communication per forward pass (2 x {layers} layers x latency), milliseconds\n\n"
            f"{markdown(per_pass)}\n")


def rule_text(sizes: list[int], args, world: int) -> str:
    """The winner rule, as the tuned file records it."""
    nodes = f" on {args.nnodes} nodes" if args.nnodes > 1 else ""
    return (f"measured at {', '.join(map(str, sizes))} tokens x {args.hidden} {args.dtype} over {world} ranks{nodes} "
            f"in CUDA graphs. NCCL's defaults run {rule.DEFAULT_RUNS} times (first, middle and last of the sweep); at "
            f"each size the baseline is their median and the noise their second-largest deviation from it, at "
            f"least {rule.MIN_NOISE:.0%}; with fewer usable defaults runs, or a noise above {rule.MAX_NOISE:.0%} at "
            f"any size, nothing is decided and NCCL's defaults are kept. A candidate is judged on its slowest run: "
            f"it never wins if it is more than {rule.SLOWER_TOLERANCE:.0%} slower than the baseline at any of these "
            f"sizes (a fixed limit the noise never widens); it qualifies only if it beats the defaults' fastest run "
            f"by more than the noise at one size or more and its mean relative gain over the sizes is above zero; "
            f"qualifiers rank never slower than the baseline first, then by mean gain, worst ratio, fewer variables; "
            f"the winner is confirmed by {rule.CONFIRM_RUNS} runs. The PCIe-IPC all-reduce wins at a size only where "
            f"its slowest run beats the winning NCCL profile's fastest run by more than the noise there")


# The rule's fixed limits, recorded in the tuned file beside the figures they were applied to.
LIMITS = {"defaults_runs": rule.DEFAULT_RUNS, "min_noise": rule.MIN_NOISE, "max_noise": rule.MAX_NOISE,
          "slower_tolerance": rule.SLOWER_TOLERANCE, "confirm_runs": rule.CONFIRM_RUNS}


def _per_size(figures: dict, sizes: list[int], digits: int = 4) -> dict:
    return {str(t): None if figures.get(t) is None else round(figures[t], digits) for t in sizes}


def _rounded_run(run) -> dict | None:
    """A run as the file keeps it: microseconds to 0.01, None for a figure that is not one (and for a failed run)."""
    if not isinstance(run, dict):
        return None
    return {str(t): round(us, 2) if rule.usable(us) else None for t, us in run.items()}


def _judged(verdict, name: str) -> dict:
    """A candidate's worst ratio to the baseline and its mean gain, where it was judged that far."""
    if name not in verdict.gain:
        return {}
    return {"worst_ratio": round(verdict.worst_ratio[name], 4), "mean_gain": round(verdict.gain[name], 4)}


# The tuned file records the sha256 of its own content: the JSON of every other field, keys sorted, no spaces.
# Across nodes every node writes the same file, and says so with this digest.
CONTENT_DIGEST = "content_sha256"


def content_digest(config: dict) -> str:
    content = {key: value for key, value in config.items() if key != CONTENT_DIGEST}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _across_nodes(steps) -> dict:
    """What the measured section says about the nodes: how the ranks met, and every rank's node and device."""
    nodes = steps.nodes
    return {"count": nodes.count, "ranks_per_node": nodes.local, "ranks": steps.seen.get("ranks"),
            "rendezvous": f"{nodes.master_addr}:{nodes.master_port}", "join_timeout_s": nodes.join_timeout,
            "launcher": "torch.distributed.run (static rendezvous)"}


def tuned_config(sweep: Sweep, profiles: dict, spec: dict, args, world: int, fingerprint: dict, ipc: dict,
                 wall_s: float, steps=None) -> dict:
    """The tuned file's content: the winner's variables, the fingerprint, the rule, every run, the IPC section, and
    the digest of all that; across nodes (``steps``: nodes.NodeSteps) how the nodes ran it."""
    config = _content(sweep, profiles, spec, args, world, fingerprint, ipc, wall_s)
    if steps is not None:
        config["measured"]["nodes"] = _across_nodes(steps)
    config[CONTENT_DIGEST] = content_digest(config)
    return config


def _content(sweep: Sweep, profiles: dict, spec: dict, args, world: int, fingerprint: dict, ipc: dict,
             wall_s: float) -> dict:
    verdict = sweep.verdict
    sizes = spec["tokens"]
    return {
        "format": tuned_file.FORMAT,
        "fingerprint": fingerprint,
        "winner": verdict.winner,
        "values": profiles[verdict.winner],
        "rule": rule_text(sizes, args, world),
        "verdict": verdict.reason,
        "guarantee_sizes": sizes,
        "measured": {"backend": args.backend, "tp": world, "hidden": args.hidden, "dtype": args.dtype,
                     "layers": args.layers, "tokens": args.tokens, "prefill_tokens": args.prefill_tokens,
                     "allreduces_per_graph": {str(t): allreduces_per_graph(spec, t) for t in sizes},
                     "torch_nccl": sweep.info.get("nccl"), "device": sweep.info.get("device"),
                     "noise": _per_size(verdict.noise, sizes), "spread": _per_size(verdict.spread, sizes),
                     "baseline": _per_size(verdict.baseline, sizes, 2), "limits": LIMITS,
                     "sweep_s": round(sweep.wall_s, 1), "wall_s": round(wall_s, 1),
                     "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "table": {name: {"values": profiles[name],
                         "runs": [_rounded_run(run) for run in sweep.measured[name]],
                         "verdict": verdict_note(sweep, name),
                         **_judged(verdict, name)}
                  for name in sweep.measured},
        "ipc": ipc,
    }
