"""``sglang-pcie doctor``: the probes in order, each under a time bound, and the table or JSON they make."""
from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import asdict
from pathlib import Path

from sglang_pcie.tools.command import Command, UsageError
from sglang_pcie.tools.doctor import findings as F
from sglang_pcie.tools.doctor import gpu_facts, host, network, p2p, plan
from sglang_pcie.tools.doctor.findings import INFO, NOT_VISIBLE, Finding
from sglang_pcie.tools.doctor.world import RecordedWorld, RecordingWorld, World

PROBE_TIMEOUT_S = 60.0  # every probe but the copy check (which has its own bound): reads and short commands
DESCRIPTION = ("What on this box will hang, corrupt or slow a multi-GPU SGLang server, found before the first "
               "start: peer-to-peer between every two GPUs (NVML's status, then a real copy with every byte "
               "compared and the bandwidth timed), the host (IOMMU, ACS, PCIe links, BAR1, NUMA / sockets, driver "
               "and library versions), the all-reduce plan a server started now would follow, and the network for "
               "multi-node. One line per finding: what it will cause, how to fix it, where the fact comes from. "
               "Only the copy check's child process uses CUDA; no root needed (what only root can see is said).")
EPILOG = ("Exit status: 0 nothing wrong (ok, info and not-visible lines only), 1 at least one warning (slower or "
          "risky), 2 bad usage, 3 at least one failure (a server would hang or compute wrong results). "
          "Finding ids and fixes: https://github.com/sglang-pcie/sglang-pcie/blob/main/docs/doctor.md")


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 1 to 3600")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output: findings, probe times, GPUs")
    p.add_argument("--tp", type=_positive_int, metavar="N",
                   help="the TP size you will serve with: the first N visible GPUs (default: every visible GPU)")
    p.add_argument("--nodes", type=_positive_int, default=1, metavar="N",
                   help="nodes the server will span (default 1): from 2, what the network lacks for it is a warning")
    p.add_argument("--no-p2p-test", action="store_true",
                   help="skip the copy check (NVML's P2P status is still read)")
    p.add_argument("--p2p-timeout", type=_seconds, default=p2p.DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"time bound of the copy check, torch's start included (default {p2p.DEFAULT_TIMEOUT_S:.0f})")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--facts", metavar="DIR", help="read a recorded machine (a --record folder) instead of this one")
    source.add_argument("--record", metavar="DIR", help="also write every file and command output read into DIR "
                                                        "(the layout --facts reads)")


def bounded(name: str, seconds: float, probe, probes: list):
    """``probe()`` in a daemon thread, waited for at most ``seconds``: (result, None) or (None, why not)."""
    box = {}

    def work():
        try:
            box["result"] = probe()
        except Exception as exc:  # noqa: BLE001 - a probe that breaks is one not-visible line, never a traceback
            box["error"] = f"{type(exc).__name__}: {exc}"

    began = time.monotonic()
    thread = threading.Thread(target=work, name=f"doctor-{name}", daemon=True)
    thread.start()
    thread.join(seconds)
    timed_out = thread.is_alive()
    probes.append({"name": name, "seconds": round(time.monotonic() - began, 3), "timed_out": timed_out})
    if timed_out:
        return None, f"did not finish in {seconds:.0f} s"
    return box.get("result"), box.get("error")


def gpu_findings(facts: gpu_facts.GpuFacts, tp: int | None) -> list[Finding]:
    if facts.problem:
        return [Finding("gpu.inventory", INFO, facts.problem, source="nvidia-smi -q; CUDA_VISIBLE_DEVICES")]
    names = {}
    for gpu in facts.used:
        names[gpu.name] = names.get(gpu.name, 0) + 1
    models = ", ".join(f"{n} x {name}" for name, n in names.items())
    hidden = len(facts.gpus) - len(facts.visible)
    selection = (f" of {len(facts.gpus)} ({hidden} hidden by CUDA_VISIBLE_DEVICES)" if hidden else "") + (
        f", the first {tp} of {len(facts.visible)} visible (--tp)" if tp and tp < len(facts.visible) else "")
    out = [Finding("gpu.inventory", INFO,
                   f"a TP server here uses {len(facts.used)} GPU(s){selection}: {models} "
                   f"(GPU {', '.join(str(g.index) for g in facts.used)}); driver {facts.driver}, CUDA {facts.cuda}",
                   source="nvidia-smi -q")]
    out += [Finding("gpu.not-read", NOT_VISIBLE, note, source="nvidia-smi") for note in facts.notes]
    return out


def p2p_section(world: World, facts, args) -> tuple[list[Finding], p2p.ChildRun | None]:
    out, run = p2p.nvml_findings(facts), None
    if args.no_p2p_test:
        out.append(Finding("p2p.copy", INFO, "copy check skipped (--no-p2p-test): whether P2P moves the right bytes "
                                             "is not known", source="doctor"))
    else:
        run = p2p.run_check(world, facts, args.p2p_timeout)
        out += p2p.copy_findings(facts, run, args.p2p_timeout)
    out += p2p.patched_driver_finding(facts)
    out += p2p.sglang_cache_finding(world, facts, run)
    return out, run


def host_section(world: World, facts, run: p2p.ChildRun | None) -> list[Finding]:
    cpu = host.lscpu(world)
    hyper = host.hypervisor(world, cpu)
    out = host.machine(hyper)
    if facts.used:
        out += host.iommu(world, facts, hyper) + host.acs(world, facts) + host.links(world, facts, run is not None)
        out += host.bar1(facts) + host.numa(world, facts, cpu) + host.driver(world, facts)
    return out + host.versions(facts, run.start if run else None)


def diagnose(world: World, args) -> tuple[list[Finding], list[dict], gpu_facts.GpuFacts]:
    probes, found = [], []

    def step(name, seconds, probe, fallback):
        result, problem = bounded(name, seconds, probe, probes)
        if problem:
            found.append(Finding(f"{fallback}.probe", NOT_VISIBLE, f"the {name} probe stopped: {problem}",
                                 source="doctor"))
        return result

    facts = step("gpus", PROBE_TIMEOUT_S, lambda: gpu_facts.read_gpus(world, args.tp), "gpu")
    facts = facts or gpu_facts.GpuFacts(problem="no GPU visible: the GPU probe did not finish")
    if args.tp and facts.visible and args.tp > len(facts.visible):
        raise UsageError(f"--tp {args.tp}: only {len(facts.visible)} GPU(s) visible here")
    found[:0] = gpu_findings(facts, args.tp)
    run = None
    if facts.used:
        result = step("p2p", args.p2p_timeout + PROBE_TIMEOUT_S, lambda: p2p_section(world, facts, args), "p2p")
        if result:
            found += result[0]
            run = result[1]
    found += step("host", PROBE_TIMEOUT_S, lambda: host_section(world, facts, run), "host") or []
    if facts.used:
        found += step("plan", PROBE_TIMEOUT_S,
                      lambda: plan.plan(world, facts, list(found), run.start if run else None), "plan") or []
    found += step("network", PROBE_TIMEOUT_S, lambda: network.network(world, facts, args.nodes), "net") or []
    return found, probes, facts


def run(args: argparse.Namespace) -> int:
    if args.facts:
        if not Path(args.facts).is_dir():
            raise UsageError(f"--facts {args.facts}: no such folder")
        world = RecordedWorld(args.facts)
    elif args.record:
        world = RecordingWorld(args.record)
    else:
        world = World()
    found, probes, facts = diagnose(world, args)
    code = F.exit_code(found)
    if args.json:
        print(json.dumps({"exit": code, "counts": F.counts(found), "findings": F.as_dicts(found), "probes": probes,
                          "gpus": [asdict(g) for g in facts.used],
                          "machine": "this one" if world.live else f"recorded: {args.facts}"}, indent=1))
        return code
    if not world.live:
        print(f"(recorded machine: {args.facts})")
    for line in F.table(found):
        print(line)
    print("probes: " + ", ".join(f"{p['name']} {p['seconds']:.1f} s" + (" (timed out)" if p["timed_out"] else "")
                                 for p in probes))
    return code


COMMAND = Command("doctor", "what on this box will hang, corrupt or slow a multi-GPU server: peer-to-peer measured, "
                  "the host, the all-reduce plan, the network", add_arguments, run, description=DESCRIPTION,
                  epilog=EPILOG)
