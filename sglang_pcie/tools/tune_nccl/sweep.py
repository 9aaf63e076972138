"""The sweep: every profile in fresh processes, NCCL's defaults at the start, the middle and the end (their runs
bound the noise, drift included), then repeat runs of the best qualifier until the verdict is confirmed. Across
nodes every node makes the same runs in the same order (``nodes.NodeSteps`` starts each one on this node)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from sglang_pcie.tools.tune_nccl import verdict as rule
from sglang_pcie.tools.tune_nccl.launch import format_run, progress, run_profile

MAX_CONFIRMATIONS = 2
# After the first run (which pays for a cold start) a profile may take this many times the defaults' run
# time, at least LATER_TIMEOUT_FLOOR seconds: a hanging profile then costs seconds, not the whole --timeout.
LATER_TIMEOUT_FACTOR = 4
LATER_TIMEOUT_FLOOR = 30.0


@dataclass
class Sweep:
    measured: dict = field(default_factory=dict)  # name -> list of runs ({tokens: us} or None)
    errors: dict = field(default_factory=dict)  # name -> first failure
    info: dict = field(default_factory=dict)
    verdict: rule.Verdict | None = None
    wall_s: float = 0.0


def later_timeout(timeout: float, first_wall_s: float) -> float:
    return min(timeout, max(LATER_TIMEOUT_FLOOR, LATER_TIMEOUT_FACTOR * first_wall_s))


class _Runner:
    """Runs one profile at a time, numbering the runs, and records each outcome in the sweep."""

    def __init__(self, sweep: Sweep, profiles: dict, spec: dict, world: int, timeout: float, command: list[str],
                 total: int, steps=None):
        self.sweep, self.profiles, self.spec, self.world, self.command = sweep, profiles, spec, world, command
        self.timeout, self.total, self.step, self.steps = timeout, total, 0, steps

    def run(self, name: str):
        self.step += 1
        variables = ' '.join(f'{k}={v}' for k, v in self.profiles[name].items()) or '(none)'
        progress(f"[{self.step}/{self.total}] {name:<14} {variables}")
        if self.steps is not None:  # across nodes: this node's part of a run every node makes
            outcome = self.steps.run(self.profiles[name], self.spec, self.timeout, name)
        else:
            outcome = run_profile(self.profiles[name], self.spec, self.world, self.timeout, self.command)
        progress(f"[{self.step}/{self.total}] {name:<14} {format_run(outcome)}")
        self.sweep.measured.setdefault(name, []).append(outcome.us)
        if outcome.error:
            self.sweep.errors.setdefault(name, outcome.error)
        self.sweep.info.update({k: v for k, v in outcome.info.items() if k in ("nccl", "device")})
        return outcome


def plan(profiles: dict) -> list[str]:
    """The runs in order: the candidates in rule.DEFAULT_RUNS - 1 even parts, the defaults before, between and after
    them (3 runs: first, middle, last)."""
    candidates = [n for n in profiles if n != "default"]
    parts = rule.DEFAULT_RUNS - 1
    order = []
    for part in range(parts):
        order += ["default", *candidates[len(candidates) * part // parts: len(candidates) * (part + 1) // parts]]
    return order + ["default"]


def run_sweep(profiles: dict, spec: dict, world: int, timeout: float, worker_command: list[str],
              steps=None) -> Sweep:
    """The runs of plan(), then repeat runs of the best qualifier until one is confirmed (verdict.choose). Without a
    usable first defaults run the sweep stops there, with no verdict. ``steps``: a nodes.NodeSteps across nodes."""
    sweep = Sweep()
    began = time.monotonic()
    order = plan(profiles)
    runner = _Runner(sweep, profiles, spec, world, timeout, worker_command, len(order), steps)
    first = runner.run(order[0])
    problem = rule.run_problem(first.us, spec["tokens"])
    if problem:  # nothing to compare against; the candidates would only burn time
        sweep.errors.setdefault("default", problem)
        sweep.wall_s = time.monotonic() - began
        return sweep
    runner.timeout = later_timeout(timeout, first.wall_s)
    for name in order[1:]:
        runner.run(name)
    for confirmations in range(MAX_CONFIRMATIONS + 1):
        sweep.verdict = rule.choose(sweep.measured, profiles, spec["tokens"])
        if sweep.verdict.pending is None or confirmations == MAX_CONFIRMATIONS:
            break
        runner.total += 1
        progress(f"confirming {sweep.verdict.pending} with a repeat run")
        runner.run(sweep.verdict.pending)
    sweep.wall_s = time.monotonic() - began
    return sweep
