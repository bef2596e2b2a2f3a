"""Lowerings of ONNX DFT (opsets 17 and 20) and STFT (opset 17), the spectral front-end of speech models
that compute their features in the graph (torch.stft exports as STFT, after a reflect Pad for center=True).

A DFT of static length N is a product with constant cos / sin matrices (computed at conversion time in
float64, rounded to float32): X[k] = Σ x[n] e^{∓2πi kn/N}, divided by N for the inverse; onesided keeps
the first N/2 + 1 bins. STFT gathers its frames (constant positions), multiplies them by the window and
takes their DFT. onnxruntime computes an FFT with its own twiddles, so results agree within the float32
bound of a length-N sum, not bit for bit. dft_length, frame_step, frame_length and the axis must be
constants (the output shape depends on them).
"""

from __future__ import annotations

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.onnx import op_default_opset
from qconvert.ir.types import F32, I64, RankedTensorType, element_type_of

from . import ops as hlo
from .lowering import LoweringContext
from .onnx_fold import constant_input, lowers_folding, static_shape
from .onnx_shape import normalize_axis


def dft_matrices(length: int, bins: int, inverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of 2π k n / N as float32 [N, bins]; the inverse's sign and 1/N scale folded in."""
    n = np.arange(length, dtype=np.float64)[:, None]
    k = np.arange(bins, dtype=np.float64)[None, :]
    angle = 2.0 * np.pi * ((n * k) % length) / length
    scale = 1.0 / length if inverse else 1.0
    sign = 1.0 if inverse else -1.0
    return (np.cos(angle) * scale).astype(np.float32), (sign * np.sin(angle) * scale).astype(np.float32)


def _constant_int(ctx: LoweringContext, op: Operation, position: int, what: str) -> int | None:
    if ctx.source_input(op, position) is None:
        return None
    value = constant_input(ctx, op, position)
    if value is None:
        ctx.unsupported(f"{what} is computed at run time (the output shape depends on it)")
    return int(np.asarray(value).reshape(-1)[0])


def dft_last(
    ctx: LoweringContext, real: Value, imaginary: Value | None, bins: int, inverse: bool
) -> tuple[Value, Value]:
    """The DFT of (real, imaginary) along their last dim: (real, imaginary) of `bins` bins, last dim."""
    b = ctx.builder
    length = hlo.tensor_type(real).shape[-1]
    cos, sin = dft_matrices(length, bins, inverse)
    rank = hlo.tensor_type(real).rank

    def times(value: Value, matrix: np.ndarray) -> Value:
        return hlo.dot_general(
            b, value, ctx.constant(matrix, F32), lhs_contracting=[rank - 1], rhs_contracting=[0]
        )

    # (a + ib)(c + is) = (ac - bs) + i(as + bc), with c = cos, s = the signed sin.
    out_real, out_imaginary = times(real, cos), times(real, sin)
    if imaginary is not None:
        out_real = hlo.subtract(b, out_real, times(imaginary, sin))
        out_imaginary = hlo.add(b, out_imaginary, times(imaginary, cos))
    return out_real, out_imaginary


def _split_complex(ctx: LoweringContext, x: Value) -> tuple[Value, Value | None]:
    """A [..., 1] real or [..., 2] complex tensor -> (real, imaginary or None), the last dim dropped."""
    b = ctx.builder
    shape = hlo.tensor_type(x).shape
    rank = len(shape)
    if shape[-1] not in (1, 2):
        ctx.unsupported(f"a signal whose last dim is {shape[-1]} (1 real, 2 complex)")

    def part(index: int) -> Value:
        start, limit = [0] * rank, list(shape)
        start[-1], limit[-1] = index, index + 1
        return hlo.reshape(b, hlo.slice_(b, x, start, limit, [1] * rank), shape[:-1])

    return part(0), (part(1) if shape[-1] == 2 else None)


def _join_complex(ctx: LoweringContext, real: Value, imaginary: Value) -> Value:
    shape = hlo.tensor_type(real).shape
    parts = [hlo.reshape(ctx.builder, v, [*shape, 1]) for v in (real, imaginary)]
    return hlo.concatenate(ctx.builder, parts, len(shape))


@lowers_folding("onnx.DFT")
def lower_dft(ctx: LoweringContext, op: Operation) -> list[Value]:
    x = ctx.input(op, 0)
    assert x is not None
    shape = static_shape(ctx, x, "DFT's input")
    if element_type_of(x.type) != F32:
        ctx.unsupported(f"DFT of {element_type_of(x.type)}")
    rank = len(shape)
    if op_default_opset(op) >= 20:
        given = _constant_int(ctx, op, 2, "DFT's axis")
        axis = normalize_axis(ctx, -2 if given is None else given, rank)
    else:
        axis = normalize_axis(ctx, int(ctx.attribute(op, "axis", 1)), rank)  # type: ignore[arg-type]
    if axis == rank - 1:
        ctx.unsupported("DFT along the real/imaginary dim")
    inverse = bool(int(ctx.attribute(op, "inverse", 0)))  # type: ignore[arg-type]
    onesided = bool(int(ctx.attribute(op, "onesided", 0)))  # type: ignore[arg-type]
    if inverse and onesided:
        ctx.unsupported("DFT with inverse=1 and onesided=1")
    length = _constant_int(ctx, op, 1, "DFT's dft_length") or shape[axis]
    b = ctx.builder
    # Move the axis last, pad or cut it to dft_length.
    permutation = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]
    moved = hlo.transpose(b, x, permutation)
    real, imaginary = _split_complex(ctx, moved)
    size = hlo.tensor_type(real).shape[-1]
    if length != size:
        low = [0] * (rank - 1)
        high = [0] * (rank - 2) + [length - size]
        real = hlo.pad(b, real, ctx.scalar(0.0, F32), low, high)
        if imaginary is not None:
            imaginary = hlo.pad(b, imaginary, ctx.scalar(0.0, F32), low, high)
    bins = length // 2 + 1 if onesided else length
    out_real, out_imaginary = dft_last(ctx, real, imaginary, bins, inverse)
    joined = _join_complex(ctx, out_real, out_imaginary)
    inverse_permutation = [permutation.index(d) for d in range(rank)]
    return [hlo.transpose(b, joined, inverse_permutation)]


@lowers_folding("onnx.STFT")
def lower_stft(ctx: LoweringContext, op: Operation) -> list[Value]:
    signal, window = ctx.input(op, 0), ctx.input(op, 2)
    assert signal is not None
    shape = static_shape(ctx, signal, "STFT's signal")
    if element_type_of(signal.type) != F32 or len(shape) != 3:
        ctx.unsupported(f"STFT of {signal.type} (float32 [batch, length, 1 or 2] is lowered)")
    step = _constant_int(ctx, op, 1, "STFT's frame_step")
    assert step is not None
    frame_length = _constant_int(ctx, op, 3, "STFT's frame_length")
    if frame_length is None:
        if window is None:
            ctx.unsupported("STFT without a window or a frame_length")
        frame_length = hlo.tensor_type(window).shape[0]
    onesided = bool(int(ctx.attribute(op, "onesided", 1)))  # type: ignore[arg-type]
    batch, length = shape[0], shape[1]
    frames = (length - frame_length) // step + 1
    b = ctx.builder
    real, imaginary = _split_complex(ctx, signal)  # [batch, length]
    if imaginary is not None and onesided:
        ctx.unsupported("STFT of a complex signal with onesided=1")
    positions = (np.arange(frames)[:, None] * step + np.arange(frame_length)[None, :]).astype(np.int64)
    index = ctx.constant(positions.reshape(frames, frame_length, 1), I64)

    def framed(value: Value) -> Value:
        result = hlo.gather(
            b,
            value,
            index,
            RankedTensorType((batch, frames, frame_length), F32),
            offset_dims=[0],
            collapsed_slice_dims=[1],
            start_index_map=[1],
            index_vector_dim=2,
            slice_sizes=[batch, 1],
        )
        if window is None:
            return result
        weights = hlo.broadcast_in_dim(b, window, (batch, frames, frame_length), [2])
        return hlo.multiply(b, result, weights)

    bins = frame_length // 2 + 1 if onesided else frame_length
    declared = op.results[0].type
    computed = (batch, frames, bins, 2)
    static = isinstance(declared, RankedTensorType) and declared.has_static_shape()
    if static and declared.shape != computed:  # type: ignore[union-attr]
        # onnx 1.23's shape inference takes the default onesided as 0 (16 bins where 9 are computed).
        ctx.unsupported(
            f"STFT: the model declares its output {list(declared.shape)}, the op computes "  # type: ignore[union-attr]
            f"{list(computed)} (give onesided explicitly)"
        )
    out_real, out_imaginary = dft_last(
        ctx, framed(real), None if imaginary is None else framed(imaginary), bins, inverse=False
    )
    return [_join_complex(ctx, out_real, out_imaginary)]


# Window generators (opset 17): the window is a constant of the model once its size is known.
WINDOW_TERMS = {
    # op -> cosine series coefficients a_k of w[n] = Σ (-1)^k a_k cos(2πkn / d)
    "onnx.HannWindow": (0.5, 0.5),
    "onnx.HammingWindow": (25.0 / 46.0, 21.0 / 46.0),
    "onnx.BlackmanWindow": (0.42, 0.5, 0.08),
}


@lowers_folding(*WINDOW_TERMS)
def lower_window(ctx: LoweringContext, op: Operation) -> list[Value]:
    """w[n] = Σ_k (-1)^k a_k cos(2πkn / d), d = size (periodic=1, default) or size - 1, computed at
    conversion time in float64 and rounded to the output type (onnxruntime: within an ulp)."""
    size = _constant_int(ctx, op, 0, f"{op.name}'s size")
    assert size is not None
    periodic = bool(int(ctx.attribute(op, "periodic", 1)))  # type: ignore[arg-type]
    denominator = size if periodic else size - 1
    n = np.arange(size, dtype=np.float64)
    window = np.zeros(size)
    for k, coefficient in enumerate(WINDOW_TERMS[op.name]):
        window += (-1) ** k * coefficient * np.cos(2.0 * np.pi * k * n / max(denominator, 1))
    element = element_type_of(ctx.result_type(op))
    return [ctx.constant(window, element)]
