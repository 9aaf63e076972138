"""What a bench run will do: the variants, their counterbalanced order, the workload, and each server's command and
environment. Nothing here starts a process."""
from __future__ import annotations

import dataclasses
import os
import random
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pcie.tools.command import UsageError

BASELINE = "baseline"
PROFILE_FILE_NAME = "eagle3-profile.jsonl"
WARMUP_FOLDER = "00-warmup"  # under out/runs: the unmeasured warm-up server's
# Variables the built-in variants control: removed from the inherited environment so each variant gets exactly
# what it says (an exported EAGLE3_PROFILE=1 would otherwise profile the baseline too).
# SGLANG_PCIE_NCCL_DECIDED (nccl.DECIDED_VAR) too: inherited, it would make every server skip its own NCCL decision.
CONTROLLED_VARS = ("SGLANG_PCIE_DISABLE", "EAGLE3_PROFILE", "EAGLE3_PROFILE_FILE", "SGLANG_PCIE_NCCL_DECIDED")
MUST_MATCH, MAY_DIFFER = "must-match", "may-differ"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---------------------------------------------------------------------------------------------------- variants

@dataclass(frozen=True)
class Variant:
    name: str
    env: dict = field(default_factory=dict)
    args: tuple = ()
    base: str = ""  # the built-in it starts from ("" for the built-ins themselves)
    tokens: str = MUST_MATCH
    repeats: int | None = None  # run only in the last K repeats (None: every repeat)
    spec: str = ""  # as given on the command line

    @property
    def profiling(self) -> bool:
        return self.env.get("EAGLE3_PROFILE") == "1"

    def as_dict(self) -> dict:
        return {"name": self.name, "base": self.base or None, "env": dict(self.env), "args": list(self.args),
                "tokens": self.tokens, "repeats": self.repeats, "spec": self.spec or self.name}


BUILTINS = {
    "baseline": Variant("baseline", env={"SGLANG_PCIE_DISABLE": "1"}),
    "overlay": Variant("overlay"),
    "profile": Variant("profile", env={"EAGLE3_PROFILE": "1"}),
}
FIELDS = ("base", "env", "args", "tokens", "repeats")


def parse_variant(spec: str) -> Variant:
    """``NAME`` (a built-in) or ``NAME:FIELD=VALUE[;FIELD=VALUE...]``; UsageError names the bad part."""
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not _NAME.match(name):
        raise UsageError(f"--variant {spec!r}: the name {name!r} must be letters, digits, '_', '.', '+' or '-'")
    if not sep:
        if name in BUILTINS:
            return BUILTINS[name]
        raise UsageError(f"--variant {spec!r}: unknown variant (built-ins: {', '.join(BUILTINS)}; define one"
                         " as NAME:env=K=V or NAME:args=...)")
    if name in BUILTINS:
        raise UsageError(f"--variant {spec!r}: {name!r} is a built-in; give your variant another name"
                         f" (NAME:base={name};...)")
    fields = _variant_fields(spec, rest)
    repeats = fields.get("repeats")
    if repeats is not None and not (repeats.isdigit() and int(repeats) >= 1):
        raise UsageError(f"--variant {spec!r}: repeats={repeats!r} is not a positive integer")
    base = fields.get("base", "overlay")
    if base not in BUILTINS:
        raise UsageError(f"--variant {spec!r}: base={base!r} (choose {', '.join(BUILTINS)})")
    env = dict(BUILTINS[base].env)
    env.update(parse_env_pairs(fields.get("env", ""), f"--variant {spec!r}"))
    try:
        args = tuple(shlex.split(fields.get("args", "")))
    except ValueError as exc:
        raise UsageError(f"--variant {spec!r}: args= does not parse ({exc})") from None
    tokens = fields.get("tokens") or (MAY_DIFFER if args else MUST_MATCH)
    if tokens not in (MUST_MATCH, MAY_DIFFER):
        raise UsageError(f"--variant {spec!r}: tokens={tokens!r} (choose {MUST_MATCH} or {MAY_DIFFER})")
    if not fields.get("env") and not fields.get("args") and "base" not in fields:
        raise UsageError(f"--variant {spec!r}: gives no env=, args= or base=")
    return Variant(name, env=env, args=args, base=base, tokens=tokens,
                   repeats=int(repeats) if repeats is not None else None, spec=spec)


def _variant_fields(spec: str, rest: str) -> dict:
    """FIELD -> VALUE of a user variant's ``FIELD=VALUE;...`` part, each field known and given once."""
    fields: dict = {}
    for part in rest.split(";"):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in FIELDS:
            raise UsageError(f"--variant {spec!r}: {part.strip()!r} is not FIELD=VALUE with FIELD one of"
                             f" {', '.join(FIELDS)}")
        if key in fields:
            raise UsageError(f"--variant {spec!r}: {key}= given twice")
        fields[key] = value.strip()
    return fields


def parse_env_pairs(text: str, where: str) -> dict:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{where}: env= does not parse ({exc})") from None
    env = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not _ENV_NAME.match(key):
            raise UsageError(f"{where}: {word!r} is not NAME=VALUE")
        env[key] = value
    return env


def resolve_variants(specs: list[str]) -> list[Variant]:
    """The variants to run, baseline first (added when not named: every ratio is to it)."""
    variants = [parse_variant(spec) for spec in specs] or [BUILTINS["baseline"], BUILTINS["overlay"]]
    names = [v.name for v in variants]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"--variant {name!r} given twice")
    if BASELINE not in names:
        variants.insert(0, BUILTINS[BASELINE])
    else:
        variants.insert(0, variants.pop(names.index(BASELINE)))
    return variants


def counterbalanced(names: list[str], repeats: int, counts: dict | None = None) -> list[tuple[int, str]]:
    """(repeat, name) in A B C, C B A, A B C ... order: a linear drift over time hits every variant alike.
    ``counts[name] = K`` runs that variant only in the last K repeats: the variants that run in every repeat
    complete their pairs first, should a long run be cut short."""
    counts = counts or {}
    order = []
    for repeat in range(repeats):
        sequence = names if repeat % 2 == 0 else list(reversed(names))
        order.extend((repeat, name) for name in sequence if repeat >= repeats - counts.get(name, repeats))
    return order


# ---------------------------------------------------------------------------------------------------- workload

@dataclass(frozen=True)
class Workload:
    seed: int = 0
    concurrency: int = 32
    batch_requests: int = 128
    stream_requests: int = 8
    input_len: int = 128
    output_len: int = 256
    warmup_requests: int = 32
    warmup_output_len: int = 16
    token_low: int = 10
    token_high: int = 30000  # exclusive; below any vocabulary this is used with (32000 for Llama-2 sizes)

    def prompts(self) -> dict:
        """Token-id prompts per phase, the same for every server: a function of the seed only."""
        rng = random.Random(self.seed)

        def make(count):
            return [[rng.randrange(self.token_low, self.token_high) for _ in range(self.input_len)]
                    for _ in range(count)]
        return {"warmup": make(self.warmup_requests), "batch": make(self.batch_requests),
                "stream": make(self.stream_requests)}

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# -------------------------------------------------------------------------------------------------------- plan

AUTO_START_REPEATS = 3  # --repeats auto begins with these: two pairs give a t interval 12.7 standard errors wide
AUTO_MAX_REPEATS = 50


@dataclass(frozen=True)
class Resolve:
    """``--repeats auto``: one more counterbalanced repeat at a time until every variant's ``metric`` could resolve
    an effect of ``target`` (0.02: 2%), or ``budget_s`` would be passed."""
    target: float
    metric: str  # a metric's label, e.g. "batch output tok/s"
    budget_s: float

    def as_dict(self) -> dict:
        return {"target": self.target, "metric": self.metric, "budget_s": self.budget_s}


@dataclass
class Plan:
    variants: list
    workload: Workload
    launch_args: list
    server_cmd: list
    extra_env: dict
    host: str
    port: int
    repeats: int
    out: Path
    start_timeout: float
    stop_timeout: float
    request_timeout: float
    dry_run: bool = False
    argv: list = field(default_factory=list)
    resolve: Resolve | None = None  # --repeats auto; ``repeats`` then counts the repeats scheduled so far
    warmup: bool = True  # an unmeasured server of the first run's variant before the first measured one

    def schedule(self, repeats: int | None = None) -> list[dict]:
        """Every server of the first ``repeats`` (default: all) repeats, in order."""
        by_name = {v.name: v for v in self.variants}
        counts = {v.name: v.repeats for v in self.variants if v.repeats is not None}
        order = counterbalanced(list(by_name), self.repeats if repeats is None else repeats, counts)
        return [self.make_run(index + 1, repeat + 1, by_name[name]) for index, (repeat, name) in enumerate(order)]

    def make_run(self, index: int, repeat: int, variant, folder: Path | None = None, label: str | None = None) -> dict:
        """One server's run, as ``schedule`` makes them and ``runs.execute_run`` takes them: ``variant`` (a Variant,
        or the name of one of this plan's) with its environment (the plan's ``extra_env``, then the variant's; a
        profiling variant's profile file in ``folder``) and launch arguments (the plan's, then the variant's).
        ``folder`` defaults to ``out/runs/NN-name``; ``label`` names the server in the progress lines (default
        ``index/servers name (repeat r)``). Another tool (tune-spec) schedules its own runs with it."""
        if isinstance(variant, str):
            variant = next((v for v in self.variants if v.name == variant), None) or _unknown(variant, self)
        folder = Path(folder) if folder is not None else self.out / "runs" / f"{index:02d}-{variant.name}"
        env = dict(self.extra_env)
        env.update(variant.env)
        if variant.profiling:
            env["EAGLE3_PROFILE_FILE"] = str(folder / PROFILE_FILE_NAME)
        run = {"index": index, "repeat": repeat, "variant": variant.name, "folder": folder,
               "env": env, "args": list(self.launch_args) + list(variant.args)}
        if label is not None:
            run["label"] = label
        return run

    def warmup_run(self, variant=None) -> dict:
        """The unmeasured warm-up server's run: index and repeat 0, the first scheduled run's variant (or
        ``variant``), in ``out/runs/00-warmup``."""
        run = self.make_run(0, 0, self.schedule()[0]["variant"] if variant is None else variant,
                            folder=self.out / "runs" / WARMUP_FOLDER)
        run["label"] = f"warm-up {run['variant']}"
        return run

    def command(self, run: dict, port: int) -> list[str]:
        return list(self.server_cmd) + run["args"] + ["--host", self.host, "--port", str(port)]

    def environment(self, run: dict) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in CONTROLLED_VARS}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(run["env"])
        return env


def _unknown(name: str, plan: Plan):
    raise ValueError(f"no variant {name!r} in this plan ({', '.join(v.name for v in plan.variants)})")
