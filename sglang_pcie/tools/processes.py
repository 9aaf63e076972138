"""Processes the commands start: free ports, and stopping a process tree (a server, a sweep's ranks) whole."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

KILL_WAIT_S = 10.0  # after SIGKILL, how long to wait for a tree to disappear before naming survivors


def free_port(host: str = "127.0.0.1", start: int | None = None) -> int:
    """A port ``host`` can bind now: the first free one of ``start``..``start + 199`` (a server the user may want
    at a known port), or with no ``start`` one the kernel picks (a rendezvous nobody types)."""
    if start is None:
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    for port in range(start, start + 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}..{start + 199}")


def _proc_stat(pid: int):
    """(ppid, pgrp, session, starttime, state) from /proc/PID/stat, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()  # after the command name, which may hold spaces and ')'
    return int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]), fields[0]


def tree_members(leader: int) -> dict:
    """pid -> starttime of the leader's session and of every descendant (by parent links), zombies excluded."""
    stats = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None and stat[4] != "Z":
                stats[int(entry)] = stat
    members = {pid for pid, s in stats.items() if s[2] == leader or s[1] == leader}
    if leader in stats:
        members.add(leader)
    grew = True
    while grew:
        children = {pid for pid, s in stats.items() if s[0] in members} - members
        grew = bool(children)
        members |= children
    return {pid: stats[pid][3] for pid in members}


def _alive(pid: int, starttime: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[3] == starttime and stat[4] != "Z"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return "?"


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tree(proc: subprocess.Popen, known: dict, grace_s: float) -> dict:
    """SIGTERM the server's process group (and any member that left it), wait ``grace_s``, SIGKILL what is left,
    and wait until none remains. Returns what happened, with any survivor named: ``processes`` counts those alive
    when the stop began (a member of ``known`` that had already ended is not one it stopped), and
    ``started_after_ready`` those of them ``known`` (the processes seen at ready) did not hold."""
    members = dict(known)
    members.update(tree_members(proc.pid))
    members = {pid: start for pid, start in members.items() if _alive(pid, start)}
    started = time.monotonic()
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    for pid, start in members.items():
        if _alive(pid, start):
            _signal(pid, signal.SIGTERM)

    def remaining():
        proc.poll()  # reap the leader
        return {pid: start for pid, start in members.items() if _alive(pid, start)}

    deadline = time.monotonic() + grace_s
    while remaining() and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = remaining()
    if killed:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in killed:
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S
        while remaining() and time.monotonic() < deadline:
            time.sleep(0.2)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    survivors = remaining()
    return {"processes": len(members), "started_after_ready": len(set(members) - set(known)),
            "sigkilled": sorted(killed), "stop_s": round(time.monotonic() - started, 2),
            "survivors": [{"pid": pid, "cmdline": _cmdline(pid)} for pid in sorted(survivors)]}


def kill_groups(processes) -> None:
    """SIGKILL the process group of each (each started in its own session), then reap them: takes any children
    with them, also when the leader itself has already exited."""
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for process in processes:
        process.wait()
