"""The speculative settings tune-spec weighs, made from the user's own launch arguments.

Candidates: no speculation (every ``--speculative-*`` option removed), EAGLE / EAGLE-3 chains (top-k 1, k steps,
k + 1 draft tokens) for k = 1 .. ``max_steps``, the user's current setting where it is not one of those chains,
and SGLang's adaptive steps where the installed release has ``--speculative-adaptive``. Each candidate's launch
arguments are the user's, with the speculative options replaced: nothing else of the launch changes.
"""
from __future__ import annotations

from dataclasses import dataclass

from sglang_pcie.tools.command import UsageError

SPEC_PREFIX = "--speculative-"
CHAIN_ALGORITHMS = ("EAGLE", "EAGLE3")
STEPS, TOPK, DRAFT_TOKENS, ALGORITHM = ("--speculative-num-steps", "--speculative-eagle-topk",
                                        "--speculative-num-draft-tokens", "--speculative-algorithm")
ADAPTIVE = "--speculative-adaptive"
NONE = "none"


@dataclass(frozen=True)
class Candidate:
    name: str  # "none", "chain-3", "current", "adaptive"
    args: tuple  # the whole launch, speculative options as this candidate sets them
    steps: int | None  # chain length (None: none, adaptive, a tree)
    kind: str  # "none" | "chain" | "current" | "adaptive"

    @property
    def modelled(self) -> bool:
        """The cost model predicts chains only; the others are measured or not at all."""
        return self.kind == "chain"

    def as_dict(self) -> dict:
        return {"name": self.name, "args": list(self.args), "steps": self.steps, "kind": self.kind}


def split_speculative(args: list[str]) -> tuple[list[str], dict]:
    """The launch without its ``--speculative-*`` options, and those options (flag -> value, True for a flag given
    without one). ``--opt=value`` and ``--opt value`` both; a value is the next word unless it starts with ``--``
    (launch_server takes no positional arguments, and no speculative value starts with ``--``)."""
    rest, spec = [], {}
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith(SPEC_PREFIX):
            rest.append(word)
            i += 1
            continue
        flag, eq, value = word.partition("=")
        if eq:
            spec[flag] = value
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            spec[flag] = args[i + 1]
            i += 2
        else:
            spec[flag] = True
            i += 1
    return rest, spec


def _int_option(spec: dict, flag: str) -> int | None:
    value = spec.get(flag)
    if value is None:
        return None
    if value is True or not str(value).isdigit() or int(value) < 1:
        raise UsageError(f"launch argument {flag} {value if value is not True else ''}".rstrip()
                         + ": must be a positive integer")
    return int(value)


def _with(rest: list[str], spec: dict) -> tuple:
    words = list(rest)
    for flag, value in spec.items():
        words.append(flag)
        if value is not True:
            words.append(str(value))
    return tuple(words)


def current_setting(spec: dict) -> tuple[str, int | None, int | None, int | None]:
    """(algorithm, steps, topk, draft tokens) of the user's launch; UsageError where it is not EAGLE / EAGLE3."""
    algorithm = spec.get(ALGORITHM)
    if algorithm is None or algorithm is True:
        raise UsageError("the launch arguments after '--' name no --speculative-algorithm: tune-spec weighs"
                         " speculative settings of an EAGLE or EAGLE3 launch (give yours, with its drafter)")
    if str(algorithm).upper() not in CHAIN_ALGORITHMS:
        raise UsageError(f"--speculative-algorithm {algorithm}: tune-spec models EAGLE and EAGLE3 chains only")
    return (str(algorithm).upper(), _int_option(spec, STEPS), _int_option(spec, TOPK),
            _int_option(spec, DRAFT_TOKENS))


def candidates(launch_args: list[str], max_steps: int, adaptive_available: bool,
               steps_wanted: list[int] | None = None) -> list[Candidate]:
    """Every candidate for this launch, in the order they are listed: none, chains 1..max_steps (or only the
    depths in ``steps_wanted``), current (where it is no chain of those), adaptive (where the release has it)."""
    rest, spec = split_speculative(launch_args)
    _, steps, topk, draft_tokens = current_setting(spec)
    if not 1 <= max_steps <= 16:
        raise UsageError(f"--max-steps {max_steps}: give 1 to 16")
    chain_spec = {k: v for k, v in spec.items() if k not in (STEPS, TOPK, DRAFT_TOKENS, ADAPTIVE)}
    found = [Candidate(NONE, tuple(rest), None, "none")]
    depths = sorted(set(steps_wanted)) if steps_wanted else list(range(1, max_steps + 1))
    for k in depths:
        found.append(Candidate(f"chain-{k}", _with(rest, dict(chain_spec, **{STEPS: k, TOPK: 1, DRAFT_TOKENS: k + 1})),
                               k, "chain"))
    user_chain = (steps is not None and (topk or 1) == 1 and draft_tokens in (None, steps + 1)
                  and ADAPTIVE not in spec)
    if not (user_chain and steps in depths):  # otherwise the user's setting is chain-<steps>
        found.append(Candidate("current", tuple(launch_args), steps if user_chain else None, "current"))
    if adaptive_available and ADAPTIVE not in spec:
        found.append(Candidate("adaptive", _with(rest, dict(spec, **{ADAPTIVE: True})), None, "adaptive"))
    return found


def current_name(launch_args: list[str], found: list[Candidate]) -> str:
    """The candidate that is the user's own setting."""
    _, spec = split_speculative(launch_args)
    _, steps, topk, draft_tokens = current_setting(spec)
    chains = {c.steps for c in found if c.kind == "chain"}
    if (steps is not None and (topk or 1) == 1 and draft_tokens in (None, steps + 1) and steps in chains
            and ADAPTIVE not in spec):
        return f"chain-{steps}"
    return "current"


def adaptive_in_release(root) -> bool | None:
    """Whether the SGLang source tree at ``root`` has ``ServerArgs.speculative_adaptive`` (None: no tree)."""
    if root is None:
        return None
    from sglang_pcie.patching.source import SourceTree

    try:
        tree = SourceTree(root)
    except ValueError:
        return None
    return "speculative_adaptive" in tree.members("sglang.srt.server_args", "ServerArgs")
