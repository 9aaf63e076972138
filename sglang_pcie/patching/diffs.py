"""Versioned diffs: ``patches/<sglang-release>/<patch-id>.diff``, applied with ``patch -p1`` in the folder that
holds the ``sglang`` package, for users who bake patched sources into an image.

``apply-diffs`` applies a patch's diff only where that patch's static check (the one ``verify-patches`` runs)
says ``applicable``, and removes it only where the check says ``applied``; any other status refuses, and a refusal
changes nothing.  A diff is applied only if it makes exactly the change the patch's ``rewrite()`` approves for this
very tree (so a locally modified source never gets a second copy of something it already has).  All or nothing:
the diffs are applied to copies of the files first; only when every one applied cleanly (no fuzz) and checked out
are the copies moved over the originals.  ``--dry-run`` runs all of it except that last move.

The diffs are generated from each patch's ``rewrite(tree)`` (``diff_for``; ``ci/generate-diffs`` writes them), the
source-level equivalent of the runtime patch, so the diffs and the monkeypatches are made from one description of
the change and cannot tell different stories.

User settings (opt-ins, SGLANG_PCIE_DISABLE_PATCHES) do not enter: an image gets every diff its release needs,
and the baked code keeps its own run-time switch (SGLANG_PCIE_SM120_FUSION=1 for sm120-allreduce-fusion,
EAGLE3_PROFILE=1 for eagle3-profile), so it behaves as SGLang until the user asks.
"""
from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import sglang_pcie
from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DIFF_MARKER, NOT_APPLICABLE, UPSTREAM, Patch
from sglang_pcie.patching.source import SourceTree

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


# What apply-diffs does with one patch.
APPLY, REMOVE, ALREADY, NOTHING, REFUSE = "apply", "remove", "already", "nothing", "refuse"


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


def diffs_for(version: str, root: Path | None = None) -> list[Path]:
    folder = (diffs_root() if root is None else root) / version
    diffs = sorted(folder.glob("*.diff")) if folder.is_dir() else []
    if not diffs:
        known = ", ".join(releases_with_diffs(root)) or "none"
        raise DiffError(f"no diffs for sglang {version} (releases with diffs: {known})")
    return diffs


def touched_files(diff: Path) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", diff.read_text(), re.M)


@dataclass
class Step:
    """One patch's part in an apply-diffs run."""
    patch_id: str
    status: str  # its static check on the target
    detail: str
    diff: Path | None  # patches/<release>/<id>.diff, where there is one
    action: str  # APPLY, REMOVE, ALREADY, NOTHING or REFUSE
    why: str = ""

    def line(self) -> str:
        """``<id> is <status>: <why>`` for a refusal; ``<id>: already applied`` / ``nothing to do (...)``."""
        if self.action == REFUSE:
            return f"{self.patch_id} is {self.status}: {self.why}"
        if self.action == ALREADY:
            return f"{self.patch_id}: already applied"
        if self.action == NOTHING:
            return f"{self.patch_id}: nothing to do ({self.status}: {self.why})"
        return f"{self.patch_id}: {self.action} {self.why}"


@dataclass
class Run:
    version: str
    root: Path
    reverse: bool
    dry_run: bool
    steps: list[Step] = field(default_factory=list)

    @property
    def refused(self) -> list[Step]:
        return [s for s in self.steps if s.action == REFUSE]

    @property
    def changing(self) -> list[Step]:
        return [s for s in self.steps if s.action in (APPLY, REMOVE)]


def plan(tree: SourceTree, reverse: bool = False, diffs_dir: Path | None = None) -> Run:
    """What apply-diffs would do with each patch, from each patch's static check (no file read but the source)."""
    from sglang_pcie.patching.engine import all_patches
    from sglang_pcie.patching.verify import check_source

    diffs = {path.stem: path for path in diffs_for(tree.version, diffs_dir)}
    patches = all_patches()
    unknown = sorted(set(diffs) - {p.id for p in patches})
    if unknown:
        raise DiffError(f"diffs for sglang {tree.version} name no registered patch: {', '.join(unknown)}")
    run = Run(tree.version, tree.root, reverse, False)
    for patch in patches:
        result = check_source(patch, tree)
        diff = diffs.get(patch.id)
        step = Step(patch.id, result.status, result.detail, diff, REFUSE)
        rel = f"patches/{tree.version}/{patch.id}.diff"
        step.why = result.detail
        if result.status == (APPLIED if reverse else APPLICABLE):
            if diff is not None:
                step.action, step.why = (REMOVE if reverse else APPLY), rel
            else:
                step.why += f"; but there is no {rel}"
        elif result.status == APPLIED:  # forward, already there
            step.action = ALREADY
        elif result.status in (UPSTREAM, NOT_APPLICABLE) and diff is None:
            step.action = NOTHING
        elif result.status in (UPSTREAM, NOT_APPLICABLE):
            step.why += f"; yet {rel} exists: this source is not the pristine release it was made for"
        elif reverse and result.status == APPLICABLE:
            step.why = "its diff is not in this tree, nothing to remove"
        run.steps.append(step)
    return run


def apply_release_diffs(tree: SourceTree, reverse: bool = False, dry_run: bool = False,
                        diffs_dir: Path | None = None) -> Run:
    """Plan, stage every change in a scratch copy, check it, then (unless ``dry_run`` or refused) write it.

    Returns the run; ``run.refused`` non-empty means nothing was changed. Raises DiffError for a target this
    release has no diffs for, or where the ``patch`` program is missing.
    """
    run = plan(tree, reverse, diffs_dir)
    run.dry_run = dry_run
    if run.refused or not run.changing:
        return run
    patch_exe = shutil.which("patch")
    if not patch_exe:
        raise DiffError("the 'patch' program is not installed")
    steps = list(reversed(run.changing)) if reverse else run.changing
    files = sorted({rel for step in steps for rel in touched_files(step.diff)})
    missing = [rel for rel in files if not (tree.root / rel).is_file()]
    if missing:
        for step in steps:
            if set(touched_files(step.diff)) & set(missing):
                step.action, step.why = REFUSE, f"{tree.root} lacks {', '.join(missing)}"
        return run
    with tempfile.TemporaryDirectory(prefix="sglang-pcie-diffs-") as scratch:
        work = Path(scratch) / "all"
        _copy(tree.root, work, files)
        for step in steps:
            problem = (_run_patch(patch_exe, work, step.diff, reverse)
                       or _check_step(patch_exe, tree, step, reverse, scratch))
            if problem:
                step.action, step.why = REFUSE, problem
        if run.refused or dry_run:
            return run
        _install(tree.root, work, files)
    return run


def _install(root: Path, work: Path, files: list[str]) -> None:
    """Every diff applied and checked out: stage each patched copy beside its original, then rename them all
    over the originals. A target that cannot be written fails at staging, before any original is replaced."""
    staged = []
    try:
        for rel in files:
            target = root / (rel + ".sglang-pcie-new")
            shutil.copyfile(work / rel, target)  # never into a folder of that name, unlike copy2
            staged.append(target)
            shutil.copymode(root / rel, target)  # the original's mode; a new mtime, so no stale .pyc is used
    except OSError as exc:
        for target in staged:
            target.unlink(missing_ok=True)
        raise DiffError(f"cannot write in {root}: {exc}; nothing changed") from None
    for rel, target in zip(files, staged):
        os.replace(target, root / rel)


def _copy(root: Path, dest: Path, files) -> None:
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)


def _run_patch(patch_exe: str, work: Path, diff: Path, reverse: bool) -> str | None:
    """Apply (or reverse) one diff in ``work``, exactly (no fuzz); a one-line problem or None."""
    cmd = [patch_exe, "-p1", "--batch", "--silent", "--fuzz=0", "--no-backup-if-mismatch", "-r", "-",
           "-d", str(work), "-i", str(diff.resolve()), "--reverse" if reverse else "--forward"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    why = (proc.stdout + proc.stderr).strip().splitlines()
    return (f"{diff.parent.name}/{diff.name} does not {'reverse' if reverse else 'apply'} cleanly: "
            f"{why[0] if why else 'patch failed'}")


def _check_step(patch_exe: str, tree: SourceTree, step: Step, reverse: bool, scratch: str) -> str | None:
    """The diff alone, on copies of the files it touches, must make exactly the change ``rewrite()`` approves
    for this tree (applying), or leave none of the patch's marked lines behind (removing)."""
    from sglang_pcie.patching.engine import get_patch

    files = touched_files(step.diff)
    alone = Path(scratch) / step.patch_id
    _copy(tree.root, alone, files)
    problem = _run_patch(patch_exe, alone, step.diff, reverse)
    if problem:
        return problem
    marker = f"{DIFF_MARKER} {step.patch_id}"
    if reverse:
        left = [rel for rel in files if marker in (alone / rel).read_text(encoding="utf-8")]
        return (f"{', '.join(left)} still carry `{marker}` lines once the diff is removed (applied twice, or "
                "edited since?)") if left else None
    wanted = {}
    for module, text in get_patch(step.patch_id).rewrite(tree).items():
        wanted[tree.path(module).relative_to(tree.root).as_posix()] = text
    if sorted(wanted) != sorted(files):
        return (f"{step.diff.parent.name}/{step.diff.name} touches {', '.join(sorted(files))}, but this tree needs "
                f"changes in {', '.join(sorted(wanted)) or 'nothing'}: the source is not the pristine "
                f"{tree.version}")
    differ = [rel for rel in files if (alone / rel).read_text(encoding="utf-8") != wanted[rel]]
    if differ:
        return (f"{step.diff.parent.name}/{step.diff.name} does not make the change this tree needs in "
                f"{', '.join(differ)} (the source is not the pristine {tree.version}; verify-patches shows what fits)")
    return None
