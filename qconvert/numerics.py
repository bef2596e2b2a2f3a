"""Reference quantize/dequantize: every rounding and saturation rule of qconvert, each pinned to its engine.

NOTE: numpy (+ ml_dtypes) in, numpy out; no IR, no ONNX, nothing else from qconvert. Every rule is one
`Rounding` member and one private function below; its docstring gives the formula and names the engine
whose behaviour it reproduces (tests/unit/test_numerics.py runs that engine). Notation: `rne` = round
half to even, `trunc` = round toward zero, `clamp(v, lo, hi)`, `s` = scale, `zp` = zero point,
`[qmin, qmax]` = `[storage_type_min, storage_type_max]`.

The rules disagree, on purpose, because the engines do:

| rule          | quantize                                  | engine                                   |
|---------------|-------------------------------------------|------------------------------------------|
| ONNX          | clamp(rne(x / s) + zp, qmin, qmax)        | onnxruntime QuantizeLinear (CPU EP)      |
| STABLEHLO     | rne(clamp(x / s + zp, qmin, qmax))        | stablehlo.uniform_quantize (interpreter) |
| MLIR_LOWERING | trunc(x / s + zp), clamp if bounds narrow | upstream `--lower-quant-ops` (fptosi)    |

ONNX and STABLEHLO differ by one on ties (`x / s` = n + 0.5) with an odd zero point strictly inside
the storage range, where adding zp in float drops bits of `x / s`, and on NaN (qmin vs 0). MLIR_LOWERING
truncates, so it differs from both wherever they round away from zero (|fraction| > 0.5, half the ties).

The QOperator section (end of module) holds onnxruntime's integer-kernel rules, one function each:
`requantize_mlas` (QLinearConv / QLinearMatMul / QGemm / QLinearGlobalAveragePool:
`clamp(rne(f32(acc) * f32(s_a * s_b / s_y))) + zp`), `qlinear_add_mlas` (FMA, zp added before
rounding), `qlinear_mul_mlas`, `lookup_table_onnxruntime` (QLinearSigmoid / LeakyRelu / Concat),
`quantize_pool_onnxruntime` + `average_pool_float32` (QLinearAveragePool),
`dynamic_quantize_parameters_onnxruntime` (DynamicQuantizeLinear / DynamicQuantizeMatMul).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import ml_dtypes
import numpy as np

__all__ = [
    "Rounding",
    "UniformParams",
    "storage_range",
    "storage_dtype_range",
    "integer_storage_dtype",
    "round_half_to_even",
    "round_half_away_from_zero",
    "broadcast_params",
    "quantize",
    "dequantize",
    "float32_fma",
    "requantize_scale_onnxruntime",
    "requantize_mlas",
    "scale_output_mlas",
    "qlinear_add_mlas",
    "qlinear_mul_mlas",
    "quantize_linear_mlas",
    "lookup_table_onnxruntime",
    "sigmoid_float32",
    "global_average_pool_scale_mlas",
    "dynamic_quantize_parameters_onnxruntime",
    "quantize_pool_onnxruntime",
    "average_pool_float32",
]


class Rounding(StrEnum):
    """The quantize (and dequantize) arithmetic of one engine; pass it, never re-derive it inline."""

    ONNX = "onnx"  # clamp(round_half_even(x / s) + zp)            onnxruntime QuantizeLinear
    STABLEHLO = "stablehlo"  # round_half_even(clamp(x / s + zp, qmin, qmax)) stablehlo.uniform_quantize
    MLIR_LOWERING = "mlir"  # fptosi(x / s + zp), clamp only if bounds are narrowed  upstream lower-quant-ops


_FLOAT32 = np.dtype(np.float32)

_EXPRESSED_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float32),
    np.dtype(np.float64),
)

_INTEGER_STORAGE_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(ml_dtypes.int1),
    np.dtype(ml_dtypes.uint1),
    np.dtype(ml_dtypes.int2),
    np.dtype(ml_dtypes.uint2),
    np.dtype(ml_dtypes.int4),
    np.dtype(ml_dtypes.uint4),
    np.dtype(np.int8),
    np.dtype(np.uint8),
    np.dtype(np.int16),
    np.dtype(np.uint16),
    np.dtype(np.int32),
    np.dtype(np.uint32),
)

# Float types with Inf/NaN encodings (or at least NaN): ONNX's `saturate` attribute decides overflow.
_FLOAT8_STORAGE_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz),
    np.dtype(ml_dtypes.float8_e4m3),
    np.dtype(ml_dtypes.float8_e3m4),
    np.dtype(ml_dtypes.float8_e4m3b11fnuz),
)

# Float types without Inf/NaN encodings: the cast itself saturates, the ONNX reference adds zp first.
_FINITE_FLOAT_STORAGE_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(ml_dtypes.float4_e2m1fn),
    np.dtype(ml_dtypes.float6_e2m3fn),
    np.dtype(ml_dtypes.float6_e3m2fn),
)

_FLOAT_STORAGE_DTYPES = _FLOAT8_STORAGE_DTYPES + _FINITE_FLOAT_STORAGE_DTYPES


def storage_range(width: int, signed: bool) -> tuple[int, int]:
    """The full `[min, max]` of an `iN` (signed) or `uN` storage type, as MLIR's quant dialect defines it.

    `storage_range(8, True) == (-128, 127)`, `storage_range(4, False) == (0, 15)`; widths 1..32.
    """
    if not 1 <= width <= 32:
        raise ValueError(f"illegal storage type size: {width}")
    if signed:
        return -(1 << (width - 1)), (1 << (width - 1)) - 1
    return 0, (1 << width) - 1


def integer_storage_dtype(width: int, signed: bool) -> np.dtype:
    """The smallest numpy / ml_dtypes container for `iN` / `uN` (i3 -> int4, u7 -> uint8, i17 -> int32)."""
    storage_range(width, signed)  # validates the width
    for dtype in _INTEGER_STORAGE_DTYPES:
        info = ml_dtypes.iinfo(dtype)
        if (info.min < 0) == signed and info.bits >= width:
            return dtype
    raise AssertionError(f"no container for width {width}")  # unreachable: int32/uint32 hold width 32


def storage_dtype_range(storage_dtype: np.dtype | type) -> tuple[int, int] | tuple[float, float]:
    """The full `[min, max]` of a storage container: iinfo for integers, ±(largest finite) for floats."""
    dtype = np.dtype(storage_dtype)
    if dtype in _INTEGER_STORAGE_DTYPES:
        info = ml_dtypes.iinfo(dtype)
        return int(info.min), int(info.max)
    if dtype in _FLOAT_STORAGE_DTYPES:
        largest = float(ml_dtypes.finfo(dtype).max)
        return -largest, largest
    raise ValueError(
        f"storage type must be an integer of at most 32 bits or a float8/float6/float4 type, got {dtype}"
    )


def round_half_to_even(x: np.ndarray | float) -> np.ndarray:
    """Round to the nearest integer, ties to even (IEEE roundTiesToEven); same float dtype, NaN/±Inf kept.

    This is `rne` of ONNX QuantizeLinear and of `stablehlo.round_nearest_even`.
    """
    array = np.asarray(x)
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        # Every integer rne can produce from a bfloat16 is itself a bfloat16, so rounding in f32 is exact.
        return np.rint(array.astype(np.float32)).astype(array.dtype)
    return np.rint(array)


def round_half_away_from_zero(x: np.ndarray | float) -> np.ndarray:
    """Round to the nearest integer, ties away from zero (C `round`); same float dtype, NaN/±Inf/-0 kept.

    The rule `mlir::quant` UniformSupport's `roundHalfToEven` actually implements, despite its name.
    """
    array = np.asarray(x)
    compute = np.float32 if array.dtype == np.dtype(ml_dtypes.bfloat16) else array.dtype
    values = array.astype(compute)
    truncated = np.trunc(values)
    with np.errstate(invalid="ignore"):
        # x - trunc(x) is exact in binary floating point, so the tie test has no rounding error.
        away = np.abs(values - truncated) >= 0.5
    return np.where(away, truncated + np.copysign(1.0, values).astype(compute), truncated).astype(array.dtype)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclass(frozen=True, slots=True, kw_only=True)
class UniformParams:
    """Parameters of a uniform quantization, independent of any IR type: `real = (q - zp) * scale`.

    Granularity follows MLIR's quant types:
    - per-tensor (`!quant.uniform<i8:f32, 0.5:3>`): `scale` has shape `()`;
    - per-axis (`!quant.uniform<i8:f32:1, {0.5:3, 0.25:-1}>`): shape `(C,)`, `quantized_dimension` set;
    - sub-channel (`!quant.uniform<i8:f32:{1:2}, {{...}}>`): `scale` has the tensor's rank, each axis in
      `block_sizes` has `ceil(dim / block_size)` entries (ONNX allows a shorter last block), every
      other axis 1.

    `scale` is stored as a read-only float64 copy (lossless for f16/bf16/f32 scales) and `zero_point` as
    read-only int64 (float64 zeros for float storage). Storage of odd integer widths (i3, u7, ...) uses
    the smallest container (`integer_storage_dtype`) with `storage_type_min/max` giving the real range.
    Invalid parameters raise ValueError with MLIR's wording where MLIR has the rule.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    storage_dtype: np.dtype
    storage_type_min: int | float
    storage_type_max: int | float
    quantized_dimension: int | None = None
    block_sizes: tuple[tuple[int, int], ...] = ()
    expressed_dtype: np.dtype = _FLOAT32

    def __post_init__(self) -> None:
        storage_dtype = np.dtype(self.storage_dtype)
        expressed_dtype = np.dtype(self.expressed_dtype)
        if expressed_dtype not in _EXPRESSED_DTYPES:
            raise ValueError(f"expressed type must be floating point, got {expressed_dtype}")
        container_min, container_max = storage_dtype_range(storage_dtype)
        is_float_storage = storage_dtype in _FLOAT_STORAGE_DTYPES
        storage_type_min = float(self.storage_type_min) if is_float_storage else int(self.storage_type_min)
        storage_type_max = float(self.storage_type_max) if is_float_storage else int(self.storage_type_max)
        if storage_type_min != self.storage_type_min or storage_type_max != self.storage_type_max:
            raise ValueError(
                f"storage bounds must be integers for integer storage: ({self.storage_type_min}:"
                f"{self.storage_type_max})"
            )
        if storage_type_min < container_min:
            raise ValueError(f"illegal storage type minimum: {storage_type_min}")
        if storage_type_max > container_max:
            raise ValueError(f"illegal storage type maximum: {storage_type_max}")
        if storage_type_max <= storage_type_min:
            raise ValueError(f"illegal storage min and storage max: ({storage_type_min}:{storage_type_max})")

        scale = np.array(self.scale, dtype=np.float64)  # copy: the caller's array stays theirs
        lowest = float(ml_dtypes.finfo(expressed_dtype).smallest_subnormal)
        highest = float(ml_dtypes.finfo(expressed_dtype).max)
        out_of_range = ~((scale >= lowest) & (scale <= highest))
        if out_of_range.any():
            bad = float(scale[out_of_range].flat[0])
            raise ValueError(f"scale {bad:e} out of expressed type range [{lowest:e}, {highest:e}]")

        zero_point = np.array(self.zero_point)
        if zero_point.shape != scale.shape:
            raise ValueError(
                f"shape of scales and zeroPoints ({scale.shape} vs {zero_point.shape}) does not match"
            )
        if is_float_storage:
            zero_point = zero_point.astype(np.float64)
            if np.any(zero_point != 0):
                raise ValueError(f"zero point must be 0 for float storage type {storage_dtype}")
        else:
            as_integer = zero_point.astype(np.int64)
            if np.any(as_integer != zero_point):
                raise ValueError("zero point must be an integer for integer storage")
            zero_point = as_integer

        self._check_granularity(scale)
        object.__setattr__(self, "scale", _read_only(scale))
        object.__setattr__(self, "zero_point", _read_only(zero_point))
        object.__setattr__(self, "storage_dtype", storage_dtype)
        object.__setattr__(self, "expressed_dtype", expressed_dtype)
        object.__setattr__(self, "storage_type_min", storage_type_min)
        object.__setattr__(self, "storage_type_max", storage_type_max)
        object.__setattr__(self, "block_sizes", tuple((int(a), int(b)) for a, b in self.block_sizes))

    def _check_granularity(self, scale: np.ndarray) -> None:
        if self.quantized_dimension is not None and self.block_sizes:
            raise ValueError("a quantization is per-axis (quantized_dimension) or sub-channel (block_sizes)")
        if self.quantized_dimension is not None:
            if self.quantized_dimension < 0:
                raise ValueError(f"illegal quantized dimension: {self.quantized_dimension}")
            if scale.ndim != 1:
                raise ValueError(f"per-axis scales must have rank 1, got shape {scale.shape}")
            return
        if not self.block_sizes:
            if scale.ndim != 0:
                raise ValueError(f"per-tensor scale must have shape (), got {scale.shape}")
            return
        seen: set[int] = set()
        for axis, block_size in self.block_sizes:
            if axis < 0 or axis >= scale.ndim:
                raise ValueError(f"illegal quantized dimension: {axis}")
            if block_size <= 0:
                raise ValueError(f"illegal block size: {block_size}")
            if axis in seen:
                raise ValueError(f"duplicate block size for quantized dimension: {axis}")
            seen.add(axis)

    @property
    def is_per_tensor(self) -> bool:
        """One scale and zero point for the whole tensor."""
        return self.quantized_dimension is None and not self.block_sizes

    @property
    def is_per_axis(self) -> bool:
        """One scale and zero point per slice along `quantized_dimension`."""
        return self.quantized_dimension is not None

    @property
    def is_sub_channel(self) -> bool:
        """One scale and zero point per block (`block_sizes`)."""
        return bool(self.block_sizes)

    @property
    def has_float_storage(self) -> bool:
        """Storage is a float8 / float6 / float4 type (zero point 0; only the ONNX rule applies)."""
        return self.storage_dtype in _FLOAT_STORAGE_DTYPES

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UniformParams):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[object, ...]:
        # Arrays compare by dtype, shape and bytes, so equality and hashing stay structural.
        return (
            self.scale.shape,
            self.scale.tobytes(),
            self.zero_point.dtype.str,
            self.zero_point.tobytes(),
            self.storage_dtype,
            self.storage_type_min,
            self.storage_type_max,
            self.quantized_dimension,
            self.block_sizes,
            self.expressed_dtype,
        )


def _expand_to_shape(values: np.ndarray, params: UniformParams, shape: tuple[int, ...]) -> np.ndarray:
    """`values` (shaped like `params.scale`) broadcast to `shape`, as a read-only view where possible."""
    if params.is_per_tensor:
        return np.broadcast_to(values, shape)
    rank = len(shape)
    if params.quantized_dimension is not None:
        axis = params.quantized_dimension
        if axis >= rank:
            raise ValueError(f"quantized dimension must be less than tensor rank: {axis} >= {rank}")
        if shape[axis] != values.shape[0]:
            raise ValueError(
                f"quantized dimension size does not match number of scales: "
                f"{shape[axis]} vs {values.shape[0]}"
            )
        return np.broadcast_to(values.reshape([-1 if i == axis else 1 for i in range(rank)]), shape)
    if values.ndim != rank:
        raise ValueError(f"scales rank {values.ndim} does not match tensor rank {rank}")
    block_size_of = dict(params.block_sizes)
    expanded = values
    for axis, dim in enumerate(shape):
        block_size = block_size_of.get(axis)
        expected = 1 if block_size is None else math.ceil(dim / block_size)
        if values.shape[axis] != expected:
            raise ValueError(
                f"scales dimension {axis} has size {values.shape[axis]}, expected {expected} for a tensor "
                f"dimension of {dim} and block size {block_size or dim}"
            )
        if block_size is not None and block_size > 1:
            # Repeat each block's entry, then cut the ragged tail ONNX allows for the last block.
            expanded = np.take(np.repeat(expanded, block_size, axis=axis), np.arange(dim), axis=axis)
    return np.broadcast_to(expanded, shape)


def broadcast_params(params: UniformParams, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """`(scale, zero_point)` expanded to exactly `shape`: element `i` holds the parameters of element `i`.

    Per-axis parameters broadcast along `quantized_dimension`; sub-channel parameters repeat
    `block_size` times along each blocked axis (the last block may be shorter, as ONNX allows). The
    results are read-only (float64 scale, int64 or float64 zero point). Raises ValueError when the
    parameters do not fit `shape`.
    """
    shape = tuple(int(d) for d in shape)
    return (
        _expand_to_shape(params.scale, params, shape),
        _expand_to_shape(params.zero_point, params, shape),
    )


def _onnx_compute_dtype(expressed_dtype: np.dtype) -> np.dtype:
    """onnxruntime upcasts f16 / bf16 inputs and scales to f32; f64 (no ORT kernel) stays f64."""
    return np.dtype(np.float64) if expressed_dtype == np.float64 else np.dtype(np.float32)


def _scale_in(params: UniformParams, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The scale as the expressed type holds it (rounded once), then converted exactly to `dtype`."""
    scale = params.scale.astype(params.expressed_dtype).astype(dtype)
    return _expand_to_shape(scale, params, shape)


def _to_integer_storage(integral: np.ndarray, params: UniformParams, nan_value: float) -> np.ndarray:
    """Integer-valued float64 -> storage: NaN becomes `nan_value`, the rest saturates to the bounds."""
    values = np.where(np.isnan(integral), nan_value, integral)
    values = np.clip(values, params.storage_type_min, params.storage_type_max)
    return values.astype(np.int64).astype(params.storage_dtype)


def _quantize_onnx_integer(x: np.ndarray, params: UniformParams) -> np.ndarray:
    """ONNX QuantizeLinear, integer storage: `clamp(rne(x / s) + zp, qmin, qmax)`, reproducing onnxruntime.

    `x / s` is divided in float32 (onnxruntime upcasts f16 / bf16 input and scale first; f64 stays
    f64), rounded half to even, then the zero point is added exactly and the sum saturated. NaN gives
    `storage_type_min` (MLAS clamps with max/min, which return the bound for NaN), +Inf `qmax`,
    -Inf `qmin`. Pinned bit-exactly against onnxruntime 1.32 CPU (opset 21).
    """
    compute = _onnx_compute_dtype(params.expressed_dtype)
    quotient = x.astype(compute) / _scale_in(params, compute, x.shape)
    _, zero_point = broadcast_params(params, x.shape)
    # The rounded quotient and the zero point are integers, so their float64 sum is exact below 2**53.
    shifted = round_half_to_even(quotient).astype(np.float64) + zero_point
    return _to_integer_storage(shifted, params, nan_value=params.storage_type_min)


def _quantize_onnx_float(x: np.ndarray, params: UniformParams, saturate: bool) -> np.ndarray:
    """ONNX QuantizeLinear, float storage: `cast(x / s)` with round-to-nearest-even, reproducing onnxruntime.

    float8 (zp 0, not added): `saturate=True` clamps finite overflow and ±Inf to ±storage bounds, NaN
    stays NaN; `saturate=False` keeps the ONNX Cast table: overflow and ±Inf become NaN for E4M3FN and
    the FNUZ types, ±Inf for E5M2; FNUZ types turn -0 into +0. Bit-exact with onnxruntime 1.32 except
    where it departs from that table (saturate=0 only): |x / s| in (480, 496) gives ±448 there, NaN
    here (E4M3FN); |x / s| in (61440, 65536) gives NaN there, ±Inf here (E5M2). We follow the spec and
    the ONNX reference evaluator. An f64 quotient is cast by ml_dtypes, which rounds through f32 first
    (no onnxruntime kernel takes f64). float4e2m1 / float6 (no Inf or NaN
    encodings): `cast(x / s + zp)` as the ONNX reference evaluator computes it (so -0 becomes +0),
    overflow saturates whatever `saturate` says, NaN casts to -0 (ml_dtypes, which the reference uses);
    onnxruntime's CPU EP does not implement QuantizeLinear to float4e2m1.
    """
    compute = _onnx_compute_dtype(params.expressed_dtype)
    quotient = x.astype(compute) / _scale_in(params, compute, x.shape)
    if params.storage_dtype in _FINITE_FLOAT_STORAGE_DTYPES:
        _, zero_point = broadcast_params(params, x.shape)
        return (quotient + zero_point.astype(compute)).astype(params.storage_dtype)
    if saturate:
        low = np.asarray(params.storage_type_min, dtype=compute)
        high = np.asarray(params.storage_type_max, dtype=compute)
        quotient = np.clip(quotient, low, high)  # NaN passes through np.clip unchanged
    return quotient.astype(params.storage_dtype)


def _quantize_stablehlo(x: np.ndarray, params: UniformParams) -> np.ndarray:
    """stablehlo.uniform_quantize: `rne(clamp(x / s + zp, qmin, qmax))`, arithmetic in the expressed type.

    The zero point is added before rounding (ties go to the even *stored* value). Pinned against the
    StableHLO interpreter (`stablehlo.eval_module`, which lowers through
    `--stablehlo-legalize-quant-to-math`: divide, add, clamp in float, round_nearest_even, convert);
    the interpreter accepts f32 only, f16 / bf16 follow the spec (numpy rounds each op to that type).
    NaN gives 0, even outside narrowed bounds, as the interpreter and XLA:CPU convert NaN (the spec
    leaves it undefined); ±Inf give `qmax` / `qmin`. A final integer clamp stands in for the
    saturating convert when a bound is not representable in the expressed type.
    """
    expressed = params.expressed_dtype
    _, zero_point = broadcast_params(params, x.shape)
    shifted = x / _scale_in(params, expressed, x.shape) + zero_point.astype(np.float64).astype(expressed)
    low = np.asarray(params.storage_type_min, dtype=np.float64).astype(expressed)
    high = np.asarray(params.storage_type_max, dtype=np.float64).astype(expressed)
    clamped = np.minimum(np.maximum(shifted, low), high)  # propagates NaN, like stablehlo.clamp
    rounded = round_half_to_even(clamped).astype(np.float64)
    nan_mask = np.isnan(rounded)
    stored = _to_integer_storage(rounded, params, nan_value=0.0)
    return np.where(nan_mask, np.zeros((), params.storage_dtype), stored).astype(params.storage_dtype)


def _quantize_mlir_lowering(x: np.ndarray, params: UniformParams) -> np.ndarray:
    """Upstream `--lower-quant-ops` qcast: `fptosi(x / s + zp)` in the expressed type (trunc toward zero).

    `arith.divf`, `arith.addf(sitofp(zp))`, then `arith.fptosi` / `fptoui`: no rounding step. The pass
    adds `maxsi`/`minsi` only for narrowed bounds; without them an out-of-range value is poison in
    MLIR, and a NaN always is. We return what `llvm.fptosi.sat` gives followed by the clamp to
    `[qmin, qmax]`: out-of-range values saturate, NaN becomes 0 (clamped into narrowed bounds), so the
    result always lies within the bounds and agrees with upstream wherever upstream is defined.
    """
    expressed = params.expressed_dtype
    _, zero_point = broadcast_params(params, x.shape)
    shifted = x / _scale_in(params, expressed, x.shape) + zero_point.astype(np.float64).astype(expressed)
    return _to_integer_storage(np.trunc(shifted).astype(np.float64), params, nan_value=0.0)


def quantize(
    x: np.ndarray,
    params: UniformParams,
    rounding: Rounding = Rounding.ONNX,
    *,
    saturate: bool = True,
) -> np.ndarray:
    """Quantize `x` (converted to `params.expressed_dtype` first) to a `params.storage_dtype` array.

    - `Rounding.ONNX`: `clamp(rne(x / s) + zp, qmin, qmax)`, onnxruntime QuantizeLinear, f32 division;
      NaN -> `qmin`. Float storage: `cast(x / s)` round-to-nearest-even, with `saturate` as ONNX's
      attribute (it has no effect on integer storage, which always saturates).
    - `Rounding.STABLEHLO`: `rne(clamp(x / s + zp, qmin, qmax))` in the expressed type,
      stablehlo.uniform_quantize; NaN -> 0.
    - `Rounding.MLIR_LOWERING`: `clamp(trunc(x / s + zp), qmin, qmax)` in the expressed type, upstream
      `--lower-quant-ops`; values the pass leaves undefined saturate, NaN -> 0 (then clamped).

    The result has the shape of `x`; integer results lie in `[storage_type_min, storage_type_max]`
    (except NaN under STABLEHLO, which gives 0 like the engine). STABLEHLO and MLIR_LOWERING need
    integer storage (ValueError otherwise).
    """
    rounding = Rounding(rounding)
    values = np.asarray(x).astype(params.expressed_dtype, copy=False)
    if params.has_float_storage:
        if rounding is not Rounding.ONNX:
            raise ValueError(f"rounding {rounding.value!r} needs integer storage, got {params.storage_dtype}")
        return _quantize_onnx_float(values, params, saturate)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        match rounding:
            case Rounding.ONNX:
                return _quantize_onnx_integer(values, params)
            case Rounding.STABLEHLO:
                return _quantize_stablehlo(values, params)
            case Rounding.MLIR_LOWERING:
                return _quantize_mlir_lowering(values, params)


def _dequantize_onnx(q: np.ndarray, params: UniformParams) -> np.ndarray:
    """ONNX DequantizeLinear: `float32(q - zp) * s`, reproducing onnxruntime bit for bit.

    The subtraction is integer, in int32 two's complement as onnxruntime does it (it can wrap only for
    32-bit storage), then converted to float32 and multiplied by the f32 scale; the product is cast
    to the expressed type (f64 stays f64 throughout). Float storage: `float32(q) * s`.
    """
    compute = _onnx_compute_dtype(params.expressed_dtype)
    scale = _scale_in(params, compute, q.shape)
    if params.has_float_storage:
        return (q.astype(compute) * scale).astype(params.expressed_dtype)
    _, zero_point = broadcast_params(params, q.shape)
    difference = (q.astype(np.int64) - zero_point).astype(np.int32)
    return (difference.astype(compute) * scale).astype(params.expressed_dtype)


def _dequantize_stablehlo(q: np.ndarray, params: UniformParams) -> np.ndarray:
    """stablehlo.uniform_dequantize: `convert(q - zp) * s`, subtraction in i32, product in the expressed type.

    As `--stablehlo-legalize-quant-to-math` emits it: convert storage to i32, subtract the i32 zero
    point (two's complement), convert to the expressed type, multiply by the scale.
    """
    expressed = params.expressed_dtype
    _, zero_point = broadcast_params(params, q.shape)
    difference = (q.astype(np.int64) - zero_point).astype(np.int32)
    # int32 -> f64 is exact, so the one rounding is the conversion to the expressed type.
    return difference.astype(np.float64).astype(expressed) * _scale_in(params, expressed, q.shape)


def _dequantize_mlir_lowering(q: np.ndarray, params: UniformParams) -> np.ndarray:
    """Upstream `--lower-quant-ops` dcast: `(sitofp(q) - sitofp(zp)) * s`, each step in the expressed type."""
    expressed = params.expressed_dtype
    _, zero_point = broadcast_params(params, q.shape)
    stored = q.astype(np.int64).astype(np.float64).astype(expressed)
    zero = zero_point.astype(np.float64).astype(expressed)
    return (stored - zero) * _scale_in(params, expressed, q.shape)


def dequantize(q: np.ndarray, params: UniformParams, rounding: Rounding = Rounding.ONNX) -> np.ndarray:
    """`(q - zp) * scale` as a `params.expressed_dtype` array shaped like `q`, with one engine's arithmetic.

    - `Rounding.ONNX`: `float32(int32(q - zp)) * s` (f32 even for f16 / bf16), onnxruntime
      DequantizeLinear; float storage `float32(q) * s`.
    - `Rounding.STABLEHLO`: `expressed(int32(q - zp)) * s` in the expressed type, uniform_dequantize.
    - `Rounding.MLIR_LOWERING`: `(expressed(q) - expressed(zp)) * s` in the expressed type,
      `--lower-quant-ops`.

    For f32 and storage of at most 16 bits the three agree bit for bit. STABLEHLO and MLIR_LOWERING
    need integer storage (ValueError otherwise).
    """
    rounding = Rounding(rounding)
    stored = np.asarray(q)
    if params.has_float_storage:
        if rounding is not Rounding.ONNX:
            raise ValueError(f"rounding {rounding.value!r} needs integer storage, got {params.storage_dtype}")
        return _dequantize_onnx(stored.astype(params.storage_dtype, copy=False), params)
    with np.errstate(invalid="ignore", over="ignore"):
        match rounding:
            case Rounding.ONNX:
                return _dequantize_onnx(stored, params)
            case Rounding.STABLEHLO:
                return _dequantize_stablehlo(stored, params)
            case Rounding.MLIR_LOWERING:
                return _dequantize_mlir_lowering(stored, params)


# onnxruntime QOperator kernels ----------------------------------------------------------------------
# Integer-domain ops (QLinearConv, QLinearMatMul, QGemm, com.microsoft QLinear*) as onnxruntime 1.32's
# CPU EP computes them on x86-64 (MLAS, AVX2 + FMA dispatch). Each function names its kernel; the
# accumulations that precede them are exact int32 arithmetic and live with the caller.


def float32_fma(
    a: np.ndarray | np.floating | float,
    b: np.ndarray | np.floating | float,
    c: np.ndarray | np.floating | float,
) -> np.ndarray:
    """`fma(a, b, c)` in float32 with one rounding, as `vfmadd*ps` computes it (round to nearest even).

    Requires `a * b` to be exact in float64 (true when `a` is an integer of at most 29 bits and `b` a
    float32). The float64 sum `a * b + c` is rounded to odd (two-sum error term, then one step toward
    it when the rounded sum is even), so the final float64 -> float32 conversion rounds correctly.
    """
    product = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    addend = np.asarray(c, np.float32).astype(np.float64)
    total = product + addend
    virtual = total - product
    error = (product - (total - virtual)) + (addend - virtual)
    even = (np.asarray(total).view(np.int64) & 1) == 0
    toward = np.nextafter(total, np.where(error > 0, np.inf, -np.inf))
    return np.where((error != 0) & even, toward, total).astype(np.float32)


def requantize_scale_onnxruntime(
    input_scale: float, weight_scale: np.ndarray, output_scale: float
) -> np.ndarray:
    """The float32 multiplier `(s_in * s_w) / s_out` of QLinearConv / QLinearMatMul (one rounding per op).

    onnxruntime qlinearconv.cc / qlinearmatmul.cc: `output_scales[i] = X_scale * W_scale[i] / Y_scale`.
    Per-channel when `weight_scale` has one entry per output channel.
    """
    product = np.float32(input_scale) * np.asarray(weight_scale, np.float32)
    return (product / np.float32(output_scale)).astype(np.float32)


def requantize_mlas(
    accumulator: np.ndarray, multiplier: np.ndarray | np.floating, zero_point: int, storage_dtype: np.dtype
) -> np.ndarray:
    """MLAS `MlasRequantizeOutput`: `clamp(rne(f32(acc) * m), qmin - zp, qmax - zp) + zp`, all in float32.

    onnxruntime onnxruntime/core/mlas/lib/quantize.cpp (x86 `_mm_cvtepi32_ps`, `_mm_mul_ps`,
    `_mm_max_ps`/`_mm_min_ps`, `_mm_cvtps_epi32` under round-to-nearest-even, `+ zp`). `accumulator`
    is the int32 sum (bias included), converted to float32 with one rounding; `multiplier` broadcasts
    against it (a per-column / per-channel vector on the right axis, or a scalar). Used by
    QLinearConv, QLinearMatMul, QGemm with a quantized output and QLinearGlobalAveragePool.
    """
    low, high = (int(v) for v in storage_dtype_range(storage_dtype))
    value = np.asarray(accumulator).astype(np.int32).astype(np.float32) * np.asarray(multiplier, np.float32)
    value = np.clip(value, np.float32(low - zero_point), np.float32(high - zero_point))
    return (np.rint(value).astype(np.int64) + zero_point).astype(storage_dtype)


def scale_output_mlas(accumulator: np.ndarray, multiplier: np.ndarray) -> np.ndarray:
    """MLAS `MLAS_QGEMM_SCALE_BIAS_OUTPUT_PROCESSOR` (ZeroMode, no float bias): `f32(acc) * m` in float32.

    QGemm without `y_scale` (float output): `m = (alpha * s_a) * s_b` per column.
    """
    return np.asarray(accumulator).astype(np.int32).astype(np.float32) * np.asarray(multiplier, np.float32)


def qlinear_add_mlas(
    a: np.ndarray,
    a_scale: float,
    a_zero_point: int,
    b: np.ndarray,
    b_scale: float,
    b_zero_point: int,
    c_scale: float,
    c_zero_point: int,
    storage_dtype: np.dtype,
) -> np.ndarray:
    """com.microsoft QLinearAdd: MLAS `MlasQLinearAddKernelAvx2Helper` (qladd_avx2.cpp), float32 with FMA.

    With `r_a = s_a / s_c`, `r_b = s_b / s_c` (float32) and
    `fixed = f32(zp_c) - fma(zp_b, r_b, r_a * zp_a)` (the compiler contracts the sum into an FMA):
    `c = sat(rne(fma(a, r_a, fma(b, r_b, fixed))))`, `a` and `b` the raw stored values (their zero
    points sit in `fixed`), `sat` the saturating packs to the storage range. Note the output zero point
    is added *before* rounding, unlike QuantizeLinear. Spans where B is a scalar fold `b * r_b` into
    `fixed` with a contracted multiply-add: the same arithmetic. onnxruntime swaps the inputs when A is
    the per-span scalar (qlinear_binary_op.cc); the caller does the same, since the order of the two
    FMAs matters. Pinned against onnxruntime 1.32 on an AVX2 + FMA x86-64 CPU (the SSE2 and NEON
    kernels of older / other CPUs round differently).
    """
    ratio_a = np.float32(np.float32(a_scale) / np.float32(c_scale))
    ratio_b = np.float32(np.float32(b_scale) / np.float32(c_scale))
    partial = float32_fma(np.float32(b_zero_point), ratio_b, ratio_a * np.float32(a_zero_point))
    fixed = np.float32(np.float32(c_zero_point) - partial)
    value = float32_fma(np.asarray(b, np.float32), ratio_b, fixed)
    value = float32_fma(np.asarray(a, np.float32), ratio_a, value)
    low, high = (int(v) for v in storage_dtype_range(storage_dtype))
    return np.clip(np.rint(value).astype(np.int64), low, high).astype(storage_dtype)


def qlinear_mul_mlas(
    a: np.ndarray,
    a_scale: float,
    a_zero_point: int,
    b: np.ndarray,
    b_scale: float,
    b_zero_point: int,
    c_scale: float,
    c_zero_point: int,
    storage_dtype: np.dtype,
) -> np.ndarray:
    """com.microsoft QLinearMul: MLAS `MlasQLinearMulKernel` (qlmul.cpp, SSE2), float32 without FMA.

    `c = sat(rne(f32((a - zp_a) * (b - zp_b)) * m + f32(zp_c)))` with `m = (s_a * s_b) / s_c` in float32;
    the int32 product is exact, the multiply and the add round separately, the zero point is added
    before rounding; `sat` saturates to the storage range.
    """
    ratio = np.float32(np.float32(np.float32(a_scale) * np.float32(b_scale)) / np.float32(c_scale))
    product = (np.asarray(a, np.int64) - a_zero_point) * (np.asarray(b, np.int64) - b_zero_point)
    value = product.astype(np.int32).astype(np.float32) * ratio + np.float32(c_zero_point)
    low, high = (int(v) for v in storage_dtype_range(storage_dtype))
    return np.clip(np.rint(value).astype(np.int64), low, high).astype(storage_dtype)


def quantize_linear_mlas(x: np.ndarray, scale: float, zero_point: int, storage_dtype: np.dtype) -> np.ndarray:
    """MLAS `MlasQuantizeLinear`: `clamp(rne(x / s) + zp)`, float32 division (= ONNX QuantizeLinear rule).

    NaN gives `qmin`. Used for lookup tables (QLinearSigmoid, QLinearLeakyRelu), QLinearConcat's
    requantized inputs, QLinearAveragePool and DynamicQuantizeLinear.
    """
    low, high = (int(v) for v in storage_dtype_range(storage_dtype))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        quotient = np.asarray(x, np.float32) / np.float32(scale)
        rounded = np.rint(quotient).astype(np.float64) + zero_point
    rounded = np.where(np.isnan(rounded), low, rounded)
    return np.clip(rounded, low, high).astype(np.int64).astype(storage_dtype)


def lookup_table_onnxruntime(
    function: object,
    x_scale: float,
    x_zero_point: int,
    y_scale: float,
    y_zero_point: int,
    storage_dtype: np.dtype,
) -> np.ndarray:
    """The 256-entry table of onnxruntime's `QlinearBuildLookupTable` (qlinear_lookup_table.cc).

    Entry `i` (the byte pattern of the stored value `x`): `y = MlasQuantizeLinear(f(f32(s_x * (x -
    zp_x))), s_y, zp_y)`, `f` a float32 array function (`sigmoid_float32`, a leaky ReLU). Index the
    table with the input's bytes (`x.view(np.uint8)`).
    """
    codes = np.arange(256, dtype=np.uint8).view(storage_dtype).astype(np.int64)
    dequantized = np.float32(x_scale) * (codes - x_zero_point).astype(np.float32)
    transformed = np.asarray(function(dequantized.astype(np.float32)), np.float32)  # type: ignore[operator]
    return quantize_linear_mlas(transformed, y_scale, y_zero_point, storage_dtype)


def sigmoid_float32(x: np.ndarray) -> np.ndarray:
    """`1 / (1 + exp(-x))` correctly rounded to float32 (computed in float64).

    onnxruntime evaluates MLAS `MlasComputeLogistic`, a rational approximation within a few float32
    ulps of this; the lookup table quantizes to 8 bits afterwards, so the two differ only if a value
    lands within those ulps of a rounding tie.
    """
    values = np.asarray(x, np.float64)
    return (1.0 / (1.0 + np.exp(-values))).astype(np.float32)


def global_average_pool_scale_mlas(input_scale: float, output_scale: float, image_size: int) -> np.float32:
    """MLAS `CheckQLinearGlobalAveragePoolScaleAndSize`: `s_in / (s_out * f32(image_size))` in float32.

    QLinearGlobalAveragePool then requantizes `sum(x) - zp_in * image_size` with `requantize_mlas`.
    """
    return np.float32(np.float32(input_scale) / np.float32(np.float32(output_scale) * np.float32(image_size)))


def dynamic_quantize_parameters_onnxruntime(x: np.ndarray) -> tuple[np.float32, int]:
    """onnxruntime DynamicQuantizeLinear (uint8) scale and zero point (`GetQuantizationParameter`).

    `min = min(0, min(x))`, `max = max(0, max(x))` in float32; `scale = (max - min) / 255` in float32
    (1.0 when max == min); `zp = round_half_even(clamp(0 - min / scale, 0, 255))`.
    """
    values = np.asarray(x, np.float32)
    low = np.float32(min(0.0, float(values.min()))) if values.size else np.float32(0)
    high = np.float32(max(0.0, float(values.max()))) if values.size else np.float32(0)
    scale = np.float32((high - low) / np.float32(255.0))
    if scale == 0:
        scale = np.float32(1.0)
    initial = np.float32(np.float32(0) - np.float32(low / scale))
    zero_point = int(np.rint(np.clip(initial, np.float32(0), np.float32(255))))
    return scale, zero_point


def quantize_pool_onnxruntime(
    y: np.ndarray, scale: float, zero_point: int, storage_dtype: np.dtype
) -> np.ndarray:
    """onnxruntime QLinearAveragePool's `quantize_value` (qlinear_pool.cc): `clamp(rne(y / s + zp))`, f32.

    Unlike QuantizeLinear the zero point is added in float32 *before* rounding (`std::nearbyintf(y /
    y_scale + y_zero_point)`), so ties round to the even stored value.
    """
    low, high = (int(v) for v in storage_dtype_range(storage_dtype))
    value = np.asarray(y, np.float32) / np.float32(scale) + np.float32(zero_point)
    return np.clip(np.rint(value), np.float32(low), np.float32(high)).astype(np.int64).astype(storage_dtype)


def average_pool_float32(windows: list[np.ndarray], count: np.ndarray | np.floating) -> np.ndarray:
    """onnxruntime QLinearAveragePool's float pooling: sequential float32 sum over the window (row-major
    kernel order, as `PoolType::Process` accumulates), then one float32 division by the element count.

    `windows` holds one float32 array per kernel offset (zeros where the window leaves the input:
    adding +0.0 is exact), `count` the divisor per output (kernel size with `count_include_pad`).
    """
    total = np.zeros(windows[0].shape, np.float32)
    for window in windows:
        total = (total + window.astype(np.float32)).astype(np.float32)
    return (total / np.asarray(count, np.float32)).astype(np.float32)
