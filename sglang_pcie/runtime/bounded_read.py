"""Reading a small JSON file a user hands us, in a process that must not hang or break: a regular file only, a size
cap, a nesting cap and a time bound. Every violation is a one-line reason; nothing here raises.

Used where SGLang's own processes read a file at start: the tuned NCCL file and SGLang's ``--config`` YAML file, read
when ``sglang`` is imported.
"""
from __future__ import annotations

import json
import os
import re
import stat
import threading

MAX_BYTES = 256 * 1024  # a tune-nccl result is a few KiB
MAX_DEPTH = 16  # a tune-nccl result nests 4 levels
TIME_BOUND_S = 10.0  # a local file reads in microseconds, even on a loaded machine; a hung network mount never returns

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class Unreadable(Exception):
    """Why a file was not read: one line."""


def read_json(path: os.PathLike | str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
              time_bound_s: float = TIME_BOUND_S):
    """The JSON value in ``path``; FileNotFoundError where there is no such file; Unreadable (one line) for
    anything else that keeps it from being read: not a regular file, too large, not UTF-8, not JSON, nested too
    deep, or not read within ``time_bound_s`` (the reading thread is left behind, blocked, as a daemon)."""
    text = read_text(path, max_bytes, time_bound_s)
    depth = nesting_depth(text)
    if depth > max_depth:
        raise Unreadable(f"nests {depth} levels deep (at most {max_depth})")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Unreadable(f"is not valid JSON ({exc})") from None


def read_text(path: os.PathLike | str, max_bytes: int = MAX_BYTES, time_bound_s: float = TIME_BOUND_S) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``, read within ``time_bound_s``; FileNotFoundError or
    Unreadable (one line) otherwise."""
    outcome: list = []

    def read():
        try:
            outcome.append(_read_bytes(path, max_bytes))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    reader = threading.Thread(target=read, name="sglang-pcie-bounded-read", daemon=True)
    reader.start()
    reader.join(time_bound_s)
    if not outcome:
        raise Unreadable(f"not read within {time_bound_s:g} s (a hung network filesystem?)")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    raw = outcome[0]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unreadable(f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_bytes(path, max_bytes: int) -> bytes:
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Unreadable(f"cannot be opened ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        for test, kind in _KINDS:
            if test(info.st_mode):
                raise Unreadable(f"is {kind}, not a regular file")
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable("is not a regular file")
        if info.st_size > max_bytes:
            raise Unreadable(f"is {info.st_size} bytes, more than the {max_bytes} read from such a file")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # grew while read
                raise Unreadable(f"is more than the {max_bytes} bytes read from such a file")
        return b"".join(chunks)
    except OSError as exc:
        raise Unreadable(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def nesting_depth(text: str) -> int:
    """How deep ``[`` and ``{`` nest in JSON text (brackets inside strings do not count): checked before parsing, so
    that no input can exhaust the parser's recursion."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
