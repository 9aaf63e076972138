"""The tuned NCCL profile: the file ``sglang-pcie tune-nccl`` writes, how its winner is chosen, and how the
launcher reads it back.

The launcher reads the file when ``sglang`` is imported, so reading it stays cheap: one small JSON file, NVML
(already probed by ``nccl.decide``) and a directory listing for the NCCL version. No CUDA, no torch, no
``importlib.metadata`` (50 ms in a full SGLang environment, against under 1 ms for the listing).

A file applies only where it was measured: same GPU models in the same order, same NVLink / peer-to-peer
links, same installed NCCL, same transport switches (``NCCL_P2P_DISABLE`` ...). Anything else reads as a
mismatch and nothing from the file is applied: values measured for another machine can be slower than NCCL's
defaults (the fixed PCIe profile was 1.2-2.9x slower on 2 x H200).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

TUNED_FILE_VAR = "SGLANG_PCIE_TUNED_FILE"
FORMAT = 1
# Variables that change which path NCCL's traffic takes. They are part of the fingerprint because a profile
# measured with peer-to-peer off is no evidence for a server run with it on, and the other way round. The sweep
# never sets them; it measures with whatever the environment has.
TRANSPORT_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NVLS_ENABLE")
FINGERPRINT_FIELDS = ("gpus", "nvlink", "p2p", "nccl", "transport_env")

# Winner rule (see choose()). A candidate must beat the defaults' total by at least this much, or by the spread
# between the defaults' own runs where that is larger, so that run-to-run noise never picks a winner.
MIN_GAIN = 0.03
CONFIRM_RUNS = 2


def warn(message: str) -> None:
    sys.stderr.write(f"sglang-pcie: {message}\n")


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    explicit = env.get(TUNED_FILE_VAR, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    base = env.get("XDG_CONFIG_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "sglang-pcie" / "nccl-tuned.json"


def installed_nccl() -> str | None:
    """The NCCL pip distribution(s) on sys.path, e.g. ``nvidia-nccl-cu12==2.27.5``; None when there is none.

    PyTorch's CUDA wheels and SGLang load libnccl from this distribution, so its version is the NCCL the
    server will run, known without loading the library or initialising CUDA. A system-wide or statically
    linked NCCL is not seen (None on both sides still matches).
    """
    found = []
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            # nvidia_nccl_cu12-2.27.5.dist-info
            if name.startswith("nvidia_nccl_cu") and name.endswith(".dist-info") and "-" in name:
                dist, version = name[: -len(".dist-info")].split("-", 1)
                found.append(f"{dist.replace('_', '-')}=={version}")
    return ",".join(sorted(set(found))) or None


def fingerprint(topology, environ: Mapping[str, str] | None = None, nccl: str | None = None) -> dict:
    """What a tuned profile depends on. ``topology`` is an ``nccl.Topology``; ``nccl`` defaults to installed_nccl()."""
    env = os.environ if environ is None else environ
    return {
        "gpus": list(topology.gpu_names),
        "nvlink": topology.nvlink,
        "p2p": topology.p2p,
        "nccl": installed_nccl() if nccl is None else nccl,
        "transport_env": {name: env[name] for name in TRANSPORT_VARS if name in env},
    }


def fingerprint_differences(recorded: dict, here: dict) -> list[str]:
    return [f"{key} {recorded.get(key)!r} here {here.get(key)!r}"
            for key in FINGERPRINT_FIELDS if recorded.get(key) != here.get(key)]


def describe_machine(fp: dict) -> str:
    gpus = fp.get("gpus") or []
    models = ", ".join(sorted(set(gpus))) or "no GPU"
    links = f"nvlink={fp.get('nvlink')}, p2p={fp.get('p2p')}"
    extra = "".join(f", {k}={v}" for k, v in sorted((fp.get("transport_env") or {}).items()))
    return f"{len(gpus)} x {models} ({links}{extra}), NCCL {fp.get('nccl')}"


def validate_config(config) -> str | None:
    """Why ``config`` (parsed JSON) is not a usable tuned file; None when it is."""
    if not isinstance(config, dict):
        return "not a JSON object"
    if config.get("format") != FORMAT:
        return f"format {config.get('format')!r} is not {FORMAT}"
    fp = config.get("fingerprint")
    if not isinstance(fp, dict) or any(key not in fp for key in FINGERPRINT_FIELDS):
        return f"fingerprint must hold {', '.join(FINGERPRINT_FIELDS)}"
    values = config.get("values")
    if not isinstance(values, dict):
        return "values must be an object of NCCL variables"
    for key, value in values.items():
        # The sweep keeps NVLink multicast as the environment has it; a file that switches it is not ours.
        if not (isinstance(key, str) and key.startswith("NCCL_") and key != "NCCL_NVLS_ENABLE"
                and isinstance(value, str)):
            return f"values: {key!r}={value!r} is not an NCCL variable the tuner sets"
    return None


def read_config(path: Path) -> tuple[dict | None, str | None]:
    """(config, None), or (None, why not). A missing file is (None, None)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read tuned NCCL file {path}: {exc}"
    try:
        config = json.loads(text)
    except ValueError as exc:
        return None, f"tuned NCCL file {path} is not valid JSON ({exc})"
    problem = validate_config(config)
    if problem:
        return None, f"tuned NCCL file {path} is not usable: {problem}"
    return config, None


def tuned_profile(topology, explicit: bool, environ: Mapping[str, str] | None = None) -> tuple[dict | None, str]:
    """(variables to apply, reason) when a tuned file exists and was measured on this machine, else (None, reason).

    The variables may be {}: the sweep found nothing faster than NCCL's defaults, and that is a result too
    (``auto`` then keeps the defaults instead of applying its rule). With ``explicit`` (the user asked for
    ``SGLANG_PCIE_NCCL_PROFILE=tuned``) a missing or non-matching file applies nothing - neither the PCIe
    rule nor values measured elsewhere - and says so in one warning line. A corrupt or unreadable file is one
    warning line naming it, in either mode; this function never raises.
    """
    label = "SGLANG_PCIE_NCCL_PROFILE=tuned" if explicit else "auto"
    try:
        path = config_path(environ)
        config, problem = read_config(path)
        if problem:
            warn(f"{problem}; nothing applied from it")
            return None, f"{label}: {problem}"
        if config is None:
            reason = f"{label}: no tuned NCCL file at {path} (run sglang-pcie tune-nccl)"
            if explicit:
                warn(f"{reason}; no NCCL profile applied")
            return None, reason
        recorded = config["fingerprint"]
        differences = fingerprint_differences(recorded, fingerprint(topology, environ))
        if differences:
            reason = (f"{label}: tuned NCCL file {path} was measured on another setup"
                      f" ({'; '.join(differences)}): not applied")
            if explicit:
                warn(f"{reason}; no NCCL profile applied (re-run sglang-pcie tune-nccl here)")
            return None, reason
        values = dict(config["values"])
        what = " ".join(f"{k}={v}" for k, v in sorted(values.items())) or "nothing (NCCL defaults were fastest)"
        return values, (f"{label}: tuned NCCL file {path} matches this machine"
                        f" ({describe_machine(recorded)}); winner {config.get('winner', '?')}: {what}")
    except Exception as exc:  # reading a profile must never break SGLang's import
        warn(f"tuned NCCL profile not applied: {type(exc).__name__}: {exc}")
        return None, f"{label}: tuned NCCL profile not applied ({type(exc).__name__}: {exc})"


def write_config(path: Path, config: dict) -> None:
    """Atomically, so that a launcher reading the file never sees half of it."""
    problem = validate_config(config)
    if problem:
        raise ValueError(f"refusing to write an unusable tuned file: {problem}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)


# ---------------------------------------------------------------------------------------------------------------
# Choosing the winner


@dataclass
class Verdict:
    winner: str  # "default" when nothing qualified
    baseline: dict  # tokens -> microseconds: the defaults' best run at each size
    margin: float  # the gain on the total a candidate needed
    qualified: list = field(default_factory=list)  # candidate names, best first
    rejected: dict = field(default_factory=dict)  # name -> why
    pending: str | None = None  # best qualifier still short of CONFIRM_RUNS runs: run it again
    worst: dict = field(default_factory=dict)  # name -> tokens -> microseconds used for the decision


def choose(measured: dict, profiles: dict, confirm_runs: int = CONFIRM_RUNS) -> Verdict:
    """Pick the winner from ``measured``: profile name -> list of runs, each {tokens: microseconds} or None
    (failed). ``profiles``: name -> the variables it sets (ties go to the one that sets fewer).

    The rule, built to never pick something slower than NCCL's defaults:
    - the baseline is the defaults' fastest run at each size (the hardest bar to clear);
    - a candidate is judged on its slowest run at each size, and a candidate that failed any run is out;
    - it qualifies only if it is no slower than the baseline at every size and its total over all sizes is
      lower by at least max(MIN_GAIN, the spread between the defaults' own runs);
    - qualifiers rank by total, then by fewer variables, then by name; the winner is the best one measured
      at least ``confirm_runs`` times (``pending`` names a better one that still needs a run).
    Raises ValueError when the defaults have no successful run: there is nothing to compare against.
    """
    default_runs = [run for run in measured.get("default", []) if run]
    if not default_runs:
        raise ValueError("NCCL defaults could not be measured")
    sizes = sorted(default_runs[0])
    baseline = {s: min(run[s] for run in default_runs) for s in sizes}
    slowest_default = {s: max(run[s] for run in default_runs) for s in sizes}
    base_total = sum(baseline.values())
    spread = (sum(slowest_default.values()) - base_total) / base_total if base_total > 0 else 0.0
    verdict = Verdict("default", baseline, max(MIN_GAIN, spread))
    verdict.worst["default"] = baseline

    totals = {}
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
        slower = [s for s in sizes if worst[s] > baseline[s]]
        if slower:
            s = slower[0]
            verdict.rejected[name] = (f"slower than defaults at {s} tok ({worst[s]:.1f} vs {baseline[s]:.1f} us)"
                                      + (f" and {len(slower) - 1} more sizes" if len(slower) > 1 else ""))
            continue
        total = sum(worst.values())
        gain = 1 - total / base_total if base_total > 0 else 0.0
        if gain < verdict.margin:
            verdict.rejected[name] = (f"{gain:.1%} faster in total, below the {verdict.margin:.1%} needed"
                                      " to tell it from noise")
            continue
        totals[name] = total

    verdict.qualified = sorted(totals, key=lambda n: (totals[n], len(profiles.get(n, {})), n))
    for name in verdict.qualified:
        if len(measured[name]) >= confirm_runs:
            verdict.winner = name
            break
        if verdict.pending is None:
            verdict.pending = name
    return verdict
