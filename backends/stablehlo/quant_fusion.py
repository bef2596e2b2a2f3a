"""Opt-in fusion of arithmetic in the `quantized` form (`fuse_arithmetic=True`, CLI `--fuse-arithmetic`):
`uniform_dequantize -> dot_general / convolution [+ bias] -> quantize` and `dequantize -> add -> quantize`
become StableHLO quantized ops, as `stablehlo-legalize-qdq-to-quantized-op` would, within what the spec
and the engines' `stablehlo-legalize-quant-to-math` accept (reference §3.3, §3.4).

Contractions are built to compute what onnxruntime's integer kernels (QLinearConv, QLinearMatMul, QGemm)
compute: the quantized op's result is an i32 accumulator `!quant.uniform<i32:f32[:axis], f32(s_x * s_w)>`
(zero point 0), so quant-to-math's combined scale `s_x s_w / s_acc` is 1 within 1e-7 and the accumulation
stays exact (no float shortcut); the int32 bias is added in that domain (a quantized `add` of identical
types is an integer add), then the accumulator is requantized to the output type. quant-to-math
requantizes with `rne(clamp(f32(acc) * f32(s_acc / s_y) + zp))`, onnxruntime (numerics `requantize_mlas`)
with `clamp(rne(f32(acc) * f32(s_x s_w / s_y))) + zp`: the multipliers are the same float (s_acc is the
f32 product, and a double quotient of two floats rounded to f32 is the f32 quotient); adding the zero
point before rounding can differ on ties when zp is odd. Under `--semantics onnx` a requantize whose
zero point is not 0 is therefore written out as `requantize_mlas` (like quant.py's quantizes); under
`--semantics stablehlo` it is a `uniform_quantize`.

Convolutions run in NHWC / HWIO: quant-to-math requires a per-axis kernel quantized on its last dim and
fails on per-axis types whose axis is not the last (quant.NOTE_AXIS), so the i8 input is transposed to
NHWC, the kernel to HWIO, and the requantized i8 result back to NCHW (data movement, exact).

A pattern that does not qualify stays unfused, its float op marked `qconvert.note = "not fused: ..."`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from qconvert import numerics
from qconvert.ir.attributes import Attribute, OpaqueAttr, StringAttr
from qconvert.ir.core import Builder, GenericOp, Operation, Value
from qconvert.ir.quant_types import QuantizedType, UniformQuantizedPerAxisType, UniformQuantizedType
from qconvert.ir.types import F32, IntegerType, RankedTensorType, Type, element_type_of

from . import ops as hlo
from .lowering import LoweringContext, Semantics
from .quant import dequantized_source, quantizations

I32 = IntegerType(32)
SCALE_TOLERANCE = 1e-6
"""Relative difference allowed between the bias scale and f32(s_x * s_w) (onnxruntime's quantizer writes
the f32 product; the integer kernels add the bias without looking at its scale)."""

NCHW_CONV = "#stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>"
NHWC_CONV = "#stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>"


def _typed(b: Builder, name: str, operands: list[Value], result_type: Type, **attributes: Attribute) -> Value:
    """An op with an explicit result type (ops.py's constructors derive it, which loses quant types)."""
    return b.insert(GenericOp(name, operands, [result_type], attributes)).result


class NotFused(Exception):
    """Why a matched QDQ pattern is left unfused (written to the float op's `qconvert.note`)."""


@dataclasses.dataclass(slots=True)
class Pattern:
    """A matched `dequantize -> op [-> add bias] -> quantize` chain."""

    op: Operation
    lhs: Value
    rhs: Value
    output: Value  # the float value that is quantized (op's result, or the bias add's)
    bias: Value | None  # the quantized bias, as it is before any broadcast
    bias_dims: tuple[int, ...]  # the result dims the bias runs along (broadcast_in_dim's dimensions)
    quantized: list[Value]  # the quantized values to replace


def fuse_arithmetic_ops(block_ops: list[Operation], ctx: LoweringContext) -> int:
    """Fuse the contractions and adds of `block_ops` (see the module docstring); returns how many."""
    fused = 0
    for op in list(block_ops):
        if op.name not in ("stablehlo.dot_general", "stablehlo.convolution", "stablehlo.add"):
            continue
        if isinstance(element_type_of(op.result.type), QuantizedType) or not op.result.uses:
            continue
        try:
            if op.name == "stablehlo.add":
                fused += _fuse_add(op, ctx)
            else:
                pattern = _match_contraction(op, ctx)
                if pattern is not None:
                    _fuse_contraction(pattern, ctx)
                    fused += 1
        except NotFused as reason:
            op.attributes["qconvert.note"] = StringAttr(f"not fused: {reason}")
    return fused


# Matching ----------------------------------------------------------------------------------------------
def _match_contraction(op: Operation, ctx: LoweringContext) -> Pattern | None:
    """The QDQ chain around a dot_general / convolution, None when it is not one (float operands or an
    unquantized result); raises NotFused when it is one that cannot be fused."""
    lhs, rhs = (dequantized_source(v, ctx) for v in op.operands)
    if lhs is None or rhs is None:
        return None
    output, bias, bias_dims = op.result, None, ()
    users = [user for user, _ in op.result.uses]
    if len(users) == 1 and users[0].name == "stablehlo.add" and not quantizations(op.result, ctx):
        add = users[0]
        other = add.operands[1] if add.operands[0] is op.result else add.operands[0]
        output, (bias, bias_dims) = add.result, _bias_source(other, ctx)
        if bias is None:
            if not quantizations(output, ctx):
                return None
            raise NotFused("the value added to the result is not a dequantized int32 bias")
    quantized = [q for q in quantizations(output, ctx) if isinstance(element_type_of(q.type), QuantizedType)]
    if not quantized:
        raise NotFused("the result is not quantized directly (a float result, or scaled / added to first)")
    return Pattern(op, lhs, rhs, output, bias, bias_dims, quantized)


def _bias_source(value: Value, ctx: LoweringContext) -> tuple[Value | None, tuple[int, ...]]:
    """The quantized 1-D bias `value` is a broadcast of (or is) the dequantization of, and the result dims
    it runs along; (None, ()) when it is not one."""
    dims: tuple[int, ...] = (0,)
    producer = value.owner_op()
    if producer is not None and producer.name == "stablehlo.broadcast_in_dim":
        value = producer.operands[0]
        dims = tuple(producer.attributes["broadcast_dimensions"].values)  # type: ignore[attr-defined]
    source = dequantized_source(value, ctx)
    if source is None or len(hlo.tensor_type(source).shape) != 1:
        return None, ()
    return source, dims


def _per_tensor_signed_8bit(type_: Type, what: str) -> UniformQuantizedType:
    element = element_type_of(type_)
    if not isinstance(element, UniformQuantizedType):
        raise NotFused(f"{what} is {element}, StableHLO needs it per-tensor")
    _check_storage(element, what)
    return element


def _check_storage(element: QuantizedType, what: str) -> None:
    if not element.is_signed:
        raise NotFused(f"{what} has unsigned storage, which quant-to-math reads as signed")
    if element.storage_type != IntegerType(8) or element.expressed_type != F32:
        raise NotFused(f"{what} is {element}; fused contractions take i8 storage, f32 expressed")


def _weight_scales(element: QuantizedType, axis_wanted: int, what: str) -> tuple[np.ndarray, bool]:
    """The weight's scales (float64 values of f32 numbers) and whether it is per-axis; checks zp == 0
    and that a per-axis weight is quantized on `axis_wanted`."""
    _check_storage(element, what)
    if isinstance(element, UniformQuantizedType):
        if element.zero_point != 0:
            raise NotFused(f"{what} has zero point {element.zero_point}; StableHLO needs 0")
        return np.asarray([element.scale], np.float64), False
    if not isinstance(element, UniformQuantizedPerAxisType):
        raise NotFused(f"{what} is {element}")
    if any(zp != 0 for zp in element.zero_points):
        raise NotFused(f"{what} has non-zero zero points; StableHLO needs 0")
    if element.quantized_dimension != axis_wanted:
        raise NotFused(
            f"{what} is quantized on axis {element.quantized_dimension}, not on the output feature "
            f"axis {axis_wanted}"
        )
    return np.asarray(element.scales, np.float64), True


def _accumulator_type(
    lhs: UniformQuantizedType,
    weight_scales: np.ndarray,
    per_axis: bool,
    axis: int,
    features: int,
    bias: Value | None,
) -> QuantizedType:
    """`i32:f32[:axis]` with scales f32(s_x * s_w) (what onnxruntime multiplies in f32), zero point 0.
    A bias must be `features` int32 values with zero point 0 and those scales (within SCALE_TOLERANCE)."""
    scales = numerics.accumulator_scale_onnxruntime(lhs.scale, weight_scales).astype(np.float64)
    if bias is not None:
        bias_type = element_type_of(bias.type)
        if hlo.tensor_type(bias).shape != (features,):
            raise NotFused(f"the bias has shape {list(hlo.tensor_type(bias).shape)}, not [{features}]")
        if not isinstance(bias_type, QuantizedType) or bias_type.storage_type != I32:
            raise NotFused(f"the bias is {bias_type}, not int32")
        if isinstance(bias_type, UniformQuantizedPerAxisType):
            bias_scales, bias_zps = np.asarray(bias_type.scales), np.asarray(bias_type.zero_points)
        elif isinstance(bias_type, UniformQuantizedType):
            bias_scales, bias_zps = np.asarray([bias_type.scale]), np.asarray([bias_type.zero_point])
        else:
            raise NotFused(f"the bias is {bias_type}")
        if np.any(bias_zps != 0):
            raise NotFused("the bias has a non-zero zero point")
        if not np.allclose(bias_scales, scales, rtol=SCALE_TOLERANCE, atol=0):
            raise NotFused("the bias scale is not s_input * s_weight")
    common = {"storage_type": I32, "expressed_type": F32, "is_signed": True}
    if per_axis:
        return UniformQuantizedPerAxisType(
            **common,
            scales=tuple(float(s) for s in scales),
            zero_points=(0,) * scales.size,
            quantized_dimension=axis,
        )  # type: ignore[arg-type]
    return UniformQuantizedType(**common, scale=float(scales[0]), zero_point=0)  # type: ignore[arg-type]


def _output_type(pattern: Pattern) -> UniformQuantizedType:
    types = {element_type_of(q.type) for q in pattern.quantized}
    if len(types) != 1:
        raise NotFused("the result is quantized to more than one type")
    return _per_tensor_signed_8bit(pattern.quantized[0].type, "the result")


# Emission ------------------------------------------------------------------------------------------------
def _with_axis(element: QuantizedType, axis: int) -> QuantizedType:
    if isinstance(element, UniformQuantizedPerAxisType):
        return dataclasses.replace(element, quantized_dimension=axis)
    return element


def _transpose(b: Builder, value: Value, permutation: list[int]) -> Value:
    """A transpose that moves a per-axis type's axis with its dim."""
    element = element_type_of(value.type)
    if isinstance(element, UniformQuantizedPerAxisType):
        element = _with_axis(element, permutation.index(element.quantized_dimension))
    shape = hlo.tensor_type(value).shape
    result_type = RankedTensorType(tuple(shape[p] for p in permutation), element)
    return _typed(b, "stablehlo.transpose", [value], result_type, permutation=hlo.i64_array(permutation))


def _reinterpret(b: Builder, value: Value, element: Type) -> Value:
    """`value`'s storage bits under another element type (quantized -> storage -> quantized)."""
    source = element_type_of(value.type)
    shape = hlo.tensor_type(value).shape
    if isinstance(source, QuantizedType):
        value = hlo.bitcast_convert(b, value, RankedTensorType(shape, source.storage_type))
    if element_type_of(value.type) == element:
        return value
    return hlo.bitcast_convert(b, value, RankedTensorType(shape, element))


def _add_bias(b: Builder, acc: Value, bias: Value, axis: int) -> Value:
    """acc + bias (1-D along `axis`), the bias reinterpreted as the accumulator's type: an exact i32 add."""
    acc_type = element_type_of(acc.type)
    assert isinstance(acc_type, QuantizedType)
    bias_value = _reinterpret(b, bias, _with_axis(acc_type, 0))
    broadcast = _typed(
        b,
        "stablehlo.broadcast_in_dim",
        [bias_value],
        RankedTensorType(hlo.tensor_type(acc).shape, acc_type),
        broadcast_dimensions=hlo.i64_array([axis]),
    )
    return hlo.add(b, acc, broadcast)


def requantize(
    ctx: LoweringContext, b: Builder, acc: Value, output: UniformQuantizedType, result_shape: tuple[int, ...]
) -> Value:
    """The accumulator requantized to `output`: uniform_quantize, or (`--semantics onnx` and zp != 0)
    numerics' `requantize_mlas` written out: `clamp(rne(f32(acc) * m), qmin - zp, qmax - zp) + zp`."""
    result_type = RankedTensorType(result_shape, output)
    if ctx.semantics is Semantics.STABLEHLO or output.zero_point == 0:
        return hlo.uniform_quantize(b, acc, result_type)
    acc_type = element_type_of(acc.type)
    assert isinstance(acc_type, QuantizedType)
    if isinstance(acc_type, UniformQuantizedPerAxisType):
        acc_scales, axis = np.asarray(acc_type.scales, np.float64), [acc_type.quantized_dimension]
    else:
        acc_scales, axis = np.asarray([acc_type.scale], np.float64), None  # type: ignore[attr-defined]
    multiplier = numerics.requantize_multiplier_onnxruntime(acc_scales, output.scale)
    saved = ctx.builder
    ctx.builder = b
    try:
        integers = _reinterpret(b, acc, I32)
        values = hlo.convert(b, integers, F32)
        if axis is None:
            factor = hlo.broadcast_in_dim(b, ctx.scalar(float(multiplier[0]), F32), result_shape, [])
        else:
            factor = hlo.broadcast_in_dim(b, ctx.constant(multiplier, F32), result_shape, axis)
        product = hlo.multiply(b, values, factor)
        zp = output.zero_point
        low = ctx.scalar(float(output.storage_type_min - zp), F32)
        high = ctx.scalar(float(output.storage_type_max - zp), F32)
        rounded = hlo.round_nearest_even(b, hlo.clamp(b, low, product, high))
        shifted = hlo.add(b, hlo.convert(b, rounded, I32), ctx.splat(zp, I32, result_shape))
        storage = hlo.convert(b, shifted, output.storage_type)
        quantized = hlo.bitcast_convert(b, storage, result_type)
    finally:
        ctx.builder = saved
    ctx.note(
        quantized,
        "requantize written out as onnxruntime's MlasRequantizeOutput (zero point added after rounding)",
    )
    return quantized


def _fuse_contraction(pattern: Pattern, ctx: LoweringContext) -> None:
    op = pattern.op
    lhs_type = _per_tensor_signed_8bit(pattern.lhs.type, "the input (lhs)")
    output_type = _output_type(pattern)
    rhs_type = element_type_of(pattern.rhs.type)
    assert isinstance(rhs_type, QuantizedType)
    b = Builder.before(pattern.quantized[0].owner_op() or op)
    if op.name == "stablehlo.dot_general":
        replacement = _fuse_dot(pattern, ctx, b, lhs_type, rhs_type, output_type)
    else:
        replacement = _fuse_convolution(pattern, ctx, b, lhs_type, rhs_type, output_type)
    for quantized in pattern.quantized:
        quantized.replace_all_uses_with(replacement)


def _dot_numbers(op: Operation) -> dict[str, list[int]]:
    text = op.attributes["dot_dimension_numbers"].text  # type: ignore[attr-defined]
    numbers: dict[str, list[int]] = {}
    for name in ("lhs_batching", "rhs_batching", "lhs_contracting", "rhs_contracting"):
        start = text.find(f"{name}_dimensions = [")
        if start < 0:
            numbers[name] = []
            continue
        body = text[text.index("[", start) + 1 : text.index("]", start)]
        numbers[name] = [int(v) for v in body.split(",") if v.strip()]
    return numbers


def _fuse_dot(
    pattern: Pattern,
    ctx: LoweringContext,
    b: Builder,
    lhs_type: UniformQuantizedType,
    rhs_type: QuantizedType,
    output_type: UniformQuantizedType,
) -> Value:
    op = pattern.op
    numbers = _dot_numbers(op)
    rhs_rank = len(hlo.tensor_type(pattern.rhs).shape)
    rhs_free = [d for d in range(rhs_rank) if d not in numbers["rhs_batching"] + numbers["rhs_contracting"]]
    result_shape = hlo.tensor_type(op.result).shape
    # quant-to-math broadcasts per-axis parameters correctly only on the last dim (quant.NOTE_AXIS).
    if len(rhs_free) != 1 and isinstance(rhs_type, UniformQuantizedPerAxisType):
        raise NotFused("a per-axis rhs needs exactly one free dim, the output features")
    scales, per_axis = _weight_scales(rhs_type, rhs_free[0] if rhs_free else -1, "the rhs")
    axis = len(result_shape) - 1
    if pattern.bias is not None and pattern.bias_dims != (axis,):
        raise NotFused("the bias does not run along the output features")
    acc_element = _accumulator_type(lhs_type, scales, per_axis, axis, result_shape[axis], pattern.bias)
    acc = _typed(
        b,
        "stablehlo.dot_general",
        [pattern.lhs, pattern.rhs],
        RankedTensorType(result_shape, acc_element),
        dot_dimension_numbers=op.attributes["dot_dimension_numbers"],
    )
    if pattern.bias is not None:
        acc = _add_bias(b, acc, pattern.bias, axis)
    return requantize(ctx, b, acc, output_type, result_shape)


def _fuse_convolution(
    pattern: Pattern,
    ctx: LoweringContext,
    b: Builder,
    lhs_type: UniformQuantizedType,
    rhs_type: QuantizedType,
    output_type: UniformQuantizedType,
) -> Value:
    op = pattern.op
    attributes = op.attributes
    rank = len(hlo.tensor_type(pattern.lhs).shape)
    if rank != 4:
        raise NotFused("only 2-D convolutions are fused")
    lhs_dilation = list(attributes["lhs_dilation"].values)  # type: ignore[attr-defined]
    if any(d != 1 for d in lhs_dilation):
        raise NotFused("quant-to-math needs lhs_dilation 1 (a transposed convolution)")
    if attributes["dimension_numbers"].text != NCHW_CONV:  # type: ignore[attr-defined]
        raise NotFused("not an NCHW / OIHW convolution")
    scales, per_axis = _weight_scales(rhs_type, 0, "the kernel (rhs)")
    if pattern.bias is not None and pattern.bias_dims != (1,):
        raise NotFused("the bias does not run along the output channels")
    nchw_shape = hlo.tensor_type(op.result).shape
    nhwc_shape = (nchw_shape[0], nchw_shape[2], nchw_shape[3], nchw_shape[1])
    acc_element = _accumulator_type(lhs_type, scales, per_axis, 3, nhwc_shape[3], pattern.bias)
    lhs = _transpose(b, pattern.lhs, [0, 2, 3, 1])
    kernel = _transpose(b, pattern.rhs, [2, 3, 1, 0])
    new_attributes = dict(attributes)
    new_attributes["dimension_numbers"] = OpaqueAttr(NHWC_CONV)
    new_attributes.pop("qconvert.note", None)
    acc = b.insert(
        GenericOp(
            "stablehlo.convolution",
            [lhs, kernel],
            [RankedTensorType(nhwc_shape, acc_element)],
            new_attributes,
        )
    ).result
    if pattern.bias is not None:
        acc = _add_bias(b, acc, pattern.bias, 3)
    quantized = requantize(ctx, b, acc, output_type, nhwc_shape)
    return _transpose(b, quantized, [0, 3, 1, 2])


# Add ---------------------------------------------------------------------------------------------------
ADD_FRACTION_BITS = 15
"""The add's i32 accumulator scale is max(s_a, s_b) / 2**15: both operands requantize into it within half
a unit (2**-15 of the coarser input step), so the sum is the float sum to that precision and the single
requantize to the output rounds as the float path's QuantizeLinear does except within ~2**-15 output
steps of a tie. (Adding in the output type, quant-to-math rounds each operand to the output scale first:
two roundings, 1 step off in about a quarter of the elements, measured.) |q - zp| <= 255 keeps the
requantized operands below 2**24, exact in f32."""


def _fuse_add(op: Operation, ctx: LoweringContext) -> int:
    """dequantize(a) + dequantize(b) -> quantize: each operand requantized (uniform_quantize) to the i32
    accumulator type, a quantized i32 `add` (exact), then one requantize to the output type. A broadcast
    operand is broadcast as quantized values."""
    sources: list[tuple[Value, Operation | None]] = []
    for operand in op.operands:
        source, broadcast = dequantized_source(operand, ctx), None
        producer = operand.owner_op()
        if source is None and producer is not None and producer.name == "stablehlo.broadcast_in_dim":
            source, broadcast = dequantized_source(producer.operands[0], ctx), producer
        if source is None:
            return 0
        sources.append((source, broadcast))
    quantized = [
        q for q in quantizations(op.result, ctx) if isinstance(element_type_of(q.type), QuantizedType)
    ]
    if not quantized:
        return 0
    if len({element_type_of(q.type) for q in quantized}) != 1:
        raise NotFused("the result is quantized to more than one type")
    output_type = _per_tensor_signed_8bit(quantized[0].type, "the result")
    input_types = [_per_tensor_signed_8bit(source.type, "an operand") for source, _ in sources]
    scale = max(t.scale for t in input_types) * 2.0**-ADD_FRACTION_BITS
    acc_type = UniformQuantizedType(
        storage_type=I32, expressed_type=F32, is_signed=True, scale=scale, zero_point=0
    )  # type: ignore[call-arg]
    shape = hlo.tensor_type(op.result).shape
    b = Builder.before(quantized[0].owner_op() or op)
    operands = []
    for source, broadcast in sources:
        source_shape = hlo.tensor_type(source).shape
        widened = hlo.uniform_quantize(b, source, RankedTensorType(source_shape, acc_type))
        if broadcast is not None:
            widened = _typed(
                b,
                "stablehlo.broadcast_in_dim",
                [widened],
                RankedTensorType(shape, acc_type),
                broadcast_dimensions=broadcast.attributes["broadcast_dimensions"],
            )
        operands.append(widened)
    total = _typed(b, "stablehlo.add", operands, RankedTensorType(shape, acc_type))
    replacement = requantize(ctx, b, total, output_type, shape)
    for value in quantized:
        value.replace_all_uses_with(replacement)
    return 1
