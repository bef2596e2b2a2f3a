"""Lowerings of ONNX normalizations and softmax variants: BatchNormalization (inference),
InstanceNormalization, GroupNormalization, LRN, LogSoftmax, Hardmax.

The formulas are onnxruntime's CPU kernels':
- BatchNormalization: s = scale / sqrt(var + eps), y = x * s + (B - mean * s). Legacy attributes of
  older opsets (`momentum`, `is_test`, `spatial`, `consumed_inputs`) do not change inference: the
  statistics are the given mean and var; `spatial=0` gives parameters shaped like one sample
  (C x D1 x ...), which broadcast over the batch. Training mode (`training_mode=1`, or the running
  statistics outputs) is refused.
- InstanceNormalization: per (n, c), mean = Σx/N, var = Σ(x - mean)²/N, s = scale / sqrt(var + eps),
  y = x * s + (B - mean * s).
- GroupNormalization (opset 18 and 21): per (n, group), (x - mean) / sqrt(var + eps), then per channel
  (opset 21) or per group (opset 18) scale and bias.
- LogSoftmax: x - max - log(Σ exp(x - max)); Hardmax: 1 at the first maximum, else 0. Before opset
  13 both work on the input coerced to 2-D at `axis`, as Softmax does.

Products that feed an add are rounded on their own (`rounded_product`: XLA:CPU would fuse them into
a multiply-add), so BatchNormalization is onnxruntime's bit for bit; the others sum in another order
than onnxruntime and agree within a few ulp of the output's magnitude.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.onnx import op_default_opset
from qconvert.ir.types import I64, FloatType, RankedTensorType, element_type_of

from . import ops as hlo
from .float32_rounding import rounded_product
from .lowering import LoweringContext
from .onnx_fold import lowers_folding, static_shape
from .onnx_index import first_index_of_extreme
from .onnx_nn import along_axis
from .onnx_reduce import reduce_max, reduce_sum


def _per_channel(ctx: LoweringContext, value: Value, shape: Sequence[int]) -> Value:
    """A per-channel vector (C) or a per-sample tensor (C x D1 x ..., BatchNormalization spatial=0)
    broadcast to `shape` (N x C x D1 x ...)."""
    rank = hlo.tensor_type(value).rank
    return hlo.broadcast_in_dim(ctx.builder, value, shape, list(range(1, 1 + rank)))


def _scale_and_shift(
    ctx: LoweringContext, x: Value, scale: Value, shift: Value, shape: Sequence[int]
) -> Value:
    product = rounded_product(ctx, x, _per_channel(ctx, scale, shape))
    return hlo.add(ctx.builder, product, _per_channel(ctx, shift, shape))


def _inverse_deviation(ctx: LoweringContext, variance: Value, epsilon: float) -> Value:
    """1 / sqrt(var + eps), two roundings as onnxruntime computes it."""
    b = ctx.builder
    element, shape = element_type_of(variance.type), hlo.tensor_type(variance).shape
    deviation = hlo.sqrt(b, hlo.add(b, variance, ctx.splat(epsilon, element, shape)))
    return hlo.exact_divide(b, ctx.splat(1.0, element, shape), deviation)


@lowers_folding("onnx.BatchNormalization")
def lower_batch_norm(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, scale, bias, mean, variance = ctx.operands(op)[:5]
    if int(ctx.attribute(op, "training_mode", 0)):  # type: ignore[arg-type]
        ctx.unsupported("BatchNormalization with training_mode=1 (only inference is supported)")
    if len(op.results) > 1:
        ctx.unsupported("BatchNormalization's running / saved statistics outputs (training only)")
    shape = static_shape(ctx, x, "BatchNormalization's input")
    element = element_type_of(x.type)
    parameters = [hlo.tensor_type(v).shape for v in (scale, bias, mean, variance)]
    if any(p != tuple(shape[1 : 1 + len(p)]) or len(p) not in (1, len(shape) - 1) for p in parameters):
        ctx.unsupported(f"BatchNormalization parameters of shapes {parameters} for an input {list(shape)}")
    b = ctx.builder
    epsilon = float(ctx.attribute(op, "epsilon", 1e-5))  # type: ignore[arg-type]
    scale, bias, mean, variance = (ctx.convert(v, element) for v in (scale, bias, mean, variance))
    channel_scale = hlo.multiply(b, _inverse_deviation(ctx, variance, epsilon), scale)
    channel_shift = hlo.subtract(b, bias, rounded_product(ctx, mean, channel_scale))
    return [_scale_and_shift(ctx, x, channel_scale, channel_shift, shape)]


def _mean_and_variance(
    ctx: LoweringContext, x: Value, axes: Sequence[int], shape: Sequence[int]
) -> tuple[Value, Value]:
    """mean = Σx/N and var = Σ(x - mean)²/N over `axes` (the two-pass form), reduced shapes."""
    b = ctx.builder
    element = element_type_of(x.type)
    kept = [d for d in range(len(shape)) if d not in axes]
    reduced_shape = [shape[d] for d in kept]
    count = ctx.splat(float(np.prod([shape[a] for a in axes])), element, reduced_shape)
    mean = hlo.exact_divide(b, reduce_sum(ctx, x, axes), count)
    centered = hlo.subtract(b, x, hlo.broadcast_in_dim(b, mean, shape, kept))
    variance = hlo.exact_divide(b, reduce_sum(ctx, hlo.multiply(b, centered, centered), axes), count)
    return mean, variance


@lowers_folding("onnx.InstanceNormalization")
def lower_instance_norm(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, scale, bias = ctx.operands(op)
    shape = static_shape(ctx, x, "InstanceNormalization's input")
    b = ctx.builder
    epsilon = float(ctx.attribute(op, "epsilon", 1e-5))  # type: ignore[arg-type]
    spatial = list(range(2, len(shape)))
    mean, variance = _mean_and_variance(ctx, x, spatial, shape)  # (N, C)
    channel_scale = hlo.multiply(
        b, _inverse_deviation(ctx, variance, epsilon), ctx.broadcast_to(scale, shape[:2])
    )
    channel_shift = hlo.subtract(
        b, ctx.broadcast_to(bias, shape[:2]), rounded_product(ctx, mean, channel_scale)
    )
    product = rounded_product(ctx, x, hlo.broadcast_in_dim(b, channel_scale, shape, [0, 1]))
    return [hlo.add(b, product, hlo.broadcast_in_dim(b, channel_shift, shape, [0, 1]))]


@lowers_folding("onnx.GroupNormalization")
def lower_group_norm(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, scale, bias = ctx.operands(op)
    shape = static_shape(ctx, x, "GroupNormalization's input")
    element = element_type_of(x.type)
    if not isinstance(element, FloatType):
        ctx.unsupported(f"GroupNormalization of {element}")
    b = ctx.builder
    groups = int(ctx.attribute(op, "num_groups"))  # type: ignore[arg-type]
    epsilon = float(ctx.attribute(op, "epsilon", 1e-5))  # type: ignore[arg-type]
    if int(ctx.attribute(op, "stash_type", 1)) != 1:  # type: ignore[arg-type]
        ctx.unsupported("GroupNormalization with stash_type other than float32")
    batch, channels = shape[0], shape[1]
    if channels % groups:
        ctx.unsupported(f"GroupNormalization: {channels} channels in {groups} groups")
    grouped_shape = [batch, groups, int(np.prod(shape[1:])) // groups]
    grouped = hlo.reshape(b, x, grouped_shape)
    mean, variance = _mean_and_variance(ctx, grouped, [2], grouped_shape)
    deviation = hlo.sqrt(b, hlo.add(b, variance, ctx.splat(epsilon, element, [batch, groups])))
    centered = hlo.subtract(b, grouped, hlo.broadcast_in_dim(b, mean, grouped_shape, [0, 1]))
    normalized = hlo.exact_divide(b, centered, hlo.broadcast_in_dim(b, deviation, grouped_shape, [0, 1]))
    parameter_size = hlo.tensor_type(scale).shape[0]
    if parameter_size == channels:
        y = hlo.reshape(b, normalized, shape)
        return [_scale_and_shift(ctx, y, scale, bias, shape)]
    if parameter_size == groups and op_default_opset(op) < 21:
        # Opset 18: one scale and bias per group.
        y = hlo.add(
            b,
            hlo.multiply(b, normalized, hlo.broadcast_in_dim(b, scale, grouped_shape, [1])),
            hlo.broadcast_in_dim(b, bias, grouped_shape, [1]),
        )
        return [hlo.reshape(b, y, shape)]
    ctx.unsupported(f"GroupNormalization scale of {parameter_size} values for {channels} channels")


@lowers_folding("onnx.LogSoftmax")
def lower_log_softmax(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    b = ctx.builder

    def log_softmax(value: Value, axis: int) -> Value:
        shape = hlo.tensor_type(value).shape
        keep = [d for d in range(len(shape)) if d != axis]
        shifted = hlo.subtract(b, value, hlo.broadcast_in_dim(b, reduce_max(ctx, value, [axis]), shape, keep))
        total = reduce_sum(ctx, hlo.exponential(b, shifted), [axis])
        return hlo.subtract(b, shifted, hlo.broadcast_in_dim(b, hlo.log(b, total), shape, keep))

    return [along_axis(ctx, op, x, log_softmax)]


@lowers_folding("onnx.Hardmax")
def lower_hardmax(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    b = ctx.builder

    def hardmax(value: Value, axis: int) -> Value:
        type_ = hlo.tensor_type(value)
        keep = [d for d in range(type_.rank) if d != axis]
        index = first_index_of_extreme(ctx, value, axis, largest=True, last=False)
        positions = hlo.iota(b, RankedTensorType(type_.shape, I64), axis)
        chosen = hlo.compare(b, "EQ", positions, hlo.broadcast_in_dim(b, index, type_.shape, keep))
        element = element_type_of(value.type)
        return hlo.select(b, chosen, ctx.splat(1, element, type_.shape), ctx.splat(0, element, type_.shape))

    return [along_axis(ctx, op, x, hardmax)]


@lowers_folding("onnx.LRN")
def lower_lrn(ctx: LoweringContext, op: Operation) -> list[Value]:
    """onnxruntime's LRN: scale = bias + (alpha / size) * Σ x² over the channel window
    [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)], y = x * scale^(-beta)."""
    (x,) = ctx.operands(op)
    shape = static_shape(ctx, x, "LRN's input")
    element = element_type_of(x.type)
    b = ctx.builder
    size = int(ctx.attribute(op, "size"))  # type: ignore[arg-type]
    alpha = float(ctx.attribute(op, "alpha", 1e-4))  # type: ignore[arg-type]
    beta = float(ctx.attribute(op, "beta", 0.75))  # type: ignore[arg-type]
    bias = float(ctx.attribute(op, "bias", 1.0))  # type: ignore[arg-type]
    rank = len(shape)
    window = [size if d == 1 else 1 for d in range(rank)]
    padding = [((size - 1) // 2, size - 1 - (size - 1) // 2) if d == 1 else (0, 0) for d in range(rank)]
    squares = hlo.multiply(b, x, x)
    total = hlo.reduce_window(
        b, squares, ctx.scalar(0, element), window_dimensions=window, window_strides=[1] * rank,
        padding=padding, body=hlo.add,
    )  # fmt: skip
    alpha_over_size = float(np.float32(alpha) / np.float32(size))
    scale = hlo.add(
        b,
        ctx.splat(bias, element, shape),
        rounded_product(ctx, ctx.splat(alpha_over_size, element, shape), total),
    )
    return [hlo.multiply(b, x, hlo.power(b, scale, ctx.splat(-beta, element, shape)))]
