"""TOSA 1.0's integer arithmetic: RESCALE (apply_scale_32 / apply_scale_16), the (multiplier, shift) of a real
scale, AVG_POOL2D's reciprocal_scale and TABLE, each bit-exact with the TOSA reference model.

NOTE: numpy in, numpy out, all arithmetic in int64 (every intermediate of the spec fits: |value| < 2**48,
multiplier < 2**31, so `value * multiplier + round` < 2**63). Pinned to tosa-tools 2026.8.0's
`tosa_reference_model` (TOSA spec 1.0, `scale_helpers.tosac`, `RESCALE.tosac`, `TABLE.tosac`); the tests
(tests/numerics/test_tosa_numerics.py) run that engine on the same inputs, and the conformance test runs
TOSA's own generated RESCALE and TABLE cases. Notation as in `qconvert.numerics`; `>>` is an arithmetic
(sign-propagating) shift.

| rule                         | formula                                                                  |
|------------------------------|--------------------------------------------------------------------------|
| apply_scale_32, SINGLE_ROUND | (v * m + 2**(s-1)) >> s                       round half up (toward +inf)|
| apply_scale_32, DOUBLE_ROUND | as SINGLE, plus sign(v) * 2**30 in the rounding term when s > 31         |
| apply_scale_16               | (v * m + 2**(s-1)) >> s, v up to 48 bits, m 16 bits                      |
| rescale                      | clip(apply_scale(x - zp_in, m[c], s[c]) + zp_out), c = last index        |
| compute_multiplier_and_shift | (mant, e) = frexp(scale); m = round_away(mant * 2**31); shift = 31 - e   |
| reciprocal_scale(n)          | k = bit_length(n - 1); m = ((2**30 + 1) << k) // n; shift = 30 + k       |
| table, i8                    | table[x + 128]                                                           |
| table, i16                   | (t[i] << 7) + (t[i+1] - t[i]) * f, i = (x >> 7) + 256, f = x & 127       |
| intdiv                       | a / b truncated toward zero (i32)                                        |

SINGLE_ROUND rounds ties up (-1.5 -> -1), unlike ONNX's half to even; DOUBLE_ROUND is TFLite / gemmlowp's
two-step rounding (half up in the high multiply, then half away from zero). Violations of the spec's
ERROR_IF rules raise `TosaErrorIf` (the reference model reports the graph as ERROR), of its REQUIRE rules
`TosaUnpredictable` (reported UNPREDICTABLE); both are ValueErrors.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from . import round_half_away_from_zero, round_half_to_even

__all__ = [
    "INTEGER_TYPES",
    "MultiplierShift",
    "TosaError",
    "TosaErrorIf",
    "TosaRounding",
    "TosaUnpredictable",
    "apply_scale_16",
    "apply_scale_32",
    "average_pool_output",
    "build_table_i8",
    "build_table_i16",
    "compute_multiplier_and_shift",
    "intdiv",
    "reciprocal_scale",
    "rescale",
    "table",
]

# TOSA's integer element types -> bit width; tensors are signless, RESCALE's unsigned flags reinterpret them.
INTEGER_TYPES: dict[str, int] = {"i8": 8, "i16": 16, "i32": 32, "i48": 48}
# The numpy container the reference model reads and writes for each type (i48 lives in int64).
_CONTAINERS: dict[str, np.dtype] = {
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i48": np.dtype(np.int64),
}
_TYPE_OF_DTYPE: dict[np.dtype, str] = {
    np.dtype(np.int8): "i8",
    np.dtype(np.uint8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.uint16): "i16",
    np.dtype(np.int32): "i32",
}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_TABLE_I8_ENTRIES = 256
_TABLE_I16_ENTRIES = 513
_TABLE_FRACTION_BITS = 7  # an i16 TABLE input is 9 bits of index and 7 of fraction


class TosaRounding(StrEnum):
    """RESCALE's `rounding_mode` (TOSA 1.0 `rounding_mode_t`). INEXACT_ROUND is not a rule: an implementation
    may return anything within the spec's error bound, so there is nothing bit-exact to emulate."""

    SINGLE = "single"  # SINGLE_ROUND: one half-up rounding of v * m / 2**s
    DOUBLE = "double"  # DOUBLE_ROUND (extension EXT-DOUBLEROUND): gemmlowp's two-step rounding when s > 31


class TosaError(ValueError):
    """An input the TOSA spec does not define a result for."""


class TosaErrorIf(TosaError):
    """A violated ERROR_IF rule: the graph is invalid (reference model status ERROR)."""


class TosaUnpredictable(TosaError):
    """A violated REQUIRE rule: the result is unpredictable (reference model status UNPREDICTABLE)."""


class MultiplierShift(NamedTuple):
    """A RESCALE scale, `multiplier * 2**-shift`: int32 multipliers (int16 values at scale16), int8 shifts."""

    multiplier: np.ndarray
    shift: np.ndarray


def _require(condition: bool | np.bool_, message: str) -> None:
    if not condition:
        raise TosaUnpredictable(message)


def _error_if(condition: bool | np.bool_, message: str) -> None:
    if condition:
        raise TosaErrorIf(message)


def _check_scale_arguments(multiplier: np.ndarray, shift: np.ndarray, name: str) -> None:
    _require(np.all(multiplier >= 0), f"{name}: multiplier must be >= 0, got {multiplier.min()}")
    out_of_range = (shift < 2) | (shift > 62)
    _require(
        not np.any(out_of_range), f"{name}: shift must be within [2, 62], got {shift[out_of_range].flat[:1]}"
    )


def apply_scale_32(
    value: np.ndarray | int, multiplier: np.ndarray | int, shift: np.ndarray | int, double_round: bool = False
) -> np.ndarray:
    """TOSA `apply_scale_32(value: i32, multiplier: i32, shift: i8, double_round)`, elementwise (broadcast).

    `round = 2**(shift-1)`, plus `2**30` (value >= 0) or `-2**30` (value < 0) when `double_round` and
    `shift > 31` (the sign of the value, not of the product); result `(value * multiplier + round) >> shift`.
    REQUIREs (else TosaUnpredictable): `multiplier >= 0`, `2 <= shift <= 62`, `-2**(shift-1) <= value <
    2**(shift-1)` (lets hardware pre-shift the value), and the result in int32. Returns int32.
    """
    value64, multiplier64, shift64 = np.broadcast_arrays(
        np.asarray(value, np.int64), np.asarray(multiplier, np.int64), np.asarray(shift, np.int64)
    )
    _check_scale_arguments(multiplier64, shift64, "apply_scale_32")
    half = np.left_shift(np.int64(1), shift64 - 1)
    _require(
        np.all((value64 >= -half) & (value64 < half)),
        "apply_scale_32: value out of [-2**(shift-1), 2**(shift-1))",
    )
    if np.any((value64 < _INT32_MIN) | (value64 > _INT32_MAX)) or np.any(multiplier64 > _INT32_MAX):
        raise TosaUnpredictable("apply_scale_32: value and multiplier must be int32")
    rounding = half
    if double_round:
        rounding = half + np.where(shift64 > 31, np.where(value64 >= 0, 1 << 30, -(1 << 30)), 0)
    result = np.right_shift(value64 * multiplier64 + rounding, shift64)
    _require(np.all((result >= _INT32_MIN) & (result <= _INT32_MAX)), "apply_scale_32: result exceeds int32")
    return result.astype(np.int32)


def apply_scale_16(
    value: np.ndarray | int, multiplier: np.ndarray | int, shift: np.ndarray | int
) -> np.ndarray:
    """TOSA `apply_scale_16(value: i48, multiplier: i16, shift: i8)`: `(value * multiplier + 2**(shift-1)) >>
    shift`, elementwise. REQUIREs: `multiplier >= 0`, `2 <= shift <= 62`, the result in int32. Returns int32.
    """
    value64, multiplier64, shift64 = np.broadcast_arrays(
        np.asarray(value, np.int64), np.asarray(multiplier, np.int64), np.asarray(shift, np.int64)
    )
    _check_scale_arguments(multiplier64, shift64, "apply_scale_16")
    if np.any((value64 < -(2**47)) | (value64 >= 2**47)) or np.any(multiplier64 > 2**15 - 1):
        raise TosaUnpredictable("apply_scale_16: value must be int48 and multiplier int16")
    result = np.right_shift(value64 * multiplier64 + np.left_shift(np.int64(1), shift64 - 1), shift64)
    _require(np.all((result >= _INT32_MIN) & (result <= _INT32_MAX)), "apply_scale_16: result exceeds int32")
    return result.astype(np.int32)


def compute_multiplier_and_shift(scale: np.ndarray | float, scale_width: int = 32) -> MultiplierShift:
    """MLIR `tosa::computeMultiplierAndShift(scale, m, shift, scaleWidth)` (QuantUtils.cpp), per element.

    `(mant, e) = frexp(scale)`, `m = round_half_away(mant * 2**(w-1))` (C++ `std::round`; Python's `round`
    is half to even and differs on exact .5 mantissas); `m == 2**(w-1)` renormalises to `(2**(w-2), e+1)`;
    `shift = (w-1) - e`; a shift above 62 is clamped, the multiplier shifted right by `min(31, shift-62)`
    (precision is lost; below ~2**-62 the multiplier is 0 and the output is the zero point). 1.0 ->
    (2**30, 30); 0.5 -> (2**30, 31); 0 -> (0, 31). ValueError for a negative or non-finite scale, and for a
    scale too large for TOSA (shift < 2: scale >= 2**29 at width 32, 2**13 at width 16), where MLIR returns
    false. `scale_width` 32 (int32 multiplier, RESCALE scale32) or 16.
    """
    if scale_width not in (16, 32):
        raise ValueError(f"scale width must be 16 or 32, got {scale_width}")
    scales = np.asarray(scale, np.float64)
    if not np.all(np.isfinite(scales) & (scales >= 0)):
        bad = scales[~(np.isfinite(scales) & (scales >= 0))].flat[0]
        raise ValueError(f"a TOSA scale must be finite and non-negative, got {bad}")
    mantissa, exponent = np.frexp(scales)
    top = 1 << (scale_width - 1)
    # mantissa * 2**(w-1) only moves the exponent, so the product is exact and so is the rounding.
    multiplier = round_half_away_from_zero(mantissa * top).astype(np.int64)
    renormalise = multiplier == top
    multiplier = np.where(renormalise, top // 2, multiplier)
    shift = (scale_width - 1) - (exponent.astype(np.int64) + renormalise)
    too_large = shift < 2
    if np.any(too_large):
        raise ValueError(
            f"scale {scales[too_large].flat[0]!r} is too large for a TOSA {scale_width}-bit rescale (shift "
            f"{shift[too_large].flat[0]} < 2)"
        )
    clamp = shift > 62
    multiplier = np.where(clamp, np.right_shift(multiplier, np.minimum(31, shift - 62)), multiplier)
    shift = np.where(clamp, 62, shift)
    return MultiplierShift(multiplier.astype(np.int32), shift.astype(np.int8))


def reciprocal_scale(count: np.ndarray | int) -> MultiplierShift:
    """TOSA `reciprocal_scale(value)` (AVG_POOL2D's division by the element count), elementwise.

    `k = 32 - clz32(n - 1)` (so `2**(k-1) < n <= 2**k`), `multiplier = ((2**30 + 1) << k) // n` (in
    [2**30, 2**31)), `shift = 30 + k`. ValueError for n < 1 (a REQUIRE of the spec).
    """
    counts = np.asarray(count, np.int64)
    if np.any(counts < 1) or np.any(counts > _INT32_MAX):
        raise TosaUnpredictable("reciprocal_scale: the element count must be in [1, 2**31)")
    below = counts - 1
    bits = np.zeros_like(counts)
    for bit in range(32):
        bits = np.where(below >= (1 << bit), bit + 1, bits)
    multiplier = np.left_shift(np.int64((1 << 30) + 1), bits) // counts
    return MultiplierShift(multiplier.astype(np.int32), (30 + bits).astype(np.int8))


def average_pool_output(
    sums: np.ndarray, counts: np.ndarray | int, output_zp: int, output_type: str
) -> np.ndarray:
    """The integer end of AVG_POOL2D: `clip(apply_scale_32(sum, reciprocal_scale(count), false) + zp_out)`.

    `sums` are the window sums of `x - input_zp` (int32), `counts` the elements each window averaged
    (padding excluded, as TOSA defines it). Returns the `output_type` ("i8" / "i16") container.
    """
    multiplier, shift = reciprocal_scale(counts)
    scaled = apply_scale_32(sums, multiplier, shift, double_round=False).astype(np.int64) + int(output_zp)
    low, high = _signed_range(INTEGER_TYPES[output_type])
    return np.clip(scaled, low, high).astype(_CONTAINERS[output_type])


def _signed_range(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _extend(values: np.ndarray, bits: int, unsigned: bool) -> np.ndarray:
    """The int64 value of `bits`-bit patterns: zero-extended when `unsigned`, sign-extended otherwise."""
    patterns = np.asarray(values, np.int64) & ((1 << bits) - 1)
    if unsigned:
        return patterns
    return np.where(patterns >= 1 << (bits - 1), patterns - (1 << bits), patterns)


def _zero_point(zp: int, bits: int, unsigned: bool, name: str) -> int:
    """A zero point given in either reading of its `bits` bits (u8 128 == i8 -128), as RESCALE reads it."""
    if not -(1 << (bits - 1)) <= int(zp) < 1 << bits:
        raise TosaErrorIf(f"rescale: {name} {zp} does not fit in {bits} bits")
    return int(_extend(np.asarray(zp), bits, unsigned))


def _check_rescale_attributes(
    input_type: str,
    output_type: str,
    scale32: bool,
    rounding: TosaRounding,
    per_channel: bool,
    rank: int,
    input_unsigned: bool,
    output_unsigned: bool,
) -> None:
    """RESCALE's attribute ERROR_IFs, as the reference model checks them before evaluating."""
    _error_if(output_type == "i48", "rescale: the output type must be i8, i16 or i32")
    _error_if(scale32 and input_type == "i48", "rescale: scale32 with an i48 input")
    _error_if(not scale32 and rounding == TosaRounding.DOUBLE, "rescale: DOUBLE_ROUND needs scale32")
    _error_if(input_unsigned and output_unsigned, "rescale: input_unsigned and output_unsigned both set")
    _error_if(output_type == "i32" and input_unsigned, "rescale: an i32 output with input_unsigned")
    _error_if(
        input_type in ("i32", "i48") and output_unsigned,
        f"rescale: an {input_type} input with output_unsigned",
    )
    _error_if(input_type in ("i32", "i48") and input_unsigned, f"rescale: an unsigned {input_type} input")
    _error_if(output_type == "i32" and output_unsigned, "rescale: an unsigned i32 output")
    _error_if(per_channel and rank < 1, "rescale: per_channel on a rank-0 input")


def _check_zero_point(zp: int, type_name: str, unsigned: bool, side: str) -> None:
    """RESCALE's zero-point ERROR_IFs: any value for i8, {0, 32768} for unsigned i16, 0 otherwise."""
    if type_name == "i8":
        return
    if type_name == "i16" and unsigned:
        _error_if(zp not in (0, 32768), f"rescale: {side}_zp of unsigned i16 must be 0 or 32768, got {zp}")
        return
    _error_if(zp != 0, f"rescale: {side}_zp must be 0 for {type_name}, got {zp}")


def rescale(
    values: np.ndarray,
    multiplier: np.ndarray | int,
    shift: np.ndarray | int,
    *,
    output_type: str,
    input_type: str | None = None,
    input_zp: int = 0,
    output_zp: int = 0,
    scale32: bool = True,
    rounding: TosaRounding = TosaRounding.SINGLE,
    per_channel: bool = False,
    input_unsigned: bool = False,
    output_unsigned: bool = False,
) -> np.ndarray:
    """TOSA RESCALE over an array, as the reference model's OpRescale evaluates it.

    Per element: `v = extend(x) - extend(input_zp)` (zero-extended when `input_unsigned`, else
    sign-extended), `r = apply_scale_32(v, m[c], s[c], rounding == DOUBLE)` if `scale32` else
    `apply_scale_16(v, m[c], s[c])`, `c` the last index when `per_channel` (else 0); `r + extend(output_zp)`
    must be int32; the output is that clipped to `[0, 2**b - 1]` (output_unsigned) or the signed range of
    `output_type`. Returns the signless container of `output_type` (int8 / int16 / int32; an unsigned output
    is its bit pattern: `.view(np.uint8)` reads it).

    `input_type` defaults from `values.dtype` (int8 / uint8 -> i8, int16 / uint16 -> i16, int32 -> i32); i48
    values come as int64 with `input_type="i48"`. Zero points may be given in either reading of their bits
    (128 or -128 for an unsigned i8). `multiplier` / `shift` have one entry, or `shape[-1]` when per channel.
    """
    values = np.asarray(values)
    if input_type is None:
        if values.dtype not in _TYPE_OF_DTYPE:
            raise ValueError(f"rescale: give input_type for {values.dtype} values")
        input_type = _TYPE_OF_DTYPE[values.dtype]
    for type_name in (input_type, output_type):
        if type_name not in INTEGER_TYPES:
            raise ValueError(
                f"rescale: unknown TOSA integer type {type_name!r}; expected one of {list(INTEGER_TYPES)}"
            )
    rounding = TosaRounding(rounding)
    _check_rescale_attributes(
        input_type, output_type, scale32, rounding, per_channel, values.ndim, input_unsigned, output_unsigned
    )
    in_bits, out_bits = INTEGER_TYPES[input_type], INTEGER_TYPES[output_type]
    input_zero = _zero_point(input_zp, in_bits, input_unsigned, "input_zp")
    output_zero = _zero_point(output_zp, out_bits, output_unsigned, "output_zp")
    _check_zero_point(input_zero, input_type, input_unsigned, "input")
    _check_zero_point(output_zero, output_type, output_unsigned, "output")

    channels = values.shape[-1] if per_channel else 1
    multipliers = np.asarray(multiplier, np.int64).reshape(-1)
    shifts = np.asarray(shift, np.int64).reshape(-1)
    if multipliers.size != channels or shifts.size != channels:
        raise TosaErrorIf(
            f"rescale: multiplier and shift need {channels} entries, got {multipliers.size} and {shifts.size}"
        )
    scale_bits = 32 if scale32 else 16
    low_m, high_m = _signed_range(scale_bits)
    if np.any((multipliers < low_m) | (multipliers > high_m)) or np.any((shifts < -128) | (shifts > 127)):
        raise ValueError(f"rescale: multipliers must be int{scale_bits} and shifts int8")

    if not per_channel:  # one scale for the whole tensor keeps a rank-0 input rank 0
        multipliers, shifts = multipliers[0], shifts[0]
    shifted = _extend(values, in_bits, input_unsigned) - input_zero
    if scale32:
        scaled = apply_scale_32(shifted, multipliers, shifts, double_round=rounding == TosaRounding.DOUBLE)
    else:
        scaled = apply_scale_16(shifted, multipliers, shifts)
    result = scaled.astype(np.int64) + output_zero
    _require(
        np.all((result >= _INT32_MIN) & (result <= _INT32_MAX)),
        "rescale: result plus output_zp exceeds int32",
    )
    low, high = (0, (1 << out_bits) - 1) if output_unsigned else _signed_range(out_bits)
    clipped = np.clip(result, low, high)
    return _extend(clipped, out_bits, unsigned=False).astype(_CONTAINERS[output_type])


def intdiv(dividend: np.ndarray, divisor: np.ndarray) -> np.ndarray:
    """TOSA INTDIV of i32 tensors (numpy broadcasting): the quotient truncated toward zero, int32.

    REQUIRE: no divisor is 0, and no INT32_MIN / -1 (else TosaUnpredictable)."""
    a, b = np.asarray(dividend).astype(np.int64), np.asarray(divisor).astype(np.int64)
    _require(bool(np.all(b != 0)), "intdiv: a divisor is zero")
    _require(not bool(np.any((a == -(2**31)) & (b == -1))), "intdiv: INT32_MIN / -1 exceeds int32")
    quotient = np.abs(a) // np.abs(np.broadcast_to(b, np.broadcast_shapes(a.shape, b.shape)))
    return (np.sign(a) * np.sign(b) * quotient).astype(np.int32)


def table(values: np.ndarray, lookup: np.ndarray) -> np.ndarray:
    """TOSA TABLE: i8 values with a 256-entry i8 table -> `lookup[x + 128]` (int8); i16 values with a
    513-entry i16 table -> int32 `(lookup[i] << 7) + (lookup[i + 1] - lookup[i]) * f`, `i = (x >> 7) + 256`,
    `f = x & 127` (a 16.7 fixed-point interpolation: the output has 7 more fraction bits than the table).

    REQUIRE (i16): every slope used fits int16 (else TosaUnpredictable). ERROR_IF: another table size or type.
    """
    values = np.asarray(values)
    lookup = np.asarray(lookup)
    if values.dtype == np.int8:
        _error_if(
            lookup.dtype != np.int8 or lookup.shape != (_TABLE_I8_ENTRIES,),
            "table: an i8 input needs an i8[256] table",
        )
        return lookup[values.astype(np.int64) + 128]
    if values.dtype == np.int16:
        _error_if(
            lookup.dtype != np.int16 or lookup.shape != (_TABLE_I16_ENTRIES,),
            "table: an i16 input needs an i16[513] table",
        )
        x = values.astype(np.int64)
        index = (x >> _TABLE_FRACTION_BITS) + (1 << 8)
        fraction = x & ((1 << _TABLE_FRACTION_BITS) - 1)
        base = lookup.astype(np.int64)[index]
        slope = lookup.astype(np.int64)[index + 1] - base
        _require(
            np.all((slope >= -(2**15)) & (slope <= 2**15 - 1)),
            "table: a slope of the i16 table exceeds int16",
        )
        return ((base << _TABLE_FRACTION_BITS) + slope * fraction).astype(np.int32)
    raise TosaErrorIf(f"table: the input must be i8 or i16, got {values.dtype}")


def _quantized(real: np.ndarray, scale: float, zero_point: int, bits: int) -> np.ndarray:
    """`clamp(rne(real / scale) + zp)` in float64 (ONNX QuantizeLinear's order), signed `bits` range."""
    low, high = _signed_range(bits)
    with np.errstate(over="ignore", invalid="ignore"):
        steps = round_half_to_even(np.asarray(real, np.float64) / scale)
    return np.clip(np.nan_to_num(steps, nan=0.0) + zero_point, low, high).astype(np.int64)


def build_table_i8(
    function: Callable[[np.ndarray], np.ndarray],
    input_scale: float,
    input_zp: int,
    output_scale: float,
    output_zp: int,
) -> np.ndarray:
    """The i8[256] TABLE computing `Q_out(function(DQ_in(x)))` for every int8 x (entry `x + 128`).

    `DQ_in(x) = (x - input_zp) * input_scale` and `Q_out(y) = clamp(rne(y / output_scale) + output_zp, -128,
    127)`, both in float64 (`function` takes and returns float64 arrays; NaN quantizes to the zero point).
    An 8-bit table is exact: TABLE then returns this quantization for every input.
    """
    codes = np.arange(-128, 128, dtype=np.int64)
    real = (codes - input_zp).astype(np.float64) * float(input_scale)
    return _quantized(function(real), output_scale, output_zp, 8).astype(np.int8)


def build_table_i16(
    function: Callable[[np.ndarray], np.ndarray],
    input_scale: float,
    input_zp: int,
    output_scale: float,
    output_zp: int,
    *,
    midpoint_correction: bool = True,
) -> np.ndarray:
    """The i16[513] TABLE whose interpolation approximates `Q_out(function(DQ_in(x)))` for int16 x.

    Entry `k` samples the knot `x_k = -32768 + 128 k` (the input where TABLE's index is k and its fraction 0;
    x_512 = 32768 is only interpolated towards): `Q_out(function(DQ_in(x_k)))` as in `build_table_i8`, 16-bit.
    With `midpoint_correction` (TFLite's `gen_lut`, which upstream's TOSA legalizations follow) each entry but
    the last is lowered by half the error the interpolation makes at the segment's midpoint,
    `rne((rne(y_k) + y_{k+1}) / 2) - rne(y_mid)` (y in output steps), which halves the worst error of convex
    pieces. TABLE's int32 result approximates `128 * Q_out(...)` (7 fraction bits): a `rescale` by 2**-7
    (multiplier 2**30, shift 37) brings it back to i16.
    """
    knots = -32768 + 128 * np.arange(_TABLE_I16_ENTRIES, dtype=np.int64)
    real = (knots - input_zp).astype(np.float64) * float(input_scale)
    entries = _quantized(function(real), output_scale, output_zp, 16)
    if midpoint_correction:
        with np.errstate(over="ignore", invalid="ignore"):
            steps = np.asarray(function(real), np.float64) / output_scale
            midpoints = np.asarray(function(real[:-1] + 64 * float(input_scale)), np.float64) / output_scale
        interpolated = round_half_to_even((round_half_to_even(steps[:-1]) + steps[1:]) / 2)
        bias = round_half_to_even((interpolated - round_half_to_even(midpoints)) / 2)
        bias = np.nan_to_num(bias, nan=0.0, posinf=0.0, neginf=0.0).astype(np.int64)
        entries[:-1] = np.clip(entries[:-1] - bias, -(2**15), 2**15 - 1)
    return entries.astype(np.int16)
