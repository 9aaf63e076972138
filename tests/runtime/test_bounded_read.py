"""A file a user hands us cannot hang, exhaust or crash the process reading it: FIFOs, devices, folders, huge and
deeply nested files and hung mounts are each one reason. Files are made by the tests; anything that could block
runs in a child process with a timeout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from sglang_pcie.runtime import bounded_read
from sglang_pcie.runtime.bounded_read import Unreadable, nesting_depth, read_json
from support import REPO


def reason(path, **bounds) -> str:
    with pytest.raises(Unreadable) as exc:
        read_json(path, **bounds)
    return str(exc.value)


def test_a_small_json_file_reads(tmp_path):
    path = tmp_path / "f.json"
    path.write_text('{"a": [1, {"b": "[[[ not brackets"}]}')
    assert read_json(path) == {"a": [1, {"b": "[[[ not brackets"}]}


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "absent.json")


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    code = f"from sglang_pcie.runtime.bounded_read import read_json, Unreadable\ntry:\n    read_json({str(fifo)!r})\n" \
           "except Unreadable as exc:\n    print(exc)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.stdout.strip() == "is a FIFO, not a regular file", done.stderr


@pytest.mark.parametrize("device, kind", [("/dev/zero", "a character device"), ("/dev/urandom", "a character device")])
def test_a_link_to_a_device_is_refused_without_reading_it(tmp_path, device, kind):
    link = tmp_path / "tuned.json"
    link.symlink_to(device)
    assert reason(link) == f"is {kind}, not a regular file"


def test_a_folder_is_refused(tmp_path):
    assert reason(tmp_path) == "is a folder, not a regular file"


def test_a_huge_file_is_refused_by_its_size_before_reading(tmp_path):
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(10 * 2**30)  # sparse: 10 GiB that take no disk
    assert reason(huge) == f"is {10 * 2**30} bytes, more than the {bounded_read.MAX_BYTES} read from such a file"


def test_deep_nesting_is_refused_before_the_parser_recurses(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert reason(deep) == f"nests 100000 levels deep (at most {bounded_read.MAX_DEPTH})"
    assert nesting_depth('{"a": "{{{{", "b": ["\\"]"]}') == 2  # brackets in strings (escaped quotes too) do not count


def test_bytes_that_are_not_utf8_or_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe{}")
    assert reason(bad).startswith("is not UTF-8 text")
    bad.write_text("{not json")
    assert reason(bad).startswith("is not valid JSON")


def test_a_read_that_never_returns_is_given_up_after_the_time_bound(tmp_path, monkeypatch):
    # A hung network mount: the reading thread blocks for good; the caller gets its answer and goes on.
    release = threading.Event()
    monkeypatch.setattr(bounded_read, "_read_bytes", lambda path, limit: release.wait())
    try:
        assert reason(tmp_path / "f.json", time_bound_s=0.2) == "not read within 0.2 s (a hung network filesystem?)"
    finally:
        release.set()


def test_the_tuned_file_reader_names_the_file_and_the_reason(tmp_path):
    from sglang_pcie.runtime import tuned_file

    fifo = tmp_path / "nccl-tuned.json"
    os.mkfifo(fifo)
    tuned = tuned_file.read_named({tuned_file.TUNED_FILE_VAR: str(fifo)})
    assert tuned.config is None
    assert tuned.error == (f"SGLANG_PCIE_TUNED_FILE={str(fifo)!r}: tuned NCCL file {fifo} is a FIFO, not a regular"
                           " file; nothing applied from it")
    assert json.dumps(tuned.error)  # one printable line


def test_the_caps_are_inclusive_and_a_file_that_grows_past_the_size_cap_while_read_is_refused(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("[[1]]")  # 5 bytes, nesting 2
    assert read_json(path, max_bytes=5, max_depth=2) == [[1]]
    assert reason(path, max_bytes=4) == "is 5 bytes, more than the 4 read from such a file"
    assert reason(path, max_depth=1) == "nests 2 levels deep (at most 1)"
    # a regular file whose size says 0 but that reads longer (as /proc's do): the cap holds while reading
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(Unreadable, match=r"^is more than the 10 bytes read from such a file$"):
        bounded_read.read_text("/proc/self/status", max_bytes=10)
