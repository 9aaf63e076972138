"""``sglang-pcie`` / ``python -m sglang_pcie``: verify-patches, apply-diffs, env, profile-report, tune-nccl."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import sglang_pcie

USAGE_ERROR = 2


def _fail(message: str) -> int:
    print(f"sglang-pcie: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def _settings_or_errors():
    from sglang_pcie.settings import load_settings

    settings = load_settings()
    for error in settings.errors:
        print(f"sglang-pcie: error: {error}", file=sys.stderr)
    return settings


def cmd_verify_patches(args) -> int:
    from sglang_pcie import nccl, verify
    from sglang_pcie.base import DISABLED, SourceTree, installed_sglang_root
    from sglang_pcie.registry import all_patches

    if args.metadata:
        meta = [patch.metadata() for patch in all_patches()]
        if args.json:
            print(json.dumps(meta, indent=2))
        else:
            for item in meta:
                print(f"{item['id']}: {item['summary']}")
                for key, value in item.items():
                    if key not in ("id", "summary"):
                        print(f"  {key}: {value}")
        return 0
    if args.sglang_source and args.sglang_version:
        return _fail("give --sglang-source or --sglang-version, not both")
    if args.runtime and args.sglang_version:
        return _fail("--runtime imports an installed SGLang; --sglang-version is static only")

    settings = _settings_or_errors()
    try:
        if args.sglang_version:
            from sglang_pcie.releases import fetch_source

            root = fetch_source(args.sglang_version)
        elif args.sglang_source:
            root = Path(args.sglang_source)
        else:
            root = installed_sglang_root()
            if root is None:
                return _fail("no sglang installed here; use --sglang-source DIR or --sglang-version X")
        tree = SourceTree(root)
    except (ValueError, RuntimeError) as exc:
        return _fail(str(exc))

    if args.runtime:
        if settings.disabled:
            rows = [{"id": p.id, "status": DISABLED, "detail": "SGLANG_PCIE_DISABLE is set"}
                    for p in all_patches()]
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
    from sglang_pcie.allreduce_paths import report as allreduce_report

    report = verify.build_report(version, mode, rows, decision.as_dict(), str(root),
                                 allreduce_report(decision, root))
    print(json.dumps(report, indent=2) if args.json else verify.format_table(report))
    return USAGE_ERROR if settings.errors else verify.exit_code(report)


def cmd_apply_diffs(args) -> int:
    from sglang_pcie.base import SourceTree, installed_sglang_root
    from sglang_pcie.diffs import ALREADY, DiffError, apply_release_diffs

    root = Path(args.target) if args.target else installed_sglang_root()
    if root is None:
        return _fail("no sglang installed here; use --target DIR (the folder holding the sglang package)")
    try:
        tree = SourceTree(root)
        run = apply_release_diffs(tree, reverse=args.reverse, dry_run=args.dry_run)
    except (ValueError, DiffError) as exc:
        return _fail(str(exc))
    where = f"sglang {run.version} in {run.root}"
    if run.refused:  # one line per refusing patch, naming its status; nothing was written
        for step in run.refused:
            print(f"sglang-pcie: refused: {step.line()}", file=sys.stderr)
        print(f"sglang-pcie: apply-diffs changed nothing in {run.root}", file=sys.stderr)
        return 1
    changing = run.changing
    if changing:
        verb = ("would remove" if run.dry_run else "removed") if run.reverse else (
            "would apply" if run.dry_run else "applied")
        print(f"{verb} {len(changing)} diff(s) for {where}: {', '.join(s.patch_id for s in changing)}")
    elif any(step.action == ALREADY for step in run.steps):
        print(f"already applied: {where} carries every diff it needs")
    else:
        print(f"nothing to {'remove' if run.reverse else 'apply'} for {where}")
    for step in run.steps:
        if step not in changing:
            print(f"  {step.line()}")
    return 0


def cmd_env(args) -> int:
    from sglang_pcie import allreduce_paths, nccl

    settings = _settings_or_errors()
    decision = nccl.decide(settings.nccl_profile)
    paths = allreduce_paths.report(decision)
    if args.json:
        print(json.dumps(dict(decision.as_dict(), allreduce=paths), indent=2))
        return USAGE_ERROR if settings.errors else 0
    print(f"SGLANG_PCIE_NCCL_PROFILE: {decision.requested or 'invalid'} -> profile {decision.profile}")
    print(f"why: {decision.reason}")
    t = decision.topology if decision.topology is not None else nccl.probe_topology()
    if t.gpu_count == 0:
        print(f"GPUs: no GPU visible ({t.detail or t.source})")
    else:
        print(f"GPUs ({t.source}): {t.gpu_count} {', '.join(sorted(set(t.gpu_names)))};"
              f" NVLink: {t.nvlink}; peer-to-peer: {t.p2p}")
    if decision.advice:
        print(f"advice: {decision.advice}")
    for key, value in decision.values.items():
        print(f"would set {key}={value}")
    for key, value in decision.user_set.items():
        print(f"keeps {key}={value} (set by the user)")
    if not decision.values and not decision.user_set:
        print("would set nothing: NCCL defaults")
    ipc = decision.ipc
    if ipc is not None:
        for key, value in ipc.values.items():
            print(f"would set {key}={value}")
        for key, value in ipc.user_set.items():
            print(f"keeps {key}={value} (set by the user)")
    for line in allreduce_paths.format_report(paths):
        print(line)
    return USAGE_ERROR if settings.errors else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-pcie", description=sglang_pcie.__doc__)
    parser.add_argument("--version", action="version", version=f"sglang-pcie {sglang_pcie.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("verify-patches", help="each patch's status for an SGLang release, and the NCCL profile")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--sglang-source", metavar="DIR", help="a folder holding an sglang package")
    where.add_argument("--sglang-version", metavar="X", help="that release's wheel, fetched without dependencies")
    p.add_argument("--runtime", action="store_true",
                   help="import the real SGLang modules in a child process and check each patch is in effect")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--metadata", action="store_true", help="print each patch's metadata instead")
    p.set_defaults(func=cmd_verify_patches)

    p = sub.add_parser("apply-diffs", help="apply the versioned diffs to an SGLang source tree, all or nothing")
    p.add_argument("--target", metavar="DIR", help="folder holding the sglang package (default: the installed one)")
    p.add_argument("--dry-run", action="store_true", help="check that every diff applies; change nothing")
    p.add_argument("--reverse", action="store_true", help="remove the diffs instead")
    p.set_defaults(func=cmd_apply_diffs)

    p = sub.add_parser("env", help="the NCCL profile, the PCIe-IPC all-reduce switch and the all-reduce paths a server would use here, and why")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_env)

    # Listed for --help only: main() hands their arguments to their own modules.
    sub.add_parser("profile-report", help="summarise an EAGLE3_PROFILE log or JSON-lines file")
    sub.add_parser("tune-nccl", help="measure NCCL profiles on the local GPUs and keep the best")
    sub.add_parser("bench", help="one real server per variant (baseline, overlay, profile, yours), side by side")
    sub.add_parser("make-test-models", help="write a tiny random Llama target and EAGLE-3 drafter (no downloads)")
    sub.add_parser("check-drafter", help="check an EAGLE-3 drafter against its target without loading weights")
    return parser


# Commands whose own argument parser lives in their module; their arguments pass through untouched.
DELEGATED = {"profile-report": "sglang_pcie.profile_report", "tune-nccl": "sglang_pcie.tune_nccl",
             "bench": "sglang_pcie.bench", "make-test-models": "sglang_pcie.test_models",
             "check-drafter": "sglang_pcie.check_drafter"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        import importlib

        return importlib.import_module(DELEGATED[argv[0]]).main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `sglang-pcie ... | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
