"""QuantizeLinear / DequantizeLinear parameters -> `!quant.uniform` types, with every check on the way.

`quant_type_of` turns one node's constant scale / zero point and attributes into the quantized element
type (per-tensor `UniformQuantizedType`, per-axis `UniformQuantizedPerAxisType`, blocked
`UniformQuantizedSubChannelType`) or raises one `InputError` naming the node. Rules (ONNX spec,
../shared/reference/quantization-reference.md §1):

- storage type: QuantizeLinear: the zero point's type, else `output_dtype`, else uint8 (a zero point
  and a different `output_dtype` is an error); DequantizeLinear: the input's type;
- expressed type: QuantizeLinear: the input's float type; DequantizeLinear: `output_dtype` (opset 23+),
  else the scale's type (opset 19+), else f32;
- granularity: a one-element scale is per-tensor; a 1-D scale with `block_size` 0 is per-axis on
  `axis` (default 1, negative counts from the end); `block_size` B > 0 is blocked on `axis`, every
  other scale dimension equal to the input's (listed in the sub-channel type with block size 1); B
  need not divide the dimension (ceil(D / B) blocks, the last shorter): the type is then that of the
  tensor padded to whole blocks (`padded_shape`), which the lifter pads to and slices back from;
- scale: finite and > 0 and inside the expressed type's range; zero point: inside the storage range,
  exactly 0 for float storage, same shape as the scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qconvert import onnx_semantics as semantics
from qconvert.errors import InputError, VerifyError
from qconvert.ir.quant_types import (
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedType,
    blocked_type,
)
from qconvert.ir.types import DYNAMIC, FloatType, IntegerType
from qconvert.numerics import storage_range

from .dtypes import (
    EXPRESSED,
    FLOAT_STORAGE,
    INTEGER_STORAGE,
    UNREPRESENTABLE_STORAGE,
    ElementType,
    is_signed_storage,
)


@dataclass(frozen=True, slots=True)
class NodeRef:
    """What an error message needs to name a node: `node 'q1' (QuantizeLinear, opset 21)`."""

    name: str
    op_type: str
    opset: int

    def error(self, message: str) -> InputError:
        return InputError(f"node '{self.name}' ({self.op_type}, opset {self.opset}): {message}")


def check_storage(node: NodeRef, storage: ElementType, *, quantize: bool) -> None:
    allowed = (INTEGER_STORAGE - ({"int32"} if quantize else set())) | FLOAT_STORAGE
    if storage.name in UNREPRESENTABLE_STORAGE:
        raise node.error(
            f"storage type {storage.name} is not supported: MLIR's quant dialect has no FNUZ float8 "
            f"storage type; supported: {', '.join(sorted(allowed))}"
        )
    if storage.name not in allowed:
        raise node.error(
            f"storage type {storage.name} is not supported; supported: {', '.join(sorted(allowed))}"
        )


def check_scale(node: NodeRef, scale: np.ndarray, scale_type: ElementType) -> None:
    if scale_type.name not in EXPRESSED:
        raise node.error(
            f"scale type {scale_type.name} is not supported (float, float16, bfloat16, double are)"
        )
    values = scale.astype(np.float64).reshape(-1)
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        index = int(np.argmax(bad))
        raise node.error(
            f"scale must be finite and > 0, got {values[index]!r} at index {index} of scale shape "
            f"{list(scale.shape)}"
        )


def check_zero_point(node: NodeRef, zero_point: np.ndarray, storage: ElementType) -> np.ndarray:
    """The zero point as int64 (zeros for float storage), after the range / float-zero checks."""
    if storage.name in FLOAT_STORAGE:
        values = zero_point.astype(np.float64)
        if np.any(values != 0):
            raise node.error(
                f"zero point must be 0 for float storage {storage.name}, got {values.reshape(-1)}"
            )
        return np.zeros(zero_point.shape, np.int64)
    width = storage.ir_type.width  # type: ignore[attr-defined]
    low, high = storage_range(width, is_signed_storage(storage.name))
    values = zero_point.astype(np.int64)
    bad = (values < low) | (values > high)
    if bad.any():
        raise node.error(
            f"zero point {int(values[bad][0])} is out of range [{low}, {high}] of storage type {storage.name}"
        )
    return values


def normalize_axis(node: NodeRef, axis: int, rank: int) -> int:
    """onnx_semantics' rule, the node named when the axis is out of range; a quantization axis needs a
    dim (a scalar has none)."""
    if rank == 0:
        raise node.error(f"axis {axis} of an input of rank 0: a quantization axis needs a dim")
    try:
        return semantics.normalize_axis(axis, rank)
    except ValueError as error:
        raise node.error(str(error)) from None


def quant_type_of(
    node: NodeRef,
    *,
    scale: np.ndarray,
    scale_type: ElementType,
    zero_point: np.ndarray | None,
    storage: ElementType,
    expressed: FloatType,
    input_shape: tuple[int, ...] | None,
    axis: int,
    block_size: int,
) -> QuantizedType:
    """The `!quant.uniform` element type of a QuantizeLinear output / DequantizeLinear input."""
    check_scale(node, scale, scale_type)
    if zero_point is None:
        zero_point = np.zeros(scale.shape, np.int64)
    elif zero_point.shape != scale.shape and not (zero_point.size == scale.size == 1):
        raise node.error(
            f"zero point shape {list(zero_point.shape)} does not match scale shape {list(scale.shape)}"
        )
    zero_points = check_zero_point(node, zero_point, storage)
    storage_type = storage.ir_type
    assert isinstance(storage_type, IntegerType | FloatType)
    common = {
        "storage_type": storage_type,
        "expressed_type": expressed,
        "is_signed": is_signed_storage(storage.name),
    }
    try:
        if block_size > 0:
            return _blocked_type(node, scale, zero_points, input_shape, axis, block_size, common)
        if block_size < 0:
            raise node.error(f"block_size must be >= 0, got {block_size}")
        if scale.size == 1 and scale.ndim <= 1:
            return UniformQuantizedType(
                **common, scale=float(scale.reshape(-1)[0]), zero_point=int(zero_points.reshape(-1)[0])
            )
        if scale.ndim != 1:
            raise node.error(
                f"scale of shape {list(scale.shape)} needs block_size > 0 (blocked quantization)"
            )
        if input_shape is None:
            raise node.error(
                "per-axis quantization needs the input's rank, which shape inference left unknown"
            )
        quantized_dimension = normalize_axis(node, axis, len(input_shape))
        size = input_shape[quantized_dimension]
        if size != DYNAMIC and size != scale.size:
            raise node.error(
                f"per-axis scale has {scale.size} elements but input dimension {quantized_dimension} (axis "
                f"{axis}) has size {size}"
            )
        return UniformQuantizedPerAxisType(
            **common,
            scales=tuple(float(s) for s in scale.astype(np.float64)),
            zero_points=tuple(int(z) for z in zero_points),
            quantized_dimension=quantized_dimension,
        )
    except VerifyError as error:
        raise node.error(f"invalid quantization parameters: {error.message}") from None


def _blocked_type(
    node: NodeRef,
    scale: np.ndarray,
    zero_points: np.ndarray,
    input_shape: tuple[int, ...] | None,
    axis: int,
    block_size: int,
    common: dict,
) -> QuantizedType:
    if input_shape is None or DYNAMIC in input_shape:
        raise node.error("blocked quantization needs the input's static shape, which is unknown")
    rank = len(input_shape)
    if scale.ndim != rank:
        raise node.error(f"blocked scale has rank {scale.ndim}, the input has rank {rank}")
    blocked_axis = normalize_axis(node, axis, rank)
    for dimension, (size, scale_size) in enumerate(zip(input_shape, scale.shape)):
        expected = math.ceil(size / block_size) if dimension == blocked_axis else size
        if scale_size != expected:
            raise node.error(
                f"blocked scale shape {list(scale.shape)} does not fit input shape {list(input_shape)} with "
                f"block_size {block_size} on axis {blocked_axis} (dimension {dimension} should be {expected})"
            )
    return blocked_type(
        **common,
        scales=scale,
        zero_points=zero_points,
        tensor_shape=padded_shape(input_shape, blocked_axis, block_size),
        axis=blocked_axis,
        block_size=block_size,
    )


def padded_shape(shape: tuple[int, ...], axis: int, block_size: int) -> tuple[int, ...]:
    """`shape` with `axis` rounded up to whole blocks: ONNX's last block may be shorter, MLIR's verifier
    wants every block whole, so the lifter pads a ragged tensor to this shape and slices the result back."""
    return tuple(-(-size // block_size) * block_size if d == axis else size for d, size in enumerate(shape))
