"""sm120-allreduce-fusion's runtime install: the diff the wheel ships for the installed release, applied to the
installed files' text and swapped into the live modules (``runtime/code_swap``). What runs in a server is the very
text ``apply-diffs`` bakes into an image, and no process reads SGLang's source to rewrite it again.

Runs in SGLang (the patch's row names ``install`` as its install): imports ``runtime/`` only.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from types import ModuleType

from sglang_pcie.runtime import code_swap, shipped_diffs
from sglang_pcie.runtime.results import APPLIED, DRIFTED, NOT_APPLICABLE, Drift, Result

PATCH_ID = "sm120-allreduce-fusion"


def install(module: ModuleType, settings) -> Result:
    """Swap in ``module``'s text with the shipped diff applied (all or nothing); not-applicable where the diff does
    not touch it."""
    status, detail, sources = diffed_sources(sglang_version(), sglang_root())
    if status != APPLIED:
        return Result(status, detail)
    if module.__name__ not in sources:
        return Result(NOT_APPLICABLE, f"nothing to change in {module.__name__} on this release ({detail})")
    old_source = _read(Path(module.__file__))
    result = code_swap.swap_in(module, old_source, sources[module.__name__], PATCH_ID)
    return Result(result.status, f"{result.detail} ({detail})")


@functools.lru_cache(maxsize=4)
def diffed_sources(version: str, root: Path) -> tuple[str, str, dict[str, str]]:
    """(status, detail, {module: the installed file with the shipped diff applied}) for SGLang ``version`` installed
    under ``root`` (the folder holding ``sglang``). Read once per process: the import of each target module asks."""
    diff, release = shipped_diffs.diff_for_release(PATCH_ID, version)
    if diff is None:
        return NOT_APPLICABLE, release, {}
    try:
        files = shipped_diffs.read_diff(diff)
        sources = {}
        for relative, hunks in files.items():
            path = root / relative
            if not path.is_file():
                raise Drift(f"{relative} is not installed")
            sources[shipped_diffs.module_name(relative)] = shipped_diffs.apply(_read(path), hunks, relative)
    except (Drift, OSError, UnicodeDecodeError) as exc:
        return DRIFTED, f"the {release} diff does not apply to sglang {version}: {exc}", {}
    said = "its own diff" if release == version else f"the diff of {release} (none shipped for {version})"
    return APPLIED, f"sglang {version}: {said}", sources


def _read(path: Path) -> str:
    # As the diffs were made (and as ``patch`` sees a copy): UTF-8, without a byte-order mark.
    return path.read_text(encoding="utf-8").removeprefix("\ufeff")


def sglang_version() -> str:
    return str(getattr(sys.modules.get("sglang"), "__version__", ""))


def sglang_root() -> Path:
    # Not resolve(): the tree Python imports from, even where it is a farm of symbolic links.
    return Path(os.path.abspath(sys.modules["sglang"].__file__)).parent.parent
