"""The processes the commands start (sglang_pcie/tools/processes.py): free ports in a bounded range, a process tree
read from /proc (the leader's session and every descendant, zombies left out), stopped whole with what it counted,
and process groups killed and reaped. Real processes; every wait is for a state, never for a length of time."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from sglang_pcie.tools import processes
from sglang_pcie.tools.processes import free_port, kill_groups, stop_tree, tree_members

# A tree whose leader prints one line per event on stdout and reads commands from stdin:
#   "term-proof": a child that ignores SIGTERM; "escaped": a child in a session of its own (it left the group);
#   "quick": a child that ends at once, and is left unreaped (a zombie) until the leader reads "reap";
#   "spawn": one more child; "orphan": a grandchild whose parent has exited (in the leader's session and group, no
#   parent link); "orphan-own-group": the same in a process group of its own. Each pid is printed as "<what> <pid>".
LEADER = textwrap.dedent("""
    import os, signal, subprocess, sys
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    kids = {}
    def say(text):
        print(text, flush=True)
    for line in sys.stdin:
        what = line.strip()
        if what == "term-proof":
            kids[what] = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                           "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
                                           "time.sleep(600)"], stdout=subprocess.PIPE)
            kids[what].stdout.readline()  # its handler is in place
        elif what == "escaped":
            kids[what] = subprocess.Popen(sleep, start_new_session=True)
        elif what == "quick":
            kids[what] = subprocess.Popen([sys.executable, "-c", "pass"])
            while open(f"/proc/{kids[what].pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                pass
        elif what == "reap":
            kids["quick"].wait()
        elif what == "spawn":
            kids[what] = subprocess.Popen(sleep)
        elif what.startswith("graceful "):  # out of the group; on SIGTERM notes it in a file, takes 0.3 s, exits
            note = what.split(" ", 1)[1]
            kids[what] = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\\n"
                                           "def bye(*_):\\n    open(sys.argv[1], 'w').write('TERM')\\n"
                                           "    time.sleep(0.3)\\n    sys.exit(0)\\n"
                                           "signal.signal(signal.SIGTERM, bye); print(1, flush=True); time.sleep(600)",
                                           note], stdout=subprocess.PIPE, start_new_session=True)
            kids[what].stdout.readline()  # its handler is in place
        elif what.startswith("orphan"):  # a grandchild whose parent has exited: no parent link to the leader
            own_group = "os.setpgid(0, 0); " if what == "orphan-own-group" else ""
            grandchild = ("import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
                          f"'import os, time; {own_group}print(os.getpid(), flush=True); time.sleep(600)'], "
                          "stdout=subprocess.PIPE); print(p.stdout.readline().decode().strip(), flush=True)")
            middle = subprocess.run([sys.executable, "-c", grandchild], stdout=subprocess.PIPE, text=True)
            kids[what] = type("Orphan", (), {"pid": int(middle.stdout.split()[0])})
        say(f"{what} {kids[what].pid if what in kids else os.getpid()}")
""")


class Tree:
    """The leader (in a session of its own, as bench starts a server; or, ``session=False``, only leading a process
    group of its own) and the children it was told to start."""

    def __init__(self, session: bool = True):
        where = {"start_new_session": True} if session else {"process_group": 0}
        self.proc = subprocess.Popen([sys.executable, "-c", LEADER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, **where)
        self.pids: dict = {}

    def do(self, what: str) -> int:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        *name, pid = self.proc.stdout.readline().split()
        assert " ".join(name) == what
        self.pids[what] = int(pid)
        return int(pid)

    def kill_all(self):
        for pid in list(self.pids.values()) + [self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


@pytest.fixture
def tree():
    made = Tree()
    yield made
    made.kill_all()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, deadline_s: float = 60) -> bool:
    end = time.monotonic() + deadline_s
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not alive(pid)


# ------------------------------------------------------------------------------------------------------- ports

def held_ports(count: int, leave_last_free: bool = False) -> tuple[int, list]:
    """A first port and sockets bound on ``count`` ports from it (the last left free on request); a port another
    process holds is as taken for free_port as one held here."""
    for _ in range(50):
        base = 20000 + int.from_bytes(os.urandom(2), "big") % 20000
        held = []
        for port in range(base, base + count - (1 if leave_last_free else 0)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        last_free = True
        if leave_last_free:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", base + count - 1))
                except OSError:
                    last_free = False
        if last_free:
            return base, held
        for s in held:
            s.close()
    pytest.fail("no range of free ports found")


def test_free_port_searches_exactly_the_200_ports_from_start():
    base, held = held_ports(200, leave_last_free=True)
    try:
        assert free_port("127.0.0.1", base) == base + 199  # the last port of the range is still in it
    finally:
        for s in held:
            s.close()
    base, held = held_ports(200)
    try:
        with pytest.raises(RuntimeError, match=rf"^no free port in {base}\.\.{base + 199}$"):
            free_port("127.0.0.1", base)
    finally:
        for s in held:
            s.close()


def test_free_port_takes_the_first_free_one_and_without_start_one_the_kernel_picks():
    base, held = held_ports(1)
    try:
        port = free_port("127.0.0.1", base)
        assert base < port < base + 200
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # it is free now
    finally:
        for s in held:
            s.close()
    low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    port = free_port()
    assert low <= port <= high  # the kernel's pick, from its ephemeral range
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# ------------------------------------------------------------------------------------------------------- trees

def test_the_tree_is_the_session_and_every_descendant_without_zombies(tree):
    escaped, term_proof, quick = tree.do("escaped"), tree.do("term-proof"), tree.do("quick")
    members = tree_members(tree.proc.pid)
    # the escaped child left the session but is still a child; the zombie is not a process to stop
    assert set(members) == {tree.proc.pid, escaped, term_proof}
    assert quick not in members
    with open(f"/proc/{escaped}/stat") as f:
        assert members[escaped] == int(f.read().rsplit(")", 1)[1].split()[19])  # its start time, from /proc
    assert tree_members(2 ** 22 + 1) == {}  # no such leader: nothing


def test_members_without_a_parent_link_are_found_by_session_and_by_process_group():
    in_session = Tree()
    group_only = Tree(session=False)  # its session is the test's: only the process group tells its members
    try:
        orphan, own_group = in_session.do("orphan"), in_session.do("orphan-own-group")
        assert set(tree_members(in_session.proc.pid)) == {in_session.proc.pid, orphan, own_group}
        grouped = group_only.do("orphan")
        assert set(tree_members(group_only.proc.pid)) == {group_only.proc.pid, grouped}
    finally:
        in_session.kill_all()
        group_only.kill_all()


def test_a_command_name_holding_spaces_and_parentheses_is_read(tmp_path):
    odd = tmp_path / "a) b (c"
    odd.symlink_to(sys.executable)
    proc = subprocess.Popen([str(odd), "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert set(tree_members(proc.pid)) == {proc.pid}
    finally:
        proc.stdin.close()
        proc.wait()


def test_stop_counts_the_processes_alive_when_it_began_and_those_started_after_ready(tree):
    quick = tree.do("quick")
    tree.do("term-proof")
    tree.do("reap")  # the quick child has ended: a member of `known` that the stop did not stop
    known = tree_members(tree.proc.pid)
    known[quick] = 1  # as seen at ready, before it ended (its start time no longer matters: it is gone)
    spawned = tree.do("spawn")  # after ready
    escaped = tree.do("escaped")  # after ready, and out of the group: reached through its parent link
    result = stop_tree(tree.proc, known, grace_s=0.5)
    assert result["processes"] == 4  # leader, term-proof, spawned, escaped: not the one that had ended
    assert result["started_after_ready"] == 2  # spawned and escaped
    assert tree.pids["term-proof"] in result["sigkilled"]  # it ignored SIGTERM
    assert result["survivors"] == [] and not any(alive(pid) for pid in (spawned, escaped, tree.proc.pid))
    assert tree.proc.returncode is not None  # the leader was reaped


def test_a_member_that_left_the_group_gets_sigterm_and_the_grace_time_first(tree, tmp_path):
    """SIGTERM reaches a member outside the process group too, and nothing is SIGKILLed while every member ends
    within ``grace_s`` (here each takes 0.3 s to end; the stop returns as soon as none is left)."""
    note = tmp_path / "got"
    graceful = tree.do(f"graceful {note}")
    result = stop_tree(tree.proc, tree_members(tree.proc.pid), grace_s=30)
    assert note.read_text() == "TERM" and result["sigkilled"] == [] and result["survivors"] == []
    assert result["processes"] == 2 and not alive(graceful)


def test_a_member_that_cannot_be_stopped_is_named_with_its_command_line(tree, monkeypatch):
    escaped = tree.do("escaped")  # out of the group: only a signal to its pid reaches it
    real_signal = processes._signal
    monkeypatch.setattr(processes, "_signal", lambda pid, sig: None if pid == escaped else real_signal(pid, sig))
    monkeypatch.setattr(processes, "KILL_WAIT_S", 0.5)
    result = stop_tree(tree.proc, tree_members(tree.proc.pid), grace_s=0.2)
    assert result["started_after_ready"] == 0 and result["processes"] == 2
    assert escaped in result["sigkilled"]
    assert [s["pid"] for s in result["survivors"]] == [escaped]
    assert "time.sleep(600)" in result["survivors"][0]["cmdline"] and alive(escaped)


def test_kill_groups_takes_the_children_also_of_a_leader_that_already_exited():
    orphaning = textwrap.dedent("""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(child.pid, flush=True)
    """)  # the leader exits at once, leaving its child in its process group
    leaders = [subprocess.Popen([sys.executable, "-c", orphaning], stdout=subprocess.PIPE, text=True,
                                start_new_session=True) for _ in range(2)]
    children = [int(p.stdout.readline()) for p in leaders]
    kill_groups(leaders)
    assert all(p.returncode is not None for p in leaders)  # reaped
    assert all(wait_gone(pid) for pid in children)
