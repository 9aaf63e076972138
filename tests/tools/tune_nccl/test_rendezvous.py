"""One rank's side of a step across nodes (sglang_pcie/tools/tune_nccl/rendezvous.py), each rank a thread over one
in-memory store with the interface of torch's TCPStore (set, get, check, wait with a timeout): the meeting (every
rank, the same step, every node), the slowest rank's figures, a failure said at once and named by the others, and
node 0's result handed to every node. (test_nodes.py runs real ranks through torch's launcher.)"""
from __future__ import annotations

import hashlib
import json
import threading
from datetime import timedelta

import pytest

from sglang_pcie.tools.tune_nccl import rendezvous
from sglang_pcie.tools.tune_nccl.rendezvous import JoinError, PeerFailed, Rendezvous, differences


class Store:
    """TCPStore's calls the rendezvous makes; ``wait`` raises (as torch's does) when a key is missing at the end."""

    def __init__(self):
        self.data, self.changed = {}, threading.Condition()

    def set(self, key, value):
        with self.changed:
            self.data[key] = value.encode() if isinstance(value, str) else value
            self.changed.notify_all()

    def get(self, key):
        with self.changed:
            self.changed.wait_for(lambda: key in self.data, timeout=30)
            return self.data[key]

    def check(self, keys):
        with self.changed:
            return all(k in self.data for k in keys)

    def wait(self, keys, timeout):
        with self.changed:
            if not self.changed.wait_for(lambda: all(k in self.data for k in keys), timeout=timeout.total_seconds()):
                raise RuntimeError("Socket Timeout")


class Dist:
    def __init__(self):
        self.store = Store()

    def TCPStore(self, addr, port, is_master, timeout):  # noqa: N802 (torch's name)
        assert (addr, port, is_master) == ("node0", 29500, False)
        return self.store


def spec_for(nodes=2, local=2, step=3, tokens=(1, 8)):
    return {"step": step, "nodes": nodes, "local": local, "tokens": list(tokens), "profile": "default"}


def ranks(monkeypatch, dist, nodes=2, local=2, spec=None, join_s=5.0, skip=(), node_of=None, tmp_path=None):
    """A Rendezvous per rank (``skip``: ranks that never come), built as each rank's process would."""
    made = {}
    for rank in range(nodes * local):
        if rank in skip:
            continue
        env = {"RANK": str(rank), "WORLD_SIZE": str(nodes * local), "LOCAL_RANK": str(rank % local),
               "GROUP_RANK": str((node_of or {}).get(rank, rank // local)), "MASTER_ADDR": "node0",
               "MASTER_PORT": "29500"}
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            made[rank] = Rendezvous(dist, spec(rank) if callable(spec) else (spec or spec_for(nodes, local)),
                                    {"join_s": join_s})
    return made


def together(calls: dict) -> dict:
    """rank -> what its call returned (or the exception it raised), every rank in its own thread."""
    out = {}

    def run(rank, call):
        try:
            out[rank] = call()
        except Exception as exc:  # noqa: BLE001 (the test looks at it)
            out[rank] = exc
    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_differences_names_each_key_two_ranks_disagree_on():
    assert differences({"tokens": [1, 2], "step": 3, "x": 1}, {"tokens": [1, 4], "step": 3}) == (
        "tokens [1, 2] (here [1, 4]), x 1 (here None)")
    assert differences({"a": 1}, {"a": 1}) == ""


def test_the_ranks_meet_and_learn_every_nodes_fingerprint_and_every_ranks_device(monkeypatch):
    dist = Dist()
    made = ranks(monkeypatch, dist)
    got = together({r: (lambda r=r: made[r].join({"node": r // 2}, f"cuda:{r % 2}")) for r in made})
    assert all(v == got[0] for v in got.values())
    assert got[0] == {"nodes": [{"node": 0}, {"node": 1}],  # each node's fingerprint: its first rank's
                      "ranks": [{"rank": r, "node": r // 2, "device": f"cuda:{r % 2}"} for r in range(4)]}


def test_a_rank_that_never_comes_is_named_with_its_node(monkeypatch):
    made = ranks(monkeypatch, Dist(), join_s=0.3, skip={3})
    got = together({r: (lambda r=r: made[r].join({}, "cpu")) for r in made})
    for error in got.values():
        assert isinstance(error, JoinError)
        assert str(error) == "rank(s) 3 (node 1) did not reach step 3 within 0.3 s (RuntimeError)"


def test_a_rank_running_another_step_is_told_what_differs(monkeypatch):
    made = ranks(monkeypatch, Dist(), spec=lambda r: spec_for(tokens=(1, 4) if r == 3 else (1, 8)))
    got = together({r: (lambda r=r: made[r].join({}, "cpu")) for r in made})
    assert str(got[0]) == ("node 1 (rank 3) runs something else at step 3: tokens [1, 4] (here [1, 8]); start every"
                           " node with the same arguments")
    assert str(got[3]).startswith("node 0 (rank 0) runs something else at step 3: tokens [1, 8] (here [1, 4])")


def test_ranks_from_other_nodes_than_0_to_n_minus_1_are_refused(monkeypatch):
    made = ranks(monkeypatch, Dist(), node_of={2: 0, 3: 0})  # every rank says node 0: node 1 never came
    got = together({r: (lambda r=r: made[r].join({}, "cpu")) for r in made})
    assert all(str(e) == "the ranks came from nodes [0], not 0..1" for e in got.values())


def test_every_rank_learns_the_slowest_figure_per_size(monkeypatch):
    made = ranks(monkeypatch, Dist())
    figures = {0: {"1": 10.0, "8": 20.0}, 1: {"1": 12.0, "8": 19.0}, 2: {"1": 11.0, "8": None}, 3: {"1": 9.0, "8": 25}}
    got = together({r: (lambda r=r: made[r].slowest(figures[r])) for r in made})
    assert all(v == {"1": 12.0, "8": None} for v in got.values())  # a size where one rank has no figure: none


def test_a_failure_is_said_at_once_and_every_other_rank_names_it(monkeypatch):
    made = ranks(monkeypatch, Dist())  # rank 3 never posts figures: the others do not wait for it
    calls = {0: lambda: made[0].slowest({"1": 1.0}), 1: lambda: made[1].fail("CUDA error: out of memory"),
             2: lambda: made[2].slowest({"1": 1.0})}
    got = together(calls)
    assert got[1] is None
    for r in (0, 2):
        assert isinstance(got[r], PeerFailed) and str(got[r]) == "rank 1 (node 0) failed: CUDA error: out of memory"
    assert json.loads(made[0].store.get(f"{rendezvous.KEY}/3/failed")) == {"rank": 1,
                                                                          "error": "CUDA error: out of memory"}


def test_a_rank_failing_after_another_names_the_first(monkeypatch):
    made = ranks(monkeypatch, Dist())
    made[2].fail("NCCL error: unhandled system error")
    with pytest.raises(PeerFailed, match=r"^rank 2 \(node 1\) failed: NCCL error: unhandled system error$"):
        made[0].fail("Connection closed by peer")


def test_every_rank_posted_and_one_failed_is_named(monkeypatch):
    made = ranks(monkeypatch, Dist(), nodes=1)
    made[1].post("figures", {"us": None, "error": "wrong sums"})  # posted its failure, not the failed key
    with pytest.raises(PeerFailed, match=r"^rank 1 \(node 0\) failed: wrong sums$"):
        made[0].slowest({"1": 1.0})


def test_node_0s_result_reaches_every_node_and_each_checks_the_bytes(monkeypatch, tmp_path):
    published = tmp_path / "publish.json"
    published.write_bytes(b'{"winner": "fast"}')
    made = ranks(monkeypatch, Dist())
    folders = {r: tmp_path / f"node{r // 2}" for r in made}
    for folder in folders.values():
        folder.mkdir(exist_ok=True)
    got = together({r: (lambda r=r: made[r].hand_out({"run_dir": str(folders[r]), "publish": str(published)}))
                    for r in made})
    digest = hashlib.sha256(b'{"winner": "fast"}').hexdigest()
    assert all(v == digest for v in got.values())
    assert (tmp_path / "node1" / rendezvous.RESULT_FILE).read_bytes() == b'{"winner": "fast"}'


def test_a_node_holding_other_bytes_fails_the_hand_out(monkeypatch, tmp_path):
    made = ranks(monkeypatch, Dist())
    for r in (1, 2, 3):  # they say they hold something else
        made[r].post("received", "f" * 64 if r == 2 else None)
    published = tmp_path / "p.json"
    published.write_bytes(b"x")
    with pytest.raises(RuntimeError, match="the nodes do not hold the same result"):
        made[0].hand_out({"run_dir": str(tmp_path), "publish": str(published)})


def test_the_join_bound_is_the_stores_timeout(monkeypatch):
    made = ranks(monkeypatch, Dist(), nodes=1, local=1, join_s=2.5)
    assert made[0].join_wait == timedelta(seconds=2.5) and made[0]._node_of(0) == "node 0"
