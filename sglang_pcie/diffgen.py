"""Generate ``patches/<release>/<patch-id>.diff`` from each patch's ``rewrite(tree)``.

``rewrite`` is the source-level equivalent of the runtime patch, so the diffs and the monkeypatches are made
from one description of the change and cannot tell different stories.
"""
from __future__ import annotations

import difflib

from sglang_pcie.base import Patch, SourceTree


def unified_diff(tree: SourceTree, rewritten: dict[str, str]) -> str:
    """One unified diff (``a/`` ``b/`` prefixes, paths relative to the folder holding ``sglang``)."""
    chunks = []
    for module in sorted(rewritten):
        path = tree.path(module)
        if path is None:
            raise ValueError(f"{module} is not in {tree.root}")
        rel = path.relative_to(tree.root).as_posix()
        old = path.read_text(encoding="utf-8").splitlines(keepends=True)
        new = rewritten[module].splitlines(keepends=True)
        chunks.extend(difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}"))
    return "".join(chunks)


def diff_for(patch: Patch, tree: SourceTree) -> str:
    """The patch's diff for this tree, or "" where the release needs none."""
    return unified_diff(tree, patch.rewrite(tree))
