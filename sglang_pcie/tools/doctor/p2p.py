"""Peer-to-peer, measured: NVML's status of each pair, then a real copy between the GPUs with every byte compared and
the bandwidth timed (``p2p_child.py``, the one child process that uses CUDA, killed at its time bound).

A pair whose bytes come back wrong, or whose copy never finishes, is a hard failure: a TP server would corrupt its
results or hang at its first all-reduce there. A pair far below its link's bandwidth is a warning.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pcie.tools.doctor.findings import FAILURE, INFO, NOT_VISIBLE, OK, WARNING, Finding
from sglang_pcie.tools.doctor.gpu_facts import P2P_STATUS, GpuFacts, link_gen
from sglang_pcie.tools.doctor.p2p_child import PREFIX
from sglang_pcie.tools.doctor.world import Completed, NotVisible, World

CHILD = Path(__file__).with_name("p2p_child.py")
CHILD_KEY = "p2p-copy-check GPU {gpus}"  # how a recorded machine names the child's run over these GPUs
COPY_MIB, REPS = 64, 5
DEFAULT_TIMEOUT_S = 120.0
SLOW_FRACTION = 0.5  # healthy P2P copies reach 60-90% of the link (cross-socket Gen5 x16: 39-51 of 63 GB/s)
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}  # per lane and direction, after encoding
METHODS = {"copy-engine": "the copy engine", "sm-write": "SM stores into the peer",
           "sm-read": "SM loads from the peer"}
UNSAFE_FIX = ("until the cause is found and fixed (see host.iommu, host.acs and p2p.patched-driver): "
              "NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce, PCIe-IPC all-reduce off")


@dataclass
class ChildRun:
    start: dict | None = None  # torch, its CUDA and NCCL, the GPUs' compute capabilities
    results: dict = field(default_factory=dict)  # (a, b) positions in the TP group -> {"peer", "methods"}
    links: dict = field(default_factory=dict)  # position -> sysfs link attributes read under load (the fastest)
    begun: dict | None = None  # the last step begun and not finished: where a hang or crash stopped
    error: dict | None = None
    done: bool = False
    completed: Completed | None = None


def parse(done: Completed) -> ChildRun:
    run = ChildRun(completed=done)
    for line in done.stdout.splitlines():
        if not line.startswith(PREFIX):
            continue
        try:
            event = json.loads(line[len(PREFIX):])
        except ValueError:
            continue
        kind = event.get("event")
        if kind == "start":
            run.start = event
        elif kind == "begin":
            run.begun = event
        elif kind == "result":
            run.results[tuple(event["pair"])] = event
            run.begun = None
        elif kind == "link":  # a GPU is read with each new partner: keep its fastest reading under load
            for position, link in event["links"].items():
                best = run.links.get(int(position))
                if best is None or (link_gen(link.get("current_link_speed", "")) or 0) > (
                        link_gen(best.get("current_link_speed", "")) or 0):
                    run.links[int(position)] = link
            run.begun = None
        elif kind == "error":
            run.error = event
        elif kind == "done":
            run.done = True
    return run


def run_check(world: World, facts: GpuFacts, timeout: float) -> ChildRun:
    spec = {"gpus": [{"uuid": g.uuid, "bus_id": g.bus_id} for g in facts.used], "mib": COPY_MIB, "reps": REPS,
            "sysfs": "/sys/bus/pci/devices"}
    env = dict(world.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1")
    key = CHILD_KEY.format(gpus=",".join(str(g.index) for g in facts.used))
    return parse(world.run([sys.executable, str(CHILD), json.dumps(spec)], timeout, key=key, env=env))


# ---------------------------------------------------------------------------------------------------------------
# What NVML says


def nvml_findings(facts: GpuFacts) -> list[Finding]:
    used = facts.used
    if len(used) < 2:
        return []
    source = "nvidia-smi topo -p2p r (NVML)"
    if facts.p2p is None:
        why = next((n for n in facts.notes if "p2p" in n), "not read")
        return [Finding("p2p.nvml", NOT_VISIBLE, f"NVML's peer-to-peer status not visible: {why}", source=source)]
    blocked = [(a.index, b.index, facts.p2p.get((a.index, b.index), "U")) for a in used for b in used
               if a.index < b.index and facts.p2p.get((a.index, b.index)) != "OK"]
    if not blocked:
        return [Finding("p2p.nvml", OK, f"NVML reports peer-to-peer reads OK between all {len(used)} GPUs",
                        source=source)]
    shown = ", ".join(f"GPU {a}-{b} {code} ({P2P_STATUS.get(code, code)})" for a, b, code in blocked[:8])
    more = f" and {len(blocked) - 8} more" if len(blocked) > 8 else ""
    return [Finding(
        "p2p.nvml", WARNING,
        f"no peer-to-peer for {len(blocked)} pair(s): {shown}{more}: their all-reduce traffic goes through host "
        "memory (slower), and SGLang's custom all-reduce stays off",
        "CNS / TNS: the platform blocks it (IOMMU, ACS, GPUs under different root complexes: see host.iommu, "
        "host.acs); GNS: this GPU model offers no P2P over PCIe; NCCL works without it, slower", source)]


# ---------------------------------------------------------------------------------------------------------------
# What the copies say


def expected_gbps(facts: GpuFacts, a, b) -> tuple[float | None, str]:
    """The per-direction bandwidth of the narrower of the two GPUs' links (their top speed, their negotiated width:
    a downtrained width is host.link-width's finding, not this one's), and its name."""
    link = facts.link(a.index, b.index)
    if link and link.startswith("NV"):
        return None, link
    gens = [g for g in (a.gen_max, b.gen_max, a.gen_host_max, b.gen_host_max) if g]  # idle links run slower
    widths = [w for w in (a.width_now or a.width_max, b.width_now or b.width_max) if w]  # host.link-width: narrow
    if not gens or len(widths) < 2 or min(gens) not in LANE_GBPS:
        return None, "link unknown"
    return LANE_GBPS[min(gens)] * min(widths), f"Gen{min(gens)} x{min(widths)}"


def _label(facts: GpuFacts, pair) -> str:
    a, b = (facts.used[p].index for p in pair)
    return f"GPU {a} -> GPU {b}" if a != b else f"within GPU {a}"


def _corrupt(facts: GpuFacts, run: ChildRun) -> list[Finding]:
    out = []
    for pair, result in sorted(run.results.items()):
        bad = {m: r for m, r in result["methods"].items() if r.get("ok") is False}
        if not bad:
            continue
        what = "; ".join(f"{METHODS[m]}: {r['mismatched_words']:,} of {r['bytes'] // 4:,} words wrong (first at byte "
                         f"{r.get('first_bad_offset', 0):,})" for m, r in bad.items())
        out.append(Finding("p2p.corrupt", FAILURE,
                           f"{_label(facts, pair)}: data came back wrong ({what}): do not start a TP server on these "
                           "GPUs with P2P on: it would compute with corrupted all-reduce results",
                           UNSAFE_FIX, "P2P copy check (doctor's child process)"))
    return out


def _slow(facts: GpuFacts, run: ChildRun) -> list[Finding]:
    slow = []
    for pair, result in sorted(run.results.items()):
        a, b = (facts.used[p] for p in pair)
        copy = result["methods"].get("copy-engine", {})
        expected, link = expected_gbps(facts, a, b)
        if a is b or not result.get("peer") or expected is None or "gbps" not in copy:
            continue
        if copy["gbps"] < SLOW_FRACTION * expected:
            path = facts.link(a.index, b.index) or "?"
            slow.append(f"{_label(facts, pair)} {copy['gbps']:g} GB/s ({link} carries {expected:.1f}; path {path})")
    if not slow:
        return []
    more = f" and {len(slow) - 8} more" if len(slow) > 8 else ""
    return [Finding("p2p.slow", WARNING,
                    f"{len(slow)} pair(s) copy at under half of what their link carries: {'; '.join(slow[:8])}{more}: "
                    "every all-reduce between them is slowed",
                    "look at host.acs (P2P redirected through the root complex), host.iommu and host.numa "
                    "(cross-socket); `sglang-pcie tune-nccl` measures what the all-reduce gets", "P2P copy check")]


def _summary(facts: GpuFacts, run: ChildRun) -> Finding:
    speeds = {m: [r["methods"][m]["gbps"] for r in run.results.values() if "gbps" in r["methods"].get(m, {})]
              for m in METHODS}
    shown = ", ".join(f"{METHODS[m]} {min(v):g}-{max(v):g} GB/s" for m, v in speeds.items() if v)
    staged = sum(not r.get("peer") for r in run.results.values())
    staged_note = f"; {staged} pair(s) without peer access, copied through the host" if staged else ""
    if list(run.results) == [(0, 0)]:
        return Finding("p2p.copy", INFO,
                       f"one GPU, no peer pairs; the check ran within GPU {facts.used[0].index} to test itself: "
                       f"{COPY_MIB} MiB {REPS + 1} times by each path, every byte as sent ({shown})",
                       source="P2P copy check")
    return Finding("p2p.copy", OK,
                   f"{len(run.results)} ordered pairs, {COPY_MIB} MiB {REPS + 1} times by each path, every byte as "
                   f"sent ({shown}){staged_note}", source="P2P copy check")


def _stopped(facts: GpuFacts, run: ChildRun, timeout: float) -> list[Finding]:
    """A child that hung, crashed or reported an error: where, and what it means."""
    done, where = run.completed, run.begun or run.error or {}
    at = f" during {_label(facts, where['pair'])} ({where.get('method')})" if where.get("pair") else ""
    if done.missing:
        return [Finding("p2p.copy", NOT_VISIBLE, f"copy check not run: {done.problem()}", source="P2P copy check")]
    if done.timed_out:
        return [Finding("p2p.hang", FAILURE,
                        f"the copy check did not finish in {timeout:.0f} s{at}: peer-to-peer hangs on this box; NCCL "
                        "hangs the same way at its first all-reduce (local-inference-lab/rtx6kpro #15)",
                        f"{UNSAFE_FIX}; a longer --p2p-timeout if the machine was only busy", "P2P copy check")]
    error = run.error or {}
    if error.get("kind") in ("no-torch", "no-cuda", "mapping"):
        return [Finding("p2p.copy", NOT_VISIBLE, f"copy check not run: {error['message']}",
                        "run doctor in the Python environment that serves SGLang (torch with CUDA)", "P2P copy check")]
    if error:
        if "out of memory" in error.get("message", ""):
            return [Finding("p2p.copy", NOT_VISIBLE, f"copy check stopped{at}: {error['message']}",
                            "free the GPUs (another process holds their memory) and run doctor again",
                            "P2P copy check")]
        return [Finding("p2p.error", FAILURE, f"a CUDA error stopped the copy check{at}: {error['message']}: peer "
                                              "access faults on this box", UNSAFE_FIX, "P2P copy check")]
    tail = (done.stderr.strip().splitlines() or [""])[-1][:300]
    return [Finding("p2p.crash", WARNING, f"the copy check exited with {done.rc}{at} without a verdict"
                                          + (f": {tail}" if tail else ""),
                    "run benchmarks/gpu_doctor.sh or the check by hand to see its output", "P2P copy check")]


def _links(facts: GpuFacts, run: ChildRun) -> list[Finding]:
    slow = []
    for position, link in sorted(run.links.items()):
        gpu = facts.used[position]
        gen, width = link_gen(link.get("current_link_speed", "")), _digits(link.get("current_link_width"))
        most = link_gen(link.get("max_link_speed", "")) or gpu.gen_max
        if gen and most and gen < most:
            slow.append(f"{gpu.label} at Gen{gen} x{width or '?'} (its maximum Gen{most})")
    if not slow:
        return []
    return [Finding("p2p.link-under-load", WARNING,
                    f"under load the link stays below its maximum speed: {'; '.join(slow)}: P2P and host transfers "
                    "run at that speed", "check the slot (BIOS PCIe speed setting, riser or retimer), reseat the card",
                    "sysfs current_link_speed read during the copy check")]


def _digits(text) -> int | None:
    return int(text) if str(text or "").strip().isdigit() else None


def copy_findings(facts: GpuFacts, run: ChildRun, timeout: float) -> list[Finding]:
    out = _corrupt(facts, run)
    if not run.done:
        return out + _stopped(facts, run, timeout)
    if not out:
        out.append(_summary(facts, run))
    return out + _slow(facts, run) + _links(facts, run)


# ---------------------------------------------------------------------------------------------------------------
# What else knows about P2P here: a patched driver, SGLang's own cached verdict


def patched_driver_finding(facts: GpuFacts) -> list[Finding]:
    used = facts.used
    geforce = [g for g in used if "geforce" in g.name.lower()]
    pcie_ok = [(a, b) for a in used for b in used if a.index < b.index and facts.p2p
               and facts.p2p.get((a.index, b.index)) == "OK" and not (facts.link(a.index, b.index) or "").startswith("NV")]
    if not geforce or not pcie_ok:
        return []
    return [Finding(
        "p2p.patched-driver", WARNING,
        f"{geforce[0].name} GPUs report peer-to-peer over PCIe, which NVIDIA's drivers do not offer on GeForce cards: "
        "a P2P-patched kernel module is the usual reason; over such a driver a custom all-reduce returned wrong data "
        "(0% draft acceptance) while plain copies checked out (noonghunna/club-3090 #922)",
        "serve with --disable-custom-all-reduce unless an A/B with `sglang-pcie bench` shows identical outputs",
        f"nvidia-smi -q product name; nvidia-smi topo -p2p r; driver {facts.driver}")]


def sglang_cache_finding(world: World, facts: GpuFacts, run: ChildRun | None) -> list[Finding]:
    """SGLang tests P2P once per CUDA_VISIBLE_DEVICES value and keeps the verdict in a file it never re-tests."""
    env = world.environ
    visible = env.get("CUDA_VISIBLE_DEVICES") or ",".join(str(i) for i in range(len(facts.gpus)))
    base = env.get("SGLANG_CACHE_DIR") or f"{env.get('HOME', '~')}/.cache/sglang"
    path = f"{base}/gpu_p2p_access_cache_for_{visible}.json"
    try:
        cached = json.loads(world.read(path))
    except (NotVisible, ValueError):
        return []
    broken = set()
    if run is not None:
        broken = {p for p, r in run.results.items() if any(m.get("ok") is False for m in r["methods"].values())}
        if run.completed is not None and run.completed.timed_out and run.begun:
            broken.add(tuple(run.begun["pair"]))
    trusted = [f"{a}->{b}" for a, b in sorted(broken) if cached.get(f"{a}->{b}") is True]
    if trusted:
        return [Finding("p2p.sglang-cache", WARNING,
                        f"SGLang cached peer access as working for {', '.join(trusted)} (CUDA indices) in {path}, "
                        "and will run its custom all-reduce on it without testing again",
                        f"delete {path}, and serve with --disable-custom-all-reduce until the copy check passes",
                        path)]
    refused = sorted(k for k, v in cached.items() if v is False and k.split("->")[0] != k.split("->")[1])
    if refused and run is not None and run.done and not broken:
        return [Finding("p2p.sglang-cache", INFO,
                        f"SGLang cached no peer access for {', '.join(refused[:6])} in {path}, while the copy check "
                        "passed: its custom all-reduce stays off until the file is gone",
                        f"delete {path} to let SGLang test again", path)]
    return []
