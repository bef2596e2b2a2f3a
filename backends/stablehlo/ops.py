"""Typed constructors of `stablehlo.*` ops: one function per op, inserting at a Builder, returning the result.

NOTE: ops are `GenericOp`s printed in MLIR's generic form (`"stablehlo.add"(%a, %b) : (...) -> ...`),
which jaxlib parses. Each constructor computes its result type where that is simple (elementwise,
transpose, reshape to a given shape, dot_general, convolution); otherwise the caller passes it.
Attributes follow jaxlib's own printing (`#stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from qconvert.ir.attributes import (
    Attribute,
    DenseArrayAttr,
    DenseElementsAttr,
    DenseResourceAttr,
    IntegerAttr,
    OpaqueAttr,
    UnitAttr,
)
from qconvert.ir.core import Block, Builder, GenericOp, Region, Value
from qconvert.ir.types import I1, I32, I64, RankedTensorType, Type, element_type_of, with_element_type

from .dimension_numbers import ConvDimensionNumbers, DotDimensionNumbers

COMPARISON_DIRECTIONS = ("EQ", "NE", "GE", "GT", "LE", "LT")


def _op(
    b: Builder,
    name: str,
    operands: Sequence[Value],
    result_types: Sequence[Type],
    attributes: dict[str, Attribute] | None = None,
    regions: Sequence[Region] = (),
) -> GenericOp:
    return b.insert(GenericOp(name, operands, result_types, attributes or {}, regions))


def _one(
    b: Builder, name: str, operands: Sequence[Value], result_type: Type, **attributes: Attribute
) -> Value:
    return _op(b, name, operands, [result_type], attributes).result


def i64_array(values: Sequence[int]) -> DenseArrayAttr:
    """`array<i64: 1, 2>`."""
    return DenseArrayAttr(I64, tuple(int(v) for v in values))


def i64_attr(value: int) -> IntegerAttr:
    return IntegerAttr(int(value), I64)


def tensor_type(value: Value) -> RankedTensorType:
    """The ranked tensor type of `value` (every value in a lowered StableHLO function has one)."""
    assert isinstance(value.type, RankedTensorType), f"expected a ranked tensor, got {value.type}"
    return value.type


# Constants ------------------------------------------------------------------------------------
def constant(
    b: Builder, value: DenseElementsAttr | DenseResourceAttr | OpaqueAttr, result_type: Type | None = None
) -> Value:
    """`stablehlo.constant` of a dense (or dense_resource) attribute; the result has the attribute's type
    (pass `result_type` for an opaque `dense<"0x...">` attribute)."""
    type_ = result_type if result_type is not None else value.type  # type: ignore[union-attr]
    return _one(b, "stablehlo.constant", [], type_, value=value)


# Elementwise ----------------------------------------------------------------------------------
def _binary(name: str) -> Callable[[Builder, Value, Value], Value]:
    def build(b: Builder, lhs: Value, rhs: Value) -> Value:
        return _one(b, name, [lhs, rhs], lhs.type)

    build.__name__ = name.split(".")[1]
    build.__doc__ = f"`{name}` of two tensors of the same type (broadcast them first)."
    return build


def _unary(name: str) -> Callable[[Builder, Value], Value]:
    def build(b: Builder, operand: Value) -> Value:
        return _one(b, name, [operand], operand.type)

    build.__name__ = name.split(".")[1]
    build.__doc__ = f"`{name}`: same type in and out."
    return build


add = _binary("stablehlo.add")
subtract = _binary("stablehlo.subtract")
multiply = _binary("stablehlo.multiply")
divide = _binary("stablehlo.divide")
maximum = _binary("stablehlo.maximum")
minimum = _binary("stablehlo.minimum")
power = _binary("stablehlo.power")
remainder = _binary("stablehlo.remainder")
and_ = _binary("stablehlo.and")
or_ = _binary("stablehlo.or")
xor = _binary("stablehlo.xor")


EXACT_DIVIDE = "qconvert.exact_divide"
"""The mark `exact_divide` leaves on its divide until the conversion settles it (engine_profile.py)."""


def exact_divide(b: Builder, lhs: Value, rhs: Value) -> Value:
    """`lhs / rhs` correctly rounded, as onnxruntime divides: a divide marked so that the conversion guards
    its divisor when the engine profile asks (XLA:CPU rewrites `x / broadcast(c)` into `x * (1 / c)`, an ulp
    off for many elements; an optimization_barrier on the divisor hides it). See engine_profile.py."""
    return _one(b, "stablehlo.divide", [lhs, rhs], lhs.type, **{EXACT_DIVIDE: UnitAttr()})


def optimization_barrier(b: Builder, operand: Value) -> Value:
    """`stablehlo.optimization_barrier` of one operand: the value, which XLA cannot see through."""
    return _one(b, "stablehlo.optimization_barrier", [operand], operand.type)


shift_right_arithmetic = _binary("stablehlo.shift_right_arithmetic")
atan2 = _binary("stablehlo.atan2")

negate = _unary("stablehlo.negate")
abs_ = _unary("stablehlo.abs")
exponential = _unary("stablehlo.exponential")
log = _unary("stablehlo.log")
sqrt = _unary("stablehlo.sqrt")
rsqrt = _unary("stablehlo.rsqrt")
tanh = _unary("stablehlo.tanh")
logistic = _unary("stablehlo.logistic")
floor = _unary("stablehlo.floor")
ceil = _unary("stablehlo.ceil")
sign = _unary("stablehlo.sign")
not_ = _unary("stablehlo.not")
round_nearest_even = _unary("stablehlo.round_nearest_even")
round_nearest_afz = _unary("stablehlo.round_nearest_afz")
sine = _unary("stablehlo.sine")
cosine = _unary("stablehlo.cosine")


def clamp(b: Builder, low: Value, operand: Value, high: Value) -> Value:
    """`stablehlo.clamp(min, operand, max)`; `low`/`high` are scalars (`tensor<T>`) or shaped like operand."""
    return _one(b, "stablehlo.clamp", [low, operand, high], operand.type)


def select(b: Builder, predicate: Value, on_true: Value, on_false: Value) -> Value:
    """`stablehlo.select`: `predicate` is i1 of the same shape (or a scalar i1)."""
    return _one(b, "stablehlo.select", [predicate, on_true, on_false], on_true.type)


def compare(b: Builder, direction: str, lhs: Value, rhs: Value, compare_type: str | None = None) -> Value:
    """`stablehlo.compare` with `comparison_direction` EQ/NE/GE/GT/LE/LT; the result is i1 of lhs's shape.

    `compare_type` (FLOAT, TOTALORDER, SIGNED, UNSIGNED) is optional, as in StableHLO.
    """
    assert direction in COMPARISON_DIRECTIONS, direction
    attributes: dict[str, Attribute] = {
        "comparison_direction": OpaqueAttr(f"#stablehlo<comparison_direction {direction}>")
    }
    if compare_type is not None:
        attributes["compare_type"] = OpaqueAttr(f"#stablehlo<comparison_type {compare_type}>")
    return _one(b, "stablehlo.compare", [lhs, rhs], with_element_type(lhs.type, I1), **attributes)


# Type changes ---------------------------------------------------------------------------------
def convert(b: Builder, operand: Value, element_type: Type) -> Value:
    """`stablehlo.convert` to `element_type` (float->int truncates toward zero: round and clamp first)."""
    return _one(b, "stablehlo.convert", [operand], with_element_type(operand.type, element_type))


def bitcast_convert(b: Builder, operand: Value, result_type: Type) -> Value:
    """`stablehlo.bitcast_convert`: reinterpret bits (storage ints <-> `!quant.uniform` of that storage)."""
    return _one(b, "stablehlo.bitcast_convert", [operand], result_type)


def reduce_precision(b: Builder, operand: Value, exponent_bits: int, mantissa_bits: int) -> Value:
    """`stablehlo.reduce_precision`: round each float to the format with these exponent and mantissa bits
    (ties to even), keeping the operand's type."""
    bits = {
        "exponent_bits": IntegerAttr(exponent_bits, I32),
        "mantissa_bits": IntegerAttr(mantissa_bits, I32),
    }
    return _one(b, "stablehlo.reduce_precision", [operand], operand.type, **bits)


def uniform_quantize(b: Builder, operand: Value, result_type: Type) -> Value:
    """`stablehlo.uniform_quantize`: float -> quantized, `rne(clamp(x / s + zp))`; or requantize."""
    return _one(b, "stablehlo.uniform_quantize", [operand], result_type)


def uniform_dequantize(b: Builder, operand: Value, result_type: Type) -> Value:
    """`stablehlo.uniform_dequantize`: quantized -> expressed float, `(q - zp) * s`."""
    return _one(b, "stablehlo.uniform_dequantize", [operand], result_type)


# Shapes and data movement ----------------------------------------------------------------------
def broadcast_in_dim(
    b: Builder, operand: Value, shape: Sequence[int], broadcast_dimensions: Sequence[int]
) -> Value:
    """`stablehlo.broadcast_in_dim`: operand dim `i` becomes result dim `broadcast_dimensions[i]`."""
    result_type = RankedTensorType(tuple(shape), element_type_of(operand.type))
    return _one(
        b,
        "stablehlo.broadcast_in_dim",
        [operand],
        result_type,
        broadcast_dimensions=i64_array(broadcast_dimensions),
    )


def reshape(b: Builder, operand: Value, shape: Sequence[int]) -> Value:
    """`stablehlo.reshape` to a static `shape` with the same number of elements."""
    return _one(
        b, "stablehlo.reshape", [operand], RankedTensorType(tuple(shape), element_type_of(operand.type))
    )


def transpose(b: Builder, operand: Value, permutation: Sequence[int]) -> Value:
    """`stablehlo.transpose`: result dim `i` is operand dim `permutation[i]`."""
    shape = tensor_type(operand).shape
    result_type = RankedTensorType(tuple(shape[p] for p in permutation), element_type_of(operand.type))
    return _one(b, "stablehlo.transpose", [operand], result_type, permutation=i64_array(permutation))


def slice_(
    b: Builder, operand: Value, start: Sequence[int], limit: Sequence[int], strides: Sequence[int]
) -> Value:
    """`stablehlo.slice` with static start (inclusive), limit (exclusive) and positive strides."""
    shape = tuple(-(-(hi - lo) // s) for lo, hi, s in zip(start, limit, strides, strict=True))
    return _one(
        b,
        "stablehlo.slice",
        [operand],
        RankedTensorType(shape, element_type_of(operand.type)),
        start_indices=i64_array(start),
        limit_indices=i64_array(limit),
        strides=i64_array(strides),
    )


def concatenate(b: Builder, operands: Sequence[Value], dimension: int) -> Value:
    """`stablehlo.concatenate` along `dimension`."""
    shapes = [tensor_type(v).shape for v in operands]
    shape = list(shapes[0])
    shape[dimension] = sum(s[dimension] for s in shapes)
    result_type = RankedTensorType(tuple(shape), element_type_of(operands[0].type))
    return _one(b, "stablehlo.concatenate", operands, result_type, dimension=i64_attr(dimension))


def pad(
    b: Builder, operand: Value, padding_value: Value, low: Sequence[int], high: Sequence[int],
    interior: Sequence[int] | None = None,
) -> Value:  # fmt: skip
    """`stablehlo.pad` with a scalar `padding_value` (negative low/high crop)."""
    interior = interior or [0] * len(low)
    shape = tuple(
        lo + hi + d + max(d - 1, 0) * i
        for d, lo, hi, i in zip(tensor_type(operand).shape, low, high, interior, strict=True)
    )
    return _one(
        b,
        "stablehlo.pad",
        [operand, padding_value],
        RankedTensorType(shape, element_type_of(operand.type)),
        edge_padding_low=i64_array(low),
        edge_padding_high=i64_array(high),
        interior_padding=i64_array(interior),
    )


def iota(b: Builder, result_type: RankedTensorType, dimension: int) -> Value:
    """`stablehlo.iota`: values counting along `dimension`."""
    return _one(b, "stablehlo.iota", [], result_type, iota_dimension=i64_attr(dimension))


def gather(
    b: Builder,
    operand: Value,
    start_indices: Value,
    result_type: RankedTensorType,
    *,
    offset_dims: Sequence[int],
    collapsed_slice_dims: Sequence[int],
    start_index_map: Sequence[int],
    index_vector_dim: int,
    slice_sizes: Sequence[int],
) -> Value:
    """`stablehlo.gather` (the caller computes the result type; see the StableHLO spec)."""

    def listed(values: Sequence[int]) -> str:
        return "[" + ", ".join(str(v) for v in values) + "]"

    parts = []
    if offset_dims:
        parts.append(f"offset_dims = {listed(offset_dims)}")
    if collapsed_slice_dims:
        parts.append(f"collapsed_slice_dims = {listed(collapsed_slice_dims)}")
    parts.append(f"start_index_map = {listed(start_index_map)}")
    parts.append(f"index_vector_dim = {index_vector_dim}")
    return _one(
        b,
        "stablehlo.gather",
        [operand, start_indices],
        result_type,
        dimension_numbers=OpaqueAttr(f"#stablehlo.gather<{', '.join(parts)}>"),
        slice_sizes=i64_array(slice_sizes),
    )


# Contractions ---------------------------------------------------------------------------------
def dot_general(
    b: Builder,
    lhs: Value,
    rhs: Value,
    *,
    lhs_batching: Sequence[int] = (),
    rhs_batching: Sequence[int] = (),
    lhs_contracting: Sequence[int],
    rhs_contracting: Sequence[int],
    result_element_type: Type | None = None,
) -> Value:
    """`stablehlo.dot_general`; result dims: batch, lhs free, rhs free (the spec's order).

    `result_element_type` defaults to lhs's element type (pass i32 for an i8 x i8 accumulation).
    """
    lhs_shape, rhs_shape = tensor_type(lhs).shape, tensor_type(rhs).shape
    batch = [lhs_shape[d] for d in lhs_batching]
    lhs_free = [d for i, d in enumerate(lhs_shape) if i not in lhs_batching and i not in lhs_contracting]
    rhs_free = [d for i, d in enumerate(rhs_shape) if i not in rhs_batching and i not in rhs_contracting]
    element = result_element_type or element_type_of(lhs.type)
    result_type = RankedTensorType(tuple(batch + lhs_free + rhs_free), element)

    numbers = DotDimensionNumbers(
        tuple(lhs_batching), tuple(rhs_batching), tuple(lhs_contracting), tuple(rhs_contracting)
    )
    return _one(
        b, "stablehlo.dot_general", [lhs, rhs], result_type, dot_dimension_numbers=numbers.attribute()
    )


def convolution(
    b: Builder,
    lhs: Value,
    rhs: Value,
    *,
    window_strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    result_element_type: Type | None = None,
) -> Value:
    """`stablehlo.convolution` in ONNX's layouts: input NC<spatial>, kernel OI<spatial>, output NC<spatial>.

    `lhs_dilation` > 1 is a transposed convolution. `result_element_type` defaults to lhs's element type.
    """
    lhs_shape, rhs_shape = tensor_type(lhs).shape, tensor_type(rhs).shape
    spatial = len(lhs_shape) - 2
    lhs_dilation = list(lhs_dilation or [1] * spatial)
    rhs_dilation = list(rhs_dilation or [1] * spatial)
    out_spatial = []
    for i in range(spatial):
        size = (lhs_shape[2 + i] - 1) * lhs_dilation[i] + 1 + padding[i][0] + padding[i][1]
        window = (rhs_shape[2 + i] - 1) * rhs_dilation[i] + 1
        out_spatial.append((size - window) // window_strides[i] + 1 if size >= window else 0)
    shape = (lhs_shape[0] // batch_group_count, rhs_shape[0], *out_spatial)
    element = result_element_type or element_type_of(lhs.type)
    pads = np.asarray(padding, dtype=np.int64).reshape(spatial, 2)
    return _one(
        b,
        "stablehlo.convolution",
        [lhs, rhs],
        RankedTensorType(shape, element),
        dimension_numbers=ConvDimensionNumbers.onnx(spatial).attribute(),
        window_strides=i64_array(window_strides),
        padding=DenseElementsAttr(pads, RankedTensorType((spatial, 2), I64)),
        lhs_dilation=i64_array(lhs_dilation),
        rhs_dilation=i64_array(rhs_dilation),
        feature_group_count=i64_attr(feature_group_count),
        batch_group_count=i64_attr(batch_group_count),
    )


# Reductions (ops with a region) ---------------------------------------------------------------
BodyFn = Callable[[Builder, Value, Value], Value]
"""Builds a reduction body: given the accumulator and the element (both `tensor<T>`), returns the result."""


def _reduction_body(element_type: Type, body: BodyFn) -> Region:
    scalar = RankedTensorType((), element_type)
    block = Block([scalar, scalar])
    inner = Builder(block)
    result = body(inner, block.arguments[0], block.arguments[1])
    inner.insert(GenericOp("stablehlo.return", [result], []))
    return Region([block])


def reduce(b: Builder, operand: Value, init: Value, dimensions: Sequence[int], body: BodyFn) -> Value:
    """`stablehlo.reduce` of one operand over `dimensions` (removed from the shape), `init` a scalar.

    Example: `reduce(b, x, zero, [1], add)` sums over dim 1 (`add` is this module's `add`).
    """
    shape = tuple(d for i, d in enumerate(tensor_type(operand).shape) if i not in dimensions)
    element = element_type_of(operand.type)
    region = _reduction_body(element, body)
    op = _op(
        b,
        "stablehlo.reduce",
        [operand, init],
        [RankedTensorType(shape, element)],
        {"dimensions": i64_array(dimensions)},
        [region],
    )
    return op.result


def reduce_window(
    b: Builder,
    operand: Value,
    init: Value,
    *,
    window_dimensions: Sequence[int],
    window_strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    body: BodyFn,
    window_dilations: Sequence[int] | None = None,
) -> Value:
    """`stablehlo.reduce_window` (pooling): one operand, a scalar `init`, full-rank window parameters."""
    shape = tensor_type(operand).shape
    rank = len(shape)
    dilations = list(window_dilations or [1] * rank)
    out = []
    for i in range(rank):
        size = shape[i] + padding[i][0] + padding[i][1]
        window = (window_dimensions[i] - 1) * dilations[i] + 1
        out.append((size - window) // window_strides[i] + 1 if size >= window else 0)
    element = element_type_of(operand.type)
    pads = np.asarray(padding, dtype=np.int64).reshape(rank, 2)
    op = _op(
        b,
        "stablehlo.reduce_window",
        [operand, init],
        [RankedTensorType(tuple(out), element)],
        {
            "window_dimensions": i64_array(window_dimensions),
            "window_strides": i64_array(window_strides),
            "window_dilations": i64_array(dilations),
            "base_dilations": i64_array([1] * rank),
            "padding": DenseElementsAttr(pads, RankedTensorType((rank, 2), I64)),
        },
        [_reduction_body(element, body)],
    )
    return op.result
