"""Lowerings of the integer ops of dynamic quantization: MatMulInteger, ConvInteger (lifted
`qconvert.matmul_integer` / `conv_integer` with constant zero points, or generic `onnx.*` ops whose zero
points come at run time from DynamicQuantizeLinear), DynamicQuantizeLinear and com.microsoft
DynamicQuantizeMatMul.

MatMulInteger / ConvInteger are exact: `i32(q) - zp` for each operand (per tensor, per row of A,
per column of B, per output channel of W, as the lifted type or the run-time tensor says), then an i32
dot_general / convolution (onnxruntime accumulates in int32; the centered input is padded with 0, i.e. with
its zero point, as onnxruntime's im2col pads). DynamicQuantizeLinear computes its scale and zero point from
the data, so in every form it is arithmetic (integer_arithmetic.dynamic_quantize_linear) and its outputs
are the ONNX storage tensors (`ui8` y and zero point, `f32` scale): no quant type can carry a scale known
only at run time.
"""

from __future__ import annotations

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.qconvert import (
    ConvIntegerOp,
    DynamicQuantizeLinearOp,
    DynamicQuantizeMatMulOp,
    MatMulIntegerOp,
)
from qconvert.ir.quant_types import uniform_params
from qconvert.ir.types import F32, I32, element_type_of

from . import ops as hlo
from .float32_rounding import rounded_product
from .integer_arithmetic import (
    along,
    centered,
    centered_quantized,
    dynamic_quantize_linear,
    runtime_zero_point,
    static_input,
    static_operands,
)
from .lowering import LoweringContext, lowers
from .onnx_nn import matmul, window_padding

NOTE_RUNTIME_SCALE = (
    "dynamic quantization written out as integer / f32 arithmetic in every form: its scale and zero point "
    "are computed from the data at run time, which no quant type can carry"
)


def integer_convolution(ctx: LoweringContext, op: Operation, x: Value, w: Value) -> Value:
    """ONNX Conv's window (pads / auto_pad, strides, dilations, group) over centered i32 operands -> i32."""
    x_shape, w_shape = hlo.tensor_type(x).shape, hlo.tensor_type(w).shape
    spatial = len(x_shape) - 2
    kernel = list(w_shape[2:])
    strides = ctx.integer_list(op, "strides", [1] * spatial)
    dilations = ctx.integer_list(op, "dilations", [1] * spatial)
    padding = window_padding(ctx, op, x_shape[2:], kernel, strides, dilations)
    return hlo.convolution(
        ctx.builder,
        x,
        w,
        window_strides=strides,
        padding=padding,
        rhs_dilation=dilations,
        feature_group_count=int(ctx.attribute(op, "group", 1)),  # type: ignore[arg-type]
        result_element_type=I32,
    )


@lowers(MatMulIntegerOp)
def lower_matmul_integer(ctx: LoweringContext, op: Operation) -> list[Value]:
    assert isinstance(op, MatMulIntegerOp)
    a, b = static_operands(ctx, op)
    lhs = centered_quantized(ctx, a, element_type_of(op.a.type))
    rhs = centered_quantized(ctx, b, element_type_of(op.b.type))
    return [matmul(ctx, lhs, rhs)]


@lowers("onnx.MatMulInteger")
def lower_onnx_matmul_integer(ctx: LoweringContext, op: Operation) -> list[Value]:
    """MatMulInteger with run-time zero points: scalar, per row of A ([M]) or per column of B ([N])."""
    a, b = static_input(ctx, op, 0), static_input(ctx, op, 1)
    assert a is not None and b is not None
    a_shape, b_shape = hlo.tensor_type(a).shape, hlo.tensor_type(b).shape
    a_rows = max(len(a_shape) - 2, 0)
    a_zero = runtime_zero_point(ctx, static_input(ctx, op, 2), a_shape, a_rows, "a_zero_point")
    b_zero = runtime_zero_point(ctx, static_input(ctx, op, 3), b_shape, len(b_shape) - 1, "b_zero_point")
    return [matmul(ctx, centered(ctx, a, a_zero), centered(ctx, b, b_zero))]


@lowers(ConvIntegerOp)
def lower_conv_integer(ctx: LoweringContext, op: Operation) -> list[Value]:
    assert isinstance(op, ConvIntegerOp)
    x, w = static_operands(ctx, op)
    x_centered = centered_quantized(ctx, x, element_type_of(op.x.type))
    w_centered = centered_quantized(ctx, w, element_type_of(op.w.type))
    return [integer_convolution(ctx, op, x_centered, w_centered)]


@lowers("onnx.ConvInteger")
def lower_onnx_conv_integer(ctx: LoweringContext, op: Operation) -> list[Value]:
    """ConvInteger with run-time zero points: scalar for x, scalar or per output channel ([M]) for w."""
    x, w = static_input(ctx, op, 0), static_input(ctx, op, 1)
    assert x is not None and w is not None
    x_shape, w_shape = hlo.tensor_type(x).shape, hlo.tensor_type(w).shape
    x_zero_point = static_input(ctx, op, 2)
    if x_zero_point is not None and int(np.prod(hlo.tensor_type(x_zero_point).shape, dtype=np.int64)) != 1:
        ctx.unsupported("x_zero_point must be a scalar (onnxruntime's ConvInteger)")
    x_zero = runtime_zero_point(ctx, x_zero_point, x_shape, 1, "x_zero_point")
    w_zero = runtime_zero_point(ctx, static_input(ctx, op, 3), w_shape, 0, "w_zero_point")
    return [integer_convolution(ctx, op, centered(ctx, x, x_zero), centered(ctx, w, w_zero))]


@lowers(DynamicQuantizeLinearOp)
def lower_dynamic_quantize_linear(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = static_operands(ctx, op)
    if len(op.results) != 3:
        ctx.unsupported("DynamicQuantizeLinear with an absent output")
    y, scale, zero_point = dynamic_quantize_linear(ctx, x)
    ctx.note(y, NOTE_RUNTIME_SCALE)
    return [y, scale, zero_point]


@lowers(DynamicQuantizeMatMulOp)
def lower_dynamic_quantize_matmul(ctx: LoweringContext, op: Operation) -> list[Value]:
    """com.microsoft DynamicQuantizeMatMul: A quantized as DynamicQuantizeLinear does, the int32 product
    with B (constant parameters, per tensor or per column), numerics `scale_output_mlas` with the
    multiplier `f32(s_a) * s_b` (s_a known at run time), then the float bias, each rounded on its own."""
    operands = static_operands(ctx, op)
    a, b = operands[0], operands[1]
    assert isinstance(op, DynamicQuantizeMatMulOp)
    b_type = element_type_of(op.b.type)
    a_stored, a_scale, a_zero = dynamic_quantize_linear(ctx, a)
    a_shape = hlo.tensor_type(a_stored).shape
    a_zero_wide = hlo.broadcast_in_dim(ctx.builder, ctx.convert(a_zero, I32), a_shape, [])
    accumulator = matmul(ctx, centered(ctx, a_stored, a_zero_wide), centered_quantized(ctx, b, b_type))
    shape = hlo.tensor_type(accumulator).shape
    params = uniform_params(b_type)  # type: ignore[arg-type]
    b_scales = along(ctx, params.scale.astype(np.float32), F32, shape, len(shape) - 1)
    multiplier = hlo.multiply(ctx.builder, hlo.broadcast_in_dim(ctx.builder, a_scale, shape, []), b_scales)
    y = rounded_product(ctx, ctx.convert(accumulator, F32), multiplier)
    ctx.note(y, NOTE_RUNTIME_SCALE)
    if len(operands) > 2:
        y = hlo.add(ctx.builder, y, ctx.broadcast_to(ctx.convert(operands[2], F32), shape))
    return [y]
