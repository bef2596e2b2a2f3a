"""Lowerings of ONNX elementwise math and activations beyond onnx_elementwise.py: Log, Reciprocal,
Floor, Ceil, Round, Sign, Sin, Cos, Tan, Atan, Asin, Acos, Sinh, Cosh, Asinh, Acosh, Atanh, Softplus,
Softsign, Elu, Selu, Celu, ThresholdedRelu, PRelu, Mish, HardSigmoid, HardSwish, Shrink, Mod, Sum, Mean.

Each formula is onnxruntime's CPU kernel's (its Eigen functor or the ONNX function body it runs), in
the same order of operations, so single IEEE operations (Floor, Ceil, Round, Sign, Reciprocal, PRelu,
Shrink, ThresholdedRelu, Mod, Sum, Mean, Softsign, HardSigmoid, HardSwish) match bit for bit: a product
that feeds an add goes through `rounded_product`, since XLA:CPU would otherwise contract the two into
one fused multiply-add where onnxruntime rounds twice. Formulas with a transcendental function (Log,
trigonometric and hyperbolic functions, Softplus, Elu, Selu, Celu, Mish) differ by the engine's
approximation of it (a few ulp, or an absolute error near zero where they cancel).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qconvert.ir.core import GenericOp, Operation, Value
from qconvert.ir.types import FloatType, IntegerType, element_type_of

from . import ops as hlo
from .float32_rounding import rounded_product
from .lowering import LoweringContext
from .onnx_elementwise import chlo_unary
from .onnx_fold import lowers_folding


def _float_input(ctx: LoweringContext, op: Operation) -> Value:
    x = ctx.input(op, 0)
    assert x is not None
    if not isinstance(element_type_of(x.type), FloatType):
        ctx.unsupported(f"{op.name} of {element_type_of(x.type)} (lowered for float types)")
    return x


def _splat_like(ctx: LoweringContext, value: float, like: Value) -> Value:
    return ctx.splat(value, element_type_of(like.type), hlo.tensor_type(like).shape)


def _float_attribute(ctx: LoweringContext, op: Operation, name: str, default: float) -> float:
    return float(ctx.attribute(op, name, default))  # type: ignore[arg-type]


UNARY: dict[str, Callable] = {
    "onnx.Log": hlo.log,
    "onnx.Floor": hlo.floor,
    "onnx.Ceil": hlo.ceil,
    "onnx.Round": hlo.round_nearest_even,  # ONNX Round: halves to even
    "onnx.Sin": hlo.sine,
    "onnx.Cos": hlo.cosine,
}


@lowers_folding(*UNARY)
def lower_unary(ctx: LoweringContext, op: Operation) -> list[Value]:
    return [UNARY[op.name](ctx.builder, _float_input(ctx, op))]


CHLO_UNARY = {
    "onnx.Tan": "chlo.tan",
    "onnx.Asin": "chlo.asin",
    "onnx.Acos": "chlo.acos",
    "onnx.Sinh": "chlo.sinh",
    "onnx.Cosh": "chlo.cosh",
    "onnx.Asinh": "chlo.asinh",
    "onnx.Acosh": "chlo.acosh",
    "onnx.Atanh": "chlo.atanh",
}


@lowers_folding("onnx.Atan", *CHLO_UNARY)
def lower_chlo_unary(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Functions with no StableHLO op of their own: their chlo op, and Atan as atan2(x, 1)."""
    x = _float_input(ctx, op)
    if op.name == "onnx.Atan":
        return [hlo.atan2(ctx.builder, x, _splat_like(ctx, 1.0, x))]
    return [chlo_unary(ctx, CHLO_UNARY[op.name], x)]


@lowers_folding("onnx.Sign")
def lower_sign(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    element = element_type_of(x.type)
    if isinstance(element, IntegerType) and element.is_unsigned:
        # stablehlo.sign is for signed types: an unsigned sign is x != 0.
        zero = _splat_like(ctx, 0, x)
        nonzero = hlo.compare(ctx.builder, "NE", x, zero)
        return [hlo.select(ctx.builder, nonzero, _splat_like(ctx, 1, x), zero)]
    return [hlo.sign(ctx.builder, x)]


@lowers_folding("onnx.Reciprocal")
def lower_reciprocal(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = _float_input(ctx, op)
    return [hlo.exact_divide(ctx.builder, _splat_like(ctx, 1.0, x), x)]


def _log_plus_one(ctx: LoweringContext, x: Value) -> Value:
    """`stablehlo.log_plus_one` (log1p, not among ops.py's constructors)."""
    return ctx.builder.insert(GenericOp("stablehlo.log_plus_one", [x], [x.type], {})).result


def softplus(ctx: LoweringContext, x: Value) -> Value:
    """onnxruntime's Softplus: x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)) (no overflow for large x)."""
    b = ctx.builder
    positive = hlo.compare(b, "GT", x, _splat_like(ctx, 0.0, x))
    magnitude = hlo.negate(b, hlo.abs_(b, x))  # -|x|: exp of it never overflows
    tail = _log_plus_one(ctx, hlo.exponential(b, magnitude))
    return hlo.select(b, positive, hlo.add(b, x, tail), tail)


@lowers_folding("onnx.Softplus")
def lower_softplus(ctx: LoweringContext, op: Operation) -> list[Value]:
    return [softplus(ctx, _float_input(ctx, op))]


@lowers_folding("onnx.Softsign")
def lower_softsign(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = _float_input(ctx, op)
    b = ctx.builder
    # onnxruntime: x * (1 / (1 + |x|)), two roundings (a single division differs by an ulp).
    denominator = hlo.add(b, _splat_like(ctx, 1.0, x), hlo.abs_(b, x))
    return [hlo.multiply(b, x, hlo.exact_divide(b, _splat_like(ctx, 1.0, x), denominator))]


@lowers_folding("onnx.Mish")
def lower_mish(ctx: LoweringContext, op: Operation) -> list[Value]:
    """x * tanh(softplus(x)) (ONNX's function body, which onnxruntime runs)."""
    x = _float_input(ctx, op)
    return [hlo.multiply(ctx.builder, x, hlo.tanh(ctx.builder, softplus(ctx, x)))]


def _exp_minus_one(ctx: LoweringContext, x: Value) -> Value:
    """exp(x) - 1 as onnxruntime's Eigen functors write it (not expm1)."""
    return hlo.subtract(ctx.builder, hlo.exponential(ctx.builder, x), _splat_like(ctx, 1.0, x))


@lowers_folding("onnx.Elu")
def lower_elu(ctx: LoweringContext, op: Operation) -> list[Value]:
    """x >= 0 ? x : alpha * (exp(x) - 1)."""
    x = _float_input(ctx, op)
    b = ctx.builder
    alpha = _splat_like(ctx, _float_attribute(ctx, op, "alpha", 1.0), x)
    non_negative = hlo.compare(b, "GE", x, _splat_like(ctx, 0.0, x))
    return [hlo.select(b, non_negative, x, hlo.multiply(b, alpha, _exp_minus_one(ctx, x)))]


@lowers_folding("onnx.Selu")
def lower_selu(ctx: LoweringContext, op: Operation) -> list[Value]:
    """x <= 0 ? gamma * (alpha * exp(x) - alpha) : gamma * x (onnxruntime's Selu functor)."""
    x = _float_input(ctx, op)
    b = ctx.builder
    alpha = _splat_like(ctx, _float_attribute(ctx, op, "alpha", 1.67326319217681884765625), x)
    gamma = _splat_like(ctx, _float_attribute(ctx, op, "gamma", 1.05070102214813232421875), x)
    non_positive = hlo.compare(b, "LE", x, _splat_like(ctx, 0.0, x))
    negative_branch = hlo.subtract(b, rounded_product(ctx, alpha, hlo.exponential(b, x)), alpha)
    return [hlo.multiply(b, gamma, hlo.select(b, non_positive, negative_branch, x))]


@lowers_folding("onnx.Celu")
def lower_celu(ctx: LoweringContext, op: Operation) -> list[Value]:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)) (ONNX's function body)."""
    x = _float_input(ctx, op)
    b = ctx.builder
    alpha = _splat_like(ctx, _float_attribute(ctx, op, "alpha", 1.0), x)
    zero = _splat_like(ctx, 0.0, x)
    scaled = _exp_minus_one(ctx, hlo.exact_divide(b, x, alpha))
    negative_part = hlo.minimum(b, zero, hlo.multiply(b, alpha, scaled))
    return [hlo.add(b, hlo.maximum(b, zero, x), negative_part)]


@lowers_folding("onnx.ThresholdedRelu")
def lower_thresholded_relu(ctx: LoweringContext, op: Operation) -> list[Value]:
    """x > alpha ? x : 0."""
    x = _float_input(ctx, op)
    alpha = _splat_like(ctx, _float_attribute(ctx, op, "alpha", 1.0), x)
    above = hlo.compare(ctx.builder, "GT", x, alpha)
    return [hlo.select(ctx.builder, above, x, _splat_like(ctx, 0.0, x))]


@lowers_folding("onnx.PRelu")
def lower_prelu(ctx: LoweringContext, op: Operation) -> list[Value]:
    """x > 0 ? x : slope * x, slope broadcast to x (unidirectionally)."""
    x, slope = ctx.operands(op)
    b = ctx.builder
    slope = ctx.broadcast_to(slope, hlo.tensor_type(x).shape)
    positive = hlo.compare(b, "GT", x, _splat_like(ctx, 0, x))
    return [hlo.select(b, positive, x, hlo.multiply(b, x, slope))]


def hard_sigmoid(ctx: LoweringContext, x: Value, alpha: float, beta: float) -> Value:
    """max(0, min(1, alpha * x + beta)), onnxruntime's order, rounded twice (no fused multiply-add)."""
    b = ctx.builder
    linear = hlo.add(b, rounded_product(ctx, _splat_like(ctx, alpha, x), x), _splat_like(ctx, beta, x))
    return hlo.maximum(b, hlo.minimum(b, linear, _splat_like(ctx, 1.0, x)), _splat_like(ctx, 0.0, x))


@lowers_folding("onnx.HardSigmoid")
def lower_hard_sigmoid(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = _float_input(ctx, op)
    alpha = _float_attribute(ctx, op, "alpha", 0.2)
    beta = _float_attribute(ctx, op, "beta", 0.5)
    return [hard_sigmoid(ctx, x, alpha, beta)]


@lowers_folding("onnx.HardSwish")
def lower_hard_swish(ctx: LoweringContext, op: Operation) -> list[Value]:
    """x * HardSigmoid(x) with alpha = 1/6 (as float32) and beta = 0.5: ONNX's function body."""
    x = _float_input(ctx, op)
    return [hlo.multiply(ctx.builder, x, hard_sigmoid(ctx, x, 1.0 / 6.0, 0.5))]


@lowers_folding("onnx.Shrink")
def lower_shrink(ctx: LoweringContext, op: Operation) -> list[Value]:
    """x < -lambd ? x + bias : x > lambd ? x - bias : 0."""
    x = ctx.input(op, 0)
    assert x is not None
    b = ctx.builder
    lambd = _float_attribute(ctx, op, "lambd", 0.5)
    bias = _float_attribute(ctx, op, "bias", 0.0)
    if isinstance(element_type_of(x.type), IntegerType) and (lambd != int(lambd) or bias != int(bias)):
        ctx.unsupported("Shrink of an integer tensor with fractional lambd or bias")
    below = hlo.compare(b, "LT", x, _splat_like(ctx, -lambd, x))
    above = hlo.compare(b, "GT", x, _splat_like(ctx, lambd, x))
    raised = hlo.add(b, x, _splat_like(ctx, bias, x))
    lowered = hlo.subtract(b, x, _splat_like(ctx, bias, x))
    zero = _splat_like(ctx, 0, x)
    return [hlo.select(b, below, raised, hlo.select(b, above, lowered, zero))]


@lowers_folding("onnx.Mod")
def lower_mod(ctx: LoweringContext, op: Operation) -> list[Value]:
    """fmod=1: C's fmod (the sign of the dividend, stablehlo.remainder); fmod=0: the sign of the divisor,
    as Python's %, so a non-zero remainder of the other sign gets the divisor added (for floats too,
    which onnxruntime and opset 28's tests accept)."""
    lhs, rhs = ctx.broadcast_operands(ctx.operands(op))
    b = ctx.builder
    element = element_type_of(lhs.type)
    use_fmod = int(ctx.attribute(op, "fmod", 0))  # type: ignore[arg-type]
    remainder = hlo.remainder(b, lhs, rhs)
    if use_fmod or (isinstance(element, IntegerType) and element.is_unsigned):
        return [remainder]
    zero = _splat_like(ctx, 0, remainder)
    nonzero = hlo.compare(b, "NE", remainder, zero)
    signs_differ = hlo.compare(
        b, "NE", hlo.compare(b, "LT", remainder, zero), hlo.compare(b, "LT", rhs, zero)
    )
    adjust = hlo.and_(b, nonzero, signs_differ)
    return [hlo.select(b, adjust, hlo.add(b, remainder, rhs), remainder)]


@lowers_folding("onnx.Sum", "onnx.Mean")
def lower_sum_mean(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Left to right sum of the broadcast inputs; Mean multiplies the sum by 1/count (onnxruntime's
    order: a division would differ from it by an ulp on a third of the elements)."""
    values = ctx.broadcast_operands(ctx.operands(op))
    result = values[0]
    for value in values[1:]:
        result = hlo.add(ctx.builder, result, value)
    if op.name == "onnx.Mean":
        if not isinstance(element_type_of(result.type), FloatType):
            ctx.unsupported("Mean of integer tensors (ONNX types it for floats)")
        reciprocal = float(np.float32(1.0) / np.float32(len(values)))
        result = hlo.multiply(ctx.builder, result, _splat_like(ctx, reciprocal, result))
    return [result]
