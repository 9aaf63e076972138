"""The server's launch arguments (``check-drafter ... -- <launch_server arguments>``) against the drafter: the
speculative algorithm, and steps / topk / draft tokens against one another, as SGLang's server arguments resolve
them (read in 0.5.9's ``server_args.py`` and 0.5.23's ``arg_groups/speculative_hook.py``; the 0.5.9 rules run on
its real ``ServerArgs``).

- ``--speculative-algorithm EAGLE`` (or ``NEXTN``, its alias) with an EAGLE-3 drafter starts and serves, but the
  target captures no auxiliary hidden states and the drafter's d2t is not read: no draft is accepted (accept
  length 1.0, sglang #21272).
- ``--speculative-eagle-topk`` or ``--speculative-num-draft-tokens`` without ``--speculative-num-steps``: SGLang
  asserts they are unset (AssertionError at start); steps without topk: topk stays None and ``None > 1`` raises.
- topk 1: SGLang replaces the draft tokens by steps + 1 (a warning in the server log).
- topk > 1: the draft tree holds ``topk + (steps - 1) x topk^2`` candidates, of which SGLang's
  ``organize_draft_results`` takes the best ``num_draft_tokens - 1`` (torch.topk raises at the first decode when
  there are fewer).
"""
from __future__ import annotations

import os
from pathlib import Path

from sglang_pcie.tools.check_drafter.checkpoint import Checkpoint, draft_layer_ids
from sglang_pcie.tools.check_drafter.context import Context
from sglang_pcie.tools.check_drafter.report import FAIL, OK, WARN, Check

NAME = "launch args"
# The options read, each with its aliases; values are the last one given, as argparse keeps them.
OPTIONS = {
    "algorithm": ("--speculative-algorithm",),
    "steps": ("--speculative-num-steps",),
    "topk": ("--speculative-eagle-topk",),
    "draft_tokens": ("--speculative-num-draft-tokens",),
    "draft_path": ("--speculative-draft-model-path", "--speculative-draft-model"),
    "model_path": ("--model-path", "--model"),
    "token_map": ("--speculative-token-map",),
}
INTEGERS = ("steps", "topk", "draft_tokens")
EAGLE3_NAMES = ("EAGLE3",)
EAGLE_ALIASES = ("EAGLE", "NEXTN")  # NEXTN becomes EAGLE in SGLang's server arguments


def parse(arguments: list[str]) -> dict:
    """The options of OPTIONS found in ``arguments`` (``--name value`` or ``--name=value``), as strings."""
    found = {}
    names = {alias: key for key, aliases in OPTIONS.items() for alias in aliases}
    for position, word in enumerate(arguments):
        name, equals, value = word.partition("=")
        if name in names:
            if not equals:
                following = arguments[position + 1] if position + 1 < len(arguments) else None
                value = None if following is None or following.startswith("--") else following
            found[names[name]] = value
    return found


def is_eagle3_drafter(d: Checkpoint, ctx: Context) -> bool:
    archs = d.config.get("architectures") or []
    if ctx.facts is not None and archs and archs[0] in ctx.facts.entry_classes(eagle3_only=True):
        return True
    return draft_layer_ids(d) is not None or d.find("d2t") is not None or "Eagle3" in "".join(archs)


def check_launch_args(ctx: Context) -> Check | None:
    if ctx.launch_args is None:
        return None
    given = parse(ctx.launch_args)
    data = {"launch_args": given}
    problems = [f"{OPTIONS[key][0]} needs a value" for key, value in given.items() if value is None]
    numbers = {}
    for key in INTEGERS:
        if given.get(key) is not None:
            try:
                numbers[key] = int(given[key])
            except ValueError:
                problems.append(f"{OPTIONS[key][0]} {given[key]!r} is not an integer")
    problems += [f"{OPTIONS[key][0]} {value} must be at least 1" for key, value in numbers.items() if value < 1]
    if problems:
        return Check(NAME, FAIL, "; ".join(problems), data)
    failures, warnings, notes = algorithm_findings(ctx, given)
    more_failures, more_warnings, more_notes = count_findings(numbers)
    failures, warnings, notes = failures + more_failures, warnings + more_warnings + path_findings(ctx, given), \
        notes + more_notes
    if failures:
        return Check(NAME, FAIL, "; ".join(failures + warnings), data)
    if warnings:
        return Check(NAME, WARN, "; ".join(warnings + notes), data)
    return Check(NAME, OK, "; ".join(notes), data)


def algorithm_findings(ctx: Context, given: dict) -> tuple[list[str], list[str], list[str]]:
    algorithm = (given.get("algorithm") or "").upper()
    eagle3 = is_eagle3_drafter(ctx.draft, ctx)
    if not algorithm:
        return [], ["no --speculative-algorithm: the server runs without the drafter"], []
    if eagle3 and algorithm in EAGLE_ALIASES:
        return [f"--speculative-algorithm {given['algorithm']} with an EAGLE-3 drafter: SGLang runs it as EAGLE, the"
                " target captures no aux hidden states and d2t is not read, so no draft is accepted (accept length"
                " 1.0, sglang #21272): use --speculative-algorithm EAGLE3"], [], []
    if eagle3 and algorithm not in EAGLE3_NAMES:
        return [], [f"--speculative-algorithm {given['algorithm']} is not EAGLE3, the algorithm of this drafter"], []
    if not eagle3 and algorithm in EAGLE3_NAMES:
        return [], ["--speculative-algorithm EAGLE3 with a drafter that shows no EAGLE-3 layout (no eagle_config, no"
                    " d2t, not an EAGLE-3 class)"], []
    notes = [f"--speculative-algorithm {given['algorithm']} fits the drafter"]
    if given.get("token_map") and algorithm in EAGLE3_NAMES:
        return [], ["--speculative-token-map is ignored with EAGLE3 (SGLang logs so): the drafter's d2t decides"], notes
    return [], [], notes


def count_findings(numbers: dict) -> tuple[list[str], list[str], list[str]]:
    steps, topk, tokens = numbers.get("steps"), numbers.get("topk"), numbers.get("draft_tokens")
    if steps is None:
        if topk is not None or tokens is not None:
            return ["--speculative-eagle-topk / --speculative-num-draft-tokens without --speculative-num-steps:"
                    " SGLang asserts they are unset (AssertionError at start)"], [], []
        return [], [], ["steps, topk and draft tokens left to SGLang's automatic choice"]
    if topk is None:
        return [f"--speculative-num-steps {steps} without --speculative-eagle-topk: SGLang compares the unset topk"
                " with 1 (TypeError at start); give --speculative-eagle-topk 1 and --speculative-num-draft-tokens"
                f" {steps + 1}"], [], []
    if topk == 1:
        if tokens is not None and tokens != steps + 1:
            return [], [f"--speculative-num-draft-tokens {tokens} with topk 1: SGLang replaces it by steps + 1 ="
                        f" {steps + 1}"], []
        return [], [], [f"{steps} steps, topk 1, {steps + 1} draft tokens (a chain)"]
    candidates = topk + (steps - 1) * topk * topk
    if tokens is None:
        return ["--speculative-eagle-topk > 1 without --speculative-num-draft-tokens"], [], []
    if tokens - 1 > candidates:
        return [f"--speculative-num-draft-tokens {tokens}: the tree of {steps} steps x topk {topk} holds"
                f" {candidates} candidates (topk + (steps - 1) x topk^2), SGLang asks for the best {tokens - 1}"
                " (num_draft_tokens - 1): torch.topk raises at the first decode"], [], []
    return [], [], [f"{steps} steps, topk {topk}, {tokens} draft tokens of {candidates} candidates"]


def path_findings(ctx: Context, given: dict) -> list[str]:
    """The drafter and target the server would load, where they are not the ones checked here."""
    warnings = []
    for key, checked, what in (("draft_path", ctx.draft, "drafter"), ("model_path", ctx.target, "target")):
        path = given.get(key)
        if not path or checked is None:
            continue
        if not os.path.isdir(path):
            warnings.append(f"{OPTIONS[key][0]} {path} is no local folder: not compared with the {what} checked here")
        elif Path(path).resolve() not in (checked.dir.resolve(), Path(checked.given).expanduser().resolve()):
            warnings.append(f"{OPTIONS[key][0]} {path} is not the {what} checked here ({checked.given})")
    return warnings
