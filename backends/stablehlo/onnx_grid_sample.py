"""Lowering of ONNX GridSample (opsets 16 and 20/22) on 4-D inputs: linear ("bilinear" at opset 16) and
nearest modes, zeros / border / reflection padding, align_corners.

The sampling positions come from the grid at run time, so everything is computed in the module, in
onnxruntime's CPU kernel's formulas (grid_sample.cc): the grid value denormalized ((n + 1) / 2 * (L - 1)
with align_corners, else ((n + 1) * L - 1) / 2), nearest rounding half to even (nearbyint), the linear
neighbours floor(x) and floor(x) + 1 with weights of the distance to the other one, the padding mode
applied to each neighbour's integer coordinates (zeros: 0 outside; border: clamped; reflection:
reflected about [-0.5, L - 0.5], or [0, L - 1] with align_corners, then truncated), and
dy2 * (dx2 * p11 + dx1 * p12) + dy1 * (dx2 * p21 + dx1 * p22). onnxruntime has a second, fused formula for
zeros padding without align_corners, so results agree within a few ulp of the output, not bit for bit.
Cubic mode and 5-D inputs are refused.
"""

from __future__ import annotations

from qconvert.ir.core import Operation, Value
from qconvert.ir.types import F32, I64, RankedTensorType, element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import lowers_folding, static_shape


def _splat(ctx: LoweringContext, value: float, like: Value) -> Value:
    return ctx.splat(value, element_type_of(like.type), hlo.tensor_type(like).shape)


def _denormalize(ctx: LoweringContext, n: Value, length: int, align_corners: bool) -> Value:
    b = ctx.builder
    shifted = hlo.add(b, n, _splat(ctx, 1.0, n))
    if align_corners:
        half = hlo.exact_divide(b, shifted, _splat(ctx, 2.0, n))
        return hlo.multiply(b, half, _splat(ctx, float(length - 1), n))
    scaled = hlo.subtract(b, hlo.multiply(b, shifted, _splat(ctx, float(length), n)), _splat(ctx, 1.0, n))
    return hlo.exact_divide(b, scaled, _splat(ctx, 2.0, n))


def _reflect(ctx: LoweringContext, position: Value, low: float, high: float) -> Value:
    """onnxruntime's GsReflect of an integer position (as f32) about [low, high], truncated to i64."""
    b = ctx.builder
    span = high - low

    def folded(distance: Value, near: float, far: float) -> Value:
        # n = trunc(distance / span), r = distance - n * span; even n: near -/+ r, odd: far +/- r.
        count = ctx.convert(ctx.convert(hlo.exact_divide(b, distance, _splat(ctx, span, distance)), I64), F32)
        rest = hlo.subtract(b, distance, hlo.multiply(b, count, _splat(ctx, span, distance)))
        halves = hlo.multiply(
            b, hlo.floor(b, hlo.multiply(b, count, _splat(ctx, 0.5, count))), _splat(ctx, 2.0, count)
        )
        even = hlo.compare(b, "EQ", count, halves)
        toward_far = 1.0 if far > near else -1.0
        near_value = hlo.add(b, _splat(ctx, near, rest), hlo.multiply(b, rest, _splat(ctx, toward_far, rest)))
        far_value = hlo.subtract(
            b, _splat(ctx, far, rest), hlo.multiply(b, rest, _splat(ctx, toward_far, rest))
        )
        return hlo.select(b, even, near_value, far_value)

    below = hlo.compare(b, "LT", position, _splat(ctx, low, position))
    above = hlo.compare(b, "GT", position, _splat(ctx, high, position))
    from_low = folded(hlo.subtract(b, _splat(ctx, low, position), position), low, high)
    from_high = folded(hlo.subtract(b, position, _splat(ctx, high, position)), high, low)
    reflected = hlo.select(b, below, from_low, hlo.select(b, above, from_high, position))
    return ctx.convert(reflected, I64)  # truncation toward zero, as the kernel's static_cast


class _Sampler:
    """Fetches input pixels at integer (row, column) positions of shape (N, Ho, Wo), padding applied."""

    def __init__(self, ctx: LoweringContext, x: Value, padding: str, align_corners: bool) -> None:
        self.ctx, self.x, self.padding = ctx, x, padding
        self.n, self.c, self.h, self.w = hlo.tensor_type(x).shape
        self.border = (0.0, 0.0, self.w - 1.0, self.h - 1.0) if align_corners else (
            -0.5, -0.5, self.w - 0.5, self.h - 0.5
        )  # fmt: skip

    def pixels(self, rows: Value, columns: Value) -> Value:
        """(N, C, Ho, Wo) values at rows / columns (i64, (N, Ho, Wo))."""
        ctx, b = self.ctx, self.ctx.builder
        shape = hlo.tensor_type(rows).shape
        valid = None
        if self.padding == "zeros":
            valid = hlo.and_(b, self._inside(rows, self.h), self._inside(columns, self.w))
        if self.padding == "reflection":
            rows = _reflect(ctx, ctx.convert(rows, F32), self.border[1], self.border[3])
            columns = _reflect(ctx, ctx.convert(columns, F32), self.border[0], self.border[2])
        rows = hlo.clamp(b, ctx.scalar(0, I64), rows, ctx.scalar(self.h - 1, I64))
        columns = hlo.clamp(b, ctx.scalar(0, I64), columns, ctx.scalar(self.w - 1, I64))
        batch = hlo.iota(b, RankedTensorType((*shape, 1), I64), 0)
        coordinates = hlo.concatenate(
            b, [batch, hlo.reshape(b, rows, [*shape, 1]), hlo.reshape(b, columns, [*shape, 1])], 3
        )
        element = element_type_of(self.x.type)
        gathered = hlo.gather(
            b,
            self.x,
            coordinates,
            RankedTensorType((*shape, self.c), element),
            offset_dims=[3],
            collapsed_slice_dims=[0, 2, 3],
            start_index_map=[0, 2, 3],
            index_vector_dim=3,
            slice_sizes=[1, self.c, 1, 1],
        )
        values = hlo.transpose(b, gathered, [0, 3, 1, 2])
        if valid is None:
            return values
        out_shape = hlo.tensor_type(values).shape
        keep = hlo.broadcast_in_dim(b, valid, out_shape, [0, 2, 3])
        return hlo.select(b, keep, values, ctx.splat(0, element, out_shape))

    def _inside(self, index: Value, length: int) -> Value:
        b = self.ctx.builder
        shape = hlo.tensor_type(index).shape
        low = hlo.compare(b, "GE", index, self.ctx.splat(0, I64, shape))
        high = hlo.compare(b, "LT", index, self.ctx.splat(length, I64, shape))
        return hlo.and_(b, low, high)


@lowers_folding("onnx.GridSample")
def lower_grid_sample(ctx: LoweringContext, op: Operation) -> list[Value]:
    x, grid = ctx.input(op, 0), ctx.input(op, 1)
    assert x is not None and grid is not None
    shape = static_shape(ctx, x, "GridSample's input")
    grid_shape = static_shape(ctx, grid, "GridSample's grid")
    if len(shape) != 4 or element_type_of(x.type) != F32 or element_type_of(grid.type) != F32:
        ctx.unsupported(f"GridSample of {x.type} with a {grid.type} grid (4-D float32 is lowered)")
    mode = str(ctx.attribute(op, "mode", "linear"))  # "bilinear" at opset 16
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = str(ctx.attribute(op, "padding_mode", "zeros"))
    align_corners = bool(int(ctx.attribute(op, "align_corners", 0)))  # type: ignore[arg-type]
    if mode not in ("linear", "nearest") or padding not in ("zeros", "border", "reflection"):
        ctx.unsupported(f"GridSample mode={mode!r} padding_mode={padding!r}")
    b = ctx.builder
    n, ho, wo = grid_shape[0], grid_shape[1], grid_shape[2]
    x_norm = hlo.reshape(b, hlo.slice_(b, grid, [0, 0, 0, 0], [n, ho, wo, 1], [1, 1, 1, 1]), [n, ho, wo])
    y_norm = hlo.reshape(b, hlo.slice_(b, grid, [0, 0, 0, 1], [n, ho, wo, 2], [1, 1, 1, 1]), [n, ho, wo])
    column = _denormalize(ctx, x_norm, shape[3], align_corners)
    row = _denormalize(ctx, y_norm, shape[2], align_corners)
    sampler = _Sampler(ctx, x, padding, align_corners)
    if mode == "nearest":
        return [sampler.pixels(ctx.convert(hlo.round_nearest_even(b, row), I64),
                               ctx.convert(hlo.round_nearest_even(b, column), I64))]  # fmt: skip
    column_low, row_low = hlo.floor(b, column), hlo.floor(b, row)
    column_high = hlo.add(b, column_low, _splat(ctx, 1.0, column_low))
    row_high = hlo.add(b, row_low, _splat(ctx, 1.0, row_low))
    dx2, dx1 = hlo.subtract(b, column_high, column), hlo.subtract(b, column, column_low)
    dy2, dy1 = hlo.subtract(b, row_high, row), hlo.subtract(b, row, row_low)
    x1, x2 = ctx.convert(column_low, I64), ctx.convert(column_high, I64)
    y1, y2 = ctx.convert(row_low, I64), ctx.convert(row_high, I64)
    out_shape = (shape[0], shape[1], ho, wo)

    def spread(weight: Value) -> Value:
        return hlo.broadcast_in_dim(b, weight, out_shape, [0, 2, 3])

    def line(p_low: Value, p_high: Value) -> Value:
        return hlo.add(b, hlo.multiply(b, spread(dx2), p_low), hlo.multiply(b, spread(dx1), p_high))

    top = line(sampler.pixels(y1, x1), sampler.pixels(y1, x2))
    bottom = line(sampler.pixels(y2, x1), sampler.pixels(y2, x2))
    return [hlo.add(b, hlo.multiply(b, spread(dy2), top), hlo.multiply(b, spread(dy1), bottom))]
