"""bf16 tensors as raw little-endian bytes, from the standard library."""
from __future__ import annotations

import random
import struct

BF16_ONE = struct.pack("<H", 0x3F80)
# High byte of a bf16: sign bit kept from the random byte, exponent bits 7..1 fixed to 0b0111100, so with the
# random low byte's top bit as the exponent's last bit the magnitude is 2^-7 .. 2^-5 (like std 0.02 weights).
_HIGH_BYTE = bytes((b & 0x80) | 0x3C for b in range(256))
_FLIP_SIGN = bytes(b ^ 0x80 for b in range(256))


def bits(value: float) -> int:
    """The bf16 nearest to value, as its 16 bits (ties away from zero)."""
    return (struct.unpack("<I", struct.pack("<f", value))[0] + 0x8000) >> 16


def pack(value: float) -> bytes:
    return struct.pack("<H", bits(value))


def rounded(value: float) -> float:
    """value rounded to bf16, as a float."""
    return struct.unpack("<f", struct.pack("<I", bits(value) << 16))[0]


def random_bf16(rng: random.Random, count: int) -> bytes:
    raw = bytearray(rng.randbytes(2 * count))
    raw[1::2] = raw[1::2].translate(_HIGH_BYTE)
    return bytes(raw)


def signed_bf16(rng: random.Random, count: int, magnitude: float) -> bytes:
    """count bf16 values +-magnitude (rounded to bf16, so their rms is magnitude within 0.4%), random signs."""
    b = bits(magnitude)
    raw = bytearray(struct.pack("<H", b) * count)
    raw[1::2] = rng.randbytes(count).translate(bytes((x & 0x80) | (b >> 8 & 0x7F) for x in range(256)))
    return bytes(raw)


def negated(values: bytes) -> bytes:
    """The same bf16 values with every sign flipped (exact)."""
    raw = bytearray(values)
    raw[1::2] = raw[1::2].translate(_FLIP_SIGN)
    return bytes(raw)


def zeros(rows: int, cols: int):
    return ("BF16", [rows, cols], bytes(2 * rows * cols))


def ones(n: int):
    return ("BF16", [n], BF16_ONE * n)
