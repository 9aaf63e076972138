"""A stand-in for ``python -m sglang.launch_server`` that speaks the HTTP endpoints bench uses, for CPU tests.

Started by ``sglang-pcie bench --server-cmd "python tests/support/fake_sglang_server.py"`` exactly as a real server is:
launch arguments, then ``--host H --port P``, in its own process group. It answers ``/health`` (503 while
"starting"), ``/model_info``, and ``/generate`` with ``input_ids``, greedy ``sampling_params`` and ``stream``
(SGLang's SSE framing: ``data: {...}`` lines with cumulative ``output_ids`` and ``meta_info``, then
``data: [DONE]``). Output tokens are a function of the prompt, so two servers agree request by request.

Behaviour knobs (environment, so bench variants can set them; launch argument ``--fake-shift N``):
  FAKE_FAIL_START=1       print a message and exit 3 before answering anything
  FAKE_FAIL_RUNS=N1,N2    the same, only in the run folders named (e.g. 00-warmup: bench's warm-up server)
  FAKE_START_DELAY=S      answer /health 503 for S seconds (default 0.3)
  FAKE_CYCLE_MS=MS        time per decode cycle (default 0.5); FAKE_ACCEPT=K tokens per cycle (default 2)
  FAKE_HISTOGRAM=KEYS     the acceptance histogram keys meta_info carries, comma-separated (default
                          spec_correct_drafts_histogram,spec_accept_histogram: SGLang 0.5.16; 0.5.9 has only
                          spec_accept_histogram, 0.5.23 only spec_correct_drafts_histogram; "none": neither). Index
                          n: the verify cycles that accepted n drafts: K - 1 in every full cycle, fewer in a last
                          cycle cut short by max_new_tokens (consistent with spec_verify_ct and completion_tokens)
  FAKE_CYCLE_JITTER=J     this server's cycle time times exp(J * z), z ~ N(0, 1) drawn once per server from
                          FAKE_SEED (default 0) and the name of its run folder (bench logs each server to
                          runs/NN-variant/server.log): identical variants differ as identical servers do, and the
                          same schedule draws the same factors. /model_info reports the cycle time it drew.
  FAKE_MAX_TOKENS=N       return at most N tokens per request (0: none), as a server at its context limit would
  FAKE_BATCH=N            non-streaming requests decode in batches of N (see Batcher)
  FAKE_DIFFER_EVERY=N     change token 3 of every request whose prompt sum is divisible by N
  FAKE_STUBBORN_CHILD=1   start a child that ignores SIGTERM (bench must SIGKILL it); its pid is logged
  FAKE_ESCAPED_CHILD=1    start a child that leaves the process group (setsid); its pid is logged
  FAKE_CHILD_SWAP=1       start a child (alive when the server is ready); at the first /generate, end it and start
                          another (as a server whose workers come and go after start-up); both pids are logged
  EAGLE3_PROFILE=1 with EAGLE3_PROFILE_FILE   append one profile interval record per request
  SGLANG_PCIE_*           the overlay's NCCL decision is applied as on ``import sglang`` (unless disabled)
  NCCL_DEBUG=INFO         NCCL_* variables logged as NCCL's "set by environment" lines (NCCL_DEBUG_SUBSYS=ENV);
                          FAKE_NCCL_IGNORES=NAME leaves one out, as if NCCL never read it
--fake-shift N            (launch argument) shifts every output token by N: a launch option that changes tokens
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's sglang_pcie (profile schema)

from sglang_pcie.runtime import nccl  # noqa: E402
from sglang_pcie.patches.eagle3_profile.payload import REPORTED, SCHEMA  # noqa: E402
from sglang_pcie.runtime.settings import load_settings  # noqa: E402

START = time.monotonic()
START_WALL = time.time()
PROFILE_LOCK = threading.Lock()
LOCK = threading.Lock()


def env_float(name, default):
    return float(os.environ.get(name) or default)


def cycle_factor(seed: str, jitter: float, run_name: str) -> float:
    """exp(jitter * z), z a standard normal drawn from the seed and the run's name."""
    return math.exp(jitter * random.Random(f"{seed}:{run_name}").gauss(0.0, 1.0))


def run_name() -> str:
    """The folder bench logs this server into (runs/NN-variant), or the pid where stdout is not a file."""
    try:
        return Path(os.readlink("/proc/self/fd/1")).parent.name
    except OSError:
        return str(os.getpid())


CYCLE_FACTOR = cycle_factor(os.environ.get("FAKE_SEED") or "0", env_float("FAKE_CYCLE_JITTER", 0.0), run_name())


def cycle_ms() -> float:
    return env_float("FAKE_CYCLE_MS", 0.5) * CYCLE_FACTOR


def output_tokens(input_ids, count, shift):
    seed = sum(input_ids)
    tokens = [(seed * 31 + k * 7 + shift) % 30000 for k in range(count)]
    every = int(os.environ.get("FAKE_DIFFER_EVERY") or 0)
    if every and seed % every == 0 and count > 3:
        tokens[3] = (tokens[3] + 1) % 30000
    return tokens


HISTOGRAM_KEYS = "spec_correct_drafts_histogram,spec_accept_histogram"  # SGLang 0.5.16: the name and its alias


def accept_histogram(done: int, accept: int) -> list:
    """The verify cycles after the prefill token that produced ``done`` tokens, by accepted drafts: each cycle
    yields its accepted drafts plus one token of the target's, ``accept`` tokens in a full cycle."""
    decoded = max(0, done - 1)
    full, last = divmod(decoded, accept)
    histogram = [0] * accept
    histogram[accept - 1] = full
    if last:
        histogram[last - 1] += 1
    return histogram


def write_profile(tokens, cycles):
    path = os.environ.get("EAGLE3_PROFILE_FILE")
    if os.environ.get("EAGLE3_PROFILE") != "1" or not path or not cycles:
        return
    cycle = cycle_ms()
    phases = {name: {"n": cycles, "mean": cycle / 4, "p50": cycle / 4, "p90": cycle / 3} for name in REPORTED}
    phases["cycle"] = {"n": cycles, "mean": cycle, "p50": cycle, "p90": cycle * 1.2}
    # FAKE_PROFILE_WALL_RATIO < 1 makes the wall-clock cycle shorter than the GPU cycle: a broken invariant
    wall_cycle_ms = cycle * env_float("FAKE_PROFILE_WALL_RATIO", 1.25)
    record = {"schema": SCHEMA, "run_id": f"{START_WALL:.3f}-{os.getpid()}", "run_started": START_WALL,
              "pid": os.getpid(), "tp_rank": 0, "timer": "fake", "syncs": 0, "decode_cycles": cycles,
              "timed_cycles": cycles, "prefill_cycles": 1, "idle_cycles": 0, "decode_requests": cycles,
              "requests_all": cycles, "tokens": tokens, "accept_length": tokens / cycles,
              "accept_length_exact": True, "phases_ms": phases, "wall_s": cycles * wall_cycle_ms / 1e3,
              "wall_cycle_ms": wall_cycle_ms, "timed_wall_cycle_ms": wall_cycle_ms, "wall_cycles": cycles,
              "profiler_host_us_per_cycle": 12.5,
              "baseline_ms": None}
    with PROFILE_LOCK, open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


class Batcher:
    """Non-streaming requests decoded as SGLang's scheduler would: together, as one batch.

    With FAKE_BATCH=N a request waits until N requests have gathered, then the N decode together and each logs the
    scheduler line with ``#running-req: N``. What the log says then depends on what the client sent, never on how
    closely its threads happened to overlap on a loaded machine. (A batch that never fills, a client that sends
    fewer than N at once, is let go after FAKE_BATCH_WAIT_S, default 60 s, and logs its real size.) Without
    FAKE_BATCH each request runs alone and logs 1.
    """

    def __init__(self):
        self.cond = threading.Condition()
        self.forming = 0  # requests gathered for the next batch
        self.batch_no = 0  # batches released so far
        self.sizes = {}  # batch number -> its size

    def join(self) -> int:
        """Wait for this request's batch to be released; its size."""
        size = int(os.environ.get("FAKE_BATCH") or 1)
        with self.cond:
            self.forming += 1
            mine = self.batch_no
            if self.forming >= size:
                return self._release()
            released = self.cond.wait_for(lambda: self.batch_no != mine, env_float("FAKE_BATCH_WAIT_S", 60))
            if not released:
                return self._release()
            return self.sizes[mine]

    def _release(self) -> int:
        size, self.forming = self.forming, 0
        self.sizes[self.batch_no] = size
        self.batch_no += 1
        self.cond.notify_all()
        return size


BATCHER = Batcher()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    shift = 0

    def log_message(self, *args):  # quiet: the log is bench's evidence, keep it short
        pass

    def _json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            ready = time.monotonic() - START >= env_float("FAKE_START_DELAY", 0.3)
            self._json(200 if ready else 503, {})
        elif self.path in ("/model_info", "/get_model_info"):
            self._json(200, {"model_path": "fake", "is_generation": True, "argv": sys.argv[1:], "cycle_ms": cycle_ms(),
                             "env": {k: v for k, v in os.environ.items()
                                     if k.startswith(("SGLANG_PCIE_", "EAGLE3_", "NCCL_", "FAKE_"))}})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        if self.path != "/generate":
            self._json(404, {"detail": "Not Found"})
            return
        swap_child()
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        params = req.get("sampling_params") or {}
        count = int(params.get("max_new_tokens", 16))
        if os.environ.get("FAKE_MAX_TOKENS"):
            count = min(count, int(os.environ["FAKE_MAX_TOKENS"]))
        tokens = output_tokens(req["input_ids"], count, self.shift)
        accept = int(os.environ.get("FAKE_ACCEPT") or 2)
        cycle_s = cycle_ms() / 1e3
        # as in SGLang's EAGLE: prefill gives the first token, each verify cycle then up to FAKE_ACCEPT tokens
        cycles = -(-(count - 1) // accept)
        start = time.monotonic()

        def meta(done, verify):
            info = {"id": "fake", "prompt_tokens": len(req["input_ids"]), "completion_tokens": done,
                    "cached_tokens": 0, "finish_reason": {"type": "length", "length": count} if done == count
                    else None, "e2e_latency": time.monotonic() - start}
            if verify:
                info.update(spec_verify_ct=verify, spec_accept_length=done / verify)
                keys = os.environ.get("FAKE_HISTOGRAM", HISTOGRAM_KEYS)
                for key in (k.strip() for k in keys.split(",") if k.strip() and keys != "none"):
                    info[key] = accept_histogram(done, accept)
            return info

        if req.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            done = verify = 0
            while done < count:
                time.sleep(cycle_s)
                done, verify = (1, 0) if done == 0 else (min(count, done + accept), verify + 1)
                chunk = {"text": "", "output_ids": tokens[:done], "meta_info": meta(done, verify)}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        else:
            running = BATCHER.join()
            time.sleep(cycle_s * cycles)
            with LOCK:
                # SGLang's scheduler log line (metrics_reporter), one per request here instead of every 40 steps
                print(f"[fake] Decode batch, #running-req: {running}, token usage: 0.01, accept len:"
                      f" {count / max(cycles, 1):.2f}, cuda graph: True, gen throughput (token/s):"
                      f" {running * accept / cycle_s:.2f}, #queue-req: 0", flush=True)
            self._json(200, {"text": "", "output_ids": tokens, "meta_info": meta(count, cycles)})
        write_profile(count - 1, cycles)  # the profile counts the tokens of decode cycles


SWAP = {"child": None, "done": False}


def swap_child():
    """FAKE_CHILD_SWAP: the first request ends the start-up child (reaped) and starts another; once."""
    with LOCK:
        if os.environ.get("FAKE_CHILD_SWAP") != "1" or SWAP["done"]:
            return
        SWAP["done"] = True
        old = SWAP["child"]
        old.terminate()
        old.wait()
        print(f"fake: ended child pid {old.pid}", flush=True)
        SWAP["child"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"fake: swapped-in child pid {SWAP['child'].pid}", flush=True)


def start_child(escape: bool):
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('armed', flush=True);"
            " sys.stdout.close(); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=escape, stdout=subprocess.PIPE)
    child.stdout.readline()  # SIGTERM is ignored from here on: no race with an early stop
    child.stdout.close()
    print(f"fake: {'escaped' if escape else 'stubborn'} child pid {child.pid}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fake-shift", type=int, default=0)
    args, unknown = parser.parse_known_args()
    print(f"fake: launch arguments {sys.argv[1:]}", flush=True)
    settings = load_settings()
    if not settings.disabled:
        nccl.apply_for_process(settings)  # what the overlay does in a real launcher when sglang is imported
    if os.environ.get("NCCL_DEBUG") == "INFO":
        for name, value in sorted(os.environ.items()):
            if name.startswith("NCCL_") and not name.startswith("NCCL_DEBUG") and name != os.environ.get(
                    "FAKE_NCCL_IGNORES"):
                print(f"fakehost:{os.getpid()}:{threading.get_ident() % 100000} [0] NCCL INFO {name} set by"
                      f" environment to {value}", flush=True)
    if os.environ.get("FAKE_FAIL_START") == "1" or run_name() in os.environ.get("FAKE_FAIL_RUNS", "").split(","):
        print("fake: boom: the model does not fit (FAKE_FAIL_START)", flush=True)
        sys.exit(3)
    if os.environ.get("FAKE_STUBBORN_CHILD") == "1":
        start_child(escape=False)
    if os.environ.get("FAKE_ESCAPED_CHILD") == "1":
        start_child(escape=True)
    if os.environ.get("FAKE_CHILD_SWAP") == "1":
        SWAP["child"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"fake: start-up child pid {SWAP['child'].pid}", flush=True)
    Handler.shift = args.fake_shift
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"fake: serving on {args.host}:{args.port}", flush=True)
    server.serve_forever(poll_interval=0.05)
    print("fake: stopped", flush=True)


if __name__ == "__main__":
    main()
