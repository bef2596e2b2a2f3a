"""`lower-quant-ops`: lower `quant.qcast` and `quant.dcast` to arith, math, tensor, shape and linalg ops.

Upstream MLIR's pass of the same name (mlir/lib/Dialect/Quant/Transforms/LowerQuantOps.cpp), anchored on
every `func.func`, reproduced op for op: with the default `rounding=mlir` our output is byte-identical to
`mlir-opt --lower-quant-ops`. `quant.scast` stays: it is the interface between the quantized values a
function exchanges and the storage integers (signless `iN`, also for `u8`) the emitted arithmetic uses.

What it emits, per quantized type:

- per-tensor (scalar, 0-d, ranked, unranked): `arith.constant` scale and zero point, a `tensor.splat` of
  each for tensors (sized by `tensor.dim` for dynamic dimensions), then the arithmetic below; unranked
  tensors are flattened to `tensor<?xT>` (`shape.shape_of`, `shape.num_elements`, `tensor.reshape`) and
  reshaped back;
- per-axis (ranked, unranked): dense scale and zero-point constants and one `linalg.generic` reading them
  through `(d0, ..., dn) -> (d_axis)`; unranked tensors are collapsed to `tensor<?xCx?xT>` around the
  axis (`"shape.split_at"`) and reshaped back;
- sub-channel (ranked): as per-axis, with scale tables read through `d_i floordiv block_size`.

The arithmetic (`rounding` chooses the quantize rule; see `qconvert.numerics.Rounding`):

- dequantize, both rules: `(sitofp(q) - sitofp(zp)) * scale` in the expressed type (`uitofp` for unsigned
  storage; the subtraction is left out when a per-tensor zero point is 0);
- quantize, `rounding=mlir` (upstream): `fptosi(x / scale + sitofp(zp))`, truncating toward zero, then
  `maxsi`/`minsi` only when the storage bounds are narrowed; values outside the storage range are poison;
- quantize, `rounding=onnx` (onnxruntime QuantizeLinear): `fptosi(clamp(roundeven(x / scale) + zp))`,
  clamped in float with `arith.maxnumf`/`minnumf` to `[storage_type_min, storage_type_max]` (NaN gives
  `storage_type_min`, as onnxruntime does). f16/bf16 values are divided in f32, as onnxruntime does;
  storage bounds a float type cannot hold exactly (above 24 bits in f32) are added and clamped in f64.

Upstream's dialect conversion folds before it lowers, and its folds see the IR as it was: `dcast(qcast(x))`
becomes `x` and `qcast(dcast(x))` becomes `x` when `x` has the qcast's type, while the other cast of the
pair is still lowered (its now unused ops stay, as upstream leaves them). Storage types other than
signless integers (`si8`, `ui8`, `f8E5M2`) cannot be lowered; upstream emits invalid IR for them, we
report an error at the cast.

Example (`qconvert opt --lower-quant-ops`):

    func.func @f(%arg0: f32) -> !quant.uniform<i8:f32, 2.000000e+00:10> {
      %0 = quant.qcast %arg0 : f32 to !quant.uniform<i8:f32, 2.000000e+00:10>
      return %0 : !quant.uniform<i8:f32, 2.000000e+00:10>
    }

becomes

    func.func @f(%arg0: f32) -> !quant.uniform<i8:f32, 2.000000e+00:10> {
      %cst = arith.constant 2.000000e+00 : f32
      %c10_i8 = arith.constant 10 : i8
      %0 = arith.divf %arg0, %cst : f32
      %1 = arith.sitofp %c10_i8 : i8 to f32
      %2 = arith.addf %0, %1 : f32
      %3 = arith.fptosi %2 : f32 to i8
      %4 = quant.scast %3 : i8 to !quant.uniform<i8:f32, 2.000000e+00:10>
      return %4 : !quant.uniform<i8:f32, 2.000000e+00:10>
    }

and with `--lower-quant-ops=rounding=onnx` the body becomes

      %cst = arith.constant 2.000000e+00 : f32
      %c10_i8 = arith.constant 10 : i8
      %0 = arith.divf %arg0, %cst : f32
      %1 = math.roundeven %0 : f32
      %2 = arith.sitofp %c10_i8 : i8 to f32
      %3 = arith.addf %1, %2 : f32
      %cst_0 = arith.constant -1.280000e+02 : f32
      %cst_1 = arith.constant 1.270000e+02 : f32
      %4 = arith.maxnumf %3, %cst_0 : f32
      %5 = arith.minnumf %4, %cst_1 : f32
      %6 = arith.fptosi %5 : f32 to i8
      %7 = quant.scast %6 : i8 to !quant.uniform<i8:f32, 2.000000e+00:10>
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

import numpy as np

from qconvert.errors import InputError
from qconvert.ir.attributes import AffineMapAttr, BoolAttr, DenseElementsAttr, FloatAttr, IntegerAttr
from qconvert.ir.core import Block, Builder, Operation, Region, Value
from qconvert.ir.dialects import arith, linalg, math, shape, tensor
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantCastOp, QuantizeCastOp, StorageCastOp
from qconvert.ir.parser import numpy_dtype
from qconvert.ir.quant_types import (
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
    float_dtype,
    wrap_to_width,
)
from qconvert.ir.types import (
    BF16,
    DYNAMIC,
    F16,
    F32,
    F64,
    INDEX,
    FloatType,
    IntegerType,
    RankedTensorType,
    Type,
    UnrankedTensorType,
    element_type_of,
    is_tensor,
    with_element_type,
)
from qconvert.numerics import Rounding
from qconvert.passes import ModulePass, PassResult, register_pass
from qconvert.passes.rewrite import ConversionPattern, ConversionRewriter, apply_partial_conversion

__all__ = [
    "DequantizeCastLowering",
    "LowerQuantOpsPass",
    "QuantizeCastLowering",
    "SUPPORTED_ROUNDINGS",
    "lower_quant_ops_patterns",
]

SUPPORTED_ROUNDINGS = (Rounding.MLIR_LOWERING, Rounding.ONNX)
EXTENT_TENSOR = RankedTensorType((DYNAMIC,), INDEX)  # shape::getExtentTensorType: tensor<?xindex>
UniformType = UniformQuantizedType | UniformQuantizedPerAxisType | UniformQuantizedSubChannelType
OpT = TypeVar("OpT", bound=Operation)

# The sizes of a scalar-or-tensor value (upstream's OpFoldResult list): static sizes as ints, dynamic
# sizes as the `index` values `tensor.dim` returned; empty for scalars and 0-d tensors.
MixedSizes = list[int | Value]


class OpInserter(Protocol):
    """Anything that inserts new ops at a point: `Builder`, `ConversionRewriter`."""

    def insert(self, op: OpT) -> OpT: ...


# Scalar-or-tensor helpers ---------------------------------------------------------------------------
def float_attr(value: float, float_type: FloatType) -> FloatAttr:
    """`value` rounded to `float_type` (builder.getFloatAttr)."""
    return FloatAttr(float(np.asarray(value, dtype=np.float64).astype(float_dtype(float_type))), float_type)


def storage_attr(value: int, storage_type: IntegerType) -> IntegerAttr | BoolAttr:
    """An `iN` constant; values outside `iN` wrap and read back signed (u8 zero point 200 is -56).

    An `i1` constant is a BoolAttr (`arith.constant true`), as MLIR prints every i1 integer attribute.
    """
    wrapped = int(wrap_to_width(np.asarray([value]), storage_type.width)[0])
    return BoolAttr(wrapped != 0) if storage_type.width == 1 else IntegerAttr(wrapped, storage_type)


def constant(builder: OpInserter, value: IntegerAttr | BoolAttr | FloatAttr | DenseElementsAttr) -> Value:
    return builder.insert(arith.ConstantOp.create(value)).result


def mixed_sizes(builder: OpInserter, value: Value) -> MixedSizes:
    """tensor::getMixedSizes: static sizes, and `arith.constant i` + `tensor.dim` per dynamic size."""
    value_type = value.type
    if not isinstance(value_type, RankedTensorType):
        return []
    sizes: MixedSizes = []
    for axis, size in enumerate(value_type.shape):
        if size != DYNAMIC:
            sizes.append(size)
            continue
        index = constant(builder, IntegerAttr(axis, INDEX))
        sizes.append(builder.insert(tensor.DimOp(value, index)).result)
    return sizes


def dynamic_sizes(sizes: MixedSizes) -> list[Value]:
    return [size for size in sizes if isinstance(size, Value)]


def static_shape(sizes: MixedSizes) -> tuple[int, ...]:
    return tuple(size if isinstance(size, int) else DYNAMIC for size in sizes)


def splat_like(builder: OpInserter, scalar: Value, reference_type: Type, sizes: MixedSizes) -> Value:
    """getScalarOrTensorConstant: `scalar` itself for a scalar reference, else a `tensor.splat` of `sizes`."""
    if not is_tensor(reference_type):
        return scalar
    splat_type = RankedTensorType(static_shape(sizes), scalar.type)
    return builder.insert(tensor.SplatOp(scalar, dynamic_sizes(sizes), splat_type)).result


def is_constant_zero(value: Value) -> bool:
    """matchPattern(value, m_Zero()): an `arith.constant 0` (block arguments never are)."""
    op = value.owner_op()
    return (
        isinstance(op, arith.ConstantOp)
        and isinstance(op.value, IntegerAttr | BoolAttr)
        and not op.value.value
    )


def integer_to_float(builder: OpInserter, value: Value, result_type: Type, is_signed: bool) -> Value:
    cast = arith.SIToFPOp if is_signed else arith.UIToFPOp
    return builder.insert(cast(value, result_type)).result


def float_to_integer(builder: OpInserter, value: Value, result_type: Type, is_signed: bool) -> Value:
    cast = arith.FPToSIOp if is_signed else arith.FPToUIOp
    return builder.insert(cast(value, result_type)).result


def is_exact_in(value: int, float_type: FloatType) -> bool:
    return float(np.asarray(value, dtype=np.float64).astype(float_dtype(float_type))) == value


# Element-wise arithmetic ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CastLowering:
    """How one cast is lowered: its direction, quantized type and quantize rounding rule."""

    is_quantize: bool
    quantized_type: UniformType
    rounding: Rounding

    @property
    def storage_type(self) -> IntegerType:
        storage_type = self.quantized_type.storage_type
        assert isinstance(storage_type, IntegerType)
        return storage_type

    @property
    def expressed_type(self) -> FloatType:
        expressed_type = self.quantized_type.expressed_type
        assert expressed_type is not None
        return expressed_type

    @property
    def is_onnx_quantize(self) -> bool:
        return self.is_quantize and self.rounding is Rounding.ONNX

    @property
    def scale_type(self) -> FloatType:
        """The scales' float type: f32 for ONNX quantize of f16/bf16 (as onnxruntime), else expressed."""
        if self.is_onnx_quantize and self.expressed_type in (F16, BF16):
            return F32
        return self.expressed_type

    def scale_values(self, scales: np.ndarray) -> np.ndarray:
        """Scales as the expressed type holds them (rounded once), then exactly in `scale_type`."""
        expressed = np.asarray(scales, dtype=np.float64).astype(float_dtype(self.expressed_type))
        return expressed.astype(float_dtype(self.scale_type))

    def convert(
        self, builder: OpInserter, value: Value, sizes: MixedSizes, scale: Value, zero_point: Value
    ) -> Value:
        """convertRanked: quantize or dequantize a scalar or ranked tensor by scalar scale and zero point."""
        if not self.is_quantize:
            return self.dequantize(builder, value, sizes, scale, zero_point)
        if self.rounding is Rounding.ONNX:
            return self.quantize_onnx(builder, value, sizes, scale, zero_point)
        return self.quantize_mlir(builder, value, sizes, scale, zero_point)

    def dequantize(
        self, builder: OpInserter, value: Value, sizes: MixedSizes, scale: Value, zero_point: Value
    ) -> Value:
        """`(q - zp) * scale` in the expressed type; both zero point ops are left out for a constant 0."""
        is_signed = self.quantized_type.is_signed
        scale = splat_like(builder, scale, value.type, sizes)
        result = integer_to_float(builder, value, scale.type, is_signed)
        if not is_constant_zero(zero_point):
            zero_point = splat_like(builder, zero_point, value.type, sizes)
            zero_point = integer_to_float(builder, zero_point, scale.type, is_signed)
            result = builder.insert(arith.SubFOp(result, zero_point)).result
        return builder.insert(arith.MulFOp(result, scale)).result

    def quantize_mlir(
        self, builder: OpInserter, value: Value, sizes: MixedSizes, scale: Value, zero_point: Value
    ) -> Value:
        """Upstream: `fptosi(x / scale + zp)`, then `maxsi`/`minsi` only for narrowed storage bounds."""
        is_signed = self.quantized_type.is_signed
        scale = splat_like(builder, scale, value.type, sizes)
        stored_float = builder.insert(arith.DivFOp(value, scale)).result
        if not is_constant_zero(zero_point):
            zero_point = splat_like(builder, zero_point, value.type, sizes)
            zero_point = integer_to_float(builder, zero_point, scale.type, is_signed)
            stored_float = builder.insert(arith.AddFOp(stored_float, zero_point)).result
        storage_type = with_element_type(value.type, self.storage_type)
        stored = float_to_integer(builder, stored_float, storage_type, is_signed)
        if not self.quantized_type.has_storage_type_bounds:
            return stored
        low = constant(builder, storage_attr(self.quantized_type.storage_type_min, self.storage_type))
        high = constant(builder, storage_attr(self.quantized_type.storage_type_max, self.storage_type))
        low = splat_like(builder, low, value.type, sizes)
        high = splat_like(builder, high, value.type, sizes)
        maximum, minimum = (arith.MaxSIOp, arith.MinSIOp) if is_signed else (arith.MaxUIOp, arith.MinUIOp)
        stored = builder.insert(maximum(stored, low)).result
        return builder.insert(minimum(stored, high)).result

    def quantize_onnx(
        self, builder: OpInserter, value: Value, sizes: MixedSizes, scale: Value, zero_point: Value
    ) -> Value:
        """onnxruntime QuantizeLinear: `fptosi(clamp(roundeven(x / scale) + zp, storage_min, storage_max))`.

        Numerics.quantize(..., Rounding.ONNX) is the reference: the quotient in f32 (f64 for f64), the
        zero point added to the rounded quotient, the sum saturated; with the bounds exact in the float
        type, every step is exact or monotone, so the stored integer is onnxruntime's.
        """
        quantized_type, is_signed = self.quantized_type, self.quantized_type.is_signed
        if element_type_of(value.type) != self.scale_type:
            value = builder.insert(arith.ExtFOp(value, with_element_type(value.type, self.scale_type))).result
        scale = splat_like(builder, scale, value.type, sizes)
        quotient = builder.insert(arith.DivFOp(value, scale)).result
        stored_float = builder.insert(math.RoundEvenOp(quotient)).result
        bounds = (quantized_type.storage_type_min, quantized_type.storage_type_max)
        clamp_type = self.scale_type if all(is_exact_in(b, self.scale_type) for b in bounds) else F64
        if clamp_type != self.scale_type:  # e.g. i32 in f32: 2**31 - 1 has no f32 value, so clamp in f64
            stored_float = builder.insert(
                arith.ExtFOp(stored_float, with_element_type(value.type, F64))
            ).result
        if not is_constant_zero(zero_point):
            zero_point = splat_like(builder, zero_point, value.type, sizes)
            zero_point = integer_to_float(builder, zero_point, stored_float.type, is_signed)
            stored_float = builder.insert(arith.AddFOp(stored_float, zero_point)).result
        low, high = (constant(builder, float_attr(bound, clamp_type)) for bound in bounds)
        low, high = (splat_like(builder, bound, value.type, sizes) for bound in (low, high))
        # maxnumf/minnumf return the non-NaN operand: NaN saturates to storage_type_min, as in onnxruntime.
        stored_float = builder.insert(arith.MaxNumFOp(stored_float, low)).result
        stored_float = builder.insert(arith.MinNumFOp(stored_float, high)).result
        storage_type = with_element_type(value.type, self.storage_type)
        return float_to_integer(builder, stored_float, storage_type, is_signed)


# Per-tensor, per-axis and sub-channel lowering ------------------------------------------------------
def flatten_unranked(builder: OpInserter, value: Value) -> tuple[Value, Value]:
    """flattenUnrankedTensor: `(tensor<?xT> value, original shape)`."""
    assert isinstance(value.type, UnrankedTensorType)
    input_shape = builder.insert(shape.ShapeOfOp(value, EXTENT_TENSOR)).result
    size = builder.insert(shape.NumElementsOp(input_shape, INDEX)).result
    flat_shape = builder.insert(tensor.FromElementsOp([size], RankedTensorType((1,), INDEX))).result
    flat_type = RankedTensorType((DYNAMIC,), value.type.element_type)
    return builder.insert(tensor.ReshapeOp(value, flat_shape, flat_type)).result, input_shape


def flatten_unranked_around_axis(
    builder: OpInserter, value: Value, axis: int, axis_size: int
) -> tuple[Value, Value]:
    """flattenUnrankedTensorAroundAxis: `(tensor<?x{axis_size}x?xT> value, original shape)`."""
    assert isinstance(value.type, UnrankedTensorType)
    input_shape = builder.insert(shape.ShapeOfOp(value, EXTENT_TENSOR)).result
    axis_value = constant(builder, IntegerAttr(axis, INDEX))
    axis_next_value = constant(builder, IntegerAttr(axis + 1, INDEX))
    shape_left = builder.insert(shape.SplitAtOp([input_shape, axis_value], [EXTENT_TENSOR] * 2)).results[0]
    size_left = builder.insert(shape.NumElementsOp(shape_left, INDEX)).result
    shape_right = builder.insert(
        shape.SplitAtOp([input_shape, axis_next_value], [EXTENT_TENSOR] * 2)
    ).results[1]
    size_right = builder.insert(shape.NumElementsOp(shape_right, INDEX)).result
    axis_size_value = constant(builder, IntegerAttr(axis_size, INDEX))
    flat_shape_type = RankedTensorType((3,), INDEX)
    flat_shape = builder.insert(
        tensor.FromElementsOp([size_left, axis_size_value, size_right], flat_shape_type)
    )
    flat_type = RankedTensorType((DYNAMIC, axis_size, DYNAMIC), value.type.element_type)
    return builder.insert(tensor.ReshapeOp(value, flat_shape.result, flat_type)).result, input_shape


def restore_unranked(builder: OpInserter, value: Value, input_shape: Value) -> Value:
    """restoreUnrankedTensorShape: reshape back to `tensor<*xT>`."""
    unranked_type = UnrankedTensorType(element_type_of(value.type))
    return builder.insert(tensor.ReshapeOp(value, input_shape, unranked_type)).result


def lower_per_layer(builder: OpInserter, lowering: CastLowering, value: Value) -> Value:
    """convertPerLayer: unranked tensors are flattened to rank 1, then reshaped back."""
    if isinstance(value.type, UnrankedTensorType):
        flat_value, input_shape = flatten_unranked(builder, value)
        return restore_unranked(builder, lower_per_layer_ranked(builder, lowering, flat_value), input_shape)
    return lower_per_layer_ranked(builder, lowering, value)


def lower_per_layer_ranked(builder: OpInserter, lowering: CastLowering, value: Value) -> Value:
    """convertPerLayerRanked: scalar scale and zero point constants, splatted over tensors."""
    quantized_type = lowering.quantized_type
    assert isinstance(quantized_type, UniformQuantizedType)
    scale_value = float(lowering.scale_values(np.asarray(quantized_type.scale)))
    scale = constant(builder, FloatAttr(scale_value, lowering.scale_type))
    zero_point = constant(builder, storage_attr(quantized_type.zero_point, lowering.storage_type))
    sizes = mixed_sizes(builder, value)
    return lowering.convert(builder, value, sizes, scale, zero_point)


def lower_with_generic(
    builder: OpInserter,
    lowering: CastLowering,
    value: Value,
    scales: np.ndarray,
    zero_points: np.ndarray,
    parameter_map: AffineMapAttr,
) -> Value:
    """convertPerChannelRanked / convertSubChannel: a `linalg.generic` reading per-element parameters."""
    value_type = value.type
    assert isinstance(value_type, RankedTensorType)
    rank = value_type.rank
    scales_type = RankedTensorType(scales.shape, lowering.scale_type)
    scales_value = constant(builder, DenseElementsAttr(lowering.scale_values(scales), scales_type))
    storage_type = lowering.storage_type
    zero_points_type = RankedTensorType(zero_points.shape, storage_type)
    zero_points = wrap_to_width(zero_points, storage_type.width).astype(numpy_dtype(storage_type))
    zero_points_value = constant(builder, DenseElementsAttr(zero_points, zero_points_type))
    result_element = storage_type if lowering.is_quantize else lowering.expressed_type
    sizes = mixed_sizes(builder, value)
    init_type = RankedTensorType(static_shape(sizes), result_element)
    init = builder.insert(tensor.EmptyOp(dynamic_sizes(sizes), init_type)).result

    body = Block([value_type.element_type, lowering.scale_type, storage_type, result_element])
    body_builder = Builder(body)
    element, scale, zero_point, _ = body.arguments
    result = lowering.convert(body_builder, element, [], scale, zero_point)
    body_builder.insert(linalg.YieldOp([result]))

    identity = AffineMapAttr(rank, 0, tuple(f"d{axis}" for axis in range(rank)))
    generic = linalg.GenericOp.create(
        inputs=[value, scales_value, zero_points_value],
        outputs=[init],
        result_types=[init_type],
        indexing_maps=[identity, parameter_map, parameter_map, identity],
        iterator_types=["parallel"] * rank,
        body=Region([body]),
    )
    return builder.insert(generic).result


def lower_per_channel(builder: OpInserter, lowering: CastLowering, value: Value) -> Value:
    """convertPerChannel: unranked tensors are collapsed to rank 3 around the axis, then reshaped back."""
    quantized_type = lowering.quantized_type
    assert isinstance(quantized_type, UniformQuantizedPerAxisType)
    axis = quantized_type.quantized_dimension
    if isinstance(value.type, UnrankedTensorType):
        axis_size = len(quantized_type.scales)
        flat_value, input_shape = flatten_unranked_around_axis(builder, value, axis, axis_size)
        return restore_unranked(
            builder, lower_per_channel_ranked(builder, lowering, flat_value, 1), input_shape
        )
    return lower_per_channel_ranked(builder, lowering, value, axis)


def lower_per_channel_ranked(builder: OpInserter, lowering: CastLowering, value: Value, axis: int) -> Value:
    """convertPerChannelRanked: scale and zero point of element `i` are entry `i[axis]` of the constants."""
    quantized_type = lowering.quantized_type
    assert isinstance(quantized_type, UniformQuantizedPerAxisType)
    assert isinstance(value.type, RankedTensorType)
    return lower_with_generic(
        builder,
        lowering,
        value,
        np.asarray(quantized_type.scales, dtype=np.float64),
        np.asarray(quantized_type.zero_points, dtype=np.int64),
        AffineMapAttr(value.type.rank, 0, (f"d{axis}",)),
    )


def lower_sub_channel(builder: OpInserter, lowering: CastLowering, value: Value) -> Value:
    """convertSubChannel: axis i of the scale table is `d_i floordiv block_size`, or 0 when not blocked."""
    quantized_type = lowering.quantized_type
    assert isinstance(quantized_type, UniformQuantizedSubChannelType)
    assert isinstance(value.type, RankedTensorType), "the verifier requires a ranked tensor"
    results = ["0"] * value.type.rank
    for axis, block_size in quantized_type.block_size_info:  # a repeated axis keeps its last block size
        results[axis] = f"d{axis}" if block_size == 1 else f"d{axis} floordiv {block_size}"
    return lower_with_generic(
        builder,
        lowering,
        value,
        quantized_type.scales.array,
        quantized_type.zero_points.array,
        AffineMapAttr(value.type.rank, 0, tuple(results)),
    )


def lower_quantized(builder: OpInserter, lowering: CastLowering, value: Value) -> Value:
    """convertQuantized: dispatch on the granularity of the quantized type."""
    match lowering.quantized_type:
        case UniformQuantizedType():
            return lower_per_layer(builder, lowering, value)
        case UniformQuantizedPerAxisType():
            return lower_per_channel(builder, lowering, value)
        case UniformQuantizedSubChannelType():
            return lower_sub_channel(builder, lowering, value)


def lowerable_type(op: Operation, quantized_type: Type) -> UniformType:
    """The uniform quantized type of a cast, or an error at the cast when it has no lowering."""
    if not isinstance(quantized_type, UniformType):
        raise op.error(
            f"cannot lower quantized type {quantized_type}: only !quant.uniform types can be lowered"
        )
    storage_type = quantized_type.storage_type
    if not (isinstance(storage_type, IntegerType) and storage_type.is_signless):
        raise op.error(
            f"cannot lower quantized type {quantized_type}: storage type "
            f"{quantized_type.storage_type_spelling} is not a signless integer type"
        )
    return quantized_type


# Patterns -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DequantizeCastLowering:
    """`quant.dcast %q` -> `quant.scast %q` to storage integers, then `(q - zp) * scale` on them."""

    root: ClassVar[type[Operation]] = DequantizeCastOp

    def match_and_rewrite(self, op: Operation, rewriter: ConversionRewriter) -> bool:
        assert isinstance(op, DequantizeCastOp)
        quantized_type = lowerable_type(op, element_type_of(op.input.type))
        storage_container = with_element_type(op.input.type, quantized_type.storage_type)
        stored = rewriter.insert(StorageCastOp(op.input, storage_container)).result
        lowering = CastLowering(
            is_quantize=False, quantized_type=quantized_type, rounding=Rounding.MLIR_LOWERING
        )
        rewriter.replace_op(op, [lower_quantized(rewriter, lowering, stored)])
        return True


@dataclass(frozen=True, slots=True)
class QuantizeCastLowering:
    """`quant.qcast %x` -> integers by the `rounding` rule, then `quant.scast` to the quantized type."""

    root: ClassVar[type[Operation]] = QuantizeCastOp
    rounding: Rounding = Rounding.MLIR_LOWERING

    def match_and_rewrite(self, op: Operation, rewriter: ConversionRewriter) -> bool:
        assert isinstance(op, QuantizeCastOp)
        quantized_type = lowerable_type(op, element_type_of(op.result.type))
        lowering = CastLowering(is_quantize=True, quantized_type=quantized_type, rounding=self.rounding)
        stored = lower_quantized(rewriter, lowering, op.input)
        rewriter.replace_op(op, [rewriter.insert(StorageCastOp(stored, op.result.type)).result])
        return True


def lower_quant_ops_patterns(rounding: Rounding = Rounding.MLIR_LOWERING) -> tuple[ConversionPattern, ...]:
    """populateLowerQuantOpsPatterns: the dcast and qcast lowerings, for `apply_partial_conversion`."""
    return (DequantizeCastLowering(), QuantizeCastLowering(Rounding(rounding)))


def fold_quant_cast(op: Operation) -> Value | None:
    """The cast's folder (upstream's dialect conversion folds before it converts); None for other ops."""
    return op.fold() if isinstance(op, QuantCastOp) else None


# The pass -------------------------------------------------------------------------------------------
@register_pass
@dataclass(frozen=True, kw_only=True)
class LowerQuantOpsPass(ModulePass):
    """Lower quant.dcast and quant.qcast ops in every `func.func`; `quant.scast` remains (see module doc)."""

    name: ClassVar[str] = "lower-quant-ops"
    anchor: ClassVar[type[Operation]] = FuncOp
    rounding: Rounding = Rounding.MLIR_LOWERING

    def __post_init__(self) -> None:
        try:
            rounding = Rounding(self.rounding)
        except ValueError:
            rounding = None
        if rounding not in SUPPORTED_ROUNDINGS:
            choices = ", ".join(r.value for r in SUPPORTED_ROUNDINGS)
            raise InputError(
                f"pass '{self.name}': rounding '{self.rounding}' is not supported (choose {choices})"
            )
        object.__setattr__(self, "rounding", rounding)

    def run(self, module: Operation) -> PassResult:
        """Convert each function directly inside `module` (or `module` itself when it is a function)."""
        patterns = lower_quant_ops_patterns(self.rounding)
        if isinstance(module, FuncOp):
            functions = [module]
        else:
            functions = [op for region in module.regions for block in region.blocks for op in block.ops]
        changed = False
        for function in functions:
            if isinstance(function, FuncOp) and not function.is_declaration:
                changed |= apply_partial_conversion(function, patterns, fold_quant_cast)
        return PassResult(changed)
