"""What a tune-spec server is sent: the levels parsed, the edge levels, the prompts (seeded per level, the same in
every server), and the order in which a measured and the warm-up server drive them (bench's run_batch and
run_stream replaced by recorders: no server, no clock)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from sglang_pcie.tools.bench.plan import Workload
from sglang_pcie.tools.tune_spec import levels
from sglang_pcie.tools.tune_spec.levels import edge_levels, parse_levels, prompts, requests_at


def test_levels_are_parsed_sorted_and_unique():
    assert parse_levels("64, 8,1,8") == (1, 8, 64)
    assert parse_levels("4096") == (4096,)


@pytest.mark.parametrize("text, fault", [
    ("0,8", "each concurrency must be 1 to 4096"), ("1,4097", "each concurrency must be 1 to 4096"),
    ("", "give concurrencies as positive integers"), ("1,x", "give concurrencies as positive integers"),
    ("1,,8", "give concurrencies as positive integers"), ("-1", "give concurrencies as positive integers"),
])
def test_a_level_that_is_no_concurrency_is_named(text, fault):
    with pytest.raises(ValueError) as caught:
        parse_levels(text)
    assert str(caught.value).startswith(f"{text!r}: {fault}")


def test_without_graphs_the_edge_is_just_below_each_measured_level_above_another_unless_measured():
    assert edge_levels((1, 8, 32, 64)) == (7, 31, 63)
    assert edge_levels((1, 8, 32, 64), []) == (7, 31, 63)  # decode graphs off: no padding
    assert edge_levels((1, 2, 3)) == ()  # 2 - 1 is 1, below 2; 3 - 1 is measured
    assert edge_levels((1, 3)) == (2,)
    assert edge_levels((4, 5, 16)) == (15,)  # below the lowest level the lowest bucket serves: no switch there
    assert edge_levels((1,)) == ()
    assert edge_levels((2, 8)) == (7,)  # not 1: c=1 is one streamed request, no batch


def test_with_graphs_the_edge_is_the_smallest_batch_sglang_pads_into_the_bucket():
    """SGLang serves a batch with the bucket of its padded size (0.5.16 adaptive_spec_params._route): with graphs at
    1 and 32 every batch from 2 runs as 32, so bucket 32 starts at batch 2 and batch 31 is no edge at all."""
    assert edge_levels((1, 32), [1, 32]) == (2,)
    # a measured level that itself pads past the next key is no edge: the first batch above it is (33, not 32)
    assert edge_levels((1, 8, 32, 64), [1, 2, 4, 16, 64]) == (5, 17, 33)
    default = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]  # SGLang's usual small sizes
    assert edge_levels((1, 8, 32, 64), default) == (5, 25, 57)  # 5 pads to 8, 25 to 32, 57 to 64
    assert edge_levels((1, 8, 32), [1, 2, 4, 8, 16]) == (5, 31)  # above every graph a batch runs unpadded
    assert [levels.padded(b, [1, 32]) for b in (1, 2, 32, 33)] == [1, 32, 32, 33]


SERVER_ARGS_0_5_16 = ("server_args=ServerArgs(model_path='/m', cuda_graph_config=CudaGraphConfig(decode=PhaseConfig("
                      "backend='full', max_bs=32, bs=[1, 32], tc_compiler='eager', full_prefill_max_req=None), "
                      "prefill=PhaseConfig(backend='disabled', max_bs=8192, bs=[4, 8, 12], tc_compiler='eager')), "
                      "cuda_graph_bs_decode=[1, 32], disable_cuda_graph=False)")  # as 0.5.16 logs it (shortened)


def test_the_graph_sizes_are_read_from_the_server_args_sglang_logs():
    assert levels.graph_batch_sizes(SERVER_ARGS_0_5_16) == [1, 32]
    assert levels.graph_batch_sizes(SERVER_ARGS_0_5_16.replace("backend='full', max_bs=32",
                                                               "backend='disabled', max_bs=32")) == []
    assert levels.graph_batch_sizes("server_args=ServerArgs(cuda_graph_max_bs=8, cuda_graph_bs=[1, 2, 4, 8],"
                                    " disable_cuda_graph=False)") == [1, 2, 4, 8]  # up to 0.5.13
    assert levels.graph_batch_sizes("server_args=ServerArgs(cuda_graph_bs=[1, 2], disable_cuda_graph=True)") == []
    assert levels.graph_batch_sizes("no server_args here") is None


def test_only_the_head_of_a_log_is_read(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(SERVER_ARGS_0_5_16 + "\n")
    assert levels.read_graph_batch_sizes(log) == [1, 32]
    log.write_text("x" * levels.LOG_HEAD + SERVER_ARGS_0_5_16)
    assert levels.read_graph_batch_sizes(log) is None
    assert levels.read_graph_batch_sizes(tmp_path / "missing.log") is None and levels.read_graph_batch_sizes(None) is None


def test_requests_per_level():
    w = Workload(stream_requests=5)
    assert requests_at(1, w, None) == 5 and requests_at(1, w, 40) == 5  # c=1: the streamed requests
    assert requests_at(8, w, None) == 32  # 4 x c
    assert requests_at(8, w, 10) == 10  # --batch-requests
    assert requests_at(8, w, None, 16) == 128 and requests_at(2, w, None, 16) == 32  # --batch-waves 16: 16 x c
    assert requests_at(1, w, None, 16) == 5


def expected(seed, name, count, w):
    rng = random.Random(f"{seed}-{name}")
    return [[rng.randrange(w.token_low, w.token_high) for _ in range(w.input_len)] for _ in range(count)]


def test_prompts_are_seeded_per_level_and_the_same_whatever_else_is_measured():
    w = Workload(seed=3, stream_requests=2, input_len=5, token_low=10, token_high=50)
    sent = prompts(w, (1, 4, 8), None)
    assert sent["warmup"] == expected(3, "warmup", 8, w)  # as many as the highest level
    assert sent["levels"] == {1: expected(3, "level-1", 2, w), 4: expected(3, "level-4", 16, w),
                              8: expected(3, "level-8", 32, w)}
    alone = prompts(w, (8,), None)
    assert alone["levels"][8] == sent["levels"][8]  # a level's prompts do not depend on the other levels
    assert sent["levels"][4] != sent["levels"][8][:16]  # no level finds another's prefixes
    other = prompts(Workload(seed=4, stream_requests=2, input_len=5, token_low=10, token_high=50), (8,), None)
    assert other["levels"][8] != sent["levels"][8]
    assert len(prompts(w, (1, 4), 6)["levels"][4]) == 6
    assert all(10 <= t < 50 and len(p) == 5 for p in sent["levels"][8] for t in p)


class Recorder:
    def __init__(self):
        self.calls = []

    def batch(self, host, port, sent, max_new, concurrency, timeout):
        self.calls.append(("batch", len(sent), max_new, concurrency, sent[0][0]))
        return ({"requests": len(sent), "output_tok_s": 100.0 * concurrency, "accept_length": 2.5},
                [{"output_ids": [concurrency]} for _ in sent])

    def stream(self, host, port, sent, max_new, timeout):
        self.calls.append(("stream", len(sent), max_new, 1, sent[0][0]))
        return {"requests": len(sent), "tpot_ms_mean": 4.0}, [{"output_ids": [1]} for _ in sent]


def plan():
    return SimpleNamespace(host="h", request_timeout=9, workload=Workload(output_len=12, warmup_output_len=3))


def sent_for(level_list):
    return {"warmup": [[0]] * max(level_list), "levels": {c: [[c]] * (2 if c == 1 else 4 * c) for c in level_list}}


def test_a_measured_server_sends_the_warm_up_then_each_level_in_ascending_order(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(levels, "run_batch", rec.batch)
    monkeypatch.setattr(levels, "run_stream", rec.stream)
    said = []
    metrics, outputs = levels.drive((1, 2, 8), None)(plan(), 1, sent_for((1, 2, 8)), None, said.append, "server 3")
    assert rec.calls == [("batch", 8, 3, 8, 0), ("stream", 2, 12, 1, 1), ("batch", 8, 12, 2, 2),
                         ("batch", 32, 12, 8, 8)]
    assert list(metrics["levels"]) == ["1", "2", "8"]
    assert metrics["levels"]["8"] == {"requests": 32, "output_tok_s": 800.0, "accept_length": 2.5}
    assert outputs == {"batch": [[2]] * 8 + [[8]] * 32, "stream": [[1]] * 2}
    assert said == ["server 3: c=1: 2 x 12 tokens: 1000 / mean TPOT 250.0",
                    "server 3: c=2: 8 x 12 tokens: 200.0 tok/s, accept length 2.50",
                    "server 3: c=8: 32 x 12 tokens: 800.0 tok/s, accept length 2.50"]


def test_the_warm_up_server_sends_one_wave_at_each_level_and_one_streamed_request(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(levels, "run_batch", rec.batch)
    monkeypatch.setattr(levels, "run_stream", rec.stream)
    said = []
    metrics, outputs = levels.warm_drive((1, 2, 8))(plan(), 1, sent_for((1, 2, 8)), None, said.append, "warm-up")
    assert rec.calls == [("batch", 8, 3, 8, 0), ("stream", 1, 12, 1, 1), ("batch", 2, 12, 2, 2),
                         ("batch", 8, 12, 8, 8)]
    assert outputs is None and set(metrics) == {"wall_s"}
    assert len(said) == 1 and said[0].startswith("warm-up: warm-up requests and one wave at each of c=1,2,8 in ")
    assert said[0].endswith(" s (not measured)")
