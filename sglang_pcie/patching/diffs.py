"""Versioned diffs: ``diffs/<sglang-release>/<patch-id>.diff``, applied with ``patch -p1`` in the folder that
holds the ``sglang`` package, for users who bake patched sources into an image (``diff_apply`` applies them).

The diffs are generated from each patch's ``rewrite(tree)`` (``diff_for``; ``ci/generate-diffs`` writes them), the
source-level equivalent of the runtime patch, so the diffs and the monkeypatches are made from one description of
the change and cannot tell different stories.

"""
from __future__ import annotations

import difflib
import re
from pathlib import Path

import sglang_pcie
from sglang_pcie.patching.engine import Patch
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.runtime import shipped_diffs

def unified_diff(tree: SourceTree, rewritten: dict[str, str]) -> str:
    """One unified diff (``a/`` ``b/`` prefixes, paths relative to the folder holding ``sglang``)."""
    chunks = []
    for module in sorted(rewritten):
        path = tree.path(module)
        if path is None:
            raise ValueError(f"{module} is not in {tree.root}")
        rel = path.relative_to(tree.root).as_posix()
        old = tree.source(module).splitlines(keepends=True)  # without a UTF-8 BOM, as patch sees it in a copy
        new = rewritten[module].splitlines(keepends=True)
        chunks.extend(difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}"))
    return "".join(chunks)


def diff_for(patch: Patch, tree: SourceTree) -> str:
    """The patch's diff for this tree, or "" where the release needs none."""
    return unified_diff(tree, patch.rewrite(tree))


class DiffError(Exception):
    pass


def diffs_root() -> Path:
    """The packaged diffs (wheel install), else the checkout's ``diffs/`` folder (editable install): where a server
    finds them too (``runtime/shipped_diffs``)."""
    root = shipped_diffs.diffs_root()
    if root is None:
        raise DiffError(f"no diffs folder found beside {Path(sglang_pcie.__file__).parent}")
    return root


def releases_with_diffs(root: Path | None = None) -> list[str]:
    """The release folders of ``root`` (default: diffs_root()) holding any diff, oldest first."""
    from packaging.version import Version

    root = diffs_root() if root is None else root
    if not root.is_dir():
        return []
    return sorted((p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.diff"))), key=Version)


def diffs_for(version: str, root: Path | None = None) -> list[Path]:
    folder = (diffs_root() if root is None else root) / version
    diffs = sorted(folder.glob("*.diff")) if folder.is_dir() else []
    if not diffs:
        known = ", ".join(releases_with_diffs(root)) or "none"
        raise DiffError(f"no diffs for sglang {version} (releases with diffs: {known})")
    return diffs


def touched_files(diff: Path) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", diff.read_text(), re.M)
