"""Lowering of com.microsoft MatMulIntegerToFloat (what onnxruntime's graph optimizer makes of a
quantize_dynamic model's `MatMulInteger -> Cast -> Mul [-> Add]`; the semantics and onnxruntime's rule are
in qconvert/interpret_integer_to_float.py). Its A scale and zero point come from DynamicQuantizeLinear at
run time, so in every form it is integer / f32 arithmetic: `i32(a) - a_zp` and `i32(b) - b_zp` (per column
of B), an exact i32 dot_general, `f32(acc) * f32(a_scale * b_scale)` rounded once, then the bias."""

from __future__ import annotations

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.types import F32

from . import ops as hlo
from .float32_rounding import rounded_product
from .integer_arithmetic import centered, runtime_zero_point, static_input
from .lowering import LoweringContext, lowers
from .onnx_integer import NOTE_RUNTIME_SCALE
from .onnx_nn import matmul


def per_column(ctx: LoweringContext, value: Value, shape: list[int], what: str) -> Value:
    """A scalar / one-element f32 value, or one per column (the last dimension), broadcast to `shape`."""
    count = int(np.prod(hlo.tensor_type(value).shape, dtype=np.int64))
    wide = ctx.convert(value, F32)
    if count == 1:
        return hlo.broadcast_in_dim(ctx.builder, hlo.reshape(ctx.builder, wide, []), shape, [])
    if count != shape[-1]:
        ctx.unsupported(f"{what} has {count} values, not 1 or N = {shape[-1]}")
    vector = hlo.reshape(ctx.builder, wide, [count])
    return hlo.broadcast_in_dim(ctx.builder, vector, shape, [len(shape) - 1])


@lowers("onnx.com.microsoft.MatMulIntegerToFloat")
def lower_matmul_integer_to_float(ctx: LoweringContext, op: Operation) -> list[Value]:
    a, b = static_input(ctx, op, 0), static_input(ctx, op, 1)
    a_scale, b_scale = static_input(ctx, op, 2), static_input(ctx, op, 3)
    assert a is not None and b is not None and a_scale is not None and b_scale is not None
    a_shape, b_shape = hlo.tensor_type(a).shape, hlo.tensor_type(b).shape
    a_zero_point = static_input(ctx, op, 4)
    for value, what in ((a_scale, "a_scale"), (a_zero_point, "a_zero_point")):
        if value is not None and int(np.prod(hlo.tensor_type(value).shape, dtype=np.int64)) != 1:
            ctx.unsupported(f"{what} must be a scalar (onnxruntime's kernel)")
    a_zero = runtime_zero_point(ctx, a_zero_point, a_shape, len(a_shape) - 1, "a_zero_point")
    b_zero = runtime_zero_point(ctx, static_input(ctx, op, 5), b_shape, len(b_shape) - 1, "b_zero_point")
    accumulator = matmul(ctx, centered(ctx, a, a_zero), centered(ctx, b, b_zero))
    shape = list(hlo.tensor_type(accumulator).shape)
    a_scale_wide = per_column(ctx, a_scale, shape, "a_scale")
    multiplier = hlo.multiply(ctx.builder, a_scale_wide, per_column(ctx, b_scale, shape, "b_scale"))
    y = rounded_product(ctx, ctx.convert(accumulator, F32), multiplier)
    ctx.note(y, NOTE_RUNTIME_SCALE)
    bias = static_input(ctx, op, 6)
    if bias is not None:
        y = hlo.add(ctx.builder, y, ctx.broadcast_to(ctx.convert(bias, F32), shape))
    return [y]
