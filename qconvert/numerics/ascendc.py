"""AscendC's quantization APIs emulated bit for bit as documented: AscendQuant, AscendDequant, AntiQuant.

NOTE: numpy (+ ml_dtypes) in, numpy out. No Ascend hardware, CANN toolkit or simulator exists here: this
module IS the semantics, written from the CANN asc-devkit documentation and implementation headers
(summarised in the project's quantization reference, section 5) and tested on the documentation's worked
examples and hand-computed vectors (tests/numerics/test_ascendc*.py). Notation: `half(v)` = round v to
IEEE binary16 (half to even), `c(v)` = round to the compute type, `cast_m` = the final conversion with
round mode m and saturation.

| API (mode)                            | formula                                               | compute  |
|---------------------------------------|-------------------------------------------------------|----------|
| AscendQuant PER_TENSOR / PER_CHANNEL  | cast_m(half(half(half(x) · half(scale)) + half(off))) | half     |
| AscendQuant PER_TOKEN / PER_GROUP     | cast_m(c(c(c(x) · c(scale)) + c(off)))                | scaleT * |
| AscendDequant                         | dstT(float32(acc) · float32(deqScale))                | float32  |
| AscendAntiQuant, half out             | half(half(half(w) + half(off)) · half(scale))         | half     |
| AscendAntiQuant, bf16 out             | bf16(float32(float32(w) + off) · scale)               | float32  |

(* 950 parts: the scale's type for int8 / HiF8 destinations, float32 for fp8 / fp4 ones. fp8 destinations
compute in float32 in every mode. fp4 destinations (float4_e2m1fn, FLOAT4_E1M2 codes) round twice: to
bfloat16 (RINT), then to fp4 with the round mode.)

From ONNX (`y = sat(rne(x / s) + zp)`): AscendQuant multiplies by `scale = 1/s` and adds `offset = zp`
(`quant_parameters_from_onnx`); AscendAntiQuant adds `offset = -zp` then multiplies by `scale = s`;
AscendDequant multiplies the int32 accumulator by `deqScale = s_x · s_w`. The half pipeline is not ONNX's
float32 division: `predicted_mismatch` says exactly where they differ (measured 1.8 % of int8 outputs at
random scales, never more than one step; none for power-of-two scales, zero points 0 and half-representable
inputs; float32 compute (950 PER_TOKEN) 0.001 %, bfloat16 compute 13 %).

Beyond the documentation, from the implementation headers (asc-devkit `impl/adv_api/detail/quantization`):
the A2/A3 T = float PER_CHANNEL form converts its scale / offset tensors to half in place
(`float_parameters_after_call`); the float -> half source cast saturates; AscendDequant copies a float32
result out with `Adds(x, 0)`. What only hardware can confirm: NaN handling, overflow inside the half
multiply (IEEE Inf assumed), the HYBRID mode's random bits, and the headers being what the silicon runs.

Round modes (`RoundMode`, precision_conversion.md): RINT half to even, ROUND half away from zero, FLOOR,
CEIL, TRUNC, ODD (to odd), NONE (= RINT when the conversion loses precision), HYBRID (HiF8 only). Each
destination takes only some modes and silently falls back to its default for the others
(`effective_round_mode`): int8 / int4 / fp4 RINT, ROUND, FLOOR, CEIL, TRUNC (default RINT); fp8 RINT only;
HiF8 ROUND (default) or HYBRID. Out-of-range values saturate (half 127.5 -> int8 127 in every mode); NaN
converts to 0 for integer destinations (an assumption only hardware can confirm: the documentation is
silent).
"""

from __future__ import annotations

import math
from enum import StrEnum

import ml_dtypes
import numpy as np

from . import round_half_away_from_zero
from .hifloat8 import decode_hifloat8, encode_hifloat8

__all__ = [
    "FLOAT4_E1M2",
    "HIFLOAT8",
    "AscendQuantMode",
    "AscendRoundMode",
    "antiquant_parameters_from_onnx",
    "ascend_antiquant",
    "ascend_dequant",
    "ascend_quant",
    "decode_float4_e1m2",
    "dequant_scale_from_onnx",
    "effective_round_mode",
    "encode_float4_e1m2",
    "float_parameters_after_call",
    "pack_deq_scale",
    "predicted_mismatch",
    "predicted_mismatch_float8",
    "quant_parameters_from_onnx",
    "round_to_grid",
    "unpack_deq_scale",
]

HIFLOAT8 = "hifloat8"  # the dst_dtype / weight dtype of HiF8 (numpy has none): arrays hold uint8 codes
# fp4x2_e1m2_t's element: S | E (1 bit) | M (2 bits), bias 1, no Inf / NaN: 0, 0.25, ..., 1.75 (a uniform
# grid, as en_dtypes' float4_e1m2 defines it). ml_dtypes has no such type: arrays hold its codes in uint8.
FLOAT4_E1M2 = "float4_e1m2"
_FLOAT4_E1M2_GRID = np.arange(8, dtype=np.float64) * 0.25

_HALF = np.dtype(np.float16)
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_FLOAT32 = np.dtype(np.float32)
_INT8 = np.dtype(np.int8)
_INT4 = np.dtype(ml_dtypes.int4)
_FP8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_FP8_E5M2 = np.dtype(ml_dtypes.float8_e5m2)
_FP4_E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
_FP8_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_HALF_MAX = float(np.finfo(np.float16).max)
_BFLOAT16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)


class AscendRoundMode(StrEnum):
    """AscendC `RoundMode` (CAST_*) of the final conversion."""

    NONE = "none"  # CAST_NONE: RINT when the conversion loses precision
    RINT = "rint"  # CAST_RINT: round half to even
    ROUND = "round"  # CAST_ROUND: round half away from zero
    FLOOR = "floor"  # CAST_FLOOR: toward -inf
    CEIL = "ceil"  # CAST_CEIL: toward +inf
    TRUNC = "trunc"  # CAST_TRUNC: toward zero
    ODD = "odd"  # CAST_ODD: round to odd (von Neumann / sticky)
    HYBRID = "hybrid"  # CAST_HYBRID: HiF8 only, ties away below |Ev| = 4, stochastic above


class AscendQuantMode(StrEnum):
    """Granularity of AscendQuant / AscendDequant / AscendAntiQuant parameters (`AscendQuantPolicy`)."""

    PER_TENSOR = "per_tensor"  # scalar scale and offset
    PER_CHANNEL = "per_channel"  # scale[n] recycled every n (= scaleCount) elements of the flattened source
    PER_TOKEN = "per_token"  # src [m, n], scale [m] (one per row); 950 parts
    PER_GROUP = "per_group"  # src [m, n], scale [ceil(m/G), n] (kDim 0) or [m, ceil(n/G)] (kDim 1); 950 parts


# Destination kind -> the round modes its cast takes, first = the default the others fall back to.
_SUPPORTED_MODES: dict[str, tuple[AscendRoundMode, ...]] = {
    "integer": (
        AscendRoundMode.RINT,
        AscendRoundMode.ROUND,
        AscendRoundMode.FLOOR,
        AscendRoundMode.CEIL,
        AscendRoundMode.TRUNC,
    ),
    "fp4": (
        AscendRoundMode.RINT,
        AscendRoundMode.ROUND,
        AscendRoundMode.FLOOR,
        AscendRoundMode.CEIL,
        AscendRoundMode.TRUNC,
    ),
    "fp8": (AscendRoundMode.RINT,),
    HIFLOAT8: (AscendRoundMode.ROUND, AscendRoundMode.HYBRID),
}


def _destination_dtype(dst_dtype: object) -> np.dtype | str:
    """Normalise a destination: HIFLOAT8, or int8 / int4 / float8_e4m3fn / float8_e5m2 / float4_e2m1fn."""
    if isinstance(dst_dtype, str) and dst_dtype.lower() in (HIFLOAT8, "hif8", "hifloat8_t"):
        return HIFLOAT8
    if isinstance(dst_dtype, str) and dst_dtype.lower() in (FLOAT4_E1M2, "fp4x2_e1m2_t"):
        return FLOAT4_E1M2
    dtype = np.dtype(dst_dtype)  # type: ignore[call-overload]
    if dtype not in (_INT8, _INT4, _FP8_E4M3, _FP8_E5M2, _FP4_E2M1):
        raise ValueError(
            f"AscendQuant destination must be int8, int4, float8_e4m3fn, float8_e5m2, hifloat8, "
            f"float4_e2m1fn or float4_e1m2, got {dtype}"
        )
    return dtype


def _destination_kind(dst: np.dtype | str) -> str:
    if dst == HIFLOAT8:
        return HIFLOAT8
    if dst in (_INT8, _INT4):
        return "integer"
    if dst == FLOAT4_E1M2:
        return "fp4"
    if dst in (_FP8_E4M3, _FP8_E5M2):
        return "fp8"
    return "fp4"


def effective_round_mode(dst_dtype: object, round_mode: AscendRoundMode | str) -> AscendRoundMode:
    """The mode the API really applies for `dst_dtype`: the requested one if supported, else the default.

    CAST_NONE on a lossy conversion is CAST_RINT (CAST_ROUND for HiF8, whose only nearest mode that is).
    """
    mode = AscendRoundMode(round_mode)
    supported = _SUPPORTED_MODES[_destination_kind(_destination_dtype(dst_dtype))]
    return mode if mode in supported else supported[0]


def round_to_grid(values: np.ndarray, grid: np.ndarray, round_mode: AscendRoundMode | str) -> np.ndarray:
    """Round float64 `values` onto an ascending grid of non-negative float64 points (mirrored for negatives).

    Values beyond the last point saturate to it (the API's cast saturates); NaN stays NaN. Modes: RINT (ties
    to the point of even index, which is the even mantissa on an IEEE-style grid), ROUND (ties away from
    zero), FLOOR, CEIL, TRUNC, ODD (to the odd-index point unless exact). Used for destinations numpy cannot
    round in every mode (fp4); exact because every grid point and input is a float64.
    """
    mode = AscendRoundMode(round_mode)
    array = np.asarray(values, np.float64)
    magnitude = np.minimum(np.abs(array), grid[-1])
    safe = np.where(np.isnan(magnitude), 0.0, magnitude)
    upper = np.minimum(np.searchsorted(grid, safe, side="left"), grid.size - 1)
    lower = np.where(grid[upper] == safe, upper, np.maximum(upper - 1, 0))
    exact = grid[lower] == safe
    negative = np.signbit(array)
    toward_zero, away = grid[lower], grid[upper]
    match mode:
        case AscendRoundMode.TRUNC:
            pick_away = np.zeros(array.shape, bool)
        case AscendRoundMode.FLOOR:
            pick_away = negative & ~exact
        case AscendRoundMode.CEIL:
            pick_away = ~negative & ~exact
        case AscendRoundMode.ROUND:
            pick_away = (away - safe) <= (safe - toward_zero)
        case AscendRoundMode.ODD:
            pick_away = ~exact & (lower % 2 == 0)
        case _:  # RINT, NONE
            below_half = (away - safe) > (safe - toward_zero)
            tie = (away - safe) == (safe - toward_zero)
            pick_away = ~below_half & (~tie | (upper % 2 == 0))
    result = np.where(pick_away & ~exact, away, toward_zero)
    return np.where(np.isnan(array), np.nan, np.where(negative, -result, result))


def encode_float4_e1m2(
    values: np.ndarray, round_mode: AscendRoundMode | str = AscendRoundMode.RINT
) -> np.ndarray:
    """float -> float4_e1m2 codes (uint8, 0..15): the magnitude rounded on {0, 0.25, ..., 1.75} with
    `round_mode` and saturated at 1.75 (±Inf too), the sign kept (so -0 exists, code 8), NaN -> 0."""
    array = np.asarray(values, np.float64)
    magnitude = np.abs(round_to_grid(np.where(np.isnan(array), 0.0, array), _FLOAT4_E1M2_GRID, round_mode))
    index = np.rint(magnitude * 4).astype(np.uint8)
    return np.where(np.signbit(array) & ~np.isnan(array), index | np.uint8(8), index).astype(np.uint8)


def decode_float4_e1m2(codes: np.ndarray) -> np.ndarray:
    """float4_e1m2 codes (low nibble of uint8) -> float32."""
    array = np.asarray(codes, np.uint8) & np.uint8(0x0F)
    magnitude = (array & np.uint8(7)).astype(np.float32) * np.float32(0.25)
    return np.where(array & np.uint8(8), -magnitude, magnitude).astype(np.float32)


def _round_integral(values: np.ndarray, mode: AscendRoundMode) -> np.ndarray:
    """Round float64 values to integers with one RoundMode (NaN kept)."""
    match mode:
        case AscendRoundMode.ROUND:
            return round_half_away_from_zero(values)
        case AscendRoundMode.FLOOR:
            return np.floor(values)
        case AscendRoundMode.CEIL:
            return np.ceil(values)
        case AscendRoundMode.TRUNC:
            return np.trunc(values)
        case AscendRoundMode.ODD:
            truncated = np.trunc(values)
            bump = (truncated != values) & (np.mod(truncated, 2) == 0)
            return truncated + np.where(bump, np.sign(values), 0.0)
        case _:
            return np.rint(values)


def _round_to_float32_odd(values: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded to odd: a later rounding to a narrower format (bf16) is then correct."""
    nearest = values.astype(np.float32)
    back = nearest.astype(np.float64)
    overshoot = np.abs(back) > np.abs(values)
    truncated = np.where(overshoot, np.nextafter(nearest, np.float32(0)), nearest)
    bits = truncated.view(np.uint32)
    inexact = (truncated.astype(np.float64) != values) & np.isfinite(values)
    return np.where(inexact, bits | np.uint32(1), bits).view(np.float32)


def _round_to(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round exact float64 values once (half to even) to float16 / bfloat16 / float32, returned as float64."""
    if dtype == _BFLOAT16:
        # ml_dtypes rounds float64 through float32: round to odd there so the second rounding is the only one.
        return _round_to_float32_odd(values).astype(_BFLOAT16).astype(np.float64)
    with np.errstate(over="ignore"):  # beyond the type's range: ±Inf, as the IEEE conversion gives
        return values.astype(dtype).astype(np.float64)


def _cast_destination(
    values: np.ndarray, dst: np.dtype | str, mode: AscendRoundMode, rng: np.random.Generator | None
) -> np.ndarray:
    """The saturating final cast of float64 `values` (already of the compute type) to the destination."""
    if dst == HIFLOAT8:
        return encode_hifloat8(values.astype(np.float32), saturate=True, round_mode=mode.value, rng=rng)
    if dst in (_INT8, _INT4):
        low, high = (-128, 127) if dst == _INT8 else (-8, 7)
        rounded = _round_integral(values, mode)
        return np.clip(np.where(np.isnan(rounded), 0.0, rounded), low, high).astype(np.int64).astype(dst)
    if dst in (FLOAT4_E1M2, _FP4_E2M1):
        # TransRegForFp4 (quantize_impl.h, ascend_quant_3510_impl.h): the value goes to bfloat16 first (RINT,
        # saturating), then to fp4 with the round mode: two roundings.
        values = _round_to(np.clip(values, -_BFLOAT16_MAX, _BFLOAT16_MAX), _BFLOAT16)
    if dst == FLOAT4_E1M2:
        return encode_float4_e1m2(values, mode)
    if dst == _FP4_E2M1:
        grid = np.unique(np.abs(np.arange(16, dtype=np.uint8).view(_FP4_E2M1).astype(np.float64)))
        return round_to_grid(values, grid, mode).astype(_FP4_E2M1)
    largest = float(ml_dtypes.finfo(dst).max)
    # SatMode::SAT: finite overflow and ±Inf saturate; NaN stays NaN. Round (half to even) in one step.
    return np.clip(values, -largest, largest).astype(np.float32).astype(dst)


def _as_float64(array: np.ndarray | float, dtype: np.dtype) -> np.ndarray:
    """An operand as the API holds it (rounded once to `dtype`), widened exactly to float64."""
    return _round_to(np.asarray(array).astype(np.float64), dtype)


def _expand_quant_params(
    values: np.ndarray | float,
    shape: tuple[int, ...],
    mode: AscendQuantMode,
    group_size: int | None,
    axis: int,
    name: str,
) -> np.ndarray:
    """Scale or offset broadcast to the source's shape following the mode's layout (section 5.2)."""
    array = np.asarray(values)
    if mode is AscendQuantMode.PER_TENSOR or array.size == 1:
        if mode is not AscendQuantMode.PER_TENSOR and array.size != 1:
            raise ValueError(f"{name}: expected one value")
        return np.broadcast_to(array.reshape(()), shape)
    if mode is AscendQuantMode.PER_CHANNEL:
        count = array.size
        total = math.prod(shape)
        if total % count:
            raise ValueError(
                f"PER_CHANNEL: {total} source elements are not a multiple of {count} {name} values"
            )
        return np.tile(array.reshape(-1), total // count).reshape(shape)
    if len(shape) != 2:
        raise ValueError(f"{mode.name}: the source must be 2-D [m, n], got shape {shape}")
    rows, columns = shape
    if mode is AscendQuantMode.PER_TOKEN:
        if array.size != rows:
            raise ValueError(f"PER_TOKEN: {name} needs {rows} values (one per row), got {array.size}")
        return np.broadcast_to(array.reshape(rows, 1), shape)
    if group_size is None or group_size <= 0:
        raise ValueError(f"PER_GROUP needs a positive group_size, got {group_size}")
    k_dim = 0 if axis == 0 else 1
    expected = (
        (math.ceil(rows / group_size), columns) if k_dim == 0 else (rows, math.ceil(columns / group_size))
    )
    if array.shape != expected:
        raise ValueError(
            f"PER_GROUP (kDim={k_dim}, groupSize={group_size}): {name} must have shape {expected}, got "
            f"{array.shape}"
        )
    repeated = np.repeat(array, group_size, axis=k_dim)
    return repeated[:rows, :columns]


def ascend_quant(
    src: np.ndarray,
    scale: np.ndarray | float,
    offset: np.ndarray | float | None,
    *,
    mode: AscendQuantMode | str,
    dst_dtype: object,
    round_mode: AscendRoundMode | str = AscendRoundMode.RINT,
    group_size: int | None = None,
    axis: int = -1,
    src_dtype: object = None,
    scale_dtype: object = None,
    compute_dtype: object = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """AscendQuant: `dst = cast_m(c(c(c(src) · c(scale)) + c(offset)))`, shaped like `src`, of `dst_dtype`.

    - `mode` PER_TENSOR: scalar scale / offset. PER_CHANNEL: `scale[n]` (and offset scalar or `[n]`) recycled
      every n elements of the flattened source. PER_TOKEN: src `[m, n]`, scale `[m]` or `[m, 1]`. PER_GROUP:
      src `[m, n]`, `group_size` G, `axis` = kDim: 1 (or -1) -> scale `[m, ceil(n/G)]`, 0 -> `[ceil(m/G), n]`.
    - `offset` None: no offset (PER_TOKEN / PER_GROUP `hasOffset = false`); ignored for fp4 destinations.
    - `src_dtype` (half / bfloat16 / float32; default src's own float type): the source as the kernel reads
      it.
    - the compute type `c`: float32 for fp8 / fp4 destinations (every mode); otherwise half for PER_TENSOR /
      PER_CHANNEL (`ascend_quant_pre_impl.h` and the 950's `ascend_quant_3510_impl.h` cast float / bf16
      inputs, scale and offset to half, the float -> half cast saturating) and `scale_dtype` (default
      float32) for PER_TOKEN / PER_GROUP (`ascend_quant_per_group_3510_impl.h`); `compute_dtype` overrides.
    - `dst_dtype`: int8, ml_dtypes.int4, float8_e4m3fn, float8_e5m2, float4_e2m1fn, or HIFLOAT8 / FLOAT4_E1M2
      (uint8 codes).
    - `round_mode`: falls back to the destination's default when unsupported (`effective_round_mode`).
    """
    quant_mode = AscendQuantMode(mode)
    dst = _destination_dtype(dst_dtype)
    effective = effective_round_mode(dst, round_mode)
    source = np.asarray(src)
    read_as = (
        np.dtype(src_dtype)
        if src_dtype is not None
        else (source.dtype if source.dtype in (_HALF, _BFLOAT16, _FLOAT32) else _FLOAT32)
    )
    if compute_dtype is not None:
        compute = np.dtype(compute_dtype)
    elif _destination_kind(dst) in ("fp8", "fp4"):
        compute = _FLOAT32
    elif quant_mode in (AscendQuantMode.PER_TENSOR, AscendQuantMode.PER_CHANNEL):
        compute = _HALF
    else:
        compute = np.dtype(scale_dtype) if scale_dtype is not None else _FLOAT32
    shape = source.shape
    # The source as stored (read_as), then converted to the compute type: two exact-or-RNE conversions.
    stored = _as_float64(source, read_as)
    if compute == _HALF:
        # The float -> half source cast saturates (SatS): ±Inf and overflow become ±65504.
        stored = np.clip(stored, -_HALF_MAX, _HALF_MAX)
    values = _round_to(stored, compute)
    scales = _round_to(
        _as_float64(
            _expand_quant_params(scale, shape, quant_mode, group_size, axis, "scale"),
            np.dtype(scale_dtype) if scale_dtype is not None else _FLOAT32,
        ),
        compute,
    )
    with np.errstate(over="ignore", invalid="ignore"):
        result = _round_to(values * scales, compute)  # float64 product of two <=24-bit values is exact
        if offset is not None and _destination_kind(dst) != "fp4":
            offsets = _expand_quant_params(offset, shape, quant_mode, group_size, axis, "offset")
            offsets = _round_to(_as_float64(offsets, _FLOAT32), compute)
            result = _round_to(result + offsets, compute)  # exact in float64, then one rounding
        return _cast_destination(result, dst, effective, rng)


def float_parameters_after_call(parameters: np.ndarray) -> np.ndarray:
    """A float32 scale (or offset) tensor as an A2/A3 AscendQuant PER_CHANNEL call with T = float leaves it.

    `ascend_quant_pre_impl.h` (`__NPU_ARCH__` 2002 / 2201) converts the float tensor to half IN PLACE
    ("source vector of scale is reused"): its first `2 n` bytes now hold the n halves, the rest is unchanged.
    Read as float32 again, e.g. by the next tile's call when the parameters are kept resident, it is garbage:
    a kernel must copy the parameters in again (or into a scratch buffer) before every call. An implementation
    detail of the headers, not of the documentation: only hardware can confirm it.
    """
    original = np.ascontiguousarray(parameters, dtype=np.float32).reshape(-1)
    buffer = original.copy()
    halves = original.astype(np.float16)
    buffer.view(np.uint8)[: halves.nbytes] = halves.view(np.uint8)
    return buffer.reshape(np.shape(parameters))


def pack_deq_scale(deq_scale: np.ndarray | float, control_bits: int = 0) -> np.ndarray:
    """float32 deqScale -> the uint64 form AscendDequant takes: low 32 bits the float32's bits, high 32 bits
    `control_bits` (hardware control, ignored by the dequantization itself)."""
    bits = np.asarray(deq_scale, np.float32).view(np.uint32).astype(np.uint64)
    return bits | (np.uint64(control_bits & 0xFFFFFFFF) << np.uint64(32))


def unpack_deq_scale(packed: np.ndarray | int) -> np.ndarray:
    """uint64 deqScale -> its float32 value (the low 32 bits; the high control bits are dropped)."""
    low = np.asarray(packed, np.uint64) & np.uint64(0xFFFFFFFF)
    return low.astype(np.uint32).view(np.float32)


def ascend_dequant(
    acc_int32: np.ndarray,
    deq_scale: np.ndarray | float,
    *,
    mode: AscendQuantMode | str,
    dst_dtype: object = np.float32,
    cal_count: int | None = None,
    group_size: int | None = None,
    axis: int = -1,
) -> np.ndarray:
    """AscendDequant: `dst[i][j] = dstT(float32(src[i][j]) · float32(deqScale[j]))` for the first `cal_count`
    columns of every row (the API leaves the rest unspecified, so the result has shape `[m, cal_count]`).

    `acc_int32` `[m, n]` int32 (a 1-D source is one row). `deq_scale`: float32 / bfloat16 values, or the
    uint64 packed form (`pack_deq_scale`); PER_TENSOR a scalar, PER_CHANNEL `[>= cal_count]` per column,
    PER_TOKEN `[m]`, PER_GROUP as AscendQuant's layout. `dst_dtype` float32, float16 or bfloat16 (the float32
    product is rounded once, half to even; a float32 result is copied out by `Adds(x, 0)`, so -0 becomes +0).
    Under the default DEQUANT_WITH_SINGLE_ROW a single row `{1, n, calCount}` with `n % calCount == 0` is
    computed as `n / calCount` rows, defining its later columns too; only the first `cal_count` columns are
    defined in every mode, and those are what this returns.
    """
    quant_mode = AscendQuantMode(mode)
    source = np.asarray(acc_int32)
    if source.dtype.kind not in "iu" and source.dtype != _FLOAT32:
        raise ValueError(f"AscendDequant takes an int32 (or float32) source, got {source.dtype}")
    matrix = source.reshape(1, -1) if source.ndim == 1 else source
    if matrix.ndim != 2:
        raise ValueError(f"AscendDequant takes a 2-D source, got shape {source.shape}")
    rows, columns = matrix.shape
    count = columns if cal_count is None else int(cal_count)
    if not 1 <= count <= columns:
        raise ValueError(f"calCount must lie in [1, {columns}], got {count}")
    scales = np.asarray(deq_scale)
    if scales.dtype == np.uint64:
        scales = unpack_deq_scale(scales)
    scales = scales.astype(np.float32)
    if quant_mode is AscendQuantMode.PER_CHANNEL and scales.size > 1:
        if scales.size < count:
            raise ValueError(
                f"PER_CHANNEL deqScale needs at least calCount = {count} values, got {scales.size}"
            )
        expanded = np.broadcast_to(scales.reshape(-1)[:count], (rows, count))
    else:
        expanded = _expand_quant_params(scales, (rows, columns), quant_mode, group_size, axis, "deqScale")[
            :, :count
        ]
    accumulator = matrix[:, :count].astype(np.float32)  # int32 -> float32, half to even above 2**24
    with np.errstate(over="ignore", invalid="ignore"):
        product = accumulator * expanded.astype(np.float32)
    dst = np.dtype(dst_dtype)
    if dst not in (_FLOAT32, _HALF, _BFLOAT16):
        raise ValueError(f"AscendDequant's destination must be float32, float16 or bfloat16, got {dst}")
    if dst == _FLOAT32:
        return product + np.float32(0.0)  # the implementation's Adds(dst, src, 0) copy
    return product.astype(dst)


def _weight_values(weight: np.ndarray, weight_dtype: object) -> tuple[np.ndarray, str]:
    """Weights as exact float64 values, and their family ('integer', 'float8' or 'fp4')."""
    array = np.asarray(weight)
    if weight_dtype is not None and str(weight_dtype).lower() in (HIFLOAT8, "hif8"):
        return decode_hifloat8(array).astype(np.float64), "float8"
    if weight_dtype is not None and str(weight_dtype).lower() == FLOAT4_E1M2:
        return decode_float4_e1m2(array).astype(np.float64), "fp4"
    if array.dtype in (_FP8_E4M3, _FP8_E5M2):
        return array.astype(np.float64), "float8"
    if array.dtype == _FP4_E2M1:
        return array.astype(np.float64), "fp4"
    if array.dtype.kind in "iu" or array.dtype == _INT4:
        return array.astype(np.int64).astype(np.float64), "integer"
    raise ValueError(f"AscendAntiQuant weights must be int8, int4, fp8, hifloat8 or fp4, got {array.dtype}")


def ascend_antiquant(
    weight: np.ndarray,
    scale: np.ndarray | float,
    offset: np.ndarray | float | None,
    *,
    mode: AscendQuantMode | str,
    dst_dtype: object = np.float16,
    group_size: int | None = None,
    is_transpose: bool = False,
    weight_dtype: object = None,
) -> np.ndarray:
    """AscendAntiQuant: `dst = scale · (src + offset)`, shaped like `weight` (offset ADDED: ONNX's -zp).

    - int8 / int4 weights, half output: src -> half (exact), `half(src + offset)`, `half(· scale)`.
    - bfloat16 output (A2): src -> half -> float32, offset / scale -> float32, add and multiply in float32,
      one rounding to bfloat16. fp8 / HiF8 weights (950; pass `weight_dtype=HIFLOAT8` for uint8 codes): the
      same in float32, rounded to `dst_dtype`.
    - `mode` PER_TENSOR: scalars. PER_CHANNEL, weight `[K, N]`: `scale[i/G][j]` with `G = K / scale.shape[0]`
      (scale `[N]` or `[1, N]` is one per column); `is_transpose`, weight `[N, K]`: `scale[i][j/G]`,
      `G = K / scale.shape[1]`. PER_GROUP (950): the same layouts with G = `group_size` along K; fp4 weights
      (float4_e2m1fn) with float8_e8m0fnu scales and no offset: `dst = out(out(scale) · src)`, one product in
      the output type (half or bf16); 8-bit weights in float32. PER_TOKEN (950): scale `[rows]`, float32.
    """
    quant_mode = AscendQuantMode(mode)
    values, family = _weight_values(weight, weight_dtype)
    dst = np.dtype(dst_dtype)
    if dst not in (_HALF, _BFLOAT16, _FLOAT32):
        raise ValueError(f"AscendAntiQuant's destination must be float16 or bfloat16, got {dst}")
    shape = values.shape
    if quant_mode is AscendQuantMode.PER_TOKEN:
        # 950: one scale (and offset) per row of the weight, in float32 like the other 950 forms.
        rows = shape[0] if values.ndim else 1
        scales = np.asarray(scale, np.float32).astype(np.float64).reshape(rows, *([1] * (values.ndim - 1)))
        result = values
        if offset is not None:
            offsets = np.asarray(offset, np.float32).astype(np.float64).reshape(scales.shape)
            result = _round_to(result + offsets, _FLOAT32)
        return _round_to(_round_to(result * scales, _FLOAT32), dst).astype(dst)
    if family == "fp4" or quant_mode is AscendQuantMode.PER_GROUP:
        # Groups along K: scale [ceil(K/G), N] (weight [K, N]) or [N, ceil(K/G)] (transposed, weight [N, K]);
        # an e8m0 scale is 2**(e - 127) (0x00 -> 2**-127, 0xFF -> NaN), exactly a bfloat16.
        scales = np.asarray(scale).astype(np.float32).astype(np.float64)
        expanded = _antiquant_layout(scales, shape, AscendQuantMode.PER_CHANNEL, is_transpose, "scale")
        if group_size is not None and scales.size > 1:
            k = shape[1] if is_transpose else shape[0]
            groups = (
                scales.reshape(shape[0], -1).shape[1]
                if is_transpose
                else scales.reshape(-1, shape[1]).shape[0]
            )
            if k != groups * int(group_size):
                raise ValueError(f"PER_GROUP: K = {k} is not {groups} groups of {group_size}")
        if family == "fp4":
            # ascend_antiquant_3510_impl.h: fp4 -> bf16 (exact), half out: both -> half (saturating), one
            # product in the output type.
            if dst == _HALF:
                expanded = np.clip(expanded, -_HALF_MAX, _HALF_MAX)
            with np.errstate(over="ignore", invalid="ignore"):
                return _round_to(values * _round_to(expanded, dst), dst).astype(dst)
        result = values
        if offset is not None:
            offsets = _antiquant_layout(
                np.asarray(offset, np.float32).astype(np.float64),
                shape,
                AscendQuantMode.PER_CHANNEL,
                is_transpose,
                "offset",
            )
            result = _round_to(result + offsets, _FLOAT32)
        return _round_to(_round_to(result * expanded, _FLOAT32), dst).astype(dst)
    compute = _HALF if family == "integer" and dst == _HALF else _FLOAT32
    scales = _round_to(
        _as_float64(_antiquant_layout(scale, shape, quant_mode, is_transpose, "scale"), dst), compute
    )
    result = _round_to(values, compute)
    with np.errstate(over="ignore", invalid="ignore"):
        if offset is not None:
            offsets = _antiquant_layout(offset, shape, quant_mode, is_transpose, "offset")
            result = _round_to(result + _round_to(_as_float64(offsets, dst), compute), compute)
        result = _round_to(result * scales, compute)
    return _round_to(result, dst).astype(dst)


def _antiquant_layout(
    values: np.ndarray | float, shape: tuple[int, ...], mode: AscendQuantMode, is_transpose: bool, name: str
) -> np.ndarray:
    """AntiQuant's PER_CHANNEL indexing `[i/G][j]` (`[i][j/G]` transposed), broadcast to the weight."""
    array = np.asarray(values)
    if mode is AscendQuantMode.PER_TENSOR or array.size == 1:
        return np.broadcast_to(array.reshape(()), shape)
    if len(shape) != 2:
        raise ValueError(f"AscendAntiQuant PER_CHANNEL takes a 2-D weight, got shape {shape}")
    rows, columns = shape
    if not is_transpose:
        table = array.reshape(-1, columns)
        if rows % table.shape[0]:
            raise ValueError(f"{name}: K = {rows} is not a multiple of {table.shape[0]} {name} rows")
        return np.repeat(table, rows // table.shape[0], axis=0)
    table = array.reshape(rows, -1)
    if columns % table.shape[1]:
        raise ValueError(f"{name}: K = {columns} is not a multiple of {table.shape[1]} {name} columns")
    return np.repeat(table, columns // table.shape[1], axis=1)


def quant_parameters_from_onnx(
    scale: np.ndarray | float, zero_point: np.ndarray | float, *, src_dtype: object = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX QuantizeLinear's `(s, zp)` -> AscendQuant's `(scale, offset)` = `(1/s, zp)` in the API's type T.

    `1/s` is divided in float32 (the host's `1.0f / s`) and returned as `src_dtype` (float32 or half: the
    A2/A3 API's T; the kernel rounds it to half anyway). Raises ValueError when `1/s` exceeds half's range
    (s < 1/65504), which the half pipeline cannot represent.
    """
    scales = np.asarray(scale, np.float32)
    if np.any(~(scales > 0)) or np.any(~np.isfinite(scales)):
        raise ValueError("ONNX scales must be positive and finite")
    with np.errstate(divide="ignore", over="ignore"):
        reciprocal = np.float32(1.0) / scales
    if np.any(np.abs(reciprocal.astype(np.float64)) > float(np.finfo(np.float16).max)):
        bad = float(scales[np.abs(reciprocal) > np.finfo(np.float16).max].flat[0])
        raise ValueError(
            f"scale {bad:g}: its reciprocal exceeds half's range (AscendQuant needs s >= 1/65504)"
        )
    dtype = np.dtype(src_dtype)
    return reciprocal.astype(dtype), np.asarray(zero_point).astype(np.float64).astype(dtype)


def antiquant_parameters_from_onnx(
    scale: np.ndarray | float, zero_point: np.ndarray | float, *, dst_dtype: object = np.float16
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX DequantizeLinear's `(s, zp)` -> AscendAntiQuant's `(scale, offset)` = `(s, -zp)`, as dst_dtype."""
    dtype = np.dtype(dst_dtype)
    return np.asarray(scale, np.float32).astype(dtype), (-np.asarray(zero_point).astype(np.float64)).astype(
        dtype
    )


def dequant_scale_from_onnx(
    input_scale: np.ndarray | float, weight_scale: np.ndarray | float, *, packed: bool = False
) -> np.ndarray:
    """AscendDequant's deqScale of an int8 x int8 -> int32 product: `float32(s_x · s_w)` (uint64: packed)."""
    product = np.asarray(input_scale, np.float32) * np.asarray(weight_scale, np.float32)
    return pack_deq_scale(product) if packed else product.astype(np.float32)


def predicted_mismatch(
    x: np.ndarray,
    scale: np.ndarray | float,
    zero_point: np.ndarray | float,
    *,
    round_mode: AscendRoundMode | str = AscendRoundMode.RINT,
    compute_dtype: object = np.float16,
    qmin: int = -128,
    qmax: int = 127,
) -> np.ndarray:
    """Where AscendQuant (int8) differs from ONNX QuantizeLinear on the same `(s, zp)`.

    ONNX: `sat(rne(float32(x) / float32(s)) + zp)`. AscendQuant: `sat(m(t))` with
    `t = c(c(c(x) · c(float32(1/s))) + c(zp))`, `c` the compute type: half (PER_TENSOR / PER_CHANNEL; the
    float -> half source cast saturates at ±65504), float32 or bfloat16 (the 950's PER_TOKEN / PER_GROUP with
    that scale type). `scale` and `zero_point` broadcast against `x` (per-channel or per-token: give them the
    shape that broadcasts). Returns a bool array shaped like `x`, True where the two integers differ; the
    reasons are the compute type's rounding of the input, the reciprocal, the product and the sum (half:
    0.0625 spacing in [64, 128)), and multiplying by a rounded reciprocal instead of dividing near ties.
    """
    compute = np.dtype(compute_dtype)
    values = np.asarray(x, np.float32)
    scales = np.broadcast_to(np.asarray(scale, np.float32), values.shape)
    zeros = np.broadcast_to(np.asarray(zero_point, np.float64), values.shape)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        onnx = np.rint(values / scales).astype(np.float64) + zeros
        onnx = np.clip(np.where(np.isnan(onnx), qmin, onnx), qmin, qmax)
        reciprocal = _round_to((np.float32(1.0) / scales).astype(np.float64), compute)
        source = values.astype(np.float64)
        if compute == _HALF:
            source = np.clip(source, -_HALF_MAX, _HALF_MAX)  # the saturating float -> half cast
        product = _round_to(_round_to(source, compute) * reciprocal, compute)
        shifted = _round_to(product + _round_to(zeros, compute), compute)
        ascend = _round_integral(shifted, effective_round_mode(_INT8, round_mode))
        ascend = np.clip(np.where(np.isnan(ascend), 0.0, ascend), qmin, qmax)
    return onnx != ascend


def predicted_mismatch_float8(
    x: np.ndarray,
    scale: np.ndarray | float,
    dst_dtype: object,
    *,
    compute_dtype: object = np.float32,
) -> np.ndarray:
    """Where AscendQuant to float8_e4m3fn / float8_e5m2 differs from ONNX QuantizeLinear (saturate=1, zero
    point 0) on the same scale, as a bool array shaped like `x`.

    ONNX (onnxruntime): `fp8(sat(float32(x) / float32(s)))`, round half to even. AscendQuant: the fp8 forms
    compute in float32 (`ascend_quant`): `fp8(sat(c(c(x) · c(float32(1/s)))))`, CAST_RINT (fp8's only mode)
    with SatMode::SAT. They part where multiplying by the rounded reciprocal moves x/s across a rounding
    boundary of the fp8 grid (or of the compute type's, for half / bfloat16). NaN against NaN is no mismatch.
    """
    destination = np.dtype(dst_dtype)  # type: ignore[call-overload]
    if destination not in (_FP8_E4M3, _FP8_E5M2):
        raise ValueError(
            f"predicted_mismatch_float8: destination must be float8_e4m3fn or float8_e5m2, got {destination}"
        )
    compute = np.dtype(compute_dtype)  # type: ignore[call-overload]
    largest = float(ml_dtypes.finfo(destination).max)
    values = np.asarray(x, np.float32)
    scales = np.broadcast_to(np.asarray(scale, np.float32), values.shape)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        onnx = np.clip(values / scales, -largest, largest).astype(destination)
        reciprocal = _round_to((np.float32(1.0) / scales).astype(np.float64), compute)
        product = _round_to(_round_to(values.astype(np.float64), compute) * reciprocal, compute)
        ascend = np.clip(product, -largest, largest).astype(np.float32).astype(destination)
    same = onnx.view(np.uint8) == ascend.view(np.uint8)
    same |= np.isnan(onnx.astype(np.float32)) & np.isnan(ascend.astype(np.float32))
    return ~same
