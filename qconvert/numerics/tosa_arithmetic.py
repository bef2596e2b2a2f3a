"""TOSA 1.0's integer arithmetic outside RESCALE and TABLE (those are `qconvert.numerics.tosa`): the range
rules of accumulators and elementwise ops, MUL's rounding shift and CAST's conversions, as the reference model
(tosa-tools 2026.8.0) evaluates them. The emulator of TOSA graphs (backends/tosa/emulate.py) calls these; the
tests run the reference model on the same graphs.

NOTE: numpy in, numpy out; values are computed exactly in int64 (every product of two int32 fits) and then
checked against the spec's REQUIRE rules, which raise `TosaUnpredictable` (the reference model's status
UNPREDICTABLE) rather than wrap.

| rule                         | formula                                                                  |
|------------------------------|--------------------------------------------------------------------------|
| accumulate (CONV, MATMUL)    | exact sum of (x - x_zp) * (w - w_zp) + bias; REQUIRE it fits i32 / i48    |
| add / sub / sum              | exact; REQUIRE the result fits the type                                  |
| mul, i32 with shift > 0      | (a * b + 2**(shift-1)) >> shift   (round half up); REQUIRE fits i32      |
| mul, shift 0                 | a * b wrapped to int32 (its low 32 bits), as the reference model does     |
| cast int -> wider int        | sign extension (a bool is 0 or 1)                                        |
| cast int -> bool             | x != 0                                                                   |
| cast int -> narrower int     | truncation to the low bits (wraps, no saturation)                        |
| cast float -> int            | clamp(rne(x)) to the output range; NaN is not allowed                    |
"""

from __future__ import annotations

import numpy as np

from . import round_half_to_even
from .tosa import INTEGER_TYPES, TosaErrorIf, TosaUnpredictable

__all__ = [
    "CONTAINERS",
    "cast_integer",
    "cast_to_boolean",
    "float_to_integer",
    "multiply",
    "require_range",
    "signed_range",
]

# The numpy container of each TOSA integer type, as the reference model reads and writes it.
CONTAINERS: dict[str, np.dtype] = {
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i48": np.dtype(np.int64),
}
_MAX_MUL_SHIFT = 63


def signed_range(type_name: str) -> tuple[int, int]:
    """`[min, max]` of a TOSA signless integer type read as signed (i8, i16, i32, i48)."""
    bits = INTEGER_TYPES[type_name]
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def require_range(values: np.ndarray, type_name: str, what: str) -> np.ndarray:
    """Exact int64 `values` in the container of `type_name`; TosaUnpredictable when one does not fit (the
    spec's REQUIRE on accumulators and on ADD / SUB / REDUCE_SUM results: no wrap is defined)."""
    low, high = signed_range(type_name)
    values = np.asarray(values, np.int64)
    if values.size and (int(values.min()) < low or int(values.max()) > high):
        raise TosaUnpredictable(f"{what}: a result exceeds {type_name} (the spec REQUIREs it to fit)")
    return values.astype(CONTAINERS[type_name])


def multiply(a: np.ndarray, b: np.ndarray, shift: int, input_type: str) -> np.ndarray:
    """TOSA MUL of integers (broadcast), an int32 result: `a * b`, or for i32 inputs with `shift > 0`
    `(a * b + 2**(shift - 1)) >> shift` (the product in int64, rounded half up; REQUIRE: it fits int32); with
    shift 0 the product's low 32 bits (the reference model wraps). ERROR_IF: a shift other than 0 for i8 / i16
    inputs (the reference model ignores it instead), or outside [0, 63]."""
    if not 0 <= shift <= _MAX_MUL_SHIFT:
        raise TosaErrorIf(f"mul: shift must be within [0, {_MAX_MUL_SHIFT}], got {shift}")
    if input_type != "i32" and shift != 0:
        raise TosaErrorIf(f"mul: shift must be 0 for {input_type} inputs, got {shift}")
    product = np.asarray(a, np.int64) * np.asarray(b, np.int64)
    if shift == 0:
        # The low 32 bits: the reference model wraps an i32 product (an i8 / i16 one always fits).
        return cast_integer(product, "i32")
    product = np.right_shift(product + (np.int64(1) << np.int64(shift - 1)), np.int64(shift))
    return require_range(product, "i32", "mul")


def cast_integer(values: np.ndarray, output_type: str) -> np.ndarray:
    """TOSA CAST between integer types: sign extension to a wider type, truncation to the low bits of a
    narrower one (so 200 : i32 -> i8 is -56, not 127)."""
    bits = INTEGER_TYPES[output_type]
    patterns = np.asarray(values, np.int64) & ((1 << bits) - 1)
    signed = np.where(patterns >= 1 << (bits - 1), patterns - (1 << bits), patterns)
    return signed.astype(CONTAINERS[output_type])


def cast_to_boolean(values: np.ndarray) -> np.ndarray:
    """TOSA CAST from an integer type to bool: true where the value is not zero."""
    return np.asarray(values) != 0


def float_to_integer(values: np.ndarray, output_type: str) -> np.ndarray:
    """TOSA CAST from a float type to an integer: round half to even, then saturate to the output range.
    REQUIRE: no NaN (TosaUnpredictable)."""
    array = np.asarray(values)
    if np.any(np.isnan(array)):
        raise TosaUnpredictable("cast: a NaN cannot be cast to an integer")
    low, high = signed_range(output_type)
    rounded = round_half_to_even(array.astype(np.float64))
    return np.clip(rounded, low, high).astype(CONTAINERS[output_type])
