"""``apply-diffs``: the versioned diffs applied to (or removed from) a live SGLang tree, all or nothing.

A patch's diff is applied only where its static check (the one ``verify-patches`` runs, and shows as
``source check: ...`` for a patch switched off there) says ``applicable``, and removed only where the check says
``applied``; any other status refuses. A diff is applied only if it makes exactly
the change the patch's ``rewrite()`` approves for this very tree (no fuzz), so a locally modified source never gets a
second copy of something it already has.

All or nothing, on the trees users and their installers make: every diff is applied to copies first (a UTF-8 BOM
taken off for ``patch`` and put back after); only when every one applied and checked out, and the tree can take the
writes (folders writable, the space there), are the originals replaced. A replaced file keeps its mode and (where
this process may set it) its owner. A file that is a symbolic link (a shared store some installers use) is refused,
naming it, unless the user asks to edit the link's target in place (``follow_links``). ``dry_run`` runs every check
of the real run, the permission and space checks included, and stops before the first write. Every refusal changes
nothing.

User settings (opt-ins, SGLANG_PCIE_DISABLE_PATCHES) do not enter: an image gets every diff its release needs, and the
baked code asks the runtime's one gate (``SGLANG_PCIE_DISABLE``, ``SGLANG_PCIE_DISABLE_PATCHES``, the opt-in:
SGLANG_PCIE_SM120_FUSION=1 for sm120-allreduce-fusion, EAGLE3_PROFILE=1 for eagle3-profile) each time SGLang imports
it, so every switch works in the baked image as with the runtime patches, and an opt-in's code behaves as SGLang's
until the user asks.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pcie.patching.diffs import DiffError, diffs_for, touched_files
from sglang_pcie.patching.engine import APPLICABLE, APPLIED, DIFF_MARKER, NOT_APPLICABLE, UPSTREAM, all_patches
from sglang_pcie.patching.source import SourceTree

# What apply-diffs does with one patch.
APPLY, REMOVE, ALREADY, NOTHING, REFUSE = "apply", "remove", "already", "nothing", "refuse"
BOM = b"\xef\xbb\xbf"
STAGED_SUFFIX = ".sglang-pcie-new"


@dataclass
class Step:
    """One patch's part in an apply-diffs run."""
    patch_id: str
    status: str  # its static check on the target
    detail: str
    diff: Path | None  # diffs/<release>/<id>.diff, where there is one
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
        rel = f"diffs/{tree.version}/{patch.id}.diff"
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
                        diffs_dir: Path | None = None, follow_links: bool = False) -> Run:
    """Plan, stage every change in a scratch copy, check it and the tree, then (unless ``dry_run`` or refused)
    write it. Returns the run; ``run.refused`` non-empty means nothing was changed. Raises DiffError for a target
    this release has no diffs for, or where the ``patch`` program is missing."""
    run = plan(tree, reverse, diffs_dir)
    run.dry_run = dry_run
    if run.refused or not run.changing:
        return run
    patch_exe = shutil.which("patch")
    if not patch_exe:
        raise DiffError("the 'patch' program is not installed")
    steps = list(reversed(run.changing)) if reverse else run.changing
    files = sorted({rel for step in steps for rel in touched_files(step.diff)})
    for step in steps:  # the tree as it is: files present, links only where asked for
        problem = _tree_problem(tree.root, touched_files(step.diff), follow_links)
        if problem:
            step.action, step.why = REFUSE, problem
    if run.refused:
        return run
    with tempfile.TemporaryDirectory(prefix="sglang-pcie-diffs-") as scratch:
        work = Path(scratch) / "all"
        _copy(tree.root, work, files)
        for step in steps:
            problem = (_run_patch(patch_exe, work, step.diff, reverse)
                       or _check_step(patch_exe, tree, step, reverse, scratch))
            if problem:
                step.action, step.why = REFUSE, problem
        if run.refused:
            return run
        problem = _write_problem(tree.root, work, files)  # what the real write needs, dry run or not
        if problem:
            for step in steps:
                step.action, step.why = REFUSE, problem
            return run
        if not dry_run:
            _install(tree.root, work, files)
    return run


def _tree_problem(root: Path, files: list[str], follow_links: bool) -> str | None:
    missing = [rel for rel in files if not (root / rel).is_file()]
    if missing:
        return f"{root} lacks {', '.join(missing)}"
    links = [rel for rel in files if (root / rel).is_symlink()]
    if links and not follow_links:
        return (f"{', '.join(links)} {'is a symbolic link' if len(links) == 1 else 'are symbolic links'} (to "
                f"{', '.join(os.path.realpath(root / rel) for rel in links)}): editing would change every tree that "
                "shares it; give --follow-links to edit the target in place")
    return None


def _target(root: Path, rel: str) -> Path:
    """The file a write goes to: the file itself, or the target of a link (only reached with follow_links)."""
    return Path(os.path.realpath(root / rel))


def _write_problem(root: Path, work: Path, files: list[str]) -> str | None:
    """Why the real run could not write the staged files beside the originals and rename them over, or None."""
    needed: dict[Path, int] = {}
    for rel in files:
        folder = _target(root, rel).parent
        needed[folder] = needed.get(folder, 0) + (work / rel).stat().st_size
    me = os.geteuid()
    for folder, size in needed.items():
        info = folder.stat()
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"cannot write in {folder} (no write permission for this user); nothing changed"
        if info.st_mode & stat.S_ISVTX and me not in (0, info.st_uid):  # a sticky folder: only owners may rename
            others = [rel for rel in files if _target(root, rel).parent == folder and _target(root, rel).stat().st_uid != me]
            if others:
                return f"cannot replace {others[0]} in the sticky folder {folder} (another user's file); nothing changed"
        free = shutil.disk_usage(folder).free
        if free < size:
            return f"{folder} has {free} bytes free, {size} needed; nothing changed"
    return None


def _install(root: Path, work: Path, files: list[str]) -> None:
    """Every diff applied and checked out: stage each patched copy beside the file it replaces (its mode, its owner
    where this process may set it, its BOM), then rename them all over the originals. A target that cannot be
    written fails at staging, before any original is replaced."""
    staged = []
    try:
        for rel in files:
            target = _target(root, rel)
            new = target.with_name(target.name + STAGED_SUFFIX)
            _write_like(work / rel, new, target)
            staged.append((new, target))
    except OSError as exc:
        for new, _ in staged:
            new.unlink(missing_ok=True)
        raise DiffError(f"cannot write in {root}: {exc}; nothing changed") from None
    for new, target in staged:
        os.replace(new, target)


def _write_like(source: Path, new: Path, original: Path) -> None:
    info = original.stat()
    text = source.read_bytes()
    if original.read_bytes().startswith(BOM) and not text.startswith(BOM):
        text = BOM + text
    with open(new, "xb") as handle:  # never into a folder or a link of that name
        handle.write(text)
    os.chmod(new, stat.S_IMODE(info.st_mode))  # a new mtime, so no stale .pyc is used
    if (info.st_uid, info.st_gid) != (new.stat().st_uid, new.stat().st_gid):
        try:
            os.chown(new, info.st_uid, info.st_gid)
        except PermissionError:  # not root: the file is ours, as any edit by this user would leave it
            pass


def _copy(root: Path, dest: Path, files) -> None:
    """Copies of ``files`` for ``patch`` to work on, each without a UTF-8 BOM (patch compares bytes; the BOM goes back
    when the file is written)."""
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        data = (root / rel).read_bytes()
        (dest / rel).write_bytes(data[len(BOM):] if data.startswith(BOM) else data)


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
