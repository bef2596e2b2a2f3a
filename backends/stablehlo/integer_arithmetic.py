"""onnxruntime's integer-kernel rules emitted as plain StableHLO ops: the run-time half of
qconvert/numerics/onnxruntime_kernels.py, for the lowerings of the QOperator, *Integer and dynamic
quantization ops (onnx_integer.py, onnx_qoperator.py) and of DynamicQuantizeLSTM (onnx_recurrent.py).

Everything known at conversion time (multipliers, QLinearAdd's constants, lookup tables) is computed by
`qconvert.numerics` and emitted as constants; what depends on the data (int32 accumulations, the
requantization of each element, DynamicQuantizeLinear's scale) is emitted here, one function per rule,
each naming the numerics function it mirrors, and the tests pin the emitted results against onnxruntime.

Where a rule rounds a product before adding (`qlinear_mul_mlas`, `scale_output_mlas` + bias,
QLinearAveragePool's sums) or rounds a multiply-add once (`qlinear_add_mlas`), the lowerings use
float32_rounding.py, which keeps XLA:CPU's contractions from changing the result; divisions use
`hlo.exact_divide`. StableHLO's reference interpreter gives the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.quant_types import QuantizedType, uniform_params
from qconvert.ir.types import F32, I32, IntegerType, RankedTensorType, Signedness, Type, element_type_of

from . import ops as hlo
from .lowering import LoweringContext, static_shape, storage_element_type

U8 = IntegerType(8, Signedness.UNSIGNED)  # DynamicQuantizeLinear's storage, lookup tables' byte index


# Operands ------------------------------------------------------------------------------------------
def static_operands(ctx: LoweringContext, op: Operation) -> list[Value]:
    """`ctx.operands(op)`, or `ctx.unsupported` naming the first operand whose shape is not static (an
    upstream op left unlowered, or a shape inference could not give)."""
    operands = ctx.operands(op)
    for index, value in enumerate(operands):
        static_shape(ctx, value, f"operand #{index}")
    return operands


def static_input(ctx: LoweringContext, op: Operation, position: int) -> Value | None:
    """`ctx.input(op, position)` checked as `static_operands` does."""
    value = ctx.input(op, position)
    if value is not None:
        static_shape(ctx, value, f"input #{position}")
    return value


# Storage views -------------------------------------------------------------------------------------
def storage(ctx: LoweringContext, value: Value) -> Value:
    """The storage integers of a quantized value (`i8`, or `ui8` for u8 storage): a bitcast in the
    quantized / qdq forms, the value itself in the integer form (or when it is storage already)."""
    element = element_type_of(value.type)
    if not isinstance(element, QuantizedType):
        return value
    producer = value.owner_op()
    wanted = storage_element_type(element)
    if producer is not None and producer.name == "stablehlo.bitcast_convert":
        source = producer.operands[0]
        if element_type_of(source.type) == wanted:
            return source  # storage -> quant -> storage: take the storage back
    return hlo.bitcast_convert(ctx.builder, value, hlo.tensor_type(value).with_element_type(wanted))


def as_result(ctx: LoweringContext, stored: Value, result_type: Type, note: str) -> Value:
    """Storage integers as the op's result type: a bitcast to `!quant.uniform` (marked with `note`) when
    the form keeps quant types, else the storage itself."""
    element = element_type_of(result_type)
    if not isinstance(element, QuantizedType):
        return stored
    result = hlo.bitcast_convert(ctx.builder, stored, result_type)
    ctx.note(result, note)
    return result


def zero_point_vector(ctx: LoweringContext, quant_type: Type, shape: Sequence[int]) -> Value | None:
    """The zero points of a per-tensor or per-axis quant type as an i32 tensor of `shape`; None when every
    zero point is 0 (nothing to subtract)."""
    assert isinstance(quant_type, QuantizedType)
    params = uniform_params(quant_type)
    zero_point = np.asarray(params.zero_point, np.int64)
    if not np.any(zero_point != 0):
        return None
    if params.block_sizes:
        raise AssertionError("sub-channel zero points reach no integer kernel of onnxruntime")
    constant = ctx.constant(zero_point.astype(np.int32), I32)
    axis = params.quantized_dimension
    return hlo.broadcast_in_dim(ctx.builder, constant, shape, [] if axis is None else [axis])


def centered(ctx: LoweringContext, stored: Value, zero_point: Value | None) -> Value:
    """`i32(q) - zp`, exact (`zero_point` already an i32 tensor of q's shape, or None for 0)."""
    wide = ctx.convert(stored, I32)
    return wide if zero_point is None else hlo.subtract(ctx.builder, wide, zero_point)


def centered_quantized(ctx: LoweringContext, value: Value, quant_type: Type) -> Value:
    """`i32(q) - zp` of a quantized operand whose zero points its type carries."""
    shape = hlo.tensor_type(value).shape
    return centered(ctx, storage(ctx, value), zero_point_vector(ctx, quant_type, shape))


def runtime_zero_point(
    ctx: LoweringContext, zero_point: Value | None, shape: Sequence[int], axis: int, what: str
) -> Value | None:
    """A zero point given as a tensor at run time (scalar, one element, or 1-D along `axis` of `shape`)
    as an i32 tensor of `shape`; None when absent."""
    if zero_point is None:
        return None
    zp_shape = hlo.tensor_type(zero_point).shape
    count = int(np.prod(zp_shape, dtype=np.int64))
    wide = ctx.convert(zero_point, I32)
    if count == 1:
        return hlo.broadcast_in_dim(ctx.builder, hlo.reshape(ctx.builder, wide, []), shape, [])
    non_unit = [d for d in zp_shape if d != 1]
    if len(non_unit) == 1 and non_unit[0] == shape[axis]:
        vector = hlo.reshape(ctx.builder, wide, [non_unit[0]])
        return hlo.broadcast_in_dim(ctx.builder, vector, shape, [axis])
    ctx.unsupported(f"{what} of shape {list(zp_shape)} for an operand of shape {list(shape)}")


# Requantization ----------------------------------------------------------------------------------------
def along(ctx: LoweringContext, values: np.ndarray, element: Type, shape: Sequence[int], axis: int) -> Value:
    """A per-tensor (one value) or per-axis (1-D along `axis`) constant broadcast to `shape`."""
    values = np.asarray(values)
    if values.size == 1:
        scalar = ctx.scalar(values.reshape(()).item(), element)
        return hlo.broadcast_in_dim(ctx.builder, scalar, shape, [])
    return hlo.broadcast_in_dim(ctx.builder, ctx.constant(values.reshape(-1), element), shape, [axis])


def requantize_mlas(
    ctx: LoweringContext, accumulator: Value, multiplier: Value, zero_point: int, quant_type: QuantizedType
) -> Value:
    """numerics `requantize_mlas`: `clamp(rne(f32(acc) * m), qmin - zp, qmax - zp) + zp` -> storage.
    `multiplier`: an f32 tensor of the accumulator's shape (no add follows the multiply: nothing to fuse)."""
    b = ctx.builder
    product = hlo.multiply(b, ctx.convert(accumulator, F32), multiplier)
    low = ctx.scalar(float(quant_type.storage_type_min - zero_point), F32)
    high = ctx.scalar(float(quant_type.storage_type_max - zero_point), F32)
    rounded = hlo.round_nearest_even(b, hlo.clamp(b, low, product, high))
    integers = hlo.convert(b, rounded, I32)
    if zero_point != 0:
        integers = hlo.add(b, integers, ctx.splat(zero_point, I32, hlo.tensor_type(integers).shape))
    return hlo.convert(b, integers, storage_element_type(quant_type))


def saturate_rounded(ctx: LoweringContext, value: Value, quant_type: QuantizedType) -> Value:
    """`sat(rne(v))` of an f32 tensor whose zero point is already added -> storage (QLinearAdd / QLinearMul
    / QLinearAveragePool: the bounds are integers, so clamping before or after rounding is the same)."""
    b = ctx.builder
    low = ctx.scalar(float(quant_type.storage_type_min), F32)
    high = ctx.scalar(float(quant_type.storage_type_max), F32)
    rounded = hlo.round_nearest_even(b, hlo.clamp(b, low, value, high))
    return hlo.convert(b, hlo.convert(b, rounded, I32), storage_element_type(quant_type))


def gather_table(ctx: LoweringContext, index: Value, table: np.ndarray, element: Type) -> Value:
    """`table[index]` elementwise: a 1-D constant `table` gathered by an i32 `index` tensor of any shape."""
    shape = tuple(hlo.tensor_type(index).shape)
    return hlo.gather(
        ctx.builder,
        ctx.constant(table, element),
        index,
        RankedTensorType(shape, element),
        offset_dims=[],
        collapsed_slice_dims=[0],
        start_index_map=[0],
        index_vector_dim=len(shape),
        slice_sizes=[1],
    )


def lookup(ctx: LoweringContext, stored: Value, table: np.ndarray, quant_type: QuantizedType) -> Value:
    """`table[byte(q)]`: the 256-entry tables of numerics `lookup_table_onnxruntime`, indexed by the stored
    value's byte pattern (as onnxruntime indexes them) -> storage of `quant_type`."""
    shape = hlo.tensor_type(stored).shape
    if element_type_of(stored.type) != U8:
        stored = hlo.bitcast_convert(ctx.builder, stored, RankedTensorType(tuple(shape), U8))
    index = hlo.convert(ctx.builder, stored, I32)
    return gather_table(ctx, index, table, storage_element_type(quant_type))


# Dynamic quantization ----------------------------------------------------------------------------------
def dynamic_quantize_linear(ctx: LoweringContext, x: Value) -> tuple[Value, Value, Value]:
    """onnxruntime DynamicQuantizeLinear (uint8): numerics `dynamic_quantize_parameters_onnxruntime` then
    `quantize_linear_mlas`, on the data at run time. Returns (y ui8, scale f32 scalar, zero point ui8 scalar).

    `min = min(0, min(x))`, `max = max(0, max(x))`, `scale = (max - min) / 255` (1 when 0), `zp =
    rne(clamp(0 - min / scale, 0, 255))`, `y = clamp(rne(x / scale) + zp, 0, 255)`, NaN -> 0; all f32."""
    b = ctx.builder
    shape = hlo.tensor_type(x).shape
    x = ctx.convert(x, F32)
    every = list(range(len(shape)))
    smallest = hlo.reduce(b, x, ctx.scalar(np.inf, F32), every, hlo.minimum)
    largest = hlo.reduce(b, x, ctx.scalar(-np.inf, F32), every, hlo.maximum)
    low = hlo.minimum(b, smallest, ctx.scalar(0.0, F32))
    high = hlo.maximum(b, largest, ctx.scalar(0.0, F32))
    spread = hlo.exact_divide(b, hlo.subtract(b, high, low), ctx.scalar(255.0, F32))
    is_zero = hlo.compare(b, "EQ", spread, ctx.scalar(0.0, F32))
    scale = hlo.select(b, is_zero, ctx.scalar(1.0, F32), spread)
    initial = hlo.subtract(b, ctx.scalar(0.0, F32), hlo.exact_divide(b, low, scale))
    zero_point = hlo.round_nearest_even(
        b, hlo.clamp(b, ctx.scalar(0.0, F32), initial, ctx.scalar(255.0, F32))
    )
    quotient = hlo.exact_divide(b, x, hlo.broadcast_in_dim(b, scale, shape, []))
    # |x / scale| <= 255 and zp in [0, 255]: the f32 sum of the rounded quotient and zp is exact.
    shifted = hlo.add(b, hlo.round_nearest_even(b, quotient), hlo.broadcast_in_dim(b, zero_point, shape, []))
    is_nan = hlo.compare(b, "NE", shifted, shifted)
    cleaned = hlo.select(b, is_nan, ctx.splat(0.0, F32, shape), shifted)
    clamped = hlo.clamp(b, ctx.scalar(0.0, F32), cleaned, ctx.scalar(255.0, F32))
    y = hlo.convert(b, clamped, U8)
    return y, scale, hlo.convert(b, zero_point, U8)
