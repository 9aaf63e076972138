"""The GPUs as the driver reports them, read from ``nvidia-smi`` (a subprocess with a time bound, so a wedged driver
costs seconds, and no CUDA context): ``-q`` for each GPU's name, UUID, PCI address, link generation and width,
BAR1 and memory; ``topo -m`` for the path between GPUs and to NICs, CPU and NUMA affinity; ``topo -p2p r`` for
NVML's peer-to-peer read status of each pair. Which GPUs a server would use follows ``CUDA_VISIBLE_DEVICES`` as
``runtime.gpus`` maps it, then ``--tp``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from sglang_pcie.runtime import gpus as runtime_gpus
from sglang_pcie.runtime.gpus import Topology
from sglang_pcie.tools.doctor.world import World

SMI_TIMEOUT_S = 30.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# nvidia-smi topo -m: the path between two devices, nearest first (its own legend)
PATH_RANK = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6}
P2P_STATUS = {"OK": "ok", "CNS": "chipset not supported", "GNS": "GPU not supported",
              "TNS": "topology not supported", "NS": "not supported", "DR": "disabled by regkey", "U": "unknown"}


@dataclass
class Gpu:
    index: int  # nvidia-smi's (and NVML's) index: PCI bus order
    name: str
    uuid: str
    bus_id: str  # as sysfs names it: 0000:41:00.0
    arch: str | None = None
    gen_now: int | None = None
    gen_max: int | None = None  # the GPU's own maximum ("Device Max", else "Max")
    gen_host_max: int | None = None  # the slot's ("Host Max"; N/A on older drivers and in VMs)
    width_now: int | None = None
    width_max: int | None = None
    bar1_mib: int | None = None
    memory_mib: int | None = None

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.bus_id})"


@dataclass
class Topo:
    """``nvidia-smi topo -m``: the path between every two of its devices (GPUn, NICn)."""
    devices: list = field(default_factory=list)  # column labels in order: GPU0.., NIC0..
    cells: dict = field(default_factory=dict)  # (row label, column label) -> "PIX", "NV18", "SYS", ...
    cpu_affinity: dict = field(default_factory=dict)  # "GPU0" -> "0-31,64-95"
    numa_affinity: dict = field(default_factory=dict)  # "GPU0" -> "0" (or "N/A")
    nic_names: dict = field(default_factory=dict)  # "NIC0" -> "mlx5_0"

    def path(self, a: str, b: str) -> str | None:
        return self.cells.get((a, b))


@dataclass
class GpuFacts:
    gpus: list = field(default_factory=list)  # every GPU nvidia-smi lists, in its order
    visible: list = field(default_factory=list)  # indices CUDA_VISIBLE_DEVICES shows, in CUDA's order
    chosen: list = field(default_factory=list)  # indices a TP server would use: the first --tp of those
    driver: str | None = None
    cuda: str | None = None  # the newest CUDA the driver supports
    topo: Topo | None = None
    p2p: dict | None = None  # (index, index) -> "OK" / "CNS" / ...; None: not read
    problem: str = ""  # why no GPU is visible, or why the selection could not be mapped
    notes: list = field(default_factory=list)  # facts not read, and why

    @property
    def used(self) -> list[Gpu]:
        return [self.gpus[i] for i in self.chosen]

    def link(self, a: int, b: int) -> str | None:
        return self.topo.path(f"GPU{a}", f"GPU{b}") if self.topo else None

    def topology(self, indices: list[int] | None = None) -> Topology:
        """The Topology ``runtime.nccl`` decides on for these GPUs (default: the TP group), built from these facts
        (a recorded machine has no NVML)."""
        used = [self.gpus[i] for i in (self.chosen if indices is None else indices)]
        pairs = [(a.index, b.index) for a in used for b in used if a.index != b.index]
        nvlink = p2p = None
        if len(used) > 1:
            links = [self.link(a, b) for a, b in pairs]
            nvlink = None if None in links else all(link.startswith("NV") for link in links)
            if self.p2p is not None:
                p2p = all(self.p2p.get(pair) == "OK" for pair in pairs)
        return Topology([g.name for g in used], nvlink, p2p, "nvidia-smi", f"{len(used)} GPU(s) (recorded)",
                        [g.uuid for g in used])


# ---------------------------------------------------------------------------------------------------------------
# nvidia-smi -q


GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def link_gen(speed: str) -> int | None:
    """sysfs link speed ("32.0 GT/s PCIe", "8 GT/s") -> PCIe generation; None for "Unknown" and the like."""
    try:
        return GEN_BY_GTS.get(float(speed.split()[0]))
    except (ValueError, IndexError):
        return None


def _int(text: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """00000000:41:00.0 (NVML) -> 0000:41:00.0 (sysfs)."""
    domain, rest = nvml_bus_id.strip().split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def parse_query(text: str) -> tuple[dict, list[dict]]:
    """``nvidia-smi -q`` as (top-level values, one dict per GPU of "Section/Sub/Key" -> value)."""
    top, gpus, current, stack = {}, [], None, []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0 and re.match(r"GPU [0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d$", line):
            current, stack = {"Bus Id": line.split(" ", 1)[1]}, []
            gpus.append(current)
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if ":" not in line:
            stack.append((indent, line.strip()))
            continue
        key, value = (part.strip() for part in line.split(":", 1))
        if current is None or indent == 0:
            top[key] = value
        else:
            current["/".join([name for _, name in stack] + [key])] = value
    return top, gpus


def _gpu(index: int, q: dict) -> Gpu:
    def first(*keys):
        return next((q[k] for k in keys if q.get(k) not in (None, "", "N/A")), None)

    link = "PCI/GPU Link Info"
    return Gpu(index=index, name=q.get("Product Name", "?"), uuid=q.get("GPU UUID", ""),
               bus_id=sysfs_bus_id(q.get("PCI/Bus Id") or q["Bus Id"]), arch=first("Product Architecture"),
               gen_now=_int(first(f"{link}/PCIe Generation/Current")),
               gen_max=_int(first(f"{link}/PCIe Generation/Device Max", f"{link}/PCIe Generation/Max")),
               gen_host_max=_int(first(f"{link}/PCIe Generation/Host Max")),
               width_now=_int(first(f"{link}/Link Width/Current")), width_max=_int(first(f"{link}/Link Width/Max")),
               bar1_mib=_int(first("BAR1 Memory Usage/Total")), memory_mib=_int(first("FB Memory Usage/Total")))


# ---------------------------------------------------------------------------------------------------------------
# nvidia-smi topo -m / topo -p2p r


def _matrix(text: str) -> tuple[list[str], list[list[str]]]:
    """(the header's device labels, the token rows that follow it): the first line whose first token is GPU0 is the
    header (nvidia-smi underlines it with ANSI escapes); each later line that starts with a GPUn / NICn is a row."""
    lines = [ANSI.sub("", line).split() for line in text.splitlines()]
    start = next((i for i, tokens in enumerate(lines) if tokens[:1] == ["GPU0"]), None)
    if start is None:
        return [], []
    devices = [t for t in lines[start] if re.fullmatch(r"(GPU|NIC)\d+", t)]
    rows = [tokens for tokens in lines[start + 1:] if tokens and tokens[0] in devices and len(tokens) > len(devices)]
    return devices, rows


def parse_topo(text: str) -> Topo:
    topo = Topo()
    topo.devices, rows = _matrix(text)
    width = len(topo.devices)
    for tokens in rows:
        row = tokens[0]
        for column, cell in zip(topo.devices, tokens[1:1 + width]):
            topo.cells[(row, column)] = cell
        tail = tokens[1 + width:]  # CPU Affinity, NUMA Affinity[, GPU NUMA ID]
        if row.startswith("GPU") and tail:
            topo.cpu_affinity[row] = tail[0]
            if len(tail) > 1:
                topo.numa_affinity[row] = tail[1]
    for line in text.splitlines():
        match = re.match(r"\s+(NIC\d+):\s*(\S+)\s*$", line)
        if match:
            topo.nic_names[match.group(1)] = match.group(2)
    return topo


def parse_p2p(text: str) -> dict:
    """``nvidia-smi topo -p2p r``: (i, j) -> status code (OK, CNS, ...) for i != j."""
    devices, rows = _matrix(text)
    columns = [int(label[3:]) for label in devices if label.startswith("GPU")]
    out = {}
    for tokens in rows:
        row = int(tokens[0][3:])
        for column, cell in zip(columns, tokens[1:]):
            if column != row:
                out[(row, column)] = cell
    return out


# ---------------------------------------------------------------------------------------------------------------
# Reading them


def read_gpus(world: World, tp: int | None) -> GpuFacts:
    facts = GpuFacts()
    done = world.run(["nvidia-smi", "-q"], SMI_TIMEOUT_S)
    if done.problem():
        facts.problem = f"no GPU visible: {done.problem()}"
        return facts
    top, blocks = parse_query(done.stdout)
    facts.driver = top.get("Driver Version") or top.get("KMD Version")
    facts.cuda = top.get("CUDA Version") or top.get("CUDA UMD Version")
    facts.gpus = [_gpu(i, q) for i, q in enumerate(blocks)]
    if not facts.gpus:
        facts.problem = "no GPU visible: nvidia-smi -q lists none"
        return facts
    chosen, problem = runtime_gpus.select_visible([g.uuid for g in facts.gpus],
                                                  runtime_gpus.visible_selection(world.environ))
    if chosen is None:
        facts.problem = problem
        return facts
    if not chosen:
        facts.problem = "no GPU visible: CUDA_VISIBLE_DEVICES hides every GPU"
        return facts
    facts.visible = chosen
    facts.chosen = chosen[:tp] if tp else chosen
    topo = world.run(["nvidia-smi", "topo", "-m"], SMI_TIMEOUT_S)
    if topo.problem():
        facts.notes.append(topo.problem())
    else:
        facts.topo = parse_topo(topo.stdout)
    if len(facts.gpus) > 1:
        p2p = world.run(["nvidia-smi", "topo", "-p2p", "r"], SMI_TIMEOUT_S)
        if p2p.problem():
            facts.notes.append(p2p.problem())
        else:
            facts.p2p = parse_p2p(p2p.stdout)
    return facts
