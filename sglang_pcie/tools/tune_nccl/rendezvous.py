"""One rank's side of a step across nodes (``tune-nccl --nnodes N``): torch's launcher (torchrun) started it on every
node, its rendezvous store served by node 0's launcher at ``--master-addr``. Through that store the ranks check that
every node runs the same step (the same profile, sizes and ranks), learn every node's fingerprint, share their
figures (so that every node knows the slowest rank) and carry node 0's result to every node. Runs in a worker
process; the parent's side is ``nodes``.

What the node's parent tells its own workers (``NODE_VAR``, JSON): the folder for their output files, this node's
fingerprint, the join bound, and on node 0 in the last step the file holding the result to hand out.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

NODE_VAR = "SGLANG_PCIE_TUNE_NODE"
KEY = "sglang-pcie-tune"
RESULT_FILE = "result.json"
FIGURES_POLL = timedelta(seconds=1)  # how often a rank waiting for the others' figures looks for a failure


class JoinError(RuntimeError):
    """The ranks did not all meet at this step, or do not run the same step: the nodes are apart."""


class PeerFailed(RuntimeError):
    """Another rank of this step failed (its own error is in the message): this rank stops too."""


def local_setup() -> dict:
    """What this node's parent tells its workers; stdout and stderr go to this rank's files in its folder (torch's
    launcher passes one shared stream to every local rank)."""
    local = json.loads(os.environ[NODE_VAR])
    folder, rank = Path(local["run_dir"]), os.environ["LOCAL_RANK"]
    for stream, name in ((sys.stdout, f"rank{rank}.out"), (sys.stderr, f"rank{rank}.err")):
        stream.flush()
        with open(folder / name, "w") as target:
            os.dup2(target.fileno(), stream.fileno())
    return local


def mark_joined(local: dict) -> None:
    """Tells the parent this rank met every other rank: from now on the step's own time bound runs."""
    (Path(local["run_dir"]) / f"joined{os.environ['LOCAL_RANK']}").touch()


def differences(theirs: dict, mine: dict) -> str:
    """The spec keys two ranks disagree on, for people: "tokens [1, 2] (here [1, 4])"."""
    keys = sorted(set(theirs) | set(mine))
    return ", ".join(f"{key} {theirs.get(key)!r} (here {mine.get(key)!r})" for key in keys
                     if theirs.get(key) != mine.get(key))


class Rendezvous:
    """This rank's connection to the step's store (node 0's launcher serves it), and the exchanges through it."""

    def __init__(self, dist, spec: dict, local: dict):
        env = os.environ
        self.rank, self.world = int(env["RANK"]), int(env["WORLD_SIZE"])
        self.node, self.local_rank = int(env["GROUP_RANK"]), int(env["LOCAL_RANK"])
        self.spec, self.step = spec, spec["step"]
        self.join_wait = timedelta(seconds=float(local["join_s"]))
        self.store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                                   timeout=self.join_wait)
        self.nodes_of = {}  # rank -> node, as each said at the meeting
        self.failed = f"{KEY}/{self.step}/failed"  # the first rank to fail at this step, and why

    def _node_of(self, rank: int) -> str:
        """The node a rank runs on: as it said at the meeting, else as torch's launcher numbers ranks (node by node,
        ``local`` each)."""
        return f"node {self.nodes_of.get(rank, rank // self.spec['local'])}"

    def _key(self, what: str, rank: int | str) -> str:
        return f"{KEY}/{self.step}/{what}/{rank}"

    def post(self, what: str, value) -> None:
        self.store.set(self._key(what, self.rank), json.dumps(value))

    def everyone(self, what: str, value, wait: timedelta) -> list:
        """Every rank's ``value`` (this one's posted first), in rank order; JoinError naming the ranks (and nodes)
        that posted nothing within ``wait``."""
        self.post(what, value)
        keys = [self._key(what, rank) for rank in range(self.world)]
        try:
            self.store.wait(keys, wait)
        except Exception as exc:
            missing = [rank for rank, key in enumerate(keys) if not self.store.check([key])]
            if not missing:
                raise
            nodes = sorted({self._node_of(rank) for rank in missing})
            raise JoinError(f"rank(s) {', '.join(map(str, missing))} ({', '.join(nodes)}) did not reach step "
                            f"{self.step} within {wait.total_seconds():g} s ({type(exc).__name__})") from None
        return [json.loads(self.store.get(key)) for key in keys]

    def join(self, fingerprint: dict, device: str) -> dict:
        """Meet every rank of this step; JoinError when one does not come or runs another step. Returns what the
        report carries about the nodes: every node's fingerprint (node order) and every rank's node and device."""
        mine = {"node": self.node, "spec": self.spec, "fingerprint": fingerprint, "device": device}
        ranks = self.everyone("join", mine, self.join_wait)
        for rank, theirs in enumerate(ranks):
            if theirs["spec"] != self.spec:
                raise JoinError(f"node {theirs['node']} (rank {rank}) runs something else at step {self.step}: "
                                f"{differences(theirs['spec'], self.spec)}; start every node with the same arguments")
        self.nodes_of = {rank: theirs["node"] for rank, theirs in enumerate(ranks)}
        nodes = {}
        for theirs in ranks:
            nodes.setdefault(theirs["node"], theirs["fingerprint"])
        if sorted(nodes) != list(range(self.spec["nodes"])):
            raise JoinError(f"the ranks came from nodes {sorted(nodes)}, not 0..{self.spec['nodes'] - 1}")
        return {"nodes": [nodes[n] for n in range(len(nodes))],
                "ranks": [{"rank": rank, "node": theirs["node"], "device": theirs["device"]}
                          for rank, theirs in enumerate(ranks)]}

    def fail(self, error: str) -> None:
        """This rank's measurement failed: say so to the others at once (they stop waiting for its figures). A rank
        whose peer died fails too (gloo: "Connection closed by peer"), so where another rank posted a failure first,
        that one says what happened: PeerFailed names it."""
        self.post("figures", {"us": None, "error": error})
        self._raise_posted()
        self.store.set(self.failed, json.dumps({"rank": self.rank, "error": error}))

    def slowest(self, us: dict) -> dict:
        """Every rank's figures shared: tokens -> the slowest rank's microseconds (None where a rank had none).
        PeerFailed as soon as a rank posts a failure, without waiting for ranks that may never post (one stuck in a
        collective: the parent's bound ends it)."""
        self.post("figures", {"us": us, "error": None})
        keys = [self._key("figures", rank) for rank in range(self.world)]
        while True:
            try:
                self.store.wait(keys, FIGURES_POLL)
                break
            except Exception:
                self._raise_posted()  # else not there yet, and nobody failed: wait on
        ranks = [json.loads(self.store.get(key)) for key in keys]
        bad = next((rank for rank, theirs in enumerate(ranks) if theirs["error"]), None)
        if bad is not None:  # every rank posted, one of them a failure
            raise PeerFailed(f"rank {bad} ({self._node_of(bad)}) failed: {ranks[bad]['error']}")
        slowest = {}
        for tokens in us:
            values = [theirs["us"].get(tokens) for theirs in ranks]
            slowest[tokens] = None if None in values else max(values)
        return slowest

    def _raise_posted(self) -> None:
        """PeerFailed naming the rank that posted a failure at this step, if one did."""
        if self.store.check([self.failed]):
            theirs = json.loads(self.store.get(self.failed))
            raise PeerFailed(f"rank {theirs['rank']} ({self._node_of(theirs['rank'])}) failed: {theirs['error']}")

    def hand_out(self, local: dict) -> str:
        """Node 0's result to every node: rank 0 puts the file's bytes in the store, each node's first rank writes
        them to its folder; every rank then says what it holds (the bytes' sha256), and each checks that every node
        holds the same bytes."""
        key = f"{KEY}/{self.step}/result"
        if self.rank == 0:
            self.store.set(key, Path(local["publish"]).read_bytes())
        held = None
        if self.local_rank == 0:
            data = self.store.get(key)  # waits, within the join bound, for rank 0's
            (Path(local["run_dir"]) / RESULT_FILE).write_bytes(data)
            held = hashlib.sha256(data).hexdigest()
        received = [h for h in self.everyone("received", held, self.join_wait) if h]
        if len(received) != self.spec["nodes"] or len(set(received)) != 1:
            raise RuntimeError(f"the nodes do not hold the same result: {received}")
        return received[0]
