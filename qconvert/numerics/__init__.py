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

Submodules hold the rules of one engine family each: `onnxruntime_kernels` (QOperator integer
kernels, re-exported here); `tosa` (TOSA 1.0's fixed-point RESCALE, multiplier / shift, TABLE, pooling's
reciprocal, pinned to the TOSA reference model; imported as `qconvert.numerics.tosa`).
`ascendc` emulates the AscendC quantization APIs (AscendQuant's half pipeline, AscendDequant,
AscendAntiQuant, their round modes) and `hifloat8` the HiFloat8 format, from the CANN documentation (no
Ascend engine exists here; imported as `qconvert.numerics.ascendc` / `qconvert.numerics.hifloat8`).
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
    "accumulator_scale_onnxruntime",
    "requantize_multiplier_onnxruntime",
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
    if q.dtype.kind in "iu" and q.dtype.itemsize <= 4:
        # The same int32 wrap and float product, in place: a weight of 2**28 elements takes two arrays of
        # its size at a time instead of six (issue 23's model over 2 GB). numpy's unsafe cast of each
        # buffered int64 difference into int32 wraps as astype does.
        difference = q.astype(np.int32)
        np.subtract(difference, zero_point, out=difference, casting="unsafe")
        values = difference.astype(compute)
        del difference
        np.multiply(values, scale, out=values)
        return values.astype(params.expressed_dtype, copy=False)
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


# Re-exported so callers keep writing `numerics.requantize_mlas`.
from .onnxruntime_kernels import (  # noqa: E402
    accumulator_scale_onnxruntime,
    average_pool_float32,
    dynamic_quantize_parameters_onnxruntime,
    float32_fma,
    global_average_pool_scale_mlas,
    lookup_table_onnxruntime,
    qlinear_add_mlas,
    qlinear_mul_mlas,
    quantize_linear_mlas,
    quantize_pool_onnxruntime,
    requantize_mlas,
    requantize_multiplier_onnxruntime,
    requantize_scale_onnxruntime,
    scale_output_mlas,
    sigmoid_float32,
)
