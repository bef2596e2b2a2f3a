"""numpy kernels for the generic `onnx.*` ops where onnx's reference implementation is wrong or slow.

The interpreter (qconvert/interpret.py) runs a generic `onnx.<Op>` on onnx's pure-Python reference
implementation (`onnx.reference.ReferenceEvaluator`) unless `interpret.ONNX_KERNELS` names a kernel for
it; the kernels of this module are registered there. Design: each is our own numpy code, not a one-node
onnxruntime session, because `qconvert check --backend interpreter` judges the interpreter against
onnxruntime node by node, and running a node in onnxruntime would make that node's check circular (it
would compare onnxruntime with itself). The semantics of every op here are short enough to write once:

- BatchNormalization, every opset: the reference takes the training path whenever a `momentum`
  attribute is present (opset 9-13, written by older exporters), so every output element differs from
  onnxruntime's. Here, as onnxruntime decides: inference (`y = x * (scale / sqrt(var + eps)) + (bias -
  mean * scale / sqrt(var + eps))`) unless the node asks for the running statistics (more than one output
  before opset 14, `training_mode = 1` from opset 14); `spatial = 0` (opset <= 8) takes per-element
  parameters; `is_test` and `consumed_inputs` (opset < 7) are ignored.
- Conv, ConvInteger, MatMulInteger (100-2,000x slower in the reference, a Python loop over output
  positions): one matmul per kernel offset (`convolution`), in the input's float type for Conv, exact
  for the integer ops (`qconvert.numerics.integer_accumulation`: float64 BLAS while it is exact, the
  int32 wrap of onnxruntime's accumulators); the quant-typed `qconvert.conv_integer` / `qlinear_conv`
  share `integer_convolution`.
- MaxPool, AveragePool, LpPool (300-15,000x slower): one strided slice per kernel offset, summed in the kernel
  offsets' row-major order (onnxruntime's loop order); MaxPool's `Indices` output stays on the reference.
- ConvTranspose (2,000x slower): one matmul per kernel offset scattered into the output (explicit pads or
  NOTSET; `auto_pad` SAME_* / `output_shape` stay on the reference).
- Resize / Upsample, nearest and bilinear: the reference keeps a uint8 bilinear result unrounded
  differently from onnxruntime's truncation (QOperator models resize uint8 tensors) and, downsampling
  with align_corners, samples other points; here qconvert/onnx_semantics.py's coordinates in
  onnxruntime's float32 order, bit-exact (cubic, antialias, tf_crop_and_resize stay on the reference).
- GatherElements: the reference's `np.choose` takes at most 32 choices (BERT's 512-position buffer).
- GridSample (4-D float32, bilinear / nearest, every padding mode): the reference loops in Python per
  output element (60,000x onnxruntime's time on 1x16x32x32); bicubic and N-D stay on it.
- Einsum (float): numpy's contraction path with BLAS products (the reference's plain `np.einsum` was
  355x onnxruntime's time on an attention-shaped equation).
- LRN: the reference is 4.6e-4 off the exact value on unit inputs (onnxruntime 2e-7).
- Softmax, LogSoftmax, Hardmax before opset 13: over every dim from `axis` on (the input coerced to
  2-D); the reference normalizes along `axis` alone at every opset.
- Tanh, Sigmoid (float32): onnxruntime's MLAS polynomials (qconvert/numerics), bit-exact: an ulp of
  difference before a DynamicQuantizeLinear flips roundings that cascade through a dynamically
  quantized model.
- Erf, Gelu (float32): MLAS's erf (qconvert/numerics), bit-exact with onnxruntime's Erf, as fast as
  the reference's per-element `math.erf`, which is an ulp off onnxruntime on 16% of values.

A kernel takes the op, its inputs by ONNX position (None where an optional input is absent) and the opset
of the op's domain; it returns the node's outputs by ONNX position, or None to leave the node to the
reference (a dtype or an attribute it does not handle).

Float results are not bit-exact with onnxruntime (MLAS sums in another order): they agree within a
float32 bound, `|ours - ort| <= k * eps32 * sum |x_i w_i|` with k of the order of the number of summed
terms (tests/interpret/test_onnx_kernels.py states each one).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from qconvert import onnx_semantics as semantics
from qconvert.errors import InputError
from qconvert.ir.attributes import ArrayAttr, DenseArrayAttr, FloatAttr, IntegerAttr, StringAttr
from qconvert.ir.core import Operation
from qconvert.ir.dialects.onnx import absent_positions, op_label
from qconvert.ir.types import FloatType
from qconvert.numerics.integer_accumulation import float64_is_exact, max_magnitude, wrap_int32
from qconvert.numerics.onnxruntime_elementwise import erf_mlas
from qconvert.numerics.onnxruntime_recurrent import logistic_mlas, tanh_mlas

Inputs = Sequence[np.ndarray | None]
OnnxKernel = Callable[[Operation, Inputs, int], "list[np.ndarray | None] | None"]
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def attribute(op: Operation, name: str, default: object) -> object:
    """An ONNX attribute of the op as a Python value (int, float, str, list), `default` when absent."""
    value = op.attributes.get(name)
    if value is None:
        return default
    if isinstance(value, IntegerAttr | FloatAttr | StringAttr):
        return value.value
    if isinstance(value, DenseArrayAttr):
        if isinstance(value.element_type, FloatType):
            return [float(v) for v in value.values]
        return [int(v) for v in value.values]
    if isinstance(value, ArrayAttr):
        return [getattr(v, "value", v) for v in value.elements]
    return getattr(value, "value", default)


def _ints(op: Operation, name: str, default: list[int]) -> list[int]:
    value = attribute(op, name, None)
    return [int(v) for v in value] if value else list(default)  # type: ignore[union-attr]


# Sliding-window geometry (Conv, ConvInteger, pools) ---------------------------------------------------
Window = semantics.Window


def window(
    op: Operation, spatial_shape: Sequence[int], kernel: Sequence[int], ceil_mode: bool = False
) -> Window:
    """The window geometry of `op` over an input of `spatial_shape` (auto_pad, pads, strides, dilations),
    by onnx_semantics' `window_geometry`."""
    try:
        return semantics.window_geometry(
            spatial_shape,
            kernel,
            strides=_ints(op, "strides", []),
            dilations=_ints(op, "dilations", []),
            pads=_ints(op, "pads", []),
            auto_pad=str(attribute(op, "auto_pad", "NOTSET")),
            ceil_mode=ceil_mode,
        )
    except ValueError as error:
        raise InputError(f"{op_label(op)}: {error}") from None


def _pad_for_windows(x: np.ndarray, geometry: Window, value: float | int) -> np.ndarray:
    """`x` padded so that every window of `geometry` lies inside it (ceil_mode windows may overhang)."""
    spatial = len(geometry.kernel)
    widths = [(0, 0)] * (x.ndim - spatial)
    for axis in range(spatial):
        size = x.shape[x.ndim - spatial + axis]
        begin, end = geometry.pads[axis], geometry.pads[axis + spatial]
        needed = (geometry.output[axis] - 1) * geometry.strides[axis] + geometry.extents[axis]
        widths.append((begin, max(end, needed - size - begin)))
    if all(w == (0, 0) for w in widths):
        return x
    return np.pad(x, widths, constant_values=value)


def _taps(geometry: Window) -> itertools.product:
    """Every kernel offset, row-major (the order onnxruntime's pool loops visit a window)."""
    return itertools.product(*[range(k) for k in geometry.kernel])


def _slice_at(geometry: Window, offsets: Sequence[int], leading: int) -> tuple[slice, ...]:
    """The strided slice of a padded input that one kernel offset reads for every output position."""
    return (slice(None),) * leading + tuple(
        slice(o * d, o * d + (n - 1) * s + 1, s)
        for o, d, n, s in zip(offsets, geometry.dilations, geometry.output, geometry.strides)
    )


# Convolution -----------------------------------------------------------------------------------------
def convolution(x: np.ndarray, w: np.ndarray, geometry: Window, group: int) -> np.ndarray:
    """`y[n, m, p] = sum_{c, k} x[n, g*C/G + c, p*s + k*d - pad] * w[m, c, k]` in the dtype of `x` and `w`.

    One (M/G x C/G) @ (C/G x P) matmul per kernel offset and group, accumulated in the operands' dtype
    (float32 for Conv, float64 holding exact integers for `integer_convolution`); depthwise convolutions
    (one channel per group) multiply elementwise instead.
    """
    batch, channels = x.shape[:2]
    filters = w.shape[0]
    if channels % group or filters % group or w.shape[1] * group != channels:
        raise InputError(
            f"convolution: input channels {channels}, weight {tuple(w.shape)} and group {group} disagree"
        )
    per_group_in, per_group_out = channels // group, filters // group
    positions = math.prod(geometry.output)
    padded = _pad_for_windows(x, geometry, 0)
    grouped_w = w.reshape(group, per_group_out, per_group_in, *geometry.kernel)
    result = np.zeros((batch, group, per_group_out, positions), np.result_type(x, w))
    for offsets in _taps(geometry):
        patch = padded[_slice_at(geometry, offsets, 2)].reshape(batch, group, per_group_in, positions)
        taps = grouped_w[(slice(None), slice(None), slice(None), *offsets)]
        if per_group_in == 1:
            result += taps * patch  # (G, M/G, 1) * (N, G, 1, P): depthwise, no matmul to batch
        else:
            result += np.matmul(taps, patch)
    return result.reshape(batch, filters, *geometry.output)


def integer_convolution(x: np.ndarray, w: np.ndarray, geometry: Window, group: int) -> np.ndarray:
    """The exact int64 convolution of integer `x` and `w` (zero points already subtracted)."""
    terms = math.prod(w.shape[1:])
    if float64_is_exact(max_magnitude(x), max_magnitude(w), terms):
        return convolution(x.astype(np.float64), w.astype(np.float64), geometry, group).astype(np.int64)
    return convolution(x.astype(np.int64), w.astype(np.int64), geometry, group)


def _channel(values: np.ndarray, rank: int, axis: int = 1) -> np.ndarray:
    """A per-channel vector shaped to broadcast along `axis` of a rank-`rank` tensor (a scalar stays one)."""
    if values.size == 1:
        return values.reshape(())
    shape = [1] * rank
    shape[axis] = -1
    return values.reshape(shape)


def conv(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    if x.dtype not in FLOAT_DTYPES or w.dtype != x.dtype:
        return None  # float16 / bfloat16 Conv: the reference's arithmetic in that type
    kernel = _ints(op, "kernel_shape", list(w.shape[2:]))
    geometry = window(op, x.shape[2:], kernel)
    y = convolution(x, w, geometry, int(attribute(op, "group", 1)))  # type: ignore[arg-type]
    if bias is not None:
        y += _channel(bias.astype(x.dtype), y.ndim)
    return [y]


def _zero_point(values: np.ndarray | None) -> np.ndarray:
    return np.zeros((), np.int64) if values is None else values.astype(np.int64)


def conv_integer(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """ConvInteger with run-time zero points: `x_zero_point` per tensor, `w_zero_point` per tensor or per
    output channel; exact int32 (wrapped) accumulation."""
    x, w = inputs[0], inputs[1]
    assert x is not None and w is not None
    x_zero = _zero_point(inputs[2] if len(inputs) > 2 else None)
    w_zero = _zero_point(inputs[3] if len(inputs) > 3 else None)
    if x_zero.size != 1:
        raise InputError(f"{op_label(op)}: x_zero_point must be a scalar (got shape {x_zero.shape})")
    centered_x = x.astype(np.int64) - x_zero.reshape(())
    centered_w = w.astype(np.int64) - _channel(w_zero, w.ndim, 0)
    kernel = _ints(op, "kernel_shape", list(w.shape[2:]))
    geometry = window(op, x.shape[2:], kernel)
    group = int(attribute(op, "group", 1))  # type: ignore[arg-type]
    return [wrap_int32(integer_convolution(centered_x, centered_w, geometry, group))]


def matmul_integer(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """MatMulInteger with run-time zero points: `a_zero_point` per tensor or per row (M, or [..., M, 1]),
    `b_zero_point` per tensor or per column (N, or [..., 1, N]); exact int32 (wrapped) accumulation."""
    from qconvert.numerics.integer_accumulation import exact_integer_matmul

    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    a_zero = _zero_point(inputs[2] if len(inputs) > 2 else None)
    b_zero = _zero_point(inputs[3] if len(inputs) > 3 else None)
    if a_zero.ndim == 1 and a_zero.size > 1:
        a_zero = a_zero.reshape(-1, 1)  # one zero point per row of A
    centered_a = a.astype(np.int64) - a_zero
    centered_b = b.astype(np.int64) - b_zero
    return [wrap_int32(exact_integer_matmul(centered_a, centered_b))]


# Pools -----------------------------------------------------------------------------------------------
def _pool_geometry(op: Operation, x: np.ndarray) -> Window:
    kernel = _ints(op, "kernel_shape", [])
    if not kernel:
        raise InputError(f"{op_label(op)}: kernel_shape is required")
    return window(op, x.shape[2:], kernel, ceil_mode=bool(attribute(op, "ceil_mode", 0)))


def max_pool(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    x = inputs[0]
    assert x is not None
    if len(op.results) > 1 or x.dtype.kind not in "fiu":
        return None  # the Indices output (and its storage_order): the reference computes it
    geometry = _pool_geometry(op, x)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    padded = _pad_for_windows(x, geometry, lowest)
    result: np.ndarray | None = None
    for offsets in _taps(geometry):
        patch = padded[_slice_at(geometry, offsets, 2)]
        result = patch.copy() if result is None else np.maximum(result, patch)
    return [result]


def average_pool(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """AveragePool: the window sum in the input's float type, divided by the count of the elements it
    covers (`count_include_pad`: pads count, the overhang of a ceil_mode window does not)."""
    x = inputs[0]
    assert x is not None
    if x.dtype not in FLOAT_DTYPES:
        return None
    geometry = _pool_geometry(op, x)
    spatial = len(geometry.kernel)
    padded = _pad_for_windows(x, geometry, 0)
    # 1 where an element counts toward the divisor: the input, and its pads with count_include_pad
    include_pad = bool(attribute(op, "count_include_pad", 0))
    counted = np.zeros(padded.shape[2:], np.int64)
    counted[
        tuple(
            slice(0 if include_pad else begin, begin + size + (end if include_pad else 0))
            for begin, end, size in zip(geometry.pads[:spatial], geometry.pads[spatial:], x.shape[2:])
        )
    ] = 1
    total = np.zeros((*x.shape[:2], *geometry.output), x.dtype)
    count = np.zeros(geometry.output, np.int64)
    for offsets in _taps(geometry):
        total += padded[_slice_at(geometry, offsets, 2)]
        count += counted[_slice_at(geometry, offsets, 0)]
    return [(total / count.astype(x.dtype)).astype(x.dtype)]


def lp_pool(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """LpPool: `(sum over the window of |x|^p) ^ (1/p)`, pads counting as zeros (the reference loops in
    Python: 300x onnxruntime's time)."""
    x = inputs[0]
    assert x is not None
    if x.dtype not in FLOAT_DTYPES:
        return None
    geometry = _pool_geometry(op, x)
    power = float(attribute(op, "p", 2))  # type: ignore[arg-type]
    padded = _pad_for_windows(np.abs(x) ** x.dtype.type(power), geometry, 0)
    total = np.zeros((*x.shape[:2], *geometry.output), x.dtype)
    for offsets in _taps(geometry):
        total += padded[_slice_at(geometry, offsets, 2)]
    return [(total ** x.dtype.type(1.0 / power)).astype(x.dtype)]


# ConvTranspose ---------------------------------------------------------------------------------------
def conv_transpose(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """`y[n, g*M/G + m, i*s + k*d - pad] += x[n, g*C/G + c, i] * w[g*C/G + c, m, k]`, a matmul per offset."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    if x.dtype not in FLOAT_DTYPES or w.dtype != x.dtype:
        return None
    if str(attribute(op, "auto_pad", "NOTSET")) not in ("NOTSET", "VALID") or attribute(
        op, "output_shape", None
    ):
        return None  # SAME_* and output_shape derive the pads: the reference does it
    spatial = x.ndim - 2
    sizes = x.shape[2:]
    kernel = _ints(op, "kernel_shape", list(w.shape[2:]))
    strides = _ints(op, "strides", [1] * spatial)
    dilations = _ints(op, "dilations", [1] * spatial)
    output_padding = _ints(op, "output_padding", [0] * spatial)
    padding = semantics.conv_transpose_padding(
        sizes,
        kernel,
        strides,
        dilations,
        output_padding,
        _ints(op, "pads", []),
        str(attribute(op, "auto_pad", "NOTSET")),
    )
    pads = [begin for begin, _ in padding] + [end for _, end in padding]
    group = int(attribute(op, "group", 1))  # type: ignore[arg-type]
    batch, channels = x.shape[:2]
    per_group_in, per_group_out = channels // group, w.shape[1]
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    output = [
        s * (n - 1) + p + e - pads[a] - pads[a + spatial]
        for a, (n, s, p, e) in enumerate(zip(sizes, strides, output_padding, extents))
    ]
    full = [
        max((n - 1) * s + e, pads[a] + o)
        for a, (n, s, e, o) in enumerate(zip(sizes, strides, extents, output))
    ]
    buffer = np.zeros((batch, group, per_group_out, *full), x.dtype)
    grouped_x = x.reshape(batch, group, per_group_in, math.prod(sizes))
    grouped_w = w.reshape(group, per_group_in, per_group_out, *kernel)
    for offsets in itertools.product(*[range(k) for k in kernel]):
        taps = np.swapaxes(grouped_w[(slice(None), slice(None), slice(None), *offsets)], 1, 2)
        contribution = np.matmul(taps, grouped_x).reshape(batch, group, per_group_out, *sizes)
        target = tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in zip(offsets, dilations, sizes, strides)
        )
        buffer[(slice(None), slice(None), slice(None), *target)] += contribution
    crop = tuple(slice(pads[a], pads[a] + output[a]) for a in range(spatial))
    y = np.ascontiguousarray(buffer[(slice(None), slice(None), slice(None), *crop)]).reshape(
        batch, group * per_group_out, *output
    )
    if bias is not None:
        y += _channel(bias.astype(x.dtype), y.ndim)
    return [y]


# BatchNormalization ----------------------------------------------------------------------------------
def batch_normalization(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """BatchNormalization as onnxruntime runs it, at every opset (see the module docstring)."""
    x, scale, bias, mean, var = inputs[:5]
    assert x is not None and scale is not None and bias is not None and mean is not None and var is not None
    if x.dtype.kind != "f":
        raise InputError(f"{op_label(op)}: BatchNormalization takes a float input, got {x.dtype}")
    compute = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    epsilon = compute.type(attribute(op, "epsilon", 1e-5))
    momentum = compute.type(attribute(op, "momentum", 0.9))
    outputs = len(op.results) + len(_absent_outputs(op))
    training = bool(attribute(op, "training_mode", 0)) if opset >= 14 else outputs > 1
    spatial = opset > 8 or int(attribute(op, "spatial", 1)) == 1  # type: ignore[arg-type]
    values = x.astype(compute)
    scale, bias, mean, var = (a.astype(compute) for a in (scale, bias, mean, var))

    def shaped(parameter: np.ndarray) -> np.ndarray:
        # spatial: one value per channel (axis 1); spatial = 0: one per element of x[n]
        return _channel(parameter, x.ndim) if spatial else parameter.reshape(1, *parameter.shape)

    if not training:
        inverse_std = (np.ones((), compute) / np.sqrt(var + epsilon)).astype(compute)
        multiplier = (scale * inverse_std).astype(compute)
        offset = (bias - mean * multiplier).astype(compute)
        return [(values * shaped(multiplier) + shaped(offset)).astype(x.dtype)]
    axes = (0, *range(2, x.ndim)) if spatial else (0,)
    batch_mean = values.mean(axis=axes, dtype=compute).astype(compute)
    batch_var = values.var(axis=axes, dtype=compute).astype(compute)  # biased, as onnxruntime's
    inverse_std = (np.ones((), compute) / np.sqrt(batch_var + epsilon)).astype(compute)
    y = ((values - shaped(batch_mean)) * shaped(inverse_std * scale) + shaped(bias)).astype(x.dtype)
    running_mean = (mean * momentum + batch_mean * (1 - momentum)).astype(x.dtype)
    running_var = (var * momentum + batch_var * (1 - momentum)).astype(x.dtype)
    if opset >= 14:
        return [y, running_mean, running_var]
    # opset 7-13: saved_mean, saved_var; onnxruntime's saved_var is the inverse standard deviation
    return [y, running_mean, running_var, batch_mean.astype(x.dtype), inverse_std.astype(x.dtype)]


def _absent_outputs(op: Operation) -> set[int]:
    return absent_positions(op, "outputs")


# GatherElements --------------------------------------------------------------------------------------
def gather_elements(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """`y[i][j][k] = data[index[i][j][k]][j][k]` (axis 0; likewise for the others), negative indices
    counted from the end. The reference uses `np.choose`, which takes at most 32 choices: it fails on
    an axis longer than that (BERT's token-type buffer of 512 positions)."""
    data, indices = inputs[0], inputs[1]
    assert data is not None and indices is not None
    if indices.ndim != data.ndim:
        raise InputError(f"{op_label(op)}: indices of rank {indices.ndim}, data of rank {data.ndim}")
    try:
        axis = semantics.normalize_axis(int(attribute(op, "axis", 0)), data.ndim)  # type: ignore[arg-type]
    except ValueError as error:
        raise InputError(f"{op_label(op)}: {error}") from None
    length = data.shape[axis]
    index = indices.astype(np.int64)
    if index.size and (index.min() < -length or index.max() >= length):
        raise InputError(f"{op_label(op)}: an index is outside [-{length}, {length - 1}]")
    index = np.where(index < 0, index + length, index)
    if any(i > d for a, (i, d) in enumerate(zip(index.shape, data.shape)) if a != axis):
        raise InputError(f"{op_label(op)}: indices {indices.shape} exceed data {data.shape} off the axis")
    # off the axis, indices may be shorter than data: read the leading block only
    window = tuple(slice(None) if a == axis else slice(0, n) for a, n in enumerate(index.shape))
    return [np.take_along_axis(data[window], index, axis=axis)]


# Resize, Upsample -----------------------------------------------------------------------------------
def _resize_plan(op: Operation, inputs: Inputs, opset: int) -> tuple[list[int], list[float]] | None:
    """The output shape and the float32 scale of every axis (onnx_semantics' rules), or None."""
    x = inputs[0]
    assert x is not None
    modern = op.name == "onnx.Resize" and opset >= 11
    scales_position, sizes_position = (2, 3) if modern else (1, None)
    axes_value = attribute(op, "axes", None)
    axes = [int(a) for a in axes_value] if axes_value else None  # type: ignore[union-attr]
    if op.name == "onnx.Upsample" and "scales" in op.attributes:  # Upsample-7: scales as an attribute
        scales: list[float] | None = [float(v) for v in attribute(op, "scales", [])]  # type: ignore[union-attr]
    else:
        given = inputs[scales_position] if len(inputs) > scales_position else None
        scales = None if given is None or given.size == 0 else [float(v) for v in given.reshape(-1)]
    input_shape = list(x.shape)
    if scales is not None:
        full_scales = semantics.resize_scales(input_shape, input_shape, scales, axes)
        return semantics.resize_output_shape(input_shape, full_scales), full_scales
    sizes = inputs[sizes_position] if sizes_position is not None and len(inputs) > sizes_position else None
    if sizes is None:
        return None
    axes_list = list(range(x.ndim)) if not axes else semantics.normalize_axes(axes, x.ndim)
    wanted = list(input_shape)
    for axis, size in zip(axes_list, sizes.reshape(-1), strict=True):
        wanted[axis] = int(size)
    policy = str(attribute(op, "keep_aspect_ratio_policy", "stretch"))
    if policy != "stretch":
        full_scales, output_shape = semantics.aspect_ratio_scales(input_shape, wanted, axes_list, policy)
        return output_shape, full_scales
    return wanted, semantics.resize_scales(input_shape, wanted, None)


def resize(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """Resize / Upsample, nearest (any rank) and bilinear (2-D, or 4-D resizing the last two axes) as
    onnxruntime's CPU kernel computes them: coordinates by qconvert/onnx_semantics.py (float32, in
    onnxruntime's order), bilinear as `(dx2 dy2) X11 + (dx1 dy2) X21 + (dx2 dy1) X12 + (dx1 dy1) X22`
    summed left to right in float32 and cast to the input type (integers truncate: a uint8 Resize of a
    QOperator model). The reference rounds integer results otherwise and, downsampling with align_corners,
    samples other points. Cubic, antialias, tf_crop_and_resize and trilinear stay on the reference."""
    x = inputs[0]
    assert x is not None
    mode = str(attribute(op, "mode", "nearest"))
    mode = "linear" if mode == "bilinear" else mode
    modern = op.name == "onnx.Resize" and opset >= 11
    coordinate_mode = (
        str(attribute(op, "coordinate_transformation_mode", "half_pixel")) if modern else "asymmetric"
    )
    nearest_mode = str(attribute(op, "nearest_mode", "round_prefer_floor")) if modern else "simple"
    if mode not in ("nearest", "linear") or int(attribute(op, "antialias", 0)):  # type: ignore[arg-type]
        return None
    if coordinate_mode == "tf_crop_and_resize" or x.dtype.kind not in "fiu":
        return None
    try:
        plan = _resize_plan(op, inputs, opset)
    except ValueError as error:
        raise InputError(f"{op_label(op)}: {error}") from None
    if plan is None:
        return None
    output_shape, scales = plan
    if any(s <= 0 for s in scales):
        raise InputError(f"{op_label(op)}: scales {scales} must be positive")
    resized = [a for a in range(x.ndim) if output_shape[a] != x.shape[a] or scales[a] != 1.0]
    coordinates = {
        a: semantics.resize_source_coordinates(coordinate_mode, output_shape[a], x.shape[a], scales[a])
        for a in resized
    }
    if mode == "nearest":
        result = x
        for axis in resized:
            indices = semantics.resize_nearest_indices(
                coordinates[axis], nearest_mode, scales[axis], x.shape[axis]
            )
            result = np.take(result, indices, axis=axis)
        return [np.ascontiguousarray(result)]
    if x.ndim not in (2, 4) or any(a < x.ndim - 2 for a in resized):
        return None  # onnxruntime's linear kernels: bilinear over the last two axes (trilinear: reference)
    height_axis, width_axis = x.ndim - 2, x.ndim - 1
    f32 = np.float32

    def taps(axis: int) -> semantics.LinearTaps:
        # an axis kept at scale 1 still goes through the taps (its last index weighs 0.5 + 0.5), as in
        # onnxruntime's bilinear kernel
        source = coordinates.get(axis)
        if source is None:
            source = semantics.resize_source_coordinates(coordinate_mode, x.shape[axis], x.shape[axis], 1.0)
        return semantics.resize_linear_taps(source, x.shape[axis])

    rows, columns = taps(height_axis), taps(width_axis)
    dy1, dy2 = rows.high_weight[:, None], rows.low_weight[:, None]  # distance to y1, to y2
    dx1, dx2 = columns.high_weight[None, :], columns.low_weight[None, :]
    values = x.astype(f32)

    def corner(row_index: np.ndarray, column_index: np.ndarray) -> np.ndarray:
        return np.take(np.take(values, row_index, axis=height_axis), column_index, axis=width_axis)

    y = (dx2 * dy2).astype(f32) * corner(rows.low, columns.low)
    y = (y + (dx1 * dy2).astype(f32) * corner(rows.low, columns.high)).astype(f32)
    y = (y + (dx2 * dy1).astype(f32) * corner(rows.high, columns.low)).astype(f32)
    y = (y + (dx1 * dy1).astype(f32) * corner(rows.high, columns.high)).astype(f32)
    if x.dtype.kind == "f":
        return [y.astype(x.dtype)]
    return [np.trunc(y).astype(x.dtype)]  # static_cast<T>(float): toward zero


# GridSample ------------------------------------------------------------------------------------------
def _reflect(coordinate: np.ndarray, low: float, high: float) -> np.ndarray:
    """Reflect coordinates into [low, high] (onnxruntime's GsReflect: fold by the span, odd folds mirror)."""
    f32 = np.float32
    span = f32(high - low)
    below, above = coordinate < low, coordinate > high
    distance = np.where(below, f32(low) - coordinate, np.where(above, coordinate - f32(high), f32(0))).astype(
        f32
    )
    folds = np.trunc(distance / span) if span > 0 else np.zeros_like(distance)
    rest = (distance - folds * span).astype(f32)
    even = (folds.astype(np.int64) % 2) == 0
    from_low = np.where(even, f32(low) + rest, f32(high) - rest)
    from_high = np.where(even, f32(high) - rest, f32(low) + rest)
    return np.where(below, from_low, np.where(above, from_high, coordinate)).astype(f32)


def grid_sample(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """GridSample of a 4-D float32 input, bilinear or nearest, padding zeros / border / reflection, as
    onnxruntime's kernel computes it (the reference loops in Python per output element: 60,000x
    onnxruntime's time on 1x16x32x32). Bicubic and N-D (opset 20) stay on the reference."""
    x, grid = inputs[0], inputs[1]
    assert x is not None and grid is not None
    mode = {"linear": "bilinear", "cubic": "bicubic"}.get(str(attribute(op, "mode", "bilinear")), "")
    mode = mode or str(attribute(op, "mode", "bilinear"))
    padding = str(attribute(op, "padding_mode", "zeros"))
    if x.dtype != np.float32 or x.ndim != 4 or mode not in ("bilinear", "nearest"):
        return None
    align = bool(attribute(op, "align_corners", 0))
    f32 = np.float32
    batch, _, height, width = x.shape
    grid = grid.astype(f32)

    def denormalize(values: np.ndarray, length: int) -> np.ndarray:
        if align:
            return ((values + f32(1)) / f32(2) * f32(length - 1)).astype(f32)
        return (((values + f32(1)) * f32(length) - f32(1)) / f32(2)).astype(f32)

    column, row = denormalize(grid[..., 0], width), denormalize(grid[..., 1], height)
    low_x, low_y = (0.0, 0.0) if align else (-0.5, -0.5)
    high_x, high_y = (width - 1.0, height - 1.0) if align else (width - 0.5, height - 0.5)
    if padding == "border":
        column, row = np.clip(column, f32(0), f32(width - 1)), np.clip(row, f32(0), f32(height - 1))
    elif padding == "reflection":
        column, row = _reflect(column, low_x, high_x), _reflect(row, low_y, high_y)
    elif padding != "zeros":
        return None
    batches = np.arange(batch)[:, None, None]

    def pixel(r: np.ndarray, c: np.ndarray) -> np.ndarray:
        """x[n, :, r, c] as (N, C, Ho, Wo); outside the input: 0, or the border / reflected pixel."""
        if padding == "zeros":
            inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
            values = x[batches, :, np.clip(r, 0, height - 1), np.clip(c, 0, width - 1)]
            values = np.where(inside[..., None], values, f32(0))
        else:
            if padding == "reflection":
                c = _reflect(c.astype(f32), low_x, high_x).astype(np.int64)
                r = _reflect(r.astype(f32), low_y, high_y).astype(np.int64)
            values = x[batches, :, np.clip(r, 0, height - 1), np.clip(c, 0, width - 1)]
        return np.moveaxis(values, -1, 1)

    if mode == "nearest":
        return [pixel(np.rint(row).astype(np.int64), np.rint(column).astype(np.int64))]
    x1, y1 = np.floor(column), np.floor(row)
    dx1, dx2 = (column - x1).astype(f32)[:, None], (x1 + f32(1) - column).astype(f32)[:, None]
    dy1, dy2 = (row - y1).astype(f32)[:, None], (y1 + f32(1) - row).astype(f32)[:, None]
    c1, r1 = x1.astype(np.int64), y1.astype(np.int64)
    top = dx2 * pixel(r1, c1) + dx1 * pixel(r1, c1 + 1)
    bottom = dx2 * pixel(r1 + 1, c1) + dx1 * pixel(r1 + 1, c1 + 1)
    return [(dy2 * top + dy1 * bottom).astype(f32)]


# Einsum ----------------------------------------------------------------------------------------------
def einsum(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """Einsum of float tensors with numpy's contraction path (`optimize=True`: pairwise BLAS products);
    ONNX's equation syntax is numpy's. The reference contracts without a path: 355x onnxruntime's time
    on an attention-shaped `bhqd,bhkd->bhqk`."""
    operands = [x for x in inputs if x is not None]
    if not operands or any(x.dtype not in FLOAT_DTYPES for x in operands):
        return None
    equation = str(attribute(op, "equation", ""))
    try:
        result = np.einsum(equation.replace(" ", ""), *operands, optimize=True)
    except ValueError as error:
        raise InputError(f"{op_label(op)}: Einsum '{equation}': {error}") from None
    return [np.asarray(result, operands[0].dtype)]


# LRN -------------------------------------------------------------------------------------------------
def lrn(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """`y = x / (bias + alpha / size * sum of x² over channels [c - floor((size-1)/2), c + ceil((size-1)/2)])
    ** beta`, in float64 then rounded (the reference is 4.6e-4 off the exact value on unit inputs;
    onnxruntime 2e-7)."""
    x = inputs[0]
    if x is None or x.dtype not in FLOAT_DTYPES or x.ndim < 2:
        return None
    size = int(attribute(op, "size", 0))  # type: ignore[arg-type]
    if size < 1:
        raise InputError(f"{op_label(op)}: LRN size must be positive, got {size}")
    alpha = float(attribute(op, "alpha", 1e-4))  # type: ignore[arg-type]
    beta = float(attribute(op, "beta", 0.75))  # type: ignore[arg-type]
    bias = float(attribute(op, "bias", 1.0))  # type: ignore[arg-type]
    wide = x.astype(np.float64)
    squares = np.square(wide)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    channels = x.shape[1]
    padded = np.pad(squares, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    window = sum(padded[:, offset : offset + channels] for offset in range(size))
    return [(wide / (bias + alpha / size * window) ** beta).astype(x.dtype)]


# Softmax, LogSoftmax, Hardmax before opset 13 --------------------------------------------------------
def _coerced_rows(op: Operation, x: np.ndarray, opset: int) -> np.ndarray:
    """Opsets 1-12: the input seen as a 2-D matrix, dims before `axis` (default 1) as rows."""
    given = attribute(op, "axis", None)
    try:
        axis = semantics.softmax_axis(None if given is None else int(given), x.ndim, opset)  # type: ignore[arg-type]
    except ValueError as error:
        raise InputError(f"{op_label(op)}: {error}") from None
    return x.reshape(math.prod(x.shape[:axis]), -1)


def softmax_family(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """Softmax / LogSoftmax / Hardmax of opsets 1-12 normalize over every dim from `axis` on (the input
    coerced to 2-D), not along `axis` alone as opset 13 does and as the reference computes at every
    opset: a 4-D Softmax over channels (axis 1) of an opset-11 export differed from onnxruntime by 0.78.
    Opset 13 and later stay on the reference."""
    x = inputs[0]
    if opset >= 13 or x is None or x.dtype not in FLOAT_DTYPES or x.size == 0:
        return None
    rows = _coerced_rows(op, x, opset)
    if op.name == "onnx.Hardmax":  # one-hot of the first maximum of each row
        result = np.zeros_like(rows)
        result[np.arange(rows.shape[0]), np.argmax(rows, axis=1)] = 1
        return [result.reshape(x.shape)]
    shifted = rows - rows.max(axis=1, keepdims=True)
    exponentials = np.exp(shifted)
    total = exponentials.sum(axis=1, keepdims=True, dtype=x.dtype)
    if op.name == "onnx.LogSoftmax":
        return [(shifted - np.log(total)).astype(x.dtype).reshape(x.shape)]
    return [(exponentials / total).astype(x.dtype).reshape(x.shape)]


# Tanh, Sigmoid ---------------------------------------------------------------------------------------
def tanh(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """onnxruntime's MLAS tanh (float32), bit for bit: numpy's tanh differs from it by an ulp on about
    half the values, which flips DynamicQuantizeLinear roundings downstream (a 24-layer dynamically
    quantized Conv1d-Tanh stack: 34 dB end to end against onnxruntime with np.tanh, exact with this)."""
    x = inputs[0]
    return None if x is None or x.dtype != np.float32 else [tanh_mlas(x)]


def sigmoid(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """onnxruntime's MLAS logistic (float32), bit for bit (see `tanh`)."""
    x = inputs[0]
    return None if x is None or x.dtype != np.float32 else [logistic_mlas(x)]


# Erf, Gelu -------------------------------------------------------------------------------------------
def erf(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """float32 Erf as onnxruntime's MLAS kernel computes it, bit for bit (`erf_mlas`; the reference's
    per-element math.erf is correctly rounded, an ulp away from onnxruntime on 16% of values)."""
    x = inputs[0]
    return None if x is None or x.dtype != np.float32 else [erf_mlas(x)]


def gelu(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """Gelu (opset 20), float32: `0.5 x (1 + erf(x / sqrt 2))` on `erf_mlas`, or the tanh approximation
    `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x³)))` on `tanh_mlas` (within a few ulps of onnxruntime)."""
    x = inputs[0]
    if x is None or x.dtype != np.float32:
        return None
    f32 = np.float32
    if str(attribute(op, "approximate", "none")) == "tanh":
        inner = (f32(math.sqrt(2 / math.pi)) * (x + f32(0.044715) * x * x * x)).astype(f32)
        return [(f32(0.5) * x * (f32(1) + tanh_mlas(inner))).astype(f32)]
    return [(f32(0.5) * x * (f32(1) + erf_mlas((x * f32(math.sqrt(0.5))).astype(f32)))).astype(f32)]


KERNELS: dict[str, OnnxKernel] = {
    "onnx.BatchNormalization": batch_normalization,
    "onnx.Conv": conv,
    "onnx.ConvInteger": conv_integer,
    "onnx.MatMulInteger": matmul_integer,
    "onnx.ConvTranspose": conv_transpose,
    "onnx.MaxPool": max_pool,
    "onnx.AveragePool": average_pool,
    "onnx.LpPool": lp_pool,
    "onnx.GatherElements": gather_elements,
    "onnx.Resize": resize,
    "onnx.Upsample": resize,
    "onnx.GridSample": grid_sample,
    "onnx.Einsum": einsum,
    "onnx.LRN": lrn,
    "onnx.Softmax": softmax_family,
    "onnx.LogSoftmax": softmax_family,
    "onnx.Hardmax": softmax_family,
    "onnx.Tanh": tanh,
    "onnx.Sigmoid": sigmoid,
    "onnx.Erf": erf,
    "onnx.Gelu": gelu,
}

__all__ = [
    "KERNELS",
    "OnnxKernel",
    "Window",
    "attribute",
    "convolution",
    "integer_convolution",
    "window",
]
