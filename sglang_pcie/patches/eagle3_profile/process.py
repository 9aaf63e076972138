"""The process the profiler runs in: its identity (run id: start time and pid) and the flush of the last partial
interval at exit and on SIGTERM."""
from __future__ import annotations

import atexit
import os
import signal
import threading
import time

_IMPORT_TIME = time.time()


def process_start_time() -> float:
    """Unix time this process started (Linux: /proc), else the time this module was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks
        with open("/proc/stat", encoding="ascii") as stat:
            boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except Exception:
        return _IMPORT_TIME


def run_identity() -> tuple[str, float]:
    """(run id, process start time): the id is the start time (UTC, to the second) and the pid."""
    started = process_start_time()
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(started))}-{os.getpid()}", round(started, 2)


# ----------------------------------------------------------------------------------------- exit flush

_exit_hooks_installed = False
_exit_profiler = None  # the profiler to flush at exit: the process's, bound last (one per scheduler process)


def install_exit_flush(profiler) -> None:
    """Flush ``profiler`` at interpreter exit and on SIGTERM (the hooks are installed once per process; a later
    profiler replaces the one they flush).

    The SIGTERM handler flushes, then does what was there before: a Python handler is called; the default action
    (terminate) is restored and the signal raised again, so the exit status is unchanged.  An ignored SIGTERM stays
    ignored.  Signal handlers can only be set from the main thread; elsewhere only the atexit flush is installed."""
    global _exit_hooks_installed, _exit_profiler
    _exit_profiler = profiler
    if _exit_hooks_installed:
        return
    _exit_hooks_installed = True
    atexit.register(flush_at_exit)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return

    def flush_on_sigterm(signum, frame):
        flush_at_exit()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, flush_on_sigterm)


def flush_at_exit() -> None:
    profiler = _exit_profiler
    if profiler is None:
        return
    try:
        profiler.flush(wait=False)
    except Exception:  # at exit nothing may get in the way
        pass
