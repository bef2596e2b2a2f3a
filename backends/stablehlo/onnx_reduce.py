"""Lowerings of ONNX reductions: ReduceSum, ReduceMean, ReduceMax (axes as attribute or input).

ReduceMean is the sum divided by the count, as onnxruntime computes it. The engine's summation order
differs from onnxruntime's, so float sums can differ by a few ulp.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qconvert import onnx_semantics as semantics
from qconvert.ir.core import Operation, Value
from qconvert.ir.types import FloatType, IntegerType, Type, element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import constant_input, lowers_folding
from .onnx_shape import by_rule


def lowest(element: Type) -> float | int:
    """The identity of max: -inf for floats, the smallest value for integers."""
    if isinstance(element, FloatType):
        return -np.inf
    assert isinstance(element, IntegerType)
    if element.is_unsigned:
        return 0
    return -(1 << (element.width - 1)) if element.width > 1 else 0


def reduce_sum(ctx: LoweringContext, x: Value, axes: Sequence[int]) -> Value:
    """Sum over `axes` (removed from the shape)."""
    zero = ctx.scalar(0, element_type_of(x.type))
    return hlo.reduce(ctx.builder, x, zero, sorted(axes), hlo.add)


def reduce_max(ctx: LoweringContext, x: Value, axes: Sequence[int]) -> Value:
    element = element_type_of(x.type)
    return hlo.reduce(ctx.builder, x, ctx.scalar(lowest(element), element), sorted(axes), hlo.maximum)


def keep_dims(ctx: LoweringContext, reduced: Value, shape: Sequence[int], axes: Sequence[int]) -> Value:
    """Reshape a reduction's result back to rank with size-1 reduced dims."""
    kept = [1 if i in axes else d for i, d in enumerate(shape)]
    return hlo.reshape(ctx.builder, reduced, kept)


def reduction_axes(ctx: LoweringContext, op: Operation, rank: int) -> list[int] | None:
    """The normalized axes to reduce; None means none (noop_with_empty_axes=1 and no axes)."""
    axes = constant_input(ctx, op, 1) if ctx.source_input(op, 1) is not None else None
    if ctx.source_input(op, 1) is not None and axes is None:
        ctx.unsupported("axes computed at run time (StableHLO reductions need constant axes)")
    from_input = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    given = semantics.ints_from(from_input, ctx.attribute(op, "axes"))  # type: ignore[arg-type]
    noop = bool(int(ctx.attribute(op, "noop_with_empty_axes", 0)))  # type: ignore[arg-type]
    return by_rule(ctx, semantics.reduction_axes, rank, given, noop)


@lowers_folding("onnx.ReduceSum", "onnx.ReduceMean", "onnx.ReduceMax")
def lower_reduce(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = hlo.tensor_type(x).shape
    axes = reduction_axes(ctx, op, len(shape))
    if axes is None:
        return [x]
    if op.name == "onnx.ReduceMax":
        result = reduce_max(ctx, x, axes)
    else:
        result = reduce_sum(ctx, x, axes)
        if op.name == "onnx.ReduceMean":
            count = int(np.prod([shape[a] for a in axes], dtype=np.int64))
            element = element_type_of(x.type)
            divisor = ctx.splat(count, element, hlo.tensor_type(result).shape)
            result = hlo.exact_divide(ctx.builder, result, divisor)
    if int(ctx.attribute(op, "keepdims", 1)):  # type: ignore[arg-type]
        result = keep_dims(ctx, result, shape, axes)
    return [result]
