"""How many nodes (boxes) the server this process belongs to spans, read from its launch: SGLang's own arguments
(``--nnodes N`` / ``--nnodes=N``, ``--node-rank``, or ``nnodes:`` in a ``--config`` YAML file), torch's launcher
(``WORLD_SIZE`` above ``LOCAL_WORLD_SIZE``) or SLURM (``SLURM_NNODES``).

Read once, by the process that makes the NCCL decision (the launcher); it writes ``SGLANG_PCIE_NNODES`` so that the
workers it spawns know too. Nothing here raises: a config file that cannot be read is one reason, and the launch
counts as one node unless something else says otherwise.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

from sglang_pcie.runtime.bounded_read import Unreadable, read_text

NODES_VAR = "SGLANG_PCIE_NNODES"  # written by the deciding process, read by its workers


@dataclass(frozen=True)
class Launch:
    nodes: int  # 1: everything on this box
    source: str  # where the count comes from, for people ("--nnodes 2", "SLURM_NNODES=2", ...)
    node_rank: int | None = None
    problem: str | None = None  # a config file that could not be read: one line naming it

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def describe(self) -> str:
        rank = f", this is node {self.node_rank}" if self.node_rank is not None else ""
        return f"a launch over {self.nodes} nodes ({self.source}{rank})"


def detect(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Launch:
    env = os.environ if environ is None else environ
    argv = list(sys.argv[1:] if argv is None else argv)
    inherited = _positive(env.get(NODES_VAR))
    if inherited:
        return Launch(inherited, f"{NODES_VAR}={inherited}, from the launcher")
    nodes, rank = _option(argv, "--nnodes"), _option(argv, "--node-rank")
    if nodes is not None:
        return _counted(nodes, f"--nnodes {nodes}", rank)
    config, problem = _option(argv, "--config"), None
    if config:
        values, problem = _read_config(config)
        nodes = values.get("nnodes")
        if rank is None:
            rank = values.get("node-rank", values.get("node_rank"))
        if nodes is not None:
            return _counted(str(nodes), f"nnodes: {nodes} in --config {config}", rank, problem)
    world, local = _positive(env.get("WORLD_SIZE")), _positive(env.get("LOCAL_WORLD_SIZE"))
    if world and local and world > local:
        return Launch(-(-world // local), f"torch's launcher: WORLD_SIZE={world} > LOCAL_WORLD_SIZE={local}",
                      _positive(env.get("GROUP_RANK"), zero=True), problem)
    slurm = _positive(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES"))
    if slurm and slurm > 1:
        return Launch(slurm, f"SLURM_NNODES={slurm}", _positive(env.get("SLURM_NODEID"), zero=True), problem)
    return Launch(1, "one node", None, problem)


def _counted(raw: str, source: str, rank, problem: str | None = None) -> Launch:
    nodes = _positive(raw)
    if nodes is None:
        return Launch(1, "one node", None, f"{source}: not a positive number of nodes; read as one node")
    return Launch(nodes, source, _positive(None if rank is None else str(rank), zero=True), problem)


def _positive(raw: str | None, zero: bool = False) -> int | None:
    try:
        value = int(str(raw).strip())
    except (TypeError, ValueError):
        return None
    return value if value > 0 or (zero and value == 0) else None


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``name`` as argparse reads it (``--x V`` or ``--x=V``; the last one wins)."""
    found = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def _read_config(path: str) -> tuple[dict, str | None]:
    """The top-level keys of SGLang's YAML config file that say where this node stands; read with the bounds of
    every file the overlay reads in a server process."""
    try:
        import yaml  # SGLang's own dependency: its --config reader uses it
    except ImportError:
        return {}, f"--config {path}: PyYAML is not installed, so its nnodes could not be read"
    try:
        data = yaml.safe_load(read_text(path))
    except FileNotFoundError:
        return {}, f"--config {path}: no such file"
    except Unreadable as exc:
        return {}, f"--config {path} {exc}"
    except yaml.YAMLError as exc:
        return {}, f"--config {path}: not YAML ({type(exc).__name__})"
    if not isinstance(data, dict):
        return {}, None
    return {k: v for k, v in data.items() if k in ("nnodes", "node-rank", "node_rank")}, None
