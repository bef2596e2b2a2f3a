"""What ONNX ops mean, as pure numpy functions shared by the backends and the interpreter: axis and
padding normalization, Conv and pool windows (auto_pad, ceil_mode), Resize's coordinate transforms
and neighbour rules, Einsum equations.

Each rule is written once here (DESIGN.md: "what an ONNX op means is written once"); a lowering calls
these at conversion time with static shapes and emits only the data movement and arithmetic that
remain. Where the ONNX spec leaves float details open, the rule is onnxruntime's CPU kernel, which is
what every artifact is checked against: Resize computes its coordinates in float32, in the order of
onnxruntime's `upsamplebase.h`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Domains -------------------------------------------------------------------------------------------

DEFAULT_DOMAINS = ("", "ai.onnx")  # the two spellings of ONNX's default domain in a node or an opset import


# Axes ----------------------------------------------------------------------------------------------


def normalize_axis(axis: int, rank: int) -> int:
    """An ONNX axis in [-rank, rank) as a non-negative one (axis 0 of a scalar is 0); ValueError when
    out of range."""
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range [{-rank}, {max(rank, 1) - 1}] for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Sequence[int], rank: int) -> list[int]:
    """Every axis normalized (see `normalize_axis`), in the given order; ValueError on a repeat."""
    normalized = [normalize_axis(int(a), rank) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"axes {list(axes)} repeat an axis")
    return normalized


def ints_from(from_input: Sequence[int] | None, from_attribute: Sequence[int] | None) -> list[int] | None:
    """An int list an op takes as an input in newer opsets and as an attribute in older ones (Squeeze /
    Unsqueeze `axes` and Split's `split` from 13, Reduce* `axes` from 13 or 18): the input when the node
    has it, else the attribute, else None."""
    chosen = from_input if from_input is not None else from_attribute
    return None if chosen is None else [int(v) for v in chosen]


# Shape ops (Reshape, Split, Squeeze, Unsqueeze, Transpose) ------------------------------------------


def reshape_target(shape: Sequence[int], target: Sequence[int], allowzero: bool) -> list[int]:
    """Reshape's output shape: a 0 copies the input's dim at that position (unless `allowzero`), one -1
    takes what is left. ValueError on two -1s or an element count the input does not have."""
    result = [int(v) for v in target]
    if not allowzero:
        result = [shape[i] if v == 0 and i < len(shape) else v for i, v in enumerate(result)]
    if result.count(-1) > 1:
        raise ValueError(f"Reshape's shape {list(target)} has more than one -1")
    total = int(np.prod(shape, dtype=np.int64))
    if -1 in result:
        known = int(np.prod([v for v in result if v != -1], dtype=np.int64))
        result[result.index(-1)] = total // max(known, 1)
    if int(np.prod(result, dtype=np.int64)) != total:
        raise ValueError(f"Reshape cannot make {list(shape)} into {list(target)}")
    return result


def flattened_shape(shape: Sequence[int], axis: int) -> list[int]:
    """Flatten's output [prod(shape[:axis]), prod(shape[axis:])]; its axis may be the rank itself (then
    [size, 1]), so its range is [-rank, rank]. ValueError outside."""
    rank = len(shape)
    if not -rank <= axis <= rank:
        raise ValueError(f"axis {axis} is out of range [{-rank}, {rank}] for Flatten of rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return [int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))]


def split_sizes(dim: int, count: int, sizes: Sequence[int] | None) -> list[int]:
    """Split's part sizes along its axis: `sizes` when given, else `count` parts of ceil(dim / count)
    with the last one smaller (opset 18's num_outputs; equal parts before). ValueError when the parts
    do not add up to the dim."""
    if sizes is None:
        chunk = -(-dim // count)
        sizes = [min(chunk, dim - i * chunk) for i in range(count)]
    parts = [int(v) for v in sizes]
    if any(v < 0 for v in parts) or sum(parts) != dim:
        raise ValueError(f"Split into {parts} does not add up to the axis' size {dim}")
    return parts


def squeezed_axes(shape: Sequence[int], axes: Sequence[int] | None) -> set[int]:
    """The dims Squeeze removes: `axes` normalized, or every size-1 dim when there are none."""
    if axes is None:
        return {i for i, d in enumerate(shape) if d == 1}
    return {normalize_axis(int(a), len(shape)) for a in axes}


def unsqueezed_shape(shape: Sequence[int], axes: Sequence[int]) -> list[int]:
    """Unsqueeze's output shape: size-1 dims inserted at `axes`, which count in the output's rank."""
    rank = len(shape) + len(axes)
    inserted = {normalize_axis(int(a), rank) for a in axes}
    dims = iter(shape)
    return [1 if i in inserted else next(dims) for i in range(rank)]


def transpose_permutation(rank: int, perm: Sequence[int] | None) -> list[int]:
    """Transpose's permutation: `perm`, or the dims reversed when the node has none."""
    return list(range(rank))[::-1] if perm is None else [int(p) for p in perm]


# Reductions and the Softmax family ----------------------------------------------------------------


def reduction_axes(rank: int, axes: Sequence[int] | None, noop_with_empty_axes: bool) -> list[int] | None:
    """The sorted, normalized axes a Reduce* op reduces: all of them when `axes` is absent or empty,
    unless `noop_with_empty_axes` (then None: nothing is reduced)."""
    if axes is None or len(axes) == 0:
        return None if noop_with_empty_axes else list(range(rank))
    return sorted({normalize_axis(int(a), rank) for a in axes})


SOFTMAX_ALONG_AXIS_OPSET = 13  # from opset 13 Softmax / LogSoftmax / Hardmax work along `axis` alone


def softmax_axis(axis: int | None, rank: int, opset: int) -> int:
    """The normalized axis of Softmax / LogSoftmax / Hardmax: the attribute, else -1 from opset 13 and
    1 before."""
    if axis is None:
        axis = -1 if opset >= SOFTMAX_ALONG_AXIS_OPSET else 1
    return normalize_axis(axis, rank)


def softmax_matrix(shape: Sequence[int], axis: int, opset: int) -> tuple[int, int] | None:
    """Before opset 13 the Softmax family sees its input as the matrix [prod(shape[:axis]),
    prod(shape[axis:])] and normalizes each row: that matrix's shape, or None when the op works along
    `axis` alone (opset 13 on, or `axis` the last dim, where both rules agree)."""
    if opset >= SOFTMAX_ALONG_AXIS_OPSET or axis == len(shape) - 1:
        return None
    return int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))


# Pad -----------------------------------------------------------------------------------------------


def pad_amounts(pads: Sequence[int], rank: int, axes: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """ONNX `pads` ([x1_begin, x2_begin, ..., x1_end, x2_end, ...], over `axes` when given, opset 18)
    -> (begin, end) per dim of a rank-`rank` tensor; dims not in `axes` get (0, 0)."""
    axes_list = list(range(rank)) if axes is None else normalize_axes(axes, rank)
    if len(pads) != 2 * len(axes_list):
        raise ValueError(f"pads has {len(pads)} values, expected {2 * len(axes_list)} (2 per axis)")
    amounts = [(0, 0)] * rank
    count = len(axes_list)
    for index, axis in enumerate(axes_list):
        amounts[axis] = (int(pads[index]), int(pads[count + index]))
    return amounts


# Sliding windows (Conv, ConvTranspose's SAME padding aside, ConvInteger, QLinearConv, pools) ---------------


@dataclass(frozen=True, slots=True)
class Window:
    """Where the kernel windows of a Conv or pool sit along the spatial axes of the input."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begin of each spatial axis, then end of each (ONNX's layout)
    output: tuple[int, ...]

    @property
    def extents(self) -> tuple[int, ...]:
        """The span of one dilated window along each axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @property
    def padding(self) -> list[tuple[int, int]]:
        """(begin, end) padding per spatial axis."""
        spatial = len(self.kernel)
        return list(zip(self.pads[:spatial], self.pads[spatial:]))

    def overhang(self, spatial_shape: Sequence[int]) -> list[int]:
        """Per axis, how far the last window reaches past the end padding (a ceil_mode window), else 0."""
        spatial = len(self.kernel)
        return [
            max(0, (out - 1) * stride + extent - (size + self.pads[axis] + self.pads[axis + spatial]))
            for axis, (out, stride, extent, size) in enumerate(
                zip(self.output, self.strides, self.extents, spatial_shape)
            )
        ]


AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def same_padding(size: int, stride: int, extent: int, auto_pad: str) -> tuple[int, int]:
    """auto_pad SAME_UPPER / SAME_LOWER along one axis: `output = ceil(size / stride)`, the total padding
    split with the odd unit at the end (UPPER) or the beginning (LOWER)."""
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + extent - size)
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def window_geometry(
    spatial_shape: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: bool = False,
) -> Window:
    """The windows of a Conv or pool over an input of `spatial_shape` (absent attributes: strides and
    dilations 1, pads 0). With `ceil_mode` the output rounds up, but a last window that would start in
    the end padding is dropped (ONNX opset 19's rule, onnxruntime's PoolAttributes). ValueError on an
    unknown auto_pad or a window larger than the padded input."""
    spatial = len(spatial_shape)
    strides = list(strides) if strides else [1] * spatial
    dilations = list(dilations) if dilations else [1] * spatial
    padding = list(pads) if pads else [0] * (2 * spatial)
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}")
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for axis, size in enumerate(spatial_shape):
            padding[axis], padding[axis + spatial] = same_padding(
                size, strides[axis], extents[axis], auto_pad
            )
    elif auto_pad == "VALID":
        padding = [0] * (2 * spatial)
    output = []
    for axis, size in enumerate(spatial_shape):
        span = size + padding[axis] + padding[axis + spatial] - extents[axis]
        if span < 0:
            raise ValueError(
                f"the kernel ({extents[axis]}) is larger than the padded input ({span + extents[axis]})"
            )
        out = (-(-span // strides[axis]) if ceil_mode else span // strides[axis]) + 1
        if ceil_mode and (out - 1) * strides[axis] >= size + padding[axis]:
            out -= 1
        output.append(out)
    return Window(tuple(kernel), tuple(strides), tuple(dilations), tuple(padding), tuple(output))


def conv_transpose_padding(
    spatial_shape: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    output_padding: Sequence[int],
    pads: Sequence[int] | None = None,
    auto_pad: str = "NOTSET",
    output_shape: Sequence[int] | None = None,
) -> list[tuple[int, int]]:
    """ConvTranspose's (begin, end) padding per spatial axis. With `output_shape` or SAME_*: the ONNX
    spec's total padding `stride * (in - 1) + output_padding + extent - wanted` (wanted: `output_shape`,
    else `in * stride`), its larger half at the end for SAME_UPPER, at the beginning otherwise. Else the
    `pads` attribute (zeros for VALID). ValueError on an unknown auto_pad."""
    spatial = len(spatial_shape)
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}")
    if output_shape is None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        given = list(pads) if pads and auto_pad == "NOTSET" else [0] * (2 * spatial)
        return list(zip(given[:spatial], given[spatial:]))
    if output_shape is not None:
        wanted = [int(v) for v in output_shape][-spatial:]
    else:
        wanted = [size * stride for size, stride in zip(spatial_shape, strides)]
    padding = []
    for axis, size in enumerate(spatial_shape):
        extent = (kernel[axis] - 1) * dilations[axis] + 1
        total = strides[axis] * (size - 1) + output_padding[axis] + extent - wanted[axis]
        half = total // 2
        padding.append((half, total - half) if auto_pad == "SAME_UPPER" else (total - half, half))
    return padding


# Resize ----------------------------------------------------------------------------------------------

COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


def resize_source_coordinates(mode: str, output_length: int, input_length: int, scale: float) -> np.ndarray:
    """For each output index along one axis, the input coordinate it samples (float32, onnxruntime's
    arithmetic). A scale of exactly 1 maps each index to itself, as onnxruntime does for every mode.

    `mode` is a `coordinate_transformation_mode` (tf_crop_and_resize, which needs the roi, is not here).
    """
    f32 = np.float32
    resized = np.arange(output_length, dtype=f32)
    if scale == 1.0:
        return resized
    x_scale, length_resized, length_original = f32(scale), f32(output_length), f32(input_length)
    half = f32(0.5)
    if mode == "asymmetric":
        return resized / x_scale
    if mode == "half_pixel":
        return (resized + half) / x_scale - half
    if mode == "pytorch_half_pixel":
        if output_length > 1:
            return (resized + half) / x_scale - half
        return np.zeros(output_length, f32)
    if mode == "tf_half_pixel_for_nn":
        return (resized + half) / x_scale
    if mode == "align_corners":
        if output_length == 1:
            return np.zeros(output_length, f32)
        return resized * (length_original - f32(1)) / (length_resized - f32(1))
    if mode == "half_pixel_symmetric":
        # onnxruntime computes this one partly in double: (x + 0.5) / scale promotes to double.
        adjustment = length_resized / (x_scale * length_original)
        center = length_original / f32(2)
        offset = center * (f32(1) - adjustment)
        original = offset.astype(np.float64) + (resized.astype(np.float64) + 0.5) / float(x_scale) - 0.5
        return original.astype(f32)
    raise ValueError(f"coordinate_transformation_mode {mode!r} is not supported")


def resize_nearest_indices(
    coordinates: np.ndarray, nearest_mode: str, scale: float, input_length: int
) -> np.ndarray:
    """The input index each output picks in nearest mode, clamped into [0, input_length - 1].

    `nearest_mode` "simple" is Resize-10 / Upsample's rule: ceil when downsampling, else truncate.
    round_prefer_floor rounds halves down, round_prefer_ceil (std::round) rounds them away from zero.
    """
    x = coordinates.astype(np.float32)
    truncated = np.trunc(x)
    # std::round: halves away from zero, computed exactly (x - trunc(x) is exact in float32).
    away = truncated + np.sign(x) * (np.abs(x - truncated) >= np.float32(0.5))
    if nearest_mode == "floor":
        picked = np.floor(x)
    elif nearest_mode == "ceil":
        picked = np.ceil(x)
    elif nearest_mode == "round_prefer_ceil":
        picked = away
    elif nearest_mode == "round_prefer_floor":
        # onnxruntime: x == (int64)x + 0.5f ? floor(x) : round(x), so only positive halves go down.
        picked = np.where(x == truncated + np.float32(0.5), np.floor(x), away)
    elif nearest_mode == "simple":
        picked = np.ceil(x) if scale < 1 else truncated
    else:
        raise ValueError(f"nearest_mode {nearest_mode!r} is not supported")
    return np.clip(picked, 0, input_length - 1).astype(np.int64)


@dataclass(frozen=True)
class LinearTaps:
    """Linear interpolation along one axis: y[i] = low_weight[i] * x[low[i]] + high_weight[i] * x[high[i]]."""

    low: np.ndarray
    high: np.ndarray
    low_weight: np.ndarray
    high_weight: np.ndarray


def resize_linear_taps(coordinates: np.ndarray, input_length: int) -> LinearTaps:
    """onnxruntime's linear taps: the coordinate clamped into [0, n - 1], its two neighbours, weights of
    the distance to the other neighbour; when both neighbours coincide, 0.5 each."""
    f32 = np.float32
    x = np.clip(coordinates.astype(f32), f32(0), f32(input_length - 1))
    low = np.minimum(x.astype(np.int64), input_length - 1)
    high = np.minimum(low + 1, input_length - 1)
    distance_low = np.abs(x - low.astype(f32))
    distance_high = np.abs(x - high.astype(f32))
    same = low == high
    low_weight = np.where(same, f32(0.5), distance_high).astype(f32)
    high_weight = np.where(same, f32(0.5), distance_low).astype(f32)
    return LinearTaps(low, high, low_weight, high_weight)


def resize_scales(
    input_shape: Sequence[int],
    output_shape: Sequence[int],
    scales: Sequence[float] | None,
    axes: Sequence[int] | None = None,
) -> list[float]:
    """The float32 scale of every dim: the `scales` input (over `axes` when given, others 1), or, when
    the op was given `sizes`, output / input as onnxruntime computes it."""
    rank = len(input_shape)
    axes_list = list(range(rank)) if not axes else normalize_axes(axes, rank)
    if scales is not None:
        if len(scales) != len(axes_list):
            raise ValueError(f"scales has {len(scales)} values for {len(axes_list)} axes")
        result = [1.0] * rank
        for axis, scale in zip(axes_list, scales, strict=True):
            result[axis] = float(np.float32(scale))
        return result
    return [
        1.0 if i == 0 else float(np.float32(o) / np.float32(i))
        for i, o in zip(input_shape, output_shape, strict=True)
    ]


def resize_output_shape(input_shape: Sequence[int], scales: Sequence[float]) -> list[int]:
    """floor(input * scale) per dim, in float32 as onnxruntime computes it."""
    return [int(np.float32(s) * np.float32(d)) for d, s in zip(input_shape, scales, strict=True)]


def aspect_ratio_scales(
    input_shape: Sequence[int], sizes: Sequence[int], axes: Sequence[int], policy: str
) -> tuple[list[float], list[int]]:
    """keep_aspect_ratio_policy not_larger / not_smaller (Resize-18 with sizes): one scale for every
    axis in `axes` (min / max of output / input), output dims round(scale * input)."""
    rank = len(input_shape)
    scales = [float(np.float32(o) / np.float32(i)) if i else 1.0 for i, o in zip(input_shape, sizes)]
    chosen = [scales[a] for a in axes]
    common = min(chosen) if policy == "not_larger" else max(chosen)
    out_scales, out_shape = [], []
    for dim in range(rank):
        if dim in axes:
            out_scales.append(common)
            # std::round: halves away from zero (numpy's round goes to even).
            out_shape.append(int(np.floor(float(np.float32(common) * np.float32(input_shape[dim])) + 0.5)))
        else:
            out_scales.append(1.0)
            out_shape.append(input_shape[dim])
    return out_scales, out_shape


# Einsum ----------------------------------------------------------------------------------------------


def parse_einsum(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """An Einsum equation -> each operand's labels and the output's labels, one letter per dim.

    An ellipsis becomes fresh upper-case-free labels (digits are never ONNX labels, so '0', '1'...
    name the broadcast dims); an implicit output (no '->') is the labels seen once, sorted, after the
    ellipsis dims, as numpy does.
    """
    text = equation.replace(" ", "")
    inputs_text, arrow, output_text = text.partition("->")
    terms = inputs_text.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation {equation!r} has {len(terms)} operands, the node has {len(ranks)}")
    ellipsis_rank = 0
    for term, rank in zip(terms, ranks):
        if "..." in term:
            ellipsis_rank = max(ellipsis_rank, rank - (len(term) - 3))
    fresh = "".join(str(d) for d in range(ellipsis_rank))

    def expand(term: str, rank: int | None) -> str:
        if "..." not in term:
            return term
        count = ellipsis_rank if rank is None else rank - (len(term) - 3)
        return term.replace("...", fresh[ellipsis_rank - count :])

    labels = [expand(t, r) for t, r in zip(terms, ranks)]
    for term, rank in zip(labels, ranks):
        if len(term) != rank:
            raise ValueError(f"equation {equation!r}: term {term!r} does not match an operand of rank {rank}")
    if arrow:
        output = expand(output_text, None)
    else:
        counts: dict[str, int] = {}
        for term in labels:
            for label in term:
                counts[label] = counts.get(label, 0) + 1
        output = fresh + "".join(sorted(c for c, n in counts.items() if n == 1 and not c.isdigit()))
    return labels, output


def linear_interpolation_axes(scales: Sequence[float]) -> tuple[int, ...] | None:
    """The axes onnxruntime's linear Resize interpolates over together, by the input's rank: the two
    dims of a 2-D input, H and W of NCHW (scales of N and C 1) or of NHWC (scales of N and C 1),
    all three of a 3-D input, the last three of a 5-D one (trilinear); None where it refuses."""
    rank = len(scales)
    if rank == 2:
        return (0, 1)
    if rank == 4 and scales[0] == 1 and scales[1] == 1:
        return (2, 3)
    if rank == 4 and scales[0] == 1 and scales[3] == 1:
        return (1, 2)
    if rank == 3:
        return (0, 1, 2)
    if rank == 5 and scales[0] == 1 and scales[1] == 1:
        return (2, 3, 4)
    return None


def bilinear_corners(
    rows: LinearTaps, columns: LinearTaps
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """onnxruntime's bilinear sum, term by term, in its order: (row indices, column indices, float32
    coefficient grid [rows x columns]) for the corners (low, low), (low, high), (high, low), (high, high);
    each coefficient is the float32 product of the two taps' weights."""
    corners = []
    for row_index, row_weight in ((rows.low, rows.low_weight), (rows.high, rows.high_weight)):
        for column_index, column_weight in (
            (columns.low, columns.low_weight),
            (columns.high, columns.high_weight),
        ):
            coefficient = (column_weight[None, :] * row_weight[:, None]).astype(np.float32)
            corners.append((row_index, column_index, coefficient))
    return corners


@dataclass(frozen=True)
class CubicTaps:
    """Cubic interpolation along one axis: for output i, the four input indices `indices[:, i]` (clamped
    into the axis), their coefficients `coefficients[:, i]` and the coefficients' sum `sums[i]` (1 unless
    exclude_outside renormalizes)."""

    indices: np.ndarray
    coefficients: np.ndarray
    sums: np.ndarray


def cubic_coefficients(s: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution weights of the four neighbours at distance s from the left one, in float32
    and onnxruntime's order of operations (upsample.cc GetCubicCoeffs); shape (4, len(s))."""
    f32 = np.float32
    a, s = f32(a), np.abs(s.astype(f32))
    one, two, three, four, five, eight = (f32(v) for v in (1, 2, 3, 4, 5, 8))
    near, far = s + one, two - s
    return np.stack(
        [
            ((a * near - five * a) * near + eight * a) * near - four * a,
            ((a + two) * s - (a + three)) * s * s + one,
            ((a + two) * (one - s) - (a + three)) * (one - s) * (one - s) + one,
            ((a * far - five * a) * far + eight * a) * far - four * a,
        ]
    ).astype(f32)


def resize_cubic_taps(
    coordinates: np.ndarray, input_length: int, a: float, exclude_outside: bool
) -> CubicTaps:
    """onnxruntime's cubic taps: the neighbours floor(x) - 1 ... floor(x) + 2 (clamped: edge values
    repeat), Keys' coefficients of x - floor(x); with exclude_outside the out-of-range ones are 0 and
    `sums` holds the rest's float32 sum (added left to right) for renormalizing."""
    x = coordinates.astype(np.float32)
    base = np.floor(x)
    coefficients = cubic_coefficients(x - base, a)
    positions = base.astype(np.int64)[None, :] + np.arange(-1, 3)[:, None]
    sums = np.ones(len(x), np.float32)
    if exclude_outside:
        inside = (positions >= 0) & (positions < input_length)
        coefficients = np.where(inside, coefficients, np.float32(0)).astype(np.float32)
        sums = np.zeros(len(x), np.float32)
        for row in coefficients:
            sums = (sums + row).astype(np.float32)
    return CubicTaps(np.clip(positions, 0, input_length - 1), coefficients, sums)


# com.microsoft transformer ops (onnxruntime's transformer optimizer) -------------------------------------
# Their attribute defaults and input layouts, as onnxruntime's contrib schemas (bert_defs.cc) and CPU
# kernels define them; shared by the StableHLO lowerings and the interpreter's numpy kernels.

FAST_GELU_B = 0.7978845608028654  # FastGelu's sqrt(2 / pi), as onnxruntime writes it in float32
FAST_GELU_C = 0.035677408136300125  # FastGelu's 0.044715 * sqrt(2 / pi)
QUICK_GELU_ALPHA = 1.702  # QuickGelu's default alpha
LAYER_NORM_EPSILON = 1e-12  # Skip*/EmbedLayerNormalization's default epsilon (kDefault*Epsilon)
ATTENTION_MASK_FILTER_VALUE = -10000.0  # Attention's default mask_filter_value


def skip_layer_norm_positions(simplified: bool) -> tuple[int | None, int]:
    """(beta's input position or None, bias's input position) of SkipLayerNormalization /
    SkipSimplifiedLayerNormalization: (input, skip, gamma, beta, bias) / (input, skip, gamma, bias)."""
    return (None, 3) if simplified else (3, 4)


def attention_scale(scale: float, head_size: int) -> float:
    """Attention's score scale: the `scale` attribute, or 1 / sqrt(head_size) in float32 when it is 0."""
    return float(scale) or float(np.float32(1.0) / np.sqrt(np.float32(head_size)))


def attention_mask_format(shape: Sequence[int], batch: int, sequence: int, total: int) -> str | None:
    """Which of onnxruntime's Attention mask_index layouts `shape` is (total = past + sequence length):
    "end" (batch,): keys at or after mask_index[b] are masked (right padding); "end_start" (2 batch,): also
    keys before mask_index[batch + b]; "raw2d" (batch, total) and "raw3d" (batch, sequence, total): a
    key is masked where the value is not positive; None for anything else (4-D Megatron masks)."""
    shape = tuple(int(d) for d in shape)
    if shape == (batch,):
        return "end"
    if shape == (2 * batch,):
        return "end_start"
    if shape == (batch, total):
        return "raw2d"
    if shape == (batch, sequence, total):
        return "raw3d"
    return None


def attention_keep_mask(mask_index: np.ndarray, batch: int, sequence: int, total: int) -> np.ndarray:
    """The (batch, sequence, total) boolean of keys each query attends to (see `attention_mask_format`);
    ValueError for a layout onnxruntime's CPU kernel would not read."""
    layout = attention_mask_format(mask_index.shape, batch, sequence, total)
    keys = np.arange(total)
    if layout in ("end", "end_start"):
        ends = mask_index.reshape(-1)[:batch].astype(np.int64)
        keep = keys[None, :] < ends[:, None]
        if layout == "end_start":
            keep &= keys[None, :] >= mask_index.reshape(-1)[batch:].astype(np.int64)[:, None]
        return np.broadcast_to(keep[:, None, :], (batch, sequence, total))
    if layout == "raw2d":
        return np.broadcast_to((mask_index > 0)[:, None, :], (batch, sequence, total))
    if layout == "raw3d":
        return mask_index > 0
    raise ValueError(
        f"Attention mask_index of shape {list(mask_index.shape)} is not a layout onnxruntime reads"
    )
