"""Read and write the safetensors format with the standard library only (no numpy, no torch, no safetensors).

A safetensors file is: 8 bytes little-endian header length N, N bytes of JSON header, then the raw tensor
bytes. The header maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative
to the end of the header) and may carry ``"__metadata__"`` (str -> str). Readers here touch only the header and,
for ``read_tensor``, that one tensor's bytes: a checkpoint of any size costs one small read.

Stable API (shared by check-drafter and the benchmark's tiny test models):
- ``write_safetensors(path, tensors, metadata=None)``: tensors maps name -> (dtype, shape, raw little-endian bytes);
  bytes None means zeros, left as a hole in a sparse file (a header-valid 1 TB checkpoint costs no disk).
- ``read_header(path) -> dict``: name -> {"dtype", "shape", "data_offsets"}, validated.
- ``read_metadata(path) -> dict``: the ``__metadata__`` block, or {}.
- ``read_tensor(path, name) -> (dtype, shape, values)``: values flat, as an ``array.array`` (or a list for
  BOOL / BF16 / F16 / F8 types, decoded to Python bool / float).
- ``pack(dtype, values) -> bytes``: flat Python numbers to raw little-endian bytes, for writers.
"""
from __future__ import annotations

import array
import json
import os
import struct
import sys
from pathlib import Path

# dtype -> (bytes per element, array/struct type code or None where the stdlib has none)
DTYPES = {
    "BOOL": (1, "B"),
    "U8": (1, "B"),
    "I8": (1, "b"),
    "I16": (2, "h"),
    "U16": (2, "H"),
    "I32": (4, "i"),
    "U32": (4, "I"),
    "I64": (8, "q"),
    "U64": (8, "Q"),
    "F16": (2, "e"),
    "BF16": (2, None),
    "F32": (4, "f"),
    "F64": (8, "d"),
    "F8_E4M3": (1, None),
    "F8_E5M2": (1, None),
}
# array.array has no 'e' (half) code; struct does.
_ARRAY_CODES = {"B", "b", "h", "H", "i", "I", "q", "Q", "f", "d"}
# A real header is kilobytes to a few megabytes (one entry per tensor); more than this is a corrupt length.
MAX_HEADER_BYTES = 100 * 1024 * 1024


def element_size(dtype: str) -> int:
    try:
        return DTYPES[dtype][0]
    except KeyError:
        raise ValueError(f"unknown safetensors dtype {dtype!r}") from None


def numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def pack(dtype: str, values) -> bytes:
    """Flat Python numbers -> raw little-endian bytes of ``dtype`` (BF16 is rounded to nearest even)."""
    values = list(values)
    if dtype == "BOOL":
        return bytes(1 if v else 0 for v in values)
    if dtype == "BF16":
        out = bytearray()
        for v in values:
            bits = struct.unpack("<I", struct.pack("<f", float(v)))[0]
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            out += struct.pack("<H", bits & 0xFFFF)
        return bytes(out)
    size, code = DTYPES.get(dtype, (None, None))
    if code is None:
        raise ValueError(f"pack() cannot encode dtype {dtype!r}")
    return struct.pack(f"<{len(values)}{code}", *values)


def write_safetensors(path, tensors: dict, metadata: dict | None = None) -> None:
    """Write ``tensors`` (name -> (dtype, shape, raw little-endian bytes or None for zeros)) to ``path``, in the
    given order."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    blobs = []
    for name, (dtype, shape, data) in tensors.items():
        shape = [int(d) for d in shape]
        expected = numel(shape) * element_size(dtype)
        if data is None:
            data = expected  # a hole of this many zero bytes
        elif len(data) != expected:
            raise ValueError(f"tensor {name!r}: {len(data)} bytes given, {dtype} {shape} needs {expected}")
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + expected]}
        offset += expected
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header with spaces to an 8-byte boundary
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for data in blobs:
            if isinstance(data, int):
                f.seek(data, os.SEEK_CUR)
            else:
                f.write(data)
        f.truncate()  # a trailing hole still counts towards the file size


def _read_raw_header(path) -> tuple[dict, int, int]:
    """(parsed header, byte offset where tensor data begins, file size)."""
    path = Path(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: {size} bytes, too short for a safetensors header length")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise ValueError(f"{path}: header length {length} does not fit in a {size}-byte file"
                             f" (limit {MAX_HEADER_BYTES}): truncated or not a safetensors file")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is a {type(header).__name__}, not a JSON object")
    return header, 8 + length, size


def read_metadata(path) -> dict:
    meta = _read_raw_header(path)[0].get("__metadata__") or {}
    return dict(meta) if isinstance(meta, dict) else {}


def read_header(path) -> dict:
    """name -> {"dtype", "shape", "data_offsets"} for every tensor, each entry checked against the file size."""
    return _entries(path)[0]


def _entries(path) -> tuple[dict, int]:
    header, data_start, size = _read_raw_header(path)
    data_size = size - data_start
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = entry["dtype"]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{path}: tensor {name!r} has a malformed header entry {entry!r}") from None
        expected = numel(shape) * element_size(dtype)
        if end - begin != expected or begin < 0:
            raise ValueError(f"{path}: tensor {name!r} spans bytes {begin}..{end}, {dtype} {shape}"
                             f" needs {expected}")
        if end > data_size:
            raise ValueError(f"{path}: tensor {name!r} ends at byte {end} of a {data_size}-byte data section:"
                             f" truncated file")
        out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
    return out, data_start


def _decode(dtype: str, data: bytes):
    if dtype == "BOOL":
        return [b != 0 for b in data]
    if dtype == "BF16":
        halves = array.array("H", data)
        if sys.byteorder == "big":
            halves.byteswap()
        return list(struct.unpack(f"<{len(halves)}f", b"".join(struct.pack("<I", h << 16) for h in halves)))
    code = DTYPES[dtype][1]
    if code == "e":
        return list(struct.unpack(f"<{len(data) // 2}e", data))
    if code is None:
        raise ValueError(f"read_tensor() cannot decode dtype {dtype!r}")
    values = array.array(code, data)
    if sys.byteorder == "big" and values.itemsize > 1:
        values.byteswap()
    return values


def read_tensor(path, name: str):
    """(dtype, shape, flat values) of one tensor, reading only its bytes."""
    entries, data_start = _entries(path)
    if name not in entries:
        raise KeyError(f"{path}: no tensor named {name!r}")
    entry = entries[name]
    begin, end = entry["data_offsets"]
    with open(path, "rb") as f:
        f.seek(data_start + begin)
        data = f.read(end - begin)
    if len(data) != end - begin:
        raise ValueError(f"{path}: tensor {name!r} truncated ({len(data)} of {end - begin} bytes)")
    return entry["dtype"], entry["shape"], _decode(entry["dtype"], data)
