"""The HTTP client bench drives a server with: SGLang's ``/generate`` (token ids in, output ids and meta info out),
plain and streamed, every reply's shape checked. The standard library's ``http.client``: nothing of SGLang is
imported in the client process."""
from __future__ import annotations

import http.client
import json
import time


class RequestError(Exception):
    pass


def sampling_params(max_new_tokens: int) -> dict:
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}


def http_get(host, port, path, timeout=5.0):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _post(host, port, payload, timeout):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    body = json.dumps(payload).encode()
    conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        text = response.read()[:300].decode("utf-8", "replace")
        conn.close()
        raise RequestError(f"/generate answered HTTP {response.status}: {text}")
    return conn, response


def generate(host, port, input_ids, max_new_tokens, timeout) -> dict:
    """One non-streaming request: {"output_ids", "meta_info", "latency_s"}."""
    start = time.perf_counter()
    conn, response = _post(host, port, {"input_ids": input_ids, "sampling_params": sampling_params(max_new_tokens)},
                           timeout)
    try:
        data = json.loads(response.read())
    finally:
        conn.close()
    if not isinstance(data, dict) or "output_ids" not in data:
        raise RequestError(f"/generate answered without output_ids: {str(data)[:200]}")
    ids, meta = checked_reply(data, "/generate", ids_required=True)
    return {"output_ids": ids, "meta_info": meta or {}, "latency_s": time.perf_counter() - start}


_COUNTS = ("completion_tokens", "spec_verify_ct")  # the meta_info fields bench does arithmetic with
_HISTOGRAMS = ("spec_correct_drafts_histogram", "spec_accept_histogram")  # lists of counts it sums


def checked_reply(data, where: str, ids_required: bool = False) -> tuple[list, dict | None]:
    """(output ids, meta_info) of one reply or stream chunk; RequestError when their shapes are not SGLang's,
    so that a malformed reply fails the run instead of escaping as a TypeError."""
    if not isinstance(data, dict):
        raise RequestError(f"{where} answered {type(data).__name__}, not an object: {str(data)[:200]}")
    ids, meta = data.get("output_ids"), data.get("meta_info")
    if ids is None and not ids_required:  # a stream chunk may carry meta info only
        ids = []
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise RequestError(f"{where} answered output_ids that are not a list of integers: {str(ids)[:200]}")
    if meta is not None and not isinstance(meta, dict):
        raise RequestError(f"{where} answered meta_info that is not an object: {str(meta)[:200]}")
    for key in _COUNTS:
        value = (meta or {}).get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise RequestError(f"{where} answered meta_info {key}={value!r}, not an integer")
    for key in _HISTOGRAMS:
        value = (meta or {}).get(key)
        if value is not None and not (isinstance(value, list) and all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)):
            raise RequestError(f"{where} answered meta_info {key}={str(value)[:200]}, not a list of counts")
    return ids, meta


def generate_stream(host, port, input_ids, max_new_tokens, timeout) -> dict:
    """One streaming request: output ids, meta info, and the arrival time of every chunk that carried tokens."""
    start = time.perf_counter()
    conn, response = _post(host, port, {"input_ids": input_ids, "sampling_params": sampling_params(max_new_tokens),
                                        "stream": True}, timeout)
    tokens: list = []
    meta: dict = {}
    arrivals = []  # (seconds since start, tokens so far)
    try:
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if isinstance(chunk, dict) and "error" in chunk:
                raise RequestError(f"stream error: {str(chunk['error'])[:200]}")
            ids, chunk_meta = checked_reply(chunk, "/generate stream")
            meta = chunk_meta or meta
            # SGLang streams cumulative ids by default and deltas with --incremental-streaming-output;
            # completion_tokens tells which one this chunk is.
            if meta.get("completion_tokens") == len(ids) and len(ids) >= len(tokens):
                new = len(ids) - len(tokens)
                tokens = ids
            else:
                new = len(ids)
                tokens.extend(ids)
            if new > 0:
                arrivals.append((time.perf_counter() - start, len(tokens)))
    finally:
        conn.close()
    return {"output_ids": tokens, "meta_info": meta, "latency_s": time.perf_counter() - start,
            "arrivals": arrivals}
