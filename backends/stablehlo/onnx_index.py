"""Lowerings of ONNX indexing ops: ArgMax, ArgMin, TopK, GatherElements, GatherND, ScatterND,
ScatterElements, OneHot, Trilu, CumSum, Tile.

All are exact except float CumSum, whose running sums XLA computes in another order than
onnxruntime's sequential loop. Conventions that follow onnxruntime where ONNX leaves them open: ArgMax /
ArgMin and TopK pick the lowest index among equal values (the highest with select_last_index=1);
TopK with sorted=0 returns its k elements sorted (ONNX allows any order). Negative indices count from
the end, checked at run time for run-time indices. Duplicate indices in ScatterND / ScatterElements
without a reduction are undefined in ONNX; the engines then pick one of the updates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from qconvert.ir.attributes import Attribute, IntegerAttr, OpaqueAttr
from qconvert.ir.core import Block, Builder, GenericOp, Operation, Region, Value
from qconvert.ir.types import I1, I64, FloatType, IntegerType, RankedTensorType, Type, element_type_of

from . import ops as hlo
from .lowering import LoweringContext, lowers
from .onnx_fold import constant_input, lowers_folding, static_shape
from .onnx_reduce import keep_dims, lowest
from .onnx_shape import normalize_axis, required_constant, reverse


def highest(element: Type) -> float | int:
    """The identity of min: +inf for floats, the largest value for integers."""
    if isinstance(element, FloatType):
        return np.inf
    assert isinstance(element, IntegerType)
    if element.width == 1:
        return 1
    bits = element.width if element.is_unsigned else element.width - 1
    return (1 << bits) - 1


def reduce_min(ctx: LoweringContext, x: Value, axes: Sequence[int]) -> Value:
    element = element_type_of(x.type)
    return hlo.reduce(ctx.builder, x, ctx.scalar(highest(element), element), sorted(axes), hlo.minimum)


def block_region(
    argument_types: Sequence[Type], body: Callable[[Builder, list[Value]], Value | list[Value]]
) -> Region:
    """A one-block region whose block returns `body(builder, arguments)` (sort comparators, scatter
    update computations, variadic reduction bodies returning a list)."""
    block = Block(list(argument_types))
    inner = Builder(block)
    returned = body(inner, list(block.arguments))
    inner.insert(GenericOp("stablehlo.return", returned if isinstance(returned, list) else [returned], []))
    return Region([block])


def first_index_of_extreme(ctx: LoweringContext, x: Value, axis: int, *, largest: bool, last: bool) -> Value:
    """The i64 index of the maximum (or minimum) along `axis`, the first one among equal values (the
    last with `last`); `axis` is removed from the shape."""
    b = ctx.builder
    type_ = hlo.tensor_type(x)
    keep = [d for d in range(type_.rank) if d != axis]
    extreme = hlo.reduce(
        b,
        x,
        ctx.scalar(
            lowest(type_.element_type) if largest else highest(type_.element_type), type_.element_type
        ),
        [axis],
        hlo.maximum if largest else hlo.minimum,
    )
    at_extreme = hlo.compare(b, "EQ", x, hlo.broadcast_in_dim(b, extreme, type_.shape, keep))
    positions = hlo.iota(b, RankedTensorType(type_.shape, I64), axis)
    size = type_.shape[axis]
    filler = ctx.splat(-1 if last else size, I64, type_.shape)
    candidates = hlo.select(b, at_extreme, positions, filler)
    if last:
        return hlo.reduce(b, candidates, ctx.scalar(-1, I64), [axis], hlo.maximum)
    return hlo.reduce(b, candidates, ctx.scalar(size, I64), [axis], hlo.minimum)


@lowers_folding("onnx.ArgMax", "onnx.ArgMin")
def lower_arg_extreme(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    shape = static_shape(ctx, x, f"{op.name}'s input")
    axis = normalize_axis(ctx, int(ctx.attribute(op, "axis", 0)), len(shape))  # type: ignore[arg-type]
    last = bool(int(ctx.attribute(op, "select_last_index", 0)))  # type: ignore[arg-type]
    index = first_index_of_extreme(ctx, x, axis, largest=op.name == "onnx.ArgMax", last=last)
    if int(ctx.attribute(op, "keepdims", 1)):  # type: ignore[arg-type]
        index = keep_dims(ctx, index, shape, [axis])
    return [index]


def sort_along(ctx: LoweringContext, operands: Sequence[Value], axis: int, direction: str) -> list[Value]:
    """`stablehlo.sort` of `operands` (same shape) along `axis`, stable, ordered by the first operand
    with `direction` (GT: descending, LT: ascending)."""
    scalar_types: list[Type] = []
    for value in operands:
        scalar = RankedTensorType((), element_type_of(value.type))
        scalar_types += [scalar, scalar]
    region = block_region(scalar_types, lambda inner, args: hlo.compare(inner, direction, args[0], args[1]))
    attributes: dict[str, Attribute] = {
        "dimension": IntegerAttr(axis, I64),
        "is_stable": OpaqueAttr("true"),
    }
    op = ctx.builder.insert(
        GenericOp("stablehlo.sort", list(operands), [v.type for v in operands], attributes, [region])
    )
    return list(op.results)


@lowers_folding("onnx.TopK")
def lower_top_k(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "TopK's input")
    axis = normalize_axis(ctx, int(ctx.attribute(op, "axis", -1)), len(shape))  # type: ignore[arg-type]
    if "k" in op.attributes:  # opset 1
        k = int(ctx.attribute(op, "k"))  # type: ignore[arg-type]
    else:
        k_array = required_constant(ctx, op, 1, "TopK's k")
        assert k_array is not None
        k = int(k_array[0])
    if not 0 <= k <= shape[axis]:
        ctx.unsupported(f"TopK k={k} for an axis of {shape[axis]}")
    largest = bool(int(ctx.attribute(op, "largest", 1)))  # type: ignore[arg-type]
    positions = hlo.iota(ctx.builder, RankedTensorType(shape, I64), axis)
    values, indices = sort_along(ctx, [x, positions], axis, "GT" if largest else "LT")
    limit = list(shape)
    limit[axis] = k
    start, strides = [0] * len(shape), [1] * len(shape)
    return [
        hlo.slice_(ctx.builder, values, start, limit, strides),
        hlo.slice_(ctx.builder, indices, start, limit, strides),
    ]


def _wrap_negative(ctx: LoweringContext, indices: Value, sizes: Value) -> Value:
    """indices < 0 ? indices + sizes : indices (all i64 of one shape)."""
    b = ctx.builder
    shape = hlo.tensor_type(indices).shape
    negative = hlo.compare(b, "LT", indices, ctx.splat(0, I64, shape))
    return hlo.select(b, negative, hlo.add(b, indices, sizes), indices)


def _index_operand(ctx: LoweringContext, op: Operation, position: int, sizes: np.ndarray | int) -> Value:
    """ONNX input `position` (indices) as i64 with negative values wrapped by `sizes` (broadcast along
    the last dim when an array): folded at conversion time for constant indices."""
    constant = constant_input(ctx, op, position)
    if constant is not None:
        array = np.asarray(constant, dtype=np.int64)
        return ctx.constant(np.where(array < 0, array + sizes, array), I64)
    indices = ctx.input(op, position)
    assert indices is not None
    indices = ctx.convert(indices, I64)
    shape = hlo.tensor_type(indices).shape
    bound = ctx.constant(np.ascontiguousarray(np.broadcast_to(np.asarray(sizes, np.int64), shape)), I64)
    return _wrap_negative(ctx, indices, bound)


def _full_coordinates(ctx: LoweringContext, indices: Value, axis: int) -> Value:
    """For indices of rank r used along `axis` (GatherElements / ScatterElements): the coordinates
    (*shape, r) of every element, the index along `axis` and the element's own position elsewhere."""
    b = ctx.builder
    shape = hlo.tensor_type(indices).shape
    rank = len(shape)
    column_type = RankedTensorType((*shape, 1), I64)
    columns = []
    for dim in range(rank):
        if dim == axis:
            columns.append(hlo.reshape(b, indices, [*shape, 1]))
        else:
            columns.append(hlo.iota(b, column_type, dim))
    return hlo.concatenate(b, columns, rank)


def _dimension_numbers(kind: str, **fields: Sequence[int] | int) -> OpaqueAttr:
    parts = []
    for name, value in fields.items():
        if isinstance(value, int):
            parts.append(f"{name} = {value}")
        elif value:
            parts.append(f"{name} = [{', '.join(str(v) for v in value)}]")
    return OpaqueAttr(f"#stablehlo.{kind}<{', '.join(parts)}>")


@lowers("onnx.GatherElements")  # never folded: see the docstring
def lower_gather_elements(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Not folded on constant inputs: onnx's reference GatherElements fails when the indices are smaller
    than the data on another axis (its np.choose broadcasts them; BERT's token-type ids hit it), and
    the gather is exact on the engine anyway."""
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "GatherElements' data")
    rank = len(shape)
    axis = normalize_axis(ctx, int(ctx.attribute(op, "axis", 0)), rank)  # type: ignore[arg-type]
    indices = _index_operand(ctx, op, 1, shape[axis])
    index_shape = hlo.tensor_type(indices).shape
    coordinates = _full_coordinates(ctx, indices, axis)
    result_type = RankedTensorType(index_shape, element_type_of(x.type))
    return [
        hlo.gather(
            ctx.builder,
            x,
            coordinates,
            result_type,
            offset_dims=[],
            collapsed_slice_dims=list(range(rank)),
            start_index_map=list(range(rank)),
            index_vector_dim=rank,
            slice_sizes=[1] * rank,
        )
    ]


def _nd_coordinates(ctx: LoweringContext, op: Operation, data_shape: Sequence[int], batch_dims: int) -> Value:
    """GatherND / ScatterND indices (*B, *M, k) -> coordinates (*B, *M, b + k): the batch position
    first (batch_dims), then the given k indices, negative ones wrapped."""
    index_source = ctx.source_input(op, 1)
    assert index_source is not None
    indices_value = ctx.input(op, 1)
    assert indices_value is not None
    index_shape = static_shape(ctx, indices_value, f"{op.name}'s indices")
    k = index_shape[-1]
    sizes = np.asarray(data_shape[batch_dims : batch_dims + k], np.int64)
    indices = _index_operand(ctx, op, 1, sizes)
    if not batch_dims:
        return indices
    b = ctx.builder
    column_type = RankedTensorType((*index_shape[:-1], 1), I64)
    columns = [hlo.iota(b, column_type, dim) for dim in range(batch_dims)]
    return hlo.concatenate(b, [*columns, indices], len(index_shape) - 1)


@lowers_folding("onnx.GatherND")
def lower_gather_nd(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "GatherND's data")
    batch_dims = int(ctx.attribute(op, "batch_dims", 0))  # type: ignore[arg-type]
    coordinates = _nd_coordinates(ctx, op, shape, batch_dims)
    coordinate_shape = hlo.tensor_type(coordinates).shape
    depth = coordinate_shape[-1]  # b + k
    if depth > len(shape):
        ctx.unsupported(f"GatherND index vectors of {depth} for data of rank {len(shape)}")
    rest = shape[depth:]
    batch_rank = len(coordinate_shape) - 1
    result_type = RankedTensorType((*coordinate_shape[:-1], *rest), element_type_of(x.type))
    return [
        hlo.gather(
            ctx.builder,
            x,
            coordinates,
            result_type,
            offset_dims=list(range(batch_rank, batch_rank + len(rest))),
            collapsed_slice_dims=list(range(depth)),
            start_index_map=list(range(depth)),
            index_vector_dim=batch_rank,
            slice_sizes=[1] * depth + list(rest),
        )
    ]


REDUCTIONS: dict[str, Callable[[Builder, Value, Value], Value] | None] = {
    "none": None,
    "add": hlo.add,
    "mul": hlo.multiply,
    "max": hlo.maximum,
    "min": hlo.minimum,
}


def scatter(
    ctx: LoweringContext, op: Operation, data: Value, coordinates: Value, updates: Value, **numbers: object
) -> Value:
    """A `stablehlo.scatter` of `updates` into `data` at `coordinates`, combined by `op`'s `reduction`
    attribute; `numbers` are its scatter dimension numbers."""
    reduction = str(ctx.attribute(op, "reduction", "none"))
    if reduction not in REDUCTIONS:
        ctx.unsupported(f"{op.name} reduction={reduction!r}")
    combine = REDUCTIONS[reduction]
    scalar = RankedTensorType((), element_type_of(data.type))

    def body(inner: Builder, args: list[Value]) -> Value:
        return args[1] if combine is None else combine(inner, args[0], args[1])

    attributes: dict[str, Attribute] = {
        "scatter_dimension_numbers": _dimension_numbers("scatter", **numbers),  # type: ignore[arg-type]
        "indices_are_sorted": OpaqueAttr("false"),
        "unique_indices": OpaqueAttr("false"),
    }
    region = block_region([scalar, scalar], body)
    # StableHLO's reference interpreter (jaxlib 0.10.2) writes the scatter's result into its operand's
    # buffer, so other users of `data` saw the updates (measured); the scatter gets a copy of its own.
    # XLA folds the select away.
    data = hlo.select(ctx.builder, ctx.scalar(True, I1), data, data)
    scatter_op = GenericOp(
        "stablehlo.scatter", [data, coordinates, updates], [data.type], attributes, [region]
    )
    return ctx.builder.insert(scatter_op).result


@lowers_folding("onnx.ScatterND")
def lower_scatter_nd(ctx: LoweringContext, op: Operation) -> list[Value]:
    data, updates = ctx.input(op, 0), ctx.input(op, 2)
    assert data is not None and updates is not None
    shape = static_shape(ctx, data, "ScatterND's data")
    coordinates = _nd_coordinates(ctx, op, shape, 0)
    coordinate_shape = hlo.tensor_type(coordinates).shape
    k, batch_rank = coordinate_shape[-1], len(coordinate_shape) - 1
    return [
        scatter(
            ctx,
            op,
            data,
            coordinates,
            updates,
            update_window_dims=list(range(batch_rank, batch_rank + len(shape) - k)),
            inserted_window_dims=list(range(k)),
            scatter_dims_to_operand_dims=list(range(k)),
            index_vector_dim=batch_rank,
        )
    ]


@lowers_folding("onnx.ScatterElements", "onnx.Scatter")
def lower_scatter_elements(ctx: LoweringContext, op: Operation) -> list[Value]:
    data, updates = ctx.input(op, 0), ctx.input(op, 2)
    assert data is not None and updates is not None
    shape = static_shape(ctx, data, f"{op.name}'s data")
    rank = len(shape)
    axis = normalize_axis(ctx, int(ctx.attribute(op, "axis", 0)), rank)  # type: ignore[arg-type]
    indices = _index_operand(ctx, op, 1, shape[axis])
    coordinates = _full_coordinates(ctx, indices, axis)
    return [
        scatter(
            ctx,
            op,
            data,
            coordinates,
            updates,
            update_window_dims=[],
            inserted_window_dims=list(range(rank)),
            scatter_dims_to_operand_dims=list(range(rank)),
            index_vector_dim=rank,
        )
    ]


@lowers_folding("onnx.OneHot")
def lower_one_hot(ctx: LoweringContext, op: Operation) -> list[Value]:
    indices, values = ctx.input(op, 0), ctx.input(op, 2)
    assert indices is not None and values is not None
    depth_array = constant_input(ctx, op, 1)
    if depth_array is None:
        ctx.unsupported("OneHot's depth is computed at run time (the output shape depends on it)")
    depth = int(np.asarray(depth_array).reshape(-1)[0])
    index_shape = static_shape(ctx, indices, "OneHot's indices")
    out_rank = len(index_shape) + 1
    axis = normalize_axis(ctx, int(ctx.attribute(op, "axis", -1)), out_rank)  # type: ignore[arg-type]
    out_shape = [*index_shape[:axis], depth, *index_shape[axis:]]
    b = ctx.builder
    # Float indices are truncated toward zero, as onnxruntime casts them to int64.
    index = _wrap_negative(ctx, ctx.convert(indices, I64), ctx.splat(depth, I64, index_shape))
    kept = [d for d in range(out_rank) if d != axis]
    positions = hlo.iota(b, RankedTensorType(tuple(out_shape), I64), axis)
    hot = hlo.compare(b, "EQ", positions, hlo.broadcast_in_dim(b, index, out_shape, kept))
    off = hlo.reshape(b, hlo.slice_(b, values, [0], [1], [1]), [])
    on = hlo.reshape(b, hlo.slice_(b, values, [1], [2], [1]), [])
    return [hlo.select(b, hot, ctx.broadcast_to(on, out_shape), ctx.broadcast_to(off, out_shape))]


@lowers_folding("onnx.Trilu")
def lower_trilu(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "Trilu's input")
    k_array = required_constant(ctx, op, 1, "Trilu's k")
    k = 0 if k_array is None else int(k_array[0])
    upper = bool(int(ctx.attribute(op, "upper", 1)))  # type: ignore[arg-type]
    rows, columns = shape[-2], shape[-1]
    if 0 in shape:
        return [x]  # nothing to mask
    # The mask is known at conversion time: upper keeps column - row >= k, lower column - row <= k.
    difference = np.arange(columns)[None, :] - np.arange(rows)[:, None]
    mask = difference >= k if upper else difference <= k
    b = ctx.builder
    keep = hlo.broadcast_in_dim(b, ctx.constant(mask, I1), shape, [len(shape) - 2, len(shape) - 1])
    zero = ctx.splat(0, element_type_of(x.type), shape)
    return [hlo.select(b, keep, x, zero)]


@lowers_folding("onnx.CumSum")
def lower_cum_sum(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "CumSum's input")
    rank = len(shape)
    axis_array = required_constant(ctx, op, 1, "CumSum's axis")
    assert axis_array is not None
    axis = normalize_axis(ctx, int(axis_array[0]), rank)
    b = ctx.builder
    element = element_type_of(x.type)
    reversed_ = bool(int(ctx.attribute(op, "reverse", 0)))  # type: ignore[arg-type]
    if reversed_:
        x = reverse(ctx, x, [axis])
    size = shape[axis]
    window = [size if d == axis else 1 for d in range(rank)]
    padding = [(size - 1, 0) if d == axis else (0, 0) for d in range(rank)]
    result = hlo.reduce_window(
        b, x, ctx.scalar(0, element), window_dimensions=window, window_strides=[1] * rank, padding=padding,
        body=hlo.add,
    )  # fmt: skip
    if int(ctx.attribute(op, "exclusive", 0)):  # type: ignore[arg-type]
        # Shift by one along the axis: a leading zero, the last sum dropped.
        low = [1 if d == axis else 0 for d in range(rank)]
        high = [-1 if d == axis else 0 for d in range(rank)]
        result = hlo.pad(b, result, ctx.scalar(0, element), low, high)
    if reversed_:
        result = reverse(ctx, result, [axis])
    return [result]


@lowers_folding("onnx.Tile")
def lower_tile(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "Tile's input")
    repeats = required_constant(ctx, op, 1, "Tile's repeats")
    assert repeats is not None
    if len(repeats) != len(shape) or any(r < 0 for r in repeats):
        ctx.unsupported(f"Tile repeats {list(repeats)} for an input of rank {len(shape)}")
    b = ctx.builder
    # (d0, d1, ...) -> (r0, d0, r1, d1, ...) -> (r0 * d0, r1 * d1, ...)
    interleaved = [v for r, d in zip(repeats, shape) for v in (int(r), d)]
    spread = hlo.broadcast_in_dim(b, x, interleaved, [2 * i + 1 for i in range(len(shape))])
    return [hlo.reshape(b, spread, [int(r) * d for r, d in zip(repeats, shape)])]
