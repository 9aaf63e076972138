"""The host under the GPUs: IOMMU, ACS on the bridges above them, each GPU's PCIe link against its maximum, BAR1,
which NUMA node and CPU socket each GPU hangs off, a virtual machine, the driver and the CUDA / NCCL / FlashInfer
/ SGLang versions, and the NCCL release against those reported bad on PCIe boxes (nccl_releases). Read from sysfs,
/proc, ``lscpu`` and ``lspci`` through the world; what this process may not see (no root, no tool, a VM) is said as
"not visible" and why.
"""
from __future__ import annotations

import re

from sglang_pcie.runtime import allreduce, tuned_file
from sglang_pcie.tools.doctor import nccl_releases
from sglang_pcie.tools.doctor.findings import FAILURE, INFO, NOT_VISIBLE, OK, WARNING, Finding
from sglang_pcie.tools.doctor.gpu_facts import GpuFacts, link_gen
from sglang_pcie.tools.doctor.world import NotVisible, World

LSPCI_TIMEOUT_S = 30.0
LSCPU_TIMEOUT_S = 10.0
PCI = "/sys/bus/pci/devices"
ACS_REDIRECT = ("ReqRedir", "CmpltRedir", "EgressCtrl")  # what pci=disable_acs_redir= clears: P2P goes upstream
TRANSLATED = ("DMA", "DMA-FQ")  # iommu_group/type values where the IOMMU translates the device's DMA


def lscpu(world: World) -> dict:
    done = world.run(["lscpu"], LSCPU_TIMEOUT_S)
    if done.problem():
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in done.stdout.splitlines()) if v}


def _sysfs(world: World, gpu, name: str) -> str | None:
    try:
        return world.read(f"{PCI}/{gpu.bus_id}/{name}").strip()
    except NotVisible:
        return None


# ---------------------------------------------------------------------------------------------------------------
# Links and BAR1


def _link(world: World, gpu) -> tuple[int | None, int | None, int | None, int | None, str]:
    """(gen now, gen max, width now, width max, source): sysfs, else what nvidia-smi -q said."""
    speeds = [_sysfs(world, gpu, n) for n in ("current_link_speed", "max_link_speed")]
    widths = [_sysfs(world, gpu, n) for n in ("current_link_width", "max_link_width")]
    if None not in speeds + widths and all(w.isdigit() for w in widths):
        return link_gen(speeds[0]), link_gen(speeds[1]), int(widths[0]), int(widths[1]), "sysfs"
    return gpu.gen_now, gpu.gen_max, gpu.width_now, gpu.width_max, "nvidia-smi -q"


def links(world: World, facts: GpuFacts, measured_under_load: bool) -> list[Finding]:
    out, idle, sources, shown = [], [], set(), set()
    for gpu in facts.used:
        gen, gen_max, width, width_max, source = _link(world, gpu)
        sources.add(source)
        if width and width_max and width < width_max:
            out.append(Finding(
                "host.link-width", WARNING,
                f"{gpu.label} negotiated PCIe x{width} of its x{width_max}: a downtrained link; P2P, NCCL and host "
                f"transfers to this GPU get {width}/{width_max} of the bandwidth",
                "reseat the card and its riser; check the slot's lanes in the BIOS (bifurcation, lanes shared with "
                "M.2 slots); a slot wired x8 cannot do more", f"{source} current_link_width / max_link_width"))
        if gpu.gen_host_max and gen_max and gpu.gen_host_max < gen_max:
            out.append(Finding(
                "host.link-slot", WARNING,
                f"{gpu.label} sits in a Gen{gpu.gen_host_max} slot (the GPU does Gen{gen_max}): its link runs at "
                f"Gen{gpu.gen_host_max} at most", "move it to a slot of its generation, or set the slot's speed to "
                "Auto in the BIOS", "nvidia-smi -q PCIe Generation Host Max"))
        if gen and gen_max and gen < gen_max:
            idle.append(f"{gpu.label} Gen{gen} (max Gen{gen_max})")
        shown.add(f"Gen{gen or '?'} x{width or '?'}" + ("" if (gen, width) == (gen_max, width_max) else
                                                          f" of Gen{gen_max or '?'} x{width_max or '?'}"))
    if idle:
        later = ("the copy check read it under load (p2p.link-under-load says if it stays low)" if measured_under_load
                 else "run without --no-p2p-test to read it under load")
        out.append(Finding("host.link-speed", INFO,
                           f"links below their maximum speed now: {'; '.join(idle)}: GPUs lower the link speed when "
                           f"idle, so this is a fault only if it stays low under load; {later}",
                           source=f"{'/'.join(sorted(sources))} current_link_speed"))
    if not out:
        out.append(Finding("host.link", OK, f"PCIe links of the {len(facts.used)} GPU(s): {', '.join(sorted(shown))}",
                           source=f"{'/'.join(sorted(sources))} link speed and width"))
    return out


def bar1(facts: GpuFacts) -> list[Finding]:
    small = [g for g in facts.used if g.bar1_mib and g.memory_mib and g.bar1_mib < g.memory_mib]
    known = [g for g in facts.used if g.bar1_mib]
    if not known:
        return [Finding("host.bar1", NOT_VISIBLE, "BAR1 size not reported", source="nvidia-smi -q")]
    if not small:
        return [Finding("host.bar1", OK, f"BAR1 {known[0].bar1_mib // 1024} GiB, not smaller than the GPU memory "
                                         f"({known[0].memory_mib // 1024} GiB): Resizable BAR on",
                        source="nvidia-smi -q BAR1 Memory Usage")]
    severity = WARNING if len(facts.used) > 1 else INFO
    g = small[0]
    return [Finding("host.bar1", severity,
                    f"BAR1 of {', '.join(x.label for x in small)} is {g.bar1_mib} MiB, smaller than its {g.memory_mib} "
                    "MiB of memory (Resizable BAR off): peer-to-peer over PCIe maps peer memory through BAR1, and "
                    "P2P-enabling drivers need it to cover the memory",
                    "enable Above 4G Decoding and Resizable BAR in the BIOS", "nvidia-smi -q BAR1 Memory Usage")]


# ---------------------------------------------------------------------------------------------------------------
# IOMMU and ACS


def _iommu_units(world: World) -> list[str] | None:
    try:
        return world.listdir("/sys/class/iommu")
    except NotVisible as exc:
        return [] if "no such file" in str(exc) else None


def iommu(world: World, facts: GpuFacts, hypervisor: str | None) -> list[Finding]:
    units = _iommu_units(world)
    vm = f" (inside this {hypervisor} virtual machine; the host's own IOMMU is out of sight)" if hypervisor else ""
    if units is None:
        return [Finding("host.iommu", NOT_VISIBLE, "IOMMU state not visible: /sys/class/iommu unreadable",
                        source="/sys/class/iommu")]
    if not units:
        return [Finding("host.iommu", OK, f"no IOMMU active in this kernel (/sys/class/iommu is empty): the GPUs' "
                                          f"DMA is not translated{vm}", source="/sys/class/iommu")]
    try:
        cmdline = world.read("/proc/cmdline").split()
    except NotVisible:
        cmdline = []
    types = {g.index: _sysfs(world, g, "iommu_group/type") for g in facts.used}
    translated = [i for i, kind in types.items() if kind in TRANSLATED]
    by_type: dict = {}
    for index, kind in types.items():
        if kind:
            by_type.setdefault(kind, []).append(str(index))
    said = "; ".join(f"{kind} for GPU {', '.join(ids)}" for kind, ids in by_type.items())
    params = " ".join(t for t in cmdline if t.split("=")[0] in ("iommu", "intel_iommu", "amd_iommu",
                                                                 "iommu.passthrough"))
    source = f"/sys/class/iommu ({', '.join(units[:4])}); iommu_group/type; /proc/cmdline {params or '(no iommu=)'}"
    if translated:
        severity = WARNING if len(facts.used) > 1 else INFO
        return [Finding(
            "host.iommu", severity,
            f"the IOMMU translates the GPUs' DMA (iommu group type {said}): peer-to-peer between GPUs passes "
            "through address translation; NCCL then hangs at its first all-reduce on some boards "
            "(local-inference-lab/rtx6kpro #15, NVIDIA/nccl #1999) or runs slowly",
            "boot with iommu=pt (keeps the IOMMU for virtual machines, host devices pass through), or turn the IOMMU "
            "off (amd_iommu=off / intel_iommu=off, or in the BIOS); until then NCCL_P2P_DISABLE=1 and "
            "--disable-custom-all-reduce", source)]
    if types and all(kind == "identity" for kind in types.values()):
        return [Finding("host.iommu", OK, f"IOMMU on, pass-through for the GPUs (iommu group type {said}): their DMA "
                                          "is not translated", source=source)]
    if "iommu=pt" in cmdline or "iommu.passthrough=1" in cmdline:
        return [Finding("host.iommu", OK, f"IOMMU on, pass-through per the kernel command line ({params}); the "
                                          "GPUs' iommu_group/type is not readable", source=source)]
    return [Finding("host.iommu", WARNING if len(facts.used) > 1 else INFO,
                    f"IOMMU active ({', '.join(units[:4])}); whether it translates the GPUs' DMA is not visible (no "
                    "iommu_group/type; kernel older than 5.11?) and the command line has no iommu=pt",
                    "boot with iommu=pt unless this box runs virtual machines that need translation", source)]


def parse_lspci(text: str) -> dict:
    """``lspci -D -vvv``: address -> {"bus": (secondary, subordinate) for bridges, "acs": {flag: bool} or None,
    "denied": capabilities hidden (not root)}."""
    devices, current = {}, None
    for line in text.splitlines():
        header = re.match(r"([0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s", line)
        if header:
            current = devices.setdefault(header.group(1).lower(), {"bus": None, "acs": None, "denied": False})
            continue
        if current is None:
            continue
        bus = re.search(r"Bus: primary=([0-9a-f]+), secondary=([0-9a-f]+), subordinate=([0-9a-f]+)", line)
        if bus:
            current["bus"] = (int(bus.group(2), 16), int(bus.group(3), 16))
        elif "ACSCtl:" in line:
            current["acs"] = {m.group(1): m.group(2) == "+" for m in re.finditer(r"(\w+)([+-])", line.split(":", 1)[1])}
        elif "Capabilities: <access denied>" in line:
            current["denied"] = True
    return devices


def upstream_bridges(devices: dict, bus_id: str) -> list[str]:
    domain, bus = bus_id.split(":")[0], int(bus_id.split(":")[1], 16)
    return sorted(addr for addr, d in devices.items()
                  if d["bus"] and addr.split(":")[0] == domain and d["bus"][0] <= bus <= d["bus"][1])


def acs(world: World, facts: GpuFacts) -> list[Finding]:
    if len(facts.used) < 2:
        return []
    done = world.run(["lspci", "-D", "-vvv"], LSPCI_TIMEOUT_S)
    if done.problem():
        return [Finding("host.acs", NOT_VISIBLE, f"ACS not visible: {done.problem()}; sysfs shows PCIe capabilities "
                                                 "only as raw config space, to root",
                        "install pciutils and run doctor as root (sudo) to see ACS", "lspci -D -vvv")]
    devices = parse_lspci(done.stdout)
    above = {gpu.label: upstream_bridges(devices, gpu.bus_id) for gpu in facts.used}
    bridges = sorted({b for chain in above.values() for b in chain})
    if not bridges:
        return [Finding("host.acs", INFO, "no PCIe bridge above the GPUs in lspci (a virtual machine, or the GPUs sit "
                                          "on the root bus): ACS not applicable here", source="lspci -D -vvv")]
    hidden = [b for b in bridges if devices[b]["acs"] is None and devices[b]["denied"]]
    redirecting = {b: [f for f in ACS_REDIRECT if devices[b]["acs"] and devices[b]["acs"].get(f)] for b in bridges}
    redirecting = {b: flags for b, flags in redirecting.items() if flags}
    if redirecting:
        shown = "; ".join(f"{b} ({' '.join(f + '+' for f in flags)}) above "
                          f"{', '.join(label for label, chain in above.items() if b in chain)}"
                          for b, flags in redirecting.items())
        first = next(iter(redirecting))
        return [Finding(
            "host.acs", WARNING,
            f"ACS redirect on {len(redirecting)} bridge(s): {shown}: peer-to-peer requests between GPUs are sent up to "
            "the root complex; NCCL hangs there (NVIDIA/nccl #2079) or P2P runs slowly",
            f"disable ACS in the BIOS, or boot with pci=disable_acs_redir={';'.join(redirecting)}; as root until the "
            f"next boot: setpci -s {first} ECAP_ACS+6.w=0000 (each bridge)", "lspci -D -vvv ACSCtl")]
    if hidden:
        return [Finding("host.acs", NOT_VISIBLE, f"ACS of {len(hidden)} bridge(s) above the GPUs not visible: lspci "
                                                 "ran without root (capabilities: access denied)",
                        "run doctor as root (sudo) to see ACS", "lspci -D -vvv")]
    return [Finding("host.acs", OK, f"no ACS redirect on the {len(bridges)} bridge(s) above the GPUs",
                    source="lspci -D -vvv ACSCtl")]


# ---------------------------------------------------------------------------------------------------------------
# NUMA nodes and sockets


def _node_of(world: World, facts: GpuFacts, gpu) -> int | None:
    affinity = facts.topo.numa_affinity.get(f"GPU{gpu.index}") if facts.topo else None
    if affinity and affinity.isdigit():
        return int(affinity)
    raw = _sysfs(world, gpu, "numa_node")
    return int(raw) if raw and raw.lstrip("-").isdigit() and int(raw) >= 0 else None


def _socket_of(world: World, node: int) -> int | None:
    try:
        first = re.match(r"\d+", world.read(f"/sys/devices/system/node/node{node}/cpulist")).group(0)
        return int(world.read(f"/sys/devices/system/cpu/cpu{first}/topology/physical_package_id").strip())
    except (NotVisible, AttributeError, ValueError):
        return None


def numa(world: World, facts: GpuFacts, cpu: dict) -> list[Finding]:
    nodes = {gpu.index: _node_of(world, facts, gpu) for gpu in facts.used}
    sockets = int(cpu["Socket(s)"]) if cpu.get("Socket(s)", "").isdigit() else None
    source = "nvidia-smi topo -m NUMA Affinity / sysfs numa_node; node cpulist -> physical_package_id; lscpu"
    if None in nodes.values():
        if sockets == 1:
            return [Finding("host.numa", OK, "one CPU socket (lscpu): every GPU hangs off it", source=source)]
        unknown = ", ".join(f"GPU {i}" for i, n in nodes.items() if n is None)
        return [Finding("host.numa", NOT_VISIBLE, f"NUMA node of {unknown} not reported (numa_node -1, no topo -m "
                                                  "affinity)", source=source)]
    socket_of = {n: 0 if sockets == 1 else _socket_of(world, n) for n in set(nodes.values())}
    by_socket = None not in socket_of.values()
    groups: dict = {}
    for index, node in nodes.items():
        groups.setdefault(f"socket {socket_of[node]}" if by_socket else f"NUMA node {node}", []).append(index)
    where = ", ".join(f"NUMA node {n}" for n in sorted(set(nodes.values())))
    if len(groups) == 1:
        return [Finding("host.numa", OK, f"all {len(nodes)} GPU(s) on {next(iter(groups))} ({where})", source=source)]
    split = "; ".join(f"GPU {','.join(map(str, ids))} on {group}" for group, ids in groups.items())
    spans = f"{len(groups)} CPU sockets" if by_socket else f"{len(groups)} NUMA nodes (their sockets not visible)"
    return [Finding(
        "host.numa", WARNING,
        f"a TP group over these {len(nodes)} GPUs spans {spans} ({split}): every all-reduce crosses the CPU "
        "interconnect; one-shot PCIe all-reduce measured faster on 4 GPUs but slower on 8 GPUs over two sockets "
        "(local-inference-lab/rtx6kpro wiki)",
        "keep a TP group inside one socket (CUDA_VISIBLE_DEVICES of one socket's GPUs and --tp of that count; serve "
        "the other socket with a second server), or measure this TP size with `sglang-pcie tune-nccl`", source)]


# ---------------------------------------------------------------------------------------------------------------
# The machine, the driver, the versions


def hypervisor(world: World, cpu: dict) -> str | None:
    if cpu.get("Hypervisor vendor"):
        return cpu["Hypervisor vendor"]
    try:
        return "hypervisor" if " hypervisor" in world.read("/proc/cpuinfo", 64 * 1024) else None
    except NotVisible:
        return None


def machine(hyper: str | None) -> list[Finding]:
    if not hyper:
        return []
    return [Finding("host.vm", INFO, f"a virtual machine ({hyper}): the host's IOMMU, ACS and PCIe switches are out "
                                     "of sight from here; the copy check is what tells whether P2P works",
                    source="lscpu Hypervisor vendor / cpuinfo")]


def driver(world: World, facts: GpuFacts) -> list[Finding]:
    try:
        text = world.read("/proc/driver/nvidia/version")
        kind = "open kernel module" if "Open Kernel Module" in text else "proprietary kernel module"
    except NotVisible as exc:
        kind = f"module type not visible ({exc})"
    return [Finding("host.driver", INFO, f"NVIDIA driver {facts.driver or '?'} ({kind}); it supports CUDA up to "
                                         f"{facts.cuda or '?'}", source="nvidia-smi -q; /proc/driver/nvidia/version")]


def _torch_cuda(child_start: dict | None) -> tuple[str | None, str | None, str]:
    """(torch version, its CUDA, source): the copy check's torch, else the dist-info folder's +cuXYZ tag."""
    if child_start and child_start.get("torch"):
        return child_start["torch"], child_start.get("cuda"), "torch in the copy check"
    found = [v for d, v, _ in tuned_file.installed_distributions("torch-") if d == "torch"]
    if not found:
        return None, None, "no torch in this Python"
    tag = re.search(r"\+cu(\d+)(\d)$", found[0])
    return found[0], f"{tag.group(1)}.{tag.group(2)}" if tag else None, "torch dist-info"


def versions(facts: GpuFacts, child_start: dict | None) -> list[Finding]:
    torch, torch_cuda, where = _torch_cuda(child_start)
    nccl = (child_start or {}).get("nccl")
    nccl_from = "torch in the copy check" if nccl else "nvidia-nccl-cu* dist-info"
    nccl = nccl or tuned_file.installed_nccl()
    flashinfer, sglang = allreduce.flashinfer_install().version, allreduce.sglang_install().version
    out = [Finding("host.versions", INFO,
                   (f"torch {torch} (CUDA {torch_cuda or 'not visible'})" if torch else "torch not installed")
                   + f", NCCL {nccl or 'not found'}, "
                   f"FlashInfer {flashinfer or 'not installed'}, SGLang {sglang or 'not installed'}",
                   source=f"this Python environment ({where}; dist-info folders)")]
    major = [int(v.split(".")[0]) if v and v.split(".")[0].isdigit() else None for v in (torch_cuda, facts.cuda)]
    if None not in major and major[0] > major[1]:
        out.append(Finding("host.cuda", FAILURE,
                           f"torch is built for CUDA {torch_cuda}, the driver supports up to CUDA {facts.cuda}: CUDA "
                           "fails to initialise in every SGLang process",
                           f"install a driver for CUDA {torch_cuda}, or a torch build for CUDA {facts.cuda}",
                           f"{where}; nvidia-smi -q CUDA Version"))
    return out + nccl_release(nccl, nccl_from, facts)


def nccl_release(nccl: str | None, nccl_from: str, facts: GpuFacts) -> list[Finding]:
    """The NCCL a server would load (``versions``' reading; several distributions: each) against the releases
    reported bad on PCIe boxes (nccl_releases.KNOWN_BAD), on the GPUs of the TP group. Nothing where NCCL was not
    found: the versions line says so."""
    out = []
    for text in nccl.split(",") if nccl else []:
        release = nccl_releases.parse(text)
        if release is None:
            out.append(Finding("host.nccl-release", NOT_VISIBLE,
                               f"NCCL version {text.strip()!r} not understood: not compared with the NCCL releases "
                               "reported bad (docs/doctor.md)", source=f"NCCL from {nccl_from}"))
            continue
        for row, hit in nccl_releases.match(release, [g.name for g in facts.used]):
            source = f"{row.name} {row.source}; NCCL from {nccl_from}"
            if hit:
                several = len(facts.used) > 1
                on = ", ".join(str(g.index) for g in facts.used if g.name in hit)
                out.append(Finding(
                    "host.nccl-release", WARNING if several else INFO,
                    f"NCCL {release} is a release reported bad on {', '.join(sorted(set(hit)))} (GPU {on}): "
                    f"{row.symptom}; {row.name}: {row.reported}"
                    + ("" if several else "; one GPU here, so no collective between GPUs"), row.fix, source))
            elif facts.used:
                out.append(Finding("host.nccl-release", INFO,
                                   f"NCCL {release} is reported bad on {', '.join(row.gpus)}, not on these GPUs: "
                                   f"{row.symptom} ({row.name})", row.fix, source))
    return out
