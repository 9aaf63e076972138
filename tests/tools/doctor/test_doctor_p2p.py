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


def events(*lines) -> "p2p.ChildRun":
    import json as _json

    from sglang_pcie.tools.doctor.world import Completed

    text = "\n".join(line if isinstance(line, str) else p2p_child.PREFIX + _json.dumps(line) for line in lines)
    return p2p.parse(Completed("p2p", 0, text))


def speed(gen):
    return {"current_link_speed": {3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}[gen],
            "current_link_width": "16"}


@pytest.mark.parametrize("order, kept", [((4, 5), 5), ((5, 4), 5), ((4, 4), 4), ((3, None), 3)])
def test_the_childs_events_keep_each_gpus_fastest_link_under_load(order, kept):
    first, second = order
    readings = [{"event": "link", "links": {"0": speed(first)}}]
    readings.append({"event": "link", "links": {"0": {"current_link_speed": "unknown"} if second is None
                                                else speed(second)}})
    run = events("some other output", "0123456789 " + '{"event": "done"}', p2p_child.PREFIX + "{not json",
                 *readings)
    assert not run.done  # a line without the prefix is not the child's, whatever it holds
    assert run.links[0]["current_link_speed"] == speed(kept)["current_link_speed"]


def test_the_childs_events_say_where_it_stopped():
    begin = {"event": "begin", "pair": [0, 1], "method": "sm-write"}
    result = {"event": "result", "pair": [0, 1], "peer": True, "methods": {}}
    hung = events({"event": "start", "torch": "2.9"}, begin)
    assert hung.begun == begin and hung.start["torch"] == "2.9" and not hung.done
    finished = events(begin, result, {"event": "done"})
    assert finished.begun is None and finished.done and finished.results == {(0, 1): result}
    failed = events(begin, {"event": "error", "kind": "cuda", "message": "boom"})
    assert failed.error["message"] == "boom" and failed.begun == begin and not failed.done


def nvml_facts(n: int, p2p_codes: dict | None) -> GpuFacts:
    found = facts(*(gpu(i, 5) for i in range(n)))
    found.p2p = p2p_codes
    return found


def test_nvmls_p2p_status_not_read_is_not_visible_and_one_gpu_says_nothing():
    (found,) = p2p.nvml_findings(nvml_facts(2, None))
    assert found.severity == "not-visible" and found.what == "NVML's peer-to-peer status not visible: not read"
    assert p2p.nvml_findings(nvml_facts(1, None)) == []


@pytest.mark.parametrize("n, ok, shown_more", [(4, 0, ""), (5, 2, ""), (5, 1, " and 1 more"),
                                                 (5, 0, " and 2 more")])
def test_nvml_blocked_pairs_are_shown_eight_at_most(n, ok, shown_more):
    """4 GPUs: 6 pairs, all shown; 5 GPUs with 2 pairs OK: 8 blocked, all shown; 10 pairs: 8 shown and '2 more'."""
    codes = {(0, b): "OK" for b in range(1, ok + 1)}  # the rest not reported: each is "U"
    (found,) = p2p.nvml_findings(nvml_facts(n, codes))
    pairs = n * (n - 1) // 2 - ok
    assert found.severity == "warning" and found.what.startswith(f"no peer-to-peer for {pairs} pair(s): GPU ")
    assert found.what.count(" U (unknown)") == min(8, pairs)
    assert found.what.split(": their all-reduce")[0].endswith("(unknown)" + shown_more)
    ok = {(a, b): "OK" for a in range(n) for b in range(n) if a < b}
    assert p2p.nvml_findings(nvml_facts(n, ok))[0].severity == "ok"


@pytest.mark.parametrize("gen, gbps", [(1, 4.0), (2, 8.0), (3, 15.76), (4, 31.5), (5, 63.0), (6, 121.0)])
def test_what_a_x16_link_carries_per_direction(gen, gbps):
    a, b = gpu(0, gen), gpu(1, gen)
    expected, name = p2p.expected_gbps(facts(a, b), a, b)
    assert expected == pytest.approx(gbps, rel=0.001) and name == f"Gen{gen} x16"


def test_an_nvlink_pair_or_an_unknown_link_has_no_expected_bandwidth():
    from sglang_pcie.tools.doctor.gpu_facts import Topo

    a, b = gpu(0, 5), gpu(1, 5)
    linked = facts(a, b)
    linked.topo = Topo(cells={("GPU0", "GPU1"): "NV18"})
    assert p2p.expected_gbps(linked, a, b) == (None, "NV18")
    unknown = Gpu(1, "x", "GPU-1", "0000:02:00.0")  # no generation, no width
    assert p2p.expected_gbps(facts(a, unknown), a, unknown) == (None, "link unknown")
    one_width = Gpu(1, "x", "GPU-1", "0000:02:00.0", gen_max=5)
    assert p2p.expected_gbps(facts(a, one_width), a, one_width) == (None, "link unknown")


def copy_result(gbps, peer=True, ok=True):
    return {"peer": peer, "methods": {"copy-engine": {"gbps": gbps, "ok": ok, "bytes": 64, "mismatched_words": 0}}}


@pytest.mark.parametrize("gbps, peer, pair, slow", [
    (p2p.LANE_GBPS[5] * 16 / 2, True, (0, 1), False),  # exactly half of Gen5 x16's 63.0: not under half
    (31.4, True, (0, 1), True),
    (5.0, False, (0, 1), False),  # no peer access: copied through the host, not a P2P figure
    (5.0, True, (0, 0), False),  # within one GPU
    (None, True, (0, 1), False),  # no figure (the copy engine path did not time)
])
def test_a_pair_is_slow_under_half_of_what_its_link_carries(gbps, peer, pair, slow):
    two = facts(gpu(0, 5), gpu(1, 5))
    result = copy_result(gbps, peer)
    if gbps is None:
        del result["methods"]["copy-engine"]["gbps"]
    found = p2p._slow(two, p2p.ChildRun(results={pair: result}, done=True))
    assert bool(found) == slow
    if slow:
        assert found[0].what.startswith("1 pair(s) copy at under half of what their link carries: GPU 0 -> GPU 1 "
                                        "31.4 GB/s (Gen5 x16 carries 63.0; path ?)")


def test_the_summary_of_one_gpu_says_it_tested_itself_and_of_pairs_counts_them():
    one = p2p._summary(facts(gpu(0, 5)), p2p.ChildRun(results={(0, 0): copy_result(20.0)}, done=True))
    assert one.severity == "info" and one.what.startswith("one GPU, no peer pairs; the check ran within GPU 0")
    run = p2p.ChildRun(results={(0, 1): copy_result(30.0), (1, 0): copy_result(40.0, peer=False),
                                (0, 2): copy_result(35.0)}, done=True)
    two = p2p._summary(facts(gpu(0, 5), gpu(1, 5), gpu(2, 5)), run)
    assert two.severity == "ok" and two.what == (
        "3 ordered pairs, 64 MiB 6 times by each path, every byte as sent (the copy engine 30-40 GB/s); 1 pair(s)"
        " without peer access, copied through the host")


def test_a_patched_driver_is_suspected_only_for_geforce_cards_reporting_pcie_p2p():
    from sglang_pcie.tools.doctor.gpu_facts import Topo

    def made(name, code="OK", path="PHB"):
        found = facts(*(Gpu(i, name, f"GPU-{i}", f"0000:{i + 1:02x}:00.0") for i in range(2)))
        found.p2p, found.topo = {(0, 1): code}, Topo(cells={("GPU0", "GPU1"): path})
        return found

    (found,) = p2p.patched_driver_finding(made("NVIDIA GeForce RTX 3090"))
    assert found.id == "p2p.patched-driver" and found.severity == "warning"
    assert p2p.patched_driver_finding(made("NVIDIA RTX PRO 6000")) == []
    assert p2p.patched_driver_finding(made("NVIDIA GeForce RTX 3090", code="CNS")) == []
    assert p2p.patched_driver_finding(made("NVIDIA GeForce RTX 3090", path="NV4")) == []


def test_the_expected_bandwidth_at_the_edges_of_what_is_known():
    a = gpu(0, 5)
    idle_width = Gpu(1, "x", "GPU-1", "0000:02:00.0", gen_max=5, width_now=None, width_max=8)  # width_max stands in
    assert p2p.expected_gbps(facts(a, idle_width), a, idle_width) == (p2p.LANE_GBPS[5] * 8, "Gen5 x8")
    assert p2p.expected_gbps(facts(idle_width, a), idle_width, a) == (p2p.LANE_GBPS[5] * 8, "Gen5 x8")
    future = gpu(1, 7)  # a generation the table does not know: the known slower end decides
    assert p2p.expected_gbps(facts(a, future), a, future) == (p2p.LANE_GBPS[5] * 16, "Gen5 x16")
    both = gpu(0, 7)
    assert p2p.expected_gbps(facts(both, future), both, future) == (None, "link unknown")
    no_gen = [Gpu(i, "x", f"GPU-{i}", f"0000:0{i + 1}:00.0", width_now=16, width_max=16) for i in range(2)]
    assert p2p.expected_gbps(facts(*no_gen), *no_gen) == (None, "link unknown")


def completed(rc=0, stderr="", timed_out=False, missing=False):
    from sglang_pcie.tools.doctor.world import Completed

    return Completed("p2p", rc, "", stderr, missing=missing, timed_out=timed_out)


BAD = {"peer": True, "methods": {"copy-engine": {"gbps": 40.0, "ok": True, "bytes": 64, "mismatched_words": 0},
                                 "sm-write": {"ok": False, "bytes": 64, "mismatched_words": 2,
                                              "first_bad_offset": 4}}}


def test_a_corrupt_pair_is_a_failure_before_anything_else_and_replaces_the_summary():
    two = facts(gpu(0, 5), gpu(1, 5))
    run = p2p.ChildRun(results={(0, 1): BAD, (1, 0): copy_result(40.0)}, done=True, completed=completed())
    found = p2p.copy_findings(two, run, 120)
    assert [f.id for f in found] == ["p2p.corrupt"]
    assert found[0].what.startswith("GPU 0 -> GPU 1: data came back wrong (SM stores into the peer: 2 of 16 words"
                                    " wrong (first at byte 4))")
    clean = p2p.ChildRun(results={(0, 1): copy_result(10.0)}, done=True, completed=completed(),
                         links={0: {"current_link_speed": "16.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe"}})
    assert [f.id for f in p2p.copy_findings(two, clean, 120)] == ["p2p.copy", "p2p.slow", "p2p.link-under-load"]


@pytest.mark.parametrize("run, expected", [
    (p2p.ChildRun(completed=completed(timed_out=True), begun={"pair": [0, 1], "method": "sm-read"}),
     ("p2p.hang", "failure", "the copy check did not finish in 120 s during GPU 0 -> GPU 1 (sm-read)")),
    (p2p.ChildRun(completed=completed(missing=True)), ("p2p.copy", "not-visible", "copy check not run: `p2p`")),
    (p2p.ChildRun(completed=completed(1), error={"kind": "no-cuda", "message": "no CUDA"}),
     ("p2p.copy", "not-visible", "copy check not run: no CUDA")),
    (p2p.ChildRun(completed=completed(1), error={"kind": "cuda", "message": "CUDA out of memory", "pair": [1, 0],
                                                 "method": "copy-engine"}),
     ("p2p.copy", "not-visible", "copy check stopped during GPU 1 -> GPU 0 (copy-engine): CUDA out of memory")),
    (p2p.ChildRun(completed=completed(1), error={"kind": "cuda", "message": "illegal address"}),
     ("p2p.error", "failure", "a CUDA error stopped the copy check: illegal address")),
    (p2p.ChildRun(completed=completed(-11, "line one\nSegmentation fault\n")),
     ("p2p.crash", "warning", "the copy check exited with -11 without a verdict: Segmentation fault")),
    (p2p.ChildRun(completed=completed(-9, "")),
     ("p2p.crash", "warning", "the copy check exited with -9 without a verdict")),
])
def test_a_copy_check_that_did_not_finish_says_how_and_where(run, expected):
    found = p2p.copy_findings(facts(gpu(0, 5), gpu(1, 5)), run, 120)
    assert len(found) == 1 and (found[0].id, found[0].severity) == expected[:2]
    assert found[0].what.startswith(expected[2]) and (expected[0] != "p2p.crash" or found[0].what == expected[2])


def test_a_corrupt_pair_is_kept_when_the_check_then_stops():
    run = p2p.ChildRun(results={(0, 1): BAD}, completed=completed(timed_out=True),
                       begun={"pair": [1, 0], "method": "copy-engine"})
    assert [f.id for f in p2p.copy_findings(facts(gpu(0, 5), gpu(1, 5)), run, 120)] == ["p2p.corrupt", "p2p.hang"]


def test_the_link_under_load_falls_back_to_the_gpus_own_maximum():
    run = p2p.ChildRun(links={0: {"current_link_speed": "16.0 GT/s PCIe", "current_link_width": "16"}})
    (found,) = p2p._links(facts(gpu(0, 5), gpu(1, 5)), run)
    assert "GPU 0 (0000:01:00.0) at Gen4 x16 (its maximum Gen5)" in found.what


class CacheWorld:
    def __init__(self, files, environ):
        self.files, self.environ = files, environ

    def read(self, path, limit=None):
        from sglang_pcie.tools.doctor.world import NotVisible

        if path not in self.files:
            raise NotVisible(path)
        return self.files[path]


CACHE = "/home/u/.cache/sglang/gpu_p2p_access_cache_for_0,1.json"


@pytest.mark.parametrize("cached, run, expected", [
    ({"0->1": True, "1->0": True}, p2p.ChildRun(results={(0, 1): BAD}, done=True), ("warning", "0->1")),
    ({"0->1": False, "1->0": True}, p2p.ChildRun(results={(0, 1): BAD}, done=True), None),  # not trusted there
    ({"0->1": True}, p2p.ChildRun(completed=completed(timed_out=True), begun={"pair": [0, 1]}), ("warning", "0->1")),
    ({"0->1": True}, p2p.ChildRun(completed=completed(1), begun={"pair": [0, 1]}), None),  # a crash is no hang
    ({"0->1": False, "0->0": False}, p2p.ChildRun(results={(0, 1): copy_result(30.0)}, done=True),
     ("info", "0->1")),
    ({"0->0": False}, p2p.ChildRun(results={(0, 1): copy_result(30.0)}, done=True), None),  # a GPU with itself
    ({"0->1": False}, p2p.ChildRun(results={(0, 1): copy_result(30.0)}), None),  # the check did not finish
    ({"0->1": False}, None, None),  # no check run
    ({"0->1": False}, p2p.ChildRun(results={(0, 1): BAD}, done=True), None),  # the check found it broken
])
def test_sglangs_cached_p2p_verdict_against_the_copy_check(cached, run, expected):
    import json as _json

    world = CacheWorld({CACHE: _json.dumps(cached)}, {"HOME": "/home/u"})
    found = p2p.sglang_cache_finding(world, facts(gpu(0, 5), gpu(1, 5)), run)
    if expected is None:
        assert found == []
    else:
        (finding,) = found
        assert finding.severity == expected[0] and f"for {expected[1]} " in finding.what and CACHE in finding.what


def test_sglangs_cache_file_follows_its_cache_dir_and_visible_devices():
    world = CacheWorld({"/c/gpu_p2p_access_cache_for_3,2.json": '{"2->3": true}'},
                       {"HOME": "/home/u", "SGLANG_CACHE_DIR": "/c", "CUDA_VISIBLE_DEVICES": "3,2"})
    run = p2p.ChildRun(results={(2, 3): BAD}, done=True)
    (found,) = p2p.sglang_cache_finding(world, facts(*(gpu(i, 5) for i in range(4))), run)
    assert found.source == "/c/gpu_p2p_access_cache_for_3,2.json"


@pytest.mark.parametrize("slow_pairs, more", [(8, ""), (9, " and 1 more")])
def test_slow_pairs_are_shown_eight_at_most(slow_pairs, more):
    four = facts(*(gpu(i, 5) for i in range(4)))
    ordered = [(a, b) for a in range(4) for b in range(4) if a != b]
    results = {pair: copy_result(10.0 if k < slow_pairs else 60.0) for k, pair in enumerate(ordered)}
    results[(0, 0)] = {"peer": True, "methods": {"copy-engine": {"ok": True}}}  # no figure: not judged
    (found,) = p2p._slow(four, p2p.ChildRun(results=results, done=True))
    assert found.what.startswith(f"{slow_pairs} pair(s) copy at under half")
    assert found.what.count(" GB/s (Gen5 x16 carries") == 8
    assert found.what.split(": every all-reduce")[0].endswith("path ?)" + more)
