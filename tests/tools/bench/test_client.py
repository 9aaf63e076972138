"""bench's HTTP client: a malformed reply or stream chunk is a RequestError naming it, a well-formed one parses."""
from __future__ import annotations

import json
import re

import pytest

from sglang_pcie.tools.bench.client import RequestError, generate, generate_stream


@pytest.fixture
def canned_server():
    """A /generate that answers whatever body the test sets (a malformed SGLang, in-process)."""
    import http.server
    import threading

    reply = {"body": b""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply["body"])))
            self.end_headers()
            self.wfile.write(reply["body"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield reply, server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("body, named", [
    ({"output_ids": None, "meta_info": {}}, "output_ids that are not a list"),
    ({"output_ids": [1, "x"]}, "output_ids that are not a list"),
    ({"output_ids": [1], "meta_info": [1]}, "meta_info that is not an object"),
    ({"output_ids": [1], "meta_info": {"spec_verify_ct": "3"}}, "spec_verify_ct='3'"),
    ({"output_ids": [1], "meta_info": {"spec_accept_histogram": [1, -2]}}, "spec_accept_histogram=[1, -2], not a"),
    ({"output_ids": [1], "meta_info": {"spec_correct_drafts_histogram": 3}}, "spec_correct_drafts_histogram=3"),
    ([1, 2], "answered without output_ids"),
])
def test_a_malformed_reply_is_a_request_error(canned_server, body, named):
    reply, port = canned_server
    reply["body"] = json.dumps(body).encode()
    with pytest.raises(RequestError, match=re.escape(named)):
        generate("127.0.0.1", port, [1, 2], 4, 5)


@pytest.mark.parametrize("chunk, named", [
    ("[1, 2]", "answered list, not an object"),
    ('"text"', "answered str, not an object"),
    ('{"output_ids": 7}', "output_ids that are not a list"),
    ('{"output_ids": [1], "meta_info": {"completion_tokens": 1.5}}', "completion_tokens=1.5"),
])
def test_a_malformed_stream_chunk_is_a_request_error(canned_server, chunk, named):
    reply, port = canned_server
    reply["body"] = f"data: {chunk}\n\ndata: [DONE]\n\n".encode()
    with pytest.raises(RequestError, match=re.escape(named)):
        generate_stream("127.0.0.1", port, [1, 2], 4, 5)


def test_well_formed_replies_still_parse(canned_server):
    reply, port = canned_server
    reply["body"] = json.dumps({"output_ids": [5, 6], "meta_info": {"completion_tokens": 2}}).encode()
    assert generate("127.0.0.1", port, [1], 2, 5)["output_ids"] == [5, 6]
    reply["body"] = (b'data: {"output_ids": [5], "meta_info": {"completion_tokens": 1}}\n\n'
                     b'data: {"output_ids": [5, 6], "meta_info": {"completion_tokens": 2}}\n\ndata: [DONE]\n\n')
    result = generate_stream("127.0.0.1", port, [1], 2, 5)
    assert result["output_ids"] == [5, 6] and len(result["arrivals"]) == 2


@pytest.fixture
def recording_server():
    """A /generate that records each request body and answers with the status and body the test sets."""
    import http.server
    import threading

    state = {"status": 200, "body": b"", "requests": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            state["requests"].append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(state["status"])
            self.send_header("Content-Length", str(len(state["body"])))
            self.end_headers()
            self.wfile.write(state["body"])

        def do_GET(self):
            self.send_response(204 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, server.server_address[1]
    server.shutdown()
    server.server_close()


def test_every_request_is_greedy_ignores_eos_and_asks_for_its_tokens(recording_server):
    state, port = recording_server
    state["body"] = json.dumps({"output_ids": [5]}).encode()
    result = generate("127.0.0.1", port, [1, 2], 7, 5)
    assert state["requests"] == [{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 7, "temperature": 0.0,
                                                                          "ignore_eos": True}}]
    assert result["meta_info"] == {} and result["latency_s"] > 0  # a reply without meta info
    state["body"] = b"data: [DONE]\n\n"
    generate_stream("127.0.0.1", port, [3], 2, 5)
    assert state["requests"][-1] == {"input_ids": [3], "sampling_params": {"max_new_tokens": 2, "temperature": 0.0,
                                                                           "ignore_eos": True}, "stream": True}


def test_an_http_error_is_a_request_error_with_the_servers_words(recording_server):
    state, port = recording_server
    state["status"], state["body"] = 500, b"out of memory" + b"x" * 400
    with pytest.raises(RequestError, match=r"^/generate answered HTTP 500: out of memoryx+$") as caught:
        generate("127.0.0.1", port, [1], 1, 5)
    assert len(str(caught.value)) == len("/generate answered HTTP 500: ") + 300  # the body's first 300 bytes
    with pytest.raises(RequestError, match="answered HTTP 500"):
        generate_stream("127.0.0.1", port, [1], 1, 5)


def test_http_get_returns_the_status_and_body(recording_server):
    from sglang_pcie.tools.bench.client import http_get

    _, port = recording_server
    assert http_get("127.0.0.1", port, "/health") == (204, b"")
    assert http_get("127.0.0.1", port, "/nothing")[0] == 404


def test_a_stream_error_chunk_is_a_request_error(canned_server):
    reply, port = canned_server
    reply["body"] = b'data: {"output_ids": [1], "meta_info": {"completion_tokens": 1}}\n\ndata: {"error": "boom"}\n\n'
    with pytest.raises(RequestError, match=r"^stream error: boom$"):
        generate_stream("127.0.0.1", port, [1], 4, 5)


def test_incremental_chunks_are_appended_and_cumulative_ones_replace(canned_server):
    """SGLang streams cumulative ids by default, deltas with --incremental-streaming-output; completion_tokens
    (the tokens so far) tells which a chunk is. Lines that are not ``data:`` are skipped; a chunk of meta info
    only adds no tokens and no arrival."""
    reply, port = canned_server
    reply["body"] = (b': keep-alive\n\n'
                     b'data: {"output_ids": [5, 6], "meta_info": {"completion_tokens": 2}}\n\n'
                     b'data: {"output_ids": [7], "meta_info": {"completion_tokens": 3}}\n\n'
                     b'data: {"meta_info": {"completion_tokens": 3, "spec_verify_ct": 2}}\n\n'
                     b'data: {"output_ids": [8, 9], "meta_info": {"completion_tokens": 5}}\n\ndata: [DONE]\n\n'
                     b'data: {"output_ids": [1]}\n\n')  # after [DONE]: not read
    result = generate_stream("127.0.0.1", port, [1], 5, 5)
    assert result["output_ids"] == [5, 6, 7, 8, 9] and [n for _, n in result["arrivals"]] == [2, 3, 5]
    assert result["meta_info"] == {"completion_tokens": 5}
    reply["body"] = (b'data: {"output_ids": [5], "meta_info": {"completion_tokens": 1}}\n\n'
                     b'data: {"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3}}\n\n'
                     b'data: {"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3}}\n\n'  # nothing new
                     b'data: [DONE]\n\n')
    result = generate_stream("127.0.0.1", port, [1], 3, 5)
    assert result["output_ids"] == [5, 6, 7] and [n for _, n in result["arrivals"]] == [1, 3]


@pytest.mark.parametrize("meta, named", [
    ({"completion_tokens": True}, "completion_tokens=True, not an integer"),
    ({"spec_accept_histogram": [1, True]}, "spec_accept_histogram=[1, True], not a list of counts"),
    ({"spec_accept_histogram": [1.0]}, "spec_accept_histogram=[1.0], not a list of counts"),
])
def test_booleans_and_floats_are_not_counts(canned_server, meta, named):
    reply, port = canned_server
    reply["body"] = json.dumps({"output_ids": [1], "meta_info": meta}).encode()
    with pytest.raises(RequestError, match=re.escape(named)):
        generate("127.0.0.1", port, [1], 1, 5)


def test_counts_that_are_absent_or_null_are_fine(canned_server):
    reply, port = canned_server
    reply["body"] = json.dumps({"output_ids": [], "meta_info": {"completion_tokens": None,
                                                                "spec_accept_histogram": [0, 3]}}).encode()
    assert generate("127.0.0.1", port, [1], 1, 5)["meta_info"]["spec_accept_histogram"] == [0, 3]
