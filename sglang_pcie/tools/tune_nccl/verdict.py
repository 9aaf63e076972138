"""tune-nccl's winner rule: which measured NCCL profile (if any) beats NCCL's defaults, and where the PCIe-IPC
all-reduce beats the NCCL a server would run. Built never to pick something slower than the defaults:

- the defaults run DEFAULT_RUNS times, spread through the sweep (first, middle, last), so that drift shows; at each
  size the **baseline** is their median and the **spread** the second-largest deviation from it (one outlier run,
  slow or fast, moves neither), relative to the median; the **noise** bound is the spread, at least MIN_NOISE;
- fewer usable defaults runs than DEFAULT_RUNS, or a spread above MAX_NOISE at any size: **too noisy to decide**,
  NCCL's defaults are kept and the verdict says why;
- a candidate is judged on its **slowest** run at each size; a failed or malformed run drops it;
- it never wins if it is slower than the baseline by more than SLOWER_TOLERANCE at any size: a fixed limit that no
  measured noise widens;
- it qualifies only if its slowest run beats the defaults' **fastest** run by more than the noise at one size or
  more, and its mean relative gain over all sizes (each size counts the same) is above zero;
- qualifiers rank never-slower first (slowest run at or below the baseline at every size), then by mean gain, then
  by their worst ratio to the baseline, then by fewer variables; the winner is the best one measured at least
  CONFIRM_RUNS times (``pending`` names a better one that still needs a run).

Measurements are taken as given, never trusted: a run that is not a mapping with a positive finite number of
microseconds at every size is unusable (one line says which size and what it held), never a KeyError.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

DEFAULT_RUNS = 3
MIN_NOISE = 0.03
MAX_NOISE = 0.10
SLOWER_TOLERANCE = 0.03
CONFIRM_RUNS = 2


@dataclass
class Verdict:
    winner: str  # "default" when nothing qualified, or when undecided
    baseline: dict  # tokens -> microseconds: the median of the defaults' usable runs
    noise: dict  # tokens -> relative noise bound (the spread, at least MIN_NOISE); None where not measurable
    sizes: list = field(default_factory=list)  # the sizes judged: the guarantee covers exactly these
    spread: dict = field(default_factory=dict)  # tokens -> the defaults' robust relative spread, as measured
    undecided: str | None = None  # why nothing was decided (too noisy, too few defaults runs): defaults kept
    reason: str = ""  # one line: why the winner won (or the defaults were kept)
    qualified: list = field(default_factory=list)  # candidate names, best first
    rejected: dict = field(default_factory=dict)  # name -> why
    pending: str | None = None  # best qualifier still short of CONFIRM_RUNS runs: run it again
    worst: dict = field(default_factory=dict)  # name -> tokens -> microseconds used for the decision
    fastest: dict = field(default_factory=dict)  # name -> tokens -> its fastest run's microseconds
    faster: dict = field(default_factory=dict)  # qualified name -> sizes where it beats the defaults
    gain: dict = field(default_factory=dict)  # judged name -> mean relative gain over all sizes
    worst_ratio: dict = field(default_factory=dict)  # judged name -> max over sizes of worst / baseline


def usable(value) -> bool:
    """A figure of microseconds: a real, finite, positive number."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value > 0)


def run_problem(run, sizes: list) -> str | None:
    """Why ``run`` is no measurement at every one of ``sizes`` (None when it is)."""
    if run is None:
        return "failed"
    if not isinstance(run, dict):
        return f"not a measurement ({type(run).__name__})"
    for size in sizes:
        if size not in run:
            return f"no figure at {size} tok"
        if not usable(run[size]):
            return f"{run[size]!r} us at {size} tok"
    return None


def robust_spread(values: list, center: float) -> float:
    """The second-largest absolute deviation from ``center``, relative to it: one outlier does not move it."""
    deviations = sorted((abs(v - center) for v in values), reverse=True)
    return (deviations[1] if len(deviations) > 1 else 0.0) / center


def _sizes(default_runs: list) -> list:
    return sorted({s for run in default_runs if isinstance(run, dict) for s in run
                   if isinstance(s, int) and not isinstance(s, bool)})


def _defaults(default_runs: list, sizes: list, verdict: Verdict) -> None:
    """The baseline, spread and noise from the defaults' usable runs, and ``undecided`` where they cannot bound the
    noise. Raises ValueError (one line) when no run is usable: there is nothing to compare against."""
    problems = [(i, run_problem(run, sizes)) for i, run in enumerate(default_runs, 1)]
    good = [run for run, (_, problem) in zip(default_runs, problems) if problem is None]
    first_bad = next((f"run {i}: {problem}" for i, problem in problems if problem), None)
    if not sizes or not good:
        raise ValueError("NCCL defaults could not be measured" + (f" ({first_bad})" if first_bad else ""))
    verdict.baseline = {s: statistics.median(run[s] for run in good) for s in sizes}
    verdict.fastest["default"] = {s: min(run[s] for run in good) for s in sizes}
    verdict.worst["default"] = verdict.baseline
    if len(good) < DEFAULT_RUNS:
        verdict.noise = {s: None for s in sizes}
        verdict.undecided = (f"too few defaults runs to bound the noise: {len(good)} of {len(default_runs)} usable, "
                             f"{DEFAULT_RUNS} needed" + (f" ({first_bad})" if first_bad else ""))
        return
    verdict.spread = {s: robust_spread([run[s] for run in good], verdict.baseline[s]) for s in sizes}
    verdict.noise = {s: max(MIN_NOISE, verdict.spread[s]) for s in sizes}
    noisy = [s for s in sizes if verdict.spread[s] > MAX_NOISE]
    if noisy:
        worst = max(noisy, key=lambda s: verdict.spread[s])
        verdict.undecided = (f"too noisy to decide: the defaults' {len(good)} runs spread {verdict.spread[worst]:.1%} "
                             f"at {worst} tok" + (f" (and more than {MAX_NOISE:.0%} at {len(noisy) - 1} more sizes)"
                                                 if len(noisy) > 1 else f" (more than {MAX_NOISE:.0%})"))


def _judge(name: str, runs, verdict: Verdict) -> None:
    """Reject ``name`` with the reason, or record it as qualified (its faster sizes, gain and worst ratio)."""
    sizes, baseline, noise = verdict.sizes, verdict.baseline, verdict.noise
    if not isinstance(runs, list) or not runs or all(run is None for run in runs):
        verdict.rejected[name] = "failed"
        return
    problems = [(i, run_problem(run, sizes)) for i, run in enumerate(runs, 1)]
    if any(run is None for run in runs):
        verdict.rejected[name] = "failed in a repeat run"
        return
    bad = next(((i, problem) for i, problem in problems if problem), None)
    if bad:
        verdict.rejected[name] = f"unusable measurement (run {bad[0]}: {bad[1]})"
        return
    worst = {s: max(run[s] for run in runs) for s in sizes}
    verdict.worst[name] = worst
    verdict.fastest[name] = {s: min(run[s] for run in runs) for s in sizes}
    ratio = {s: worst[s] / baseline[s] for s in sizes}
    verdict.worst_ratio[name] = max(ratio.values())
    verdict.gain[name] = sum(1 - r for r in ratio.values()) / len(sizes)
    slower = [s for s in sizes if ratio[s] > 1 + SLOWER_TOLERANCE]
    if slower:
        s = slower[0]
        verdict.rejected[name] = (f"slower than defaults at {s} tok ({worst[s]:.1f} vs {baseline[s]:.1f} us, "
                                  f"+{ratio[s] - 1:.1%}; the limit is {SLOWER_TOLERANCE:.0%})"
                                  + (f" and {len(slower) - 1} more sizes" if len(slower) > 1 else ""))
        return
    if noise[sizes[0]] is None:
        verdict.rejected[name] = "not judged: the defaults' runs do not bound the noise"
        return
    faster = [s for s in sizes if worst[s] < verdict.fastest["default"][s] * (1 - noise[s])]
    if not faster:
        verdict.rejected[name] = "not faster than defaults beyond the noise at any size"
        return
    if verdict.gain[name] <= 0:
        verdict.rejected[name] = (f"slower on average: mean gain {verdict.gain[name]:+.1%} over {len(sizes)} sizes "
                                  f"(faster beyond the noise only at {', '.join(map(str, faster))} tok)")
        return
    verdict.faster[name] = faster


def _rank(verdict: Verdict, profiles: dict) -> list:
    """Never-slower qualifiers first, then by mean gain, worst ratio, fewer variables, name."""
    def key(name):
        ratio = verdict.worst_ratio[name]
        return ratio > 1, -verdict.gain[name], ratio, len(profiles.get(name, {})), name

    return sorted(verdict.faster, key=key)


def _reason(verdict: Verdict, measured: dict) -> str:
    if verdict.undecided:
        return f"NCCL's defaults kept: {verdict.undecided}"
    name = verdict.winner
    if name == "default":
        judged = len([n for n in measured if n != "default"])
        return (f"NCCL's defaults: none of the {judged} candidates is faster beyond the noise at one size or more "
                f"without being more than {SLOWER_TOLERANCE:.0%} slower at another or slower on average")
    never = "never slower than" if verdict.worst_ratio[name] <= 1 else f"at most {SLOWER_TOLERANCE:.0%} slower than"
    return (f"{name}: {never} NCCL's defaults at the {len(verdict.sizes)} sizes (worst {verdict.worst_ratio[name]:.3f}"
            f" x their median), faster beyond the noise at {', '.join(map(str, verdict.faster[name]))} tok, mean "
            f"gain {verdict.gain[name]:.1%}, {len(measured[name])} runs")


def choose(measured: dict, profiles: dict, sizes: list | None = None, confirm_runs: int = CONFIRM_RUNS) -> Verdict:
    """Pick the winner from ``measured``: profile name -> list of runs, each {tokens: microseconds} or None
    (failed). ``profiles``: name -> the variables it sets (ties go to the one that sets fewer). ``sizes``: the sizes
    to judge (default: every size a defaults run holds). The rule is the module's docstring.
    Raises ValueError (one line) when the defaults have no usable run: there is nothing to compare against."""
    default_runs = measured.get("default") or []
    default_runs = default_runs if isinstance(default_runs, list) else [default_runs]
    sizes = sorted(sizes) if sizes is not None else _sizes(default_runs)
    verdict = Verdict("default", {}, {}, sizes)
    _defaults(default_runs, sizes, verdict)
    for name, runs in measured.items():
        if name != "default":
            _judge(name, runs, verdict)
    verdict.qualified = _rank(verdict, profiles)
    if not verdict.undecided:
        for name in verdict.qualified:
            if len(measured[name]) >= confirm_runs:
                verdict.winner = name
                break
            if verdict.pending is None:
                verdict.pending = name
    verdict.reason = _reason(verdict, measured)
    return verdict


def ipc_verdict(nccl_us: dict, noise: dict, ipc_runs: list) -> dict:
    """Per size, whether the PCIe-IPC all-reduce beats the NCCL the server would run (``nccl_us``: the fastest run of
    the winning profile) by more than the noise, judged on IPC's slowest run; and the largest size up to which it
    wins at every measured size (``max_tokens``, None when it loses at the smallest). A failed run means no win
    anywhere; a size the kernels refuse (None), a malformed figure, or a noise that is unknown or above MAX_NOISE
    (listed in ``undecided``) is not a win."""
    sizes = sorted(s for s in nccl_us if s in noise)
    runs = ipc_runs if isinstance(ipc_runs, list) else []
    if not runs or any(not isinstance(run, dict) for run in runs):
        return {"wins": {}, "max_tokens": None, "worst": {}, "undecided": []}
    worst, wins, undecided = {}, {}, []
    for s in sizes:
        figures = [run.get(s) for run in runs]
        worst[s] = max(figures) if all(usable(v) for v in figures) else None
        bound = noise.get(s)
        if not (usable(bound) and bound <= MAX_NOISE):
            undecided.append(s)
        reference = nccl_us.get(s)
        wins[s] = (worst[s] is not None and s not in undecided and usable(reference)
                   and worst[s] < reference * (1 - max(MIN_NOISE, bound)))
    max_tokens = None
    for s in sizes:
        if not wins[s]:
            break
        max_tokens = s
    return {"wins": wins, "max_tokens": max_tokens, "worst": worst, "undecided": undecided}
