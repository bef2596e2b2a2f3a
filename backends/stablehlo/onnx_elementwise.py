"""Lowerings of ONNX elementwise ops (float semantics; quant casts are lower_quant.py's).

Binary ops broadcast by numpy's rules (`ctx.broadcast_operands`). Where onnxruntime computes a special
case its own way, we follow it: Pow with exponent 2 or 3 is a product, as in onnxruntime's Pow kernel.
Tanh and Sigmoid of f32 are MLAS's polynomials as onnxruntime's x86-64 kernels compute them, bit for
bit (onnx_recurrent.HloMath); other transcendental functions (Exp, Erf, and Gelu through erf/tanh) are
the engine's approximations, as onnxruntime's are MLAS's or Eigen's: they can differ by a few ulp.
"""

from __future__ import annotations

import math

import numpy as np

from qconvert.ir.core import GenericOp, Operation, Value
from qconvert.ir.dialects.onnx import ELEMENT_TYPES_BY_NAME, OnnxElement
from qconvert.ir.types import F32, I1, IntegerType, Signedness, Type, element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import constant_input, lowers_folding
from .onnx_recurrent import HloMath

# The ONNX element types Cast / CastLike / EyeLike lower to (numeric, no float8, no sub-byte integers).
CAST_TARGETS = ("float", "uint8", "int8", "uint16", "int16", "int32", "int64", "bool", "float16", "double")
CAST_TARGETS += ("uint32", "uint64", "bfloat16")


def stablehlo_element(entry: OnnxElement) -> Type:
    """An ONNX element type's StableHLO element type: the IR's, with unsigned integers as `ui*`."""
    if entry.is_unsigned_integer and isinstance(entry.ir_type, IntegerType):
        return IntegerType(entry.ir_type.width, Signedness.UNSIGNED)
    return entry.ir_type


# ONNX TensorProto data types -> StableHLO element types, for Cast's `to`.
ONNX_ELEMENT_TYPES: dict[int, Type] = {
    entry.onnx_type: stablehlo_element(entry)
    for entry in (ELEMENT_TYPES_BY_NAME[name] for name in CAST_TARGETS)
}


def chlo_unary(ctx: LoweringContext, name: str, operand: Value) -> Value:
    """A `chlo.*` elementwise op (erf has no StableHLO op; XLA and the runner's interpreter path legalize
    chlo to StableHLO)."""
    return ctx.builder.insert(GenericOp(name, [operand], [operand.type], {})).result


def _binary(ctx: LoweringContext, op: Operation) -> tuple[Value, Value]:
    lhs, rhs = ctx.broadcast_operands(ctx.operands(op))
    return lhs, rhs


def zero_like(ctx: LoweringContext, value: Value) -> Value:
    return ctx.splat(0, element_type_of(value.type), hlo.tensor_type(value).shape)


@lowers_folding("onnx.Add", "onnx.Sub", "onnx.Mul", "onnx.Div")
def lower_arithmetic(ctx: LoweringContext, op: Operation) -> list[Value]:
    lhs, rhs = _binary(ctx, op)
    if op.name == "onnx.Div":
        return [hlo.exact_divide(ctx.builder, lhs, rhs)]
    build = {"onnx.Add": hlo.add, "onnx.Sub": hlo.subtract, "onnx.Mul": hlo.multiply}
    return [build[op.name](ctx.builder, lhs, rhs)]


@lowers_folding("onnx.Pow")
def lower_pow(ctx: LoweringContext, op: Operation) -> list[Value]:
    base, exponent = ctx.operands(op)
    element = element_type_of(base.type)
    constant = constant_input(ctx, op, 1)
    if constant is not None and constant.size == 1 and float(constant.reshape(())) in (1.0, 2.0, 3.0):
        # onnxruntime's Pow multiplies for these exponents (std::pow would agree only up to an ulp).
        power = int(float(constant.reshape(())))
        shape = np.broadcast_shapes(hlo.tensor_type(base).shape, constant.shape)
        (base,) = ctx.broadcast_operands([base], shape)
        result = base
        for _ in range(power - 1):
            result = hlo.multiply(ctx.builder, result, base)
        return [result]
    exponent = ctx.convert(exponent, element)
    base, exponent = ctx.broadcast_operands([base, exponent])
    return [hlo.power(ctx.builder, base, exponent)]


@lowers_folding("onnx.Relu")
def lower_relu(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    return [hlo.maximum(ctx.builder, x, zero_like(ctx, x))]


@lowers_folding("onnx.LeakyRelu")
def lower_leaky_relu(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    element, shape = element_type_of(x.type), hlo.tensor_type(x).shape
    alpha = ctx.splat(float(ctx.attribute(op, "alpha", 0.01)), element, shape)  # type: ignore[arg-type]
    # onnxruntime: x >= 0 ? x : alpha * x
    non_negative = hlo.compare(ctx.builder, "GE", x, zero_like(ctx, x))
    return [hlo.select(ctx.builder, non_negative, x, hlo.multiply(ctx.builder, x, alpha))]


@lowers_folding("onnx.Clip")
def lower_clip(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    element, shape = element_type_of(x.type), hlo.tensor_type(x).shape
    low, high = ctx.input(op, 1), ctx.input(op, 2)
    if "min" in op.attributes:  # opset < 11
        low = ctx.scalar(float(ctx.attribute(op, "min")), element)  # type: ignore[arg-type]
    if "max" in op.attributes:
        high = ctx.scalar(float(ctx.attribute(op, "max")), element)  # type: ignore[arg-type]
    result = x
    # onnxruntime: min(max(x, low), high), so low > high gives high.
    if low is not None:
        result = hlo.maximum(ctx.builder, result, ctx.broadcast_to(low, shape))
    if high is not None:
        result = hlo.minimum(ctx.builder, result, ctx.broadcast_to(high, shape))
    return [result]


@lowers_folding("onnx.Sigmoid")
def lower_sigmoid(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    if element_type_of(x.type) == F32:  # onnxruntime's MLAS polynomial, bit for bit (onnx_recurrent)
        return [HloMath(ctx, mlas_activations=True).sigmoid(x)]
    return [hlo.logistic(ctx.builder, x)]


@lowers_folding("onnx.Tanh")
def lower_tanh(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    if element_type_of(x.type) == F32:
        return [HloMath(ctx, mlas_activations=True).tanh(x)]
    return [hlo.tanh(ctx.builder, x)]


@lowers_folding("onnx.Erf")
def lower_erf(ctx: LoweringContext, op: Operation) -> list[Value]:
    return [chlo_unary(ctx, "chlo.erf", ctx.operands(op)[0])]


@lowers_folding("onnx.Sqrt")
def lower_sqrt(ctx: LoweringContext, op: Operation) -> list[Value]:
    return [hlo.sqrt(ctx.builder, ctx.operands(op)[0])]


@lowers_folding("onnx.Exp")
def lower_exp(ctx: LoweringContext, op: Operation) -> list[Value]:
    return [hlo.exponential(ctx.builder, ctx.operands(op)[0])]


@lowers_folding("onnx.Neg")
def lower_neg(ctx: LoweringContext, op: Operation) -> list[Value]:
    return [hlo.negate(ctx.builder, ctx.operands(op)[0])]


@lowers_folding("onnx.Abs")
def lower_abs(ctx: LoweringContext, op: Operation) -> list[Value]:
    return [hlo.abs_(ctx.builder, ctx.operands(op)[0])]


@lowers_folding("onnx.Min", "onnx.Max")
def lower_min_max(ctx: LoweringContext, op: Operation) -> list[Value]:
    build = hlo.minimum if op.name == "onnx.Min" else hlo.maximum
    values = ctx.broadcast_operands(ctx.operands(op))
    result = values[0]
    for value in values[1:]:
        result = build(ctx.builder, result, value)
    return [result]


@lowers_folding("onnx.Gelu")
def lower_gelu(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    element, shape = element_type_of(x.type), hlo.tensor_type(x).shape
    b = ctx.builder

    def splat(value: float) -> Value:
        return ctx.splat(value, element, shape)

    approximate = str(ctx.attribute(op, "approximate", "none"))
    if approximate == "none":
        # onnxruntime: 0.5 * x * (1 + erf(x * M_SQRT1_2))
        inner = chlo_unary(ctx, "chlo.erf", hlo.multiply(b, x, splat(math.sqrt(0.5))))
    elif approximate == "tanh":
        # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
        cube = hlo.multiply(b, hlo.multiply(b, x, x), x)
        sum_ = hlo.add(b, x, hlo.multiply(b, splat(0.044715), cube))
        inner = hlo.tanh(b, hlo.multiply(b, splat(math.sqrt(2.0 / math.pi)), sum_))
    else:
        ctx.unsupported(f"Gelu approximate={approximate!r} (expected 'none' or 'tanh')")
    half_x = hlo.multiply(b, splat(0.5), x)
    return [hlo.multiply(b, half_x, hlo.add(b, splat(1.0), inner))]


@lowers_folding("onnx.Identity")
def lower_identity(ctx: LoweringContext, op: Operation) -> list[Value]:
    return [ctx.operands(op)[0]]


@lowers_folding("onnx.Dropout")
def lower_dropout(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Inference: the output is the input; the optional mask is all true (training_mode must be off)."""
    training = constant_input(ctx, op, 2)
    if ctx.source_input(op, 2) is not None and (training is None or bool(training.reshape(()))):
        ctx.unsupported("Dropout in training mode (only inference is supported)")
    x = ctx.input(op, 0)
    assert x is not None
    results = [x]
    if len(op.results) > 1:
        results.append(ctx.splat(True, I1, hlo.tensor_type(x).shape))
    return results


@lowers_folding("onnx.Equal")
def lower_equal(ctx: LoweringContext, op: Operation) -> list[Value]:
    lhs, rhs = _binary(ctx, op)
    return [hlo.compare(ctx.builder, "EQ", lhs, rhs)]


@lowers_folding("onnx.Where")
def lower_where(ctx: LoweringContext, op: Operation) -> list[Value]:
    condition, on_true, on_false = ctx.broadcast_operands(ctx.operands(op))
    return [hlo.select(ctx.builder, condition, on_true, on_false)]


@lowers_folding("onnx.Cast")
def lower_cast(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    to = int(ctx.attribute(op, "to", 1))  # type: ignore[arg-type]
    target = ONNX_ELEMENT_TYPES.get(to)
    if target is None:
        ctx.unsupported(f"Cast to ONNX type {to} (StableHLO lowering covers numeric types without float8)")
    # stablehlo.convert truncates float -> int toward zero, as onnxruntime's static_cast does (out-of-range
    # values are undefined in both); unsigned targets stay `ui*`, which the driver accepts for signless.
    return [ctx.convert(x, target)]
