"""The copy check's verdicts on constructed facts (tools/doctor/p2p.py and the child's own comparison, p2p_child.py):
what a pair's link should carry, a link that stays one generation low under load, a pass that corrupts once."""
from __future__ import annotations

import pytest

from sglang_pcie.tools.doctor import p2p, p2p_child
from sglang_pcie.tools.doctor.gpu_facts import Gpu, GpuFacts


def gpu(index: int, gen_max: int, width: int = 16, host_max: int | None = None) -> Gpu:
    return Gpu(index, "NVIDIA RTX PRO 6000", f"GPU-{index}", f"0000:{index + 1:02x}:00.0", gen_now=gen_max,
               gen_max=gen_max, gen_host_max=host_max, width_now=width, width_max=width)


def facts(*gpus: Gpu) -> GpuFacts:
    return GpuFacts(gpus=list(gpus), visible=[g.index for g in gpus], chosen=[g.index for g in gpus])


def test_a_pair_whose_ends_differ_in_generation_is_held_to_the_slower_end():
    a, b = gpu(0, 5), gpu(1, 4)
    assert p2p.expected_gbps(facts(a, b), a, b) == (p2p.LANE_GBPS[4] * 16, "Gen4 x16")
    assert p2p.expected_gbps(facts(b, a), b, a) == (p2p.LANE_GBPS[4] * 16, "Gen4 x16")  # whichever end is which
    slot = gpu(2, 5, host_max=3)  # a Gen5 GPU in a Gen3 slot: the slot is the end that counts
    assert p2p.expected_gbps(facts(a, slot), a, slot) == (p2p.LANE_GBPS[3] * 16, "Gen3 x16")
    narrow = gpu(3, 5, width=8)
    assert p2p.expected_gbps(facts(a, narrow), a, narrow) == (p2p.LANE_GBPS[5] * 8, "Gen5 x8")


@pytest.mark.parametrize("now, warned", [("16.0 GT/s PCIe", True), ("32.0 GT/s PCIe", False)])
def test_a_link_one_generation_below_its_maximum_under_load_is_a_warning(now, warned):
    a, b = gpu(0, 5), gpu(1, 5)
    run = p2p.ChildRun(links={0: {"current_link_speed": now, "current_link_width": "16",
                                  "max_link_speed": "32.0 GT/s PCIe"}})
    found = p2p._links(facts(a, b), run)
    assert bool(found) == warned
    if warned:
        assert found[0].id == "p2p.link-under-load"
        assert "GPU 0 (0000:01:00.0) at Gen4 x16 (its maximum Gen5)" in found[0].what


@pytest.mark.parametrize("passes", [("bad", "good"), ("good", "bad")], ids=["corrupt-then-clean", "clean-then-corrupt"])
def test_a_copy_that_comes_back_wrong_once_is_wrong(monkeypatch, passes):
    """The first pass is compared, then the timed repeats are: a wrong first pass is not washed out by clean ones."""
    verdicts = {"bad": {"bytes": 64, "mismatched_words": 3, "ok": False, "first_bad_offset": 8},
                "good": {"bytes": 64, "mismatched_words": 0, "ok": True}}
    order = iter(dict(verdicts[p]) for p in passes)
    clock = iter([0.0, 1.0])

    class Tensor:
        def copy_(self, src):
            pass

    class Torch:
        int32 = "int32"

        def full(self, *args, **kwargs):
            return Tensor()

    monkeypatch.setattr(p2p_child, "pattern", lambda torch, words, salt, device: Tensor())
    monkeypatch.setattr(p2p_child, "synchronize", lambda torch, *devices: None)
    monkeypatch.setattr(p2p_child, "compare", lambda torch, dst, expected: next(order))
    monkeypatch.setattr(p2p_child.time, "perf_counter", lambda: next(clock))
    result = p2p_child.run_method(Torch(), None, "copy-engine", 0, 1, words=16, reps=5, salt=1)
    assert result["ok"] is False and result["mismatched_words"] == 3 and result["first_bad_offset"] == 8
    assert result["gbps"] == round(16 * 4 * 5 / 1.0 / 1e9, 2)
