"""The plan for this box: which all-reduce path a server started now would use (the decision ``sglang-pcie env``
reports: ``runtime.nccl.decide`` and the all-reduce report), whether a tune-nccl result exists and still matches,
what the user's settings will do at this TP size, and the next command to run."""
from __future__ import annotations

import dataclasses

from sglang_pcie.patching import register
from sglang_pcie.runtime import gpus as runtime_gpus
from sglang_pcie.runtime import nccl
from sglang_pcie.runtime.settings import load_settings, unknown_patch_ids
from sglang_pcie.tools.allreduce_report import report
from sglang_pcie.tools.doctor.findings import FAILURE, INFO, OK, WARNING, Finding
from sglang_pcie.tools.doctor.gpu_facts import GpuFacts
from sglang_pcie.tools.doctor.world import World

SOURCE = "runtime.nccl.decide + the all-reduce report (what `sglang-pcie env` prints)"
FUSION_MIN_TP = 4  # sglang #32330: a substantial regression at TP4; its closing note asks for TP gating
NOT_SM120 = ("Hopper", "Ada Lovelace", "Ampere", "Turing", "Volta")  # architectures nvidia-smi names, none SM120


def _decision(world: World, facts: GpuFacts, requested):
    """The launcher's decision over every visible GPU (as a server makes it), reported for the TP group."""
    if world.live:
        def probe():
            return runtime_gpus.probe_topology(world.environ)
    else:
        def probe():
            return facts.topology(facts.visible)
    decision = nccl.decide(requested, world.environ, probe)
    return decision, report(dataclasses.replace(decision, topology=facts.topology()))


def _tuned(decision, tp: int, topology) -> list[Finding]:
    if decision.file_error:
        return [Finding("plan.tuned", WARNING, f"the tuned NCCL file cannot be used: {decision.file_error}",
                        "run `sglang-pcie tune-nccl` again (it rewrites the file), or unset SGLANG_PCIE_TUNED_FILE",
                        SOURCE)]
    if decision.config is not None:
        return [Finding("plan.tuned", OK, f"a tune-nccl result matches these GPUs: {decision.reason}", source=SOURCE)]
    if "measured on another setup" in decision.reason:
        return [Finding("plan.tuned", WARNING, f"the tune-nccl result no longer matches: {decision.reason}",
                        "run `sglang-pcie tune-nccl` on this setup (the GPUs, links, NCCL and transport switches "
                        "the server will run with)", SOURCE)]
    if tp > 1 and topology.nvlink is not True:
        return [Finding("plan.tuned", INFO, f"no tune-nccl result for these GPUs: {decision.reason}",
                        "run `sglang-pcie tune-nccl` once: it measures NCCL profiles and the PCIe-IPC all-reduce here",
                        SOURCE)]
    return []


def _fusion(settings, tp: int, facts: GpuFacts, child_start: dict | None) -> list[Finding]:
    if not settings.sm120_fusion:
        return []
    caps = set((child_start or {}).get("capabilities") or [])
    archs = {g.arch for g in facts.used}
    if (caps and not any(c.startswith("12.") for c in caps)) or (not caps and archs and archs <= set(NOT_SM120)):
        shown = ", ".join(sorted(caps) or sorted(a for a in archs if a))
        return [Finding("plan.sm120-fusion", INFO, f"SGLANG_PCIE_SM120_FUSION=1 has no effect on these GPUs "
                                                   f"({shown}): the patch acts on SM120 only", source="settings")]
    bench = (f"SGLANG_PCIE_SM120_FUSION=0 sglang-pcie bench --variant overlay --variant "
             f"'fusion:env=SGLANG_PCIE_SM120_FUSION=1;tokens=may-differ' -- <your launch arguments> --tp {tp}")
    if tp >= FUSION_MIN_TP:
        return [Finding("plan.sm120-fusion", WARNING,
                        f"SGLANG_PCIE_SM120_FUSION=1 at TP {tp}: upstream closed the SM120 all-reduce-fusion PR after "
                        "a substantial TP4 regression and asks for TP gating validated at TP2, TP4 and TP8 "
                        "(sgl-project/sglang #32330); not measured on this box",
                        f"unset it, or A/B it here first: {bench}", "settings; sgl-project/sglang #32330")]
    return [Finding("plan.sm120-fusion", INFO, f"SGLANG_PCIE_SM120_FUSION=1 at TP {tp}: upstream measured +5.2% decode "
                                               "at TP2 on 2 x RTX PRO 6000 (sgl-project/sglang #30700)",
                    f"confirm it here: {bench}", "settings")]


def _p2p_switch(world: World, p2p_broken: bool, p2p_healthy: bool) -> list[Finding]:
    if world.environ.get("NCCL_P2P_DISABLE", "").strip() not in ("1", "true", "yes", "on"):
        return []
    said = ("NCCL_P2P_DISABLE=1: NCCL moves all-reduce data through host memory instead of peer-to-peer; SGLang's "
            "custom all-reduce and the PCIe-IPC all-reduce do not read this switch")
    if p2p_broken:
        return [Finding("plan.nccl-p2p-disable", INFO, f"{said}: the workaround this box needs now",
                        "keep it, and add --disable-custom-all-reduce until peer-to-peer is fixed", "environment")]
    if p2p_healthy:
        return [Finding("plan.nccl-p2p-disable", WARNING, f"{said}; the copy check found peer-to-peer healthy here, "
                                                          "so it only costs bandwidth",
                        "unset NCCL_P2P_DISABLE and measure with `sglang-pcie tune-nccl`", "environment")]
    return [Finding("plan.nccl-p2p-disable", INFO, said, source="environment")]


def _ipc_across_sockets(rep: dict, decision, spans_sockets: bool) -> list[Finding]:
    ipc_on = any(p.get("on") for p in rep["paths"] if p["path"].startswith("PCIe-IPC"))
    if not (ipc_on and spans_sockets):
        return []
    if decision.ipc is not None and decision.ipc.user_set:
        return [Finding("plan.ipc-sockets", WARNING,
                        "the PCIe-IPC (one-shot) all-reduce is switched on by you over a TP group that spans CPU "
                        "sockets: it measured slower than NCCL on 8 GPUs over two sockets elsewhere "
                        "(local-inference-lab/rtx6kpro wiki)",
                        "let `sglang-pcie tune-nccl` decide it on this box (unset SGLANG_ENABLE_PCIE_IPC_ALLREDUCE)",
                        SOURCE)]
    return [Finding("plan.ipc-sockets", OK, "the PCIe-IPC all-reduce spans CPU sockets here, and tune-nccl measured "
                                            "it faster on this box", source=SOURCE)]


def next_step(findings: list[Finding], tp: int, decision, topology) -> Finding:
    if any(f.severity == FAILURE for f in findings):
        step = "fix the failures above, then run `sglang-pcie doctor` again"
    elif tp > 1 and decision.config is None and topology.nvlink is not True:
        step = "`sglang-pcie tune-nccl` (measure NCCL and the PCIe-IPC all-reduce on these GPUs)"
    elif any(f.id == "plan.sm120-fusion" and f.severity == WARNING for f in findings):
        step = "the bench A/B named in plan.sm120-fusion"
    else:
        step = f"start the server: python -m sglang.launch_server --tp {tp} ..."
    return Finding("plan.next", INFO, f"next: {step}", source="doctor")


def plan(world: World, facts: GpuFacts, earlier: list[Finding], child_start: dict | None) -> list[Finding]:
    settings = load_settings(world.environ)
    errors = settings.errors + list(filter(None, [unknown_patch_ids(settings, register.ids(), world.environ)]))
    out = [Finding("plan.settings", WARNING, f"{error}", "fix or unset the variable: a server warns once and applies "
                                                         "nothing from it", "environment") for error in errors]
    tp = len(facts.used)
    decision, rep = _decision(world, facts, settings.nccl_profile)
    topology = facts.topology()
    broken = any(f.severity == FAILURE and f.section == "p2p" for f in earlier)
    healthy = (any(f.id == "p2p.copy" and f.severity == OK for f in earlier)
               and not any(f.id == "p2p.nvml" and f.severity != OK for f in earlier))
    uses = f"a server started now with --tp {tp} uses: {rep['server_uses']}. Why: {rep['why']}"
    if broken and rep["server_uses"].startswith("custom all-reduce"):
        out.append(Finding("plan.allreduce", WARNING, f"{uses}; its peer-to-peer path failed the copy check here",
                           "serve with --disable-custom-all-reduce (and NCCL_P2P_DISABLE=1) until P2P is fixed",
                           SOURCE))
    else:
        out.append(Finding("plan.allreduce", INFO, uses, source=SOURCE))
    out += _tuned(decision, tp, topology)
    out += _fusion(settings, tp, facts, child_start)
    out += _p2p_switch(world, broken, healthy)
    spans = any(f.id == "host.numa" and f.severity == WARNING for f in earlier)
    out += _ipc_across_sockets(rep, decision, spans)
    out.append(next_step(earlier + out, tp, decision, topology))
    return out
