"""Lowerings of the ONNX reductions beyond onnx_reduce.py: ReduceMin, ReduceProd, ReduceL1, ReduceL2,
ReduceSumSquare, ReduceLogSum, ReduceLogSumExp (axes as attribute or input, keepdims,
noop_with_empty_axes: no axes then reduce nothing, each element alone).

onnxruntime's formulas: L1 = Σ|x|, L2 = sqrt(Σx²), SumSquare = Σx², LogSum = log(Σx), LogSumExp =
log(Σ exp(x - max)) + max. ReduceMin is exact; the sums run in another order than onnxruntime's, so
float results agree within a few ulp of the result's magnitude (integer sums and products are exact).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.types import FloatType, element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import lowers_folding
from .onnx_index import reduce_min
from .onnx_reduce import keep_dims, reduce_max, reduce_sum, reduction_axes

FLOAT_ONLY = ("onnx.ReduceL2", "onnx.ReduceLogSum", "onnx.ReduceLogSumExp")


@lowers_folding(
    "onnx.ReduceMin",
    "onnx.ReduceProd",
    "onnx.ReduceL1",
    "onnx.ReduceL2",
    "onnx.ReduceSumSquare",
    "onnx.ReduceLogSum",
    "onnx.ReduceLogSumExp",
)
def lower_reduce_more(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = hlo.tensor_type(x).shape
    element = element_type_of(x.type)
    if op.name in FLOAT_ONLY and not isinstance(element, FloatType):
        ctx.unsupported(f"{op.name} of {element}")
    axes = reduction_axes(ctx, op, len(shape))
    b = ctx.builder

    def over_axes(function: Callable[[LoweringContext, Value, list[int]], Value]) -> Callable[[Value], Value]:
        # No axes (noop_with_empty_axes=1): each element is reduced alone.
        return (lambda value: value) if axes is None else (lambda value: function(ctx, value, axes))

    total = over_axes(reduce_sum)
    if op.name == "onnx.ReduceMin":
        result = over_axes(reduce_min)(x)
    elif op.name == "onnx.ReduceProd":
        result = over_axes(_reduce_product)(x)
    elif op.name == "onnx.ReduceL1":
        result = total(hlo.abs_(b, x))
    elif op.name == "onnx.ReduceL2":
        result = hlo.sqrt(b, total(hlo.multiply(b, x, x)))
    elif op.name == "onnx.ReduceSumSquare":
        result = total(hlo.multiply(b, x, x))
    elif op.name == "onnx.ReduceLogSum":
        result = hlo.log(b, total(x))
    else:  # ReduceLogSumExp
        result = _log_sum_exp(ctx, x, axes)
    if axes is not None and int(ctx.attribute(op, "keepdims", 1)):  # type: ignore[arg-type]
        result = keep_dims(ctx, result, shape, axes)
    return [result]


def _reduce_product(ctx: LoweringContext, x: Value, axes: list[int]) -> Value:
    one = ctx.scalar(1, element_type_of(x.type))
    return hlo.reduce(ctx.builder, x, one, sorted(axes), hlo.multiply)


def _log_sum_exp(ctx: LoweringContext, x: Value, axes: list[int] | None) -> Value:
    b = ctx.builder
    if axes is None:
        return hlo.log(b, hlo.exponential(b, x))
    shape = hlo.tensor_type(x).shape
    kept = [d for d in range(len(shape)) if d not in axes]
    peak = reduce_max(ctx, x, axes)
    # An all -inf slice has max -inf: x - max would be NaN; onnxruntime then shifts by 0 instead.
    element = element_type_of(x.type)
    reduced_shape = hlo.tensor_type(peak).shape
    finite = hlo.compare(b, "NE", peak, ctx.splat(-np.inf, element, reduced_shape))
    shift = hlo.select(b, finite, peak, ctx.splat(0.0, element, reduced_shape))
    shifted = hlo.subtract(b, x, hlo.broadcast_in_dim(b, shift, shape, kept))
    return hlo.add(b, hlo.log(b, reduce_sum(ctx, hlo.exponential(b, shifted), axes)), shift)
