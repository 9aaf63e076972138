"""The network a multi-node server would use: NICs and their link speed, RDMA devices, whether GPUDirect RDMA's
peer-memory module is loaded, what NCCL_SOCKET_IFNAME / NCCL_IB_HCA select, and each GPU's PCIe distance to its
nearest NIC. Read from sysfs (/sys/class/net, /sys/class/infiniband, /sys/module) and ``nvidia-smi topo -m``."""
from __future__ import annotations

from sglang_pcie.tools.doctor.findings import FAILURE, INFO, NOT_VISIBLE, OK, WARNING, Finding
from sglang_pcie.tools.doctor.gpu_facts import PATH_RANK, GpuFacts
from sglang_pcie.tools.doctor.world import NotVisible, World

NET, IB = "/sys/class/net", "/sys/class/infiniband"
PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")


def _attr(world: World, path: str) -> str | None:
    try:
        return world.read(path).strip()
    except NotVisible:
        return None


def nics(world: World) -> tuple[list[Finding], list[str]]:
    """(findings, every interface name): physical NICs (those with a device behind them) and their speed."""
    try:
        names = world.listdir(NET)
    except NotVisible as exc:
        return [Finding("net.nics", NOT_VISIBLE, f"network interfaces not visible: {exc}", source=NET)], []
    physical = [n for n in names if world.exists(f"{NET}/{n}/device")]
    if not physical:
        return [Finding("net.nics", INFO, f"no physical NIC seen ({', '.join(names) or 'none'} are virtual): a "
                                          "multi-node server has no network here", source=NET)], names
    shown = []
    for name in physical:
        state = _attr(world, f"{NET}/{name}/operstate") or "?"
        speed = _attr(world, f"{NET}/{name}/speed")  # Mb/s; -1 or unreadable when the link is down
        rate = f"{int(speed) / 1000:g} Gb/s" if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else "no speed"
        shown.append(f"{name} {state} {rate}")
    return [Finding("net.nics", INFO, f"NICs: {'; '.join(shown)}", source=f"{NET}/*/operstate, speed")], names


def rdma(world: World, weigh: str) -> tuple[list[Finding], list[str]]:
    try:
        devices = world.listdir(IB)
    except NotVisible as exc:
        if "no such file" not in str(exc):
            return [Finding("net.rdma", NOT_VISIBLE, f"RDMA devices not visible: {exc}", source=IB)], []
        devices = []
    if not devices:
        return [Finding("net.rdma", weigh, "no RDMA device (InfiniBand / RoCE): a multi-node server's NCCL traffic "
                                           "goes over TCP sockets, far slower than RDMA", source=IB)], []
    shown, down = [], []
    for device in devices:
        try:
            ports = world.listdir(f"{IB}/{device}/ports")
        except NotVisible:
            ports = []
        for port in ports:
            base = f"{IB}/{device}/ports/{port}"
            state = (_attr(world, f"{base}/state") or "?").split(":")[-1].strip()
            rate, layer = _attr(world, f"{base}/rate") or "?", _attr(world, f"{base}/link_layer") or "?"
            shown.append(f"{device}:{port} {state} {rate} {layer}")
            if state != "ACTIVE":
                down.append(f"{device}:{port} {state}")
    out = [Finding("net.rdma", INFO, f"RDMA: {'; '.join(shown)}", source=f"{IB}/*/ports/*")]
    if down:
        out.append(Finding("net.rdma-down", weigh, f"RDMA port(s) not active: {', '.join(down)}: NCCL skips them",
                           "check the cable and the subnet manager (ibstat)", f"{IB}/*/ports/*/state"))
    return out, devices


def peer_memory(world: World, rdma_devices: list[str], weigh: str) -> list[Finding]:
    if not rdma_devices:
        return []
    loaded = [m for m in PEER_MEMORY_MODULES if world.exists(f"/sys/module/{m}")]
    if loaded:
        return [Finding("net.gdr", OK, f"GPUDirect RDMA: {loaded[0]} loaded, the NICs can read and write GPU memory",
                        source="/sys/module")]
    return [Finding("net.gdr", weigh,
                    "GPUDirect RDMA's peer-memory module (nvidia_peermem / nv_peer_mem) is not loaded: NCCL stages "
                    "multi-node traffic through host memory unless it can use DMA-BUF (recent kernels and drivers)",
                    "sudo modprobe nvidia_peermem (ships with the NVIDIA driver)", "/sys/module")]


def _selected(spec: str, names: list[str], strip_port: bool = False) -> list[str]:
    """NCCL's selection syntax: comma-separated prefixes, '=' for exact names, a leading '^' to exclude."""
    exclude = spec.startswith("^")
    exact = spec.lstrip("^").startswith("=")
    wanted = [w.split(":")[0] if strip_port else w for w in spec.lstrip("^").lstrip("=").split(",") if w]

    def hit(name):
        return any(name == w if exact else name.startswith(w) for w in wanted)

    return [n for n in names if hit(n) != exclude]


def nccl_selection(world: World, interfaces: list[str], rdma_devices: list[str]) -> list[Finding]:
    env, out = world.environ, []
    ifname = env.get("NCCL_SOCKET_IFNAME")
    if ifname is not None:
        chosen = [n for n in _selected(ifname, interfaces) if n != "lo" or "lo" in ifname]
        if not chosen:
            out.append(Finding("net.nccl-socket", FAILURE,
                               f"NCCL_SOCKET_IFNAME={ifname} matches no interface here ({', '.join(interfaces)}): "
                               "NCCL finds no socket for its bootstrap and fails at init, on one node too",
                               "set it to an interface that exists (a prefix like eth, or =name), or unset it",
                               f"environment; {NET}"))
        else:
            out.append(Finding("net.nccl-socket", OK, f"NCCL_SOCKET_IFNAME={ifname} selects {', '.join(chosen)}",
                               source=f"environment; {NET}"))
    elif rdma_devices or len([n for n in interfaces if n != "lo"]) > 1:
        out.append(Finding("net.nccl-socket", INFO, "NCCL_SOCKET_IFNAME unset: NCCL picks the interface itself "
                                                    "(a docker or virtual bridge can win)",
                           "for multi-node, set NCCL_SOCKET_IFNAME to the interface on the nodes' fast network",
                           "environment"))
    hca = env.get("NCCL_IB_HCA")
    if hca is not None:
        chosen = _selected(hca, rdma_devices, strip_port=True)
        severity = OK if chosen else WARNING
        what = (f"NCCL_IB_HCA={hca} selects {', '.join(chosen)}" if chosen else
                f"NCCL_IB_HCA={hca} matches no RDMA device here ({', '.join(rdma_devices) or 'none'}): NCCL falls "
                "back to TCP sockets between nodes")
        out.append(Finding("net.nccl-ib", severity, what, "" if chosen else "name devices from /sys/class/infiniband",
                           f"environment; {IB}"))
    return out


def nic_distance(facts: GpuFacts, rdma_devices: list[str], weigh: str) -> list[Finding]:
    if not rdma_devices or not facts.used:
        return []
    topo = facts.topo
    nics = [d for d in (topo.devices if topo else []) if d.startswith("NIC")]
    if not nics:
        return [Finding("net.nic-distance", NOT_VISIBLE, "GPU-to-NIC distance not visible: nvidia-smi topo -m lists "
                                                         "no NIC", source="nvidia-smi topo -m")]
    far, shown = [], []
    for gpu in facts.used:
        cells = {nic: topo.path(f"GPU{gpu.index}", nic) or "?" for nic in nics}
        nearest = min(cells, key=lambda n: PATH_RANK.get(cells[n], 99))
        shown.append(f"GPU {gpu.index} -> {topo.nic_names.get(nearest, nearest)} {cells[nearest]}")
        if cells[nearest] in ("NODE", "SYS"):
            far.append(f"GPU {gpu.index} ({cells[nearest]})")
    if far:
        return [Finding("net.nic-distance", weigh,
                        f"no NIC behind the same PCIe switch or root port for {', '.join(far)}: its multi-node "
                        "traffic crosses the host bridges or the CPU interconnect, where GPUDirect RDMA is slow or "
                        f"not used ({'; '.join(shown)})",
                        "put a NIC on each GPU's PCIe switch or root complex, or use the GPUs nearest a NIC for TP",
                        "nvidia-smi topo -m")]
    return [Finding("net.nic-distance", OK, f"nearest NIC per GPU: {'; '.join(shown)}", source="nvidia-smi topo -m")]


def network(world: World, facts: GpuFacts, nodes: int) -> list[Finding]:
    """With one node (the default) what only a multi-node server would suffer is info; with --nodes 2 or more it
    is a warning. A socket selection that matches nothing fails NCCL's bootstrap on one node too."""
    weigh = WARNING if nodes > 1 else INFO
    found, interfaces = nics(world)
    rdma_found, devices = rdma(world, weigh)
    return (found + rdma_found + peer_memory(world, devices, weigh) + nccl_selection(world, interfaces, devices)
            + nic_distance(facts, devices, weigh))
