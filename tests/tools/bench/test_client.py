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
