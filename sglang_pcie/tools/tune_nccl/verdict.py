"""tune-nccl's winner rule: which measured NCCL profile (if any) beats NCCL's defaults, and where the PCIe-IPC
all-reduce beats the NCCL a server would run."""
from __future__ import annotations

from dataclasses import dataclass, field

# Noise is bounded per size by the spread between the defaults' runs (the first and the last run of the sweep,
# so drift over the sweep counts), and never taken as less than MIN_NOISE.
MIN_NOISE = 0.03
CONFIRM_RUNS = 2


@dataclass
class Verdict:
    winner: str  # "default" when nothing qualified
    baseline: dict  # tokens -> microseconds: the defaults' best run at each size
    noise: dict  # tokens -> relative noise bound at that size
    qualified: list = field(default_factory=list)  # candidate names, best first
    rejected: dict = field(default_factory=dict)  # name -> why
    pending: str | None = None  # best qualifier still short of CONFIRM_RUNS runs: run it again
    worst: dict = field(default_factory=dict)  # name -> tokens -> microseconds used for the decision
    faster: dict = field(default_factory=dict)  # qualified name -> sizes where it beats the defaults
    gain: dict = field(default_factory=dict)  # qualified name -> mean relative gain over all sizes


def noise_bounds(default_runs: list[dict]) -> tuple[dict, dict]:
    """(baseline, noise) per size from the defaults' successful runs: the fastest run, and the relative spread
    between their fastest and slowest run, at least MIN_NOISE."""
    sizes = sorted(default_runs[0])
    baseline = {s: min(run[s] for run in default_runs) for s in sizes}
    noise = {s: max(MIN_NOISE, (max(run[s] for run in default_runs) - baseline[s]) / baseline[s]
                    if baseline[s] > 0 else 0.0) for s in sizes}
    return baseline, noise


def compare(worst: dict, baseline: dict, noise: dict) -> tuple[list, list]:
    """(sizes where ``worst`` is slower than ``baseline`` beyond the noise, sizes where it is faster beyond it)."""
    slower = [s for s in sorted(baseline) if worst[s] > baseline[s] * (1 + noise[s])]
    faster = [s for s in sorted(baseline) if worst[s] < baseline[s] * (1 - noise[s])]
    return slower, faster


def choose(measured: dict, profiles: dict, confirm_runs: int = CONFIRM_RUNS) -> Verdict:
    """Pick the winner from ``measured``: profile name -> list of runs, each {tokens: microseconds} or None
    (failed). ``profiles``: name -> the variables it sets (ties go to the one that sets fewer).

    The rule, built never to pick something slower than NCCL's defaults at a measured size:
    - the baseline is the defaults' fastest run at each size; the noise bound at each size is the relative
      spread between the defaults' runs (first and last of the sweep), at least MIN_NOISE;
    - a candidate is judged on its slowest run at each size, and a candidate that failed any run is out;
    - it is out if it is slower than the baseline beyond the noise at any size, and it qualifies only if it is
      faster beyond the noise at one size or more (where it claims to beat the defaults, it does);
    - qualifiers rank by their mean relative gain over all sizes (each size counts the same, so prefill sizes
      do not drown the decode ones), then by fewer variables, then by name; the winner is the best one measured
      at least ``confirm_runs`` times (``pending`` names a better one that still needs a run).
    Raises ValueError when the defaults have no successful run: there is nothing to compare against.
    """
    default_runs = [run for run in measured.get("default", []) if run]
    if not default_runs:
        raise ValueError("NCCL defaults could not be measured")
    baseline, noise = noise_bounds(default_runs)
    sizes = sorted(baseline)
    verdict = Verdict("default", baseline, noise)
    verdict.worst["default"] = baseline

    for name, runs in measured.items():
        if name == "default":
            continue
        if not runs or any(run is None for run in runs):
            verdict.rejected[name] = "failed in a repeat run" if any(runs) else "failed"
            continue
        if any(s not in run for run in runs for s in sizes):
            verdict.rejected[name] = "missing sizes"
            continue
        worst = {s: max(run[s] for run in runs) for s in sizes}
        verdict.worst[name] = worst
        slower, faster = compare(worst, baseline, noise)
        if slower:
            s = slower[0]
            verdict.rejected[name] = (f"slower than defaults at {s} tok ({worst[s]:.1f} vs {baseline[s]:.1f} us,"
                                      f" noise {noise[s]:.0%})"
                                      + (f" and {len(slower) - 1} more sizes" if len(slower) > 1 else ""))
            continue
        if not faster:
            verdict.rejected[name] = "not faster than defaults beyond the noise at any size"
            continue
        verdict.faster[name] = faster
        verdict.gain[name] = sum(1 - worst[s] / baseline[s] for s in sizes) / len(sizes)

    gain = verdict.gain
    verdict.qualified = sorted(gain, key=lambda n: (-gain[n], len(profiles.get(n, {})), n))
    for name in verdict.qualified:
        if len(measured[name]) >= confirm_runs:
            verdict.winner = name
            break
        if verdict.pending is None:
            verdict.pending = name
    return verdict


def ipc_verdict(nccl_us: dict, noise: dict, ipc_runs: list) -> dict:
    """Per size, whether the PCIe-IPC all-reduce beats the NCCL the server would run (``nccl_us``: the winner's
    figures) beyond the noise, judged on IPC's slowest run; and the largest size up to which it wins at every
    measured size (``max_tokens``, None when it loses at the smallest). A failed run means no win anywhere; a
    size the kernels refuse (None) is not a win."""
    sizes = sorted(s for s in nccl_us if s in noise)
    good = [run for run in ipc_runs if run]
    if not good or len(good) != len(ipc_runs) or any(s not in run for run in good for s in sizes):
        return {"wins": {}, "max_tokens": None, "worst": {}}
    # None: a size the kernels refused in some run; it never counts as a win
    worst = {s: None if any(run[s] is None for run in good) else max(run[s] for run in good) for s in sizes}
    wins = {s: worst[s] is not None and worst[s] < nccl_us[s] * (1 - noise[s]) for s in sizes}
    max_tokens = None
    for s in sizes:
        if not wins[s]:
            break
        max_tokens = s
    return {"wins": wins, "max_tokens": max_tokens, "worst": worst}
