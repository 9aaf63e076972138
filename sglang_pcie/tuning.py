"""The tuned NCCL profile: the file ``sglang-pcie tune-nccl`` writes, how its winner is chosen, and how the
launcher reads it back.

The launcher reads the file when ``sglang`` is imported, so reading it stays cheap: one small JSON file, NVML
(already probed by ``nccl.decide``) and a directory listing for the NCCL version. No CUDA, no torch, no
``importlib.metadata`` (50 ms in a full SGLang environment, against under 1 ms for the listing).

A file applies only where it was measured: the same GPUs (UUIDs, so the same machine and the same
``CUDA_VISIBLE_DEVICES`` selection), the same NVLink / peer-to-peer links, the same installed NCCL, the same
transport switches (``NCCL_P2P_DISABLE`` ...). Anything else reads as a mismatch and nothing from the file is
applied: values measured elsewhere can be slower than NCCL's defaults (the fixed PCIe profile made prefill-sized
all-reduces 5-29x slower on 2 x H200).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

TUNED_FILE_VAR = "SGLANG_PCIE_TUNED_FILE"
# 2: prefill sizes measured, per-size noise rule, GPU UUIDs in the fingerprint, the PCIe-IPC all-reduce section.
# A format-1 file was judged on decode sizes only, so it is not used.
FORMAT = 2
# Variables that change which path NCCL's traffic takes. They are part of the fingerprint because a profile
# measured with peer-to-peer off is no evidence for a server run with it on, and the other way round. The sweep
# never sets them; it measures with whatever the environment has.
TRANSPORT_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NVLS_ENABLE")
FINGERPRINT_FIELDS = ("gpus", "gpu_uuids", "nvlink", "p2p", "nccl", "transport_env")

# Winner rule (see choose()). Noise is bounded per size by the spread between the defaults' runs (the first and
# the last run of the sweep, so drift over the sweep counts), and never taken as less than MIN_NOISE.
MIN_NOISE = 0.03
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


def installed_distributions(prefix: str, paths: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(distribution, version, folder) of every ``<prefix>*-<version>.dist-info`` folder on ``paths`` (default
    sys.path), in path order: what is installed, known from a directory listing, without importing anything."""
    found = []
    for entry in sys.path if paths is None else paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            # nvidia_nccl_cu12-2.27.5.dist-info
            if name.startswith(prefix) and name.endswith(".dist-info") and "-" in name:
                dist, version = name[: -len(".dist-info")].split("-", 1)
                found.append((dist.replace("_", "-"), version, entry or "."))
    return found


def installed_nccl() -> str | None:
    """The NCCL pip distribution(s) on sys.path, e.g. ``nvidia-nccl-cu12==2.27.5``; None when there is none.

    PyTorch's CUDA wheels and SGLang load libnccl from this distribution, so its version is the NCCL the
    server will run, known without loading the library or initialising CUDA. A system-wide or statically
    linked NCCL is not seen (None on both sides still matches).
    """
    found = {f"{dist}=={version}" for dist, version, _ in installed_distributions("nvidia_nccl_cu")}
    return ",".join(sorted(found)) or None


def fingerprint(topology, environ: Mapping[str, str] | None = None, nccl: str | None = None) -> dict:
    """What a tuned profile depends on. ``topology`` is an ``nccl.Topology`` of the GPUs this process uses (so
    CUDA_VISIBLE_DEVICES is part of it); ``nccl`` defaults to installed_nccl()."""
    env = os.environ if environ is None else environ
    return {
        "gpus": list(topology.gpu_names),
        "gpu_uuids": list(getattr(topology, "uuids", []) or []),
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
        old = isinstance(config.get("format"), int) and config["format"] < FORMAT
        return (f"format {config.get('format')!r} is not {FORMAT}"
                + (" (written by an older tune-nccl that measured decode sizes only: run sglang-pcie tune-nccl"
                   " again)" if old else ""))
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
    ipc = config.get("ipc")
    if ipc is not None:
        if not isinstance(ipc, dict):
            return "ipc must be an object"
        numel = ipc.get("max_numel")
        if numel is not None and not (isinstance(numel, int) and not isinstance(numel, bool) and numel > 0):
            return f"ipc.max_numel {numel!r} is not a positive integer"
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


def matching_config(topology, explicit: bool, environ: Mapping[str, str] | None = None) -> tuple[dict | None, str]:
    """(the tuned file, reason) when one exists and was measured on these GPUs, else (None, reason).

    Its ``values`` may be {}: the sweep found nothing faster than NCCL's defaults, and that is a result too.
    With ``explicit`` (the user asked for ``SGLANG_PCIE_NCCL_PROFILE=tuned``) a missing or non-matching file
    says so in one warning line. A corrupt or unreadable file is reported by the settings check (one line naming
    SGLANG_PCIE_TUNED_FILE, at import and in the CLI), so it is only the reason here; this function never raises.
    """
    label = "SGLANG_PCIE_NCCL_PROFILE=tuned" if explicit else "auto"
    try:
        path = config_path(environ)
        config, problem = read_config(path)
        if problem:
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
        values = config["values"]
        what = " ".join(f"{k}={v}" for k, v in sorted(values.items())) or "nothing (NCCL defaults were fastest)"
        return config, (f"{label}: tuned NCCL file {path} matches these GPUs"
                        f" ({describe_machine(recorded)}); winner {config.get('winner', '?')}: {what}")
    except Exception as exc:  # reading a profile must never break SGLang's import
        warn(f"tuned NCCL profile not applied: {type(exc).__name__}: {exc}")
        return None, f"{label}: tuned NCCL profile not applied ({type(exc).__name__}: {exc})"


def tuned_profile(topology, explicit: bool, environ: Mapping[str, str] | None = None) -> tuple[dict | None, str]:
    """(NCCL variables, reason) from a matching tuned file, or (None, reason); see matching_config."""
    config, reason = matching_config(topology, explicit, environ)
    return (dict(config["values"]) if config is not None else None), reason


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
