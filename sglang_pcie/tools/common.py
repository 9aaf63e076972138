"""What several commands share: exit codes, argument checks, process and log helpers."""
from __future__ import annotations

import os

USAGE_ERROR = 2


def tail_lines(path, max_bytes: int = 64 * 1024) -> list[str]:
    """The lines of the last ``max_bytes`` of a log file (a server's or a worker's stderr, which NCCL_DEBUG=INFO can
    make large), decoded leniently; [] when it cannot be read. The first line may be cut."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def settings_or_errors():
    """This process's settings, and every error in them (printed, one line each, as the CLI's usage errors):
    bad values, and patch ids SGLANG_PCIE_DISABLE_PATCHES names that the register does not have."""
    import sys

    from sglang_pcie.patching import register
    from sglang_pcie.runtime.settings import load_settings, unknown_patch_ids

    settings = load_settings()
    errors = settings.errors + list(filter(None, [unknown_patch_ids(settings, register.ids())]))
    for error in errors:
        print(f"sglang-pcie: error: {error}", file=sys.stderr)
    return settings, errors


def variable_lines(environ=None) -> list[str]:
    """The table of every variable sglang-pcie reads (``runtime.settings.VARIABLES``): its name, its value here (as
    set, quoted) or its default ("unset" where none), and its owner (the patch or part that reads it); ``env`` and
    ``verify-patches`` print it."""
    from sglang_pcie.runtime.settings import VARIABLES, shown

    env = os.environ if environ is None else environ
    values = [shown(env[v.name]) if v.name in env else (f"{v.default} (default)" if v.default else "unset")
              for v in VARIABLES]
    name_w = max(len(v.name) for v in VARIABLES)
    value_w = min(max(map(len, values)), VALUE_COLUMN)
    lines = ["Variables (the value here, else the default; the part that reads it):"]
    for v, value in zip(VARIABLES, values):
        lines.append(f"  {v.name:<{name_w}}  {value:<{value_w}}  {v.owner}")
    return lines


VALUE_COLUMN = 34  # a longer value (a path) pushes its owner right rather than every row's


def summed_counts(count_lists: list[list[int]]) -> list[int] | None:
    """Position by position, the sum of lists of counts of different lengths (histograms); None for no list."""
    if not count_lists:
        return None
    total = [0] * max(len(counts) for counts in count_lists)
    for counts in count_lists:
        for n, count in enumerate(counts):
            total[n] += count
    return total
