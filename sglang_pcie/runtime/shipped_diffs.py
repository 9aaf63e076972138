"""The versioned diffs the wheel ships (``sglang_pcie/diffs/<release>/<patch-id>.diff``; the checkout's ``diffs/``
in an editable install), read and applied to text in the process itself.

A patch written as source (sm120-allreduce-fusion) applies at runtime the very diff ``apply-diffs`` bakes into an
image: this module finds the diff for the installed release and applies it to the installed files' text, as
``patch -p1 --fuzz=0`` would (each hunk's context and removed lines exactly; a hunk may sit at another line, as in
a release the diff was not made from, nearest to where it says first). Anything else is ``Drift``, naming the hunk:
nothing is half-applied. Runs in SGLang processes: the standard library and ``runtime/`` only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sglang_pcie.runtime.results import Drift

MAX_DIFF_BYTES = 1 << 20  # the shipped diffs are a few kB; anything larger is not one of them
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Hunk:
    old_start: int  # 1-based line of the first old line (of the line after which it adds, where it has none)
    old: tuple[str, ...]  # context and removed lines, with their line ends
    new: tuple[str, ...]  # context and added lines


def diffs_root() -> Path | None:
    """The packaged diffs (wheel install), else the checkout's ``diffs/`` folder (editable install); None when
    neither exists."""
    package = Path(__file__).parent.parent  # the sglang_pcie package
    for candidate in (package / "diffs", package.parent / "diffs"):
        if candidate.is_dir():
            return candidate
    return None


def _version_key(name: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(name)
    except InvalidVersion:
        return None


def diff_for_release(patch_id: str, version: str, root: Path | None = None) -> tuple[Path | None, str]:
    """(the shipped diff of ``patch_id`` for SGLang ``version``, which release it was made from): the release's
    own, else the newest shipped release older than ``version`` (a release newer than the overlay knows). (None,
    why) where there is none."""
    root = diffs_root() if root is None else root
    if root is None:
        return None, "no diffs folder beside the sglang_pcie package"
    wanted = _version_key(version)
    if wanted is None:
        return None, f"sglang version {version!r} cannot be read"
    releases = sorted((key, p) for p in root.iterdir() if p.is_dir() and (key := _version_key(p.name)) is not None)
    older = [(key, p) for key, p in releases if key <= wanted]
    if not older:
        return None, f"no diffs for sglang {version} or any older release"
    key, folder = older[-1]
    diff = folder / f"{patch_id}.diff"
    if not diff.is_file():
        return None, f"no {patch_id} diff for sglang {folder.name}"
    return diff, folder.name


def read_diff(path: Path) -> dict[str, list[Hunk]]:
    """{path relative to the folder holding ``sglang`` (``b/`` side): its hunks, in order}. Drift where the file
    is not a unified diff of the shape ``generate-diffs`` writes."""
    size = path.stat().st_size
    if size > MAX_DIFF_BYTES:
        raise Drift(f"{path}: {size} bytes, more than a shipped diff ({MAX_DIFF_BYTES})")
    return parse(path.read_text(encoding="utf-8"), str(path))


def parse(text: str, name: str = "diff") -> dict[str, list[Hunk]]:
    lines = text.splitlines(keepends=True)
    files: dict[str, list[Hunk]] = {}
    current = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ b/"):
            current = files.setdefault(lines[i + 1][6:].rstrip("\n").split("\t")[0], [])
            i += 2
            continue
        match = _HUNK.match(line)
        if not match or current is None:
            raise Drift(f"{name}: line {i + 1} is not part of a unified diff: {line.rstrip()[:80]!r}")
        old_count = int(match[2]) if match[2] is not None else 1
        new_count = int(match[4]) if match[4] is not None else 1
        old, new = [], []
        i += 1
        while len(old) < old_count or len(new) < new_count:
            if i >= len(lines):
                raise Drift(f"{name}: the hunk at line {match[0]!r} ends early")
            body = lines[i]
            tag, content = body[:1], body[1:]
            if tag == " ":
                old.append(content)
                new.append(content)
            elif tag == "-":
                old.append(content)
            elif tag == "+":
                new.append(content)
            else:
                raise Drift(f"{name}: line {i + 1} is not part of the hunk {match[0]!r}")
            i += 1
        current.append(Hunk(int(match[1]), tuple(old), tuple(new)))
    if not files:
        raise Drift(f"{name}: no file in the diff")
    return files


def apply(text: str, hunks: list[Hunk], name: str) -> str:
    """``text`` with ``hunks`` applied, each where its old lines are exactly, nearest to the line it names and
    after the previous hunk; Drift naming the first hunk found nowhere."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0  # lines before this are done
    offset = 0  # how far the hunks found so far sat from where they said
    for number, hunk in enumerate(hunks, 1):
        start = hunk.old_start - 1 + (0 if hunk.old else 1)  # 0-based; a pure addition goes after its line
        at = _find(lines, hunk.old, start + offset, cursor)
        if at is None:
            raise Drift(f"{name}: hunk {number} of {len(hunks)} (at line {hunk.old_start}) does not match the "
                        "installed file")
        offset = at - start
        out.extend(lines[cursor:at])
        out.extend(hunk.new)
        cursor = at + len(hunk.old)
    out.extend(lines[cursor:])
    return "".join(out)


def _find(lines: list[str], old: tuple[str, ...], expected: int, first: int) -> int | None:
    """The start nearest ``expected`` (not before ``first``) where ``lines`` hold ``old`` exactly."""
    size = len(old)
    last = len(lines) - size
    expected = min(max(expected, first), max(last, first))
    for distance in range(0, max(last - first, 0) + 1):
        for at in (expected - distance, expected + distance) if distance else (expected,):
            if first <= at <= last and tuple(lines[at:at + size]) == old:
                return at
    return None


def module_name(relative_path: str) -> str:
    """``sglang/srt/layers/x.py`` -> ``sglang.srt.layers.x``."""
    return relative_path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
