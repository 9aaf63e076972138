"""``sglang-pcie apply-diffs``: the versioned diffs applied to (or removed from) an SGLang tree, all or nothing."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_pcie.patching.diff_apply import ALREADY, apply_release_diffs
from sglang_pcie.patching.diffs import DiffError
from sglang_pcie.patching.source import SourceTree, installed_sglang_root
from sglang_pcie.tools.command import Command, UsageError

EPILOG = ("A patch's diff is applied where the patch's source check says applicable (the check verify-patches runs; "
          "for a patch switched off here verify-patches says disabled and shows that check: 'source check: "
          "applicable'), skipped where it says applied, removed (--reverse) where it says applied; anything else "
          "refuses. The switches (SGLANG_PCIE_DISABLE_PATCHES, an opt-in such as SGLANG_PCIE_SM120_FUSION=1) do not "
          "choose the diffs: the baked code asks them each time SGLang imports it, as the runtime patch does, so an "
          "opt-in patch's diff changes nothing until its switch is given; the output names the patches that are off "
          "in this environment. A replaced file keeps its mode, owner and UTF-8 "
          "BOM; --dry-run also checks write permission and space, as the real run does. Exit status: 0 when every diff it needs was "
          "applied (or removed), or already was; 1 when a patch refused (nothing was changed); 2 for bad usage, "
          "no sglang package there, or no diffs for its release.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", metavar="DIR", help="folder holding the sglang package (default: the installed one)")
    p.add_argument("--dry-run", action="store_true", help="check that every diff applies; change nothing")
    p.add_argument("--reverse", action="store_true", help="remove the diffs instead")
    p.add_argument("--follow-links", action="store_true",
                   help="where a file to change is a symbolic link, edit the file it points to (by default such a "
                        "tree is refused, naming the links: the target may be shared with other installs)")


def run(args: argparse.Namespace) -> int:
    root = Path(args.target) if args.target else installed_sglang_root()
    if root is None:
        raise UsageError("no sglang installed here; use --target DIR (the folder holding the sglang package)")
    try:
        tree = SourceTree(root)
        result = apply_release_diffs(tree, reverse=args.reverse, dry_run=args.dry_run,
                                     follow_links=args.follow_links)
    except (ValueError, DiffError) as exc:
        raise UsageError(str(exc)) from None
    where = f"sglang {result.version} in {result.root}"
    if result.refused:  # one line per refusing patch, naming its status; nothing was written
        for step in result.refused:
            print(f"sglang-pcie: refused: {step.line()}", file=sys.stderr)
        print(f"sglang-pcie: apply-diffs changed nothing in {result.root}", file=sys.stderr)
        return 1
    changing = result.changing
    if changing:
        verb = ("would remove" if result.dry_run else "removed") if result.reverse else (
            "would apply" if result.dry_run else "applied")
        print(f"{verb} {len(changing)} diff(s) for {where}: {', '.join(s.patch_id for s in changing)}")
        if not result.reverse:
            for line in switched_off_here([s.patch_id for s in changing]):
                print(f"  {line}")
    elif any(step.action == ALREADY for step in result.steps):
        print(f"already applied: {where} carries every diff it needs")
    else:
        print(f"nothing to {'remove' if result.reverse else 'apply'} for {where}")
    for step in result.steps:
        if step not in changing:
            print(f"  {step.line()}")
    return 0


def switched_off_here(patch_ids: list[str]) -> list[str]:
    """One line per patch of ``patch_ids`` that this environment's settings switch off: its baked code stays SGLang's
    in a process with these settings, and acts in one whose switch lets it (the baked guard asks the same gate)."""
    from sglang_pcie.patching import register
    from sglang_pcie.runtime.settings import load_settings

    settings = load_settings()
    lines = []
    for patch_id in patch_ids:
        reason = register.disabled_reason(register.entry(patch_id), settings)
        if reason:
            lines.append(f"{patch_id}: baked, and off in this environment ({reason}): its code acts only where "
                         "its switch lets it, read each time SGLang imports it")
    return lines


COMMAND = Command("apply-diffs", "apply the versioned diffs to an SGLang source tree, all or nothing", add_arguments,
                  run, epilog=EPILOG, error_prefix="sglang-pcie")
