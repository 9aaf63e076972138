"""``verify-patches``: each patch's status against an SGLang source tree (static) or a live process (runtime)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from sglang_pcie.patching.engine import (APPLICABLE, DISABLED, ERROR, FAILING_STATUSES, Patch, Result, SourceTree,
                                         all_patches, release_bounds, release_gate)


def check_source(patch: Patch, tree: SourceTree) -> Result:
    """The patch's static check within its release range; a checker bug is an ``error`` result, never raised.

    Older than the first covered release: ``not-applicable`` naming the range (the patch was never written for
    it). Newer than the last: the source check decides, and the detail says tests do not cover that release yet.
    Computed once per tree.
    """
    if patch.id not in tree.results:
        tree.results[patch.id] = _check_in_range(patch, tree)
    return tree.results[patch.id]


def _check_in_range(patch: Patch, tree: SourceTree) -> Result:
    from packaging.version import InvalidVersion, Version

    try:
        first, last = release_bounds(patch)
        outside = release_gate(patch, tree.version)
    except ValueError as exc:
        return Result(ERROR, str(exc))
    if outside is not None:
        return outside
    try:
        version = Version(tree.version)
    except InvalidVersion:
        version = None
    try:
        result = patch.check_source(tree)
    except Exception as exc:
        result = Result(ERROR, f"static check failed: {type(exc).__name__}: {exc}")
    if version is None:
        return Result(result.status, f"{result.detail}; sglang version {tree.version!r} unknown: release range "
                                     f"{first} to {last} not checked")
    if version > Version(last):
        return Result(result.status, f"{result.detail}; sglang {tree.version} is newer than {last}, the last "
                                     "release covered by tests")
    return result


def static_results(tree: SourceTree, settings) -> list[tuple[Patch, Result]]:
    results = []
    for patch in all_patches():
        result = check_source(patch, tree)
        reason = patch.disabled_reason(settings)
        # A patch the user switched off is reported disabled, but drift is still worth knowing about.
        if reason and result.status not in FAILING_STATUSES:
            # Why it would not apply anyway is worth saying (a release outside the range, upstream already).
            check = result.status if result.status == APPLICABLE else f"{result.status}: {result.detail}"
            result = Result(DISABLED, f"{reason} (source check: {check})")
        results.append((patch, result))
    return results


def runtime_results(sglang_root: str | None = None, python: str | None = None,
                    timeout: float = 900) -> tuple[str, list[dict]]:
    """Import the real target modules in a child process with the overlay active; (sglang version, rows)."""
    env = dict(os.environ)
    if sglang_root:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [sglang_root, env.get("PYTHONPATH")]))
    cmd = [python or sys.executable, "-m", "sglang_pcie.patching.runtime_probe"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"runtime probe failed (exit {proc.returncode}):\n{tail}")
    report = json.loads(lines[-1])
    return report["sglang_version"], report["patches"]


def rows_from(results: list[tuple[Patch, Result]]) -> list[dict]:
    return [{"id": patch.id, "status": result.status, "detail": result.detail} for patch, result in results]
