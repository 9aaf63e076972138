"""``sglang-pcie verify-patches``: each patch's status for an SGLang release (static) or this process (runtime),
with the NCCL profile and the all-reduce paths."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_pcie.patching import verify
from sglang_pcie.patching.engine import DISABLED, FAILING_STATUSES, STATUSES, all_patches
from sglang_pcie.patching.source import SourceTree, installed_sglang_root
from sglang_pcie.runtime import nccl
from sglang_pcie.tools.allreduce_report import format_report, report as allreduce_report
from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.common import USAGE_ERROR, settings_or_errors, variable_lines

STATUS_HELP = {
    "applied": "runtime: in effect in this process (static: the source already carries the sglang-pcie diff)",
    "applicable": "static: fits this source; every name the patched code relies on was found there",
    "upstream": "the release already has every part the patch changes",
    "not-applicable": "the release lacks what the patch touches, or is older than the patch's first release",
    "disabled": "not wanted here: switched off by the user (a SGLANG_PCIE_DISABLE_PATCHES that names an id that is "
                "no patch switches every patch off, and exits 2), or an opt-in not given; the detail ends with the "
                "source check, which is what apply-diffs follows",
    "drifted": "the target moved or changed shape",
    "error": "the check itself failed",
}
EPILOG = ("statuses: " + "; ".join(f"{s}: {STATUS_HELP[s]}" for s in STATUSES) + ". Exit status: 0 when no patch "
          "is drifted or error, 1 otherwise, 2 for bad usage or settings, or no SGLang to check (none installed "
          "here, and neither --sglang-source nor --sglang-version given).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--sglang-source", metavar="DIR", help="a folder holding an sglang package")
    where.add_argument("--sglang-version", metavar="X", help="that release's wheel, fetched without dependencies")
    p.add_argument("--runtime", action="store_true",
                   help="import the real SGLang modules in a child process and check each patch is in effect")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--metadata", action="store_true", help="print each patch's metadata instead")


def run(args: argparse.Namespace) -> int:
    if args.metadata:
        return print_metadata(args.json)
    if args.runtime and args.sglang_version:
        raise UsageError("--runtime imports an installed SGLang; --sglang-version is static only")
    settings, errors = settings_or_errors()
    root = source_root(args)
    try:
        tree = SourceTree(root)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    if args.runtime:
        if settings.disabled:
            rows = [{"id": p.id, "status": DISABLED, "detail": "SGLANG_PCIE_DISABLE is set"} for p in all_patches()]
            version = tree.version
        else:
            try:
                version, rows = verify.runtime_results(str(root) if args.sglang_source else None)
            except Exception as exc:
                print(f"sglang-pcie: {exc}", file=sys.stderr)
                return 1
        mode = "runtime"
    else:
        version, rows, mode = tree.version, verify.rows_from(verify.static_results(tree, settings)), "static"
    decision = nccl.decide(settings.nccl_profile)
    if decision.file_error:
        errors.append(decision.file_error)
        print(f"sglang-pcie: error: {decision.file_error}", file=sys.stderr)
    elsewhere = args.sglang_version is not None or args.sglang_source is not None
    report = build_report(version, mode, rows, decision.as_dict(), str(root),
                          allreduce_report(decision, root, elsewhere=elsewhere))
    print(json.dumps(report, indent=2) if args.json else format_table(report, variable_lines()))
    return USAGE_ERROR if errors else exit_code(report)


def source_root(args) -> Path:
    """The folder holding the sglang package to check: fetched, given, or installed."""
    if args.sglang_version is not None:  # also "": a version was given, and it is not one
        from sglang_pcie.patching.releases import fetch_source

        try:
            return fetch_source(args.sglang_version)
        except (ValueError, RuntimeError) as exc:
            raise UsageError(str(exc)) from None
    if args.sglang_source is not None:
        if not args.sglang_source.strip():
            raise UsageError("--sglang-source '': give the folder that holds the sglang package")
        return Path(args.sglang_source)
    root = installed_sglang_root()
    if root is None:
        raise UsageError("no sglang installed here; use --sglang-source DIR or --sglang-version X")
    return root


def print_metadata(as_json: bool) -> int:
    meta = [patch.metadata() for patch in all_patches()]
    if as_json:
        print(json.dumps(meta, indent=2))
        return 0
    for item in meta:
        print(f"{item['id']}: {item['summary']}")
        for key, value in item.items():
            if key not in ("id", "summary", "upstream_refs"):
                print(f"  {key}: {value}")
    return 0


def build_report(version: str, mode: str, rows: list[dict], nccl_decision: dict, source: str,
                 allreduce: dict | None = None) -> dict:
    report = {"sglang_version": version, "mode": mode, "source": source, "patches": rows, "nccl": nccl_decision}
    if allreduce is not None:  # the all-reduce paths and the one a server would use
        report["allreduce"] = allreduce
    return report


def exit_code(report: dict) -> int:
    return 1 if any(row["status"] in FAILING_STATUSES for row in report["patches"]) else 0


DETAIL_ITEMS = 4  # a detail listing more items than this (classes, modules) shows these and a count


def fold(detail: str, keep: int = DETAIL_ITEMS) -> str:
    """A detail that ends in a long comma-separated list (``...: a (.x), b (.y), ...``) with its first ``keep`` items
    and a count of the rest; ``--json`` keeps the whole."""
    head, sep, listing = detail.rpartition(": ")
    items = listing.split(", ") if sep else []
    if len(items) <= keep + 1:
        return detail
    return f"{head}: {', '.join(items[:keep])} and {len(items) - keep} more (--json lists them all)"


def format_table(report: dict, variables: list[str] = ()) -> str:
    """The report as text; ``variables`` (the lines of ``common.variable_lines``) go before the all-reduce paths."""
    lines = [f"sglang {report['sglang_version']} ({report['mode']}: {report['source']})"]
    width = max([len(row["id"]) for row in report["patches"]] + [5])
    lines.append(f"{'PATCH':<{width}}  {'STATUS':<14}  DETAIL")
    for row in report["patches"]:
        lines.append(f"{row['id']:<{width}}  {row['status']:<14}  {fold(row['detail'])}")
    decision = report["nccl"]
    values = " ".join(f"{k}={v}" for k, v in decision.get("values", {}).items()) or "nothing set"
    lines.append(f"NCCL profile: {decision.get('profile')} ({decision.get('reason')}); {values}")
    if decision.get("user_set"):
        lines.append("  kept as the user set them: "
                     + " ".join(f"{k}={v}" for k, v in decision["user_set"].items()))
    lines.extend(variables)
    if report.get("allreduce"):
        lines.extend(format_report(report["allreduce"]))
    return "\n".join(lines)


COMMAND = Command("verify-patches", "each patch's status for an SGLang release, and the NCCL profile",
                  add_arguments, run, epilog=EPILOG, error_prefix="sglang-pcie")
