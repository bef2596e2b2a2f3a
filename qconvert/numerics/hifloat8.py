"""HiFloat8 (HiF8), Ascend's tapered 8-bit float: decode every code, encode floats with the documented rule.

NOTE: numpy in, numpy out; codes are uint8 arrays (numpy has no HiF8 dtype). Sources: CANN
asc-devkit `内置数据类型.md`, the SDK sample encoder `matmul_fp8/scripts/hif8.py`, and Luo et al.,
"Ascend HiFloat8 Format for Deep Learning" (arXiv:2409.16626); summarised in the project's
quantization reference, section 5.6.

Layout `S | D (dot, a prefix code) | E | M`; the dot code says how many exponent and mantissa bits follow:

| dot    | class | E bits | M bits | exponent Ev      | value                          |
|--------|-------|--------|--------|------------------|--------------------------------|
| `11`   | D4    | 4      | 1      | ±8 … ±15         | (-1)^S · 2^Ev · (1 + M/2)      |
| `10`   | D3    | 3      | 2      | ±4 … ±7          | (-1)^S · 2^Ev · (1 + M/4)      |
| `01`   | D2    | 2      | 3      | ±2, ±3           | (-1)^S · 2^Ev · (1 + M/8)      |
| `001`  | D1    | 1      | 3      | ±1               | (-1)^S · 2^Ev · (1 + M/8)      |
| `0001` | D0    | 0      | 3      | 0                | (-1)^S · (1 + M/8)             |
| `0000` | DML   | -      | 3      | -                | (-1)^S · 2^(M - 23), M = 1..7  |

The exponent field is sign-magnitude with an implicit leading one: its top bit is the exponent's sign (1 =
negative), the other bits are the low bits of |Ev| (D2 `E = 0b1x` -> Ev = -(2 + x)). Specials: `0x00` is the
only zero, `0x80` is NaN, `0x6F` / `0xEF` (D4, Ev = +15, M = 1) are ±Inf, so the largest finite value is
`0x6E` = 2^15 = 32768 and the smallest positive is `0x01` = 2^-22.

Encoding (float32 -> HiF8), as the SDK sample encoder does it:
- CAST_ROUND ("TA", the default and the documented mode): the nearest HiF8 value, ties away from zero. The
  grid is the set of finite codes, so a carry moves to the next binade and dot class by itself, and the
  denormal binades (powers of two) round at their arithmetic midpoints (1.5 · 2^k). The tie between 0 and
  2^-22 (|x| = 2^-23) goes away from zero to 2^-22; below it, 0 (HiF8 has no -0: a negative result of 0 is
  0x00).
- overflow: |x| >= 1.25 · 2^15 = 40960 (the midpoint between 32768 and the Inf code's 49152) and ±Inf give
  ±Inf (`0x6F`/`0xEF`), or ±32768 (`0x6E`/`0xEE`) when saturating. NaN gives `0x80`.
- CAST_HYBRID: TA where the value's binade exponent |Ev| < 4, stochastic rounding ("SSR") elsewhere: the
  neighbour above is taken with probability (x - below) / (above - below). The hardware's random bits cannot
  be reproduced, so HYBRID results are only distributed like the hardware's, never bit-exact.
- every other round mode is not supported for HiF8 and, as the API does, falls back to CAST_ROUND.

Note: the project's reference (A.5) lists 2^-23 -> 0x00 ("values below 2^-22 flush to 0"); the sample
encoder's code takes the tie away from zero (2^-23 -> 0x01), and en_dtypes' hifloat8 agrees with the code, so
we follow it.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "HIFLOAT8_INF",
    "HIFLOAT8_MAX",
    "HIFLOAT8_MAX_CODE",
    "HIFLOAT8_NAN",
    "HIFLOAT8_OVERFLOW_THRESHOLD",
    "decode_hifloat8",
    "encode_hifloat8",
    "hifloat8_dot_class",
    "hifloat8_grid",
]

HIFLOAT8_NAN = 0x80
HIFLOAT8_INF = 0x6F  # | 0x80 for -Inf
HIFLOAT8_MAX_CODE = 0x6E  # | 0x80 for the most negative finite value
HIFLOAT8_MAX = 32768.0
HIFLOAT8_OVERFLOW_THRESHOLD = 1.25 * 2.0**15  # the midpoint between 2**15 and 1.5 * 2**15 (the Inf code)
_HYBRID_TA_EXPONENT_LIMIT = 4  # HYBRID rounds ties away below |Ev| = 4, stochastically from there on

# (dot class name, prefix mask, prefix value, exponent bits, mantissa bits) of the normal classes.
_CLASSES: tuple[tuple[str, int, int, int, int], ...] = (
    ("D4", 0x60, 0x60, 4, 1),
    ("D3", 0x60, 0x40, 3, 2),
    ("D2", 0x60, 0x20, 2, 3),
    ("D1", 0x70, 0x10, 1, 3),
    ("D0", 0x78, 0x08, 0, 3),
)


def _decode_magnitude(payload: int) -> tuple[str, float]:
    """The dot class and value of a 7-bit payload (no sign), by the table above; Inf for 0x6F."""
    if payload == HIFLOAT8_INF:
        return "D4", float("inf")
    for name, mask, prefix, exponent_bits, mantissa_bits in _CLASSES:
        if payload & mask != prefix:
            continue
        mantissa = payload & ((1 << mantissa_bits) - 1)
        significand = 1.0 + mantissa / (1 << mantissa_bits)
        if exponent_bits == 0:
            return name, significand
        field = (payload >> mantissa_bits) & ((1 << exponent_bits) - 1)
        negative = field >> (exponent_bits - 1)
        # Implicit leading one: |Ev| = 2**(E-1) + the low E-1 bits.
        magnitude = (1 << (exponent_bits - 1)) | (field & ((1 << (exponent_bits - 1)) - 1))
        return name, float(np.ldexp(significand, -magnitude if negative else magnitude))
    mantissa = payload & 0x07
    return "DML", 0.0 if mantissa == 0 else float(np.ldexp(1.0, mantissa - 23))


def _build_tables() -> tuple[np.ndarray, tuple[str, ...]]:
    values = np.empty(256, np.float64)
    classes: list[str] = []
    for code in range(256):
        name, magnitude = _decode_magnitude(code & 0x7F)
        values[code] = -magnitude if code & 0x80 else magnitude
        classes.append(name)
    values[HIFLOAT8_NAN] = np.nan  # the "negative zero" pattern is NaN
    classes[HIFLOAT8_NAN] = "NaN"
    classes[0] = "zero"
    return values, tuple(classes)


_VALUES, _CLASS_NAMES = _build_tables()
_VALUES.setflags(write=False)
# The non-negative finite grid, ascending, and the code of each point (0x00, then 0x01 ... 0x6E by value).
_POSITIVE_CODES = np.array([c for c in range(128) if np.isfinite(_VALUES[c])], np.uint8)
_POSITIVE_CODES = _POSITIVE_CODES[np.argsort(_VALUES[_POSITIVE_CODES], kind="stable")]
_POSITIVE_VALUES = _VALUES[_POSITIVE_CODES]
_POSITIVE_CODES.setflags(write=False)
_POSITIVE_VALUES.setflags(write=False)


def hifloat8_grid() -> tuple[np.ndarray, np.ndarray]:
    """`(values, codes)`: every non-negative finite HiF8 value ascending (float64, exact) and its code."""
    return _POSITIVE_VALUES, _POSITIVE_CODES


def hifloat8_dot_class(codes: np.ndarray | int) -> np.ndarray:
    """The class of each code: 'D4', 'D3', 'D2', 'D1', 'D0', 'DML' (denormal), 'zero' or 'NaN' (Inf is D4)."""
    return np.asarray(_CLASS_NAMES, dtype=object)[np.asarray(codes, np.uint8)]


def decode_hifloat8(codes: np.ndarray | int) -> np.ndarray:
    """HiF8 codes (uint8) -> float32, exactly (every HiF8 value is a float32): 0x80 NaN, 0x6F/0xEF ±Inf."""
    array = np.asarray(codes)
    if array.dtype.kind not in "ui":
        raise TypeError(f"HiFloat8 codes must be integers, got {array.dtype}")
    if array.size and (array.min() < 0 or array.max() > 0xFF):
        raise ValueError(f"HiFloat8 codes must lie in [0, 255], got [{array.min()}, {array.max()}]")
    return _VALUES.astype(np.float32)[array.astype(np.uint8)]


def encode_hifloat8(
    x: np.ndarray | float,
    *,
    saturate: bool = True,
    round_mode: str = "round",
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """float -> HiF8 codes (uint8), ties away from zero (CAST_ROUND); see the module docstring for every rule.

    `x` is read as float32 (half, bfloat16 and float32 inputs convert exactly; a float64 is rounded to float32
    first, as the hardware only casts from float32 / half / bf16). `saturate`: overflow and ±Inf give ±32768
    instead of ±Inf. `round_mode`: "round" (default), "hybrid" (stochastic above |Ev| >= 4, drawing from
    `rng`, a fresh default generator when None); any other mode falls back to "round" as the API does.
    """
    values = np.asarray(x, dtype=np.float32).astype(np.float64)
    magnitude = np.abs(values)
    finite = np.isfinite(values)
    safe = np.where(finite, magnitude, 0.0)
    above_index = np.minimum(np.searchsorted(_POSITIVE_VALUES, safe, side="left"), _POSITIVE_VALUES.size - 1)
    below_index = np.where(_POSITIVE_VALUES[above_index] == safe, above_index, np.maximum(above_index - 1, 0))
    above = _POSITIVE_VALUES[above_index]
    below = _POSITIVE_VALUES[below_index]
    # float64 differences of float32 values are exact, so the tie test has no rounding error.
    take_above = (above - safe) <= (safe - below)
    if str(round_mode) == "hybrid":
        exponent = np.frexp(np.where(safe > 0, safe, 1.0))[1] - 1
        stochastic = np.abs(exponent) >= _HYBRID_TA_EXPONENT_LIMIT
        generator = rng if rng is not None else np.random.default_rng()
        draw = generator.random(values.shape)
        width = np.where(above > below, above - below, 1.0)
        take_above = np.where(stochastic, draw < (safe - below) / width, take_above)
    codes = np.where(take_above, _POSITIVE_CODES[above_index], _POSITIVE_CODES[below_index]).astype(np.uint8)
    overflow = (magnitude >= HIFLOAT8_OVERFLOW_THRESHOLD) & ~np.isnan(values)  # includes ±Inf
    codes = np.where(overflow, np.uint8(HIFLOAT8_MAX_CODE if saturate else HIFLOAT8_INF), codes)
    negative = (values < 0) & (codes != 0)
    codes = np.where(negative, codes | np.uint8(0x80), codes)
    return np.where(np.isnan(values), np.uint8(HIFLOAT8_NAN), codes).astype(np.uint8)
