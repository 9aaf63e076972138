"""Where doctor reads the machine from, and its bounds: commands killed whole at their timeout (their output so far
kept), probes abandoned at theirs, a live run recorded and replayed, and no CUDA in the doctor process."""
from __future__ import annotations

import ast
import io
import json
import os
import sys
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

from sglang_pcie.tools import cli
from sglang_pcie.tools.doctor import p2p, p2p_child, report
from sglang_pcie.tools.doctor.world import NotVisible, RecordedWorld, RecordingWorld, World

DOCTOR = Path(report.__file__).parent


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_command_past_its_bound_is_killed_with_its_children_and_its_output_kept(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
              "print('doctor-p2p ' + '{\"event\": \"begin\", \"pair\": [0, 1], \"method\": \"copy-engine\"}', flush=True)\n"
              "time.sleep(600)\n")
    began = time.monotonic()
    done = World().run([sys.executable, "-c", script], timeout=3.0, key="p2p-copy-check GPU 0,1")
    assert done.timed_out and time.monotonic() - began < 60
    run = p2p.parse(done)
    assert run.begun == {"event": "begin", "pair": [0, 1], "method": "copy-engine"} and not run.done
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_a_missing_tool_and_a_missing_file_are_said_as_such(tmp_path):
    world = World(tmp_path)
    done = world.run(["no-such-tool-for-doctor", "-q"], timeout=5)
    assert done.missing and done.problem() == "`no-such-tool-for-doctor -q` not available (not installed)"
    try:
        world.read("/sys/class/iommu/nothing")
    except NotVisible as exc:
        assert str(exc) == "/sys/class/iommu/nothing: no such file"
    else:
        raise AssertionError("no NotVisible")


def test_a_probe_past_its_bound_is_abandoned():
    release, probes = threading.Event(), []
    result, problem = report.bounded("stuck", 0.2, lambda: release.wait(), probes)
    release.set()
    assert result is None and problem == "did not finish in 0 s" and probes[0]["timed_out"]
    result, problem = report.bounded("broken", 5, lambda: 1 / 0, probes)
    assert result is None and problem == "ZeroDivisionError: division by zero"


def test_a_live_run_recorded_then_replayed_gives_the_same_findings(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    out = tmp_path / "facts"
    live = cli.main(["doctor", "--json", "--record", str(out)])
    first = json.loads(capsys.readouterr().out)
    replayed = cli.main(["doctor", "--json", "--facts", str(out)])
    second = json.loads(capsys.readouterr().out)
    assert live == replayed
    # the same facts; a tool missing here reads "not installed there" from the recording
    assert [(f["id"], f["severity"], f["what"]) for f in first["findings"]] == [
        (f["id"], f["severity"], f["what"].replace("(not installed there)", "(not installed)"))
        for f in second["findings"]]
    assert (out / "commands.json").is_file()


def test_recording_keeps_files_listings_and_commands(tmp_path):
    world = RecordingWorld(tmp_path)
    text = world.read("/proc/self/status")
    names = world.listdir("/proc/self/fd")
    done = world.run([sys.executable, "-c", "print('hello')"], timeout=30, key="hello")
    world.run(["no-such-tool-for-doctor"], timeout=5)
    again = RecordedWorld(tmp_path)
    assert again.read("/proc/self/status") == text and again.listdir("/proc/self/fd") == names
    replay = again.run(["anything"], timeout=5, key="hello")
    assert (replay.stdout, replay.rc) == (done.stdout, 0) == ("hello\n", 0)
    assert again.run(["no-such-tool-for-doctor"], timeout=5).problem().endswith("(not installed there)")
    assert again.run(["never-run"], timeout=5).problem().endswith("(not in this recording)")


def test_the_copy_checks_events_are_what_the_parent_reads():
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        p2p_child.say("start", torch="2.11.0", cuda="13.0", nccl="2.28.3", capabilities=["9.0", "9.0"])
        p2p_child.say("begin", pair=[0, 1], method="sm-read")
        p2p_child.say("result", pair=[0, 1], peer=True, methods={"copy-engine": {"ok": True, "gbps": 300.0}})
        p2p_child.say("link", links={"0": {"current_link_speed": "32.0 GT/s PCIe"}})
        p2p_child.say("done")
    done = World().run([sys.executable, "-c", f"print({buffer.getvalue()!r}, end='')"], timeout=30)
    run = p2p.parse(done)
    assert run.done and run.begun is None and run.start["capabilities"] == ["9.0", "9.0"]
    assert run.results[(0, 1)]["methods"]["copy-engine"]["gbps"] == 300.0
    assert run.links == {0: {"current_link_speed": "32.0 GT/s PCIe"}}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_only_the_copy_check_child_touches_cuda_and_it_imports_nothing_of_the_package():
    gpu_libraries = {"torch", "pynvml", "cupy", "cuda", "triton", "flashinfer", "sglang"}
    for path in DOCTOR.glob("*.py"):
        if path.name != "p2p_child.py":
            assert not _imports(path) & gpu_libraries, path.name
    child = _imports(DOCTOR / "p2p_child.py")
    assert "sglang_pcie" not in child and child <= {"__future__", "ctypes", "json", "re", "sys", "threading", "time",
                                                    "torch"}
    module_level = {n.names[0].name for n in ast.parse((DOCTOR / "p2p_child.py").read_text()).body
                    if isinstance(n, ast.Import)}
    assert "torch" not in module_level  # imported inside start(): a missing torch is a reported fact, not a crash
    assert p2p.CHILD.is_file() and os.access(p2p.CHILD, os.R_OK)


def test_a_gpu_read_with_several_partners_keeps_its_fastest_link_reading():
    from sglang_pcie.tools.doctor.world import Completed

    slow = {"current_link_speed": "2.5 GT/s PCIe", "current_link_width": "16"}
    fast = {"current_link_speed": "32.0 GT/s PCIe", "current_link_width": "16"}
    lines = [{"event": "link", "links": {"0": fast, "1": slow}}, {"event": "link", "links": {"0": slow, "2": fast}}]
    run = p2p.parse(Completed("k", 0, "".join("doctor-p2p " + json.dumps(e) + "\n" for e in lines)))
    assert run.links == {0: fast, 1: slow, 2: fast}
