"""Writes the hand-made host-facts fixtures: PCIe cases the lent machines cannot show. Each is a folder in the layout
``sglang-pcie doctor --facts DIR`` reads (``sys/``, ``proc/``, ``commands.json`` + ``commands/``), with the command
outputs written in the formats the real tools print (modelled on the recorded ``h200-1gpu/`` outputs and on outputs
quoted in NVIDIA/nccl #2079, local-inference-lab/rtx6kpro #15 and #25, noonghunna/club-3090 #922). The copy check's
output is what ``p2p_child.py`` prints, event by event.

Run from the checkout root to regenerate: ``python tests/support/data/host-facts/make_handmade.py`` (it rewrites
the four hand-made folders, never h200-1gpu/). The folders are committed; tests read them, not this script.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT_ROOT = HERE  # where the folders are written (a test writes them elsewhere and compares)
PREFIX = "doctor-p2p "
SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}
LEGEND_M = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
LEGEND_P2P = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown
"""


class Box:
    def __init__(self, name: str, readme: str):
        self.root = OUT_ROOT / name
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "commands").mkdir(parents=True)
        self.commands = {}
        (self.root / "README.md").write_text(readme.strip() + "\n\nWritten by `make_handmade.py` (hand-made).\n")

    def file(self, path: str, text: str) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text if text.endswith("\n") else text + "\n")

    def folder(self, path: str) -> None:
        (self.root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (self.root / path.lstrip("/") / ".gitkeep").touch()

    def command(self, key: str, name: str, stdout: str, rc: int = 0, **extra) -> None:
        self.file(f"commands/{name}", stdout)
        self.commands[key] = dict(stdout=f"commands/{name}", rc=rc, **extra)

    def missing(self, key: str) -> None:
        self.commands[key] = {"missing": True}

    def save(self) -> None:
        self.file("commands.json", json.dumps(self.commands, indent=1, sort_keys=True))


def smi_q(gpus: list[dict], driver: str, cuda: str) -> str:
    def row(indent: int, key: str, value=None):
        pad = " " * indent
        return f"{pad}{key}" if value is None else f"{pad}{key:<{55 - indent}}: {value}"

    lines = ["", "==============NVSMI LOG==============", "", row(0, "Timestamp", "Mon Dec  7 10:00:00 2026"),
             row(0, "Driver Version", driver), row(0, "CUDA Version", cuda), "",
             row(0, "Attached GPUs", len(gpus))]
    for i, g in enumerate(gpus):
        domain, rest = g["bus"].split(":", 1)
        lines += [f"GPU 0000{domain.upper()}:{rest.upper()}", row(4, "Product Name", g["name"]),
                  row(4, "Product Architecture", g["arch"]), row(4, "Persistence Mode", "Enabled"),
                  row(4, "GPU UUID", g["uuid"]), row(4, "Minor Number", i), row(4, "PCI"),
                  row(8, "Bus", f"0x{rest.split(':')[0].upper()}"), row(8, "Device", "0x00"),
                  row(8, "Domain", f"0x{domain}"), row(8, "Bus Id", f"0000{domain.upper()}:{rest.upper()}"),
                  row(8, "GPU Link Info"), row(12, "PCIe Generation"), row(16, "Max", g["gen_max"]),
                  row(16, "Current", g["gen_now"]), row(16, "Device Current", g["gen_now"]),
                  row(16, "Device Max", g["gen_max"]), row(16, "Host Max", g.get("host_max", g["gen_max"])),
                  row(12, "Link Width"), row(16, "Max", f"{g['width_max']}x"), row(16, "Current", f"{g['width']}x"),
                  row(4, "FB Memory Usage"), row(8, "Total", f"{g['memory']} MiB"), row(8, "Used", "0 MiB"),
                  row(4, "BAR1 Memory Usage"), row(8, "Total", f"{g['bar1']} MiB"), row(8, "Used", "1 MiB"),
                  row(4, "Compute Mode", "Default")]
    return "\n".join(lines) + "\n"


def topo_m(gpu_cells: list[list[str]], affinity: list[tuple[str, str]], nic_cells=None, nic_names=()) -> str:
    n, nics = len(gpu_cells), len(nic_names)
    labels = [f"GPU{i}" for i in range(n)] + [f"NIC{i}" for i in range(nics)]
    out = ["\t\x1b[4m" + "\t".join(labels + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]
    for i, cells in enumerate(gpu_cells):
        row = [" X " if c == "X" else c for c in cells] + [c for c in (nic_cells or [[]] * n)[i]]
        out.append("\t".join([f"GPU{i}"] + row + [affinity[i][0], affinity[i][1], "", "N/A"]))
    for k in range(nics):
        row = [nic_cells[i][k] for i in range(n)] + [" X " if j == k else "SYS" for j in range(nics)]
        out.append("\t".join([f"NIC{k}"] + row + ["", "", ""]))
    text = "\n".join(out) + "\n" + LEGEND_M
    if nics:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{k}: {name}\n" for k, name in enumerate(nic_names))
    return text


def topo_p2p(status: list[list[str]]) -> str:
    n = len(status)
    out = ["\t\x1b[4m" + "\t".join(f"GPU{i}" for i in range(n)) + "\x1b[0m"]
    out += [f" GPU{i}\t" + "\t".join(row) for i, row in enumerate(status)]
    return "\n".join(out) + "\n" + LEGEND_P2P


def bridge(addr: str, secondary: str, acs: str | None, denied: bool = False, vendor="Advanced Micro Devices, Inc. "
           "[AMD] Device 14ab") -> str:
    lines = [f"{addr} PCI bridge: {vendor} (rev 01) (prog-if 00 [Normal decode])",
             "\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+",
             "\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- >SERR- <PERR- INTx-",
             "\tLatency: 0, Cache Line Size: 64 bytes", "\tInterrupt: pin ? routed to IRQ 45",
             f"\tBus: primary={addr.split(':')[1]}, secondary={secondary}, subordinate={secondary}, sec-latency=0",
             "\tMemory behind bridge: f6000000-f70fffff [size=17M] [32-bit]"]
    if denied:
        lines.append("\tCapabilities: <access denied>")
    else:
        lines += ["\tCapabilities: [58] Express (v2) Root Port (Slot+), MSI 00",
                  "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM L1, Exit Latency L1 <64us",
                  "\t\tLnkSta:\tSpeed 32GT/s, Width x16"]
        if acs is not None:
            lines += ["\tCapabilities: [2a0 v1] Access Control Services",
                      "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+",
                      f"\t\tACSCtl:\t{acs}"]
    lines.append("\tKernel driver in use: pcieport")
    return "\n".join(lines) + "\n"


def gpu_function(addr: str, denied: bool = False) -> str:
    lines = [f"{addr} VGA compatible controller: NVIDIA Corporation Device 2bb5 (rev a1) (prog-if 00 [VGA controller])",
             "\tSubsystem: NVIDIA Corporation Device 204e",
             "\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+"]
    lines.append("\tCapabilities: <access denied>" if denied else
                 "\tCapabilities: [68] Express (v2) Legacy Endpoint, MSI 00")
    lines.append("\tKernel driver in use: nvidia")
    return "\n".join(lines) + "\n"


def gpu_sysfs(box: Box, g: dict, iommu_type: str | None = None) -> None:
    base = f"sys/bus/pci/devices/{g['bus']}"
    box.file(f"{base}/class", "0x030000")
    box.file(f"{base}/numa_node", str(g["numa"]))
    box.file(f"{base}/current_link_speed", SPEED[g.get("sysfs_gen", g["gen_now"])])
    box.file(f"{base}/max_link_speed", SPEED[g["gen_max"]])
    box.file(f"{base}/current_link_width", str(g["width"]))
    box.file(f"{base}/max_link_width", str(g["width_max"]))
    if iommu_type:
        box.file(f"{base}/iommu_group/type", iommu_type)


def child_lines(events: list[dict]) -> str:
    return "".join(PREFIX + json.dumps(e) + "\n" for e in events)


def pair_events(n: int, caps: str, method_result, torch=("2.11.0+cu130", "13.0", "2.28.3")) -> list[dict]:
    """The events of a finished copy check over n GPUs; method_result(a, b, method) -> result dict."""
    events = [{"event": "start", "torch": torch[0], "cuda": torch[1], "nccl": torch[2], "capabilities": [caps] * n}]
    linked = set()
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            methods = {}
            for m in ("copy-engine", "sm-write", "sm-read"):
                events.append({"event": "begin", "pair": [a, b], "method": m})
                methods[m] = method_result(a, b, m)
            peer = "skipped" not in methods["sm-write"]
            events.append({"event": "result", "pair": [a, b], "peer": peer, "methods": methods})
            if not {a, b} <= linked:
                events.append({"event": "begin", "pair": [a, b], "method": "link under load"})
                events.append({"event": "link", "links": {str(d): {
                    "current_link_speed": "32.0 GT/s PCIe", "current_link_width": "16",
                    "max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16"} for d in {a, b}}})
                linked |= {a, b}
    events.append({"event": "done"})
    return events


def ok(gbps: float) -> dict:
    return {"bytes": 64 << 20, "mismatched_words": 0, "ok": True, "gbps": gbps}


def common_host(box: Box, sockets: int, cpus: str, hypervisor: str | None = None) -> None:
    lines = ["Architecture:                            x86_64", "CPU(s):                                  "
             + cpus, "Vendor ID:                               AuthenticAMD",
             "Model name:                              AMD EPYC 9565 72-Core Processor",
             f"Socket(s):                               {sockets}", f"NUMA node(s):                            {sockets}"]
    if hypervisor:
        lines.append(f"Hypervisor vendor:                       {hypervisor}")
    box.command("lscpu", "lscpu.txt", "\n".join(lines))


def uuid(box: int, i: int) -> str:
    return f"GPU-{box:02x}{i:06x}-5e1f-4c2a-9d3b-{box:04x}{i:08x}"


def gpus(box: int, buses: list[str], **fields) -> list[dict]:
    out = []
    for i, bus in enumerate(buses):
        g = dict(bus=bus, uuid=uuid(box, i), **{k: v[i] if isinstance(v, list) else v for k, v in fields.items()})
        out.append(g)
    return out


def infiniband(box: Box) -> None:
    """Two 400 Gb/s HCAs with their IPoIB interfaces, a 1 GbE NIC, docker's bridge, nvidia_peermem loaded."""
    for name, speed in (("eno1", "1000"), ("ibp65s0", "400000"), ("ibp193s0", "400000")):
        box.folder(f"sys/class/net/{name}/device")
        box.file(f"sys/class/net/{name}/speed", speed)
        box.file(f"sys/class/net/{name}/operstate", "up")
    box.folder("sys/class/net/lo")
    box.folder("sys/class/net/docker0")
    for hca in ("mlx5_0", "mlx5_1"):
        box.file(f"sys/class/infiniband/{hca}/ports/1/state", "4: ACTIVE")
        box.file(f"sys/class/infiniband/{hca}/ports/1/rate", "400 Gb/sec (4X NDR)")
        box.file(f"sys/class/infiniband/{hca}/ports/1/link_layer", "InfiniBand")
    box.folder("sys/module/nvidia_peermem")


def eight_gpus_two_sockets() -> None:
    box = Box("pcie-8gpu-2socket", """
# pcie-8gpu-2socket: 8 x RTX PRO 6000 Blackwell Server Edition over two CPU sockets (hand-made)

The shape of local-inference-lab/rtx6kpro #25 (2 x EPYC 9565, 2 NUMA nodes, `iommu=pt`): GPUs 0-3 hang off socket
0, GPUs 4-7 off socket 1 (`nvidia-smi topo -m`: NODE within a socket, SYS across). Healthy otherwise: IOMMU in
pass-through (iommu_group/type identity), no ACS redirect on the root ports (lspci as root), Gen5 x16 links, BAR1
128 GiB, P2P OK for every pair, and a copy check where every byte arrives (54 GB/s within a socket, 39 GB/s
across: the same-NUMA / cross-NUMA figures of the rtx6kpro PCIe bandwidth page). Network: two 400 Gb/s
InfiniBand HCAs (mlx5_0 behind GPU 0's switch, mlx5_1 behind GPU 4's), nvidia_peermem loaded.
""")
    buses = [f"0000:{b}:00.0" for b in ("01", "21", "41", "61", "81", "a1", "c1", "e1")]
    socket = [0, 0, 0, 0, 1, 1, 1, 1]
    g = gpus(1, buses, name="NVIDIA RTX PRO 6000 Blackwell Server Edition", arch="Blackwell", gen_now=5, gen_max=5,
             width=16, width_max=16, memory=97887, bar1=131072, numa=socket)
    box.command("nvidia-smi -q", "nvidia-smi-q.txt", smi_q(g, "595.71.05", "13.2"))
    cells = [["X" if i == j else "NODE" if socket[i] == socket[j] else "SYS" for j in range(8)] for i in range(8)]
    nic = [["PIX" if i == 0 else "NODE" if socket[i] == 0 else "SYS",
            "PIX" if i == 4 else "NODE" if socket[i] == 1 else "SYS"] for i in range(8)]
    affinity = [("0-71,144-215", "0") if s == 0 else ("72-143,216-287", "1") for s in socket]
    box.command("nvidia-smi topo -m", "nvidia-smi-topo-m.txt", topo_m(cells, affinity, nic, ("mlx5_0", "mlx5_1")))
    box.command("nvidia-smi topo -p2p r", "nvidia-smi-topo-p2p-r.txt",
                topo_p2p([["X" if i == j else "OK" for j in range(8)] for i in range(8)]))
    lspci = ""
    for i, bus in enumerate(buses):
        port = f"0000:{int(bus[5:7], 16) - 1:02x}:01.1"
        lspci += bridge(port, bus[5:7], "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- "
                                        "DirectTrans-") + "\n" + gpu_function(bus) + "\n"
    box.command("lspci -D -vvv", "lspci-D-vvv.txt", lspci)
    common_host(box, 2, "288")
    for gpu in g:
        gpu_sysfs(box, gpu, "identity")
    for unit in ("ivhd0", "ivhd1", "ivhd2", "ivhd3"):
        box.folder(f"sys/class/iommu/{unit}")
    box.file("proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.8.0-1045-nvidia root=UUID=2f1c0d4e ro amd_iommu=on iommu=pt "
                             "pcie_aspm=off processor.max_cstate=1")
    box.file("sys/devices/system/node/node0/cpulist", "0-71,144-215")
    box.file("sys/devices/system/node/node1/cpulist", "72-143,216-287")
    box.file("sys/devices/system/cpu/cpu0/topology/physical_package_id", "0")
    box.file("sys/devices/system/cpu/cpu72/topology/physical_package_id", "1")
    box.file("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  595.71.05  "
                                           "Release Build  (dvs-builder@U22-I3-B17-02-5)\nGCC version:  gcc 13.3.0")
    infiniband(box)

    def result(a, b, method):
        near = socket[a] == socket[b]
        return ok({"copy-engine": 54.1, "sm-write": 52.3, "sm-read": 49.6}[method] if near else
                  {"copy-engine": 39.2, "sm-write": 37.8, "sm-read": 35.1}[method])

    key = "p2p-copy-check GPU 0,1,2,3,4,5,6,7"
    box.command(key, "p2p-copy-check-8.txt", child_lines(pair_events(8, "12.0", result)), seconds=21.4)
    box.command("p2p-copy-check GPU 0,1,2,3", "p2p-copy-check-4.txt", child_lines(pair_events(4, "12.0", result)),
                seconds=9.8)
    box.save()


def four_gpus_iommu_acs() -> None:
    box = Box("pcie-4gpu-iommu-acs", """
# pcie-4gpu-iommu-acs: 4 x RTX PRO 6000 Blackwell Workstation Edition on a Threadripper, P2P hangs (hand-made)

The signature of local-inference-lab/rtx6kpro #15 and NVIDIA/nccl #2079: the AMD IOMMU in its default translated
mode (iommu_group/type DMA-FQ, no `iommu=pt` on the command line), ACS redirect on the root ports above GPUs 0
and 1 (`ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ ...`, as quoted in nccl #2079), NVML
reporting P2P OK for every pair (as in #15), and a copy check that never finishes its first copy (GPU 0 -> 1,
killed at 120 s). Also: GPU 3 negotiated x8 of x16 (downtrained), GPU 2 idles at 2.5 GT/s (its link speed at
rest, not a fault by itself). One socket. Network: one 10 GbE NIC, no RDMA.
""")
    buses = ["0000:41:00.0", "0000:61:00.0", "0000:c1:00.0", "0000:e1:00.0"]
    g = gpus(2, buses, name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition", arch="Blackwell",
             gen_now=[5, 5, 1, 5], gen_max=5, width=[16, 16, 16, 8], width_max=16, memory=97887, bar1=131072, numa=0)
    box.command("nvidia-smi -q", "nvidia-smi-q.txt", smi_q(g, "595.58.03", "13.2"))
    cells = [["X" if i == j else "NODE" for j in range(4)] for i in range(4)]
    box.command("nvidia-smi topo -m", "nvidia-smi-topo-m.txt", topo_m(cells, [("0-63", "0")] * 4))
    box.command("nvidia-smi topo -p2p r", "nvidia-smi-topo-p2p-r.txt",
                topo_p2p([["X" if i == j else "OK" for j in range(4)] for i in range(4)]))
    redirect = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
    clean = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
    lspci = ""
    for i, bus in enumerate(buses):
        port = f"0000:{int(bus[5:7], 16) - 1:02x}:01.1"
        lspci += bridge(port, bus[5:7], redirect if i < 2 else clean) + "\n" + gpu_function(bus) + "\n"
    box.command("lspci -D -vvv", "lspci-D-vvv.txt", lspci)
    common_host(box, 1, "64")
    for gpu in g:
        gpu_sysfs(box, gpu, "DMA-FQ")
    for unit in ("ivhd0", "ivhd1", "ivhd2", "ivhd3"):
        box.folder(f"sys/class/iommu/{unit}")
    box.file("proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.14.0-37-generic root=UUID=8d0e51a2 ro quiet splash")
    box.file("sys/devices/system/node/node0/cpulist", "0-63")
    box.file("sys/devices/system/cpu/cpu0/topology/physical_package_id", "0")
    box.file("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  595.58.03  "
                                           "Release Build  (dvs-builder@U22-I3-B17-02-5)\nGCC version:  gcc 14.2.0")
    box.folder("sys/class/net/enp5s0/device")
    box.file("sys/class/net/enp5s0/speed", "10000")
    box.file("sys/class/net/enp5s0/operstate", "up")
    box.folder("sys/class/net/lo")
    hung = [{"event": "start", "torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.3",
             "capabilities": ["12.0"] * 4}, {"event": "begin", "pair": [0, 1], "method": "copy-engine"}]
    box.command("p2p-copy-check GPU 0,1,2,3", "p2p-copy-check.txt", child_lines(hung), rc=-9, timed_out=True,
                seconds=120.0)
    box.save()


def geforce_patched_p2p() -> None:
    box = Box("geforce-2gpu-patched-p2p", """
# geforce-2gpu-patched-p2p: 2 x RTX 3090 on a P2P-patched open kernel module, SM stores corrupt (hand-made)

The class of noonghunna/club-3090 #922 (ASRock Z690 + i9-14900K, Gen4 x8 each, a `-p2p` patched 610.43.02
driver): NVML reports P2P OK between two GeForce cards; the copy engine moves every byte right in both
directions, but SM stores from GPU 0 into GPU 1's memory come back wrong (a quarter of the words), which is the
path a custom all-reduce writes through. SGLang's P2P cache (`~/.cache/sglang/gpu_p2p_access_cache_for_0,1.json`
under `home/user`) says peer access works. No IOMMU; Intel root ports without an ACS capability. The cards run at
x8 (bifurcated slots): `host.link-width` says so.
""")
    buses = ["0000:01:00.0", "0000:02:00.0"]
    g = gpus(3, buses, name="NVIDIA GeForce RTX 3090", arch="Ampere", gen_now=4, gen_max=4, width=8, width_max=16,
             memory=24576, bar1=32768, numa=0)
    box.command("nvidia-smi -q", "nvidia-smi-q.txt", smi_q(g, "610.43.02", "13.3"))
    box.command("nvidia-smi topo -m", "nvidia-smi-topo-m.txt",
                topo_m([["X", "PHB"], ["PHB", "X"]], [("0-31", "0")] * 2))
    box.command("nvidia-smi topo -p2p r", "nvidia-smi-topo-p2p-r.txt", topo_p2p([["X", "OK"], ["OK", "X"]]))
    intel = "Intel Corporation Alder Lake-S PCH PCI Express Root Port"
    lspci = (bridge("0000:00:01.0", "01", None, vendor=intel) + "\n" + gpu_function(buses[0]) + "\n"
             + bridge("0000:00:01.1", "02", None, vendor=intel) + "\n" + gpu_function(buses[1]) + "\n")
    box.command("lspci -D -vvv", "lspci-D-vvv.txt", lspci)
    common_host(box, 1, "32")
    for gpu in g:
        gpu_sysfs(box, gpu)
    box.folder("sys/class/iommu")
    box.file("proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.8.0-60-generic root=UUID=c41d9e07 ro quiet splash")
    box.file("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  610.43.02  "
                                           "Release Build  (juslex@z690)\nGCC version:  gcc 13.3.0")
    box.folder("sys/class/net/enp4s0/device")
    box.file("sys/class/net/enp4s0/speed", "2500")
    box.file("sys/class/net/enp4s0/operstate", "up")
    box.folder("sys/class/net/lo")
    box.file("home/user/.cache/sglang/gpu_p2p_access_cache_for_0,1.json",
             json.dumps({"0->0": True, "0->1": True, "1->0": True, "1->1": True}, indent=4))

    def result(a, b, method):
        if (a, b, method) == (0, 1, "sm-write"):
            return {"bytes": 64 << 20, "mismatched_words": 4194304, "ok": False, "first_bad_offset": 65536,
                    "gbps": 12.1}
        return ok({"copy-engine": 12.9, "sm-write": 12.1, "sm-read": 11.8}[method])

    events = pair_events(2, "8.6", result)
    for e in events:
        if e["event"] == "link":
            for link in e["links"].values():
                link.update(current_link_speed="16.0 GT/s PCIe", current_link_width="8",
                            max_link_speed="16.0 GT/s PCIe", max_link_width="16")
    box.command("p2p-copy-check GPU 0,1", "p2p-copy-check.txt", child_lines(events), seconds=7.2)
    box.save()


def p2p_blocked() -> None:
    box = Box("pcie-2gpu-p2p-blocked", """
# pcie-2gpu-p2p-blocked: 2 x RTX 4090 on a stock driver, no peer-to-peer, read without root (hand-made)

NVML reports CNS (chipset not supported) between the two GPUs, as NVIDIA's drivers do for GeForce cards over
PCIe: CUDA offers only copies staged through host memory, which the copy check moves correctly at 11.4 GB/s (its
SM paths are skipped). Resizable BAR is off (BAR1 256 MiB of 24 GiB). doctor ran as a normal user: `lspci -vvv`
shows `Capabilities: <access denied>` for the bridges. The IOMMU is on (`intel_iommu=on`) on a 5.4 kernel that has
no iommu_group/type file. Gen4 x16 links, one socket, one 1 GbE NIC.
""")
    buses = ["0000:17:00.0", "0000:65:00.0"]
    g = gpus(4, buses, name="NVIDIA GeForce RTX 4090", arch="Ada Lovelace", gen_now=4, gen_max=4, width=16,
             width_max=16, memory=24564, bar1=256, numa=0)
    box.command("nvidia-smi -q", "nvidia-smi-q.txt", smi_q(g, "570.153.02", "12.8"))
    box.command("nvidia-smi topo -m", "nvidia-smi-topo-m.txt",
                topo_m([["X", "NODE"], ["NODE", "X"]], [("0-47", "0")] * 2))
    box.command("nvidia-smi topo -p2p r", "nvidia-smi-topo-p2p-r.txt", topo_p2p([["X", "CNS"], ["CNS", "X"]]))
    intel = "Intel Corporation Device 352a"
    lspci = (bridge("0000:16:02.0", "17", None, denied=True, vendor=intel) + "\n" + gpu_function(buses[0], True)
             + "\n" + bridge("0000:64:02.0", "65", None, denied=True, vendor=intel) + "\n"
             + gpu_function(buses[1], True) + "\n")
    box.command("lspci -D -vvv", "lspci-D-vvv.txt", lspci)
    common_host(box, 1, "48")
    for gpu in g:
        gpu_sysfs(box, gpu)
    for unit in ("dmar0", "dmar1", "dmar2"):
        box.folder(f"sys/class/iommu/{unit}")
    box.file("proc/cmdline", "BOOT_IMAGE=/vmlinuz-5.4.0-216-generic root=UUID=77aa01b3 ro intel_iommu=on")
    box.file("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.153.02  "
                                           "Tue May 13 16:34:27 UTC 2025\nGCC version:  gcc 9.4.0")
    box.folder("sys/class/net/eno1/device")
    box.file("sys/class/net/eno1/speed", "1000")
    box.file("sys/class/net/eno1/operstate", "up")
    box.folder("sys/class/net/lo")

    def result(a, b, method):
        if method != "copy-engine":
            return {"skipped": "no peer access: CUDA offers only copies staged through the host"}
        return ok(11.4)

    events = pair_events(2, "8.9", result, torch=("2.8.0+cu128", "12.8", "2.27.3"))
    for e in events:
        if e["event"] == "link":
            for link in e["links"].values():
                link.update(current_link_speed="16.0 GT/s PCIe", max_link_speed="16.0 GT/s PCIe")
    box.command("p2p-copy-check GPU 0,1", "p2p-copy-check.txt", child_lines(events), seconds=6.1)
    box.save()


BOXES = (eight_gpus_two_sockets, four_gpus_iommu_acs, geforce_patched_p2p, p2p_blocked)

if __name__ == "__main__":
    for make in BOXES:
        make()
