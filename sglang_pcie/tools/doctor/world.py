"""Where doctor reads the machine from: a root folder for files (sysfs, /proc) and a runner for commands.

The live world is ``/`` and real subprocesses; a recorded world (``--facts DIR``, the tests' fixtures under
``tests/support/data/host-facts/``) is a folder laid out like ``/`` (``sys/...``, ``proc/...``) plus the output of
each command it ran (``commands.json`` names them). The parsers are the same for both: real parsing, fake world.
``--record DIR`` writes what a live run read into that layout, so a machine's facts become a fixture as they are.

Every read is bounded in size, every command in time; a fact that cannot be read raises ``NotVisible`` with the
reason (no such file, permission denied, tool not installed, timed out), never a guess.
"""
from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

MAX_READ_BYTES = 256 * 1024  # sysfs attributes are a page; /proc/cmdline and the NVIDIA version file are short
COMMANDS_FILE = "commands.json"
UNREADABLE_FILE = "unreadable.json"  # recorded reads that failed, and why (permission denied is not absence)


class NotVisible(Exception):
    """A fact this process cannot see: the message says why, in a few words."""


@dataclass
class Completed:
    """One command's outcome. ``missing``: the tool is not installed; ``timed_out``: killed at its bound (its
    output so far is kept: the P2P check reads where it stopped)."""
    key: str
    rc: int | None
    stdout: str
    stderr: str = ""
    missing: bool = False
    timed_out: bool = False
    seconds: float = 0.0

    def problem(self) -> str | None:
        if self.missing:
            return f"`{self.key}` not available ({self.stderr or 'not installed'})"
        if self.timed_out:
            return f"`{self.key}` did not finish in {self.seconds:.0f} s (killed)"
        if self.rc != 0:
            last = (self.stderr.strip() or self.stdout.strip()).splitlines()[-1:] or [""]
            return f"`{self.key}` exited with {self.rc}" + (f": {last[0][:200]}" if last[0] else "")
        return None


def _why(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (needs root)"
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return "no such file"
    return exc.strerror or type(exc).__name__


class World:
    """The live machine: files under ``root`` (``/``) and real commands, each bounded."""
    live = True

    def __init__(self, root: str | os.PathLike = "/", environ=None):
        self.root = Path(root)
        self.environ = dict(os.environ if environ is None else environ)

    def path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str, limit: int = MAX_READ_BYTES) -> str:
        try:
            with open(self.path(path), "rb") as f:
                return f.read(limit).decode("utf-8", "replace")
        except OSError as exc:
            raise NotVisible(f"{path}: {_why(exc)}") from None

    def listdir(self, path: str) -> list[str]:
        """Entries of a folder, sorted, without dot files (fixtures keep empty folders with a .gitkeep)."""
        try:
            return sorted(name for name in os.listdir(self.path(path)) if not name.startswith("."))
        except OSError as exc:
            raise NotVisible(f"{path}: {_why(exc)}") from None

    def exists(self, path: str) -> bool:
        return os.path.exists(self.path(path))

    def run(self, argv: list[str], timeout: float, key: str | None = None, env: dict | None = None) -> Completed:
        """``argv`` in its own session, killed whole at ``timeout``; output decoded leniently."""
        key = key or shlex.join(argv)
        exe = shutil.which(argv[0], path=self.environ.get("PATH"))
        if exe is None:
            return Completed(key, None, "", missing=True)
        began = time.monotonic()
        try:
            process = subprocess.Popen([exe, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       env=self.environ if env is None else env)
        except OSError as exc:
            return Completed(key, None, "", str(exc), missing=True)
        try:
            out, err = process.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            out, err = process.communicate()
            timed_out = True
        return Completed(key, process.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                         timed_out=timed_out, seconds=time.monotonic() - began)


class RecordedWorld(World):
    """A machine recorded in a folder: files under it, commands answered from ``commands.json``
    (``{"nvidia-smi -q": {"stdout": "commands/nvidia-smi-q.txt", "rc": 0}, "lspci -D -vvv": {"missing": true}}``;
    a command it does not name was not installed there)."""
    live = False

    def __init__(self, folder: str | os.PathLike, environ=None):
        super().__init__(folder, environ)
        self.commands = self._json(COMMANDS_FILE)
        self.unreadable = self._json(UNREADABLE_FILE)

    def _json(self, name: str) -> dict:
        try:
            return json.loads((self.root / name).read_text())
        except FileNotFoundError:
            return {}

    def read(self, path: str, limit: int = MAX_READ_BYTES) -> str:
        if path in self.unreadable:
            raise NotVisible(f"{path}: {self.unreadable[path]}")
        return super().read(path, limit)

    def listdir(self, path: str) -> list[str]:
        if path in self.unreadable:
            raise NotVisible(f"{path}: {self.unreadable[path]}")
        return super().listdir(path)

    def run(self, argv: list[str], timeout: float, key: str | None = None, env: dict | None = None) -> Completed:
        key = key or shlex.join(argv)
        entry = self.commands.get(key)
        if entry is None:
            return Completed(key, None, "", "not in this recording", missing=True)
        if entry.get("missing"):
            return Completed(key, None, "", "not installed there", missing=True)
        stdout = (self.root / entry["stdout"]).read_text() if entry.get("stdout") else ""
        stderr = (self.root / entry["stderr"]).read_text() if entry.get("stderr") else ""
        return Completed(key, entry.get("rc", 0), stdout, stderr, timed_out=bool(entry.get("timed_out")),
                         seconds=float(entry.get("seconds", timeout if entry.get("timed_out") else 0.0)))


class RecordingWorld(World):
    """The live machine, with every read, listing and command also written to ``out`` in RecordedWorld's layout."""

    def __init__(self, out: str | os.PathLike, environ=None):
        super().__init__("/", environ)
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.commands: dict = {}
        self.unreadable: dict = {}

    def _save(self, name: str, data: dict) -> None:
        (self.out / name).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")

    def _failed(self, path: str, exc: NotVisible) -> None:
        why = str(exc).split(": ", 1)[-1]
        if why != "no such file":
            self.unreadable[path] = why
            self._save(UNREADABLE_FILE, self.unreadable)

    def read(self, path: str, limit: int = MAX_READ_BYTES) -> str:
        try:
            text = super().read(path, limit)
        except NotVisible as exc:
            self._failed(path, exc)
            raise
        target = self.out / path.lstrip("/")
        if target.is_dir() and [p.name for p in target.iterdir()] == [".gitkeep"]:  # listed before, a file after all
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return text

    def listdir(self, path: str) -> list[str]:
        try:
            names = super().listdir(path)
        except NotVisible as exc:
            self._failed(path, exc)
            raise
        folder = self.out / path.lstrip("/")
        for name in names:  # an entry becomes a folder (kept by git through .gitkeep) unless a read makes it a file
            if not (folder / name).is_file():
                (folder / name).mkdir(parents=True, exist_ok=True)
                (folder / name / ".gitkeep").touch()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".gitkeep").touch()
        return names

    def exists(self, path: str) -> bool:
        found = super().exists(path)
        if found and not (self.out / path.lstrip("/")).exists():
            (self.out / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
            (self.out / path.lstrip("/") / ".gitkeep").touch()
        return found

    def run(self, argv: list[str], timeout: float, key: str | None = None, env: dict | None = None) -> Completed:
        done = super().run(argv, timeout, key, env)
        if done.missing:
            self.commands[done.key] = {"missing": True}
        else:
            slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in done.key.split("/")[-1])[:80]
            name = f"commands/{len(self.commands):02d}-{slug}"
            (self.out / "commands").mkdir(exist_ok=True)
            (self.out / f"{name}.out").write_text(done.stdout)
            (self.out / f"{name}.err").write_text(done.stderr)
            self.commands[done.key] = {"stdout": f"{name}.out", "stderr": f"{name}.err", "rc": done.rc,
                                       "timed_out": done.timed_out, "seconds": round(done.seconds, 3)}
        self._save(COMMANDS_FILE, self.commands)
        return done
