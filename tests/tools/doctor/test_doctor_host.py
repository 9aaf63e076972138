"""doctor's host findings on constructed facts (tools/doctor/host.py): BAR1 against the GPU memory and the PCIe
links, at the edges each rule draws."""
from __future__ import annotations

import pytest

from sglang_pcie.tools.doctor import host
from sglang_pcie.tools.doctor.gpu_facts import Gpu, GpuFacts


def gpu(index: int, bar1: int | None = 131072, memory: int | None = 97887, **link) -> Gpu:
    return Gpu(index, "NVIDIA RTX PRO 6000", f"GPU-{index}", f"0000:{index + 1:02x}:00.0", bar1_mib=bar1,
               memory_mib=memory, **link)


def facts(*gpus: Gpu) -> GpuFacts:
    return GpuFacts(gpus=list(gpus), visible=[g.index for g in gpus], chosen=[g.index for g in gpus])


@pytest.mark.parametrize("gpus, severity", [
    ([gpu(0, bar1=97887), gpu(1, bar1=97887)], "ok"),  # exactly the memory: covers it
    ([gpu(0), gpu(1, bar1=256)], "warning"),  # one GPU of a TP group with a small BAR1
    ([gpu(0, bar1=256)], "info"),  # one GPU alone: no peer to map
    ([gpu(0, bar1=None), gpu(1, bar1=None)], "not-visible"),
])
def test_bar1_against_the_gpu_memory(gpus, severity):
    (found,) = host.bar1(facts(*gpus))
    assert found.severity == severity, found
    if severity == "warning":
        assert found.what.startswith("BAR1 of GPU 1 (0000:02:00.0) is 256 MiB, smaller than its 97887 MiB")


class NoSysfs:
    def read(self, path):
        from sglang_pcie.tools.doctor.world import NotVisible

        raise NotVisible(path)


def test_a_link_one_generation_or_one_width_step_low_is_named():
    slow = gpu(0, gen_now=4, gen_max=5, width_now=16, width_max=16)
    narrow = gpu(1, gen_now=5, gen_max=5, width_now=8, width_max=16)
    found = {f.id: f for f in host.links(NoSysfs(), facts(slow, narrow), measured_under_load=False)}
    assert found["host.link-width"].what.startswith("GPU 1 (0000:02:00.0) negotiated PCIe x8 of its x16")
    assert "GPU 0 (0000:01:00.0) Gen4 (max Gen5)" in found["host.link-speed"].what
    assert "host.link" not in found
    full = host.links(NoSysfs(), facts(gpu(0, gen_now=5, gen_max=5, width_now=16, width_max=16)), False)
    assert [(f.id, f.severity) for f in full] == [("host.link", "ok")]


class FakeWorld:
    """Files, folders and commands given as dicts; anything else is not visible (no such file)."""

    def __init__(self, files=None, dirs=None, runs=None, denied=()):
        self.files, self.dirs, self.runs, self.denied = files or {}, dirs or {}, runs or {}, set(denied)

    def read(self, path, limit=None):
        from sglang_pcie.tools.doctor.world import NotVisible

        if path in self.denied:
            raise NotVisible(f"{path}: permission denied (needs root)")
        if path not in self.files:
            raise NotVisible(f"{path}: no such file")
        return self.files[path]

    def listdir(self, path):
        from sglang_pcie.tools.doctor.world import NotVisible

        if path in self.denied:
            raise NotVisible(f"{path}: permission denied (needs root)")
        if path not in self.dirs:
            raise NotVisible(f"{path}: no such file")
        return self.dirs[path]

    def run(self, argv, timeout, key=None, env=None):
        from sglang_pcie.tools.doctor.world import Completed

        return self.runs.get(argv[0], Completed(argv[0], None, "", missing=True))


def sysfs_link(index, now="32.0 GT/s PCIe", most="32.0 GT/s PCIe", width="16", width_max="16"):
    base = f"{host.PCI}/0000:{index + 1:02x}:00.0"
    return {f"{base}/current_link_speed": now, f"{base}/max_link_speed": most, f"{base}/current_link_width": width,
            f"{base}/max_link_width": width_max}


def test_lscpu_that_fails_says_nothing():
    from sglang_pcie.tools.doctor.world import Completed

    assert host.lscpu(FakeWorld(runs={"lscpu": Completed("lscpu", 1, "Socket(s): 2\n", "boom")})) == {}
    ok = FakeWorld(runs={"lscpu": Completed("lscpu", 0, "Socket(s):  2\nFlags:\nModel name: x: y\n")})
    assert host.lscpu(ok) == {"Socket(s)": "2", "Model name": "x: y"}


def test_links_are_read_from_sysfs_when_all_four_attributes_are_there():
    """sysfs says Gen4 x8 of Gen5 x16 while nvidia-smi said full speed: sysfs is read, and named."""
    g = gpu(0, gen_now=5, gen_max=5, width_now=16, width_max=16)
    world = FakeWorld(sysfs_link(0, now="16.0 GT/s PCIe", width="8"))
    found = {f.id: f for f in host.links(world, facts(g), measured_under_load=True)}
    assert found["host.link-width"].what.startswith("GPU 0 (0000:01:00.0) negotiated PCIe x8 of its x16")
    assert found["host.link-width"].source == "sysfs current_link_width / max_link_width"
    assert "p2p.link-under-load says if it stays low" in found["host.link-speed"].what
    unreadable = sysfs_link(0, now="16.0 GT/s PCIe", width="unknown")  # a width that is no number: nvidia-smi's
    found = host.links(FakeWorld(unreadable), facts(g), measured_under_load=False)
    assert [(f.id, f.what, f.source) for f in found] == [
        ("host.link", "PCIe links of the 1 GPU(s): Gen5 x16", "nvidia-smi -q link speed and width")]


def test_a_slot_of_an_older_generation_is_named():
    g = gpu(0, gen_now=4, gen_max=5, gen_host_max=4, width_now=16, width_max=16)
    found = {f.id: f for f in host.links(NoSysfs(), facts(g), measured_under_load=False)}
    assert found["host.link-slot"].what.startswith("GPU 0 (0000:01:00.0) sits in a Gen4 slot (the GPU does Gen5)")
    assert "run without --no-p2p-test to read it under load" in found["host.link-speed"].what
    same = gpu(0, gen_now=5, gen_max=5, gen_host_max=5, width_now=16, width_max=16)
    assert [f.id for f in host.links(NoSysfs(), facts(same), False)] == ["host.link"]


IOMMU_UNITS = {"/sys/class/iommu": ["dmar0", "dmar1"]}


def iommu_world(types: dict, cmdline="BOOT_IMAGE=/vmlinuz ro"):
    files = {"/proc/cmdline": cmdline}
    files.update({f"{host.PCI}/0000:{i + 1:02x}:00.0/iommu_group/type": t for i, t in types.items()})
    return FakeWorld(files, dict(IOMMU_UNITS))


@pytest.mark.parametrize("world, gpus, severity, starts", [
    (FakeWorld(denied={"/sys/class/iommu"}), 2, "not-visible", "IOMMU state not visible"),
    (FakeWorld(), 2, "ok", "no IOMMU active in this kernel"),  # no /sys/class/iommu at all
    (FakeWorld(dirs={"/sys/class/iommu": []}), 2, "ok", "no IOMMU active in this kernel"),
    (iommu_world({0: "DMA", 1: "identity"}), 2, "warning", "the IOMMU translates the GPUs' DMA"),
    (iommu_world({0: "DMA-FQ"}), 1, "info", "the IOMMU translates the GPUs' DMA"),  # one GPU: no peer traffic
    (iommu_world({0: "identity", 1: "identity"}), 2, "ok", "IOMMU on, pass-through for the GPUs"),
    (iommu_world({0: "identity"}, "ro iommu=pt"), 2, "ok", "IOMMU on, pass-through per the kernel command line"),
    (iommu_world({}, "ro iommu.passthrough=1"), 2, "ok", "IOMMU on, pass-through per the kernel command line"),
    (iommu_world({0: "identity"}), 2, "warning", "IOMMU active (dmar0, dmar1); whether it translates"),
    (iommu_world({}), 1, "info", "IOMMU active (dmar0, dmar1); whether it translates"),
])
def test_the_iommu_rule(world, gpus, severity, starts):
    (found,) = host.iommu(world, facts(*(gpu(i) for i in range(gpus))), None)
    assert (found.severity, found.what.startswith(starts)) == (severity, True), found.what


LSPCI = """0000:00:01.1 PCI bridge: AMD Device 14ab
\tBus: primary=00, secondary=01, subordinate=03, sec-latency=0
\tCapabilities: [2a0 v1] Access Control Services
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir{redir} CmpltRedir{redir} UpstreamFwd- EgressCtrl- DirectTrans-
0000:01:00.0 VGA compatible controller: NVIDIA Corporation Device 2bb1
0000:03:00.0 VGA compatible controller: NVIDIA Corporation Device 2bb1
0000:40:01.1 PCI bridge: AMD Device 14ab
\tBus: primary=40, secondary=41, subordinate=41, sec-latency=0
"""


def test_lspci_bridges_and_their_acs_flags_are_parsed():
    devices = host.parse_lspci(LSPCI.format(redir="+"))
    assert devices["0000:00:01.1"]["bus"] == (1, 3) and devices["0000:40:01.1"]["bus"] == (0x41, 0x41)
    assert devices["0000:00:01.1"]["acs"]["ReqRedir"] is True and devices["0000:00:01.1"]["acs"]["TransBlk"] is False
    assert host.upstream_bridges(devices, "0000:03:00.0") == ["0000:00:01.1"]
    assert host.upstream_bridges(devices, "0000:04:00.0") == []


@pytest.mark.parametrize("text, severity, starts", [
    (LSPCI.format(redir="+"), "warning", "ACS redirect on 1 bridge(s): 0000:00:01.1 (ReqRedir+ CmpltRedir+) above"
                                         " GPU 0 (0000:01:00.0), GPU 1 (0000:03:00.0)"),
    (LSPCI.format(redir="-"), "ok", "no ACS redirect on the 1 bridge(s) above the GPUs"),
    ("0000:01:00.0 VGA compatible controller: NVIDIA\n", "info", "no PCIe bridge above the GPUs in lspci"),
    (LSPCI.split("\tCapabilities")[0] + "\tCapabilities: <access denied>\n", "not-visible",
     "ACS of 1 bridge(s) above the GPUs not visible"),
])
def test_the_acs_rule(text, severity, starts):
    from sglang_pcie.tools.doctor.world import Completed

    import dataclasses

    two = facts(gpu(0), dataclasses.replace(gpu(1), bus_id="0000:03:00.0"))
    (found,) = host.acs(FakeWorld(runs={"lspci": Completed("lspci", 0, text)}), two)
    assert (found.severity, found.what.startswith(starts)) == (severity, True), found.what
    assert host.acs(FakeWorld(runs={"lspci": Completed("lspci", 0, text)}), facts(gpu(0))) == []  # one GPU
    (missing,) = host.acs(FakeWorld(), two)
    assert missing.severity == "not-visible" and missing.what.startswith("ACS not visible: `lspci` not available")


def numa_world(nodes: dict, packages: dict | None = None):
    files = {f"{host.PCI}/0000:{i + 1:02x}:00.0/numa_node": str(n) for i, n in nodes.items()}
    for node, package in (packages or {}).items():
        files[f"/sys/devices/system/node/node{node}/cpulist"] = f"{node * 32}-{node * 32 + 31}"
        files[f"/sys/devices/system/cpu/cpu{node * 32}/topology/physical_package_id"] = f"{package}\n"
    return FakeWorld(files)


@pytest.mark.parametrize("nodes, packages, cpu, severity, starts", [
    ({0: 0, 1: 0}, {0: 0}, {}, "ok", "all 2 GPU(s) on socket 0 (NUMA node 0)"),
    ({0: 0, 1: 1}, {0: 0, 1: 1}, {}, "warning", "a TP group over these 2 GPUs spans 2 CPU sockets"),
    ({0: 0, 1: 1}, {0: 0, 1: 0}, {}, "ok", "all 2 GPU(s) on socket 0 (NUMA node 0, NUMA node 1)"),
    ({0: 0, 1: 1}, None, {}, "warning", "a TP group over these 2 GPUs spans 2 NUMA nodes (their sockets not"),
    ({0: 0, 1: 1}, None, {"Socket(s)": "1"}, "ok", "all 2 GPU(s) on socket 0"),
    ({0: -1, 1: 0}, None, {"Socket(s)": "1"}, "ok", "one CPU socket (lscpu): every GPU hangs off it"),
    ({0: -1, 1: 0}, None, {"Socket(s)": "2"}, "not-visible", "NUMA node of GPU 0 not reported"),
])
def test_the_numa_rule(nodes, packages, cpu, severity, starts):
    (found,) = host.numa(numa_world(nodes, packages), facts(gpu(0), gpu(1)), cpu)
    assert (found.severity, found.what.startswith(starts)) == (severity, True), found.what


def test_a_virtual_machine_is_said_once_and_a_bare_machine_not_at_all():
    assert host.machine(None) == []
    (vm,) = host.machine("KVM")
    assert vm.severity == "info" and vm.what.startswith("a virtual machine (KVM)")


def test_bus_numbers_are_hexadecimal_and_a_bridge_without_acs_is_no_redirect():
    from sglang_pcie.tools.doctor.world import Completed
    import dataclasses

    devices = host.parse_lspci(LSPCI.format(redir="+"))
    assert host.upstream_bridges(devices, "0000:41:00.0") == ["0000:40:01.1"]  # 0x41, not 41
    assert devices["0000:40:01.1"]["acs"] is None and devices["0000:40:01.1"]["denied"] is False
    far = facts(dataclasses.replace(gpu(0), bus_id="0000:41:00.0"), dataclasses.replace(gpu(1), bus_id="0000:41:00.1"))
    (found,) = host.acs(FakeWorld(runs={"lspci": Completed("lspci", 0, LSPCI.format(redir="+"))}), far)
    assert (found.severity, found.what) == ("ok", "no ACS redirect on the 1 bridge(s) above the GPUs")


def test_a_gpu_without_an_iommu_group_type_is_left_out_of_the_types_named():
    (found,) = host.iommu(iommu_world({0: "DMA"}), facts(gpu(0), gpu(1)), None)
    assert "(iommu group type DMA for GPU 0)" in found.what


def test_the_numa_node_comes_from_nvidia_smi_topo_first():
    from sglang_pcie.tools.doctor.gpu_facts import Topo

    split = facts(gpu(0), gpu(1))
    split.topo = Topo(numa_affinity={"GPU0": "0", "GPU1": "1"})
    (found,) = host.numa(numa_world({0: 0, 1: 0}), split, {})  # sysfs says node 0 for both; topo -m is read first
    assert found.what.startswith("a TP group over these 2 GPUs spans 2 NUMA nodes")


def test_the_hypervisor_is_lscpus_vendor_else_cpuinfos_flag():
    assert host.hypervisor(FakeWorld(), {"Hypervisor vendor": "KVM"}) == "KVM"
    assert host.hypervisor(FakeWorld({"/proc/cpuinfo": "flags : fpu hypervisor sse"}), {}) == "hypervisor"
    assert host.hypervisor(FakeWorld({"/proc/cpuinfo": "flags : fpu sse"}), {}) is None
    assert host.hypervisor(FakeWorld(), {}) is None


@pytest.mark.parametrize("torch_cuda, driver_cuda, fails", [("13.0", "12.8", True), ("12.9", "12.8", False),
                                                            ("12.8", "13.0", False), (None, "12.8", False)])
def test_torch_built_for_a_newer_cuda_major_than_the_driver_fails(monkeypatch, torch_cuda, driver_cuda, fails):
    from sglang_pcie.runtime import allreduce

    monkeypatch.setattr(allreduce, "flashinfer_install", lambda: allreduce.FlashinferInstall(None, False, None))
    monkeypatch.setattr(allreduce, "sglang_install", lambda: allreduce.SglangInstall(None, None, False))
    gpus = facts(gpu(0))
    gpus.cuda = driver_cuda
    start = {"torch": "2.9.0", "cuda": torch_cuda, "nccl": "nvidia-nccl-cu12==2.27.5"}
    found = host.versions(gpus, start)
    assert found[0].what == (f"torch 2.9.0 (CUDA {torch_cuda or 'not visible'}), NCCL nvidia-nccl-cu12==2.27.5, "
                             "FlashInfer not installed, SGLang not installed")
    assert [f.id for f in found[1:]] == (["host.cuda"] if fails else [])
    if fails:
        assert found[1].severity == "failure" and found[1].what.startswith(
            f"torch is built for CUDA {torch_cuda}, the driver supports up to CUDA {driver_cuda}")


def test_torchs_cuda_is_read_from_its_dist_info_without_a_copy_check(monkeypatch):
    monkeypatch.setattr(host.tuned_file, "installed_distributions",
                        lambda prefix: [("torch", "2.9.0+cu128", "/x"), ("torch", "2.8.0+cu126", "/y")])
    assert host._torch_cuda(None) == ("2.9.0+cu128", "12.8", "torch dist-info")
    assert host._torch_cuda({"torch": None}) == ("2.9.0+cu128", "12.8", "torch dist-info")
    monkeypatch.setattr(host.tuned_file, "installed_distributions", lambda prefix: [("torch-foo", "1.0", "/x")])
    assert host._torch_cuda(None) == (None, None, "no torch in this Python")


def test_lspci_lines_before_the_first_device_are_skipped():
    assert host.parse_lspci("pcilib: sysfs_read_vpd: read failed\n\tBus: primary=00, secondary=01, subordinate=03\n"
                            + LSPCI.format(redir="-"))["0000:00:01.1"]["bus"] == (1, 3)
