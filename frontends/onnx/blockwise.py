"""Block-quantized weights as onnxruntime's n-bit quantizers write them -> blocked `!quant.uniform` constants.

Two forms reach here, both `real = (q - zero_point) * scale` per block of `block_size` along K:

- com.microsoft MatMulNBits (onnxruntime's MatMulNBitsQuantizer, QOperator format): B packed as uint8
  `[N, K/block_size, block_size * bits / 8]` (low bits first), scales `[N * blocks]`, optional zero points
  packed the same way per row of N (`[N * ceil(blocks * bits / 8)]`), default `2**(bits - 1)`.
  `unpack_matmul_nbits` returns the weight as the `[K, N]` integer tensor MatMul reads (rounded up to whole
  blocks), with `[blocks, N]` scales and zero points.
- DequantizeLinear with `block_size` (opset 21, the same quantizer's QDQ format) of a constant.

Symmetric quantization there divides a block's signed largest-magnitude value by -2**(bits - 1), so a
block whose largest magnitude is positive gets a *negative* scale (onnxruntime runs it: its kernels just
multiply). ONNX does not forbid negative scales; MLIR's quant dialect does (`!quant.uniform` scales are
positive). `split_scale_signs` keeps the exact values: the weight is dequantized with |s| (1 where s = 0)
and then multiplied by the block's sign (+1, -1, or 0 where s = 0): `((q - zp) |s|) sign(s)` is
`(q - zp) s` bit for bit, signed zeros included, because float rounding is symmetric in the sign and a
multiplication by +-1 or 0 is exact. The integer weight keeps its storage type and values.
"""

from __future__ import annotations

import numpy as np

NOTE_SIGNS = (
    "multiplied by the signs of onnxruntime's block scales: !quant.uniform scales must be positive, "
    "the dequantize uses |scale| (1 for a zero scale) and this exact product restores (q - zp) * scale bit "
    "for bit"
)


def needs_signs(scale: np.ndarray) -> bool:
    """True when a scale is negative or zero (finite): what `split_scale_signs` makes representable."""
    finite = np.isfinite(scale)
    return bool(np.any(finite & (scale <= 0)))


def split_scale_signs(scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|scale| with 1 for 0, sign(scale) as +1 / -1 / 0 in the scale's dtype): |s'| sign == s exactly."""
    positive = np.where(scale == 0, np.ones_like(scale), np.abs(scale)).astype(scale.dtype)
    return positive, np.sign(scale).astype(scale.dtype)


def _unpack_rows(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint8 rows of `8 / bits` values per byte, lowest bits first -> the first `count` values per row."""
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    values = (packed[..., None] >> shifts) & mask
    return values.reshape(*packed.shape[:-1], -1)[..., :count]


def unpack_matmul_nbits(
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    k: int,
    n: int,
    bits: int,
    block_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits' B, scales, zero points -> q [blocks * block_size, N] uint8 (a ragged last block keeps
    its padding rows, which the caller slices off after dequantizing), scales and zero points [blocks, N]."""
    blocks = -(-k // block_size)
    q = _unpack_rows(packed.reshape(n, blocks * (block_size * bits // 8)), bits, blocks * block_size)
    scale = scales.reshape(n, blocks)
    if zero_points is None:
        zero = np.full((n, blocks), 1 << (bits - 1), np.uint8)
    else:
        zero = _unpack_rows(zero_points.reshape(n, -1), bits, blocks)
    return np.ascontiguousarray(q.T), np.ascontiguousarray(scale.T), np.ascontiguousarray(zero.T)
