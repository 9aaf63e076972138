"""Versioned diffs: ``patches/<sglang-release>/<patch-id>.diff``, applied with ``patch -p1`` in the folder that
holds the ``sglang`` package, for users who bake patched sources into an image.

All or nothing: the diffs are applied one after another to copies of the files they touch; only when every
one applied cleanly are the copies moved over the originals.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import sglang_pcie


class DiffError(Exception):
    pass


def diffs_root() -> Path:
    """The packaged diffs (wheel install), else the checkout's ``patches/`` folder (editable install)."""
    package = Path(sglang_pcie.__file__).parent
    for candidate in (package / "diffs", package.parent / "patches"):
        if candidate.is_dir():
            return candidate
    raise DiffError(f"no diffs folder found beside {package}")


def releases_with_diffs(root: Path | None = None) -> list[str]:
    """The release folders of ``root`` (default: diffs_root()) holding any diff, oldest first."""
    from packaging.version import Version

    root = diffs_root() if root is None else root
    if not root.is_dir():
        return []
    return sorted((p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.diff"))), key=Version)


def diffs_for(version: str) -> list[Path]:
    folder = diffs_root() / version
    diffs = sorted(folder.glob("*.diff")) if folder.is_dir() else []
    if not diffs:
        known = ", ".join(releases_with_diffs()) or "none"
        raise DiffError(f"no diffs for sglang {version} (releases with diffs: {known})")
    return diffs


def touched_files(diff: Path) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", diff.read_text(), re.M)


def apply_diffs(target: Path, diffs: list[Path], reverse: bool = False, dry_run: bool = False) -> None:
    """Apply (or with ``reverse`` remove) ``diffs`` in ``target``, all or nothing; raises DiffError."""
    patch_exe = shutil.which("patch")
    if not patch_exe:
        raise DiffError("the 'patch' program is not installed")
    ordered = list(reversed(diffs)) if reverse else list(diffs)
    files = sorted({rel for diff in ordered for rel in touched_files(diff)})
    missing = [rel for rel in files if not (target / rel).is_file()]
    if missing:
        raise DiffError(f"{target} lacks {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="sglang-pcie-diffs-") as scratch:
        work = Path(scratch)
        for rel in files:
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(target / rel, work / rel)
        for diff in ordered:
            cmd = [patch_exe, "-p1", "--batch", "--silent", "--no-backup-if-mismatch", "-r", "-",
                   "-d", str(work), "-i", str(diff.resolve())]
            cmd.append("--reverse" if reverse else "--forward")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                why = (proc.stdout + proc.stderr).strip().splitlines()
                raise DiffError(f"{diff.parent.name}/{diff.name} does not {'reverse' if reverse else 'apply'}"
                                f" cleanly in {target}: {why[0] if why else 'patch failed'}; nothing changed")
        if dry_run:
            return
        for rel in files:  # every diff applied: move the patched copies into place
            staged = target / (rel + ".sglang-pcie-new")
            shutil.copy2(work / rel, staged)
            os.replace(staged, target / rel)
