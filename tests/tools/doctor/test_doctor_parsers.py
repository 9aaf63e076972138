"""doctor's readers on real text: the recorded H200's nvidia-smi output, and the formats nvidia-smi, lspci and sysfs
print on the PCIe boxes of the fixtures."""
from __future__ import annotations

from support import SUPPORT

from sglang_pcie.tools.doctor import gpu_facts, host
from sglang_pcie.tools.doctor.gpu_facts import link_gen, parse_p2p, parse_query, parse_topo, sysfs_bus_id

FACTS = SUPPORT / "data" / "host-facts"
H200 = FACTS / "h200-1gpu" / "commands"


def test_nvidia_smi_q_of_the_recorded_h200():
    top, blocks = parse_query((H200 / "nvidia-smi-q.txt").read_text())
    assert top["Driver Version"] == "580.159.04" and top["CUDA Version"] == "13.0"
    assert len(blocks) == 1
    gpu = gpu_facts._gpu(0, blocks[0])
    assert (gpu.name, gpu.uuid, gpu.bus_id, gpu.arch) == ("NVIDIA H200", "GPU-c951b351-0211-1740-d8e0-d20d727ded00",
                                                          "0000:00:06.0", "Hopper")
    assert (gpu.gen_now, gpu.gen_max, gpu.gen_host_max, gpu.width_now, gpu.width_max) == (5, 5, None, 16, 16)
    assert (gpu.bar1_mib, gpu.memory_mib) == (262144, 143771)
    # a value holding colons stays whole; a section's keys do not leak into the next section
    assert top["Timestamp"] == "Tue Dec  1 11:49:17 2026"
    assert blocks[0]["BAR1 Memory Usage/Total"] == "262144 MiB" and blocks[0]["FB Memory Usage/Total"] == "143771 MiB"


def test_topo_m_with_its_ansi_header_and_the_gpu_numa_id_column():
    topo = parse_topo((H200 / "nvidia-smi-topo-m.txt").read_text())
    assert topo.devices == ["GPU0"] and topo.cells == {("GPU0", "GPU0"): "X"}
    assert topo.cpu_affinity == {"GPU0": "0-15"} and topo.numa_affinity == {"GPU0": "0"}


def test_topo_m_with_nics_and_their_legend():
    topo = parse_topo((FACTS / "pcie-8gpu-2socket" / "commands" / "nvidia-smi-topo-m.txt").read_text())
    assert topo.devices == [f"GPU{i}" for i in range(8)] + ["NIC0", "NIC1"]
    assert topo.path("GPU0", "GPU3") == "NODE" and topo.path("GPU0", "GPU4") == "SYS"
    assert topo.path("GPU4", "NIC1") == "PIX" and topo.path("NIC0", "GPU0") == "PIX"
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo.numa_affinity["GPU7"] == "1" and topo.cpu_affinity["GPU7"] == "72-143,216-287"


def test_p2p_matrix_as_printed_with_spaces_and_with_tabs():
    spaces = ("        GPU0    GPU1    GPU2\n GPU0   X       OK      CNS\n GPU1   OK      X       CNS\n"
              " GPU2   CNS     CNS     X\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n")
    tabs = "\t\x1b[4mGPU0\tGPU1\x1b[0m\n GPU0\tX\tNS\n GPU1\tNS\tX\n\nLegend:\n  NS   = Not supported\n"
    assert parse_p2p(spaces) == {(0, 1): "OK", (0, 2): "CNS", (1, 0): "OK", (1, 2): "CNS", (2, 0): "CNS",
                                 (2, 1): "CNS"}
    assert parse_p2p(tabs) == {(0, 1): "NS", (1, 0): "NS"}
    assert parse_p2p("") == {}


def test_bus_ids_and_link_speeds():
    assert sysfs_bus_id("00000000:41:00.0") == "0000:41:00.0"
    assert sysfs_bus_id("00000001:C1:00.0") == "0001:c1:00.0"
    assert [link_gen(s) for s in ("2.5 GT/s PCIe", "8 GT/s", "16.0 GT/s PCIe", "32.0 GT/s PCIe", "Unknown", "")] == [
        1, 3, 4, 5, None, None]


def test_lspci_acs_control_bus_ranges_and_hidden_capabilities():
    devices = host.parse_lspci((FACTS / "pcie-4gpu-iommu-acs" / "commands" / "lspci-D-vvv.txt").read_text())
    port = devices["0000:40:01.1"]
    assert port["bus"] == (0x41, 0x41) and port["acs"]["ReqRedir"] and not port["acs"]["EgressCtrl"]
    assert devices["0000:c0:01.1"]["acs"]["ReqRedir"] is False
    assert host.upstream_bridges(devices, "0000:41:00.0") == ["0000:40:01.1"]
    assert host.upstream_bridges(devices, "0001:41:00.0") == []  # another PCI domain
    hidden = host.parse_lspci((FACTS / "pcie-2gpu-p2p-blocked" / "commands" / "lspci-D-vvv.txt").read_text())
    assert hidden["0000:16:02.0"] == {"bus": (0x17, 0x17), "acs": None, "denied": True}
    no_acs = host.parse_lspci((FACTS / "geforce-2gpu-patched-p2p" / "commands" / "lspci-D-vvv.txt").read_text())
    assert no_acs["0000:00:01.0"]["acs"] is None and not no_acs["0000:00:01.0"]["denied"]
