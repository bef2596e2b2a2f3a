"""Lowerings of ONNX neural-network ops: Conv, ConvTranspose, MatMul, Gemm, Softmax, LayerNormalization,
MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.

Exactness against onnxruntime (float32): MaxPool is exact. Contractions (Conv, MatMul, Gemm) and sums
(AveragePool, LayerNormalization, Softmax) accumulate in a different order on XLA than in MLAS, so they
agree to a few ulp of the accumulated magnitude, not bit for bit. The formulas are onnxruntime's:
Softmax subtracts the max and multiplies by the reciprocal of the sum; LayerNormalization uses
var = E[x²] - E[x]² and divides by sqrt(var + eps) in f32; AveragePool divides each window's sum by
the count onnxruntime uses (explicit pads counted with count_include_pad=1, ceil-mode overhang never).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.onnx import absent_positions, op_default_opset
from qconvert.ir.types import element_type_of
from qconvert.onnx_semantics import (
    Window,
    conv_transpose_padding,
    softmax_axis,
    softmax_matrix,
    window_geometry,
)

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import lowers_folding, static_shape
from .onnx_reduce import lowest, reduce_max, reduce_sum
from .onnx_shape import by_rule, normalize_axis, reverse


def window_of(
    ctx: LoweringContext,
    op: Operation,
    spatial_shape: Sequence[int],
    kernel: Sequence[int],
    ceil_mode: bool = False,
) -> Window:
    """onnx_semantics' window geometry of `op` (its strides, dilations, pads and auto_pad attributes)."""
    try:
        return window_geometry(
            spatial_shape,
            kernel,
            strides=ctx.integer_list(op, "strides", []),
            dilations=ctx.integer_list(op, "dilations", []),
            pads=ctx.integer_list(op, "pads", []),
            auto_pad=str(ctx.attribute(op, "auto_pad", "NOTSET")),
            ceil_mode=ceil_mode,
        )
    except ValueError as error:
        ctx.unsupported(str(error))


def window_padding(
    ctx: LoweringContext,
    op: Operation,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> list[tuple[int, int]]:
    """(low, high) padding per spatial dim from `pads` or `auto_pad` (onnx_semantics' rule)."""
    auto_pad = str(ctx.attribute(op, "auto_pad", "NOTSET"))
    pads = ctx.integer_list(op, "pads", [])
    try:
        return window_geometry(sizes, kernel, strides, dilations, pads, auto_pad).padding
    except ValueError as error:
        ctx.unsupported(str(error))


def add_channel_bias(ctx: LoweringContext, y: Value, bias: Value | None) -> Value:
    """y + bias broadcast along dim 1 (the channel dim of NC<spatial>)."""
    if bias is None:
        return y
    shape = hlo.tensor_type(y).shape
    return hlo.add(ctx.builder, y, hlo.broadcast_in_dim(ctx.builder, bias, shape, [1]))


@lowers_folding("onnx.Conv")
def lower_conv(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, w, bias = ctx.input(op, 0), ctx.input(op, 1), ctx.input(op, 2)
    assert x is not None and w is not None
    x_shape = static_shape(ctx, x, "Conv's input")
    w_shape = static_shape(ctx, w, "Conv's weight")
    spatial = len(x_shape) - 2
    kernel = list(w_shape[2:])
    strides = ctx.integer_list(op, "strides", [1] * spatial)
    dilations = ctx.integer_list(op, "dilations", [1] * spatial)
    padding = window_padding(ctx, op, x_shape[2:], kernel, strides, dilations)
    y = hlo.convolution(
        ctx.builder,
        x,
        w,
        window_strides=strides,
        padding=padding,
        rhs_dilation=dilations,
        feature_group_count=int(ctx.attribute(op, "group", 1)),  # type: ignore[arg-type]
    )
    return [add_channel_bias(ctx, y, bias)]


@lowers_folding("onnx.ConvTranspose")
def lower_conv_transpose(ctx: LoweringContext, op: Operation) -> list[Value]:
    """A convolution of the input dilated by the strides with the flipped, in/out-swapped kernel."""
    x, w, bias = ctx.input(op, 0), ctx.input(op, 1), ctx.input(op, 2)
    assert x is not None and w is not None
    x_shape = static_shape(ctx, x, "ConvTranspose's input")
    w_shape = static_shape(ctx, w, "ConvTranspose's weight")
    spatial = len(x_shape) - 2
    group = int(ctx.attribute(op, "group", 1))  # type: ignore[arg-type]
    kernel = list(w_shape[2:])
    strides = ctx.integer_list(op, "strides", [1] * spatial)
    dilations = ctx.integer_list(op, "dilations", [1] * spatial)
    output_padding = ctx.integer_list(op, "output_padding", [0] * spatial)
    output_shape = ctx.attribute(op, "output_shape")
    try:
        pads = conv_transpose_padding(
            x_shape[2:],
            kernel,
            strides,
            dilations,
            output_padding,
            ctx.integer_list(op, "pads", []),
            str(ctx.attribute(op, "auto_pad", "NOTSET")),
            None if output_shape is None else [int(v) for v in output_shape],  # type: ignore[union-attr]
        )
    except ValueError as error:
        ctx.unsupported(str(error))
    pads_begin, pads_end = [begin for begin, _ in pads], [end for _, end in pads]
    # Kernel (C, M/g, k...) -> (M, C/g, k...), flipped spatially.
    channels, per_group_out = w_shape[0], w_shape[1]
    b = ctx.builder
    grouped = hlo.reshape(b, w, [group, channels // group, per_group_out, *kernel])
    swapped = hlo.transpose(b, grouped, [0, 2, 1, *range(3, 3 + spatial)])
    kernel_value = hlo.reshape(b, swapped, [group * per_group_out, channels // group, *kernel])
    kernel_value = reverse(ctx, kernel_value, list(range(2, 2 + spatial)))
    padding = []
    for i in range(spatial):
        reach = (kernel[i] - 1) * dilations[i]
        padding.append((reach - pads_begin[i], reach - pads_end[i] + output_padding[i]))
    y = hlo.convolution(
        b,
        x,
        kernel_value,
        window_strides=[1] * spatial,
        padding=padding,
        lhs_dilation=strides,
        rhs_dilation=dilations,
        feature_group_count=group,
    )
    return [add_channel_bias(ctx, y, bias)]


def matmul(ctx: LoweringContext, lhs: Value, rhs: Value) -> Value:
    """numpy.matmul: 1-D operands get a dim added then removed; batch dims broadcast."""
    b = ctx.builder
    lhs_shape, rhs_shape = hlo.tensor_type(lhs).shape, hlo.tensor_type(rhs).shape
    lhs_vector, rhs_vector = len(lhs_shape) == 1, len(rhs_shape) == 1
    if lhs_vector:
        lhs = hlo.reshape(b, lhs, [1, lhs_shape[0]])
    if rhs_vector:
        rhs = hlo.reshape(b, rhs, [rhs_shape[0], 1])
    lhs_shape, rhs_shape = hlo.tensor_type(lhs).shape, hlo.tensor_type(rhs).shape
    if len(rhs_shape) == 2:
        # The common weight case: contract lhs's last dim with rhs's first, no batching needed.
        result = hlo.dot_general(b, lhs, rhs, lhs_contracting=[len(lhs_shape) - 1], rhs_contracting=[0])
    else:
        batch = tuple(np.broadcast_shapes(lhs_shape[:-2], rhs_shape[:-2]))
        lhs = ctx.broadcast_to(lhs, (*batch, *lhs_shape[-2:]))
        rhs = ctx.broadcast_to(rhs, (*batch, *rhs_shape[-2:]))
        batch_dims = list(range(len(batch)))
        result = hlo.dot_general(
            b,
            lhs,
            rhs,
            lhs_batching=batch_dims,
            rhs_batching=batch_dims,
            lhs_contracting=[len(batch) + 1],
            rhs_contracting=[len(batch)],
        )
    shape = list(hlo.tensor_type(result).shape)
    if lhs_vector:
        shape.pop(-2)
    if rhs_vector:
        shape.pop(-1)
    if shape != list(hlo.tensor_type(result).shape):
        result = hlo.reshape(b, result, shape)
    return result


@lowers_folding("onnx.MatMul")
def lower_matmul(ctx: LoweringContext, op: Operation) -> list[Value]:
    lhs, rhs = ctx.operands(op)
    return [matmul(ctx, lhs, rhs)]


@lowers_folding("onnx.Gemm")
def lower_gemm(ctx: LoweringContext, op: Operation) -> list[Value]:
    a, w, c = ctx.input(op, 0), ctx.input(op, 1), ctx.input(op, 2)
    assert a is not None and w is not None
    b = ctx.builder
    element = element_type_of(a.type)
    # Contract A's K dim with B's K dim: transA / transB only pick which dim that is.
    a_contract = 0 if int(ctx.attribute(op, "transA", 0)) else 1  # type: ignore[arg-type]
    w_contract = 1 if int(ctx.attribute(op, "transB", 0)) else 0  # type: ignore[arg-type]
    y = hlo.dot_general(b, a, w, lhs_contracting=[a_contract], rhs_contracting=[w_contract])
    shape = hlo.tensor_type(y).shape
    alpha = float(ctx.attribute(op, "alpha", 1.0))  # type: ignore[arg-type]
    beta = float(ctx.attribute(op, "beta", 1.0))  # type: ignore[arg-type]
    if alpha != 1.0:
        y = hlo.multiply(b, y, ctx.splat(alpha, element, shape))
    if c is not None and beta != 0.0:
        c = ctx.broadcast_to(c, shape)
        if beta != 1.0:
            c = hlo.multiply(b, c, ctx.splat(beta, element, shape))
        y = hlo.add(b, y, c)
    return [y]


def softmax_last(ctx: LoweringContext, x: Value, axis: int) -> Value:
    """Softmax along `axis`: exp(x - max) * (1 / sum), as onnxruntime's MLAS kernel computes it."""
    b = ctx.builder
    shape = hlo.tensor_type(x).shape
    element = element_type_of(x.type)
    keep = [d for d in range(len(shape)) if d != axis]
    peak = hlo.broadcast_in_dim(b, reduce_max(ctx, x, [axis]), shape, keep)
    exponentials = hlo.exponential(b, hlo.subtract(b, x, peak))
    total = reduce_sum(ctx, exponentials, [axis])
    reciprocal = hlo.exact_divide(ctx.builder, ctx.splat(1.0, element, hlo.tensor_type(total).shape), total)
    return hlo.multiply(b, exponentials, hlo.broadcast_in_dim(b, reciprocal, shape, keep))


def along_axis(
    ctx: LoweringContext, op: Operation, x: Value, function: Callable[[Value, int], Value]
) -> Value:
    """Apply `function(x, axis)` at the op's `axis`: opset >= 13 along that axis (default -1); before,
    on x coerced to 2-D [prod(shape[:axis]), prod(shape[axis:])] (default axis 1), as Softmax does."""
    shape = static_shape(ctx, x, f"{op.name.removeprefix('onnx.')}'s input")
    rank = len(shape)
    opset = op_default_opset(op)
    given = ctx.attribute(op, "axis")
    axis = by_rule(ctx, softmax_axis, None if given is None else int(given), rank, opset)  # type: ignore[arg-type]
    matrix = softmax_matrix(shape, axis, opset)
    if matrix is None:
        return function(x, axis)
    b = ctx.builder
    flat = hlo.reshape(b, x, list(matrix))
    return hlo.reshape(b, function(flat, 1), shape)


@lowers_folding("onnx.Softmax")
def lower_softmax(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    return [along_axis(ctx, op, x, lambda value, axis: softmax_last(ctx, value, axis))]


@lowers_folding("onnx.LayerNormalization")
def lower_layer_norm(ctx: LoweringContext, op: Operation) -> list[Value]:
    """onnxruntime's formula, in the input type: mean = Σx/N, var = Σx²/N - mean², y = (x - mean) /
    sqrt(var + eps) * scale + bias; the optional Mean and InvStdDev = 1 / sqrt(var + eps) outputs keep
    the normalized dims as 1."""
    x, scale, bias = ctx.input(op, 0), ctx.input(op, 1), ctx.input(op, 2)
    assert x is not None and scale is not None
    b = ctx.builder
    shape = static_shape(ctx, x, "LayerNormalization's input")
    element = element_type_of(x.type)
    rank = len(shape)
    axis = normalize_axis(ctx, int(ctx.attribute(op, "axis", -1)), rank)  # type: ignore[arg-type]
    axes = list(range(axis, rank))
    outer = list(range(axis))
    count = int(np.prod(shape[axis:]))
    epsilon = float(ctx.attribute(op, "epsilon", 1e-5))  # type: ignore[arg-type]
    reduced_shape = shape[:axis]

    def per_row(total: Value) -> Value:
        return hlo.exact_divide(ctx.builder, total, ctx.splat(count, element, reduced_shape))

    mean = per_row(reduce_sum(ctx, x, axes))
    mean_square = per_row(reduce_sum(ctx, hlo.multiply(b, x, x), axes))
    variance = hlo.subtract(b, mean_square, hlo.multiply(b, mean, mean))
    deviation = hlo.sqrt(b, hlo.add(b, variance, ctx.splat(epsilon, element, reduced_shape)))
    centered = hlo.subtract(b, x, hlo.broadcast_in_dim(b, mean, shape, outer))
    y = hlo.exact_divide(ctx.builder, centered, hlo.broadcast_in_dim(b, deviation, shape, outer))
    y = hlo.multiply(b, y, ctx.broadcast_to(scale, shape))
    if bias is not None:
        y = hlo.add(b, y, ctx.broadcast_to(bias, shape))
    if len(op.results) == 1:
        return [y]
    kept = [*reduced_shape, *([1] * len(axes))]
    statistics = {
        1: hlo.reshape(b, mean, kept),
        2: hlo.reshape(b, hlo.exact_divide(b, ctx.splat(1.0, element, reduced_shape), deviation), kept),
    }
    absent = absent_positions(op, "outputs")
    present = [p for p in range(len(op.results) + len(absent)) if p not in absent]
    return [y, *(statistics[p] for p in present[1:])]


def pool_geometry(
    ctx: LoweringContext, op: Operation, shape: Sequence[int]
) -> tuple[list[int], list[int], list[int], list[tuple[int, int]], list[int]]:
    """kernel, strides, dilations, explicit padding and the extra high padding ceil_mode adds."""
    kernel = ctx.integer_list(op, "kernel_shape", [])
    ceil_mode = bool(ctx.attribute(op, "ceil_mode", 0))
    geometry = window_of(ctx, op, shape[2:], kernel, ceil_mode)
    padding, extra = geometry.padding, geometry.overhang(shape[2:])
    return list(geometry.kernel), list(geometry.strides), list(geometry.dilations), padding, extra


@lowers_folding("onnx.MaxPool")
def lower_max_pool(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    shape = static_shape(ctx, x, "MaxPool's input")
    kernel, strides, dilations, padding, extra = pool_geometry(ctx, op, shape)
    element = element_type_of(x.type)
    full_padding = [(0, 0), (0, 0), *((lo, hi + e) for (lo, hi), e in zip(padding, extra))]
    if len(op.results) > 1:  # the Indices output: onnx_pool_indices.py
        from .onnx_pool_indices import max_pool_with_indices

        storage_order = int(ctx.attribute(op, "storage_order", 0))  # type: ignore[arg-type]
        return max_pool_with_indices(
            ctx, x, [1, 1, *kernel], [1, 1, *strides], [1, 1, *dilations], full_padding, storage_order
        )
    y = hlo.reduce_window(
        ctx.builder,
        x,
        ctx.scalar(lowest(element), element),
        window_dimensions=[1, 1, *kernel],
        window_strides=[1, 1, *strides],
        padding=full_padding,
        window_dilations=[1, 1, *dilations],
        body=hlo.maximum,
    )
    return [y]


def window_counts(
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    extra: Sequence[int],
    include_pad: bool,
    dilations: Sequence[int] | None = None,
) -> np.ndarray:
    """Per output position, the divisor onnxruntime uses: the window's taps (every `dilation`-th element)
    on the input (count_include_pad=0) or on the input plus its explicit pads (=1); ceil-mode overhang
    never counts."""
    per_dim = []
    for index, (size, k, s, (low, high), e) in enumerate(zip(sizes, kernel, strides, padding, extra)):
        d = 1 if dilations is None else dilations[index]
        out = (size + low + high + e - ((k - 1) * d + 1)) // s + 1
        taps = (np.arange(out) * s - low)[:, None] + np.arange(k)[None, :] * d
        first, last = (-low, size + high) if include_pad else (0, size)
        per_dim.append(np.sum((taps >= first) & (taps < last), axis=1))
    counts = per_dim[0]
    for counted in per_dim[1:]:
        counts = np.multiply.outer(counts, counted)
    return counts


@lowers_folding("onnx.AveragePool")
def lower_average_pool(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    shape = static_shape(ctx, x, "AveragePool's input")
    kernel, strides, dilations, padding, extra = pool_geometry(ctx, op, shape)
    element = element_type_of(x.type)
    b = ctx.builder
    full_padding = [(0, 0), (0, 0), *((lo, hi + e) for (lo, hi), e in zip(padding, extra))]
    total = hlo.reduce_window(
        b,
        x,
        ctx.scalar(0, element),
        window_dimensions=[1, 1, *kernel],
        window_strides=[1, 1, *strides],
        padding=full_padding,
        body=hlo.add,
        window_dilations=[1, 1, *dilations],
    )
    include_pad = bool(int(ctx.attribute(op, "count_include_pad", 0)))  # type: ignore[arg-type]
    counts = window_counts(shape[2:], kernel, strides, padding, extra, include_pad, dilations)
    out_shape = hlo.tensor_type(total).shape
    divisor = hlo.broadcast_in_dim(b, ctx.constant(counts, element), out_shape, list(range(2, len(shape))))
    return [hlo.exact_divide(ctx.builder, total, divisor)]


@lowers_folding("onnx.GlobalAveragePool", "onnx.GlobalMaxPool")
def lower_global_pool(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    shape = static_shape(ctx, x, f"{op.name}'s input")
    b = ctx.builder
    spatial = list(range(2, len(shape)))
    if op.name == "onnx.GlobalMaxPool":
        reduced = reduce_max(ctx, x, spatial)
    else:
        element = element_type_of(x.type)
        count = int(np.prod(shape[2:]))
        total = reduce_sum(ctx, x, spatial)
        reduced = hlo.exact_divide(ctx.builder, total, ctx.splat(count, element, shape[:2]))
    return [hlo.reshape(b, reduced, [*shape[:2], *([1] * len(spatial))])]
