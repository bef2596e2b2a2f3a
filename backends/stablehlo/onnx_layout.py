"""Lowerings of ONNX Pad (constant, reflect, edge, wrap; pads as attribute or input, axes of opset 18),
SpaceToDepth and DepthToSpace (DCR and CRD). All are exact: they only move data.

Negative pads crop, in every mode (the crop comes first, as onnxruntime applies it). Reflect and wrap
need pads no larger than the (cropped) dim, minus one for reflect, as ONNX requires.
"""

from __future__ import annotations

from collections.abc import Sequence

from qconvert import onnx_semantics as semantics
from qconvert.ir.core import Operation, Value
from qconvert.ir.types import element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import lowers_folding, static_shape
from .onnx_shape import required_constant, reverse


def _slice_axis(ctx: LoweringContext, x: Value, axis: int, start: int, stop: int) -> Value:
    shape = hlo.tensor_type(x).shape
    begin, limit = [0] * len(shape), list(shape)
    begin[axis], limit[axis] = start, stop
    return hlo.slice_(ctx.builder, x, begin, limit, [1] * len(shape))


def _pad_axis(ctx: LoweringContext, x: Value, axis: int, low: int, high: int, mode: str) -> Value:
    """Pad one axis by non-negative amounts in reflect, edge or wrap mode."""
    size = hlo.tensor_type(x).shape[axis]
    limit = size - 1 if mode == "reflect" else size
    if low > limit or high > limit:
        ctx.unsupported(f"Pad mode={mode!r} by ({low}, {high}) on an axis of {size}")
    pieces: list[Value] = []
    if low:
        if mode == "reflect":
            pieces.append(reverse(ctx, _slice_axis(ctx, x, axis, 1, low + 1), [axis]))
        elif mode == "edge":
            edge = _slice_axis(ctx, x, axis, 0, 1)
            shape = list(hlo.tensor_type(x).shape)
            shape[axis] = low
            pieces.append(ctx.broadcast_to(edge, shape))
        else:  # wrap
            pieces.append(_slice_axis(ctx, x, axis, size - low, size))
    pieces.append(x)
    if high:
        if mode == "reflect":
            pieces.append(reverse(ctx, _slice_axis(ctx, x, axis, size - 1 - high, size - 1), [axis]))
        elif mode == "edge":
            edge = _slice_axis(ctx, x, axis, size - 1, size)
            shape = list(hlo.tensor_type(x).shape)
            shape[axis] = high
            pieces.append(ctx.broadcast_to(edge, shape))
        else:
            pieces.append(_slice_axis(ctx, x, axis, 0, high))
    return pieces[0] if len(pieces) == 1 else hlo.concatenate(ctx.builder, pieces, axis)


def pad(ctx: LoweringContext, x: Value, amounts: Sequence[tuple[int, int]], mode: str, value: Value) -> Value:
    """`x` padded by (low, high) per dim in `mode`; `value` (a scalar) fills constant padding."""
    shape = hlo.tensor_type(x).shape
    rank = len(shape)
    if mode == "constant":
        low, high = [lo for lo, _ in amounts], [hi for _, hi in amounts]
        return hlo.pad(ctx.builder, x, value, low, high)
    # Crop the negative amounts first, then pad the rest.
    begin = [max(-lo, 0) for lo, _ in amounts]
    limit = [d - max(-hi, 0) for d, (_, hi) in zip(shape, amounts)]
    if any(b > 0 for b in begin) or list(limit) != list(shape):
        x = hlo.slice_(ctx.builder, x, begin, limit, [1] * rank)
    for axis, (low, high) in enumerate(amounts):
        if low > 0 or high > 0:
            x = _pad_axis(ctx, x, axis, max(low, 0), max(high, 0), mode)
    return x


@lowers_folding("onnx.Pad")
def lower_pad(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "Pad's input")
    rank = len(shape)
    element = element_type_of(x.type)
    mode = str(ctx.attribute(op, "mode", "constant"))
    if mode not in ("constant", "reflect", "edge", "wrap"):
        ctx.unsupported(f"Pad mode={mode!r}")
    if "pads" in op.attributes or "paddings" in op.attributes:  # opset < 11
        pads = [int(v) for v in ctx.attribute(op, "pads", ctx.attribute(op, "paddings"))]  # type: ignore[union-attr]
        axes = None
        value = ctx.scalar(float(ctx.attribute(op, "value", 0.0)), element)  # type: ignore[arg-type]
    else:
        pads_array = required_constant(ctx, op, 1, "Pad's pads")
        assert pads_array is not None
        pads = [int(v) for v in pads_array]
        axes_array = required_constant(ctx, op, 3, "Pad's axes")
        axes = None if axes_array is None else [int(a) for a in axes_array]
        given = ctx.input(op, 2)
        value = ctx.scalar(0, element) if given is None else hlo.reshape(ctx.builder, given, [])
    try:
        amounts = semantics.pad_amounts(pads, rank, axes)
    except ValueError as error:
        ctx.unsupported(f"Pad: {error}")
    return [pad(ctx, x, amounts, mode, value)]


@lowers_folding("onnx.SpaceToDepth")
def lower_space_to_depth(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    n, c, h, w = static_shape(ctx, x, "SpaceToDepth's input")
    block = int(ctx.attribute(op, "blocksize"))  # type: ignore[arg-type]
    if h % block or w % block:
        ctx.unsupported(f"SpaceToDepth blocksize {block} for a {h}x{w} input")
    mode = str(ctx.attribute(op, "mode", "DCR"))  # the attribute exists since opset 28
    if mode not in ("DCR", "CRD"):
        ctx.unsupported(f"SpaceToDepth mode={mode!r}")
    b = ctx.builder
    split = hlo.reshape(b, x, [n, c, h // block, block, w // block, block])
    # DCR: output channel (bh * block + bw) * C + c; CRD: c * block² + bh * block + bw.
    permutation = [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4]
    moved = hlo.transpose(b, split, permutation)
    return [hlo.reshape(b, moved, [n, c * block * block, h // block, w // block])]


@lowers_folding("onnx.DepthToSpace")
def lower_depth_to_space(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    n, c, h, w = static_shape(ctx, x, "DepthToSpace's input")
    block = int(ctx.attribute(op, "blocksize"))  # type: ignore[arg-type]
    mode = str(ctx.attribute(op, "mode", "DCR"))
    if c % (block * block):
        ctx.unsupported(f"DepthToSpace blocksize {block} for {c} channels")
    depth = c // (block * block)
    b = ctx.builder
    if mode == "DCR":
        split = hlo.reshape(b, x, [n, block, block, depth, h, w])
        moved = hlo.transpose(b, split, [0, 3, 4, 1, 5, 2])
    elif mode == "CRD":
        split = hlo.reshape(b, x, [n, depth, block, block, h, w])
        moved = hlo.transpose(b, split, [0, 1, 4, 2, 5, 3])
    else:
        ctx.unsupported(f"DepthToSpace mode={mode!r}")
    return [hlo.reshape(b, moved, [n, depth, h * block, w * block])]
