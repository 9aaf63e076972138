#!/usr/bin/env python3
"""What the overlay costs a process where nothing is opted in: ``import sglang`` plus SGLang's model registry
(``import sglang.srt.models.registry``, which imports every model module), with the overlay active and without.

Runs in the real SGLang installs the tests use (``ci/sglang-env VERSION``: 0.5.9 and 0.5.23 by default, with this
checkout's wheel installed and, on a machine without a GPU, the stub libcuda of tests/support/cuda_stub.py). "Without" is
the same interpreter with ``SGLANG_PCIE_DISABLE=1``: the ``.pth`` hook then returns at once (what the hook itself
costs every interpreter is ``benchmarks/startup_overhead.py``'s figure). Each run is a fresh process; the two modes
alternate (ABAB...) so drift in machine load hits both alike. Inside the overlay process the time spent in the
overlay's post-import hooks (activation at ``import sglang``, then each patch's hook) is also summed.

The installed sglang-pcie is built from this checkout's HEAD (committed state), whose hash is printed.
Usage: python -m benchmarks.activation_cost [--versions 0.5.9,0.5.23] [--runs 7] [--json FILE] [--no-install]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from support import REPO, cuda_stub

# The child: times the two imports, and (overlay active) the time inside the overlay's hooks, outermost calls only.
CHILD = r'''
import json, os, sys, time
start = time.perf_counter()
hooks = {"s": 0.0, "depth": 0, "calls": 0}
try:
    import sglang_pcie_startup as startup
except ImportError:
    startup = None
if startup is not None:
    original = startup.ImportWatcher._call
    def timed(self, name, callback, module):
        hooks["depth"] += 1
        began = time.perf_counter()
        try:
            return original(self, name, callback, module)
        finally:
            hooks["depth"] -= 1
            if hooks["depth"] == 0:
                hooks["s"] += time.perf_counter() - began
                hooks["calls"] += 1
    startup.ImportWatcher._call = timed
t0, c0 = time.perf_counter(), time.process_time()
import sglang
t1 = time.perf_counter()
import sglang.srt.models.registry
t2, c2 = time.perf_counter(), time.process_time()
active = "sglang_pcie.runtime.activate" in sys.modules
switched_off = dict(sys.modules["sglang_pcie.runtime.activate"].SWITCHED_OFF) if active else {}
hooked = sorted(sys.modules["sglang_pcie.runtime.activate"].RESULTS) if active else []
print(json.dumps({"import_sglang_s": t1 - t0, "registry_s": t2 - t1, "cpu_s": c2 - c0, "hooks_s": hooks["s"],
                  "hook_calls": hooks["calls"], "overlay_active": active, "switched_off": switched_off,
                  "patched": hooked, "sglang": sglang.__version__}))
'''
MODES = {"overlay": {}, "without": {"SGLANG_PCIE_DISABLE": "1"}}


def sglang_python(version: str) -> Path:
    proc = subprocess.run([str(REPO / "ci" / "sglang-env"), version], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"activation_cost: ci/sglang-env {version} failed (exit {proc.returncode})")
    return Path(proc.stdout.strip().splitlines()[-1])


def head_commit() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "unknown"


def install_checkout(python: Path) -> None:
    """This checkout's committed state (HEAD, not work in progress in the tree) as a wheel, installed as the tests
    install it (one pip at a time per venv)."""
    import fcntl

    with tempfile.TemporaryDirectory() as out:
        source = Path(out) / "src"
        source.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, str(source)],
                       check=True)
        wheel = sorted(Path(out).glob("sglang_pcie-*.whl"))[0]
        with open(python.parent.parent / ".sglang-pcie-install.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                            str(wheel)], check=True)


def child_env(python: Path, mode: str) -> dict:
    """No sglang-pcie or EAGLE3 setting inherited (nothing opted in); the stub libcuda where there is no GPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_PCIE_", "EAGLE3_", "NCCL_", "PYTHON"))}
    if not Path("/dev/nvidia0").exists():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(stub_dir(python)), env.get("LD_LIBRARY_PATH")]))
    env.update(MODES[mode])
    return env


def stub_dir(python: Path) -> Path:
    """tests/support/cuda_stub.py's stub libcuda for this venv; retried, as a pip run in the shared venv (a parallel test
    session installing its wheel) can remove a folder while the stub builder walks site-packages."""
    import time

    for attempt in range(5):
        try:
            return cuda_stub.stub_dir(python)
        except OSError:
            if attempt == 4:
                raise
            time.sleep(2)


def run_once(python: Path, env: dict, workdir: str) -> dict:
    proc = subprocess.run([str(python), "-c", CHILD], env=env, cwd=workdir, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        sys.exit(f"activation_cost: child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    return {"median": statistics.median(ordered), "q1": q[0], "q3": q[2], "min": ordered[0], "max": ordered[-1],
            "n": len(ordered)}


def measure(version: str, runs: int, install: bool) -> dict:
    python = sglang_python(version)
    if install:
        install_checkout(python)
    envs = {mode: child_env(python, mode) for mode in MODES}
    samples = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as workdir:  # not the checkout: the installed wheel is what runs
        run_once(python, envs["overlay"], workdir)  # warm the file cache once, unrecorded
        run_once(python, envs["without"], workdir)
        for i in range(runs):
            order = list(MODES) if i % 2 == 0 else list(reversed(MODES))
            for mode in order:
                samples[mode].append(run_once(python, envs[mode], workdir))
                print(f"activation_cost: {version} {mode} run {i + 1}/{runs}", file=sys.stderr, flush=True)
    result = {"version": version, "runs": runs, "sglang_pcie": head_commit() if install else "as installed"}
    for mode, rows in samples.items():
        total = [r["import_sglang_s"] + r["registry_s"] for r in rows]
        result[mode] = {"import_sglang_s": spread([r["import_sglang_s"] for r in rows]),
                        "registry_s": spread([r["registry_s"] for r in rows]), "total_s": spread(total),
                        "cpu_s": spread([r["cpu_s"] for r in rows]),
                        "hooks_s": spread([r["hooks_s"] for r in rows]), "hook_calls": rows[-1]["hook_calls"],
                        "overlay_active": rows[-1]["overlay_active"], "switched_off": rows[-1]["switched_off"],
                        "patched": rows[-1]["patched"]}
    with_overlay = result["overlay"]["total_s"]["median"]
    without = result["without"]["total_s"]["median"]
    result["delta_total_ms"] = (with_overlay - without) * 1e3
    result["delta_total_pct"] = (with_overlay / without - 1) * 100
    cpu_with, cpu_without = result["overlay"]["cpu_s"]["median"], result["without"]["cpu_s"]["median"]
    result["delta_cpu_ms"] = (cpu_with - cpu_without) * 1e3
    result["delta_cpu_pct"] = (cpu_with / cpu_without - 1) * 100
    result["hooks_pct_of_total"] = result["overlay"]["hooks_s"]["median"] / with_overlay * 100
    return result


def format_result(r: dict) -> str:
    def cell(s):
        return f"{s['median'] * 1e3:8.1f} ms (IQR {s['q1'] * 1e3:.1f}-{s['q3'] * 1e3:.1f}, " \
               f"min {s['min'] * 1e3:.1f}, max {s['max'] * 1e3:.1f})"
    lines = [f"sglang {r['version']}, {r['runs']} interleaved runs per mode (fresh process each); "
             f"sglang-pcie {r['sglang_pcie']}"]
    for mode in MODES:
        m = r[mode]
        lines.append(f"  {mode:8} import sglang {cell(m['import_sglang_s'])}")
        lines.append(f"  {'':8} + registry    {cell(m['registry_s'])}")
        lines.append(f"  {'':8} = total       {cell(m['total_s'])}")
        lines.append(f"  {'':8}   CPU time    {cell(m['cpu_s'])}")
    o = r["overlay"]
    lines.append(f"  overlay hooks (activation + patch hooks, {o['hook_calls']} calls): {cell(o['hooks_s'])}")
    lines.append(f"  switched off (not registered): {o['switched_off'] or 'none'}; hooks ran for: "
                 f"{', '.join(o['patched']) or 'none'}")
    lines.append(f"  overlay hooks are {r['hooks_pct_of_total']:.2f}% of the overlay run's total")
    lines.append(f"  difference of median totals: wall {r['delta_total_ms']:+.1f} ms ({r['delta_total_pct']:+.2f}%), "
                 f"CPU {r['delta_cpu_ms']:+.1f} ms ({r['delta_cpu_pct']:+.2f}%)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="0.5.9,0.5.23", help="comma-separated SGLang releases")
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per mode and release")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--no-install", action="store_true",
                        help="use the sglang-pcie already installed in the venvs instead of this checkout's HEAD")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs} is not a positive number")
    results = [measure(v, args.runs, not args.no_install) for v in args.versions.split(",")]
    for r in results:
        print(format_result(r))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
