"""``sglang-pcie check-drafter``: the checks in order, the report (a table or JSON), the command's arguments."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sglang_pcie.tools.check_drafter.checkpoint import Checkpoint
from sglang_pcie.tools.check_drafter.context import Context
from sglang_pcie.tools.check_drafter.head_rows import check_head_rows
from sglang_pcie.tools.check_drafter.launch_args import check_launch_args
from sglang_pcie.tools.check_drafter.layer_ids import check_layer_ids
from sglang_pcie.tools.check_drafter.model_checks import (check_architecture, check_attention, check_embeddings,
                                                          check_input_width, check_target_match)
from sglang_pcie.tools.check_drafter.report import FAIL, OK, WARN, InputError
from sglang_pcie.tools.check_drafter.sglang_facts import sglang_facts
from sglang_pcie.tools.check_drafter.vocab import check_comparison, check_coverage, check_mapping
from sglang_pcie.tools.command import Command, UsageError

SAMPLE_TEXT = Path(__file__).parent.parent / "data" / "sample.txt"
# In report order; each returns a Check, or None where it has nothing to say (no --target, no --compare-d2t).
CHECKS = (check_architecture, check_input_width, check_attention, check_embeddings, check_target_match,
          check_layer_ids, check_mapping, check_head_rows, check_coverage, check_comparison, check_launch_args)


def run_checks(draft: str, target: str | None = None, other: str | None = None, text: str | None = None,
               sglang_source: str | None = None, sglang_version: str | None = None,
               launch_args: list[str] | None = None) -> dict:
    """The report of every check; ``launch_args``: the server's launch arguments, where given."""
    started = time.perf_counter()
    ctx = Context(Checkpoint(draft, "draft"), Checkpoint(target, "target") if target else None,
                  Checkpoint(other, "compare-d2t") if other else None,
                  sglang_facts(sglang_source, sglang_version), Path(text) if text else SAMPLE_TEXT, launch_args)
    if text and not ctx.text_path.is_file():
        raise InputError(f"--text {text}: no such file")
    checks = []
    for check in CHECKS:
        try:
            result = check(ctx)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # e.g. "hidden_size": "7168"
            raise InputError(f"{check.__name__.replace('check_', '')}: a config value has the wrong type or form"
                             f" ({type(exc).__name__}: {exc})") from None
        checks.extend([result] if result else [])
    return {"draft": str(ctx.draft.dir), "target": str(ctx.target.dir) if ctx.target else None,
            "sglang_version": ctx.facts.version if ctx.facts else None,
            "checks": [c.as_dict() for c in checks],
            "result": FAIL if any(c.status == FAIL for c in checks) else OK,
            "seconds": round(time.perf_counter() - started, 3)}


def format_table(report: dict) -> str:
    lines = [f"drafter {report['draft']}",
             f"target  {report['target'] or '(none: give --target DIR)'}",
             f"sglang  {report['sglang_version'] or '(not installed)'}"]
    width = max(len(c["check"]) for c in report["checks"])
    lines.append(f"{'CHECK':<{width}}  STATUS  REASON")
    for c in report["checks"]:
        lines.append(f"{c['check']:<{width}}  {c['status']:<6}  {c['reason']}")
    failed = sum(1 for c in report["checks"] if c["status"] == FAIL)
    warned = sum(1 for c in report["checks"] if c["status"] == WARN)
    lines.append(f"{failed} failed, {warned} warned, {len(report['checks'])} checks in {report['seconds']:.2f} s")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", required=True, metavar="DIR",
                        help="the EAGLE-3 drafter: a model folder or a Hugging Face cache entry")
    parser.add_argument("--target", metavar="DIR", help="the target model (config, headers and tokenizer)")
    parser.add_argument("--compare-d2t", metavar="DIR", help="another drafter (a reference) whose d2t should agree")
    parser.add_argument("--text", metavar="FILE", help="text for the coverage check (default: a bundled sample)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sglang-source", metavar="DIR", help="check against this SGLang tree, not the installed one")
    where.add_argument("--sglang-version", metavar="X", help="check against this release's wheel (fetched)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        report = run_checks(args.draft, args.target, args.compare_d2t, args.text, args.sglang_source,
                            args.sglang_version, args.passthrough)
    except InputError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 1 if report["result"] == FAIL else 0


COMMAND = Command("check-drafter", "check an EAGLE-3 drafter against its target without loading weights",
                  add_arguments, run,
                  description="Check an EAGLE-3 drafter (and its fit to a target) from configs, safetensors"
                              " headers and a few rows, before a long server start; after `--`, the server's launch"
                              " arguments are checked against the drafter. Exit 0: nothing failed; 1: a check"
                              " failed; 2: bad usage or unreadable input.",
                  usage="sglang-pcie check-drafter --draft DIR [--target DIR] [--compare-d2t DIR] [--text FILE]"
                        " [--json] [--sglang-source DIR | --sglang-version X] [-- <launch_server arguments>]",
                  passthrough=True)
