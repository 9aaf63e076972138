"""The release matrix: every patch's static check on every SGLang release of a range.

Used by ``ci/check-sglang-releases`` (the matrix, COMPATIBILITY.md) and ``ci/prepare-release-diffs``.
Releases are fetched in threads (pip download + unzip are I/O and subprocess bound) while the static checks
run in worker processes (pure Python parsing, CPU bound), so a cold run overlaps downloading with checking.
"""
from __future__ import annotations

import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Iterable

from packaging.version import InvalidVersion, Version

from sglang_pcie.patching.engine import ERROR, FAILING_STATUSES
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.patching.diffs import releases_with_diffs
from sglang_pcie.patching.engine import all_patches
from sglang_pcie.patching.verify import check_source


def parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a version (e.g. 0.5.9)") from None


def select_releases(available: Iterable[str], first: str | None = None, last: str | None = None) -> list[str]:
    """The releases of ``available`` between ``first`` and ``last`` (both inclusive), oldest first."""
    low = parse_version(first) if first else None
    high = parse_version(last) if last else None
    chosen = [v for v in available
              if (low is None or Version(v) >= low) and (high is None or Version(v) <= high)]
    return sorted(chosen, key=Version)


def check_tree(root: str) -> tuple[str, list[dict], dict[str, float]]:
    """Every patch's static check on the tree at ``root``: (version, rows, CPU seconds per patch).

    Unlike ``verify-patches`` this ignores the user's settings (SGLANG_PCIE_DISABLE_PATCHES, EAGLE3_PROFILE...):
    the matrix says whether each patch fits the release, not whether this machine would switch it on.
    """
    tree = SourceTree(root)
    rows, seconds = [], {}
    for patch in all_patches():
        started = time.process_time()
        result = check_source(patch, tree)
        seconds[patch.id] = time.process_time() - started
        rows.append({"id": patch.id, "status": result.status, "detail": result.detail})
    return tree.version, rows, seconds


def error_rows(detail: str) -> list[dict]:
    return [{"id": patch.id, "status": ERROR, "detail": detail} for patch in all_patches()]


def progress(message: str) -> None:
    print(f"check-sglang-releases: {message}", file=sys.stderr, flush=True)


def run_matrix(versions: list[str], fetch: Callable[[str], Path], fetch_jobs: int = 4,
               check_jobs: int | None = None) -> tuple[list[dict], dict]:
    """Fetch and check each release; ([{"version", "source", "patches"}] oldest first, timings).

    A release that cannot be fetched gets ``error`` in every cell rather than stopping the others.
    """
    started = time.monotonic()
    rows: dict[str, dict] = {}
    timings = {"fetch_wall_s": 0.0, "check_cpu_s": {}}
    total = len(versions)
    progress(f"fetching {total} releases ({fetch_jobs} at a time) and checking them ({check_jobs} processes)")
    # spawn, not fork: the fetching threads are running when the pool starts its workers.
    context = multiprocessing.get_context("spawn")
    with ThreadPoolExecutor(fetch_jobs) as fetchers, \
            ProcessPoolExecutor(check_jobs, mp_context=context) as checkers:
        fetching = {fetchers.submit(fetch, version): version for version in versions}
        checking = {}
        for done, future in enumerate(as_completed(fetching), 1):
            version = fetching[future]
            try:
                root = future.result()
            except Exception as exc:
                progress(f"[{done}/{total}] {version}: could not fetch: {exc}")
                rows[version] = {"version": version, "source": None,
                                 "patches": error_rows(f"could not fetch sglang {version}: {exc}")}
                continue
            progress(f"[{done}/{total}] {version}: fetched at {time.monotonic() - started:.1f}s")
            checking[checkers.submit(check_tree, str(root))] = (version, root)
        timings["fetch_wall_s"] = time.monotonic() - started
        for future in as_completed(checking):
            version, root = checking[future]
            try:
                _, patches, seconds = future.result()
                for patch_id, cpu in seconds.items():
                    timings["check_cpu_s"][patch_id] = timings["check_cpu_s"].get(patch_id, 0.0) + cpu
            except Exception as exc:  # a SourceTree that is no sglang package, a worker that died
                patches = error_rows(f"static checks failed: {type(exc).__name__}: {exc}")
            rows[version] = {"version": version, "source": str(root), "patches": patches}
    timings["total_wall_s"] = time.monotonic() - started
    return [rows[v] for v in versions], timings


def check_sources(roots: list[str]) -> list[dict]:
    """The matrix rows for source folders given by hand (no fetching), in the order given.

    Raises ValueError naming the first folder that holds no ``sglang`` package, before checking any.
    """
    for root in roots:
        SourceTree(root)
    rows = []
    for root in roots:
        version, patches, _ = check_tree(root)
        rows.append({"version": version, "source": root, "patches": patches})
    return rows


def newest_with_diffs(diffs_root: Path) -> str | None:
    """The newest release folder of ``diffs_root`` (``diffs/``) holding any diff."""
    folders = releases_with_diffs(diffs_root)
    return folders[-1] if folders else None


def annotate_diffs(rows: list[dict], diffs_root: Path) -> list[str]:
    """Add to each row the ids of its versioned diffs and whether it lacks them; the lacking versions.

    A release lacks diffs when it is newer than the newest release folder holding any diff.
    """
    newest = newest_with_diffs(diffs_root)
    newest = Version(newest) if newest else None
    lacking = []
    for row in rows:
        folder = diffs_root / row["version"]
        row["diffs"] = sorted(p.stem for p in folder.glob("*.diff")) if folder.is_dir() else []
        try:
            row["lacks_diffs"] = newest is None or Version(row["version"]) > newest
        except InvalidVersion:
            row["lacks_diffs"] = False
        if row["lacks_diffs"]:
            lacking.append(row["version"])
    return lacking


def failing(rows: list[dict]) -> bool:
    return any(cell["status"] in FAILING_STATUSES for row in rows for cell in row["patches"])


def render_markdown(rows: list[dict], lacking: list[str], newest_with_diffs: str | None) -> str:
    """The matrix as Markdown: a release x patch table, then each patch's details grouped by release runs."""
    patch_ids = [cell["id"] for cell in rows[0]["patches"]] if rows else []
    lines = ["| release | " + " | ".join(f"`{pid}`" for pid in patch_ids) + " | diffs in `diffs/` |",
             "|---|" + "---|" * len(patch_ids) + "---|"]
    for row in rows:
        cells = []
        for cell in row["patches"]:
            status = cell["status"]
            cells.append(f"**{status}**" if status in FAILING_STATUSES else status)
        if row.get("lacks_diffs"):
            diffs = f"**missing**: `ci/prepare-release-diffs {row['version']}`"
        else:
            diffs = ", ".join(row.get("diffs", [])) or "none"
        lines.append(f"| {row['version']} | " + " | ".join(cells) + f" | {diffs} |")
    if lacking:
        after = f"newer than `diffs/{newest_with_diffs}/`" if newest_with_diffs else "no folder in `diffs/`"
        lines += ["", f"Releases lacking diffs ({after}): {', '.join(lacking)}. "
                  f"Prepare them with `ci/prepare-release-diffs VERSION`."]
    if patch_ids:
        lines += ["", "Each patch's detail, for each run of releases with the same result:"]
    for pid in patch_ids:
        lines += ["", f"**{pid}**", ""]
        for versions, status, detail in _runs(rows, pid):
            span = versions[0] if len(versions) == 1 else f"{versions[0]} to {versions[-1]}"
            lines.append(f"- {span}: {status}" + (f": {detail}" if detail else ""))
    return "\n".join(lines) + "\n"


def _runs(rows: list[dict], patch_id: str) -> list[tuple[list[str], str, str]]:
    """Consecutive releases with the same status and detail for one patch, as (versions, status, detail)."""
    runs: list[tuple[list[str], str, str]] = []
    for row in rows:
        cell = next(c for c in row["patches"] if c["id"] == patch_id)
        detail = " ".join(cell["detail"].split()).replace("|", "\\|")
        if runs and runs[-1][1:] == (cell["status"], detail):
            runs[-1][0].append(row["version"])
        else:
            runs.append(([row["version"]], cell["status"], detail))
    return runs
