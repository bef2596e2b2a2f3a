"""Lowerings of ONNX comparisons and logic: Greater, GreaterOrEqual, Less, LessOrEqual, And, Or, Xor,
Not, BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot, IsNaN, IsInf, BitShift. All are exact (no
rounding anywhere).

Comparisons broadcast by numpy's rules; a float comparison with a NaN is false, as in C++ (the
`FLOAT` comparison type of StableHLO's compare, which is its default for floats).
"""

from __future__ import annotations

import numpy as np

from qconvert.ir.core import GenericOp, Operation, Value
from qconvert.ir.types import I1, FloatType, IntegerType, element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import lowers_folding

DIRECTIONS = {
    "onnx.Greater": "GT",
    "onnx.GreaterOrEqual": "GE",
    "onnx.Less": "LT",
    "onnx.LessOrEqual": "LE",
}


@lowers_folding(*DIRECTIONS)
def lower_comparison(ctx: LoweringContext, op: Operation) -> list[Value]:
    lhs, rhs = ctx.broadcast_operands(ctx.operands(op))
    return [hlo.compare(ctx.builder, DIRECTIONS[op.name], lhs, rhs)]


LOGIC = {
    "onnx.And": hlo.and_,
    "onnx.Or": hlo.or_,
    "onnx.Xor": hlo.xor,
    "onnx.BitwiseAnd": hlo.and_,
    "onnx.BitwiseOr": hlo.or_,
    "onnx.BitwiseXor": hlo.xor,
}


@lowers_folding(*LOGIC)
def lower_logic(ctx: LoweringContext, op: Operation) -> list[Value]:
    lhs, rhs = ctx.broadcast_operands(ctx.operands(op))
    return [LOGIC[op.name](ctx.builder, lhs, rhs)]


@lowers_folding("onnx.Not", "onnx.BitwiseNot")
def lower_not(ctx: LoweringContext, op: Operation) -> list[Value]:
    return [hlo.not_(ctx.builder, ctx.operands(op)[0])]


@lowers_folding("onnx.IsNaN")
def lower_is_nan(ctx: LoweringContext, op: Operation) -> list[Value]:
    """x != x is true exactly for NaN."""
    (x,) = ctx.operands(op)
    return [hlo.compare(ctx.builder, "NE", x, x)]


@lowers_folding("onnx.IsInf")
def lower_is_inf(ctx: LoweringContext, op: Operation) -> list[Value]:
    """x == +inf and / or x == -inf, per detect_positive / detect_negative (both 1 by default)."""
    (x,) = ctx.operands(op)
    element = element_type_of(x.type)
    shape = hlo.tensor_type(x).shape
    b = ctx.builder
    if not isinstance(element, FloatType):
        ctx.unsupported(f"IsInf of {element}")
    checks = []
    if int(ctx.attribute(op, "detect_positive", 1)):  # type: ignore[arg-type]
        checks.append(hlo.compare(b, "EQ", x, ctx.splat(np.inf, element, shape)))
    if int(ctx.attribute(op, "detect_negative", 1)):  # type: ignore[arg-type]
        checks.append(hlo.compare(b, "EQ", x, ctx.splat(-np.inf, element, shape)))
    if not checks:
        return [ctx.splat(False, I1, shape)]
    result = checks[0]
    for check in checks[1:]:
        result = hlo.or_(b, result, check)
    return [result]


@lowers_folding("onnx.BitShift")
def lower_bit_shift(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Unsigned types shift logically; signed ones (opset 28) shift right arithmetically. A shift by the
    width or more (or a negative one, read as unsigned) gives 0, or -1 for a negative value shifted
    right: stablehlo's shift semantics."""
    lhs, rhs = ctx.broadcast_operands(ctx.operands(op))
    element = element_type_of(lhs.type)
    if not isinstance(element, IntegerType):
        ctx.unsupported(f"BitShift of {element}")
    direction = str(ctx.attribute(op, "direction", ""))
    right = "stablehlo.shift_right_logical" if element.is_unsigned else "stablehlo.shift_right_arithmetic"
    name = {"LEFT": "stablehlo.shift_left", "RIGHT": right}.get(direction)
    if name is None:
        ctx.unsupported(f"BitShift direction={direction!r}")
    return [ctx.builder.insert(GenericOp(name, [lhs, rhs], [lhs.type], {})).result]
