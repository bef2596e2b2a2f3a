"""Lowerings of ONNX Resize (opsets 10 to 19) and Upsample (opsets 7 and 9), with static scales or sizes.

The coordinate rules (`coordinate_transformation_mode`, `nearest_mode`, the linear taps and
weights) are computed at conversion time by qconvert/onnx_semantics.py in onnxruntime's float32
arithmetic, so the module holds only gathers with constant indices and, for linear, constant weights.
Nearest is exact. Bilinear (2-D inputs, H and W of NCHW or NHWC) is onnxruntime 1.32's kernel term by
term: the four corners times float32 coefficient grids, summed in its order, each product rounded
once (`rounded_product`): bit-exact on XLA and the interpreter, in float32 and for 8-bit integers
(QOperator models: computed in float32, truncated toward zero). Trilinear (3-D and 5-D inputs) is
computed axis by axis for floats (within a few ulp) and refused for integers.

Bicubic (float32, the last two dims) is onnxruntime's kernel term by term: along W the coefficients
divided by their sum times the four clamped neighbours, summed from 0; along H each row times its
coefficient, divided by the sum (exclude_outside), summed: bit-exact too.

Not lowered (refused with the reason): antialias, tf_crop_and_resize (roi and extrapolation), and
scales or sizes computed at run time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qconvert import onnx_semantics as semantics
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.onnx import op_default_opset
from qconvert.ir.types import F32, I64, FloatType, IntegerType, RankedTensorType, element_type_of

from . import ops as hlo
from .float32_rounding import rounded_product
from .lowering import LoweringContext
from .onnx_fold import constant_input, lowers_folding, static_shape


def take(ctx: LoweringContext, x: Value, indices: np.ndarray, axis: int) -> Value:
    """x's slices along `axis` at the constant `indices` (1-D), in that order."""
    shape = hlo.tensor_type(x).shape
    out_shape = list(shape)
    out_shape[axis] = len(indices)
    start = ctx.constant(np.asarray(indices, np.int64).reshape(-1, 1), I64)
    rank = len(shape)
    return hlo.gather(
        ctx.builder,
        x,
        start,
        RankedTensorType(tuple(out_shape), element_type_of(x.type)),
        offset_dims=[d for d in range(rank) if d != axis],
        collapsed_slice_dims=[axis],
        start_index_map=[axis],
        index_vector_dim=1,
        slice_sizes=[1 if d == axis else s for d, s in enumerate(shape)],
    )


def _product(ctx: LoweringContext, coefficient: np.ndarray, value: Value, dims: Sequence[int]) -> Value:
    """coefficient (a constant over `dims` of value's shape) * value, rounded once to value's type and
    kept from fusing into the next add (`rounded_product`: XLA:CPU contracts multiply-adds into FMAs),
    so the sums round as onnxruntime's."""
    element = element_type_of(value.type)
    shape = hlo.tensor_type(value).shape
    weights = hlo.broadcast_in_dim(ctx.builder, ctx.constant(coefficient, element), shape, dims)
    if element == F32:
        return rounded_product(ctx, weights, value)
    return hlo.multiply(ctx.builder, weights, value)


def _bilinear(ctx: LoweringContext, x: Value, output_shape: Sequence[int], scales: Sequence[float],
              axes: tuple[int, int], coordinate_mode: str) -> Value:  # fmt: skip
    """onnxruntime's bilinear kernel: the four corners' products, summed in its order."""
    input_shape = hlo.tensor_type(x).shape
    taps = []
    for axis in axes:
        try:
            coordinates = semantics.resize_source_coordinates(
                coordinate_mode, output_shape[axis], input_shape[axis], scales[axis]
            )
        except ValueError as error:
            ctx.unsupported(str(error))
        taps.append(semantics.resize_linear_taps(coordinates, input_shape[axis]))
    row_axis, column_axis = axes
    result = None
    for rows, columns, coefficient in semantics.bilinear_corners(taps[0], taps[1]):
        corner = take(ctx, take(ctx, x, rows, row_axis), columns, column_axis)
        term = _product(ctx, coefficient, corner, list(axes))
        result = term if result is None else hlo.add(ctx.builder, result, term)
    assert result is not None
    return result


def _separable(ctx: LoweringContext, x: Value, output_shape: Sequence[int], scales: Sequence[float],
               coordinate_mode: str) -> Value:  # fmt: skip
    """Linear taps axis by axis, the last axis first (trilinear inputs: within a few ulp of onnxruntime's
    eight-corner sum)."""
    input_shape = hlo.tensor_type(x).shape
    result = x
    for axis in reversed(range(len(input_shape))):
        size, out, scale = input_shape[axis], output_shape[axis], scales[axis]
        if size == out and scale == 1.0:
            continue
        try:
            coordinates = semantics.resize_source_coordinates(coordinate_mode, out, size, scale)
        except ValueError as error:
            ctx.unsupported(str(error))
        taps = semantics.resize_linear_taps(coordinates, size)
        low = _product(ctx, taps.low_weight, take(ctx, result, taps.low, axis), [axis])
        high = _product(ctx, taps.high_weight, take(ctx, result, taps.high, axis), [axis])
        result = hlo.add(ctx.builder, low, high)
    return result


def _bicubic(ctx: LoweringContext, x: Value, output_shape: Sequence[int], scales: Sequence[float],
             coordinate_mode: str, a: float, exclude_outside: bool) -> Value:  # fmt: skip
    """onnxruntime's bicubic kernel over the last two dims: along W, Σ (c / Σc) * x at the four clamped
    neighbours (from 0, left to right); along H, Σ (r * c) / Σc of those rows."""
    shape = hlo.tensor_type(x).shape
    rank = len(shape)
    row_axis, column_axis = rank - 2, rank - 1
    taps = []
    for axis in (row_axis, column_axis):
        try:
            coordinates = semantics.resize_source_coordinates(
                coordinate_mode, output_shape[axis], shape[axis], scales[axis]
            )
        except ValueError as error:
            ctx.unsupported(str(error))
        taps.append(semantics.resize_cubic_taps(coordinates, shape[axis], a, exclude_outside))
    rows, columns = taps
    b = ctx.builder
    column_weights = (columns.coefficients / columns.sums[None, :]).astype(np.float32)
    across = None
    for index, weight in zip(columns.indices, column_weights):
        term = _product(ctx, weight, take(ctx, x, index, column_axis), [column_axis])
        across = term if across is None else hlo.add(b, across, term)
    assert across is not None
    result = None
    for index, coefficient in zip(rows.indices, rows.coefficients):
        term = _product(ctx, coefficient, take(ctx, across, index, row_axis), [row_axis])
        if exclude_outside:
            sums = hlo.broadcast_in_dim(
                b, ctx.constant(rows.sums, F32), hlo.tensor_type(term).shape, [row_axis]
            )
            term = hlo.exact_divide(b, term, sums)
        result = term if result is None else hlo.add(b, result, term)
    assert result is not None
    return result


def resample(
    ctx: LoweringContext,
    x: Value,
    output_shape: Sequence[int],
    scales: Sequence[float],
    mode: str,
    coordinate_mode: str,
    nearest_mode: str,
    cubic: tuple[float, bool] = (-0.75, False),
) -> Value:
    """Resize `x` to `output_shape`: nearest axis by axis; linear as onnxruntime's kernels compute it,
    in float32 for integer inputs (8-bit QOperator tensors), truncated back toward zero."""
    input_shape = hlo.tensor_type(x).shape
    if mode == "nearest":
        result = x
        for axis in range(len(input_shape)):
            size, out, scale = input_shape[axis], output_shape[axis], scales[axis]
            if size == out and scale == 1.0:
                continue
            try:
                coordinates = semantics.resize_source_coordinates(coordinate_mode, out, size, scale)
                indices = semantics.resize_nearest_indices(coordinates, nearest_mode, scale, size)
            except ValueError as error:
                ctx.unsupported(str(error))
            result = take(ctx, result, indices, axis)
        return result
    element = element_type_of(x.type)
    if mode == "cubic":
        resized = [
            d for d in range(len(input_shape)) if input_shape[d] != output_shape[d] or scales[d] != 1.0
        ]
        if element != F32 or len(input_shape) not in (2, 4) or any(d < len(input_shape) - 2 for d in resized):
            ctx.unsupported(
                f"cubic Resize of {element} {list(input_shape)} with scales {list(scales)} (onnxruntime's "
                "bicubic kernel: float32, the last two dims of a 2-D or 4-D input)"
            )
        return _bicubic(ctx, x, output_shape, scales, coordinate_mode, *cubic)
    is_integer = isinstance(element, IntegerType)
    source = ctx.convert(x, F32) if is_integer else x
    axes = semantics.linear_interpolation_axes(scales)
    unchanged = axes is not None and all(
        input_shape[d] == output_shape[d] for d in range(len(input_shape)) if d not in axes
    )
    if axes is not None and len(axes) == 2 and unchanged:
        result = _bilinear(ctx, source, output_shape, scales, (axes[0], axes[1]), coordinate_mode)
    elif is_integer:
        ctx.unsupported(f"linear Resize of {element} with scales {list(scales)} (only bilinear is exact)")
    else:
        result = _separable(ctx, source, output_shape, scales, coordinate_mode)
    return ctx.convert(result, element) if is_integer else result


def _floats(array: np.ndarray | None) -> list[float] | None:
    return None if array is None or array.size == 0 else [float(v) for v in np.asarray(array).reshape(-1)]


@lowers_folding("onnx.Resize", "onnx.Upsample")
def lower_resize(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    input_shape = static_shape(ctx, x, f"{op.name}'s input")
    rank = len(input_shape)
    opset = op_default_opset(op)
    is_resize = op.name == "onnx.Resize"
    mode = str(ctx.attribute(op, "mode", "nearest"))
    if mode == "bilinear":  # Upsample-7 spelled linear this way in some exporters
        mode = "linear"
    if mode not in ("nearest", "linear", "cubic"):
        ctx.unsupported(f"{op.name} mode={mode!r}")
    if int(ctx.attribute(op, "antialias", 0)):  # type: ignore[arg-type]
        ctx.unsupported("Resize with antialias=1")
    modern = is_resize and opset >= 11
    coordinate_mode = (
        str(ctx.attribute(op, "coordinate_transformation_mode", "half_pixel")) if modern else "asymmetric"
    )
    nearest_mode = str(ctx.attribute(op, "nearest_mode", "round_prefer_floor")) if modern else "simple"
    if coordinate_mode == "tf_crop_and_resize":
        ctx.unsupported("Resize coordinate_transformation_mode='tf_crop_and_resize' (roi, extrapolation)")
    element = element_type_of(x.type)
    if mode == "linear" and isinstance(element, FloatType) and element.name not in ("f32", "f64"):
        ctx.unsupported(f"linear {op.name} of {element} (onnxruntime's float32 weights are lowered for f32)")

    axes_attribute = ctx.attribute(op, "axes")
    axes = None if axes_attribute is None else [int(a) for a in axes_attribute]  # type: ignore[union-attr]
    scales_position, sizes_position = (2, 3) if modern else (1, None)
    scales: list[float] | None
    if op.name == "onnx.Upsample" and "scales" in op.attributes:  # Upsample-7
        scales = [float(s) for s in ctx.attribute(op, "scales")]  # type: ignore[union-attr]
    else:
        scales_array = constant_input(ctx, op, scales_position)
        if scales_array is None and ctx.source_input(op, scales_position) is not None:
            ctx.unsupported(f"{op.name}'s scales are computed at run time (StableHLO needs them static)")
        scales = _floats(scales_array)  # an empty scales input means: use sizes
    sizes = None
    if scales is None and sizes_position is not None and ctx.source_input(op, sizes_position) is not None:
        sizes_array = constant_input(ctx, op, sizes_position)
        if sizes_array is None:
            ctx.unsupported("Resize's sizes are computed at run time (StableHLO needs them static)")
        sizes = [int(v) for v in np.asarray(sizes_array).reshape(-1)]
    if scales is None and sizes is None:
        ctx.unsupported(f"{op.name} has neither scales nor sizes")

    try:
        if scales is not None:
            full_scales = semantics.resize_scales(input_shape, input_shape, scales, axes)
            output_shape = semantics.resize_output_shape(input_shape, full_scales)
        else:
            assert sizes is not None
            axes_list = list(range(rank)) if not axes else semantics.normalize_axes(axes, rank)
            wanted = list(input_shape)
            for axis, size in zip(axes_list, sizes, strict=True):
                wanted[axis] = size
            policy = str(ctx.attribute(op, "keep_aspect_ratio_policy", "stretch"))
            if policy == "stretch":
                output_shape = wanted
                full_scales = semantics.resize_scales(input_shape, output_shape, None)
            else:
                full_scales, output_shape = semantics.aspect_ratio_scales(
                    input_shape, wanted, axes_list, policy
                )
    except ValueError as error:
        ctx.unsupported(f"{op.name}: {error}")
    if any(s <= 0 for s in full_scales):
        ctx.unsupported(f"{op.name} scales {full_scales} (must be positive)")

    cubic = (
        float(ctx.attribute(op, "cubic_coeff_a", -0.75)),  # type: ignore[arg-type]
        bool(int(ctx.attribute(op, "exclude_outside", 0))),  # type: ignore[arg-type]
    )
    return [resample(ctx, x, output_shape, full_scales, mode, coordinate_mode, nearest_mode, cubic)]
