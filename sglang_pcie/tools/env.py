"""``sglang-pcie env``: the NCCL decision, the PCIe-IPC switch and the all-reduce path a server started here now would
use, and why."""
from __future__ import annotations

import argparse
import json
import sys

from sglang_pcie.runtime import nccl
from sglang_pcie.runtime import gpus
from sglang_pcie.tools.allreduce_report import format_report, report
from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.common import USAGE_ERROR, settings_or_errors, variable_lines

EPILOG = "Exit status: 0, or 2 when a setting (or the tuned file it names) is invalid."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--nnodes", type=int, metavar="N",
                   help="what a launch with SGLang's --nnodes N would get here (default: what this environment says:"
                        " torch's launcher or SLURM variables, else one node)")


def run(args: argparse.Namespace) -> int:
    settings, errors = settings_or_errors()
    decision = nccl.decide(settings.nccl_profile, launch=launch_of(args))
    if decision.file_error:
        errors.append(decision.file_error)
        print(f"sglang-pcie: error: {decision.file_error}", file=sys.stderr)
    paths = report(decision)
    if args.json:
        print(json.dumps(dict(decision.as_dict(), allreduce=paths), indent=2))
        return USAGE_ERROR if errors else 0
    print(f"SGLANG_PCIE_NCCL_PROFILE: {decision.requested or 'invalid'} -> profile {decision.profile}")
    print(f"why: {decision.reason}")
    if decision.launch.multi_node or decision.launch.problem:
        print(f"nodes: {decision.launch.describe() if decision.launch.multi_node else 'one'}"
              + (f" ({decision.launch.problem})" if decision.launch.problem else ""))
    t = decision.topology if decision.topology is not None else gpus.probe_topology()
    if t.gpu_count == 0:
        print(f"GPUs: no GPU visible ({t.detail or t.source})")
    else:
        print(f"GPUs ({t.source}): {t.gpu_count} {', '.join(sorted(set(t.gpu_names)))}; {t.links()}")
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
    for line in variable_lines() + format_report(paths):
        print(line)
    return USAGE_ERROR if errors else 0


def launch_of(args):
    """The launch ``--nnodes`` describes, or the one this environment describes."""
    from sglang_pcie.runtime import launch

    if args.nnodes is not None:
        if args.nnodes < 1:
            raise UsageError(f"--nnodes {args.nnodes}: give a number of nodes, 1 or more")
        return launch.detect(["--nnodes", str(args.nnodes)], {})
    return launch.detect([], None)


COMMAND = Command("env", "the NCCL profile, the PCIe-IPC all-reduce switch and the all-reduce paths a server would "
                  "use here, and why", add_arguments, run, epilog=EPILOG, error_prefix="sglang-pcie")
