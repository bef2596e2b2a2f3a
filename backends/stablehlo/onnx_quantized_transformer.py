"""Lowerings of com.microsoft QAttention and QEmbedLayerNormalization: what onnxruntime's quantize_dynamic
makes of a model its transformer optimizer fused (Attention, EmbedLayerNormalization). The semantics are
the interpreter's (qconvert/onnx_contrib_kernels.py).

QAttention's input scale and zero point come from DynamicQuantizeLinear at run time, so its projection is
integer / f32 arithmetic in every form, as MatMulIntegerToFloat's (onnx_integer_to_float.py): an exact i32
product of the centered operands, `f32(acc) * f32(input_scale * weight_scale)` rounded once, plus the bias;
then Attention's lowering from its QKV (onnx_contrib.attention_of_qkv), mask_index at input 5.
QEmbedLayerNormalization's tables are dequantized as onnxruntime's kernel does element by element,
`f32(q - zp) * scale` (one rounding), then EmbedLayerNormalization's lowering.
"""

from __future__ import annotations

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.types import F32

from . import ops as hlo
from .float32_rounding import rounded_product
from .integer_arithmetic import centered, runtime_zero_point, static_input
from .lowering import LoweringContext, lowers
from .onnx_contrib import attention_of_qkv, embed_layer_norm
from .onnx_integer import NOTE_RUNTIME_SCALE
from .onnx_integer_to_float import per_column
from .onnx_nn import matmul


@lowers("onnx.com.microsoft.QAttention")
def lower_quantized_attention(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, weights, bias = static_input(ctx, op, 0), static_input(ctx, op, 1), static_input(ctx, op, 2)
    x_scale, w_scale = static_input(ctx, op, 3), static_input(ctx, op, 4)
    if x is None or weights is None or bias is None or x_scale is None or w_scale is None:
        ctx.unsupported("QAttention without its input, weight, bias or scales")
    assert x is not None and weights is not None and bias is not None
    assert x_scale is not None and w_scale is not None
    if ctx.source_input(op, 8) is not None or len(op.results) > 1:
        ctx.unsupported("QAttention with past state or present outputs")
    if ctx.attribute(op, "qkv_hidden_sizes") is not None:
        ctx.unsupported("QAttention with qkv_hidden_sizes")
    x_shape, w_shape = hlo.tensor_type(x).shape, hlo.tensor_type(weights).shape
    x_zero_point = static_input(ctx, op, 6)
    for value, what in ((x_scale, "input_scale"), (x_zero_point, "input_zero_point")):
        if value is not None and int(np.prod(hlo.tensor_type(value).shape, dtype=np.int64)) != 1:
            ctx.unsupported(f"QAttention's {what} must be a scalar (onnxruntime's kernel)")
    x_zero = runtime_zero_point(ctx, x_zero_point, x_shape, len(x_shape) - 1, "input_zero_point")
    w_zero = runtime_zero_point(ctx, static_input(ctx, op, 7), w_shape, 1, "weight_zero_point")
    accumulator = matmul(ctx, centered(ctx, x, x_zero), centered(ctx, weights, w_zero))  # (B, S, 3H) i32
    shape = list(hlo.tensor_type(accumulator).shape)
    multiplier = hlo.multiply(
        ctx.builder,
        per_column(ctx, x_scale, shape, "input_scale"),
        per_column(ctx, w_scale, shape, "weight_scale"),
    )
    qkv = rounded_product(ctx, ctx.convert(accumulator, F32), multiplier)
    ctx.note(qkv, NOTE_RUNTIME_SCALE)
    qkv = hlo.add(ctx.builder, qkv, ctx.broadcast_to(ctx.convert(bias, F32), shape))
    return [attention_of_qkv(ctx, op, qkv, mask_position=5)]


@lowers("onnx.com.microsoft.QEmbedLayerNormalization")
def lower_quantized_embed_layer_norm(ctx: LoweringContext, op: Operation) -> list[Value]:
    tables: list[Value | None] = []
    for position in range(2, 7):  # word, position, segment, gamma, beta; scales at +6, zero points at +11
        stored = static_input(ctx, op, position)
        if stored is None:
            tables.append(None)
            continue
        scale, zero_point = static_input(ctx, op, position + 6), static_input(ctx, op, position + 11)
        if scale is None or int(np.prod(hlo.tensor_type(scale).shape, dtype=np.int64)) != 1:
            ctx.unsupported("QEmbedLayerNormalization with a table scale that is not a scalar")
        assert scale is not None
        shape = list(hlo.tensor_type(stored).shape)
        zero = runtime_zero_point(ctx, zero_point, shape, 0, "QEmbedLayerNormalization's zero point")
        wide = ctx.convert(centered(ctx, stored, zero), F32)  # exact: |q - zp| < 2**16
        tables.append(hlo.multiply(ctx.builder, wide, per_column(ctx, scale, shape, "scale")))
    return embed_layer_norm(ctx, op, tables, mask_position=7, position_ids_position=None)
