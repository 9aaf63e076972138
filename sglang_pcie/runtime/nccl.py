"""NCCL (and PCIe-IPC all-reduce) settings chosen for this machine and written into the process environment when
SGLang is imported.

Spawned scheduler / TP worker processes inherit the environment, so the launcher's decision reaches them
before NCCL reads its variables. A variable the user set is never overwritten.

Nothing is applied unmeasured: ``auto`` applies values only from a ``tune-nccl`` result whose fingerprint
matches the GPUs this process will use (``topology``, read without CUDA); without one it keeps NCCL's defaults.
The tuned file is read once per decision (``tuned_file.read_named``).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable, MutableMapping

from sglang_pcie.runtime import tuned_file
from sglang_pcie.runtime.settings import IPC_VARS, PCIE_PROFILE
from sglang_pcie.runtime import gpus, launch as launches
from sglang_pcie.runtime.launch import Launch
from sglang_pcie.runtime.gpus import Topology

# Set in the process that decided, so that spawned workers inherit the decision instead of probing again (and
# the advice line is printed once per process tree, not once per worker).
DECIDED_VAR = "SGLANG_PCIE_NCCL_DECIDED"
TUNE_ADVICE = ("{count} GPUs without NVLink and no tune-nccl result for them: NCCL defaults kept. "
               "Run `sglang-pcie tune-nccl` once to measure NCCL settings and the PCIe-IPC all-reduce here.")


@dataclass
class NcclDecision:
    requested: str | None  # the SGLANG_PCIE_NCCL_PROFILE value (None: invalid)
    profile: str  # what was chosen: pcie | tuned | none
    values: dict  # variables this decision sets
    user_set: dict  # profile variables the user already set (kept)
    reason: str
    topology: Topology | None = None
    advice: str | None = None  # one line worth printing once per process tree (e.g. run tune-nccl)
    config: dict | None = None  # the tuned file, when it matched this machine
    ipc: object | None = None  # allreduce.IpcDecision where there was one to take (else SGLang's default: off)
    # Why the tuned file named by SGLANG_PCIE_TUNED_FILE (or at its default path) cannot be used: one line naming
    # it; warned once by the process that decides, an error (exit 2) in the CLI.
    file_error: str | None = None
    launch: Launch = Launch(1, "one node")  # how many nodes the server spans

    def as_dict(self) -> dict:
        out = {"requested": self.requested, "profile": self.profile, "values": self.values,
               "user_set": self.user_set, "reason": self.reason}
        if self.advice:
            out["advice"] = self.advice
        if self.topology is not None:
            t = self.topology
            out["topology"] = {"gpus": t.gpu_names, "nvlink": t.nvlink, "p2p": t.p2p,
                               "source": t.source, "detail": t.detail}
        if self.ipc is not None:
            out["ipc"] = self.ipc.as_dict()
        out["nodes"] = {"count": self.launch.nodes, "source": self.launch.source}
        if self.launch.problem:
            out["nodes"]["problem"] = self.launch.problem
        return out


# ---------------------------------------------------------------------------------------------------------------
# The decision


def _exists(path) -> bool:
    """Path.exists() that answers False where the folder cannot be entered (HOME of another user in a container)
    instead of raising in the middle of activation."""
    try:
        return path.exists()
    except OSError:
        return False


def decide(requested: str | None, environ: MutableMapping[str, str] | None = None,
           probe: Callable[[], Topology] | None = None, launch: Launch | None = None) -> NcclDecision:
    """What ``requested`` (an SGLANG_PCIE_NCCL_PROFILE value) means on this machine, for ``launch`` (default: what
    the environment says; the launcher passes what its own arguments say). Touches nothing."""
    env = os.environ if environ is None else environ
    probe = probe or (lambda: gpus.probe_topology(env))
    launch = launch or launches.detect([], env)
    topology, config, advice, file_error = None, None, None, None
    if requested is None:
        chosen, reason = None, "SGLANG_PCIE_NCCL_PROFILE is invalid: nothing applied"
    elif requested == "off":
        chosen, reason = None, "SGLANG_PCIE_NCCL_PROFILE=off"
    elif requested == "pcie":
        chosen, reason = ("pcie", PCIE_PROFILE), "SGLANG_PCIE_NCCL_PROFILE=pcie (explicit; not measured here)"
    else:  # auto / tuned: measured values or nothing
        topology = probe()
        tuned = tuned_file.read_named(env)  # the one read of the file on this decision
        file_error = tuned.error
        config, tuned_reason = tuned_file.matching_config(topology, tuned, explicit=requested == "tuned", environ=env,
                                                          nodes=launch.nodes)
        if config is not None:
            chosen, reason = ("tuned", dict(config["values"])), tuned_reason
        elif requested == "tuned":
            chosen, reason = None, tuned_reason
        else:
            chosen, reason = None, f"auto: {_untuned_reason(topology)}: NCCL defaults kept"
            if _exists(tuned.path):  # a file measured elsewhere, or unusable: say why it was passed over
                reason = f"{reason}; {tuned_reason}"
            if topology.gpu_count > 1 and topology.nvlink is False:
                advice = TUNE_ADVICE.format(count=topology.gpu_count)
    if launch.multi_node and requested is not None:
        reason, advice = _across_nodes(requested, launch, chosen is not None, reason)
    ipc = None
    # The IPC decision (and its module) only where there is something to decide: a measured win, or the user's
    # own setting to report. Everywhere else activation stays as cheap as before.
    if any(name in env for name in IPC_VARS) or (config is not None and (config.get("ipc") or {}).get("max_numel")):
        from sglang_pcie.runtime import allreduce

        ipc = allreduce.decide_ipc(requested, config, topology, env, launch=launch)
    if chosen is None:
        return NcclDecision(requested, "none", {}, {}, reason, topology, advice, config, ipc, file_error, launch)
    name, profile = chosen
    values = {k: v for k, v in profile.items() if k not in env}
    user_set = {k: env[k] for k in profile if k in env}
    return NcclDecision(requested, name, values, user_set, reason, topology, advice, config, ipc, file_error, launch)


def _across_nodes(requested: str, launch: Launch, applied: bool, reason: str) -> tuple[str, str | None]:
    """(reason, the one line each node's launcher prints) for a launch that spans nodes."""
    if requested == "off":
        return reason, None
    same = "every node must run the same NCCL settings (sglang-pcie compares them when the server starts)"
    if applied:
        how = "applied as asked" if requested == "pcie" else f"a tune-nccl result measured across {launch.nodes} nodes"
        return reason, f"SGLANG_PCIE_NCCL_PROFILE={requested} on {launch.describe()}: {how}; {same}"
    why = (f"{requested}: {launch.describe()}: no tune-nccl result measured across {launch.nodes} nodes here, and a"
           " one-box result says nothing about an all-reduce over the network: NCCL defaults kept, the PCIe-IPC"
           " all-reduce (single-node) stays off")
    return why + (f" ({reason})" if "tuned NCCL file" in reason else ""), f"{why}; {same}"


def _untuned_reason(topology: Topology) -> str:
    if topology.gpu_count == 0:
        return f"no GPU visible ({topology.detail})"
    if topology.gpu_count == 1:
        return "a single GPU, no all-reduce"
    links = {True: "NVLink between them", False: "no NVLink between them", None: "NVLink unknown"}[topology.nvlink]
    return f"no tune-nccl result for these {topology.gpu_count} GPUs ({links}, peer-to-peer {topology.state(topology.p2p)})"


def apply_for_process(settings, environ: MutableMapping[str, str] | None = None) -> NcclDecision | None:
    """Decide once per process tree and write the chosen variables into the environment. Spawned workers inherit
    the decision (and its one warning about an unusable tuned file) instead of saying it again."""
    env = os.environ if environ is None else environ
    if DECIDED_VAR in env:  # a parent process already decided; its variables were inherited
        return None
    decision = decide(settings.nccl_profile, env, launch=launches.detect(None, env))
    env.update(decision.values)
    if decision.ipc is not None:
        env.update(decision.ipc.values)
    env[DECIDED_VAR] = decision.profile
    if decision.launch.multi_node:  # the workers compare every node's settings (the agreement check)
        env[launches.NODES_VAR] = str(decision.launch.nodes)
    ipc_advice = decision.ipc.advice if decision.ipc is not None else None
    for line in filter(None, (decision.file_error, decision.launch.problem, decision.advice, ipc_advice)):
        sys.stderr.write(f"sglang-pcie: {line}\n")
    return decision
