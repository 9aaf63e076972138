"""Every environment variable sglang-pcie reads, declared in one table (``VARIABLES``) and parsed from it.

Each row names the variable, how its value is read, the value an unset variable means, its owner (the patch or part
that reads it) and what it does; ``sglang-pcie env`` and ``verify-patches`` list the table with each value here.
The rows with a ``field`` are parsed here, into ``Settings`` (a class made from those rows); the others are read by
their owner where they are used (the tuned file at each NCCL decision, the release cache by the tools, and the
variables the overlay writes for its own child processes).

A bad value never raises: it becomes one line in ``Settings.errors`` naming the variable and the value (one
warning line when ``sglang`` is imported, exit code 2 in the CLI), and nothing is applied from it. The kill
switch is the exception that keeps the overlay safe: a ``SGLANG_PCIE_DISABLE`` that is not a boolean turns the
overlay off. Booleans are read by ``sglang_pcie_startup.parse_flag``, the parser the start-up hook uses, so
the hook and the settings never disagree about the kill switch.

A leaf: it imports nothing else of sglang-pcie. ``for_process()`` loads the settings once per process; activation
hands them down to the NCCL decision and the patches. What needs other knowledge is checked where that knowledge
is: patch ids against the register (activation, the CLI), the tuned file by the NCCL decision that reads it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, make_dataclass
from typing import Callable, Mapping

from sglang_pcie_startup import parse_flag

DISABLE_VAR = "SGLANG_PCIE_DISABLE"
DISABLE_PATCHES_VAR = "SGLANG_PCIE_DISABLE_PATCHES"
NCCL_PROFILES = ("auto", "pcie", "tuned", "off")
# Measured on 8 x RTX PRO 6000 Blackwell over PCIe (62.9 -> 88.8 tok/s decode). On 2 x H200 the same values made
# prefill-sized all-reduces 5-29x slower than NCCL's defaults, so only an explicit SGLANG_PCIE_NCCL_PROFILE=pcie
# applies them.
PCIE_PROFILE = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MIN_NCHANNELS": "2",
    "NCCL_MAX_NCHANNELS": "2",
    "NCCL_BUFFSIZE": "131072",
}
# SGLang's own switch and bound for FlashInfer's PCIe-IPC all-reduce: the NCCL decision keeps what the user set.
IPC_VARS = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "SGLANG_PCIE_IPC_MAX_NUMEL")
# Decode cycles per EAGLE profile report (the profiler's DEFAULT_INTERVAL, which this start-up module must not import;
# a test keeps them equal).  24 of them are timed (1 in 41) where the host budget has no room for more: that kept the
# profiler's host time at 0.79% of a host-bound H200 server's cycle (1 in 8, at 200, cost 1.1-1.8%).
EAGLE3_PROFILE_INTERVAL = 1000


def shown(raw: str) -> str:
    """A value as the user set it: the text's repr, or the bytes' repr where they are not UTF-8 (os.environ
    holds such bytes as lone surrogates, which would print as '\\udcff')."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return repr(os.fsencode(raw))
    return repr(raw)


# ------------------------------------------------------------------------------------------------ the parsers


class Invalid(ValueError):
    """A value its parser cannot read; the error line is ``NAME='value'`` + ``sep`` + ``why`` + ``; `` + effect."""

    def __init__(self, why: str, sep: str = " "):
        super().__init__(why)
        self.why, self.sep = why, sep


def boolean(raw: str) -> bool:
    value = parse_flag(raw)
    if value is None:
        raise Invalid("is not a boolean (use 1 or 0)")
    return value


def patch_ids(raw: str) -> frozenset:
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def nccl_profile(raw: str) -> str:
    profile = raw.strip().lower()
    if profile not in NCCL_PROFILES:
        raise Invalid(f"is not one of {', '.join(NCCL_PROFILES)}")
    return profile


def positive_integer(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise Invalid("is not a positive integer")
    return value


def positive_number(raw: str) -> float | None:
    if not raw:  # the default: none
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    # inf / nan would reach the JSON-lines file as Infinity / NaN, which are not JSON.
    if not (math.isfinite(value) and value > 0):
        raise Invalid("is not a positive finite number")
    return value


def writable_file(raw: str) -> str | None:
    if not raw:  # the default: none
        return None
    problem = _unwritable(raw)
    if problem:
        raise Invalid(problem, sep=": ")
    return raw


def _unwritable(raw: str) -> str | None:
    """Why JSON lines cannot be appended to the file ``raw``, found without creating anything; None if they can."""
    path = os.path.abspath(raw)
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        return "is a folder"
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else "the file is not writable"
    return None if os.access(folder, os.W_OK | os.X_OK) else f"folder {folder} is not writable"


# ------------------------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Variable:
    name: str
    reads_as: str  # how the value is read, in words
    default: str  # what an unset (or blank) variable means, as its value ("" where it means none)
    owner: str  # the patch or part that reads it
    meaning: str  # one line
    field: str | None = None  # the Settings attribute parsed here; None: its owner reads it where it is used
    parse: Callable[[str], object] | None = None  # a value that is not blank (else the default) -> the attribute
    invalid: tuple = ()  # (attribute, what is said it means) when parse raises Invalid

    def read(self, env: Mapping[str, str], errors: list):
        """The attribute for this environment's value; a bad value appends one error line and takes ``invalid``."""
        raw = env.get(self.name, "")
        try:
            return self.parse(raw if raw.strip() else self.default)
        except Invalid as exc:
            value, effect = self.invalid
            errors.append(f"{self.name}={shown(raw)}{exc.sep}{exc.why}; {effect}")
            return value


IGNORED = (False, "ignored")
BOOLEAN = "boolean: 1/true/yes/on or 0/false/no/off"
# In the order they are parsed (and their errors listed): the rows with a field first, those their owner reads after.
VARIABLES = (
    Variable(DISABLE_VAR, BOOLEAN, "0", "start-up hook, activation: the whole overlay",
             "1: the overlay does nothing in this process tree (a value that is not a boolean too)",
             "disabled", boolean, (True, "read as 1: the overlay is off")),
    Variable("SGLANG_PCIE_STRICT", BOOLEAN, "0", "activation, node-agreement",
             "1: a patch that does not fit the installed release (or differing nodes) stops the server at start",
             "strict", boolean, IGNORED),
    Variable("SGLANG_PCIE_SM120_FUSION", BOOLEAN, "0", "patch sm120-allreduce-fusion (its opt-in)",
             "1: FlashInfer's all-reduce fusion on SM120 where SGLang would enable it by itself",
             "sm120_fusion", boolean, IGNORED),
    Variable("EAGLE3_PROFILE", BOOLEAN, "0", "patch eagle3-profile (its opt-in)",
             "1: per-phase timers for SGLang's EAGLE workers", "eagle3_profile", boolean, IGNORED),
    Variable(DISABLE_PATCHES_VAR, "comma-separated patch ids", "", "the patch gate (patch_table): every patch",
             "those patches are not applied; an id that is no patch switches every patch off",
             "disabled_patches", patch_ids),
    Variable("SGLANG_PCIE_NCCL_PROFILE", f"one of {', '.join(NCCL_PROFILES)}", "auto",
             "the NCCL decision (runtime/nccl)",
             "the NCCL variables and PCIe-IPC switch written before a server starts: measured ones unless pcie",
             "nccl_profile", nccl_profile, (None, "no NCCL profile applied")),
    Variable("EAGLE3_PROFILE_INTERVAL", "positive integer", str(EAGLE3_PROFILE_INTERVAL), "patches/eagle3_profile",
             "decode cycles per logged EAGLE profile summary", "eagle3_profile_interval", positive_integer,
             (EAGLE3_PROFILE_INTERVAL, f"using {EAGLE3_PROFILE_INTERVAL}")),
    Variable("EAGLE3_PROFILE_BASELINE_MS", "positive finite number", "", "patches/eagle3_profile",
             "non-speculative decode step time (ms): adds break-even and projected speedup",
             "eagle3_profile_baseline_ms", positive_number, (None, "ignored")),
    Variable("EAGLE3_PROFILE_FILE", "path in an existing, writable folder", "", "patches/eagle3_profile",
             "also append one JSON object per interval to this file", "eagle3_profile_file", writable_file,
             (None, "no JSON lines written")),
    Variable("SGLANG_PCIE_TUNED_FILE", "path", "~/.config/sglang-pcie/nccl-tuned.json",
             "the NCCL decision (runtime/tuned_file)",
             "the tune-nccl result read under auto / tuned (the default's ~/.config is $XDG_CONFIG_HOME where set)"),
    Variable("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "SGLang's own (0.5.21+)", "",
             "the all-reduce decision (runtime/allreduce)",
             "SGLang's PCIe-IPC all-reduce switch: set by auto where measured faster; a value set is kept"),
    Variable("SGLANG_PCIE_IPC_MAX_NUMEL", "SGLang's own (0.5.21+)", "", "the all-reduce decision (runtime/allreduce)",
             "SGLang's bound for the PCIe-IPC all-reduce: set with the switch; a value set is kept"),
    Variable("SGLANG_PCIE_NCCL_DECIDED", "profile name (written by the overlay)", "",
             "the NCCL decision (runtime/nccl)",
             "the profile a parent process decided: its workers inherit it and do not decide again"),
    Variable("SGLANG_PCIE_NNODES", "number of nodes (written by the overlay)", "", "runtime/launch, node-agreement",
             "the nodes a launch spans, written by the deciding process for its workers"),
    Variable("SGLANG_PCIE_TUNE_NODE", "JSON (written by tune-nccl)", "", "tune-nccl (tools/tune_nccl)",
             "what a tune-nccl node's parent tells its workers across nodes"),
    Variable("SGLANG_PCIE_CACHE", "folder", "~/.cache/sglang-pcie", "the release fetcher (patching/releases)",
             "where pristine SGLang release wheels and sources are cached"),
    Variable("SGLANG_PCIE_INDEX_URL", "URL", "https://pypi.org/simple", "the release fetcher (patching/releases)",
             "the package index SGLang releases are fetched from"),
)
PARSED = tuple(v for v in VARIABLES if v.field)

Settings = make_dataclass(
    "Settings",
    [(v.field, object, field(default=v.parse(v.default))) for v in PARSED]
    + [("errors", list, field(default_factory=list))])  # one line per invalid variable, starting "NAME="
Settings.__module__ = __name__  # (make_dataclass's module= is Python 3.12+): pickled by name like any class
Settings.__doc__ = "The parsed variables (one attribute per row of VARIABLES with a field), and the errors."


def variable(name: str) -> Variable:
    return next(v for v in VARIABLES if v.name == name)


def unknown_patch_ids(settings: "Settings", known: list[str], environ: Mapping[str, str] | None = None) -> str | None:
    """One error line when SGLANG_PCIE_DISABLE_PATCHES names ids that are not in ``known`` (the register's ids),
    else None. Such a list switches every patch off (``patch_table.disabled_reason``): applying a patch the user
    tried to turn off is the unsafe reading, and honouring only the ids that exist would half-apply the value."""
    unknown = sorted(settings.disabled_patches.difference(known))
    if not unknown:
        return None
    raw = (os.environ if environ is None else environ).get(DISABLE_PATCHES_VAR, "")
    return (f"{DISABLE_PATCHES_VAR}={shown(raw)} names no patch {', '.join(map(shown, unknown))}"
            f" (patch ids: {', '.join(known)}); every patch is off until it names only patch ids")


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    s = Settings()
    for v in PARSED:
        setattr(s, v.field, v.read(env, s.errors))
    return s


_PROCESS_SETTINGS: Settings | None = None


def for_process() -> Settings:
    """This process's settings, read from its environment once (activation, the profiler and the diffs' hooks all
    ask; they get the same object)."""
    global _PROCESS_SETTINGS
    if _PROCESS_SETTINGS is None:
        _PROCESS_SETTINGS = load_settings()
    return _PROCESS_SETTINGS
