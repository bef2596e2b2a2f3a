"""onnxruntime's static-quantization parameter rules (quantize_static, QDQ), one function each.

NOTE: numpy (+ ml_dtypes) in, numpy out, like the rest of qconvert.numerics. These reproduce
`onnxruntime.quantization` 1.32 (quant_utils.py, base_quantizer.py, qdq_quantizer.py) bit for bit, so a
MinMax calibration gives the scales and zero points `quantize_static` gives; tests/unit/
test_numerics_calibration.py pins each one against onnxruntime's own function. Storage kinds are named
as onnxruntime's QuantType: int8, uint8, int16, uint16, int4, uint4, float8e4m3fn.

The rules, from reference §2.5:
- `qmin_qmax`: reduce_range first, then the symmetric row (int8/int16 only), else the full range;
- `compute_scale_zp`: zero always in range, scale in float64 stored in the range's float type, a scale
  below the type's smallest normal (f16: smallest subnormal) becomes (1.0, 0), zero point
  `rne(qmin - rmin / scale64)` from the float64 scale (symmetric: `rne((qmin + qmax) / 2)`);
- weights: `clip(rne(f32(w) / scale) + zp)` with the full storage range; per-channel = per-tensor on each
  slice; blocked = per block of a rank-2 weight, padded with zeros;
- bias: `s_in * s_w * beta` (float32), `clip(rne(f64(b) / f64(scale)))` to int32;
- float8 e4m3fn: `scale = std / std(every finite e4m3fn value)`, zero point 0 (data whose mean is far
  from 0 then saturates: `float8_saturated_fraction` measures it, for finalize's notes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import ml_dtypes
import numpy as np

from . import round_half_to_even

QUANT_TYPES = ("int8", "uint8", "int16", "uint16", "int4", "uint4", "float8e4m3fn")
INTEGER_QUANT_TYPES = QUANT_TYPES[:-1]
FLOAT8 = "float8e4m3fn"
# How a float8 scale is chosen: "std" is onnxruntime's rule (`float8_params`), "max" qconvert's
# (`float8_params_from_maximum`).
FLOAT8_SCALE_RULES = ("std", "max")


def check_float8_scale_rule(rule: str) -> str:
    """`rule` if it names a float8 scale rule, else ValueError (never a silent fallback to one)."""
    if rule not in FLOAT8_SCALE_RULES:
        raise ValueError(f"float8 scale rule '{rule}' is not one of {', '.join(FLOAT8_SCALE_RULES)}")
    return rule


STORAGE_DTYPES: dict[str, np.dtype] = {
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16),
    "uint16": np.dtype(np.uint16),
    "int4": np.dtype(ml_dtypes.int4),
    "uint4": np.dtype(ml_dtypes.uint4),
    "float8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
}

# get_qmin_qmax_for_qType's three tables (reference §2.5); int4/unsigned types have no symmetric row.
_FULL_RANGE = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
    "int4": (-8, 7),
    "uint4": (0, 15),
}
_SYMMETRIC_RANGE = {"int8": (-127, 127), "int16": (-32767, 32767)}
_REDUCED_RANGE = {
    "int8": (-64, 64),
    "uint8": (0, 127),
    "int16": (-16384, 16384),
    "uint16": (0, 32767),
    "int4": (-4, 3),
    "uint4": (0, 7),
}

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Weight-scale increase for int32 bias: onnxruntime's margin and the int32 range it divides by.
_BIAS_SCALE_EPSILON = 1.0001
_INT32_QRANGE = np.float64(INT32_MAX) - np.float64(INT32_MIN + 1)


def check_quant_type(quant_type: str) -> None:
    if quant_type not in QUANT_TYPES:
        raise ValueError(
            f"unknown quantization type '{quant_type}' (expected one of {', '.join(QUANT_TYPES)})"
        )


def is_signed(quant_type: str) -> bool:
    """True for int8/int16/int4/float8e4m3fn (onnxruntime makes these weights symmetric by default)."""
    check_quant_type(quant_type)
    return quant_type in ("int8", "int16", "int4", FLOAT8)


def qmin_qmax(quant_type: str, reduce_range: bool = False, symmetric: bool = False) -> tuple[int, int]:
    """onnxruntime's `get_qmin_qmax_for_qType`: reduce_range wins, then the symmetric row, else full."""
    check_quant_type(quant_type)
    if quant_type == FLOAT8:
        raise ValueError("float8e4m3fn has no integer range: its scale comes from the standard deviation")
    if reduce_range:
        return _REDUCED_RANGE[quant_type]
    if symmetric and quant_type in _SYMMETRIC_RANGE:
        return _SYMMETRIC_RANGE[quant_type]
    return _FULL_RANGE[quant_type]


def full_range(quant_type: str) -> tuple[int, int]:
    """The whole storage range (what weight quantization clips to, whatever range the scale used)."""
    return qmin_qmax(quant_type)


@dataclass(frozen=True, slots=True)
class ScaleZeroPoint:
    """One (scale, zero point) pair; `scale` keeps the float type of the range it came from."""

    scale: np.floating
    zero_point: int


def _smallest_scale(dtype: np.dtype) -> float:
    # fp16 subnormal scales still work (integer quantization divides f32 data by them), so the cut is lower.
    info = np.finfo(dtype)
    return float(info.smallest_subnormal if dtype == np.float16 else info.tiny)


def compute_scale_zp(
    rmin: float | np.floating,
    rmax: float | np.floating,
    qmin: int,
    qmax: int,
    symmetric: bool = False,
    min_real_range: float | None = None,
    dtype: np.dtype | type = np.float32,
) -> ScaleZeroPoint:
    """onnxruntime's `compute_scale_zp` (reference §2.5) for a range held in `dtype` (float32 or float16).

    Arithmetic on the range (including zero, min_real_range, symmetrizing) happens in `dtype`, the
    scale in float64, then rounded to `dtype`; the zero point uses the float64 scale.
    """
    scales, zero_points = compute_scales_zero_points(
        np.array([rmin]), np.array([rmax]), qmin, qmax, symmetric, min_real_range, dtype
    )
    return ScaleZeroPoint(scales[0], int(zero_points[0]))


def compute_scales_zero_points(
    rmin: np.ndarray,
    rmax: np.ndarray,
    qmin: int,
    qmax: int,
    symmetric: bool = False,
    min_real_range: float | None = None,
    dtype: np.dtype | type = np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """`compute_scale_zp` of every range (rmin[i], rmax[i]) at once: scales in `dtype`, int64 zero points."""
    if qmin > 0 or qmax < 0:
        raise ValueError(f"qmin and qmax must satisfy qmin <= 0 <= qmax, got [{qmin}, {qmax}]")
    dtype = np.dtype(dtype)
    rmin, rmax = np.broadcast_arrays(np.asarray(rmin), np.asarray(rmax))
    with np.errstate(over="ignore"):  # past dtype's range: ±Inf, refused below
        low = np.minimum(rmin.astype(dtype), dtype.type(0))
        high = np.maximum(rmax.astype(dtype), dtype.type(0))
    not_finite = ~(np.isfinite(low) & np.isfinite(high))
    if not_finite.any():
        first = np.flatnonzero(not_finite)[0]
        raise ValueError(f"range [{float(rmin.flat[first])}, {float(rmax.flat[first])}] is not finite")
    if min_real_range is not None:
        high = np.maximum(high, low + dtype.type(min_real_range))
    if symmetric:
        absmax = np.maximum(np.abs(low), np.abs(high))
        low, high = -absmax, absmax
    scale64 = (high.astype(np.float64) - low.astype(np.float64)) / (np.float64(qmax) - np.float64(qmin))
    stored = scale64.astype(dtype)
    # Below the smallest normal (float16: subnormal) scale, onnxruntime gives scale 1 and zero point 0.
    too_small = (stored.astype(np.float64) if dtype == np.float16 else scale64) < _smallest_scale(dtype)
    if symmetric:
        zero_point = np.full(scale64.shape, round_half_to_even(np.float64(qmin + qmax) / 2.0))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):  # scale 0: replaced below
            zero_point = round_half_to_even(np.float64(qmin) - low.astype(np.float64) / scale64)
    # In range by construction (zero is inside [low, high]); the clip only guards float64 ties.
    zero_point = np.where(too_small, 0, np.clip(zero_point, qmin, qmax)).astype(np.int64)
    return np.where(too_small, dtype.type(1.0), stored), zero_point


def activation_params(
    rmin: float | np.floating,
    rmax: float | np.floating,
    quant_type: str,
    symmetric: bool = False,
    reduce_range: bool = False,
    min_real_range: float | None = None,
    std: float | None = None,
    dtype: np.dtype | type = np.float32,
    float8_scale: str = "std",
) -> ScaleZeroPoint:
    """onnxruntime's `calc_quant_params` for one calibrated activation (float8 needs the range's `std`,
    unless `float8_scale` is "max")."""
    check_float8_scale_rule(float8_scale)
    if quant_type == FLOAT8 and float8_scale == "max":
        return float8_params_from_maximum(max(abs(float(rmin)), abs(float(rmax))), dtype)
    if quant_type == FLOAT8:
        if std is None:
            raise ValueError("float8e4m3fn activations need a standard deviation (Distribution observer)")
        return float8_params(np.dtype(dtype).type(std))
    qmin, qmax = qmin_qmax(quant_type, reduce_range=reduce_range, symmetric=symmetric)
    return compute_scale_zp(rmin, rmax, qmin, qmax, symmetric, min_real_range, dtype)


_FLOAT8_STD: dict[str, np.floating] = {}


def float8_params(std: np.floating) -> ScaleZeroPoint:
    """onnxruntime's `compute_scale_zp_float8` (E4M3FN): `std / std(all finite e4m3fn values)`, zp 0.

    The result keeps the dtype of `std` (numpy's promotion of `std / float32`).
    """
    if FLOAT8 not in _FLOAT8_STD:
        every = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        _FLOAT8_STD[FLOAT8] = np.std(every[np.isfinite(every)])
    scale = np.asarray(std / _FLOAT8_STD[FLOAT8], dtype=np.asarray(std).dtype)
    return ScaleZeroPoint(cast(np.floating, scale[()]), 0)


def float8_params_from_maximum(
    absolute_maximum: float, dtype: np.dtype | type = np.float32
) -> ScaleZeroPoint:
    """`max|x| / 448` in `dtype`, zp 0: the largest value lands on e4m3fn's largest finite one, so no value
    within the range saturates (not onnxruntime's rule; its std-based one saturates data whose mean is far
    from 0). The scale is rounded up where rounding to `dtype` would put max|x| / scale past 448, and is at
    least `dtype`'s smallest subnormal. An all-zero tensor gets scale 1; a non-finite maximum is an error."""
    if not math.isfinite(absolute_maximum):
        raise ValueError(f"range is not finite (max |x| = {absolute_maximum})")
    kind = np.dtype(dtype).type
    if not absolute_maximum > 0:
        return ScaleZeroPoint(kind(1.0), 0)
    scale = max(kind(absolute_maximum / float8_limit()), np.nextafter(kind(0), kind(1)))
    if absolute_maximum / float(scale) > float8_limit():  # in float64: the true ratio, not dtype's rounding
        scale = np.nextafter(scale, kind(np.inf))
    return ScaleZeroPoint(scale, 0)


def float8_saturated_fraction(data: np.ndarray, scale: np.ndarray, axis: int | None = None) -> float:
    """The fraction of `data` that `scale` (per tensor, or per slice along `axis`) puts past e4m3fn's
    largest finite value, where quantization saturates: onnxruntime's std-based float8 scale does that to
    data whose mean is far from 0 (LayerNorm gammas near 1: all of them)."""
    scale = np.asarray(scale, np.float64)
    if axis is not None and scale.ndim == 1:
        scale = scale.reshape([-1 if dim == axis % data.ndim else 1 for dim in range(data.ndim)])
    beyond = np.abs(np.asarray(data, np.float64)) > float8_limit() * scale
    return float(np.mean(beyond)) if data.size else 0.0


def float8_limit() -> float:
    """e4m3fn's largest finite value (448): quantization saturates past `float8_limit() * scale`."""
    return float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)


# Weights ------------------------------------------------------------------------------------------


def weight_params(
    data: np.ndarray,
    quant_type: str,
    symmetric: bool,
    reduce_range: bool = False,
    min_real_range: float | None = None,
    float8_scale: str = "std",
    rmin: float | None = None,
    rmax: float | None = None,
) -> ScaleZeroPoint:
    """onnxruntime's `compute_data_quant_params` on a whole weight (or one channel of it); float8 by
    `float8_scale` ("std": onnxruntime's, "max": `float8_params_from_maximum`). `rmin`/`rmax` replace the
    data's min/max (onnxruntime's overrides), cast to the data's float type as it does."""
    data = np.asarray(data)
    if quant_type == FLOAT8:
        if reduce_range:
            raise ValueError("reduce_range is not supported for float8e4m3fn")
        if check_float8_scale_rule(float8_scale) == "max":
            return float8_params_from_maximum(float(np.abs(data).max()) if data.size else 0.0, data.dtype)
        return float8_params(np.std(data))
    if data.size == 0:
        return ScaleZeroPoint(data.dtype.type(1.0), 0)
    qmin, qmax = qmin_qmax(quant_type, reduce_range=reduce_range, symmetric=symmetric)
    low = data.min() if rmin is None else data.dtype.type(rmin)
    high = data.max() if rmax is None else data.dtype.type(rmax)
    return compute_scale_zp(low, high, qmin, qmax, symmetric, min_real_range, data.dtype)


def quantize_values(
    data: np.ndarray, scale: np.ndarray | np.floating, zero_point: np.ndarray | int, quant_type: str
) -> np.ndarray:
    """onnxruntime's `quantize_nparray`: `clip(rne(f32(x) / scale) + zp, full range)` in float32.

    `scale` and `zero_point` broadcast against `data`; float8 storage casts `x / scale` with saturation
    (ONNX QuantizeLinear's default).
    """
    check_quant_type(quant_type)
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero float8 scale saturates, as in onnxruntime
        values = np.asarray(data).astype(np.float32) / np.asarray(scale)
    if quant_type == FLOAT8:
        limit = np.float32(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
        return np.clip(values.astype(np.float32), -limit, limit).astype(STORAGE_DTYPES[FLOAT8])
    qmin, qmax = full_range(quant_type)
    zero = np.asarray(zero_point).astype(np.float32)
    rounded = round_half_to_even(values.astype(np.float32)) + zero
    return np.clip(rounded, qmin, qmax).astype(STORAGE_DTYPES[quant_type])


def weight_params_per_channel(
    data: np.ndarray,
    axis: int,
    quant_type: str,
    symmetric: bool,
    reduce_range: bool = False,
    min_real_range: float | None = None,
    float8_scale: str = "std",
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel `(scales, zero_points)` along `axis`: each slice `data.take(i, axis)` on its own.

    Integer storage takes every channel's min/max in one reduction and one `compute_scales_zero_points`
    (the same elementwise arithmetic as `weight_params` per slice, so the same bits; a Python call per
    channel cost ~2 s on a 6-layer MiniLM's 36 weights); float8 and empty weights go slice by slice."""
    data = np.asarray(data)
    if quant_type != FLOAT8 and data.size:
        qmin, qmax = qmin_qmax(quant_type, reduce_range=reduce_range, symmetric=symmetric)
        rows = np.moveaxis(data, axis, 0).reshape(data.shape[axis], -1)
        return compute_scales_zero_points(
            rows.min(axis=1), rows.max(axis=1), qmin, qmax, symmetric, min_real_range, data.dtype
        )
    pairs = [
        weight_params(
            data.take(i, axis).ravel(), quant_type, symmetric, reduce_range, min_real_range, float8_scale
        )
        for i in range(data.shape[axis])
    ]
    scales = np.array(
        [p.scale for p in pairs], dtype=np.asarray(pairs[0].scale).dtype if pairs else data.dtype
    )
    return scales, np.array([p.zero_point for p in pairs], dtype=np.int64)


def quantize_per_channel(
    data: np.ndarray, axis: int, scales: np.ndarray, zero_points: np.ndarray, quant_type: str
) -> np.ndarray:
    """Quantize each slice along `axis` with its own (scale, zero point)."""
    shape = [1] * data.ndim
    shape[axis] = data.shape[axis]
    return quantize_values(data, np.reshape(scales, shape), np.reshape(zero_points, shape), quant_type)


def weight_params_blocked(
    data: np.ndarray, axis: int, block_size: int, quant_type: str, symmetric: bool
) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's `compute_scale_zp_blocked`: `(scales, zero_points)` shaped like `data` with
    `ceil(D_axis / block_size)` along `axis`. Rank-2 weights only; the axis is padded with zeros."""
    if data.ndim != 2:
        raise ValueError(f"blocked quantization needs a rank-2 weight, got shape {data.shape}")
    if block_size <= 0:
        raise ValueError(f"block size must be positive, got {block_size}")
    check_quant_type(quant_type)
    if quant_type == FLOAT8:
        raise ValueError("blocked quantization supports integer types only")
    length = data.shape[axis]
    blocks = -(-length // block_size)
    moved = np.moveaxis(data, axis, 0)
    padded = np.zeros((blocks * block_size, moved.shape[1]), dtype=data.dtype)
    padded[:length] = moved
    grouped = padded.reshape(blocks, block_size, moved.shape[1])
    low = np.minimum(grouped.min(axis=1), 0)
    high = np.maximum(grouped.max(axis=1), 0)
    if symmetric:
        absmax = np.maximum(np.abs(low), np.abs(high))
        low, high = -absmax, absmax
    qmin, qmax = qmin_qmax(quant_type, symmetric=symmetric)
    scale = ((high - low).astype(np.float64) / (np.float64(qmax) - np.float64(qmin))).astype(data.dtype)
    degenerate = scale < _smallest_scale(data.dtype)
    scale = np.where(degenerate, data.dtype.type(1.0), scale)
    if symmetric:
        zero_point = np.full(scale.shape, int(round_half_to_even((qmin + qmax) / 2.0)), dtype=np.int64)
    else:
        raw = round_half_to_even(np.float64(qmin) - low.astype(np.float64) / scale.astype(np.float64))
        zero_point = np.clip(raw, qmin, qmax).astype(np.int64)
        zero_point[degenerate] = 0
    return np.moveaxis(scale, 0, axis), np.moveaxis(zero_point, 0, axis)


def quantize_blocked(
    data: np.ndarray, axis: int, block_size: int, scales: np.ndarray, zero_points: np.ndarray, quant_type: str
) -> np.ndarray:
    """Quantize a rank-2 weight block by block (each scale repeated `block_size` times along `axis`)."""
    length = data.shape[axis]
    scale = np.repeat(scales, block_size, axis=axis).take(range(length), axis=axis)
    zero = np.repeat(zero_points, block_size, axis=axis).take(range(length), axis=axis)
    return quantize_values(data, scale, zero, quant_type)


# Bias ---------------------------------------------------------------------------------------------


def bias_scale(
    input_scale: np.floating | np.ndarray, weight_scale: np.ndarray, beta: float = 1.0
) -> np.ndarray:
    """`s_in * s_w * beta` in the scales' float type (per-channel when the weight is)."""
    return np.asarray(np.asarray(input_scale) * np.asarray(weight_scale) * beta)


def bias_scale_onnxruntime(
    input_scale: np.floating | np.ndarray, weight_scale: np.ndarray, beta: float, bias: np.ndarray
) -> np.ndarray:
    """The bias scale onnxruntime writes, in the bias's float type, with its float16 fallback.

    An f16 bias whose f16 scale `s_in * s_w * beta` is 0 somewhere, or too small for |b| to fit int32,
    gets an f32 scale instead, raised to at least `1.0001 * |b| / (2^31 - 1)` (the largest |b| for a
    per-tensor scale), and zeros replaced by 1 (`quantize_bias_static`); its DequantizeLinear then
    outputs f32 and a Cast returns to f16. The returned dtype says which case applies.
    """
    bias = np.asarray(bias)
    if bias.dtype == np.float16:
        candidate = np.asarray(np.asarray(input_scale) * np.asarray(weight_scale) * beta, dtype=np.float16)
        magnitudes = np.abs(bias.astype(np.float64))
        if np.any(candidate == 0) or np.any(magnitudes > INT32_MAX * candidate.astype(np.float64)):
            scale = (
                np.asarray(input_scale).astype(np.float32)
                * np.asarray(weight_scale).astype(np.float32)
                * beta
            )
            smallest = magnitudes / INT32_MAX
            if scale.size == 1:
                smallest = smallest.max()
            scale = np.maximum(scale, smallest * _BIAS_SCALE_EPSILON).astype(np.float32)
            return np.where(scale == 0, np.float32(1.0), scale)
    return bias_scale(input_scale, weight_scale, beta).astype(bias.dtype)


def quantize_bias(bias: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """`clip(rne(f64(b) / f64(scale)), int32)` as onnxruntime's `quantize_bias_static_impl` computes it."""
    quotient = np.asarray(bias, dtype=np.float64) / np.asarray(scale, dtype=np.float64)
    return np.clip(round_half_to_even(quotient), float(INT32_MIN), float(INT32_MAX)).astype(np.int32)


def adjust_weight_scale_for_int32_bias(
    input_scale: np.floating | np.ndarray, weight_scale: np.ndarray, bias: np.ndarray, per_channel: bool
) -> np.ndarray | None:
    """onnxruntime's `_adjust_weight_scale_for_int32_bias`: the increased weight scale, or None if unchanged.

    When `s_in * s_w` (float64) is positive but below `1.0001 * 2 * max|b| / (2^31 - 1 - (-2^31 + 1))`,
    the weight scale grows by that ratio so the bias fits int32 (per channel with the channel's |b|).
    """
    weight_scale = np.array(weight_scale)
    dtype = weight_scale.dtype
    if weight_scale.size == 0:
        return None
    bias = np.asarray(bias)
    input64 = np.float64(np.asarray(input_scale).item())

    def adjusted(scale: np.floating, absmax: np.floating) -> np.floating | None:
        # In absmax's own type until the division (float32 per channel, float64 per tensor), as onnxruntime.
        smallest = _BIAS_SCALE_EPSILON * (2.0 * absmax) / _INT32_QRANGE
        candidate = input64 * np.float64(scale)
        if not (0.0 < candidate < smallest):
            return None
        new = np.float64(scale) * (smallest / candidate)
        rounded = dtype.type(new)
        if dtype == np.float16 and rounded < new:  # f16 rounding must not undo the minimum
            rounded = np.nextafter(rounded, dtype.type(np.inf))
        return rounded

    changed = False
    if not per_channel:
        low = np.minimum(bias.min(), np.float64(0))
        high = np.maximum(bias.max(), np.float64(0))
        new = adjusted(weight_scale.item(), np.maximum(np.abs(low), np.abs(high)))
        if new is not None:
            weight_scale = np.asarray(new, dtype=dtype).reshape(weight_scale.shape)
            changed = True
    elif weight_scale.ndim == 1:
        for i in range(weight_scale.shape[0]):
            new = adjusted(weight_scale[i], np.abs(bias[i]))
            if new is not None:
                weight_scale[i] = new
                changed = True
    return weight_scale if changed else None
