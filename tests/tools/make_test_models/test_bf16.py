"""bf16 tensors from the standard library (sglang_pcie/tools/make_test_models/bf16.py): nearest bf16 with ties away
from zero, random weights of magnitude 2^-7..2^-5 with random signs, +-magnitude tensors, exact negation, zeros
and ones."""
from __future__ import annotations

import random
import struct

import pytest

from sglang_pcie.tools.make_test_models import bf16


def values(raw: bytes) -> list[float]:
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack(f"<{len(raw) // 2}H", raw)]


@pytest.mark.parametrize("f32_bits, expected", [
    (0x3F808000, 0x3F81),  # halfway between 0x3F80 and 0x3F81: away from zero (not to even)
    (0x3F818000, 0x3F82),
    (0xBF808000, 0xBF81),  # negative: away from zero too
    (0x3F807FFF, 0x3F80),  # below halfway: down
    (0x3F800000, 0x3F80),  # exact
])
def test_bits_is_the_nearest_bf16_ties_away_from_zero(f32_bits, expected):
    value = struct.unpack("<f", struct.pack("<I", f32_bits))[0]
    assert bf16.bits(value) == expected and bf16.pack(value) == struct.pack("<H", expected)
    assert bf16.rounded(value) == struct.unpack("<f", struct.pack("<I", expected << 16))[0]


def test_random_weights_are_2_to_the_minus_7_to_minus_5_with_both_signs_from_the_seed():
    raw = bf16.random_bf16(random.Random(3), 4096)
    got = values(raw)
    assert len(raw) == 2 * 4096 and all(2 ** -7 <= abs(v) < 2 ** -5 for v in got)
    assert min(abs(v) for v in got) == 2 ** -7 and max(abs(v) for v in got) > 2 ** -6  # both exponents used
    assert 1800 < sum(v < 0 for v in got) < 2300  # random signs
    assert raw == bf16.random_bf16(random.Random(3), 4096) != bf16.random_bf16(random.Random(4), 4096)


@pytest.mark.parametrize("magnitude", [0.125, 0.02, 3.0])
def test_signed_values_have_the_magnitude_rounded_to_bf16_and_random_signs(magnitude):
    got = values(bf16.signed_bf16(random.Random(0), 2000, magnitude))
    assert {abs(v) for v in got} == {bf16.rounded(magnitude)}
    assert abs(bf16.rounded(magnitude) / magnitude - 1) < 0.004  # "rms within 0.4%"
    assert 850 < sum(v < 0 for v in got) < 1150


def test_negated_flips_every_sign_exactly():
    raw = bf16.random_bf16(random.Random(1), 300) + bf16.pack(0.0)
    flipped = bf16.negated(raw)
    assert values(flipped)[:-1] == [-v for v in values(raw)[:-1]] and bf16.negated(flipped) == raw
    assert struct.unpack("<H", flipped[-2:])[0] == 0x8000  # -0.0: only the sign bit changed


def test_zeros_and_ones_are_tensors_of_that_shape():
    assert bf16.zeros(2, 3) == ("BF16", [2, 3], bytes(12))
    assert bf16.ones(3) == ("BF16", [3], bf16.BF16_ONE * 3) and values(bf16.BF16_ONE) == [1.0]
