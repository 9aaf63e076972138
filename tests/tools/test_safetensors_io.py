"""safetensors with the standard library only (sglang_pcie/tools/safetensors_io.py): the layout the format
defines (8-byte length, a JSON header padded with spaces to 8 bytes, offsets relative to the data section), values
round-tripped per dtype, BF16 rounded to nearest even, zeros as holes, and every malformed file one ValueError naming
what is wrong. (test_check_drafter_checkpoint.py compares files with the real safetensors library.)"""
from __future__ import annotations

import json
import math
import struct

import pytest

from sglang_pcie.tools import safetensors_io as st


def layout(path):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return length, raw[8:8 + length], raw[8 + length:]


def test_the_file_is_a_length_a_padded_json_header_and_the_tensors_in_order(tmp_path):
    path = tmp_path / "m.safetensors"
    st.write_safetensors(path, {"b": ("I32", [2], st.pack("I32", [1, -2])), "a": ("U8", [3], bytes([7, 8, 9]))},
                         metadata={"format": "pt", "n": 3})
    length, header, data = layout(path)
    assert length % 8 == 0 and header == header.rstrip(b" ") + b" " * (length - len(header.rstrip(b" ")))
    parsed = json.loads(header)
    assert list(parsed) == ["__metadata__", "b", "a"] and parsed["__metadata__"] == {"format": "pt", "n": "3"}
    assert parsed["b"] == {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}
    assert parsed["a"] == {"dtype": "U8", "shape": [3], "data_offsets": [8, 11]}
    assert data == struct.pack("<2i", 1, -2) + bytes([7, 8, 9])
    assert st.read_metadata(path) == {"format": "pt", "n": "3"}
    assert st.read_header(path) == {k: v for k, v in parsed.items() if k != "__metadata__"}


@pytest.mark.parametrize("dtype, values", [
    ("U8", [0, 255]), ("I8", [-128, 127]), ("I16", [-32768, 5]), ("U16", [65535, 1]), ("I32", [-2 ** 31, 9]),
    ("U32", [2 ** 32 - 1, 0]), ("I64", [-2 ** 63, 2 ** 62]), ("U64", [2 ** 64 - 1, 3]), ("F32", [1.5, -0.25]),
    ("F64", [math.pi, -1e300]), ("F16", [0.5, -2.0, 65504.0]), ("BOOL", [True, False, True]),
    ("BF16", [1.0, -3.5, 0.0078125]),
])
def test_values_round_trip_for_every_dtype_the_reader_decodes(tmp_path, dtype, values):
    path = tmp_path / "t.safetensors"
    st.write_safetensors(path, {"pad": ("U8", [1], b"\x01"), "t": (dtype, [len(values)], st.pack(dtype, values))})
    got_dtype, shape, decoded = st.read_tensor(path, "t")
    assert (got_dtype, shape, list(decoded)) == (dtype, [len(values)], values)


@pytest.mark.parametrize("bits, rounded", [
    (0x3F808000, 0x3F80),  # halfway, the lower half is even: down
    (0x3F818000, 0x3F82),  # halfway, the upper half is even: up
    (0x3F808001, 0x3F81),  # above halfway: up
    (0x3F807FFF, 0x3F80),  # below halfway: down
])
def test_bf16_is_rounded_to_nearest_even(bits, rounded):
    value = struct.unpack("<f", struct.pack("<I", bits))[0]
    assert st.pack("BF16", [value]) == struct.pack("<H", rounded)


def test_zeros_are_a_hole_that_still_counts_in_the_size(tmp_path):
    path = tmp_path / "sparse.safetensors"
    st.write_safetensors(path, {"w": ("F32", [1024, 1024], None), "x": ("U8", [2], b"\x05\x06"),
                                "tail": ("BF16", [4096, 512], None)})  # a trailing hole
    header = st.read_header(path)
    length = layout(path)[0]
    assert path.stat().st_size == 8 + length + 4 * 1024 * 1024 + 2 + 2 * 4096 * 512
    assert path.stat().st_blocks * 512 < 1024 * 1024  # not written: a hole (the disk holds the header and x)
    assert list(st.read_tensor(path, "x")[2]) == [5, 6] and header["x"]["data_offsets"] == [4 * 1024 * 1024,
                                                                                          4 * 1024 * 1024 + 2]
    assert set(st.read_tensor(path, "w")[2]) == {0.0}


def test_writing_bytes_of_the_wrong_size_names_the_tensor(tmp_path):
    with pytest.raises(ValueError, match=r"^tensor 'w': 7 bytes given, F32 \[2\] needs 8$"):
        st.write_safetensors(tmp_path / "x.safetensors", {"w": ("F32", [2], b"\0" * 7)})


@pytest.mark.parametrize("call, message", [
    (lambda: st.element_size("F4"), "unknown safetensors dtype 'F4'"),
    (lambda: st.pack("F8_E4M3", [1.0]), "pack() cannot encode dtype 'F8_E4M3'"),
])
def test_dtypes_it_cannot_handle_are_named(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_a_dtype_without_a_decoder_is_named_on_reading(tmp_path):
    path = tmp_path / "f8.safetensors"
    st.write_safetensors(path, {"f": ("F8_E5M2", [2], b"\x01\x02")})
    assert st.read_header(path)["f"]["data_offsets"] == [0, 2]
    with pytest.raises(ValueError, match=r"read_tensor\(\) cannot decode dtype 'F8_E5M2'"):
        st.read_tensor(path, "f")


def header_file(path, header, data: bytes = b"", length: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize("header, data, length, message", [
    (b"", b"", None, None),  # placeholder: replaced below by a 5-byte file
    ({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\0\0", 10 ** 6,
     r"header length 1000000 does not fit in a \d+-byte file \(limit 104857600\)"),
    (b"{nope", b"", None, "header is not valid JSON"),
    (b"[1, 2]", b"", None, "header is a list, not a JSON object"),
    ({"w": {"dtype": "U8", "shape": [2]}}, b"\0\0", None, r"tensor 'w' has a malformed header entry"),
    ({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 3]}}, b"\0\0\0", None,
     r"tensor 'w' spans bytes 0\.\.3, U8 \[2\] needs 2"),
    ({"w": {"dtype": "U8", "shape": [2], "data_offsets": [-1, 1]}}, b"\0\0", None,
     r"tensor 'w' spans bytes -1\.\.1, U8 \[2\] needs 2"),
    ({"w": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\0\0", None,
     r"tensor 'w' ends at byte 3 of a 2-byte data section: truncated file"),
])
def test_a_malformed_file_is_one_value_error_naming_it(tmp_path, header, data, length, message):
    path = tmp_path / "bad.safetensors"
    if message is None:
        path.write_bytes(b"\x01\x02\x03\x04\x05")
        message = r"5 bytes, too short for a safetensors header length"
    else:
        header_file(path, header, data, length)
    with pytest.raises(ValueError, match=message):
        st.read_header(path)


def test_a_header_exactly_filling_the_file_is_read(tmp_path):
    path = header_file(tmp_path / "empty.safetensors", {"__metadata__": {"k": "v"}})
    assert st.read_header(path) == {} and st.read_metadata(path) == {"k": "v"}
    with pytest.raises(ValueError, match="does not fit"):  # one byte more than the file holds
        st.read_header(header_file(tmp_path / "short.safetensors", b"{}", length=3))


def test_a_tensor_that_ends_exactly_at_the_end_of_the_file_is_read(tmp_path):
    path = header_file(tmp_path / "exact.safetensors", {"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}},
                       b"\x03\x04")
    assert list(st.read_tensor(path, "w")[2]) == [3, 4]


def test_metadata_absent_or_not_an_object_reads_as_empty(tmp_path):
    assert st.read_metadata(header_file(tmp_path / "a.safetensors", {})) == {}
    assert st.read_metadata(header_file(tmp_path / "b.safetensors", {"__metadata__": ["x"]})) == {}


def test_reading_a_tensor_that_is_not_there_is_a_key_error(tmp_path):
    path = tmp_path / "m.safetensors"
    st.write_safetensors(path, {"w": ("U8", [1], b"\x01")})
    with pytest.raises(KeyError, match="no tensor named 'v'"):
        st.read_tensor(path, "v")
