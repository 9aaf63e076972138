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
