"""qconvert.numerics.hifloat8 against the HiFloat8 definition, code by code.

No engine implements HiF8 here, so the oracle is the format's table (CANN `内置数据类型.md`, the paper, the
quantization reference section 5.6) re-derived independently below from the bit strings, plus the worked
vectors of the reference's appendix A.5 and the SDK sample encoder's rules (ties away from zero on the grid of
finite values, overflow at 1.25 * 2**15, saturate vs Inf).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from conftest import require_module

from qconvert.numerics.hifloat8 import (
    HIFLOAT8_INF,
    HIFLOAT8_MAX_CODE,
    HIFLOAT8_NAN,
    decode_hifloat8,
    encode_hifloat8,
    hifloat8_dot_class,
    hifloat8_grid,
)

# dot prefix -> (class, exponent bits, mantissa bits), read straight from the format's table.
_PREFIXES = {
    "11": ("D4", 4, 1),
    "10": ("D3", 3, 2),
    "01": ("D2", 2, 3),
    "001": ("D1", 1, 3),
    "0001": ("D0", 0, 3),
}


def table_value(code: int) -> tuple[str, float]:
    """The class and value of one code, parsed from its bit string by the documented table."""
    bits = f"{code:08b}"
    sign = -1.0 if bits[0] == "1" else 1.0
    rest = bits[1:]
    if code == 0x80:
        return "NaN", math.nan
    if rest == "0000000":
        return "zero", 0.0
    if rest.startswith("0000"):
        return "DML", sign * 2.0 ** (int(rest[4:], 2) - 23)
    for prefix, (name, exponent_bits, mantissa_bits) in _PREFIXES.items():
        if not rest.startswith(prefix):
            continue
        field = rest[len(prefix) : len(prefix) + exponent_bits]
        mantissa = int(rest[len(prefix) + exponent_bits :], 2)
        exponent = 0
        if exponent_bits:
            magnitude = int("1" + field[1:], 2)  # implicit leading one
            exponent = -magnitude if field[0] == "1" else magnitude
        if name == "D4" and exponent == 15 and mantissa == 1:
            return name, sign * math.inf
        return name, sign * 2.0**exponent * (1 + mantissa / 2**mantissa_bits)
    raise AssertionError(f"no class for {bits}")


ALL_CODES = np.arange(256, dtype=np.uint8)
TABLE = [table_value(int(code)) for code in ALL_CODES]
EXPECTED_VALUES = np.array([value for _, value in TABLE])


def test_every_code_decodes_to_the_table_value() -> None:
    decoded = decode_hifloat8(ALL_CODES)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded.astype(np.float64), EXPECTED_VALUES)  # NaN == NaN here
    assert list(hifloat8_dot_class(ALL_CODES)) == [name for name, _ in TABLE]


def test_class_sizes_and_binades() -> None:
    classes = [name for name, _ in TABLE]
    # Per sign: D4, D3, D2 have 32 codes, D1 16, D0 8, the 0000 prefix 8 (zero / NaN + 7 denormals).
    assert {name: classes.count(name) for name in set(classes)} == {
        "D4": 64, "D3": 64, "D2": 64, "D1": 32, "D0": 16, "DML": 14, "zero": 1, "NaN": 1,
    }  # fmt: skip
    positive = EXPECTED_VALUES[(EXPECTED_VALUES > 0) & np.isfinite(EXPECTED_VALUES)]
    binades = {math.frexp(value)[1] for value in positive}
    assert len(binades) == 38  # 31 normal binades (exponents -15..15) + 7 denormal powers of two
    assert positive.min() == 2.0**-22 and positive.max() == 2.0**15
    assert len(set(positive.tolist())) == positive.size  # no value has two codes


@pytest.mark.parametrize(
    ("code", "value"),
    [(0x08, 1.0), (0x09, 1.125), (0x0C, 1.5), (0x14, 3.0), (0x1C, 0.75), (0xAE, -14.0), (0x4A, 96.0),
     (0x6E, 32768.0), (0x7F, 1.5 * 2**-15), (0x70, 2.0**-8), (0x07, 2.0**-16), (0x01, 2.0**-22),
     (0x6F, math.inf), (0xEF, -math.inf), (0xEE, -32768.0)],
)  # fmt: skip
def test_documented_decodings(code: int, value: float) -> None:
    assert float(decode_hifloat8(np.uint8(code))) == value


def test_nan_code() -> None:
    assert np.isnan(decode_hifloat8(np.uint8(HIFLOAT8_NAN)))
    assert encode_hifloat8(np.float32(np.nan)) == HIFLOAT8_NAN


@pytest.mark.parametrize("saturate", [True, False])
def test_every_finite_code_round_trips(saturate: bool) -> None:
    finite = np.isfinite(EXPECTED_VALUES)
    encoded = encode_hifloat8(EXPECTED_VALUES[finite].astype(np.float32), saturate=saturate)
    expected = ALL_CODES[finite]
    np.testing.assert_array_equal(encoded, expected)


def test_every_rounding_boundary_ties_away_from_zero() -> None:
    """Between each pair of neighbours: the midpoint goes to the larger magnitude, one float32 ulp either side
    goes to the nearer one. Covers every binade, dot class change, and denormal step, both signs."""
    values, codes = hifloat8_grid()
    lower, upper = values[:-1], values[1:]
    midpoint = ((lower + upper) / 2).astype(np.float32)
    assert np.all(midpoint.astype(np.float64) == (lower + upper) / 2)  # exact in float32
    below = np.nextafter(midpoint, np.float32(0))
    above = np.nextafter(midpoint, np.float32(np.inf))
    for sign, sign_bit in ((1, 0), (-1, 0x80)):
        lower_codes = np.where(codes[:-1] == 0, 0, codes[:-1] | sign_bit)
        upper_codes = codes[1:] | sign_bit
        np.testing.assert_array_equal(encode_hifloat8(sign * midpoint), upper_codes)
        np.testing.assert_array_equal(encode_hifloat8(sign * below), lower_codes)
        np.testing.assert_array_equal(encode_hifloat8(sign * above), upper_codes)


@pytest.mark.parametrize(
    ("value", "code"),
    [(1.0, 0x08), (1.0625, 0x09), (1.5, 0x0C), (3.0, 0x14), (0.75, 0x1C), (-14.0, 0xAE), (100.0, 0x4A),
     (32768.0, 0x6E), (40959.0, 0x6E), (2.0**-16, 0x07), (2.0**-22, 0x01), (15.5, 0x40), (2.0**-24, 0x00),
     (0.0, 0x00), (-0.0, 0x00), (-(2.0**-24), 0x00)],
)  # fmt: skip
def test_documented_encodings(value: float, code: int) -> None:
    """Appendix A.5's vectors (sample encoder, CAST_ROUND), 15.5 -> 16 (a carry into D3), and zeros."""
    assert encode_hifloat8(np.float32(value)) == code


def test_the_lowest_tie_follows_the_sample_encoder() -> None:
    """2**-23 is the midpoint of 0 and 2**-22: the sample encoder's code rounds it away to 0x01 (the reference
    text says 0x00; see the module docstring), anything below goes to 0."""
    assert encode_hifloat8(np.float32(2.0**-23)) == 0x01
    assert encode_hifloat8(np.nextafter(np.float32(2.0**-23), np.float32(0))) == 0x00
    assert encode_hifloat8(np.float32(-(2.0**-23))) == 0x81


@pytest.mark.parametrize(("saturate", "positive", "negative"), [(True, 0x6E, 0xEE), (False, 0x6F, 0xEF)])
def test_overflow_saturates_or_gives_inf(saturate: bool, positive: int, negative: int) -> None:
    threshold = np.float32(40960.0)
    just_below = np.nextafter(threshold, np.float32(0))
    values = np.array([threshold, 1e30, np.inf, -threshold, -np.inf, just_below, -just_below], np.float32)
    expected = [positive, positive, positive, negative, negative, HIFLOAT8_MAX_CODE, HIFLOAT8_MAX_CODE | 0x80]
    np.testing.assert_array_equal(encode_hifloat8(values, saturate=saturate), expected)
    assert HIFLOAT8_INF == 0x6F


def test_unsupported_round_modes_fall_back_to_ties_away() -> None:
    values = np.array([1.0625, -1.0625, 2.0**-23, 100.0], np.float32)
    expected = encode_hifloat8(values)
    for mode in ("rint", "floor", "ceil", "trunc", "odd", "none"):
        np.testing.assert_array_equal(encode_hifloat8(values, round_mode=mode), expected)


def test_hybrid_is_ties_away_below_exponent_4_and_stochastic_above() -> None:
    rng = np.random.default_rng(7)
    small = np.array([1.0625, 3.75, 0.09375, 15.5, -7.5], np.float32)  # |Ev| < 4
    np.testing.assert_array_equal(
        encode_hifloat8(small, round_mode="hybrid", rng=rng), encode_hifloat8(small)
    )
    draws = 20000
    value = np.full(draws, 34.0, np.float32)  # between 32 and 40 (D3, Ev = 5): up with probability 2/8
    codes = encode_hifloat8(value, round_mode="hybrid", rng=rng)
    up, down = encode_hifloat8(np.float32(40.0)), encode_hifloat8(np.float32(32.0))
    assert set(np.unique(codes).tolist()) == {int(up), int(down)}
    assert abs(np.mean(codes == up) - 0.25) < 0.02
    exact = encode_hifloat8(np.full(100, 48.0, np.float32), round_mode="hybrid", rng=rng)
    assert np.all(exact == encode_hifloat8(np.float32(48.0)))  # representable values never move


def test_float16_and_bfloat16_inputs_encode_as_their_float32_values() -> None:
    rng = np.random.default_rng(3)
    wide = (rng.standard_normal(4096) * np.exp2(rng.uniform(-20, 16, 4096))).astype(np.float32)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        with np.errstate(over="ignore"):  # half overflows to Inf beyond 65504: encoded as overflow too
            narrow = wide.astype(dtype)
        np.testing.assert_array_equal(encode_hifloat8(narrow), encode_hifloat8(narrow.astype(np.float32)))
        np.testing.assert_array_equal(encode_hifloat8(narrow), table_encode(narrow.astype(np.float64)))


def table_encode(values: np.ndarray) -> np.ndarray:
    """Brute force over the table: nearest finite value, ties to the larger magnitude, overflow at 40960."""
    finite = np.isfinite(EXPECTED_VALUES) & (EXPECTED_VALUES >= 0)
    grid, grid_codes = EXPECTED_VALUES[finite], ALL_CODES[finite]
    out = []
    for value in values.tolist():
        if abs(value) >= 40960:
            out.append(0x6E | (0x80 if value < 0 else 0))
            continue
        distance = np.abs(grid - abs(value))
        best = np.flatnonzero(distance == distance.min())
        code = int(grid_codes[best[np.argmax(grid[best])]])
        out.append(code | 0x80 if value < 0 and code else code)
    return np.array(out, np.uint8)


def test_bad_codes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        decode_hifloat8(np.array([256]))
    with pytest.raises(TypeError, match="integers"):
        decode_hifloat8(np.array([1.0]))


@pytest.mark.engine
def test_agrees_with_en_dtypes_hifloat8() -> None:
    """en_dtypes' hifloat8 (an independent C++ implementation) decodes all 256 codes alike and encodes alike
    in its Inf mode (numpy casts do not saturate): random float32 over every binade, and every rounding
    boundary with one ulp either side. Its saturating path is not compared: it clamps only from 49152, so
    [40960, 49152) becomes Inf there where the sample encoder gives 32768."""
    en_dtypes = require_module("en_dtypes")
    hifloat8 = en_dtypes.hifloat8
    np.testing.assert_array_equal(ALL_CODES.view(hifloat8).astype(np.float32), decode_hifloat8(ALL_CODES))
    rng = np.random.default_rng(11)
    samples = (rng.standard_normal(100_000) * np.exp2(rng.uniform(-26, 17, 100_000))).astype(np.float32)
    values, _ = hifloat8_grid()
    midpoints = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    neighbours = [np.nextafter(midpoints, np.float32(0)), np.nextafter(midpoints, np.float32(np.inf))]
    boundaries = np.concatenate([midpoints, *neighbours, [40960.0, 1e30, np.inf, np.nan]])
    every = np.concatenate([samples, boundaries, -boundaries]).astype(np.float32)
    np.testing.assert_array_equal(
        every.astype(hifloat8).view(np.uint8), encode_hifloat8(every, saturate=False)
    )
