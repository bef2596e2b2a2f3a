"""stablehlo-legalize-to-tosa on StableHLO's quantized form: one pattern per StableHLO op, each computing on
storage integers (storage.py), and the folds that clean up after them.

Quantized ops are exact on storage when nothing changes scale: data movement (transpose, reshape,
broadcast_in_dim, slice, concatenate, pad), max / min / clamp of one type, and the add of an i32 bias to the
i32 accumulator of the same scale (the fused form's). Convolution and dot_general take their zero points
as TOSA operands and accumulate in i32. Every change of scale is legalize_quant.py's rescale. A pattern
that cannot legalize an op records why (`Refusals`), for the one InputError convert.py raises.
"""

from __future__ import annotations

import re
from typing import ClassVar

import numpy as np

from qconvert.ir.attributes import DenseArrayAttr, DenseElementsAttr, IntegerAttr
from qconvert.ir.core import GenericOp, Operation, Value
from qconvert.ir.quant_types import QuantizedType, UniformQuantizedPerAxisType
from qconvert.ir.types import I8, I32, I64, FloatType, IntegerType, RankedTensorType, Type, element_type_of
from qconvert.numerics.tosa import TosaRounding
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .float_island import splat_value
from .legalize_quant import I16, INT16_ZERO_POINT, exact_to_i32, rescale_to, storage_zero_point
from .storage import (
    CAST,
    Refusals,
    broadcast_source,
    constant_of,
    materialize,
    quant_type,
    replace_with_storage,
    storage_element,
    storage_of,
    storage_type,
)

__all__ = ["ELEMENTWISE", "fold_patterns", "legalize_patterns"]


def _ints(op: Operation, name: str, default: list[int] | None = None) -> list[int]:
    attribute = op.attributes.get(name)
    if attribute is None:
        assert default is not None, f"{op.name} has no {name}"
        return list(default)
    if isinstance(attribute, DenseArrayAttr):
        return [int(v) for v in attribute.values]
    if isinstance(attribute, DenseElementsAttr):
        return [int(v) for v in np.asarray(attribute.array).reshape(-1)]
    if isinstance(attribute, IntegerAttr):
        return [attribute.value]
    raise AssertionError(f"{op.name}: unexpected {name} {attribute}")


def _pairs(op: Operation, name: str, rank: int) -> np.ndarray:
    """A `padding` attribute (`dense<1> : tensor<Rx2xi64>`, possibly a splat) as an (R, 2) array."""
    attribute = op.attributes.get(name)
    if attribute is None:
        return np.zeros((rank, 2), np.int64)
    assert isinstance(attribute, DenseElementsAttr)
    return np.broadcast_to(np.asarray(attribute.array, np.int64), (rank, 2))


def _ranked(value: Value) -> RankedTensorType:
    assert isinstance(value.type, RankedTensorType), f"expected a ranked tensor: {value.type}"
    return value.type


def _transposed(rewriter: PatternRewriter, value: Value, perms: list[int]) -> Value:
    return value if perms == sorted(perms) else ops.transpose(rewriter, value, perms)


def _is_narrowed(value: Value) -> bool:
    """An i64 value that is an i32 one read through a cast: token ids narrowed by index_ops.py."""
    producer = value.owner_op()
    return (
        producer is not None and producer.name == CAST and element_type_of(producer.operands[0].type) == I32
    )


def _is_float(value: Value) -> bool:
    return isinstance(storage_element(value.type), FloatType)


def _single_zero_point(type_: QuantizedType | None) -> int | None:
    """The one zero point of a type (all channels'), None when channels differ; 0 for a plain integer."""
    if type_ is None:
        return 0
    zero_points = storage_zero_point(type_)
    return int(zero_points[0]) if np.all(zero_points == zero_points[0]) else None


class _Pattern:
    roots: ClassVar[tuple[Root, ...]]

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals

    def refuse(self, op: Operation, reason: str) -> bool:
        return self.refusals.refuse(op, reason)


# Constants and casts ------------------------------------------------------------------------------
class ConstantToConst(_Pattern):
    roots = ("stablehlo.constant",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        array = constant_of(op.result)
        if array is None:
            return self.refuse(op, "a constant without its data (elided)")
        element = storage_element(op.result.type)
        array = np.asarray(array)
        if array.dtype.kind == "u" and array.dtype.itemsize < 8:  # unsigned storage: its bits, signless
            array = array.view(np.dtype(f"i{array.dtype.itemsize}"))
        replace_with_storage(rewriter, op, [ops.const(rewriter, array, element)])
        return True


class BitcastConvertToStorage(_Pattern):
    """`bitcast_convert` between a quantized type and its storage: the same integers."""

    roots = ("stablehlo.bitcast_convert",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if storage_type(op.operands[0].type) != storage_type(op.result.type):
            return self.refuse(op, "a bitcast that changes the bits' type")
        replace_with_storage(rewriter, op, [storage_of(rewriter, op.operands[0])])
        return True


# Data movement ----------------------------------------------------------------------------------
class TransposeToTranspose(_Pattern):
    roots = ("stablehlo.transpose",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if _is_float(op.operands[0]):
            return False  # a float island's: FloatDataMovementOnStorage or the island's pattern
        perms = _ints(op, "permutation")
        replace_with_storage(
            rewriter, op, [ops.transpose(rewriter, storage_of(rewriter, op.operands[0]), perms)]
        )
        return True


class ReshapeToReshape(_Pattern):
    roots = ("stablehlo.reshape",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if quant_type(op.operands[0]) is None and not isinstance(
            element_type_of(op.operands[0].type), IntegerType
        ):
            return False  # a float reshape: part of a float island
        shape = _ranked(op.result).shape
        if element_type_of(op.operands[0].type) == I64:
            array = constant_of(op.operands[0])
            if array is not None:  # constant indices: read as a constant by the gather that takes them
                replace_with_storage(rewriter, op, [ops.const(rewriter, array.reshape(shape), I64)])
                return True
            if _is_narrowed(op.operands[0]):
                return False  # narrowed token ids: index_ops.py's, as i32
        replace_with_storage(
            rewriter, op, [ops.reshape(rewriter, storage_of(rewriter, op.operands[0]), shape)]
        )
        return True


class BroadcastInDimToReshapeTile(_Pattern):
    """`broadcast_in_dim` as a reshape to the result's rank (dims of 1 elsewhere), then a tile; elementwise
    patterns read the tile's input, which TOSA broadcasts."""

    roots = ("stablehlo.broadcast_in_dim",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        source, result = _ranked(op.operands[0]), _ranked(op.result)
        if isinstance(storage_element(source), FloatType):
            return False  # a float island's broadcast: the island's pattern reads it
        if element_type_of(source) == I64 and _is_narrowed(op.operands[0]):
            return False  # narrowed token ids: index_ops.py's, as i32
        dims = _ints(op, "broadcast_dimensions")
        shape = [1] * result.rank
        for index, dim in enumerate(dims):
            shape[dim] = source.shape[index]
        if dims != sorted(dims):
            return self.refuse(op, "a broadcast that also transposes")
        value = storage_of(rewriter, op.operands[0])
        if tuple(shape) != source.shape:
            value = ops.reshape(rewriter, value, shape)
        multiples = [r // s for r, s in zip(result.shape, shape, strict=True)]
        if any(m != 1 for m in multiples):
            value = ops.tile(rewriter, value, multiples)
        replace_with_storage(rewriter, op, [value])
        return True


class SliceToSlice(_Pattern):
    roots = ("stablehlo.slice",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if _is_float(op.operands[0]):
            return False  # a float island's: FloatDataMovementOnStorage or the island's pattern
        start, limit = _ints(op, "start_indices"), _ints(op, "limit_indices")
        strides = _ints(op, "strides", [1] * len(start))
        if any(s != 1 for s in strides):
            return self.refuse(op, "a strided slice")
        size = [hi - lo for lo, hi in zip(start, limit, strict=True)]
        value = ops.slice_(rewriter, storage_of(rewriter, op.operands[0]), start, size)
        replace_with_storage(rewriter, op, [value])
        return True


class ConcatenateToConcat(_Pattern):
    roots = ("stablehlo.concatenate",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if _is_float(op.operands[0]):
            return False  # a float island's: FloatDataMovementOnStorage or the island's pattern
        if any(quant_type(operand) != quant_type(op.result) for operand in op.operands):
            return self.refuse(op, "a concatenation of differently quantized values")
        axis = _ints(op, "dimension")[0]
        inputs = [storage_of(rewriter, operand) for operand in op.operands]
        replace_with_storage(rewriter, op, [ops.concat(rewriter, inputs, axis)])
        return True


class PadToPad(_Pattern):
    roots = ("stablehlo.pad",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if _is_float(op.operands[0]):
            return False  # a float island's: FloatDataMovementOnStorage or the island's pattern
        low, high = _ints(op, "edge_padding_low"), _ints(op, "edge_padding_high")
        interior = _ints(op, "interior_padding", [0] * len(low))
        if any(interior) or min(low + high) < 0:
            return self.refuse(op, "interior or negative padding")
        if quant_type(op.operands[1]) != quant_type(op.operands[0]):
            return self.refuse(op, "a padding value of another type")
        pad_value = constant_of(op.operands[1])
        if pad_value is None:
            return self.refuse(op, "a padding value that is not a constant")
        value = ops.pad(
            rewriter, storage_of(rewriter, op.operands[0]), low, high, int(pad_value.reshape(-1)[0])
        )
        replace_with_storage(rewriter, op, [value])
        return True


# Elementwise ------------------------------------------------------------------------------------
ELEMENTWISE = {
    "stablehlo.add": ops.add,
    "stablehlo.subtract": ops.sub,
    "stablehlo.maximum": ops.maximum,
    "stablehlo.minimum": ops.minimum,
}


def _is_accumulator(type_: QuantizedType) -> bool:
    """An i32 type with zero point 0: its integers add as the reals they stand for (same scale)."""
    return type_.storage_type.width == 32 and bool(np.all(storage_zero_point(type_) == 0))  # type: ignore[union-attr]


class ElementwiseOnStorage(_Pattern):
    """add / subtract / maximum / minimum where the storage computes the same: integers, the i32 accumulator
    plus a bias of its own type (zero point 0), max / min of one quantized type."""

    roots = tuple(ELEMENTWISE)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        types = {operand.type for operand in op.operands} | {op.result.type}
        element = element_type_of(op.result.type)
        storage = storage_element(element)
        if not isinstance(storage, IntegerType) or storage.width not in (8, 16, 32):
            return False  # float, or i64 (the integer end of a float island's emulation): not TOSA's
        if len(types) != 1:
            return self.refuse(
                op, "operands of different quantized types (a rescaling add is not supported yet)"
            )
        is_sum = op.name in ("stablehlo.add", "stablehlo.subtract")
        if is_sum and isinstance(element, QuantizedType) and not _is_accumulator(element):
            return self.refuse(op, "an add of quantized values that is not the i32 accumulator's")
        if isinstance(element, QuantizedType) and not element.is_signed:
            return self.refuse(op, "max / min / add of unsigned storage (TOSA compares its bits as signed)")
        lhs, rhs = (broadcast_source(storage_of(rewriter, operand)) for operand in op.operands)
        replace_with_storage(rewriter, op, [ELEMENTWISE[op.name](rewriter, lhs, rhs)])
        return True


class ClampToClamp(_Pattern):
    roots = ("stablehlo.clamp",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        low_value, operand, high_value = op.operands
        if not isinstance(storage_element(operand.type), IntegerType):
            return False
        operand_type = quant_type(operand)
        if operand_type is not None and not operand_type.is_signed:
            return self.refuse(op, "a clamp of unsigned storage (TOSA compares its bits as signed)")
        low, high = constant_of(low_value), constant_of(high_value)
        if low is None or high is None or low.size != 1 or high.size != 1:
            return self.refuse(op, "a clamp whose bounds are not scalar constants")
        if quant_type(low_value) != quant_type(operand) or quant_type(high_value) != quant_type(operand):
            return self.refuse(op, "clamp bounds of another type than the operand")
        value = ops.clamp(
            rewriter, storage_of(rewriter, operand), int(low.reshape(-1)[0]), int(high.reshape(-1)[0])
        )
        replace_with_storage(rewriter, op, [value])
        return True


# Convolution, dot ---------------------------------------------------------------------------------
def _conv_numbers(op: Operation) -> object:
    from qconvert.backends.stablehlo import ConvDimensionNumbers

    return ConvDimensionNumbers.parse(op.attributes["dimension_numbers"])


def _dot_numbers(op: Operation) -> object:
    from qconvert.backends.stablehlo import DotDimensionNumbers

    return DotDimensionNumbers.parse(op.attributes["dot_dimension_numbers"])


def _accumulating_operands(op: Operation) -> tuple[QuantizedType, QuantizedType, int, int] | str:
    """The two operands' quantized types and their single zero points, or why TOSA cannot take them."""
    lhs, rhs = quant_type(op.operands[0]), quant_type(op.operands[1])
    result = quant_type(op.result)
    if lhs is None or rhs is None or result is None:
        return "a float (not quantized) product"
    if lhs.storage_type.width not in (8, 16) or rhs.storage_type.width != 8:  # type: ignore[union-attr]
        return "operands of other than 8-bit weights and 8 / 16-bit activations"
    if isinstance(lhs, UniformQuantizedPerAxisType):
        return "a per-axis quantized activation"
    lhs_zp, rhs_zp = _single_zero_point(lhs), _single_zero_point(rhs)
    if lhs_zp is None or rhs_zp is None:
        return "per-channel weight zero points (TOSA takes one)"
    if lhs.storage_type.width == 16 and lhs_zp != 0:  # type: ignore[union-attr]
        return INT16_ZERO_POINT
    if not rhs.is_signed and constant_of(op.operands[1]) is None:
        return "an unsigned 8-bit right-hand side that is not a constant"
    # unsigned operands are re-centred to i8 (signed_storage): their zero points move by 128
    return lhs, rhs, _recentred(lhs, lhs_zp), _recentred(rhs, rhs_zp)


I48 = IntegerType(48)


def _width_of(value: Value) -> int:
    element = element_type_of(value.type)
    return element.width if isinstance(element, IntegerType) else 0


def _recentred(type_: QuantizedType, zero_point: int) -> int:
    """The zero point of `type_`'s storage as i8: an unsigned one less 128 (its bits read as signed, plus
    128: storage_zero_point gives the bits)."""
    return zero_point if type_.is_signed else (zero_point + 256) % 256 - 128


def signed_storage(rewriter: PatternRewriter, value: Value) -> Value:
    """`value`'s storage as signed i8: unsigned storage re-centred by 128 (a constant in numpy, else an exact
    rescale with input_unsigned), which TOSA's conv2d / matmul need; signed storage as it is."""
    type_ = quant_type(value)
    storage = storage_of(rewriter, value)
    if type_ is None or type_.is_signed:
        return storage
    array = constant_of(value)
    if array is not None:
        recentred = (np.asarray(array).astype(np.int64) & 0xFF) - 128
        return ops.const(rewriter, recentred.astype(np.int8), I8)
    zero_point = int(storage_zero_point(type_)[0])
    return rescale_to(
        rewriter,
        storage,
        np.array([1.0]),
        zero_point,
        _recentred(type_, zero_point),
        storage_type(value.type),
        TosaRounding.SINGLE,
        input_unsigned=True,
    )


class ConvolutionToConv2D(_Pattern):
    """2-D `convolution` as `tosa.conv2d` (or `depthwise_conv2d` when each group is one input channel) in
    NHWC / OHWI (HWCM), with transposes to and from the op's layouts (folded into constant weights)."""

    roots = ("stablehlo.convolution",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        checked = _accumulating_operands(op)
        if isinstance(checked, str):
            return self.refuse(op, checked)
        _, _, input_zp, weight_zp = checked
        numbers = _conv_numbers(op)
        layout_in, layout_kernel, layout_out = numbers.input, numbers.kernel, numbers.output  # type: ignore[attr-defined]
        if len(layout_in) != 4:
            return self.refuse(op, f"a {len(layout_in) - 2}-D convolution (TOSA conv2d is 2-D)")
        if any(d != 1 for d in _ints(op, "lhs_dilation", [1, 1])):
            return self.refuse(op, "an input dilation (a transposed convolution)")
        if _ints(op, "batch_group_count", [1])[0] != 1:
            return self.refuse(op, "a batch group count")
        padding = _pairs(op, "padding", 2)
        if np.any(padding < 0):
            return self.refuse(op, "negative padding")
        input_type, kernel_type = _ranked(op.operands[0]), _ranked(op.operands[1])
        channels = input_type.shape[layout_in.index("f")]
        groups = _ints(op, "feature_group_count", [1])[0]
        depthwise = groups > 1
        if depthwise and (groups != channels or kernel_type.shape[layout_kernel.index("i")] != 1):
            return self.refuse(op, "a grouped convolution that is not depthwise")
        nhwc = ["b", 0, 1, "f"]
        input_ = _transposed(
            rewriter, signed_storage(rewriter, op.operands[0]), [layout_in.index(d) for d in nhwc]
        )
        kernel = signed_storage(rewriter, op.operands[1])
        result_shape = _ranked(op.result).shape
        out_shape = tuple(result_shape[layout_out.index(d)] for d in nhwc)
        wide = _width_of(input_) == 16  # TOSA's int16 profile: i16 x i8 accumulates in i48
        accumulator = I48 if wide else I32
        result_type = RankedTensorType(out_shape, accumulator)
        bias = ops.const(rewriter, np.zeros((1,), np.int64 if wide else np.int32), accumulator)
        zps = ops.zero_point(rewriter, input_zp, I16 if wide else I8), ops.zero_point(rewriter, weight_zp, I8)
        stride, dilation = _ints(op, "window_strides", [1, 1]), _ints(op, "rhs_dilation", [1, 1])
        kernel_shape = _ranked(op.operands[1]).shape
        extents = [(kernel_shape[layout_kernel.index(d)] - 1) * dilation[d] + 1 for d in (0, 1)]
        input_shape = _ranked(input_).shape
        pads, rows = _strided_pads(input_shape[1:3], extents, stride, padding)
        if rows != list(input_shape[1:3]):  # the last rows no window reaches, beyond the padding
            input_ = ops.slice_(rewriter, input_, [0, 0, 0, 0], [input_shape[0], *rows, input_shape[3]])
        geometry = {"pad": pads, "stride": stride, "dilation": dilation}
        if depthwise:
            kernel = _transposed(rewriter, kernel, [layout_kernel.index(d) for d in (0, 1, "i", "o")])
            height, width, _, outputs = _ranked(kernel).shape
            kernel = ops.reshape(rewriter, kernel, [height, width, channels, outputs // channels])
            value = ops.depthwise_conv2d(
                rewriter, input_, kernel, bias, *zps, result_type, acc_type=accumulator, **geometry
            )
        else:
            kernel = _transposed(rewriter, kernel, [layout_kernel.index(d) for d in ("o", 0, 1, "i")])
            value = ops.conv2d(
                rewriter, input_, kernel, bias, *zps, result_type, acc_type=accumulator, **geometry
            )
        if wide:
            value = exact_to_i32(rewriter, value)
        value = _transposed(rewriter, value, [nhwc.index(d) for d in layout_out])
        replace_with_storage(rewriter, op, [value])
        return True


class DotGeneralToMatmul(_Pattern):
    """`dot_general` as `tosa.matmul`: each side transposed and reshaped to `[batch, free, contract]` /
    `[batch, contract, free]`, the `[B, M, N]` product reshaped to dot_general's result."""

    roots = ("stablehlo.dot_general",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        checked = _accumulating_operands(op)
        if isinstance(checked, str):
            return self.refuse(op, checked)
        _, _, lhs_zp, rhs_zp = checked
        numbers = _dot_numbers(op)
        lhs_type, rhs_type = _ranked(op.operands[0]), _ranked(op.operands[1])
        lhs_batch, rhs_batch = list(numbers.lhs_batching), list(numbers.rhs_batching)  # type: ignore[attr-defined]
        lhs_contract, rhs_contract = list(numbers.lhs_contracting), list(numbers.rhs_contracting)  # type: ignore[attr-defined]
        lhs_free = [d for d in range(lhs_type.rank) if d not in lhs_batch + lhs_contract]
        rhs_free = [d for d in range(rhs_type.rank) if d not in rhs_batch + rhs_contract]

        def size(type_: RankedTensorType, dims: list[int]) -> int:
            return int(np.prod([type_.shape[d] for d in dims]))

        batch = size(lhs_type, lhs_batch)
        lhs = _transposed(
            rewriter, signed_storage(rewriter, op.operands[0]), lhs_batch + lhs_free + lhs_contract
        )
        lhs = ops.reshape(rewriter, lhs, [batch, size(lhs_type, lhs_free), size(lhs_type, lhs_contract)])
        rhs = _transposed(
            rewriter, signed_storage(rewriter, op.operands[1]), rhs_batch + rhs_contract + rhs_free
        )
        rhs = ops.reshape(rewriter, rhs, [batch, size(rhs_type, rhs_contract), size(rhs_type, rhs_free)])
        wide = _width_of(lhs) == 16
        if wide:  # TOSA's matmul takes i16 x i16 (into i48), zero points 0: the i8 weights widened, centred
            weights = constant_of(op.operands[1])
            rhs_quant = quant_type(op.operands[1])
            if rhs_quant is None or not rhs_quant.is_signed or (weights is None and rhs_zp != 0):
                return self.refuse(
                    op, "a 16-bit matmul whose 8-bit right-hand side is unsigned or not centred"
                )
            if weights is not None:
                centred = np.transpose(
                    np.asarray(weights).astype(np.int64) - rhs_zp, rhs_batch + rhs_contract + rhs_free
                )
                rhs = ops.const(rewriter, centred.reshape(_ranked(rhs).shape).astype(np.int16), I16)
            else:
                rhs = ops.cast(rewriter, rhs, I16)
            rhs_zp = 0
        zero_point_type = I16 if wide else I8
        product = ops.matmul(
            rewriter,
            lhs,
            rhs,
            ops.zero_point(rewriter, lhs_zp, zero_point_type),
            ops.zero_point(rewriter, rhs_zp, zero_point_type),
        )
        if wide:
            product = exact_to_i32(rewriter, product)
        value = ops.reshape(rewriter, product, _ranked(op.result).shape)
        replace_with_storage(rewriter, op, [value])
        return True


# Pooling ----------------------------------------------------------------------------------------
def _lowest(type_: Type) -> int | None:
    quant = quant_type(type_)
    if quant is not None:
        return quant.storage_type_min
    element = element_type_of(type_)
    return -(1 << (element.width - 1)) if isinstance(element, IntegerType) else None


class ReduceWindowMaxToMaxPool(_Pattern):
    """`reduce_window` of `maximum` over two spatial dims of a rank-4 tensor as `tosa.max_pool2d` (NHWC)."""

    roots = ("stablehlo.reduce_window",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if len(op.operands) != 2 or not isinstance(storage_element(op.operands[0].type), IntegerType):
            return False
        body = op.regions[0].entry
        if len(body.ops) != 2 or body.ops[0].name != "stablehlo.maximum":
            return self.refuse(op, "a window reduction other than maximum")
        source = _ranked(op.operands[0])
        source_type = quant_type(op.operands[0])
        if source_type is not None and not source_type.is_signed:
            return self.refuse(op, "a max pool of unsigned storage (TOSA compares its bits as signed)")
        if source.rank != 4:
            return self.refuse(op, f"a max pool of a rank-{source.rank} tensor")
        window = _ints(op, "window_dimensions")
        strides = _ints(op, "window_strides", [1] * 4)
        padding = _pairs(op, "padding", 4)
        if any(d != 1 for d in _ints(op, "base_dilations", [1] * 4) + _ints(op, "window_dilations", [1] * 4)):
            return self.refuse(op, "a dilated max pool")
        pooled = [d for d in range(4) if window[d] != 1 or strides[d] != 1 or np.any(padding[d] != 0)]
        if set(pooled) <= {2, 3}:
            to_nhwc, from_nhwc = [0, 2, 3, 1], [0, 3, 1, 2]
        elif set(pooled) <= {1, 2}:
            to_nhwc, from_nhwc = [0, 1, 2, 3], [0, 1, 2, 3]
        else:
            return self.refuse(op, f"a max pool over dims {pooled}")
        init = constant_of(op.operands[1])
        if init is None or int(init.reshape(-1)[0]) != _lowest(op.operands[0].type):
            return self.refuse(op, "a max pool whose initial value is not the lowest storage value")
        spatial = to_nhwc[1:3]
        if any(padding[d][0] >= window[d] or padding[d][1] >= window[d] for d in spatial):
            return self.refuse(op, "a max pool padded by a whole window")
        pads = _exact_pads(source.shape, window, strides, padding, spatial)
        if pads is None:
            return self.refuse(op, "a max pool whose last window needs input the pool does not have")
        value = _transposed(rewriter, storage_of(rewriter, op.operands[0]), to_nhwc)
        result_shape = _ranked(op.result).shape
        out_type = RankedTensorType(tuple(result_shape[d] for d in to_nhwc), storage_element(op.result.type))
        value = ops.max_pool2d(
            rewriter,
            value,
            out_type,
            kernel=[window[d] for d in spatial],
            stride=[strides[d] for d in spatial],
            pad=pads,
        )
        replace_with_storage(rewriter, op, [_transposed(rewriter, value, from_nhwc)])
        return True


_SIGNED = {8: np.int8, 16: np.int16, 32: np.int32}


_COMMUTING = ("stablehlo.transpose", "stablehlo.reshape", "stablehlo.slice", "stablehlo.broadcast_in_dim")


class DequantizeThroughDataMovement(_Pattern):
    """`m(uniform_dequantize(q))` -> `uniform_dequantize(m(q))` for data movement `m` (transpose, reshape,
    slice, broadcast, a gather at constant indices): moving values commutes with dequantizing each, exactly.
    The dequantize moves towards the quantize that ends the float region, where QuantizeOfDequantize
    meets it."""

    roots = (*_COMMUTING, "stablehlo.gather")

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        producer = op.operands[0].owner_op()
        if producer is None or producer.name != "stablehlo.uniform_dequantize":
            return False
        if op.name == "stablehlo.gather" and _take(op) is None:
            return False
        source = producer.operands[0]
        quantized = quant_type(source)
        if quantized is None or isinstance(quantized, UniformQuantizedPerAxisType):
            return False  # a per-axis type's axis would move too
        if constant_of(source) is not None:
            return False  # a constant's dequantize is read as a constant by the float-island patterns
        result_type = _ranked(op.result)
        moved_type = result_type.with_element_type(quantized)
        moved = GenericOp(op.name, [source, *op.operands[1:]], [moved_type], dict(op.attributes))
        value = rewriter.insert(moved).result
        dequantized = GenericOp("stablehlo.uniform_dequantize", [value], [result_type])
        rewriter.replace_op(op, [rewriter.insert(dequantized).result])
        return True


class QuantizeOfDequantize(_Pattern):
    """`uniform_quantize(uniform_dequantize(x))`: x itself when the types are one, else a requantize of x
    (RequantizeToRescale's): onnxruntime's float path rounds x * s_x / s the same way, within a step."""

    roots = ("stablehlo.uniform_quantize",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        producer = op.operands[0].owner_op()
        if producer is None or producer.name != "stablehlo.uniform_dequantize":
            return False
        source = producer.operands[0]
        if source.type == op.result.type:
            rewriter.replace_op(op, [source])
            return True
        requantize = GenericOp("stablehlo.uniform_quantize", [source], [op.result.type])
        rewriter.replace_op(op, [rewriter.insert(requantize).result])
        return True


def _take(op: Operation) -> tuple[int, np.ndarray] | None:
    """`(axis, indices)` when a `stablehlo.gather` takes whole slices at constant indices along one axis
    (np.take: what Resize nearest and a Gather of constant indices lower to), else None."""
    attribute = op.attributes.get("dimension_numbers")
    text = getattr(attribute, "text", "")
    fields = dict(re.findall(r"(\w+) = (\[[^\]]*\]|\d+)", text))
    indices = constant_of(op.operands[1])
    operand = _ranked(op.operands[0])
    if indices is None or set(fields) != {
        "offset_dims",
        "collapsed_slice_dims",
        "start_index_map",
        "index_vector_dim",
    }:
        return None
    collapsed = [int(v) for v in re.findall(r"-?\d+", fields["collapsed_slice_dims"])]
    start_map = [int(v) for v in re.findall(r"-?\d+", fields["start_index_map"])]
    offsets = [int(v) for v in re.findall(r"-?\d+", fields["offset_dims"])]
    index_vector_dim = int(fields["index_vector_dim"])
    if len(collapsed) != 1 or start_map != collapsed or indices.ndim != 2 or indices.shape[1] != 1:
        return None
    axis = collapsed[0]
    sizes = _ints(op, "slice_sizes")
    expected_sizes = [1 if d == axis else n for d, n in enumerate(operand.shape)]
    if (
        index_vector_dim != 1
        or sizes != expected_sizes
        or offsets != [d for d in range(operand.rank) if d != axis]
    ):
        return None
    flat = indices.reshape(-1).astype(np.int64)
    if np.any((flat < 0) | (flat >= operand.shape[axis])):
        return None  # StableHLO clamps an index out of range; TOSA's gather does not
    if _ranked(op.result).shape != tuple(n if d != axis else flat.size for d, n in enumerate(operand.shape)):
        return None
    return axis, flat


class GatherToGather(_Pattern):
    """A gather at constant indices along one axis (`_take`) as `tosa.gather` on `[outer, K, inner]`."""

    roots = ("stablehlo.gather",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if _is_float(op.operands[0]):
            return False
        taken = _take(op)
        if taken is None:
            return self.refuse(op, "a gather other than whole slices at constant indices along one axis")
        axis, indices = taken
        shape = _ranked(op.operands[0]).shape
        outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1 :]))
        values = ops.reshape(rewriter, storage_of(rewriter, op.operands[0]), [outer, shape[axis], inner])
        table = ops.const(rewriter, np.tile(indices.astype(np.int32), (outer, 1)), I32)
        gathered = ops.gather(rewriter, values, table)
        replace_with_storage(rewriter, op, [ops.reshape(rewriter, gathered, _ranked(op.result).shape)])
        return True


_DATA_MOVEMENT = ("stablehlo.transpose", "stablehlo.reshape", "stablehlo.slice", "stablehlo.pad")


class FloatDataMovementOnStorage(_Pattern):
    """`uniform_quantize(m(uniform_dequantize(q)))`, `m` a transpose / reshape / slice / pad and the quantize
    to q's own type, as `m(q)`: moving values commutes with quantizing them (each quantizes back to itself),
    and a pad's value is the storage onnxruntime's quantize gives it. The new op is legalized next sweep."""

    roots = ("stablehlo.uniform_quantize",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        movement = op.operands[0].owner_op()
        if target is None or movement is None or movement.name not in _DATA_MOVEMENT:
            return False
        dequantize = movement.operands[0].owner_op()
        if dequantize is None or dequantize.name != "stablehlo.uniform_dequantize":
            return False
        source = dequantize.operands[0]
        if quant_type(source) != target:
            return False  # a change of type too: the move then a rescale would round twice
        operands = [source]
        if movement.name == "stablehlo.pad":
            pad_value = splat_value(movement.operands[1])
            if pad_value is None:
                return self.refuse(op, "a float pad whose value is not a constant")
            from qconvert.ir.quant_types import uniform_params
            from qconvert.numerics import quantize

            stored = int(quantize(np.asarray(pad_value, np.float32).reshape(()), uniform_params(target)))
            width = target.storage_type.width  # type: ignore[union-attr]
            signless = stored - (1 << width) if stored >= 1 << (width - 1) else stored  # unsigned: its bits
            element = storage_element(target)
            constant = ops.const(rewriter, np.array(signless, _SIGNED[width]), element)
            operands.append(materialize(rewriter, constant, RankedTensorType((), target)))
        moved = GenericOp(movement.name, operands, [op.result.type], dict(movement.attributes))
        rewriter.replace_op(op, [rewriter.insert(moved).result])
        return True


def _strided_pads(
    sizes: tuple[int, ...], extents: list[int], strides: list[int], padding: np.ndarray
) -> tuple[list[int], list[int]]:
    """A convolution's TOSA pads `[top, bottom, left, right]` and input sizes such that `size + pads - extent`
    is divisible by the stride, as TOSA requires: what no window reaches is dropped, bottom / right padding
    first, then input rows (a slice)."""
    pads, kept = [], []
    for size, extent, stride, (low, high) in zip(sizes, extents, strides, padding.tolist(), strict=True):
        remainder = (size + low + high - extent) % stride
        dropped_padding = min(remainder, high)
        pads += [int(low), int(high - dropped_padding)]
        kept.append(int(size - (remainder - dropped_padding)))
    return pads, kept


def _exact_pads(
    shape: tuple[int, ...], window: list[int], strides: list[int], padding: np.ndarray, spatial: list[int]
) -> list[int] | None:
    """TOSA's `[top, bottom, left, right]`, the bottom / right padding that no window reaches dropped (TOSA
    wants `size + pads - kernel` divisible by the stride); None when padding cannot absorb the remainder."""
    pads = []
    for d in spatial:
        low, high = int(padding[d][0]), int(padding[d][1])
        remainder = (shape[d] + low + high - window[d]) % strides[d]
        if remainder > high:
            return None
        pads += [low, high - remainder]
    return pads


def _window_counts(size: int, kernel: int, stride: int, low: int, high: int) -> np.ndarray:
    """How many input elements each window along one dim covers, padding excluded (TOSA's count)."""
    starts = np.arange(0, size + low + high - kernel + 1, stride) - low
    return np.minimum(starts + kernel, size) - np.maximum(starts, 0)


def _broadcast_constant(value: Value, shape: tuple[int, ...]) -> np.ndarray | None:
    """A constant (possibly a `broadcast_in_dim` of one) as an array of `shape`."""
    producer = value.owner_op()
    if producer is not None and producer.name == "stablehlo.broadcast_in_dim":
        source = constant_of(producer.operands[0])
        if source is None:
            return None
        expanded = [1] * len(shape)
        for index, dim in enumerate(_ints(producer, "broadcast_dimensions")):
            expanded[dim] = source.shape[index]
        return np.broadcast_to(source.reshape(expanded), shape)
    array = constant_of(value)
    return None if array is None else np.broadcast_to(array, shape)


class FloatAveragePoolToAvgPool(_Pattern):
    """`uniform_quantize(reduce_window_add(uniform_dequantize(q)) / counts)` to q's own type, the counts
    excluding padding (ONNX AveragePool's default), as `tosa.avg_pool2d` in NHWC: the window sum in i32
    times `reciprocal_scale(count)`, rounded once (onnxruntime: a float mean quantized, within a step)."""

    roots = ("stablehlo.uniform_quantize",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        divide = op.operands[0].owner_op()
        if target is None or divide is None or divide.name != "stablehlo.divide":
            return False
        window_op = divide.operands[0].owner_op()
        if window_op is None or window_op.name != "stablehlo.reduce_window":
            return False
        body = window_op.regions[0].entry
        if len(body.ops) != 2 or body.ops[0].name != "stablehlo.add":
            return False
        dequantize = window_op.operands[0].owner_op()
        if dequantize is None or dequantize.name != "stablehlo.uniform_dequantize":
            return False
        source = dequantize.operands[0]
        init = splat_value(window_op.operands[1])
        if init is None or float(init) != 0.0:
            return self.refuse(op, "a window sum whose initial value is not 0")
        if quant_type(source) != target or not quant_type(source).is_signed:  # type: ignore[union-attr]
            return self.refuse(op, "an average pool that changes the quantization, or of unsigned storage")
        shape = _ranked(source).shape
        result_shape = _ranked(op.result).shape
        if len(shape) != 4:
            return self.refuse(op, f"an average pool of a rank-{len(shape)} tensor")
        window = _ints(window_op, "window_dimensions")
        strides = _ints(window_op, "window_strides", [1] * 4)
        padding = _pairs(window_op, "padding", 4)
        if any(
            d != 1
            for d in _ints(window_op, "base_dilations", [1] * 4)
            + _ints(window_op, "window_dilations", [1] * 4)
        ):
            return self.refuse(op, "a dilated average pool")
        pooled = [d for d in range(4) if window[d] != 1 or strides[d] != 1 or np.any(padding[d] != 0)]
        if set(pooled) <= {2, 3}:
            to_nhwc, from_nhwc = [0, 2, 3, 1], [0, 3, 1, 2]
        elif set(pooled) <= {1, 2}:
            to_nhwc, from_nhwc = [0, 1, 2, 3], [0, 1, 2, 3]
        else:
            return self.refuse(op, f"an average pool over dims {pooled}")
        spatial = to_nhwc[1:3]
        counts = _broadcast_constant(divide.operands[1], result_shape)
        expected = np.multiply.outer(
            *(_window_counts(shape[d], window[d], strides[d], *padding[d]) for d in spatial)
        )
        if counts is None:
            return self.refuse(op, "an average pool whose divisor is not a constant")
        as_nhwc = np.transpose(counts, to_nhwc)
        if not np.all(as_nhwc == expected[None, :, :, None]):
            return self.refuse(
                op, "an average pool that counts padding (count_include_pad): TOSA excludes it"
            )
        if any(padding[d][0] >= window[d] or padding[d][1] >= window[d] for d in spatial):
            return self.refuse(op, "an average pool padded by a whole window")
        pads = _exact_pads(shape, window, strides, padding, spatial)
        if pads is None:
            return self.refuse(op, "an average pool whose last window needs input the pool does not have")
        zero_point = int(storage_zero_point(target)[0])  # type: ignore[arg-type]
        value = _transposed(rewriter, storage_of(rewriter, source), to_nhwc)
        out_type = RankedTensorType(tuple(result_shape[d] for d in to_nhwc), storage_element(target))
        value = ops.avg_pool2d(
            rewriter,
            value,
            ops.zero_point(rewriter, zero_point, storage_element(target)),  # i16 for 16-bit activations
            ops.zero_point(rewriter, zero_point, storage_element(target)),
            out_type,
            kernel=[window[d] for d in spatial],
            stride=[strides[d] for d in spatial],
            pad=pads,
        )
        replace_with_storage(rewriter, op, [_transposed(rewriter, value, from_nhwc)])
        return True


def legalize_patterns(refusals: Refusals) -> list[_Pattern]:
    """The StableHLO -> TOSA patterns (but the rescales: legalize_quant.py)."""
    return [
        pattern(refusals)
        for pattern in (
            ConstantToConst,
            BitcastConvertToStorage,
            TransposeToTranspose,
            ReshapeToReshape,
            BroadcastInDimToReshapeTile,
            SliceToSlice,
            ConcatenateToConcat,
            PadToPad,
            ElementwiseOnStorage,
            ClampToClamp,
            ConvolutionToConv2D,
            DotGeneralToMatmul,
            ReduceWindowMaxToMaxPool,
            FloatDataMovementOnStorage,
            FloatAveragePoolToAvgPool,
            DequantizeThroughDataMovement,
            QuantizeOfDequantize,
            GatherToGather,
        )
    ]


# Folds ------------------------------------------------------------------------------------------
def _const_like(rewriter: PatternRewriter, array: np.ndarray, like: Value) -> Value:
    return ops.const(rewriter, array, element_type_of(like.type))


class FoldTranspose:
    """transpose(const) -> const; transpose(transpose(x)) -> one transpose of x (none when the identity)."""

    roots: ClassVar[tuple[Root, ...]] = ("tosa.transpose",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        perms = _ints(op, "perms")
        source = op.operands[0]
        array = (
            constant_of(source)
            if source.owner_op() is not None and source.owner_op().name == "tosa.const"
            else None
        )  # type: ignore[union-attr]
        if array is not None:
            rewriter.replace_op(op, [_const_like(rewriter, np.transpose(array, perms), op.result)])
            return True
        producer = source.owner_op()
        if producer is None or producer.name != "tosa.transpose":
            if perms == sorted(perms):
                rewriter.replace_op(op, [source])
                return True
            return False
        inner = _ints(producer, "perms")
        composed = [inner[p] for p in perms]
        inner_source = producer.operands[0]
        value = (
            inner_source if composed == sorted(composed) else ops.transpose(rewriter, inner_source, composed)
        )
        rewriter.replace_op(op, [value])
        return True


class FoldReshape:
    """reshape(const) -> const; reshape(reshape(x)) -> reshape(x); a reshape to its input's shape -> x."""

    roots: ClassVar[tuple[Root, ...]] = ("tosa.reshape",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        source = op.operands[0]
        shape = _ranked(op.result).shape
        producer = source.owner_op()
        if _ranked(source).shape == shape:
            rewriter.replace_op(op, [source])
            return True
        if producer is not None and producer.name == "tosa.const":
            array = constant_of(source)
            assert array is not None
            rewriter.replace_op(op, [_const_like(rewriter, np.reshape(array, shape), op.result)])
            return True
        if producer is not None and producer.name == "tosa.reshape":
            rewriter.replace_op(op, [ops.reshape(rewriter, producer.operands[0], shape)])
            return True
        return False


class FoldBiasIntoConvolution:
    """`add(conv2d(x, w, 0, ...), bias)` with a constant bias of one value per output channel, the convolution
    read by nothing else: the bias becomes the convolution's own operand (TOSA's form; the sum is the same
    i32 arithmetic)."""

    roots: ClassVar[tuple[Root, ...]] = ("tosa.add",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        for conv_side, bias_side in ((0, 1), (1, 0)):
            conv = op.operands[conv_side].owner_op()
            if conv is None or conv.name not in ("tosa.conv2d", "tosa.depthwise_conv2d"):
                continue
            if len(conv.results[0].uses) != 1 or conv.results[0].type != op.result.type:
                continue
            bias = constant_of(op.operands[bias_side])
            zero = constant_of(conv.operands[2])
            channels = _ranked(conv.results[0]).shape[-1]
            if bias is None or zero is None or np.any(zero != 0):
                continue
            if bias.shape != (1, 1, 1, channels):
                continue
            rewriter.set_insertion_point_before(conv)
            conv.set_operand(2, ops.const(rewriter, bias.reshape(channels).astype(np.int32), I32))
            rewriter.replace_op(op, [conv.results[0]])
            return True
        return False


def fold_patterns() -> list[object]:
    """The folds run once every op is legalized (transposes and reshapes of weights become constants, a
    constant bias add becomes the convolution's bias)."""
    return [FoldTranspose(), FoldReshape(), FoldBiasIntoConvolution()]
