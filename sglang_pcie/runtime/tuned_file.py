"""The tuned NCCL profile: the file ``sglang-pcie tune-nccl`` writes, and how the launcher reads it back (the
winner rule itself is the tool's: ``sglang_pcie.tools.nccl_verdict``).

The launcher reads the file when ``sglang`` is imported, so reading it stays cheap: one small JSON file, NVML
(already probed by ``nccl.decide``) and a directory listing for the NCCL version. No CUDA, no torch, no
``importlib.metadata`` (50 ms in a full SGLang environment, against under 1 ms for the listing).

A file applies only where it was measured: the same GPUs (UUIDs, so the same machine and the same
``CUDA_VISIBLE_DEVICES`` selection), the same NVLink / peer-to-peer links, the same installed NCCL, the same
transport switches (``NCCL_P2P_DISABLE`` ...). Anything else reads as a mismatch and nothing from the file is
applied: values measured elsewhere can be slower than NCCL's defaults (the fixed PCIe profile made prefill-sized
all-reduces 5-29x slower on 2 x H200).

A file measured across nodes (``tune-nccl --nnodes N``) records ``nodes`` and, in ``node_fingerprints``, every
node's own fingerprint (its GPUs, links, NCCL, transport switches) with its network transport (the NCCL network
switches set there and the InfiniBand devices the kernel lists); it applies on a node whose own fingerprint is one
of them, in a launch over the same number of nodes.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from sglang_pcie.runtime.bounded_read import Unreadable, read_json
from sglang_pcie.runtime.settings import PCIE_PROFILE

TUNED_FILE_VAR = "SGLANG_PCIE_TUNED_FILE"
# 2: prefill sizes measured, per-size noise rule, GPU UUIDs in the fingerprint, the PCIe-IPC all-reduce section.
# A format-1 file was judged on decode sizes only, so it is not used.
FORMAT = 2
# Variables that change which path NCCL's traffic takes. They are part of the fingerprint because a profile
# measured with peer-to-peer off is no evidence for a server run with it on, and the other way round. The sweep
# never sets them; it measures with whatever the environment has.
TRANSPORT_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NVLS_ENABLE")
FINGERPRINT_FIELDS = ("gpus", "gpu_uuids", "nvlink", "p2p", "nccl", "transport_env")
# Across nodes NCCL's traffic also takes the network: InfiniBand (or RoCE) where the kernel lists such a device and
# nothing switches it off, else sockets; these variables choose the transport, the devices and GPUDirect RDMA.
# Recorded per node (interface names may differ between nodes), with the devices the kernel lists.
NET_VARS = ("NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME",
            "NCCL_NET_GDR_LEVEL")
NODE_FIELDS = (*FINGERPRINT_FIELDS, "net_env", "ib_devices")
IB_DEVICES = "/sys/class/infiniband"


# The profiles tune-nccl measures, and so the only values a tuned file can carry (validate_config). Kept to what
# fits the time goal (the whole sweep under 3 minutes on 2 GPUs: about 8 s per
# profile, mostly process start, torch import and NCCL init). NCCL_NVLS_ENABLE is never among them.
CANDIDATES = {
    "default": {},
    "pcie": dict(PCIE_PROFILE),
    "proto-LL": {"NCCL_PROTO": "LL"},
    "proto-LL128": {"NCCL_PROTO": "LL128"},
    "proto-Simple": {"NCCL_PROTO": "Simple"},
    "algo-Ring": {"NCCL_ALGO": "Ring"},
    # Crashed CUDA-graph capture at server start on one machine: a failure here just drops it.
    "algo-Tree": {"NCCL_ALGO": "Tree"},
    "ring-LL": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"},
    "channels-2": {"NCCL_MIN_NCHANNELS": "2", "NCCL_MAX_NCHANNELS": "2"},
    "channels-4": {"NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "4"},
    "LL-channels-2": {"NCCL_PROTO": "LL", "NCCL_MIN_NCHANNELS": "2", "NCCL_MAX_NCHANNELS": "2"},
    "buffsize-128k": {"NCCL_BUFFSIZE": "131072"},
    "p2p-level-sys": {"NCCL_P2P_LEVEL": "SYS"},
}
# Every variable a candidate sets: removed from tune-nccl's workers so that each profile gets exactly its own.
TUNABLE_VARS = sorted({name for values in CANDIDATES.values() for name in values})


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


def fingerprint(topology, environ: Mapping[str, str] | None = None, nccl: str | None = None,
                nodes: int = 1) -> dict:
    """What a tuned profile depends on. ``topology`` is an ``nccl.Topology`` of the GPUs this process uses (so
    CUDA_VISIBLE_DEVICES is part of it); ``nccl`` defaults to installed_nccl(); ``nodes`` the nodes the all-reduce
    spans (recorded only above 1, so a one-box file reads the same as before)."""
    env = os.environ if environ is None else environ
    return ({"nodes": nodes} if nodes > 1 else {}) | {
        "gpus": list(topology.gpu_names),
        "gpu_uuids": list(getattr(topology, "uuids", []) or []),
        "nvlink": topology.nvlink,
        "p2p": topology.p2p,
        "nccl": installed_nccl() if nccl is None else nccl,
        "transport_env": {name: env[name] for name in TRANSPORT_VARS if name in env},
    }


def ib_devices() -> list[str]:
    """The InfiniBand / RoCE devices the kernel lists (NCCL's IB transport uses them unless switched off); [] where
    there are none. A directory listing: no NCCL, no verbs library."""
    try:
        return sorted(os.listdir(IB_DEVICES))[:64]
    except OSError:
        return []


def network(environ: Mapping[str, str]) -> dict:
    """This node's network transport, as far as it is known without NCCL: the NCCL network switches set in
    ``environ`` and the InfiniBand devices listed here."""
    return {"net_env": {name: environ[name] for name in NET_VARS if name in environ}, "ib_devices": ib_devices()}


def node_fingerprint(topology, environ: Mapping[str, str] | None = None, nccl: str | None = None) -> dict:
    """One node's part of a multi-node fingerprint: its one-box fingerprint and its network transport."""
    env = os.environ if environ is None else environ
    return fingerprint(topology, env, nccl) | network(env)


def _all_or_none(values: list):
    """True (False) where every node says so; None where any does not know and none says False."""
    return False if False in values else (True if values and all(v is True for v in values) else None)


def multi_node_fingerprint(nodes: list[dict]) -> dict:
    """The fingerprint of a measurement across ``nodes`` (node_fingerprint() of each, in node-rank order): the count,
    every node's own fingerprint, and at the top what a one-box reader shows: every node's GPUs in node order,
    NVLink / peer-to-peer where they hold within every node, and node 0's NCCL and transport switches."""
    return {"nodes": len(nodes), "node_fingerprints": nodes,
            "gpus": [name for node in nodes for name in node["gpus"]],
            "gpu_uuids": [uuid for node in nodes for uuid in node["gpu_uuids"]],
            "nvlink": _all_or_none([node["nvlink"] for node in nodes]),
            "p2p": _all_or_none([node["p2p"] for node in nodes]),
            "nccl": nodes[0]["nccl"], "transport_env": dict(nodes[0]["transport_env"])}


def _shown(value) -> str:
    """A fingerprint value for people: JSON's null is "unknown", never "None"."""
    if value is None:
        return "unknown"
    return json.dumps(value) if isinstance(value, (bool, list, dict)) else repr(value)


def _node_differences(recorded: list, node: dict) -> list[str]:
    """Why ``node`` (this node's node_fingerprint) is none of the ``recorded`` nodes: the fields it differs in from
    the closest one."""
    if node in recorded:
        return []
    differences = [[f"{key} {_shown(entry.get(key))} here {_shown(node.get(key))}"
                    for key in NODE_FIELDS if entry.get(key) != node.get(key)] for entry in recorded]
    closest = min(range(len(recorded)), key=lambda i: len(differences[i]))
    return [f"this node is none of the {len(recorded)} nodes measured (closest, node {closest}: "
            f"{'; '.join(differences[closest])})"]


def fingerprint_differences(recorded: dict, here: dict, node: dict | None = None) -> list[str]:
    """What differs between the ``recorded`` fingerprint and ``here``; for a file measured across nodes, between its
    nodes and ``node`` (this node's node_fingerprint), and in the node count."""
    if isinstance(recorded.get("node_fingerprints"), list) and node is not None:
        found = _node_differences(recorded["node_fingerprints"], node)
    else:
        found = [f"{key} {_shown(recorded.get(key))} here {_shown(here.get(key))}"
                 for key in FINGERPRINT_FIELDS if recorded.get(key) != here.get(key)]
    if recorded.get("nodes", 1) != here.get("nodes", 1):  # a one-box measurement is no evidence across the network
        found.insert(0, f"measured on {recorded.get('nodes', 1)} node(s), launched on {here.get('nodes', 1)}")
    return found


def describe_machine(fp: dict) -> str:
    gpus = fp.get("gpus") or []
    models = ", ".join(sorted(set(gpus))) or "no GPU"
    links = f"nvlink={_shown(fp.get('nvlink'))}, p2p={_shown(fp.get('p2p'))}"
    extra = "".join(f", {k}={v}" for k, v in sorted((fp.get("transport_env") or {}).items()))
    nccl = fp.get("nccl") or "unknown (no nvidia-nccl distribution found)"
    nodes = f"{fp['nodes']} nodes, " if "nodes" in fp else ""
    return f"{nodes}{len(gpus)} x {models} ({links}{extra}), NCCL {nccl}"


def validate_config(config) -> str | None:
    """Why ``config`` (parsed JSON) is not a usable tuned file; None when it is.

    An allow-list, not a shape check: the file may set exactly the values of one profile tune-nccl measures (the
    one it names as winner), its fingerprint holds the types tune-nccl writes, and the PCIe-IPC bound is a measured
    decode size times the measured hidden size. Anything else rejects the whole file: a file is evidence of a
    measurement, and nothing else may steer NCCL (no plugin path, no transport switch, no buffer size it never ran).
    """
    if not isinstance(config, dict):
        return "not a JSON object"
    if config.get("format") != FORMAT:
        old = _is_int(config.get("format")) and config["format"] < FORMAT
        return (f"format {config.get('format')!r} is not {FORMAT}"
                + (" (written by an older tune-nccl that measured decode sizes only: run sglang-pcie tune-nccl"
                   " again)" if old else ""))
    return _fingerprint_problem(config.get("fingerprint")) or _values_problem(config) or _ipc_problem(config)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short_strings(items, limit: int = 256) -> bool:
    return isinstance(items, list) and len(items) <= 1024 and all(
        isinstance(item, str) and len(item) <= limit for item in items)


def _fingerprint_problem(fp, name: str = "fingerprint") -> str | None:
    if not isinstance(fp, dict) or any(key not in fp for key in FINGERPRINT_FIELDS):
        return f"{name} must hold {', '.join(FINGERPRINT_FIELDS)}"
    if not (_short_strings(fp["gpus"]) and _short_strings(fp["gpu_uuids"])):
        return f"{name}.gpus and .gpu_uuids must be lists of names"
    for key in ("nvlink", "p2p"):
        if fp[key] not in (True, False, None):
            return f"{name}.{key} {fp[key]!r} is not true, false or null"
    if not (fp["nccl"] is None or (isinstance(fp["nccl"], str) and len(fp["nccl"]) <= 256)):
        return f"{name}.nccl {fp['nccl']!r} is not a distribution name or null"
    if "nodes" in fp and not (_is_int(fp["nodes"]) and fp["nodes"] > 1):
        return f"{name}.nodes {fp['nodes']!r} is not a number of nodes above 1"
    transport = fp["transport_env"]
    if not isinstance(transport, dict):
        return f"{name}.transport_env must be an object"
    for key, value in transport.items():
        if key not in TRANSPORT_VARS or not (isinstance(value, str) and len(value) <= 16):
            return f"{name}.transport_env: {key!r}={value!r} is not a transport switch tune-nccl records"
    return _nodes_problem(fp, name) if "node_fingerprints" in fp else None


def _nodes_problem(fp: dict, name: str) -> str | None:
    """A multi-node fingerprint: one node fingerprint per node, each of the one-box shape plus its network transport,
    and the top-level GPUs every node's in node order."""
    nodes = fp["node_fingerprints"]
    if "nodes" not in fp or not (isinstance(nodes, list) and len(nodes) == fp["nodes"]):
        return f"{name}.node_fingerprints must hold one fingerprint per node ({name}.nodes)"
    for index, node in enumerate(nodes):
        where = f"{name}.node_fingerprints[{index}]"
        if not isinstance(node, dict) or set(node) != set(NODE_FIELDS):
            return f"{where} must hold exactly {', '.join(NODE_FIELDS)}"
        problem = _fingerprint_problem(node, where)
        if problem:
            return problem
        net = node["net_env"]
        if not (isinstance(net, dict) and all(key in NET_VARS and isinstance(value, str) and len(value) <= 256
                                              for key, value in net.items())):
            return f"{where}.net_env must map NCCL network switches ({', '.join(NET_VARS)}) to their values"
        if not _short_strings(node["ib_devices"], 64):
            return f"{where}.ib_devices must be a list of device names"
    if (fp["gpus"] != [gpu for node in nodes for gpu in node["gpus"]]
            or fp["gpu_uuids"] != [uuid for node in nodes for uuid in node["gpu_uuids"]]):
        return f"{name}.gpus and .gpu_uuids must list every node's, in node order"
    return None


def _values_problem(config: dict) -> str | None:
    values, winner = config.get("values"), config.get("winner")
    if not isinstance(values, dict):
        return "values must be an object of NCCL variables"
    for key, value in values.items():
        if not any(key in profile for profile in CANDIDATES.values()):
            return f"values: {key!r} is not a variable tune-nccl sets ({', '.join(sorted(TUNABLE_VARS))})"
        if not isinstance(value, str):
            return f"values: {key}={value!r} is not a string"
    if not isinstance(winner, str) or winner not in CANDIDATES:
        return f"winner {winner!r} is not a profile tune-nccl measures ({', '.join(CANDIDATES)})"
    if values != CANDIDATES[winner]:
        shown = " ".join(f"{k}={v}" for k, v in sorted(values.items())) or "nothing"
        wanted = " ".join(f"{k}={v}" for k, v in sorted(CANDIDATES[winner].items())) or "nothing"
        return f"values ({shown}) are not those of its winner {winner} ({wanted})"
    return None


def _ipc_problem(config: dict) -> str | None:
    ipc = config.get("ipc")
    if ipc is None:
        return None
    if not isinstance(ipc, dict):
        return "ipc must be an object"
    numel = ipc.get("max_numel")
    if numel is None:
        return None
    if not (_is_int(numel) and numel > 0):
        return f"ipc.max_numel {numel!r} is not a positive integer"
    tokens, largest, hidden = ipc.get("tokens"), ipc.get("max_tokens"), ipc.get("hidden")
    if not (isinstance(tokens, list) and tokens and all(_is_int(t) and t > 0 for t in tokens)):
        return "ipc.tokens must list the decode sizes measured"
    if not (_is_int(largest) and largest in tokens):
        return f"ipc.max_tokens {largest!r} is not one of the measured decode sizes {tokens}"
    if not (_is_int(hidden) and hidden > 0) or numel != largest * hidden:
        return (f"ipc.max_numel {numel} is not the measured bound ipc.max_tokens x ipc.hidden "
                f"({largest!r} x {hidden!r})")
    if not (isinstance(ipc.get("flashinfer"), str) and len(ipc["flashinfer"]) <= 64):
        return "ipc.flashinfer must name the FlashInfer version measured"
    return None


@dataclass
class TunedFile:
    """The tuned file as one decision read it."""
    path: Path
    config: dict | None  # parsed and valid; None when absent or unusable
    problem: str | None  # why the file at ``path`` is unusable (None: usable, or simply absent)
    error: str | None  # the same for the user, one line naming the variable; also a named file that is absent


def read_named(environ: Mapping[str, str] | None = None) -> TunedFile:
    """The file SGLANG_PCIE_TUNED_FILE names (or the default path), read once. A named file that is missing,
    unreadable or malformed, and a malformed file at the default path, give ``error``; no file at the default path
    is simply no result."""
    from sglang_pcie.runtime.settings import shown

    env = os.environ if environ is None else environ
    raw = env.get(TUNED_FILE_VAR, "")
    path = config_path(env)
    config, problem = read_config(path)
    said = problem
    if raw.strip():
        name = f"{TUNED_FILE_VAR}={shown(raw)}"
        if config is None and problem is None:
            said = f"no such file {path}"
    else:
        name = f"{TUNED_FILE_VAR} (unset: the default {path})"
    return TunedFile(path, config, problem, f"{name}: {said}; nothing applied from it" if said else None)


def read_config(path: Path) -> tuple[dict | None, str | None]:
    """(config, None), or (None, why not). A missing file is (None, None). Bounded (bounded_read): a FIFO, a device,
    a huge or deeply nested file, or a mount that hangs is one reason, never a hang or a traceback."""
    try:
        config = read_json(path)
    except FileNotFoundError:
        return None, None
    except Unreadable as exc:
        return None, f"tuned NCCL file {path} {exc}"
    problem = validate_config(config)
    if problem:
        return None, f"tuned NCCL file {path} is not usable: {problem}"
    return config, None


def matching_config(topology, tuned: TunedFile, explicit: bool, environ: Mapping[str, str] | None = None,
                    nodes: int = 1) -> tuple[dict | None, str]:
    """(the tuned file's config, reason) when one exists and was measured on these GPUs, else (None, reason).

    Its ``values`` may be {}: the sweep found nothing faster than NCCL's defaults, and that is a result too.
    With ``explicit`` (the user asked for ``SGLANG_PCIE_NCCL_PROFILE=tuned``) a missing or non-matching file
    says so in one warning line. A corrupt or unreadable file is ``tuned.error`` (one line naming
    SGLANG_PCIE_TUNED_FILE, warned by the deciding process and an error in the CLI), so it is only the reason
    here; this function never raises.
    """
    label = "SGLANG_PCIE_NCCL_PROFILE=tuned" if explicit else "auto"
    try:
        path, config = tuned.path, tuned.config
        problem = tuned.problem
        if problem:
            return None, f"{label}: {problem}"
        if config is None:
            reason = f"{label}: no tuned NCCL file at {path} (run sglang-pcie tune-nccl)"
            if explicit:
                warn(f"{reason}; no NCCL profile applied")
            return None, reason
        recorded = config["fingerprint"]
        here = fingerprint(topology, environ, nodes=nodes)
        node = None
        if "node_fingerprints" in recorded:  # measured across nodes: this node must be one of them
            node = {key: here[key] for key in FINGERPRINT_FIELDS} | network(os.environ if environ is None else environ)
        differences = fingerprint_differences(recorded, here, node)
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


def write_config(path: Path, config: dict) -> None:
    """Atomically, so that a launcher reading the file never sees half of it."""
    problem = validate_config(config)
    if problem:
        raise ValueError(f"refusing to write an unusable tuned file: {problem}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)
