"""What a ready server is sent and what is measured of it (sglang_pcie/tools/bench/workload.py), against an
in-process /generate that answers by the prompt: the batch at most --concurrency in flight and in order, every
figure of the batch and the stream, SGLang's own log figures from the batch phase only, the warm-up server's lighter
load, and the one line a short output gets."""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from sglang_pcie.tools.bench import workload
from sglang_pcie.tools.bench.plan import Plan, Workload
from sglang_pcie.tools.bench.workload import (percentile, run_batch, run_stream, server_decode_stats, short_outputs,
                                              warmup_workload)


class Scripted:
    """/generate: a request whose prompt is [n, ...] returns n output tokens (7, 8, ...) in cycles of 2 tokens
    (spec_verify_ct, a histogram), streamed as cumulative ids; what was asked is recorded in arrival order, with the
    most requests in flight at once. ``hold``: a request waits until that many are in flight (or 0.5 s)."""

    def __init__(self):
        self.prompts, self.in_flight, self.most, self.hold = [], 0, 0, None
        self.lock, self.changed = threading.Lock(), threading.Condition()
        scripted = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with scripted.changed:
                    scripted.prompts.append(body["input_ids"])
                    scripted.in_flight += 1
                    scripted.most = max(scripted.most, scripted.in_flight)
                    scripted.changed.notify_all()
                    if scripted.hold:
                        scripted.changed.wait_for(lambda: scripted.in_flight >= scripted.hold, timeout=0.5)
                n = min(body["input_ids"][0], body["sampling_params"]["max_new_tokens"])
                ids = list(range(7, 7 + n))
                meta = {"completion_tokens": n, "spec_verify_ct": (n + 1) // 2,
                        "spec_correct_drafts_histogram": [n % 2, n // 2]}
                if body.get("stream"):
                    chunks = [ids[:k] for k in range(2, n, 2)] + [ids]
                    text = "".join(f"data: {json.dumps({'output_ids': c, 'meta_info': dict(meta, completion_tokens=len(c))})}\n\n"
                                   for c in chunks) + "data: [DONE]\n\n"
                    payload = text.encode()
                else:
                    payload = json.dumps({"output_ids": ids, "meta_info": meta}).encode()
                with scripted.changed:
                    scripted.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def scripted():
    made = Scripted()
    yield made
    made.server.shutdown()
    made.server.server_close()


def test_percentile_interpolates_between_ranks():
    assert percentile([], 0.5) is None and percentile([4.0], 0.9) == 4.0
    assert percentile([3, 1, 2, 4], 0.5) == 2.5  # sorted first
    assert percentile([0, 10, 20, 30, 40], 0.9) == pytest.approx(36.0)
    assert percentile([1, 2], 1.0) == 2 and percentile([1, 2], 0.0) == 1


def test_the_batch_keeps_at_most_concurrency_in_flight_and_submits_in_order(scripted):
    scripted.hold = 3  # a request waits for a third in flight: there never is one
    prompts = [[4, i] for i in range(6)]
    metrics, results = run_batch("127.0.0.1", scripted.port, prompts, 4, 2, 30)
    assert scripted.most == 2
    # the first two submitted are the first two served; two threads race to the server, so in either order
    assert sorted(p[1] for p in scripted.prompts[:2]) == [0, 1]
    assert [r["output_ids"] for r in results] == [[7, 8, 9, 10]] * 6  # in the order submitted
    serial = Scripted()
    try:
        run_batch("127.0.0.1", serial.port, prompts, 4, 1, 30)
        assert serial.prompts == prompts and serial.most == 1
    finally:
        serial.server.shutdown()
        serial.server.server_close()


def test_the_batch_figures(scripted):
    prompts = [[4, 0], [3, 0], [1, 0]]
    metrics, results = run_batch("127.0.0.1", scripted.port, prompts, 4, 3, 30)
    assert (metrics["requests"], metrics["output_tokens"], metrics["short_outputs"]) == (3, 8, 2)
    assert metrics["output_tok_s"] == pytest.approx(8 / metrics["wall_s"])
    latencies = sorted(r["latency_s"] * 1e3 for r in results)
    assert metrics["latency_ms_p50"] == pytest.approx(latencies[1])
    assert metrics["latency_ms_mean"] == pytest.approx(sum(latencies) / 3)
    assert metrics["accept_length"] == pytest.approx(8 / (2 + 2 + 1))
    assert metrics["accept_hist"] == [2, 3] and metrics["requests_spec"] == [[4, 2, [0, 2]], [3, 2, [1, 1]],
                                                                             [1, 1, [1, 0]]]


def test_the_stream_figures_come_from_each_chunks_arrival(scripted, monkeypatch):
    ticks = iter(range(1000))  # each reading of the clock (time.perf_counter, the client's too) one second later
    monkeypatch.setattr(workload.time, "perf_counter", lambda: float(next(ticks)))
    metrics, results = run_stream("127.0.0.1", scripted.port, [[5, 0], [1, 0]], 5, 30)
    # the phase starts at 0; request 1 at 1, its chunks of 2, 4, 5 tokens at 2, 3, 4, done at 5; request 2 at 6,
    # its one token at 7, done at 8 (one token: no TPOT)
    assert metrics["ttft_ms_p50"] == pytest.approx(1000.0) and metrics["ttft_ms_mean"] == pytest.approx(1000.0)
    assert metrics["tpot_ms_p50"] == pytest.approx((4 - 1) * 1e3 / 4) and metrics["tpot_ms_mean"] == pytest.approx(750)
    assert metrics["itl_ms_p50"] == pytest.approx(1000.0) and metrics["itl_ms_p90"] == pytest.approx(1000.0)
    assert metrics["tokens_per_chunk"] == pytest.approx(6 / 4)
    assert (metrics["requests"], metrics["output_tokens"], metrics["short_outputs"]) == (2, 6, 1)
    assert [r["output_ids"] for r in results] == [[7, 8, 9, 10, 11], [7]] and "arrivals" not in results[0]
    assert metrics["accept_length"] == pytest.approx(6 / 4)


def test_a_stream_of_no_requests_has_no_figures(scripted):
    metrics, results = run_stream("127.0.0.1", scripted.port, [], 5, 30)  # --stream-requests 0
    assert results == [] and (metrics["requests"], metrics["output_tokens"]) == (0, 0)
    assert {k: metrics[k] for k in ("ttft_ms_p50", "ttft_ms_mean", "tpot_ms_p50", "tpot_ms_mean", "itl_ms_p50",
                                    "tokens_per_chunk", "accept_length")} == dict.fromkeys(
        ("ttft_ms_p50", "ttft_ms_mean", "tpot_ms_p50", "tpot_ms_mean", "itl_ms_p50", "tokens_per_chunk",
         "accept_length"))


DECODE = ("[2026-11-30 10:00:00 TP0] Decode batch, #running-req: {running}, #token: 9000, token usage: 0.01, accept"
          " len: {accept}, cuda graph: True, gen throughput (token/s): {tok_s}, #queue-req: 0\n")


def test_server_decode_stats_read_the_lines_with_that_many_running_between_the_offsets(tmp_path):
    log = tmp_path / "server.log"
    before = DECODE.format(running=4, accept="9.00", tok_s="1.00")
    during = [DECODE.format(running=4, accept=a, tok_s=t) for a, t in (("1.50", "100.00"), ("2.50", "300.00"),
                                                                       ("2.00", "200.00"))]
    other = DECODE.format(running=3, accept="7.00", tok_s="999.00")  # a batch not full: another shape
    log.write_text(before + during[0] + other + during[1] + during[2] + before)
    start, end = len(before), log.stat().st_size - len(before)
    assert server_decode_stats(log, start, end, 4) == {"lines": 3, "gen_tok_s_p50": 200.0, "accept_len_mean": 2.0}
    assert server_decode_stats(log, start, end, 3)["gen_tok_s_p50"] == 999.0
    assert server_decode_stats(tmp_path / "missing.log", 0, 10, 4) == {"lines": 0, "gen_tok_s_p50": None,
                                                                       "accept_len_mean": None}
    no_accept = "Decode batch, #running-req: 4, #token: 1, gen throughput (token/s): 5.00, #queue-req: 0\n"
    log.write_text(no_accept)
    assert server_decode_stats(log, 0, log.stat().st_size, 4) == {"lines": 1, "gen_tok_s_p50": 5.0,
                                                                 "accept_len_mean": None}


def a_plan(tmp_path, port, **work):
    return Plan(variants=[], workload=Workload(**work), launch_args=[], server_cmd=[], extra_env={}, host="127.0.0.1",
                port=port, repeats=1, out=tmp_path, start_timeout=5, stop_timeout=1, request_timeout=30)


def test_drive_workload_measures_the_batch_and_stream_and_reads_the_log_of_the_batch_only(scripted, tmp_path):
    log = tmp_path / "server.log"
    log.write_text(DECODE.format(running=2, accept="5.00", tok_s="1.00"))  # before the batch: not its figure
    plan = a_plan(tmp_path, scripted.port, concurrency=2, output_len=4, warmup_output_len=2)
    real_batch = workload.run_batch

    def logging_batch(host, port, prompts, max_new_tokens, concurrency, timeout):
        if max_new_tokens == 4:  # the measured batch: the server logs while it runs
            with open(log, "a") as f:
                f.write(DECODE.format(running=2, accept="2.00", tok_s="50.00"))
        return real_batch(host, port, prompts, max_new_tokens, concurrency, timeout)

    lines = []
    prompts = {"warmup": [[9, 0]], "batch": [[9, 1], [9, 2]], "stream": [[9, 3]]}
    import unittest.mock
    with unittest.mock.patch.object(workload, "run_batch", logging_batch):
        metrics, outputs = workload.drive_workload(plan, scripted.port, prompts, log, lines.append, "1/2 x")
    assert scripted.prompts[0] == [9, 0] and len(scripted.prompts) == 4  # the warm-up first, then 2 + 1
    assert metrics["batch"]["server_gen_tok_s_p50"] == 50.0 and metrics["batch"]["server_log_lines"] == 1
    assert outputs == {"batch": [[7, 8, 9, 10]] * 2, "stream": [[7, 8, 9, 10]]}
    assert metrics["accept_length"] == pytest.approx(12 / 6)  # batch and stream: 4 tokens in 2 verifies each
    assert metrics["accept_length_served"] == pytest.approx((2 - 1 + 3 * (4 - 1)) / (1 + 3 * 2))  # the warm-up too
    assert lines[0].startswith("1/2 x: batch 2 x 4 tokens at concurrency 2: ") and "accept length 2.00" in lines[0]
    assert lines[1].startswith("1/2 x: stream 1 x 4 tokens at concurrency 1: ")


def test_a_short_output_is_named_in_the_progress_line(scripted, tmp_path):
    plan = a_plan(tmp_path, scripted.port, concurrency=1, output_len=4, warmup_output_len=2)
    log = tmp_path / "server.log"
    log.write_text("")
    lines = []
    prompts = {"warmup": [[2, 0]], "batch": [[2, 0]], "stream": [[4, 0]]}
    workload.drive_workload(plan, scripted.port, prompts, log, lines.append, "x")
    assert lines[0].endswith("; 1 request(s) returned fewer tokens than asked (context limit?)")
    assert not lines[1].endswith("(context limit?)")


def test_short_outputs_counts_only_the_shorter_ones_and_names_the_shortest():
    assert short_outputs({"batch": [[1, 2, 3, 4], [1, 2]], "stream": [[1], [1, 2, 3, 4]]}, 4) == (
        "2 of 4 requests returned fewer than the 4 tokens asked (0 empty, shortest 1); the ratios leave this run out")
    assert short_outputs({"batch": [[], []], "stream": []}, 2).startswith("2 of 2 requests returned fewer than the 2"
                                                                          " tokens asked (2 empty, shortest 0)")
    assert short_outputs({"batch": [[1, 2, 3]]}, 3) is None and short_outputs({"batch": [[1, 2, 3, 4]]}, 3) is None


def test_a_warm_up_server_gets_the_warm_up_requests_one_batch_and_one_streamed_request(scripted, tmp_path):
    plan = a_plan(tmp_path, scripted.port, concurrency=2, output_len=4, warmup_output_len=2)
    lines = []
    prompts = {"warmup": [[9, 0]], "batch": [[9, 1], [9, 2], [9, 3]], "stream": [[9, 4], [9, 5]]}
    figures, outputs = warmup_workload(plan, scripted.port, prompts, Path("unused"), lines.append, "warm-up x")
    assert outputs is None and [p[1] for p in scripted.prompts] in ([0, 1, 2, 4], [0, 2, 1, 4])
    assert figures["batch_output_tok_s"] > 0 and figures["wall_s"] > 0
    assert lines == [lines[0]] and lines[0].startswith("warm-up x: warm-up requests, one batch of 2 x 4 tokens and"
                                                       " one streamed request in ")
    assert lines[0].endswith(" s (not measured)")
    scripted.prompts.clear()
    warmup_workload(plan, scripted.port, dict(prompts, stream=[]), Path("unused"), lines.append, "w")
    assert len(scripted.prompts) == 3 and "streamed" not in lines[-1]
