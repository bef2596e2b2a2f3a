"""Lowerings of ONNX data-movement ops: Reshape, Transpose, Concat, Split, Slice, Gather, Unsqueeze,
Squeeze, Flatten, Expand. All are exact. Their shape inputs (Reshape's shape, Slice's starts, Split's
sizes...) must be known at conversion time (constants, or folded by onnx_fold.py); each op also folds
when its data input is constant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from qconvert import onnx_semantics as semantics
from qconvert.ir.core import GenericOp, Operation, Value
from qconvert.ir.types import I64, RankedTensorType, element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import constant_input, lowers_folding, static_shape

T = TypeVar("T")


def required_constant(ctx: LoweringContext, op: Operation, position: int, what: str) -> np.ndarray | None:
    """ONNX input `position` as an int64 array; None when absent; `ctx.unsupported` when computed."""
    if ctx.source_input(op, position) is None:
        return None
    array = constant_input(ctx, op, position)
    if array is None:
        ctx.unsupported(f"{what} is computed at run time (StableHLO needs it static; try --input-shape)")
    return np.asarray(array, dtype=np.int64).reshape(-1)


def ints_from(
    ctx: LoweringContext, op: Operation, position: int, attribute: str, what: str
) -> list[int] | None:
    """An int list given as input `position` (newer opsets) or as attribute `attribute` (older)."""
    from_input = required_constant(ctx, op, position, what)
    return semantics.ints_from(from_input, ctx.attribute(op, attribute))  # type: ignore[arg-type]


def by_rule(ctx: LoweringContext, rule: Callable[..., T], *arguments: object) -> T:
    """onnx_semantics' `rule(*arguments)`; the ValueError of a malformed node fails the op with its text."""
    try:
        return rule(*arguments)
    except ValueError as error:
        ctx.unsupported(str(error))


def normalize_axis(ctx: LoweringContext, axis: int, rank: int) -> int:
    """onnx_semantics' `normalize_axis`; an out-of-range axis fails the op, naming the axis and rank."""
    return by_rule(ctx, semantics.normalize_axis, axis, rank)


def data(ctx: LoweringContext, op: Operation) -> tuple[Value, tuple[int, ...]]:
    x = ctx.input(op, 0)
    assert x is not None
    return x, static_shape(ctx, x, f"input of {op.name}")


@lowers_folding("onnx.Reshape")
def lower_reshape(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, shape = data(ctx, op)
    given = required_constant(ctx, op, 1, "Reshape's shape")
    allowzero = bool(int(ctx.attribute(op, "allowzero", 0)))  # type: ignore[arg-type]
    target = by_rule(ctx, semantics.reshape_target, shape, given, allowzero)
    return [hlo.reshape(ctx.builder, x, target)]


@lowers_folding("onnx.Flatten")
def lower_flatten(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, shape = data(ctx, op)
    axis = int(ctx.attribute(op, "axis", 1))  # type: ignore[arg-type]
    return [hlo.reshape(ctx.builder, x, by_rule(ctx, semantics.flattened_shape, shape, axis))]


@lowers_folding("onnx.Unsqueeze")
def lower_unsqueeze(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, shape = data(ctx, op)
    axes = ints_from(ctx, op, 1, "axes", "Unsqueeze's axes") or []
    return [hlo.reshape(ctx.builder, x, by_rule(ctx, semantics.unsqueezed_shape, shape, axes))]


@lowers_folding("onnx.Squeeze")
def lower_squeeze(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, shape = data(ctx, op)
    axes = ints_from(ctx, op, 1, "axes", "Squeeze's axes")
    removed = by_rule(ctx, semantics.squeezed_axes, shape, axes)
    return [hlo.reshape(ctx.builder, x, [d for i, d in enumerate(shape) if i not in removed])]


@lowers_folding("onnx.Expand")
def lower_expand(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, shape = data(ctx, op)
    target = required_constant(ctx, op, 1, "Expand's shape")
    assert target is not None
    # ONNX Expand broadcasts both ways (a target dim of 1 keeps the input's dim).
    result_shape = np.broadcast_shapes(shape, tuple(int(v) for v in target))
    return [ctx.broadcast_to(x, result_shape)]


@lowers_folding("onnx.Transpose")
def lower_transpose(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, shape = data(ctx, op)
    permutation = semantics.transpose_permutation(len(shape), ctx.attribute(op, "perm"))  # type: ignore[arg-type]
    return [hlo.transpose(ctx.builder, x, permutation)]


@lowers_folding("onnx.Concat")
def lower_concat(ctx: LoweringContext, op: Operation) -> list[Value]:
    values = ctx.operands(op)
    rank = hlo.tensor_type(values[0]).rank
    axis = normalize_axis(ctx, int(ctx.attribute(op, "axis")), rank)  # type: ignore[arg-type]
    return [hlo.concatenate(ctx.builder, values, axis)]


@lowers_folding("onnx.Split")
def lower_split(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, shape = data(ctx, op)
    axis = normalize_axis(ctx, int(ctx.attribute(op, "axis", 0)), len(shape))  # type: ignore[arg-type]
    given = ints_from(ctx, op, 1, "split", "Split's sizes")
    sizes = by_rule(ctx, semantics.split_sizes, shape[axis], len(op.results), given)
    results, start = [], 0
    for size in sizes:
        begin = [0] * len(shape)
        limit = list(shape)
        begin[axis], limit[axis] = start, start + size
        results.append(hlo.slice_(ctx.builder, x, begin, limit, [1] * len(shape)))
        start += size
    return results


def reverse(ctx: LoweringContext, x: Value, dimensions: Sequence[int]) -> Value:
    """`stablehlo.reverse` along `dimensions` (not among ops.py's constructors)."""
    attributes = {"dimensions": hlo.i64_array(dimensions)}
    return ctx.builder.insert(GenericOp("stablehlo.reverse", [x], [x.type], attributes)).result


@lowers_folding("onnx.Slice")
def lower_slice(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, shape = data(ctx, op)
    rank = len(shape)
    if "starts" in op.attributes:  # opset < 10
        starts = [int(v) for v in ctx.attribute(op, "starts")]  # type: ignore[union-attr]
        ends = [int(v) for v in ctx.attribute(op, "ends")]  # type: ignore[union-attr]
        axes = ctx.attribute(op, "axes")
        steps = [1] * len(starts)
    else:
        starts = [int(v) for v in required_constant(ctx, op, 1, "Slice's starts")]  # type: ignore[union-attr]
        ends = [int(v) for v in required_constant(ctx, op, 2, "Slice's ends")]  # type: ignore[union-attr]
        axes = required_constant(ctx, op, 3, "Slice's axes")
        step_array = required_constant(ctx, op, 4, "Slice's steps")
        steps = [1] * len(starts) if step_array is None else [int(v) for v in step_array]
    axes_list = list(range(len(starts)))
    if axes is not None:
        axes_list = [normalize_axis(ctx, int(a), rank) for a in axes]  # type: ignore[union-attr]
    begin, limit, strides = [0] * rank, list(shape), [1] * rank
    reversed_axes = []
    for axis, start, end, step in zip(axes_list, starts, ends, steps):
        if step == 0:
            ctx.unsupported("Slice with a step of 0")
        # Python's slice rules clamp as ONNX does (start to [0, dim] or [0, dim-1] for negative steps).
        picked = range(*slice(start, end, step).indices(shape[axis]))
        count, stride = len(picked), abs(step)
        if step < 0:
            # Reversing the axis maps index i to dim - 1 - i and makes the step positive.
            reversed_axes.append(axis)
            first = shape[axis] - 1 - picked[0] if count else 0
        else:
            first = picked[0] if count else 0
        begin[axis], strides[axis] = first, stride
        limit[axis] = first + (count - 1) * stride + 1 if count else first
    source = reverse(ctx, x, reversed_axes) if reversed_axes else x
    return [hlo.slice_(ctx.builder, source, begin, limit, strides)]


@lowers_folding("onnx.Gather")
def lower_gather(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, shape = data(ctx, op)
    rank = len(shape)
    axis = normalize_axis(ctx, int(ctx.attribute(op, "axis", 0)), rank)  # type: ignore[arg-type]
    constant = constant_input(ctx, op, 1)
    if constant is not None:
        # Negative indices count from the end (ONNX); normalized here, at conversion time.
        normalized = np.where(constant < 0, constant + shape[axis], constant).astype(np.int64)
        indices = ctx.constant(normalized, I64)
        index_shape = normalized.shape
    else:
        indices = ctx.input(op, 1)
        assert indices is not None
        index_shape = static_shape(ctx, indices, "Gather's indices")
        indices = ctx.convert(indices, I64)
        negative = hlo.compare(ctx.builder, "LT", indices, ctx.splat(0, I64, index_shape))
        wrapped = hlo.add(ctx.builder, indices, ctx.splat(shape[axis], I64, index_shape))
        indices = hlo.select(ctx.builder, negative, wrapped, indices)
    # Indices get a trailing index-vector dim of size 1: gather picks one coordinate along `axis`.
    indices = hlo.reshape(ctx.builder, indices, [*index_shape, 1])
    index_rank = len(index_shape)
    out_shape = (*shape[:axis], *index_shape, *shape[axis + 1 :])
    offset_dims = [*range(axis), *range(axis + index_rank, len(out_shape))]
    slice_sizes = [1 if i == axis else d for i, d in enumerate(shape)]
    result_type = RankedTensorType(tuple(out_shape), element_type_of(x.type))
    return [
        hlo.gather(
            ctx.builder,
            x,
            indices,
            result_type,
            offset_dims=offset_dims,
            collapsed_slice_dims=[axis],
            start_index_map=[axis],
            index_vector_dim=index_rank,
            slice_sizes=slice_sizes,
        )
    ]
