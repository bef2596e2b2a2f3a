"""The `quant` dialect's type family: any, uniform (per-tensor, per-axis, sub-channel), calibrated, quantile.

NOTE: every type checks upstream's invariants (QuantTypes.cpp `verifyInvariants`) in `__post_init__`, with
upstream's message text, so an invalid type cannot exist; the parser adds the source location.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from qconvert.errors import VerifyError
from qconvert.ir.float_format import format_diagnostic_float
from qconvert.ir.types import FloatType, IntegerType, Signedness, Type
from qconvert.numerics import UniformParams, integer_storage_dtype

MAX_STORAGE_BITS = 32

# Float types that may hold quantized storage values, with their numpy equivalents.
FLOAT_STORAGE_DTYPES: dict[str, np.dtype] = {
    "f8E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "f8E4M3": np.dtype(ml_dtypes.float8_e4m3),
    "f8E4M3FN": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "f8E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "f8E4M3B11FNUZ": np.dtype(ml_dtypes.float8_e4m3b11fnuz),
    "f8E3M4": np.dtype(ml_dtypes.float8_e3m4),
    "f8E8M0FNU": np.dtype(ml_dtypes.float8_e8m0fnu),
    "f6E2M3FN": np.dtype(ml_dtypes.float6_e2m3fn),
    "f6E3M2FN": np.dtype(ml_dtypes.float6_e3m2fn),
    "f4E2M1FN": np.dtype(ml_dtypes.float4_e2m1fn),
}

# The small floats that implement upstream's QuantStorageTypeInterface: the legal float storage of
# !quant.any / !quant.uniform (a quantile type takes any float).
QUANT_FLOAT_STORAGE_TYPES = frozenset({"f8E5M2", "f8E4M3FN", "f4E2M1FN"})

EXPRESSED_DTYPES: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}


def float_dtype(float_type: FloatType) -> np.dtype:
    """The numpy dtype of a float type (expressed or storage)."""
    dtype = EXPRESSED_DTYPES.get(float_type.name) or FLOAT_STORAGE_DTYPES.get(float_type.name)
    if dtype is None:
        raise VerifyError(f"no numpy equivalent of {float_type.name}")
    return dtype


# Types without a numpy equivalent, as upstream sees them after `convertToDouble` (f80/f128 over- and
# underflow a double, so every non-negative scale passes).
SCALE_RANGES_WITHOUT_DTYPE = {
    "tf32": (2.0**-136, (2 - 2**-10) * 2.0**127),
    "f80": (0.0, math.inf),
    "f128": (0.0, math.inf),
}


@functools.cache  # asked once per scale: 65,536 times for a large per-axis type
def scale_range(expressed_type: FloatType) -> tuple[float, float]:
    """[smallest positive subnormal, largest finite] of a float type: the legal range of a scale."""
    if expressed_type.name in SCALE_RANGES_WITHOUT_DTYPE:
        return SCALE_RANGES_WITHOUT_DTYPE[expressed_type.name]
    info = ml_dtypes.finfo(float_dtype(expressed_type))
    smallest = info.smallest_subnormal if float(info.smallest_subnormal) > 0 else info.tiny
    return float(smallest), float(info.max)


def default_storage_range(storage_type: Type, is_signed: bool) -> tuple[int, int]:
    """The full range of a storage type: [-2^(w-1), 2^(w-1)-1], [0, 2^w-1], or a float's finite range."""
    if isinstance(storage_type, IntegerType):
        width = storage_type.width
        if width == 0:
            return 0, 0
        if is_signed:
            return -(1 << (width - 1)), (1 << (width - 1)) - 1
        return 0, (1 << width) - 1
    if isinstance(storage_type, FloatType) and storage_type.name in FLOAT_STORAGE_DTYPES | EXPRESSED_DTYPES:
        info = ml_dtypes.finfo(float_dtype(storage_type))
        return int(info.min), int(info.max)
    raise VerifyError("storage type must be integral")


def storage_type_spelling(storage_type: Type, is_signed: bool) -> str:
    """`i8`/`u8` for signless storage by the signed flag, else as written: `si8`, `ui8`, `f8E5M2`."""
    if isinstance(storage_type, IntegerType):
        if storage_type.signedness is Signedness.SIGNLESS:
            return f"{'i' if is_signed else 'u'}{storage_type.width}"
        return f"{storage_type.signedness.value}i{storage_type.width}"
    assert isinstance(storage_type, FloatType)
    return storage_type.name


def check_scale_in_expressed_range(scale: float, expressed_type: FloatType) -> None:
    """Upstream `isScaleInExpressedTypeRange`: zero, negative, NaN and overflowing scales are illegal."""
    low, high = scale_range(expressed_type)
    if scale < low or scale > high:  # NaN passes, as upstream's comparison lets it
        raise VerifyError(
            f"scale {format_diagnostic_float(scale)} out of expressed type range "
            f"[{format_diagnostic_float(low)}, {format_diagnostic_float(high)}]"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizedType(Type):
    """Common part of every quantized type: storage type, signedness flag, storage bounds, expressed type."""

    storage_type: IntegerType | FloatType
    expressed_type: FloatType | None
    is_signed: bool = True
    storage_type_min: int = None  # type: ignore[assignment]  # filled with the default range when None
    storage_type_max: int = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.storage_type, IntegerType | FloatType) or (
            isinstance(self.storage_type, FloatType)
            and self.storage_type.name not in QUANT_FLOAT_STORAGE_TYPES
        ):
            raise VerifyError("storage type must be integral")
        width = self.storage_type.width
        if isinstance(self.storage_type, IntegerType) and (width == 0 or width > MAX_STORAGE_BITS):
            raise VerifyError(f"illegal storage type size: {width}")
        default_min, default_max = default_storage_range(self.storage_type, self.is_signed)
        if self.storage_type_min is None:
            object.__setattr__(self, "storage_type_min", default_min)
        if self.storage_type_max is None:
            object.__setattr__(self, "storage_type_max", default_max)
        low, high = self.storage_type_min, self.storage_type_max
        if high - low <= 0 or low < default_min or high > default_max:
            raise VerifyError(f"illegal storage min and storage max: ({low}:{high})")

    @property
    def storage_type_spelling(self) -> str:
        return storage_type_spelling(self.storage_type, self.is_signed)

    @property
    def has_storage_type_bounds(self) -> bool:
        """True when the bounds are narrower than the storage type's full range (they are then printed)."""
        return (self.storage_type_min, self.storage_type_max) != default_storage_range(
            self.storage_type, self.is_signed
        )

    @property
    def storage_type_integral_width(self) -> int:
        return self.storage_type.width

    def check_expressed_float(self) -> FloatType:
        if self.expressed_type is None:
            raise VerifyError("uniform quantization requires expressed type")
        if not isinstance(self.expressed_type, FloatType):
            raise VerifyError("expressed type must be floating point")
        return self.expressed_type


@dataclass(frozen=True, slots=True, kw_only=True)
class AnyQuantizedType(QuantizedType):
    """`!quant.any<i8<-8:7>:f32>`: a quantized type whose parameters are not decided yet."""

    expressed_type: FloatType | None = None

    def __post_init__(self) -> None:
        QuantizedType.__post_init__(self)  # not super(): slots=True breaks zero-arg super()
        if self.expressed_type is not None and (not isinstance(self.expressed_type, FloatType)):
            raise VerifyError("expressed type must be floating point")


@dataclass(frozen=True, slots=True, kw_only=True)
class UniformQuantizedType(QuantizedType):
    """`!quant.uniform<i8:f32, 0.5:-3>`: one scale and zero point for the whole tensor."""

    scale: float
    zero_point: int = 0

    def __post_init__(self) -> None:
        QuantizedType.__post_init__(self)
        check_scale_in_expressed_range(self.scale, self.check_expressed_float())


@dataclass(frozen=True, slots=True, kw_only=True)
class UniformQuantizedPerAxisType(QuantizedType):
    """`!quant.uniform<i8:f32:1, {0.5,0.25:3}>`: one scale and zero point per slice along an axis."""

    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    quantized_dimension: int

    def __post_init__(self) -> None:
        QuantizedType.__post_init__(self)
        expressed_type = self.check_expressed_float()
        if len(self.scales) != len(self.zero_points):
            raise VerifyError(
                f"illegal number of scales and zeroPoints: {len(self.scales)}, {len(self.zero_points)}"
            )
        low, high = scale_range(expressed_type)
        scales = np.asarray(self.scales, dtype=np.float64)
        if np.any((scales < low) | (scales > high)):  # vectorised: 65,536 scales must stay fast
            bad = next(s for s in self.scales if s < low or s > high)
            check_scale_in_expressed_range(bad, expressed_type)
        if self.quantized_dimension < 0:
            raise VerifyError(f"illegal quantized dimension: {self.quantized_dimension}")


@dataclass(frozen=True, slots=True, eq=False)
class DenseParameters:
    """An immutable N-d table of sub-channel scales or zero points, hashed by dtype, shape and bytes."""

    array: np.ndarray
    _hash: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        array = np.ascontiguousarray(self.array)
        array.setflags(write=False)
        object.__setattr__(self, "array", array)
        object.__setattr__(self, "_hash", hash((array.dtype.str, array.shape, array.tobytes())))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DenseParameters)
            and self.array.dtype == other.array.dtype
            and self.array.shape == other.array.shape
            and np.array_equal(self.array.view(np.uint8), other.array.view(np.uint8))
        )

    def __hash__(self) -> int:
        return self._hash

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape


def wrap_to_width(values: np.ndarray, width: int) -> np.ndarray:
    """Two's-complement wrap of int64 values to `width` bits, read back signed (as an APInt)."""
    values = np.asarray(values, dtype=np.int64)
    if width >= 64:
        return values
    mask = (1 << width) - 1
    wrapped = values & mask
    return np.where(wrapped >= (1 << (width - 1)), wrapped - (1 << width), wrapped).astype(np.int64)


@dataclass(frozen=True, slots=True, kw_only=True)
class UniformQuantizedSubChannelType(QuantizedType):
    """`!quant.uniform<i8:f32:{0:1, 1:2}, {{s00, s01}, {s10, s11}}>`: one scale per block of the tensor.

    `scales` holds values of the expressed type; `zero_points` holds the storage-width two's-complement
    values, read back signed, as upstream's APInt storage does (a u8 zero point 200 reads -56).
    """

    scales: DenseParameters
    zero_points: DenseParameters
    quantized_dimensions: tuple[int, ...]
    block_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        QuantizedType.__post_init__(self)
        expressed_type = self.check_expressed_float()
        if self.scales.array.dtype != float_dtype(expressed_type):
            raise VerifyError(
                f"type of scale values {self.scales.array.dtype} must match the expressed type "
                f"{expressed_type}"
            )
        if self.scales.shape != self.zero_points.shape:
            raise VerifyError(
                f"shape of scales and zeroPoints ({'x'.join(map(str, self.scales.shape))}) does not match"
            )
        if len(self.quantized_dimensions) != len(self.block_sizes):
            raise VerifyError(
                f"number of quantized dimensions and block sizes don't match "
                f"{len(self.quantized_dimensions)} and {len(self.block_sizes)}"
            )
        for dimension in self.quantized_dimensions:
            if dimension < 0:
                raise VerifyError(f"illegal quantized dimension: {dimension}")
        for block_size in self.block_sizes:
            if block_size <= 0:
                raise VerifyError(f"illegal block size: {block_size}")
        low, high = scale_range(expressed_type)
        scales = self.scales.array.astype(np.float64)
        out_of_range = (scales < low) | (scales > high)
        if np.any(out_of_range):
            check_scale_in_expressed_range(float(scales[out_of_range][0]), expressed_type)

    @property
    def block_size_info(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.quantized_dimensions, self.block_sizes, strict=True))


def blocked_type(
    *,
    storage_type: IntegerType | FloatType,
    expressed_type: FloatType,
    is_signed: bool,
    scales: np.ndarray,
    zero_points: np.ndarray,
    tensor_shape: tuple[int, ...],
    axis: int,
    block_size: int,
) -> UniformQuantizedSubChannelType:
    """The sub-channel type of ONNX blocked quantization (`scales` / `zero_points` shaped like the tensor,
    `ceil(size / block_size)` along `axis`): `axis` is listed with `block_size`, every other dimension
    of size > 1 with block size 1 (a size-1 dimension needs no entry)."""
    dimensions = tuple(d for d in range(len(tensor_shape)) if d == axis or tensor_shape[d] > 1)
    return UniformQuantizedSubChannelType(
        storage_type=storage_type,
        expressed_type=expressed_type,
        is_signed=is_signed,
        scales=DenseParameters(np.asarray(scales).astype(float_dtype(expressed_type))),
        zero_points=DenseParameters(wrap_to_width(zero_points, storage_type.width)),
        quantized_dimensions=dimensions,
        block_sizes=tuple(block_size if d == axis else 1 for d in dimensions),
    )


@dataclass(frozen=True, slots=True)
class CalibratedQuantizedType(Type):
    """`!quant.calibrated<f32<-0.998:1.2321>>`: an observed [min, max] range, not yet quantized."""

    expressed_type: FloatType
    min: float
    max: float

    def __post_init__(self) -> None:
        if not isinstance(self.expressed_type, FloatType):
            raise VerifyError("expressed type must be floating point")
        if not self.max > self.min:
            raise VerifyError(
                f"illegal min and max: ({format_diagnostic_float(self.min)}:"
                f"{format_diagnostic_float(self.max)})"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantileQuantizedType(Type):
    """`!quant.quantile<ui4:f16, {v0,...,v15}[, <lo:hi>]>`: storage codes index a lookup table of values.

    `quantile_type` is the type of the table's values; `has_explicit_range` records a written `<lo:hi>`.
    """

    storage_type: Type
    quantile_type: Type
    quantiles: tuple[float, ...]
    is_signed: bool = True
    storage_type_min: int = None  # type: ignore[assignment]
    storage_type_max: int = None  # type: ignore[assignment]
    has_explicit_range: bool = False

    def __post_init__(self) -> None:
        storage = self.storage_type
        if not isinstance(storage, IntegerType | FloatType):
            raise VerifyError("storage type must be an integer or float type")
        if not isinstance(self.quantile_type, IntegerType | FloatType):
            raise VerifyError("quantile type must be a float or integer type")
        if not self.quantiles:
            raise VerifyError("quantile values must not be empty")
        if not all(math.isfinite(value) for value in self.quantiles):
            raise VerifyError("quantile values must be finite (no NaN or infinity)")
        default_min, default_max = default_storage_range(storage, self.is_signed)
        if self.storage_type_min is None:
            object.__setattr__(self, "storage_type_min", default_min)
        if self.storage_type_max is None:
            object.__setattr__(self, "storage_type_max", default_max)
        if self.has_explicit_range and self.storage_type_min >= self.storage_type_max:
            raise VerifyError("storage min must be less than storage max")
        if self.has_explicit_range:
            expected = self.storage_type_max - self.storage_type_min + 1
        else:
            expected = 1 << storage.width
        if len(self.quantiles) != expected:
            raise VerifyError(
                f"quantile LUT size ({len(self.quantiles)}) must equal the number of representable "
                f"storage values ({expected})"
            )

    @property
    def storage_type_spelling(self) -> str:
        return storage_type_spelling(self.storage_type, self.is_signed)


AnyQuantType = (
    AnyQuantizedType
    | UniformQuantizedType
    | UniformQuantizedPerAxisType
    | UniformQuantizedSubChannelType
    | CalibratedQuantizedType
    | QuantileQuantizedType
)
UNIFORM_TYPES = (UniformQuantizedType, UniformQuantizedPerAxisType, UniformQuantizedSubChannelType)


def is_quantized(type_: Type) -> bool:
    """True for every `!quant.*` type."""
    return isinstance(type_, QuantizedType | CalibratedQuantizedType | QuantileQuantizedType)


def uniform_params(quant_type: QuantizedType) -> UniformParams:
    """The numerics parameters of a `!quant.uniform` type (per-tensor, per-axis or sub-channel)."""
    storage = quant_type.storage_type
    if isinstance(storage, IntegerType):
        storage_dtype = integer_storage_dtype(storage.width, quant_type.is_signed)
    else:
        storage_dtype = float_dtype(storage)
    assert isinstance(quant_type.expressed_type, FloatType)
    common = {
        "storage_dtype": storage_dtype,
        "storage_type_min": quant_type.storage_type_min,
        "storage_type_max": quant_type.storage_type_max,
        "expressed_dtype": float_dtype(quant_type.expressed_type),
    }
    width = storage.width

    def unwrap(zero_points: np.ndarray) -> np.ndarray:
        values = np.asarray(zero_points, dtype=np.int64)
        if isinstance(storage, IntegerType) and not quant_type.is_signed:
            values = values & ((1 << width) - 1)
        return values

    if isinstance(quant_type, UniformQuantizedType):
        return UniformParams(
            scale=np.array(quant_type.scale), zero_point=unwrap(np.array(quant_type.zero_point)), **common
        )
    if isinstance(quant_type, UniformQuantizedPerAxisType):
        return UniformParams(
            scale=np.array(quant_type.scales),
            zero_point=unwrap(np.array(quant_type.zero_points)),
            quantized_dimension=quant_type.quantized_dimension,
            **common,
        )
    if isinstance(quant_type, UniformQuantizedSubChannelType):
        return UniformParams(
            scale=quant_type.scales.array.astype(np.float64),
            zero_point=unwrap(quant_type.zero_points.array),
            block_sizes=quant_type.block_size_info,
            **common,
        )
    raise VerifyError(f"no uniform quantization parameters for {quant_type}")
