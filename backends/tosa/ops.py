"""Typed constructors of TOSA 1.0 ops: one function per op, inserting at a Builder, returning the result.

NOTE: ops are `GenericOp`s printed in MLIR's generic form (`"tosa.rescale"(%x, %m, %s, %izp, %ozp)
{...} : (...) -> ...`), which both `tosa-opt` (tosa-tools 2026.8.0) and `iree-compile` parse (the
attributes in the discardable dictionary become the op's properties). Operand order and attribute names
are those of TOSA 1.0's MLIR dialect (llvm-project mlir/include/mlir/Dialect/Tosa/IR/TosaOps.td):

    tosa.const            {values}                                   () -> T
    tosa.const_shape      {values : tensor<Nxindex>}                 () -> !tosa.shape<N>
    tosa.rescale          (input, multiplier, shift, input_zp, output_zp)
                          {scale32, rounding_mode, per_channel, input_unsigned, output_unsigned}
    tosa.conv2d           (input, weight, bias, input_zp, weight_zp) {acc_type, pad, stride, dilation}
    tosa.depthwise_conv2d (input, weight, bias, input_zp, weight_zp) {acc_type, pad, stride, dilation}
    tosa.matmul           (a, b, a_zp, b_zp)                          [N,H,C] x [N,C,W] -> [N,H,W]
    tosa.max_pool2d       (input) {kernel, stride, pad}
    tosa.avg_pool2d       (input, input_zp, output_zp) {acc_type, kernel, stride, pad}
    tosa.add / sub / maximum / minimum (a, b);  tosa.mul (a, b, shift)
    tosa.clamp            (input) {min_val, max_val}                  (attributes of the element type)
    tosa.transpose        (input) {perms : array<i32>}
    tosa.reshape          (input, shape : !tosa.shape)
    tosa.slice            (input, start : !tosa.shape, size : !tosa.shape)
    tosa.concat           (inputs...) {axis : i32}
    tosa.tile             (input, multiples : !tosa.shape)
    tosa.gather           (values [N,K,C], indices [N,W] i32)          -> [N,W,C]
    tosa.pad              (input, padding : !tosa.shape<2*rank>, pad_const : tensor<1xT>)
    tosa.reduce_sum       (input) {axis : i32}                        (the reduced dim kept, of size 1)
    tosa.table            (input, table)
    tosa.cast             (input)

Zero points, multipliers and shifts are `tosa.const` tensors of one element (or one per channel), as TOSA
1.0 takes them. Pads are `[top, bottom, left, right]`; NHWC activations, OHWI (conv2d) and HWCM
(depthwise) weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qconvert.ir.attributes import (
    Attribute,
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    FloatAttr,
    IntegerAttr,
    OpaqueAttr,
    TypeAttr,
)
from qconvert.ir.core import Builder, GenericOp, Value
from qconvert.ir.types import (
    I8,
    I32,
    I64,
    INDEX,
    FloatType,
    IntegerType,
    OpaqueType,
    RankedTensorType,
    Type,
    element_type_of,
)
from qconvert.numerics.tosa import TosaRounding

__all__ = [
    "ROUNDING_MODES",
    "add",
    "avg_pool2d",
    "cast",
    "clamp",
    "compare",
    "concat",
    "const",
    "const_shape",
    "conv2d",
    "depthwise_conv2d",
    "float_matmul",
    "matmul",
    "max_pool2d",
    "maximum",
    "minimum",
    "mul",
    "pad",
    "reduce_sum",
    "rescale",
    "reshape",
    "shape_type",
    "slice_",
    "sub",
    "gather",
    "logical_not",
    "power",
    "reduce",
    "select",
    "table",
    "tile",
    "transpose",
    "unary",
    "zero_point",
]

ROUNDING_MODES: dict[TosaRounding, str] = {
    TosaRounding.SINGLE: "SINGLE_ROUND",
    TosaRounding.DOUBLE: "DOUBLE_ROUND",
}
"""qconvert's rounding names -> TOSA's `rounding_mode` enumerants."""

_NUMPY_OF_WIDTH = {1: np.bool_, 8: np.int8, 16: np.int16, 32: np.int32, 48: np.int64, 64: np.int64}


def _op(
    b: Builder, name: str, operands: Sequence[Value], result_type: Type, **attributes: Attribute
) -> Value:
    return b.insert(GenericOp(name, list(operands), [result_type], dict(attributes))).result


def _tensor(value: Value) -> RankedTensorType:
    assert isinstance(value.type, RankedTensorType), f"TOSA needs ranked tensors, got {value.type}"
    return value.type


def _i64_array(values: Sequence[int]) -> DenseArrayAttr:
    return DenseArrayAttr(I64, tuple(int(v) for v in values))


def shape_type(rank: int) -> OpaqueType:
    """`!tosa.shape<rank>`: the type of a `tosa.const_shape`."""
    return OpaqueType("tosa", f"tosa.shape<{rank}>")


# Constants ----------------------------------------------------------------------------------------
def const(b: Builder, array: np.ndarray, element_type: Type) -> Value:
    """`tosa.const` holding `array` as a tensor of `element_type` (the array's dtype must hold it)."""
    values = np.ascontiguousarray(array).reshape(np.shape(array))  # ascontiguousarray makes 0-d 1-d
    type_ = RankedTensorType(tuple(values.shape), element_type)
    return _op(b, "tosa.const", [], type_, values=DenseElementsAttr(values, type_))


def zero_point(b: Builder, value: int, element_type: Type) -> Value:
    """A zero point (or a shift, a multiplier): `tosa.const` of one element, `tensor<1xT>`."""
    width = element_type.width if isinstance(element_type, IntegerType) else 32
    return const(b, np.array([value], _NUMPY_OF_WIDTH[width]), element_type)


def const_shape(b: Builder, values: Sequence[int]) -> Value:
    """`tosa.const_shape`: a `!tosa.shape<N>` (reshape's new shape, slice's start and size, pad's pads)."""
    array = np.array([int(v) for v in values], np.int64)
    attribute = DenseElementsAttr(array, RankedTensorType((len(values),), INDEX))
    return _op(b, "tosa.const_shape", [], shape_type(len(values)), values=attribute)


# Scaling ------------------------------------------------------------------------------------------
def rescale(
    b: Builder,
    input_: Value,
    multiplier: Value,
    shift: Value,
    input_zp: Value,
    output_zp: Value,
    result_type: Type,
    *,
    rounding: TosaRounding,
    per_channel: bool,
    scale32: bool = True,
    input_unsigned: bool = False,
    output_unsigned: bool = False,
) -> Value:
    """`tosa.rescale`: `clip(apply_scale(x - input_zp, multiplier, shift) + output_zp)` (numerics.tosa)."""
    return _op(
        b,
        "tosa.rescale",
        [input_, multiplier, shift, input_zp, output_zp],
        result_type,
        input_unsigned=BoolAttr(input_unsigned),
        output_unsigned=BoolAttr(output_unsigned),
        per_channel=BoolAttr(per_channel),
        rounding_mode=OpaqueAttr(f"#tosa.rounding_mode<{ROUNDING_MODES[TosaRounding(rounding)]}>"),
        scale32=BoolAttr(scale32),
    )


# Tensor operators ---------------------------------------------------------------------------------
def _convolution(
    name: str,
    b: Builder,
    input_: Value,
    weight: Value,
    bias: Value,
    input_zp: Value,
    weight_zp: Value,
    result_type: Type,
    pad: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    acc_type: Type,
) -> Value:
    return _op(
        b,
        name,
        [input_, weight, bias, input_zp, weight_zp],
        result_type,
        acc_type=TypeAttr(acc_type),
        dilation=_i64_array(dilation),
        pad=_i64_array(pad),
        stride=_i64_array(stride),
    )


def conv2d(
    b: Builder,
    input_: Value,
    weight: Value,
    bias: Value,
    input_zp: Value,
    weight_zp: Value,
    result_type: Type,
    *,
    pad: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    acc_type: Type = I32,
) -> Value:
    """`tosa.conv2d`: NHWC input, OHWI weight, bias of OC (or 1) accumulator elements."""
    return _convolution(
        "tosa.conv2d",
        b,
        input_,
        weight,
        bias,
        input_zp,
        weight_zp,
        result_type,
        pad,
        stride,
        dilation,
        acc_type,
    )


def depthwise_conv2d(
    b: Builder,
    input_: Value,
    weight: Value,
    bias: Value,
    input_zp: Value,
    weight_zp: Value,
    result_type: Type,
    *,
    pad: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    acc_type: Type = I32,
) -> Value:
    """`tosa.depthwise_conv2d`: NHWC input, HWCM weight (M outputs per input channel)."""
    return _convolution(
        "tosa.depthwise_conv2d",
        b,
        input_,
        weight,
        bias,
        input_zp,
        weight_zp,
        result_type,
        pad,
        stride,
        dilation,
        acc_type,
    )


def matmul(b: Builder, a: Value, b_: Value, a_zp: Value, b_zp: Value) -> Value:
    """`tosa.matmul` of `[N, H, C]` by `[N, C, W]`: `[N, H, W]` in i32 (i8 / i16 operands: i48)."""
    a_type, b_type = _tensor(a), _tensor(b_)
    width = element_type_of(a_type).width  # type: ignore[attr-defined]
    accumulator = IntegerType(48) if width == 16 else I32
    result = RankedTensorType((a_type.shape[0], a_type.shape[1], b_type.shape[2]), accumulator)
    return _op(b, "tosa.matmul", [a, b_, a_zp, b_zp], result)


def max_pool2d(
    b: Builder,
    input_: Value,
    result_type: Type,
    *,
    kernel: Sequence[int],
    stride: Sequence[int],
    pad: Sequence[int],
) -> Value:
    """`tosa.max_pool2d` of an NHWC tensor (padding never wins: it is not an element)."""
    return _op(
        b,
        "tosa.max_pool2d",
        [input_],
        result_type,
        kernel=_i64_array(kernel),
        pad=_i64_array(pad),
        stride=_i64_array(stride),
    )


def avg_pool2d(
    b: Builder,
    input_: Value,
    input_zp: Value,
    output_zp: Value,
    result_type: Type,
    *,
    kernel: Sequence[int],
    stride: Sequence[int],
    pad: Sequence[int],
    acc_type: Type = I32,
) -> Value:
    """`tosa.avg_pool2d` of an NHWC tensor: the window sum times `reciprocal_scale(count)`, padding
    excluded from the count."""
    return _op(
        b,
        "tosa.avg_pool2d",
        [input_, input_zp, output_zp],
        result_type,
        acc_type=TypeAttr(acc_type),
        kernel=_i64_array(kernel),
        pad=_i64_array(pad),
        stride=_i64_array(stride),
    )


# Elementwise --------------------------------------------------------------------------------------
def _broadcast_shape(lhs: RankedTensorType, rhs: RankedTensorType) -> tuple[int, ...]:
    assert lhs.rank == rhs.rank, f"TOSA broadcasts tensors of one rank only: {lhs} and {rhs}"
    return tuple(max(x, y) for x, y in zip(lhs.shape, rhs.shape, strict=True))


def _binary(name: str, b: Builder, lhs: Value, rhs: Value) -> Value:
    lhs_type = _tensor(lhs)
    result = RankedTensorType(_broadcast_shape(lhs_type, _tensor(rhs)), lhs_type.element_type)
    return _op(b, name, [lhs, rhs], result)


def add(b: Builder, lhs: Value, rhs: Value) -> Value:
    """`tosa.add` (same rank; a dim of 1 broadcasts)."""
    return _binary("tosa.add", b, lhs, rhs)


def sub(b: Builder, lhs: Value, rhs: Value) -> Value:
    return _binary("tosa.sub", b, lhs, rhs)


def intdiv(b: Builder, lhs: Value, rhs: Value) -> Value:
    """`tosa.intdiv` of i32 tensors: the quotient truncated toward zero (same rank; dims of 1 broadcast)."""
    return _binary("tosa.intdiv", b, lhs, rhs)


def maximum(b: Builder, lhs: Value, rhs: Value) -> Value:
    return _binary("tosa.maximum", b, lhs, rhs)


def minimum(b: Builder, lhs: Value, rhs: Value) -> Value:
    return _binary("tosa.minimum", b, lhs, rhs)


def mul(b: Builder, lhs: Value, rhs: Value, shift: Value) -> Value:
    """`tosa.mul`: `(a * b) >> shift` rounded (shift a `tensor<1xi8>`: 0 for i8 / i16 inputs, whose product
    is i32, and for floats)."""
    lhs_type = _tensor(lhs)
    element = lhs_type.element_type
    if isinstance(element, IntegerType) and element.width in (8, 16):
        element = I32
    result = RankedTensorType(_broadcast_shape(lhs_type, _tensor(rhs)), element)
    return _op(b, "tosa.mul", [lhs, rhs, shift], result)


def clamp(b: Builder, input_: Value, low: float, high: float) -> Value:
    """`tosa.clamp` between two values of the input's element type (integers, or floats for a float input)."""
    element = _tensor(input_).element_type
    if isinstance(element, FloatType):
        bounds = {"max_val": FloatAttr(float(high), element), "min_val": FloatAttr(float(low), element)}
    else:
        bounds = {"max_val": IntegerAttr(int(high), element), "min_val": IntegerAttr(int(low), element)}
    return _op(b, "tosa.clamp", [input_], input_.type, **bounds)


def table(b: Builder, input_: Value, lookup: Value) -> Value:
    """`tosa.table`: i8 -> i8 (256 entries) or i16 -> i32 (513 entries, interpolated)."""
    input_type = _tensor(input_)
    width = element_type_of(input_type).width  # type: ignore[attr-defined]
    return _op(b, "tosa.table", [input_, lookup], input_type.with_element_type(I8 if width == 8 else I32))


def cast(b: Builder, input_: Value, element_type: Type) -> Value:
    """`tosa.cast` to another element type, same shape."""
    return _op(b, "tosa.cast", [input_], _tensor(input_).with_element_type(element_type))


# Data layout --------------------------------------------------------------------------------------
def transpose(b: Builder, input_: Value, perms: Sequence[int]) -> Value:
    """`tosa.transpose`: result dim i is input dim `perms[i]`."""
    input_type = _tensor(input_)
    shape = tuple(input_type.shape[p] for p in perms)
    result = RankedTensorType(shape, input_type.element_type)
    return _op(b, "tosa.transpose", [input_], result, perms=DenseArrayAttr(I32, tuple(int(p) for p in perms)))


def reshape(b: Builder, input_: Value, shape: Sequence[int]) -> Value:
    """`tosa.reshape` to a static shape of the same element count."""
    input_type = _tensor(input_)
    new_shape = tuple(int(d) for d in shape)
    assert int(np.prod(new_shape)) == int(np.prod(input_type.shape)), f"{input_type.shape} -> {new_shape}"
    result = RankedTensorType(new_shape, input_type.element_type)
    return _op(b, "tosa.reshape", [input_, const_shape(b, new_shape)], result)


def slice_(b: Builder, input_: Value, start: Sequence[int], size: Sequence[int]) -> Value:
    """`tosa.slice` of `size` elements from `start` (unit strides)."""
    input_type = _tensor(input_)
    result = RankedTensorType(tuple(int(s) for s in size), input_type.element_type)
    return _op(b, "tosa.slice", [input_, const_shape(b, start), const_shape(b, size)], result)


def tile(b: Builder, input_: Value, multiples: Sequence[int]) -> Value:
    """`tosa.tile`: the input repeated `multiples[d]` times along each dim d."""
    input_type = _tensor(input_)
    shape = tuple(n * int(m) for n, m in zip(input_type.shape, multiples, strict=True))
    result = RankedTensorType(shape, input_type.element_type)
    return _op(b, "tosa.tile", [input_, const_shape(b, multiples)], result)


def gather(b: Builder, values: Value, indices: Value) -> Value:
    """`tosa.gather`: `out[n, w, c] = values[n, indices[n, w], c]`."""
    values_type, indices_type = _tensor(values), _tensor(indices)
    shape = (values_type.shape[0], indices_type.shape[1], values_type.shape[2])
    return _op(b, "tosa.gather", [values, indices], RankedTensorType(shape, values_type.element_type))


def concat(b: Builder, inputs: Sequence[Value], axis: int) -> Value:
    """`tosa.concat` along `axis` of tensors of one element type."""
    first = _tensor(inputs[0])
    size = sum(_tensor(v).shape[axis] for v in inputs)
    shape = tuple(size if d == axis else n for d, n in enumerate(first.shape))
    result = RankedTensorType(shape, first.element_type)
    return _op(b, "tosa.concat", list(inputs), result, axis=IntegerAttr(axis, I32))


def pad(b: Builder, input_: Value, low: Sequence[int], high: Sequence[int], pad_value: int) -> Value:
    """`tosa.pad` by `low` / `high` elements per dim, filled with `pad_value` (a storage integer)."""
    input_type = _tensor(input_)
    padding = [int(x) for pair in zip(low, high, strict=True) for x in pair]
    shape = tuple(n + lo + hi for n, lo, hi in zip(input_type.shape, low, high, strict=True))
    constant = zero_point(b, pad_value, input_type.element_type)
    result = RankedTensorType(shape, input_type.element_type)
    return _op(b, "tosa.pad", [input_, const_shape(b, padding), constant], result)


def reduce_sum(b: Builder, input_: Value, axis: int) -> Value:
    """`tosa.reduce_sum` along `axis`, which stays as a dim of 1."""
    input_type = _tensor(input_)
    shape = tuple(1 if d == axis else n for d, n in enumerate(input_type.shape))
    result = RankedTensorType(shape, input_type.element_type)
    return _op(b, "tosa.reduce_sum", [input_], result, axis=IntegerAttr(axis, I32))


# Comparisons, selection and float functions (token-id wraps; --allow-float islands) ---------------------
def compare(b: Builder, name: str, lhs: Value, rhs: Value) -> Value:
    """`tosa.equal` / `tosa.greater` / `tosa.greater_equal`: an i1 tensor (same rank; dims of 1 broadcast)."""
    result = RankedTensorType(_broadcast_shape(_tensor(lhs), _tensor(rhs)), IntegerType(1))
    return _op(b, name, [lhs, rhs], result)


def logical_not(b: Builder, input_: Value) -> Value:
    return _op(b, "tosa.logical_not", [input_], input_.type)


def select(b: Builder, condition: Value, on_true: Value, on_false: Value) -> Value:
    """`tosa.select`: `on_true` where `condition`, else `on_false` (one rank; dims of 1 broadcast)."""
    shape = _broadcast_shape(_tensor(condition), _tensor(on_true))
    shape = _broadcast_shape(RankedTensorType(shape, I32), _tensor(on_false))
    return _op(
        b,
        "tosa.select",
        [condition, on_true, on_false],
        RankedTensorType(shape, _tensor(on_true).element_type),
    )


def unary(b: Builder, name: str, input_: Value) -> Value:
    """A TOSA op of one operand and a result of its type: exp, rsqrt, reciprocal, tanh, sigmoid, erf, ..."""
    return _op(b, name, [input_], input_.type)


def power(b: Builder, base: Value, exponent: Value) -> Value:
    """`tosa.pow` (float): base ** exponent elementwise (same rank; dims of 1 broadcast)."""
    return _binary("tosa.pow", b, base, exponent)


def reduce(b: Builder, name: str, input_: Value, axis: int) -> Value:
    """`tosa.reduce_sum` / `reduce_max` / `reduce_min` along `axis`, which stays as a dim of 1."""
    input_type = _tensor(input_)
    shape = tuple(1 if d == axis else n for d, n in enumerate(input_type.shape))
    return _op(
        b, name, [input_], RankedTensorType(shape, input_type.element_type), axis=IntegerAttr(axis, I32)
    )


def float_matmul(b: Builder, a: Value, b_: Value, zero: Value) -> Value:
    """`tosa.matmul` of float `[N, H, C]` by `[N, C, W]` (zero points: the float 0 `zero`, tensor<1xf32>)."""
    a_type, b_type = _tensor(a), _tensor(b_)
    result = RankedTensorType((a_type.shape[0], a_type.shape[1], b_type.shape[2]), a_type.element_type)
    return _op(b, "tosa.matmul", [a, b_, zero, zero], result)
