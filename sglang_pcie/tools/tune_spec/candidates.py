"""The speculative settings tune-spec weighs, made from the user's own launch arguments.

Candidates: no speculation (every ``--speculative-*`` option removed), EAGLE / EAGLE-3 chains (top-k 1, k steps,
k + 1 draft tokens) for k = 1 .. ``max_steps`` (or the depths ``--steps`` names), the user's current setting where
it is not one of those chains, SGLang's adaptive steps with the release's own table where the release has them
(``adaptive``), an adaptive table the user gives (``table``), and the table tune-spec writes for this box
(``tuned``, made after the search). Each candidate's launch arguments are the user's, with the speculative options
replaced: nothing else of the launch changes (but ``--disable-overlap-schedule``, which 0.5.11's adaptive steps need).
"""
from __future__ import annotations

from dataclasses import dataclass

from sglang_pcie.tools.command import UsageError

SPEC_PREFIX = "--speculative-"
CHAIN_ALGORITHMS = ("EAGLE", "EAGLE3")
STEPS, TOPK, DRAFT_TOKENS, ALGORITHM = ("--speculative-num-steps", "--speculative-eagle-topk",
                                        "--speculative-num-draft-tokens", "--speculative-algorithm")
ADAPTIVE, ADAPTIVE_CONFIG = "--speculative-adaptive", "--speculative-adaptive-config"
DRAFT_PATHS = ("--speculative-draft-model-path", "--speculative-draft-model")  # the second: 0.5.20+'s alias
NO_OVERLAP = "--disable-overlap-schedule"
SHAPE = (STEPS, TOPK, DRAFT_TOKENS, ADAPTIVE, ADAPTIVE_CONFIG)  # what a candidate sets itself
NONE = "none"
TABLE_KINDS = ("adaptive", "table", "tuned")  # candidates that run SGLang's adaptive steps
GLOBAL_ADAPTIVE_STEPS = (1, 3, 7)  # 0.5.11-0.5.12's candidate_steps when no config says otherwise


@dataclass(frozen=True)
class Candidate:
    name: str  # "none", "chain-3", "current", "adaptive", "table", "tuned"
    args: tuple  # the whole launch, speculative options as this candidate sets them
    steps: int | None  # chain length (None: none, a tree, an adaptive table)
    kind: str  # "none" | "chain" | "current" | one of TABLE_KINDS

    @property
    def modelled(self) -> bool:
        """The cost model predicts chains only; the others are measured or not at all."""
        return self.kind == "chain"

    @property
    def fixed_steps(self) -> int | None:
        """The steps every verify runs (0: no speculation), or None where they vary or are a tree."""
        return 0 if self.kind == "none" else self.steps if self.kind == "chain" else None

    def as_dict(self) -> dict:
        return {"name": self.name, "args": list(self.args), "steps": self.steps, "kind": self.kind}

    @classmethod
    def from_dict(cls, data: dict) -> "Candidate":
        return cls(data["name"], tuple(data["args"]), data["steps"], data["kind"])


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
    """(algorithm, steps, topk, draft tokens) of the user's launch; UsageError where it is not EAGLE / EAGLE3 with
    a drafter."""
    algorithm = spec.get(ALGORITHM)
    if algorithm is None or algorithm is True:
        raise UsageError("the launch arguments after '--' name no --speculative-algorithm: tune-spec weighs"
                         " speculative settings of an EAGLE or EAGLE3 launch (give yours, with its drafter)")
    if str(algorithm).upper() not in CHAIN_ALGORITHMS:
        raise UsageError(f"--speculative-algorithm {algorithm}: tune-spec models EAGLE and EAGLE3 chains only")
    if not any(isinstance(spec.get(flag), str) and spec[flag] for flag in DRAFT_PATHS):
        raise UsageError("the launch names no --speculative-draft-model-path: every speculative server would fail"
                         " (for a checkpoint that carries its own MTP drafter, give its --model-path there too)")
    return (str(algorithm).upper(), _int_option(spec, STEPS), _int_option(spec, TOPK),
            _int_option(spec, DRAFT_TOKENS))


def is_user_chain(spec: dict, steps: int | None, topk: int | None, draft_tokens: int | None) -> bool:
    return (steps is not None and (topk or 1) == 1 and draft_tokens in (None, steps + 1)
            and ADAPTIVE not in spec)


def chain_spec(spec: dict) -> dict:
    """The user's speculative options without those a candidate sets (steps, top-k, draft tokens, adaptive)."""
    return {k: v for k, v in spec.items() if k not in SHAPE}


def adaptive_args(rest: list[str], spec: dict, steps_union: list[int], config: str | None = None,
                  no_overlap: bool = False) -> tuple:
    """A launch running SGLang's adaptive steps: its own table (``config`` None) or the file ``config``. It starts
    at the table's largest step: SGLang sizes the logits buffer its CUDA graphs share by the launch's draft tokens,
    so a start below the largest step fails while the largest step's graphs are captured (0.5.16 on one H100:
    "shared logits buffer holds 128 rows but caller needs 256"; benchmarks/results/2026-12-05-h100/
    tune-spec-partial/NOTE.txt). It must be one of the table's steps anyway: SGLang refuses any other."""
    start = max([s for s in steps_union if s > 0] or [1])
    options = dict(chain_spec(spec), **{ADAPTIVE: True})
    if config is not None:
        options[ADAPTIVE_CONFIG] = config
    options.update({STEPS: start, TOPK: 1, DRAFT_TOKENS: start + 1})
    words = list(rest) + ([NO_OVERLAP] if no_overlap and NO_OVERLAP not in rest else [])
    return _with(words, options)


def candidates(launch_args: list[str], max_steps: int, facts=None, steps_wanted: list[int] | None = None,
               table: tuple[str, dict] | None = None) -> list[Candidate]:
    """Every candidate for this launch, in the order they are listed: none, chains 1..max_steps (or only the
    depths in ``steps_wanted``), current (where it is no chain of those), adaptive (where the release ``facts``
    have it and the launch does not already run it), table (``table``: (path, bucket -> steps) the user gave)."""
    rest, spec = split_speculative(launch_args)
    _, steps, topk, draft_tokens = current_setting(spec)
    if not 1 <= max_steps <= 16:
        raise UsageError(f"--max-steps {max_steps}: give 1 to 16")
    base = chain_spec(spec)
    found = [Candidate(NONE, tuple(rest), None, "none")]
    depths = sorted(set(steps_wanted)) if steps_wanted else list(range(1, max_steps + 1))
    for k in depths:
        found.append(Candidate(f"chain-{k}", _with(rest, dict(base, **{STEPS: k, TOPK: 1, DRAFT_TOKENS: k + 1})),
                               k, "chain"))
    user_chain = is_user_chain(spec, steps, topk, draft_tokens)
    if not (user_chain and steps in depths):  # otherwise the user's setting is chain-<steps>
        found.append(Candidate("current", tuple(launch_args), steps if user_chain else None, "current"))
    if facts is not None and facts.available and ADAPTIVE not in spec:
        union = sorted({s for v in facts.default_table.values() for s in v}) or list(GLOBAL_ADAPTIVE_STEPS)
        found.append(Candidate("adaptive", adaptive_args(rest, spec, union, no_overlap=facts.needs_no_overlap),
                               None, "adaptive"))
    if table is not None:
        path, buckets = table
        union = sorted({s for v in buckets.values() for s in v})
        found.append(Candidate("table", adaptive_args(rest, spec, union, config=path), None, "table"))
    return found


def tuned_candidate(launch_args: list[str], path: str, buckets: dict) -> Candidate:
    """The table tune-spec wrote for this box (``buckets``: batch size -> [steps]), at ``path``."""
    rest, spec = split_speculative(launch_args)
    union = sorted({s for v in buckets.values() for s in v})
    return Candidate("tuned", adaptive_args(rest, spec, union, config=path), None, "tuned")


def current_name(launch_args: list[str], found: list[Candidate]) -> str:
    """The candidate that is the user's own setting."""
    _, spec = split_speculative(launch_args)
    _, steps, topk, draft_tokens = current_setting(spec)
    chains = {c.steps for c in found if c.kind == "chain"}
    if is_user_chain(spec, steps, topk, draft_tokens) and steps in chains:
        return f"chain-{steps}"
    return "current"
