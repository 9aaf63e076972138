"""Copies of pristine SGLang releases that tests may edit: the whole tree by hard links (cheap: a file is only ever
replaced, never written in place), or only the files and folders a check reads."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from sglang_pcie.patching.releases import fetch_source


def release_copy(version: str, dest: Path, only: list[str] | None = None) -> Path:
    """``dest`` holding the pristine ``version``: every file hard-linked (copied where the cache is on another file
    system), or with ``only`` just those paths (files or folders, relative to the folder holding ``sglang``; absent
    ones skipped), copied."""
    source = fetch_source(version)
    if only is None:
        try:
            shutil.copytree(source, dest, copy_function=os.link)
        except OSError:
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(source, dest)
        return dest
    for rel in only:
        if (source / rel).is_dir():
            shutil.copytree(source / rel, dest / rel)
        elif (source / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, dest / rel)
    return dest


def module_path(module: str) -> str:
    """``sglang.srt.x`` -> ``sglang/srt/x.py``."""
    return module.replace(".", "/") + ".py"


def replace_text(path: Path, old: str, new: str, count: int = -1) -> None:
    """Edit a file of a copy, never writing through a hard link: the file is replaced. ``old`` must be there."""
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.unlink()
    path.write_text(text.replace(old, new, count), encoding="utf-8")
