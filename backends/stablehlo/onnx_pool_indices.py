"""MaxPool's Indices output and MaxUnpool, the pair SegNet-style models export.

MaxPool with Indices is one variadic `stablehlo.reduce_window` over (value, flat index) pairs: the larger
value wins, equal values go to the smaller row-major index, as onnxruntime's kernel keeps the first
maximum it meets in row-major order (strictly greater replaces), whatever the storage order. Indices
count in the whole input tensor, row-major (storage_order=0) or with the spatial dims column-major
(storage_order=1, mapped from the row-major winner by a gather). Padding never wins (it holds -inf and an
index past the end). MaxUnpool scatters each value to its index in a zero tensor of the output shape
(duplicate indices are undefined in ONNX). Both are exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qconvert.ir.attributes import DenseElementsAttr
from qconvert.ir.core import Builder, GenericOp, Operation, Value
from qconvert.ir.types import I64, RankedTensorType, element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import constant_input, lowers_folding, static_shape
from .onnx_index import block_region, scatter
from .onnx_reduce import lowest


def flat_indices(shape: Sequence[int], storage_order: int) -> np.ndarray:
    """Each element's ONNX MaxPool index: row-major over the whole tensor, or (storage_order=1) with the
    spatial dims in column-major order."""
    if storage_order == 0:
        return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    batch_channel = int(np.prod(shape[:2]))
    spatial = tuple(shape[2:])
    per_plane = np.arange(int(np.prod(spatial)), dtype=np.int64).reshape(spatial[::-1]).transpose()
    planes = np.arange(batch_channel, dtype=np.int64).reshape(*shape[:2], *([1] * len(spatial)))
    return planes * int(np.prod(spatial)) + per_plane


def max_pool_with_indices(
    ctx: LoweringContext,
    x: Value,
    window: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    padding: Sequence[tuple[int, int]],
    storage_order: int,
) -> list[Value]:
    """(max values, their indices) over the windows; full-rank window parameters."""
    type_ = hlo.tensor_type(x)
    element = type_.element_type
    if storage_order not in (0, 1):
        ctx.unsupported(f"MaxPool storage_order={storage_order}")
    b = ctx.builder
    # Ties go to the first maximum in row-major order whatever the storage order: reduce over row-major
    # indices, then map them to the storage order's.
    indices = ctx.constant(flat_indices(type_.shape, 0), I64)
    past_end = int(np.prod(type_.shape))
    scalar, scalar_index = RankedTensorType((), element), RankedTensorType((), I64)

    def pick(inner: Builder, args: list[Value]) -> list[Value]:
        value_a, index_a, value_b, index_b = args
        greater = hlo.compare(inner, "GT", value_b, value_a)
        tie = hlo.and_(
            inner, hlo.compare(inner, "EQ", value_b, value_a), hlo.compare(inner, "LT", index_b, index_a)
        )
        take_b = hlo.or_(inner, greater, tie)
        return [hlo.select(inner, take_b, value_b, value_a), hlo.select(inner, take_b, index_b, index_a)]

    rank = type_.rank
    out_shape = []
    for i in range(rank):
        size = type_.shape[i] + padding[i][0] + padding[i][1]
        extent = (window[i] - 1) * dilations[i] + 1
        out_shape.append((size - extent) // strides[i] + 1 if size >= extent else 0)
    pads = np.asarray(padding, dtype=np.int64).reshape(rank, 2)
    attributes = {
        "window_dimensions": hlo.i64_array(window),
        "window_strides": hlo.i64_array(strides),
        "window_dilations": hlo.i64_array(dilations),
        "base_dilations": hlo.i64_array([1] * rank),
        "padding": DenseElementsAttr(pads, RankedTensorType((rank, 2), I64)),
    }
    region = block_region([scalar, scalar_index, scalar, scalar_index], pick)
    op = b.insert(
        GenericOp(
            "stablehlo.reduce_window",
            [x, indices, ctx.scalar(lowest(element), element), ctx.scalar(past_end, I64)],
            [RankedTensorType(tuple(out_shape), element), RankedTensorType(tuple(out_shape), I64)],
            attributes,
            [region],
        )
    )
    values, chosen = op.results
    if storage_order == 1:
        table = ctx.constant(flat_indices(type_.shape, 1).reshape(-1), I64)
        chosen = hlo.gather(
            b,
            table,
            hlo.reshape(b, chosen, [*out_shape, 1]),
            RankedTensorType(tuple(out_shape), I64),
            offset_dims=[],
            collapsed_slice_dims=[0],
            start_index_map=[0],
            index_vector_dim=rank,
            slice_sizes=[1],
        )
    return [values, chosen]


@lowers_folding("onnx.MaxUnpool")
def lower_max_unpool(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, indices = ctx.input(op, 0), ctx.input(op, 1)
    assert x is not None and indices is not None
    shape = static_shape(ctx, x, "MaxUnpool's input")
    wanted = constant_input(ctx, op, 2)
    if wanted is None and ctx.source_input(op, 2) is not None:
        ctx.unsupported("MaxUnpool's output_shape is computed at run time (StableHLO needs it static)")
    if wanted is None:
        out_shape = ctx.result_type(op).shape
    else:
        out_shape = tuple(int(v) for v in np.asarray(wanted).reshape(-1))
    element = element_type_of(x.type)
    b = ctx.builder
    total = int(np.prod(out_shape))
    count = int(np.prod(shape))
    flat_values = hlo.reshape(b, x, [count])
    flat_targets = hlo.reshape(b, ctx.convert(indices, I64), [count, 1])
    zeros = ctx.splat(0, element, [total])
    scattered = scatter(
        ctx, op, zeros, flat_targets, flat_values,
        update_window_dims=[], inserted_window_dims=[0], scatter_dims_to_operand_dims=[0], index_vector_dim=1,
    )  # fmt: skip
    return [hlo.reshape(b, scattered, list(out_shape))]
