"""The sweep across nodes: ``tune-nccl --nnodes N --node-rank R --master-addr HOST [--master-port P]``, the parent's
side (the ranks' side is ``rendezvous``).

Every step (one profile's run, then handing out the result) is started on every node by torch's launcher (torchrun,
its static rendezvous at HOST, served by node 0's launcher), one rank per GPU of this node. The nodes step through
the same runs in the same order: the plan is the same everywhere, and every decision between runs (stop after a
failed first run, which profile to confirm) is taken from figures every node received alike (the slowest of all
ranks). At each step's start the ranks check that every node is at the same step with the same profile, sizes and
ranks; node 0 builds the result and hands it out through the last step's rendezvous, so that every node writes the
same bytes.

Time bounds: the launchers meet within ``--join-timeout`` (torch's rendezvous timeout), so do the ranks; a step whose
nodes do not meet ends the sweep in one line. Once every rank has met, the step's own bound runs, as on one node.
Alternate steps meet at P and P + 1, so that a launcher still closing one step's store never holds the next one's.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pcie.runtime import tuned_file
from sglang_pcie.tools.processes import stop_tree, tree_members
from sglang_pcie.tools.tune_nccl.launch import Outcome, last_phase, progress, read_report, tail, worker_environment
from sglang_pcie.tools.tune_nccl.rendezvous import NODE_VAR, RESULT_FILE
from sglang_pcie.tools.tune_nccl.report import CONTENT_DIGEST, content_digest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# A host name or an IPv4 / IPv6 address: what torch's launcher takes as --master-addr, and nothing else.
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
TORCH_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Timeout)\w*): (.+)$")
# NCCL's own word on the network it took (NCCL_DEBUG=INFO): "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ...",
# "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>", "NCCL INFO Using network IB".
NCCL_NETWORK = re.compile(r"NCCL INFO (NET/\S+ ?: Using .*|Using network .*)$")


class NodesApart(Exception):
    """The nodes did not meet at a step, are at different steps, or do not hold the same result: the sweep ends
    there (one line), nothing written."""


@dataclass(frozen=True)
class Nodes:
    count: int
    rank: int
    master_addr: str
    master_port: int
    join_timeout: float
    local: int  # ranks on this node
    fingerprint: dict  # this node's (tuned_file.node_fingerprint)

    def port(self, step: int) -> int:
        """Steps 1, 3, ... meet at --master-port, steps 2, 4, ... at the next port."""
        return self.master_port + (step - 1) % 2

    def describe(self) -> str:
        return (f"node {self.rank} of {self.count}, {self.local} rank(s) here and {self.local * self.count} in all; "
                f"torch's rendezvous at {self.master_addr}:{self.master_port} and :{self.master_port + 1} "
                f"(node 0 serves it), --join-timeout {self.join_timeout:g} s")

    def launcher(self, step: int, worker: list[str]) -> list[str]:
        """torch's launcher for one step on this node (static rendezvous: node 0's launcher serves the store)."""
        return [*TORCHRUN, "--nnodes", str(self.count), "--node-rank", str(self.rank),
                "--nproc-per-node", str(self.local), "--master-addr", self.master_addr,
                "--master-port", str(self.port(step)), "--rdzv-conf", f"timeout={math.ceil(self.join_timeout)}",
                "--max-restarts", "0", "--no-python", *worker]


def nccl_network(lines: list[str]) -> list[str]:
    """The lines where NCCL said which network it uses (with NCCL_DEBUG=INFO; none without)."""
    return [found.group(1).strip()[:200] for found in map(NCCL_NETWORK.search, lines) if found][:3]


def launcher_error(lines: list[str]) -> str:
    """The last exception line torch's launcher wrote, without the module path ("DistStoreError: Timed out ...")."""
    for line in reversed(lines):
        found = TORCH_ERROR.match(line.strip())
        if found:
            return f"{found.group(1)}: {found.group(2)}"[:300]
    return ""


@dataclass
class NodeSteps:
    """This node's steps, numbered in the order every node makes them."""
    nodes: Nodes
    worker_command: list
    step: int = 0
    seen: dict = field(default_factory=dict)  # from the first step every rank met: "nodes" and "ranks"

    def run(self, values: dict, spec: dict, timeout: float, label: str) -> Outcome:
        """One profile's run on every node: this node's ranks, their figures the slowest of all ranks."""
        self.step += 1
        spec = dict(spec, step=self.step, label=label, values=values, nodes=self.nodes.count, local=self.nodes.local)
        with tempfile.TemporaryDirectory(prefix="sglang-pcie-tune-") as folder:
            return self._launch(values, spec, timeout, Path(folder))

    def hand_out(self, result: bytes | None, timeout: float) -> bytes:
        """The last step: node 0 gives ``result``, every node gets back the bytes every node now holds."""
        self.step += 1
        spec = {"publish": True, "step": self.step, "label": "the result", "nodes": self.nodes.count,
                "local": self.nodes.local}
        with tempfile.TemporaryDirectory(prefix="sglang-pcie-tune-") as folder:
            given = None
            if result is not None:
                given = Path(folder) / "given.json"
                given.write_bytes(result)
            outcome = self._launch({}, spec, timeout, Path(folder), given)
            if outcome.error:
                raise NodesApart(f"step {self.step} ({spec['label']}): not handed out: {outcome.error}")
            return (Path(folder) / RESULT_FILE).read_bytes()

    def _launch(self, values: dict, spec: dict, timeout: float, folder: Path, given: Path | None = None) -> Outcome:
        nodes, step = self.nodes, spec["step"]
        env = worker_environment(values)
        env[NODE_VAR] = json.dumps({"run_dir": str(folder), "node": nodes.fingerprint, "join_s": nodes.join_timeout,
                                    "publish": None if given is None else str(given)})
        command = nodes.launcher(step, [*self.worker_command, "--worker", json.dumps(spec)])
        began = time.monotonic()
        with open(folder / "launcher.out", "w") as stdout, open(folder / "launcher.err", "w") as stderr:
            agent = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        try:
            joined_at, timed_out = self._wait(agent, folder, began, timeout)
        finally:
            if agent.poll() is None:  # its ranks run in sessions of their own: the whole tree goes
                stop_tree(agent, {}, grace_s=0)
        reports = [read_report(folder / f"rank{r}.out") for r in range(nodes.local)]
        if step == 1:  # where NCCL says which network it took (NCCL_DEBUG=INFO), this node says it once
            for line in nccl_network(tail(folder / "rank0.err", 400)):
                progress(f"node {nodes.rank}, NCCL: {line}")
        if joined_at is None:
            raise NodesApart(self._apart(spec, reports, folder, agent.returncode))
        wall = time.monotonic() - joined_at
        if all(report and report.get("ok") for report in reports):  # complete, even if a launcher lingered
            info = {k: v for k, v in reports[0].items() if k not in ("rank", "ok", "us", "error", "stage")}
            for key in ("nodes", "ranks"):
                self.seen.setdefault(key, info.get(key))
            us = {int(t): v for t, v in (reports[0].get("us") or {}).items()}
            return Outcome(us, None, wall, info)
        tails = {r: tail(folder / f"rank{r}.err") for r in range(nodes.local)}
        return Outcome(None, self._failure(reports, tails, timed_out, agent.returncode, folder), wall,
                       stderr_tails=tails)

    def _wait(self, agent, folder: Path, began: float, timeout: float) -> tuple[float | None, str | None]:
        """Until the launcher exits or the bound passes: --join-timeout plus ``timeout`` until every local rank has
        met the others, then ``timeout`` from that moment. (the moment they met or None, the time-out or None)"""
        local, deadline, joined_at = self.nodes.local, began + self.nodes.join_timeout + timeout, None
        while True:
            if joined_at is None and all((folder / f"joined{r}").exists() for r in range(local)):
                joined_at = time.monotonic()
                deadline = joined_at + timeout
            if agent.poll() is not None:
                if joined_at is None and all((folder / f"joined{r}").exists() for r in range(local)):
                    joined_at = time.monotonic()
                return joined_at, None
            if time.monotonic() > deadline:
                if joined_at is not None:
                    _dump_stacks(agent.pid)
                return joined_at, f"timed out after {timeout:.0f} s (killed)"
            time.sleep(0.05)

    def _apart(self, spec: dict, reports: list, folder: Path, code: int | None) -> str:
        """One line: why this step's ranks did not all meet (or met and found another step on a node)."""
        nodes, step = self.nodes, f"step {spec['step']} ({spec['label']})"
        ranks = next((r["error"] for r in reports if r and r.get("error") and r.get("stage") != "run"), None)
        if ranks:  # a rank's own word: one did not come, a node is at another step, or it failed before meeting
            return f"{step}: {ranks.removeprefix('JoinError: ')}"
        why = (launcher_error(tail(folder / "launcher.err"))
               or (f"torch's launcher exited with {code}" if code not in (None, 0) else "no rank met the others"))
        others = "1" if nodes.count == 2 else f"1 to {nodes.count - 1}"
        hint = (f"start tune-nccl with the same arguments and --node-rank {others} on the other node(s)"
                if nodes.rank == 0 else "is tune-nccl --node-rank 0 running there, with the same arguments?")
        return (f"{step}: the {nodes.count} nodes did not all meet at torch's rendezvous {nodes.master_addr}:"
                f"{nodes.port(spec['step'])} within --join-timeout {nodes.join_timeout:g} s: {why} ({hint})")

    def _failure(self, reports: list, tails: dict, timed_out: str | None, code: int | None, folder: Path) -> str:
        """One line for a step whose ranks met but did not all report figures."""
        failed = [r for r in reports if r and not r.get("ok")]
        if failed:  # a rank's own error first; else what a rank heard of another's
            first = next((r for r in failed if not r.get("peer")), failed[0])
            # (worded as the other nodes' ranks word it, so that every node says the same)
            return first["error"] if first.get("peer") else (f"rank {first['rank']} (node {self.nodes.rank}) "
                                                             f"failed: {first['error']}")
        if timed_out:
            phases = {rank: last_phase(lines) for rank, lines in sorted(tails.items())}
            return timed_out + ("; last phase: " + ", ".join(f"local rank {rank}: {text or '(none written)'}"
                                                              for rank, text in phases.items())
                                if any(phases.values()) else "")
        missing = next(r for r, report in enumerate(reports) if report is None)
        last = (tails[missing][-1].strip()[:300] if tails[missing]
                else launcher_error(tail(folder / "launcher.err")))
        return (f"local rank {missing} left no report (torch's launcher exited with {code})"
                + (f": {last}" if last else ""))


def _dump_stacks(agent_pid: int) -> None:
    """Ask the launcher's ranks for their Python stacks (SIGUSR1: faulthandler in run_worker) before they are
    killed."""
    ranks = [pid for pid in tree_members(agent_pid) if pid != agent_pid]
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    if ranks:
        time.sleep(1.0)


def share(steps: NodeSteps, config: dict | None, timeout: float) -> dict:
    """Node 0's result (``config``; None on the other nodes) handed to every node in the last step: the config every
    node writes, checked against its content digest and to write as the very bytes node 0 wrote."""
    with tempfile.TemporaryDirectory(prefix="sglang-pcie-tune-") as folder:
        given, again = Path(folder) / "given.json", Path(folder) / "again.json"
        if config is not None:
            try:
                tuned_file.write_config(given, config)  # the tuned file's own bytes, as every node will write them
            except (OSError, ValueError) as exc:
                raise NodesApart(f"node 0's result cannot be handed out: {exc}") from None
        progress(f"step {steps.step + 1}: " + ("handing this node's result to every node" if config is not None
                                               else "receiving node 0's result"))
        received = steps.hand_out(given.read_bytes() if config is not None else None, timeout)
        try:
            shared = json.loads(received)
        except ValueError:
            raise NodesApart("the result handed out by node 0 is not JSON") from None
        if not isinstance(shared, dict) or shared.get(CONTENT_DIGEST) != content_digest(shared):
            raise NodesApart("the result handed out by node 0 does not match its content digest")
        try:
            tuned_file.write_config(again, shared)
        except (OSError, ValueError) as exc:
            raise NodesApart(f"the result handed out by node 0 cannot be written here: {exc}") from None
        if again.read_bytes() != received:
            raise NodesApart("the result handed out by node 0 would not be written byte for byte here")
    return shared
