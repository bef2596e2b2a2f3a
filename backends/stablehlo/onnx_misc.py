"""Lowerings of ONNX ops whose result is known from types and constants: CastLike, EyeLike, and the
data-dependent ops NonZero, Compress and Unique, which StableHLO (static shapes) can hold only when their
data is a constant, then folded (NonZero) or turned into a gather of constant positions (Compress).
Otherwise each is refused with the reason: its output shape depends on the values at run time.
"""

from __future__ import annotations

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.types import element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_elementwise import ONNX_ELEMENT_TYPES
from .onnx_fold import constant_input, lowers_folding, static_shape
from .onnx_resize import take
from .onnx_shape import normalize_axis


@lowers_folding("onnx.CastLike")
def lower_cast_like(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Cast input 0 to input 1's element type, with Cast's rules (float -> int truncates); the types
    Cast lowers (no float8, no sub-byte integers)."""
    x, like = ctx.operands(op)
    target = element_type_of(like.type)
    if target not in ONNX_ELEMENT_TYPES.values():
        ctx.unsupported(f"CastLike to {target} (the StableHLO lowering covers numeric types without float8)")
    return [ctx.convert(x, target)]


@lowers_folding("onnx.EyeLike")
def lower_eye_like(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "EyeLike's input")
    if len(shape) != 2:
        ctx.unsupported(f"EyeLike of a rank-{len(shape)} input (ONNX requires 2-D)")
    dtype = ctx.attribute(op, "dtype")
    element = element_type_of(x.type) if dtype is None else ONNX_ELEMENT_TYPES.get(int(dtype))  # type: ignore[arg-type]
    if element is None:
        ctx.unsupported(f"EyeLike dtype={dtype}")
    k = int(ctx.attribute(op, "k", 0))  # type: ignore[arg-type]
    return [ctx.constant(np.eye(shape[0], shape[1], k), element)]


DATA_DEPENDENT = (
    "its output shape depends on the input values, known only at run time "
    "(StableHLO here needs static shapes)"
)


@lowers_folding("onnx.NonZero", "onnx.Unique")
def lower_data_dependent(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Reached only when `fold` could not run (NonZero of a computed tensor; Unique of floats)."""
    ctx.unsupported(f"{op.name.removeprefix('onnx.')}: {DATA_DEPENDENT}")


@lowers_folding("onnx.Compress")
def lower_compress(ctx: LoweringContext, op: Operation) -> list[Value]:
    """With a constant condition: the kept positions are constants, and Compress is a gather of them
    along `axis` (or of the flattened input when there is no axis)."""
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "Compress's input")
    condition = constant_input(ctx, op, 1)
    if condition is None:
        ctx.unsupported(f"Compress with a condition computed at run time: {DATA_DEPENDENT}")
    axis_attribute = ctx.attribute(op, "axis")
    if axis_attribute is None:
        x = hlo.reshape(ctx.builder, x, [int(np.prod(shape))])
        axis, length = 0, int(np.prod(shape))
    else:
        axis = normalize_axis(ctx, int(axis_attribute), len(shape))  # type: ignore[arg-type]
        length = shape[axis]
    kept = np.nonzero(np.asarray(condition, dtype=bool).reshape(-1)[:length])[0]
    return [take(ctx, x, kept, axis)]
