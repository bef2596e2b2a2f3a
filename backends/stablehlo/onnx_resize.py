"""Lowerings of ONNX Resize (opsets 10 to 19) and Upsample (opsets 7 and 9), with static scales or sizes.

Resize is separable: each resized axis is an independent 1-D resampling. Its coordinate rule
(`coordinate_transformation_mode`, `nearest_mode`, the linear taps) is computed at conversion time by
qconvert/onnx_semantics.py, in onnxruntime's float32 arithmetic, so the module holds only gathers with
constant indices (nearest: exact) and, for linear, two gathers weighted by constant weights per axis,
the last axis first as onnxruntime's separable bilinear kernel does (within an ulp or two of the
output's magnitude: XLA:CPU may fuse each weighted sum into a multiply-add).

Not lowered (refused with the reason): cubic mode, antialias, tf_crop_and_resize (roi and
extrapolation), and scales or sizes computed at run time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qconvert import onnx_semantics as semantics
from qconvert.ir.core import Operation, Value
from qconvert.ir.types import I64, FloatType, RankedTensorType, element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import constant_input, lowers_folding, static_shape
from .onnx_nn import opset_version


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


def _weighted(ctx: LoweringContext, value: Value, weights: np.ndarray, axis: int) -> Value:
    element = element_type_of(value.type)
    shape = hlo.tensor_type(value).shape
    weight = hlo.broadcast_in_dim(ctx.builder, ctx.constant(weights, element), shape, [axis])
    return hlo.multiply(ctx.builder, weight, value)


def resample(
    ctx: LoweringContext,
    x: Value,
    output_shape: Sequence[int],
    scales: Sequence[float],
    mode: str,
    coordinate_mode: str,
    nearest_mode: str,
) -> Value:
    """Resize `x` to `output_shape` axis by axis, the last axis first."""
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
        if mode == "nearest":
            indices = semantics.resize_nearest_indices(coordinates, nearest_mode, scale, size)
            result = take(ctx, result, indices, axis)
            continue
        taps = semantics.resize_linear_taps(coordinates, size)
        low = _weighted(ctx, take(ctx, result, taps.low, axis), taps.low_weight, axis)
        high = _weighted(ctx, take(ctx, result, taps.high, axis), taps.high_weight, axis)
        result = hlo.add(ctx.builder, low, high)
    return result


def _floats(array: np.ndarray | None) -> list[float] | None:
    return None if array is None or array.size == 0 else [float(v) for v in np.asarray(array).reshape(-1)]


@lowers_folding("onnx.Resize", "onnx.Upsample")
def lower_resize(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    input_shape = static_shape(ctx, x, f"{op.name}'s input")
    rank = len(input_shape)
    opset = opset_version(op)
    is_resize = op.name == "onnx.Resize"
    mode = str(ctx.attribute(op, "mode", "nearest"))
    if mode == "bilinear":  # Upsample-7 spelled linear this way in some exporters
        mode = "linear"
    if mode not in ("nearest", "linear"):
        ctx.unsupported(f"{op.name} mode={mode!r} (nearest and linear are lowered)")
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
    if mode == "linear" and not (isinstance(element, FloatType) and element.name in ("f32", "f64")):
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
    return [resample(ctx, x, output_shape, full_scales, mode, coordinate_mode, nearest_mode)]
