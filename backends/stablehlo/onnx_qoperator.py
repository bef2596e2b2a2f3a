"""Lowerings of the QOperator ops lifted by frontends/onnx/qoperator.py (`qconvert.qlinear_*`,
`qconvert.qgemm`), bit for bit as onnxruntime's CPU kernels compute them (qconvert/numerics/
onnxruntime_kernels.py; the interpreter runs the same rules).

Every op is written out in integer / f32 arithmetic (integer_arithmetic.py) in the `integer` form, and in
the `qdq` and `quantized` forms too, with its operands and result keeping their `!quant.uniform` types
(bitcasts at the boundary, the result marked with a `qconvert.note`), since no StableHLO quantized op
computes these kernels' numbers: they add the zero point after rounding (`requantize_mlas`) or before it
through FMAs (QLinearAdd), round the f32 product first (QLinearMul), look results up in tables
(QLinearSigmoid, QLinearLeakyRelu, QLinearConcat, QLinearSoftmax), and many QOperator models hold u8
activations, which stablehlo-legalize-quant-to-math reads as signed (quant.NOTE_UNSIGNED). The exception:
in the `quantized` form, QLinearMatMul and QGemm on signed 8-bit values with weight zero points 0 are a
quantized `dot_general` into an i32 accumulator type, built as quant_fusion.py builds fused contractions
(`quantized_dot`), which is exact. QLinearConv stays written out: jaxlib 0.10.2's StableHLO interpreter
accumulates a quantized i8 convolution in i8 (413 of 432 outputs of a test case wrong, measured; XLA is
right), and a default form must run right on both engines.

- QLinearConv / QLinearMatMul / QGemm: exact i32 accumulation of the centered operands (+ the int32 bias /
  C), then `requantize_mlas` with the f32 multiplier of numerics (per output channel / column), or for
  QGemm without y_scale `f32(acc) * m` rounded once;
- QLinearAdd: `qlinear_add_mlas`, its two FMAs emulated exactly (`float32_fma`), A and B swapped where
  onnxruntime swaps them; QLinearMul: `qlinear_mul_mlas`;
- QLinearSigmoid / QLinearLeakyRelu / QLinearConcat: numerics' 256-entry tables, gathered by byte;
  QLinearSoftmax: numerics' exponential table, a sequential f32 row sum, one division per element;
- QLinearGlobalAveragePool: i32 sum minus `zp * size`, `requantize_mlas`; QLinearAveragePool: the f32
  window sums in onnxruntime's order, one division by the count, then `quantize_pool_onnxruntime`.
"""

from __future__ import annotations

import itertools

import numpy as np

from qconvert import numerics
from qconvert import onnx_semantics as semantics
from qconvert.ir.attributes import OpaqueAttr
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.qconvert import (
    QGemmOp,
    QLinearAddOp,
    QLinearAveragePoolOp,
    QLinearConcatOp,
    QLinearConvOp,
    QLinearGlobalAveragePoolOp,
    QLinearLeakyReluOp,
    QLinearMatMulOp,
    QLinearMulOp,
    QLinearSigmoidOp,
    QLinearSoftmaxOp,
    QLinearUnaryOp,
)
from qconvert.ir.quant_types import QuantizedType, uniform_params
from qconvert.ir.types import F32, I32, RankedTensorType, element_type_of
from qconvert.numerics.onnxruntime_kernels import (
    qgemm_multiplier_onnxruntime,
    qlinear_add_constants_mlas,
    qlinear_binary_swaps_inputs,
    qlinear_softmax_output_factor_onnxruntime,
    qlinear_softmax_table_onnxruntime,
)

from . import ops as hlo
from . import quant_fusion
from .float32_rounding import float32_fma, rounded_product
from .integer_arithmetic import (
    along,
    as_result,
    centered_quantized,
    gather_table,
    lookup,
    requantize_mlas,
    saturate_rounded,
    static_operands,
    storage,
)
from .lowering import Form, LoweringContext, lowers, storage_element_type
from .onnx_integer import integer_convolution
from .onnx_nn import matmul, window_of

NOTE = (
    "written out as onnxruntime's integer kernel ({rule}): no StableHLO quantized op rounds as it does "
    "(and quant-to-math reads u8 storage as signed)"
)


def _quant_type(ctx: LoweringContext, value: Value) -> QuantizedType:
    element = element_type_of(value.type)
    if not isinstance(element, QuantizedType):
        ctx.unsupported(f"expected a quantized operand, got {value.type}")
    return element


def _per_tensor(ctx: LoweringContext, value: Value, what: str) -> tuple[QuantizedType, float, int]:
    """The quant type of a per-tensor operand / result, its scale and zero point."""
    quant_type = _quant_type(ctx, value)
    params = uniform_params(quant_type)
    if params.scale.size != 1:
        ctx.unsupported(f"{what} must be quantized per tensor")
    return quant_type, float(params.scale.reshape(-1)[0]), int(params.zero_point.reshape(-1)[0])


def _finish(ctx: LoweringContext, op: Operation, stored: Value, rule: str) -> list[Value]:
    return [as_result(ctx, stored, ctx.result_type(op), NOTE.format(rule=rule))]


def _requantized(
    ctx: LoweringContext,
    op: Operation,
    accumulator: Value,
    multiplier: np.ndarray,
    axis: int,
    output: tuple[QuantizedType, float, int],
) -> list[Value]:
    """The op's result from its i32 accumulator: numerics `requantize_mlas` with a per-tensor or per-`axis`
    f32 multiplier, to the output's (quant type, scale, zero point)."""
    y_type, _, y_zero = output
    factor = along(ctx, multiplier, F32, hlo.tensor_type(accumulator).shape, axis)
    return _finish(ctx, op, requantize_mlas(ctx, accumulator, factor, y_zero, y_type), "requantize_mlas")


# The quantized form's contractions ------------------------------------------------------------------------
def quantized_dot(
    ctx: LoweringContext,
    op: Operation,
    lhs: Value,
    rhs: Value,
    bias: Value | None,
    transposes: tuple[bool, bool],
) -> Value | None:
    """QLinearMatMul / QGemm in the `quantized` form as StableHLO quantized ops, built as quant_fusion.py
    builds a fused contraction (its helpers): an i8 x i8 `dot_general` into the i32 accumulator type
    `!quant.uniform<i32:f32[:axis], f32(s_a * s_b)>` (exact), the int32 bias added in that type, then
    `quant_fusion.requantize` (uniform_quantize where it equals onnxruntime's `requantize_mlas`: output zero
    point 0 or `--semantics stablehlo`; else `requantize_mlas` written out). None when the op does not fit
    what StableHLO's quantized ops and quant-to-math accept (then it is written out in integer arithmetic):
    signed i8 per-tensor A and output, signed i8 B with zero points 0, per tensor or per output column,
    2-D B, bias 1-D."""
    assert isinstance(op, QLinearMatMulOp | QGemmOp)
    if ctx.form is not Form.QUANTIZED:
        return None
    b = ctx.builder
    try:
        lhs_type = quant_fusion.per_tensor_signed_8bit(op.a.type, "A")
        output_type = quant_fusion.per_tensor_signed_8bit(op.results[0].type, "the output")
        _quant_type(ctx, op.b)  # B must be quantized (else unsupported)
        if len(hlo.tensor_type(rhs).shape) != 2 or len(hlo.tensor_type(lhs).shape) < 2:
            return None
        if transposes[0]:
            lhs = quant_fusion.transpose_quantized(b, lhs, [1, 0])
        if transposes[1]:
            rhs = quant_fusion.transpose_quantized(b, rhs, [1, 0])
        scales, per_axis = quant_fusion.weight_scales(element_type_of(rhs.type), 1, "B")  # type: ignore[arg-type]
    except quant_fusion.NotFused:
        return None
    lhs_shape, rhs_shape = hlo.tensor_type(lhs).shape, hlo.tensor_type(rhs).shape
    result_shape = (*lhs_shape[:-1], rhs_shape[1])
    axis = len(result_shape) - 1
    if bias is not None and tuple(hlo.tensor_type(bias).shape) != (rhs_shape[1],):
        return None
    acc_type = quant_fusion.accumulator_type(lhs_type, scales, per_axis, axis, rhs_shape[1], None)
    last = len(lhs_shape) - 1
    numbers = f"#stablehlo.dot<lhs_contracting_dimensions = [{last}], rhs_contracting_dimensions = [0]>"
    acc = quant_fusion.typed_op(
        b,
        "stablehlo.dot_general",
        [lhs, rhs],
        RankedTensorType(tuple(result_shape), acc_type),
        dot_dimension_numbers=OpaqueAttr(numbers),
    )
    if bias is not None:
        acc = quant_fusion.add_bias(b, acc, ctx.convert(bias, I32), axis)
    return quant_fusion.requantize(ctx, b, acc, output_type, tuple(result_shape))


# Contractions -------------------------------------------------------------------------------------------
@lowers(QLinearMatMulOp)
def lower_qlinear_matmul(ctx: LoweringContext, op: Operation) -> list[Value]:
    assert isinstance(op, QLinearMatMulOp)
    a, b = static_operands(ctx, op)
    a_type, a_scale, _ = _per_tensor(ctx, op.a, "QLinearMatMul's input a")
    b_type = _quant_type(ctx, op.b)
    output = _per_tensor(ctx, op.results[0], "QLinearMatMul's output")
    fused = quantized_dot(ctx, op, a, b, None, (False, False))
    if fused is not None:
        return [fused]
    accumulator = matmul(ctx, centered_quantized(ctx, a, a_type), centered_quantized(ctx, b, b_type))
    multiplier = numerics.requantize_scale_onnxruntime(a_scale, uniform_params(b_type).scale, output[1])
    last = len(hlo.tensor_type(accumulator).shape) - 1
    return _requantized(ctx, op, accumulator, multiplier, last, output)  # per-column B scales: last axis


@lowers(QLinearConvOp)
def lower_qlinear_conv(ctx: LoweringContext, op: Operation) -> list[Value]:
    assert isinstance(op, QLinearConvOp)
    operands = static_operands(ctx, op)
    x_type, x_scale, _ = _per_tensor(ctx, op.x, "QLinearConv's input")
    w_type = _quant_type(ctx, op.w)
    output = _per_tensor(ctx, op.results[0], "QLinearConv's output")
    x_centered = centered_quantized(ctx, operands[0], x_type)
    w_centered = centered_quantized(ctx, operands[1], w_type)
    accumulator = integer_convolution(ctx, op, x_centered, w_centered)
    shape = hlo.tensor_type(accumulator).shape
    if len(operands) > 2:  # the int32 bias, one per output channel
        bias = ctx.convert(operands[2], I32)
        accumulator = hlo.add(ctx.builder, accumulator, hlo.broadcast_in_dim(ctx.builder, bias, shape, [1]))
    multiplier = numerics.requantize_scale_onnxruntime(x_scale, uniform_params(w_type).scale, output[1])
    return _requantized(ctx, op, accumulator, multiplier, 1, output)  # per-channel W scales: axis 1


@lowers(QGemmOp)
def lower_qgemm(ctx: LoweringContext, op: Operation) -> list[Value]:
    assert isinstance(op, QGemmOp)
    operands = static_operands(ctx, op)
    a_type, a_scale, _ = _per_tensor(ctx, op.a, "QGemm's input A")
    b_type = _quant_type(ctx, op.b)
    alpha = float(ctx.attribute(op, "alpha", 1.0))  # type: ignore[arg-type]
    transposes = (bool(ctx.attribute(op, "transA", 0)), bool(ctx.attribute(op, "transB", 0)))
    if alpha == 1.0 and isinstance(element_type_of(op.results[0].type), QuantizedType):
        bias = operands[2] if len(operands) > 2 else None
        fused = quantized_dot(ctx, op, operands[0], operands[1], bias, transposes)
        if fused is not None:
            return [fused]
    a = centered_quantized(ctx, operands[0], a_type)
    b = centered_quantized(ctx, operands[1], b_type)
    if transposes[0]:
        a = hlo.transpose(ctx.builder, a, [1, 0])
    if transposes[1]:
        b = hlo.transpose(ctx.builder, b, [1, 0])
    accumulator = matmul(ctx, a, b)
    shape = hlo.tensor_type(accumulator).shape
    if len(operands) > 2:  # C: int32, added to the accumulator
        accumulator = hlo.add(
            ctx.builder, accumulator, ctx.broadcast_to(ctx.convert(operands[2], I32), shape)
        )
    b_scale = uniform_params(b_type).scale
    result_element = element_type_of(op.results[0].type)
    if not isinstance(result_element, QuantizedType):
        multiplier = qgemm_multiplier_onnxruntime(alpha, a_scale, b_scale, None)
        factor = along(ctx, multiplier, F32, shape, 1)
        return [rounded_product(ctx, ctx.convert(accumulator, F32), factor)]  # numerics scale_output_mlas
    output = _per_tensor(ctx, op.results[0], "QGemm's output")
    multiplier = qgemm_multiplier_onnxruntime(alpha, a_scale, b_scale, output[1])
    return _requantized(ctx, op, accumulator, multiplier, 1, output)  # per-column B scales: axis 1


# Element-wise -------------------------------------------------------------------------------------------
def _broadcast_f32(ctx: LoweringContext, value: Value, shape: tuple[int, ...]) -> Value:
    return ctx.broadcast_to(ctx.convert(storage(ctx, value), F32), shape)


@lowers(QLinearAddOp)
def lower_qlinear_add(ctx: LoweringContext, op: Operation) -> list[Value]:
    """numerics `qlinear_add_mlas`: `sat(rne(fma(a, r_a, fma(b, r_b, fixed))))` on the raw stored values."""
    assert isinstance(op, QLinearAddOp)
    a, b = static_operands(ctx, op)
    _, a_scale, a_zero = _per_tensor(ctx, op.a, "QLinearAdd's input A")
    _, b_scale, b_zero = _per_tensor(ctx, op.b, "QLinearAdd's input B")
    c_type, c_scale, c_zero = _per_tensor(ctx, op.results[0], "QLinearAdd's output")
    shape = ctx.result_type(op).shape
    if qlinear_binary_swaps_inputs(hlo.tensor_type(a).shape, hlo.tensor_type(b).shape):
        a, b, a_scale, a_zero, b_scale, b_zero = b, a, b_scale, b_zero, a_scale, a_zero
    ratio_a, ratio_b, fixed = qlinear_add_constants_mlas(a_scale, a_zero, b_scale, b_zero, c_scale, c_zero)
    value = float32_fma(
        ctx, _broadcast_f32(ctx, b, shape), ctx.splat(ratio_b, F32, shape), ctx.splat(fixed, F32, shape)
    )
    value = float32_fma(ctx, _broadcast_f32(ctx, a, shape), ctx.splat(ratio_a, F32, shape), value)
    return _finish(ctx, op, saturate_rounded(ctx, value, c_type), "qlinear_add_mlas")


@lowers(QLinearMulOp)
def lower_qlinear_mul(ctx: LoweringContext, op: Operation) -> list[Value]:
    """numerics `qlinear_mul_mlas`: `sat(rne(f32((a - zp_a) * (b - zp_b)) * m + zp_c))`, each step rounded."""
    assert isinstance(op, QLinearMulOp)
    a, b = static_operands(ctx, op)
    a_type, a_scale, _ = _per_tensor(ctx, op.a, "QLinearMul's input A")
    b_type, b_scale, _ = _per_tensor(ctx, op.b, "QLinearMul's input B")
    c_type, c_scale, c_zero = _per_tensor(ctx, op.results[0], "QLinearMul's output")
    shape = ctx.result_type(op).shape
    lhs = ctx.broadcast_to(centered_quantized(ctx, a, a_type), shape)
    rhs = ctx.broadcast_to(centered_quantized(ctx, b, b_type), shape)
    product = ctx.convert(hlo.multiply(ctx.builder, lhs, rhs), F32)  # |product| <= 255**2: exact
    ratio = numerics.requantize_scale_onnxruntime(a_scale, np.float32(b_scale), c_scale)  # f32(s_a s_b) / s_c
    scaled = rounded_product(ctx, product, ctx.splat(float(ratio.reshape(())), F32, shape))
    shifted = hlo.add(ctx.builder, scaled, ctx.splat(float(c_zero), F32, shape))
    return _finish(ctx, op, saturate_rounded(ctx, shifted, c_type), "qlinear_mul_mlas")


def _table_op(ctx: LoweringContext, op: Operation, function: object, rule: str) -> list[Value]:
    assert isinstance(op, QLinearUnaryOp)
    (x,) = static_operands(ctx, op)
    _, x_scale, x_zero = _per_tensor(ctx, op.x, "the input")
    y_type, y_scale, y_zero = _per_tensor(ctx, op.results[0], "the output")
    table = numerics.lookup_table_onnxruntime(
        function, x_scale, x_zero, y_scale, y_zero, uniform_params(y_type).storage_dtype
    )
    return _finish(ctx, op, lookup(ctx, storage(ctx, x), table, y_type), rule)


@lowers(QLinearSigmoidOp)
def lower_qlinear_sigmoid(ctx: LoweringContext, op: Operation) -> list[Value]:
    return _table_op(ctx, op, numerics.sigmoid_float32, "lookup_table_onnxruntime of sigmoid_float32")


@lowers(QLinearLeakyReluOp)
def lower_qlinear_leaky_relu(ctx: LoweringContext, op: Operation) -> list[Value]:
    alpha = np.float32(ctx.attribute(op, "alpha", 0.01))  # type: ignore[arg-type]

    def leaky_relu(values: np.ndarray) -> np.ndarray:  # onnxruntime: x >= 0 ? x : alpha * x, in f32
        return np.where(values >= 0, values, values * alpha).astype(np.float32)

    return _table_op(ctx, op, leaky_relu, "lookup_table_onnxruntime of leaky relu")


def _axis(ctx: LoweringContext, op: Operation, default: int, rank: int) -> int:
    """`op`'s axis attribute (else `default`) made non-negative by onnx_semantics' rule."""
    try:
        return semantics.normalize_axis(int(ctx.attribute(op, "axis", default)), rank)  # type: ignore[arg-type]
    except ValueError as error:
        ctx.unsupported(str(error))


@lowers(QLinearConcatOp)
def lower_qlinear_concat(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Inputs with the output's scale and zero point are copied, the others requantized by table."""
    y_type, y_scale, y_zero = _per_tensor(ctx, op.results[0], "QLinearConcat's output")
    storage_dtype = uniform_params(y_type).storage_dtype
    parts = []
    for source, value in zip(op.operands, static_operands(ctx, op)):
        _, x_scale, x_zero = _per_tensor(ctx, source, "QLinearConcat's input")
        stored = storage(ctx, value)
        if np.float32(x_scale) == np.float32(y_scale) and x_zero == y_zero:
            parts.append(stored)
            continue
        table = numerics.lookup_table_onnxruntime(
            lambda v: v, x_scale, x_zero, y_scale, y_zero, storage_dtype
        )
        parts.append(lookup(ctx, stored, table, y_type))
    rank = len(hlo.tensor_type(parts[0]).shape)
    joined = hlo.concatenate(ctx.builder, parts, _axis(ctx, op, 0, rank))
    return _finish(ctx, op, joined, "lookup_table_onnxruntime")


# Pooling ---------------------------------------------------------------------------------------------------
@lowers(QLinearGlobalAveragePoolOp)
def lower_qlinear_global_average_pool(ctx: LoweringContext, op: Operation) -> list[Value]:
    assert isinstance(op, QLinearGlobalAveragePoolOp)
    (x,) = static_operands(ctx, op)
    _, x_scale, x_zero = _per_tensor(ctx, op.x, "the input")
    y_type, y_scale, y_zero = _per_tensor(ctx, op.results[0], "the output")
    shape = hlo.tensor_type(x).shape
    channels_last = bool(ctx.attribute(op, "channels_last", 0))
    axes = list(range(1, len(shape) - 1)) if channels_last else list(range(2, len(shape)))
    image_size = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    wide = ctx.convert(storage(ctx, x), I32)
    total = hlo.reduce(ctx.builder, wide, ctx.scalar(0, I32), axes, hlo.add)  # an integer sum: exact
    result_shape = ctx.result_type(op).shape
    total = hlo.reshape(ctx.builder, total, result_shape)
    if x_zero != 0:
        total = hlo.subtract(ctx.builder, total, ctx.splat(x_zero * image_size, I32, result_shape))
    scale = numerics.global_average_pool_scale_mlas(x_scale, y_scale, image_size)
    factor = ctx.splat(float(scale), F32, result_shape)
    return _finish(ctx, op, requantize_mlas(ctx, total, factor, y_zero, y_type), "requantize_mlas")


@lowers(QLinearAveragePoolOp)
def lower_qlinear_average_pool(ctx: LoweringContext, op: Operation) -> list[Value]:
    """numerics `average_pool_float32` (f32 sums in kernel order, zeros outside the input, one division by
    the count) then `quantize_pool_onnxruntime` (`clamp(rne(y / s + zp))`)."""
    assert isinstance(op, QLinearAveragePoolOp)
    b = ctx.builder
    (x,) = static_operands(ctx, op)
    _, x_scale, x_zero = _per_tensor(ctx, op.x, "the input")
    y_type, y_scale, y_zero = _per_tensor(ctx, op.results[0], "the output")
    channels_last = bool(ctx.attribute(op, "channels_last", 0))
    if str(ctx.attribute(op, "auto_pad", "NOTSET")) not in ("NOTSET", "VALID"):
        ctx.unsupported("QLinearAveragePool with auto_pad SAME_* (the interpreter refuses it too)")
    stored = storage(ctx, x)
    rank = len(hlo.tensor_type(stored).shape)
    if channels_last:
        stored = hlo.transpose(b, stored, [0, rank - 1, *range(1, rank - 1)])
    shape = hlo.tensor_type(stored).shape
    kernel = ctx.integer_list(op, "kernel_shape", [])
    spatial = len(kernel)
    sizes = shape[2:]
    geometry = window_of(ctx, op, sizes, kernel, ceil_mode=bool(ctx.attribute(op, "ceil_mode", 0)))
    strides, pads, out_shape = list(geometry.strides), list(geometry.pads), list(geometry.output)
    include_pad = bool(ctx.attribute(op, "count_include_pad", 0))
    # real = f32(s_x * f32(q - zp)) (one rounding, not fused into the sums), zeros around it.
    centered_values = ctx.convert(
        hlo.subtract(b, ctx.convert(stored, I32), ctx.splat(x_zero, I32, shape)), F32
    )
    real = rounded_product(ctx, centered_values, ctx.splat(float(np.float32(x_scale)), F32, shape))
    high = [
        max(0, (n - 1) * s + k - (size + p))
        for n, s, k, size, p in zip(out_shape, strides, kernel, sizes, pads)
    ]
    padded = hlo.pad(b, real, ctx.scalar(0.0, F32), [0, 0, *pads[:spatial]], [0, 0, *high])
    batch_channels = list(shape[:2])
    total = ctx.splat(0.0, F32, [*batch_channels, *out_shape])
    for offsets in itertools.product(*[range(k) for k in kernel]):
        start = [0, 0, *offsets]
        limit = [*batch_channels, *[o + (n - 1) * s + 1 for o, n, s in zip(offsets, out_shape, strides)]]
        window = hlo.slice_(b, padded, start, limit, [1, 1, *strides])
        total = hlo.add(b, total, window)
    starts = [np.arange(n) * s - p for n, s, p in zip(out_shape, strides, pads)]
    if include_pad:
        count = np.full(out_shape, np.float32(np.prod(kernel)), np.float32)
    else:
        count = np.ones((), np.int64)
        for axis, (st, k, n) in enumerate(zip(starts, kernel, sizes)):
            along_axis = np.minimum(st + k, n) - np.maximum(st, 0)
            view = [1] * spatial
            view[axis] = -1
            count = count * along_axis.reshape(view)
        count = np.broadcast_to(count, out_shape).astype(np.float32)
    counts = hlo.broadcast_in_dim(
        b, ctx.constant(count, F32), [*batch_channels, *out_shape], list(range(2, 2 + spatial))
    )
    averaged = hlo.exact_divide(b, total, counts)
    out_full = [*batch_channels, *out_shape]
    quotient = hlo.exact_divide(b, averaged, ctx.splat(float(np.float32(y_scale)), F32, out_full))
    shifted = hlo.add(b, quotient, ctx.splat(float(y_zero), F32, out_full))
    y = saturate_rounded(ctx, shifted, y_type)
    if channels_last:
        y = hlo.transpose(b, y, [0, *range(2, rank), 1])
    if tuple(hlo.tensor_type(y).shape) != tuple(ctx.result_type(op).shape):
        ctx.unsupported(f"output shape {list(hlo.tensor_type(y).shape)} != {list(ctx.result_type(op).shape)}")
    return _finish(ctx, op, y, "average_pool_float32, quantize_pool_onnxruntime")


@lowers(QLinearSoftmaxOp)
def lower_qlinear_softmax(ctx: LoweringContext, op: Operation) -> list[Value]:
    """numerics `qlinear_softmax_onnxruntime`: per row, `e = table[x - max + 255]` (numerics' table), the
    float32 row sum in order (one add per element: onnxruntime sums sequentially), then
    `min(rne(f32(e * floor(1 / s_y)) / sum) + zp, qmax)`."""
    assert isinstance(op, QLinearSoftmaxOp)
    b = ctx.builder
    (x,) = static_operands(ctx, op)
    _, x_scale, _ = _per_tensor(ctx, op.x, "QLinearSoftmax's input")
    y_type, y_scale, y_zero = _per_tensor(ctx, op.results[0], "QLinearSoftmax's output")
    shape = tuple(hlo.tensor_type(x).shape)
    rank = len(shape)
    axis = _axis(ctx, op, -1, rank)
    opset = int(ctx.attribute(op, "opset", 13))  # type: ignore[arg-type]
    table = qlinear_softmax_table_onnxruntime(x_scale, shape[axis])
    wide = ctx.convert(storage(ctx, x), I32)
    permutation = list(range(rank))
    if opset >= 13:
        permutation[axis], permutation[-1] = permutation[-1], permutation[axis]
        rows = hlo.transpose(b, wide, permutation) if axis != rank - 1 else wide
    else:
        count = int(np.prod(shape[:axis], dtype=np.int64))
        rows = hlo.reshape(b, wide, [count, int(np.prod(shape[axis:], dtype=np.int64))])
    row_shape = tuple(hlo.tensor_type(rows).shape)
    outer, last = list(row_shape[:-1]), len(row_shape) - 1
    maximum = hlo.reduce(b, rows, ctx.scalar(np.iinfo(np.int32).min, I32), [last], hlo.maximum)
    offset = hlo.subtract(
        b, ctx.splat(255, I32, row_shape), hlo.broadcast_in_dim(b, maximum, row_shape, range(last))
    )
    exponentials = gather_table(ctx, hlo.add(b, rows, offset), table, F32)
    total = ctx.splat(0.0, F32, outer)
    for column in range(row_shape[-1]):
        start, limit = [0] * len(row_shape), list(row_shape)
        start[-1], limit[-1] = column, column + 1
        element = hlo.slice_(b, exponentials, start, limit, [1] * len(row_shape))
        total = hlo.add(b, total, hlo.reshape(b, element, outer))
    factor = float(qlinear_softmax_output_factor_onnxruntime(y_scale))
    scaled = hlo.multiply(b, exponentials, ctx.splat(factor, F32, row_shape))
    ratio = hlo.exact_divide(b, scaled, hlo.broadcast_in_dim(b, total, row_shape, range(last)))
    stored = hlo.add(
        b, hlo.convert(b, hlo.round_nearest_even(b, ratio), I32), ctx.splat(y_zero, I32, row_shape)
    )
    stored = hlo.minimum(b, stored, ctx.splat(int(y_type.storage_type_max), I32, row_shape))
    result = hlo.convert(b, stored, storage_element_type(y_type))
    if opset >= 13:
        result = hlo.transpose(b, result, permutation) if axis != rank - 1 else result
    else:
        result = hlo.reshape(b, result, shape)
    return _finish(ctx, op, result, "qlinear_softmax_onnxruntime")
