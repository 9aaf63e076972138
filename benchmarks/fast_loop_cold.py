"""The fast test loop from a fresh clone on a cold cache: its set-up command and the loop itself, timed, with every
byte they fetch from the network counted.

usage: python -m benchmarks.fast_loop_cold [--python PY] [--workers N] [--keep DIR] [--out FILE]

Clones this checkout's HEAD into a temporary folder and runs there, as README says,
  set-up:    PY -m venv .venv && .venv/bin/python -m pip install -e ".[test]"
  fast loop: .venv/bin/python -m pytest -m "not release and not slow" -n N -q -p no:cacheprovider
with HOME an empty folder (so pip's cache and sglang-pcie's, ~/.cache/pip and ~/.cache/sglang-pcie, start empty) and
TMPDIR one of its own (pytest's folders apart from other sessions'), no
pip configuration (PIP_CONFIG_FILE=/dev/null, no PIP_* variable: a machine's local wheel folders or index mirrors do
not stand in for the package index) and HTTPS_PROXY pointing at a counting proxy in this process: every CONNECT
tunnel's host and bytes each way are recorded (the traffic is TLS; the proxy does not look inside). NO_PROXY keeps
the tests' local servers (127.0.0.1) off it. Machine-wide received bytes (/proc/net/dev, other users included) are
printed beside, as a check that nothing went around the proxy. PY defaults to the interpreter this venv was made
from. Prints the report (and writes it to --out); --keep DIR keeps the clone, its venv and the caches there.
"""
from __future__ import annotations

import argparse
import os
import select
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from support import REPO

FAST_LOOP = ["-m", "pytest", "-m", "not release and not slow", "-q", "-p", "no:cacheprovider"]


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.hosts: dict[str, list[int]] = {}  # host -> [tunnels, bytes down, bytes up]
        self.refused: list[str] = []

    def add(self, host: str, down: int = 0, up: int = 0, tunnels: int = 0) -> None:
        with self.lock:
            row = self.hosts.setdefault(host, [0, 0, 0])
            row[0] += tunnels
            row[1] += down
            row[2] += up

    def snapshot(self) -> dict[str, list[int]]:
        with self.lock:
            return {host: list(row) for host, row in self.hosts.items()}


class Proxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, tally: Tally):
        super().__init__(("127.0.0.1", 0), Tunnel)
        self.tally = tally


class Tunnel(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        client, tally = self.request, self.server.tally
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        method, target = (head.split(b"\r\n", 1)[0].decode("latin-1").split(" ") + ["", ""])[:2]
        if method != "CONNECT":
            with tally.lock:
                tally.refused.append(f"{method} {target}")
            client.sendall(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n")
            return
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection((host, int(port)), timeout=60)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        tally.add(host, tunnels=1)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        ends = {client: upstream, upstream: client}
        with upstream:
            while True:
                ready, _, _ = select.select(list(ends), [], [], 300)
                if not ready:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    ends[sock].sendall(data)
                    if sock is upstream:
                        tally.add(host, down=len(data))
                    else:
                        tally.add(host, up=len(data))


def received_bytes() -> int:
    """Bytes received on every interface but loopback, machine-wide (/proc/net/dev); 0 where unreadable."""
    try:
        lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    except OSError:
        return 0
    return sum(int(line.split(":", 1)[1].split()[0]) for line in lines if line.split(":")[0].strip() != "lo")


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) if path.exists() else 0


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def phase(name: str, cmd: list[str], cwd: Path, env: dict, tally: Tally, report: list[str]) -> tuple[int, str]:
    before, net_before, load_before = tally.snapshot(), received_bytes(), os.getloadavg()
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    after, net_after, load_after = tally.snapshot(), received_bytes(), os.getloadavg()
    report.append(f"{name}: {' '.join(cmd)}")
    report.append(f"  exit {proc.returncode}, {wall:.1f} s wall; load average (1, 5, 15 min) before"
                  f" {', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}")
    total_down = total_up = 0
    for host in sorted(after):
        tunnels, down, up = (a - b for a, b in zip(after[host], before.get(host, [0, 0, 0])))
        if tunnels or down or up:
            report.append(f"  {host}: {tunnels} tunnels, {mb(down)} down, {mb(up)} up")
            total_down, total_up = total_down + down, total_up + up
    report.append(f"  through the proxy: {mb(total_down)} down, {mb(total_up)} up; machine-wide received"
                  f" {mb(net_after - net_before)} (every user and process of the machine)")
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    report.extend(f"  | {line}" for line in tail[-3:])
    return proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=getattr(sys, "_base_executable", sys.executable),
                        help="the interpreter that makes the venv (default: the one this venv was made from)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers of the fast loop (default 2)")
    parser.add_argument("--keep", type=Path, help="work in this (new) folder and keep it")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="fast-loop-cold-"))
    work.mkdir(parents=True, exist_ok=True)
    tally = Tally()
    proxy = Proxy(tally)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
    try:
        clone, home, tmp = work / "clone", work / "home", work / "tmp"
        home.mkdir()
        tmp.mkdir()
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PIP_", "SGLANG_PCIE_", "VIRTUAL_ENV", "PYTHON")) and k.lower() not in
               ("https_proxy", "http_proxy", "all_proxy", "no_proxy", "xdg_cache_home", "xdg_config_home")}
        env.update({"HOME": str(home), "TMPDIR": str(tmp), "PIP_CONFIG_FILE": os.devnull, "HTTPS_PROXY": proxy_url,
                    "https_proxy": proxy_url, "HTTP_PROXY": proxy_url, "http_proxy": proxy_url,
                    "NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1"})
        report = [f"# python -m benchmarks.fast_loop_cold{' '.join([''] + sys.argv[1:])} (clone of {head},"
                  f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, venv from"
                  f" {args.python}, {subprocess.run([args.python, '--version'], capture_output=True, text=True).stdout.strip()})"]
        venv_python = str(clone / ".venv" / "bin" / "python")
        code, _ = phase("set-up (venv)", [args.python, "-m", "venv", ".venv"], clone, env, tally, report)
        if code == 0:
            code, _ = phase("set-up (install)", [venv_python, "-m", "pip", "install", "-e", ".[test]"], clone, env,
                            tally, report)
        if code == 0:
            code, _ = phase("fast loop", [venv_python, *FAST_LOOP, "-n", str(args.workers)], clone, env, tally,
                            report)
        cache = home / ".cache"
        report.append(f"afterwards: ~/.cache/pip {mb(folder_size(cache / 'pip'))}, ~/.cache/sglang-pcie"
                      f" {mb(folder_size(cache / 'sglang-pcie'))} (release wheels:"
                      f" {len(list((cache / 'sglang-pcie').rglob('sglang-*.whl')))}), .venv"
                      f" {mb(folder_size(clone / '.venv'))}")
        if tally.refused:
            report.append(f"refused (not CONNECT): {', '.join(tally.refused[:10])}")
        text = "\n".join(report) + "\n"
        print(text, end="")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        return code
    finally:
        proxy.shutdown()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
