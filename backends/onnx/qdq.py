"""`!quant.uniform` types -> QuantizeLinear / DequantizeLinear parameters (scale, zero point, attributes).

| IR type                            | ONNX                                                           |
|------------------------------------|----------------------------------------------------------------|
| per-tensor `<i8:f32, s:z>`         | 0-d scale (expressed type), 0-d zero point (storage type)      |
| per-axis `<i8:f32:a, {...}>`       | 1-D scale / zero point, `axis = a` (always written)            |
| sub-channel, one axis blocked by B | scale / zero point of the input's rank, `axis`, `block_size=B` |
| sub-channel, no blocked axis       | per-tensor / per-axis when it is one, else `block_size = 1`    |

The zero point is always written, so that its type says the storage type at every opset. Storage:
int8/uint8/int32 (DequantizeLinear only), int16/uint16/int4/uint4, int2/uint2, float8e4m3fn/e5m2,
float4e2m1; scales f32, or f16/bf16 from opset 19.

Lossy on purpose (documented, not refused): narrowed storage bounds (`i8<-127:127>`) are written as
the full storage type, because QuantizeLinear always saturates to the full range. A qcast whose input
exceeds the narrowed range therefore yields -128 in ONNX where the IR (and the interpreter) yields
-127; dequantization and in-range values are unaffected. Refused (UnwritableType): storage widths ONNX
lacks (i3, u12, ...), unsigned 32-bit storage, QuantizeLinear to int32, f64 expressed types, and
sub-channel types blocked along more than one axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qconvert.ir.quant_types import (
    UNIFORM_TYPES,
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
    float_dtype,
    uniform_params,
)
from qconvert.ir.types import DYNAMIC, FloatType, IntegerType, RankedTensorType, Type

from .types import UnwritableType, as_storage_array, data_type

# The first opset whose QuantizeLinear / DequantizeLinear accepts each storage type.
STORAGE_OPSET = {
    ir.DataType.INT8: 10,
    ir.DataType.UINT8: 10,
    ir.DataType.INT32: 10,
    ir.DataType.FLOAT8E4M3FN: 19,
    ir.DataType.FLOAT8E5M2: 19,
    ir.DataType.INT16: 21,
    ir.DataType.UINT16: 21,
    ir.DataType.INT4: 21,
    ir.DataType.UINT4: 21,
    ir.DataType.FLOAT4E2M1: 23,
    ir.DataType.INT2: 25,
    ir.DataType.UINT2: 25,
}
FLOAT_STORAGE = frozenset({ir.DataType.FLOAT8E4M3FN, ir.DataType.FLOAT8E5M2, ir.DataType.FLOAT4E2M1})
SCALE_OPSET = {"f32": 10, "f16": 19, "bf16": 19}
PER_AXIS_OPSET = 13
BLOCKED_OPSET = 21


@dataclass(frozen=True)
class QdqParameters:
    """Everything a Q/DQ node needs beyond its data input, and the lowest opset that accepts it."""

    scale: np.ndarray
    zero_point: np.ndarray
    storage: ir.DataType
    axis: int | None
    block_size: int | None
    opset: int

    @property
    def scale_type(self) -> ir.DataType:
        return ir.DataType.from_numpy(self.scale.dtype)


def qdq_parameters(quant_type: QuantizedType, container: Type, *, quantize: bool) -> QdqParameters:
    """The ONNX form of `quant_type` used on a tensor of type `container` (raises UnwritableType)."""
    if not isinstance(quant_type, UNIFORM_TYPES):
        raise UnwritableType(f"{quant_type} is not a !quant.uniform type; only uniform types map to Q/DQ")
    storage = data_type(quant_type)
    if isinstance(quant_type.storage_type, IntegerType) and quant_type.storage_type.width == 32:
        if not quant_type.is_signed:
            raise UnwritableType("unsigned 32-bit storage has no ONNX Q/DQ equivalent (int32 only)")
        if quantize:
            raise UnwritableType("QuantizeLinear cannot produce int32 (only DequantizeLinear reads it)")
    if storage not in STORAGE_OPSET:
        raise UnwritableType(f"storage {quant_type.storage_type_spelling} has no ONNX Q/DQ equivalent")
    expressed = quant_type.expressed_type
    assert isinstance(expressed, FloatType)
    if expressed.name not in SCALE_OPSET:
        raise UnwritableType(f"expressed type {expressed} is not an ONNX Q/DQ scale type (f32, f16, bf16)")
    params = uniform_params(quant_type)
    expressed_dtype = float_dtype(expressed)
    opset = max(STORAGE_OPSET[storage], SCALE_OPSET[expressed.name])

    def zero_points(values: np.ndarray) -> np.ndarray:
        if storage in FLOAT_STORAGE:
            return np.zeros(np.shape(values), np.dtype(storage.numpy()))
        return as_storage_array(np.asarray(values, np.int64), storage)

    if isinstance(quant_type, UniformQuantizedType):
        scale = np.asarray(params.scale).astype(expressed_dtype)
        return QdqParameters(scale, zero_points(params.zero_point), storage, None, None, opset)
    if isinstance(quant_type, UniformQuantizedPerAxisType):
        scale = np.asarray(params.scale).astype(expressed_dtype)
        axis = quant_type.quantized_dimension
        return QdqParameters(
            scale, zero_points(params.zero_point), storage, axis, None, max(opset, PER_AXIS_OPSET)
        )
    return _sub_channel(
        quant_type, container, params.scale, params.zero_point, storage, expressed_dtype, opset
    )


def _sub_channel(
    quant_type: UniformQuantizedSubChannelType,
    container: Type,
    scale: np.ndarray,
    zero_point: np.ndarray,
    storage: ir.DataType,
    expressed_dtype: np.dtype,
    opset: int,
) -> QdqParameters:
    if not isinstance(container, RankedTensorType) or DYNAMIC in container.shape:
        raise UnwritableType("sub-channel quantization needs a static tensor shape in ONNX")
    shape = container.shape
    blocks = dict(quant_type.block_size_info)
    # The IR's table has one entry per block along each listed axis and size 1 along the others.
    table_scale = np.broadcast_to(scale, quant_type.scales.shape)
    table_zero = np.broadcast_to(zero_point, quant_type.scales.shape)
    varying = [d for d, size in enumerate(table_scale.shape) if size > 1]
    blocked_axes = [d for d in varying if blocks.get(d, 1) > 1]  # several blocks, each of several elements
    if len(blocked_axes) > 1:
        raise UnwritableType(
            f"blocks along axes {blocked_axes}: ONNX blocked quantization has one blocked axis"
        )
    if storage in FLOAT_STORAGE:
        table_zero = np.zeros(table_zero.shape, np.dtype(storage.numpy()))
    else:
        table_zero = as_storage_array(np.asarray(table_zero, np.int64), storage)
    table_scale = table_scale.astype(expressed_dtype)
    if not blocked_axes and not varying:  # one scale: per-tensor
        return QdqParameters(table_scale.reshape(()), table_zero.reshape(()), storage, None, None, opset)
    if not blocked_axes and len(varying) == 1:  # one scale per slice of one axis: per-axis
        axis = varying[0]
        return QdqParameters(
            table_scale.reshape(-1), table_zero.reshape(-1), storage, axis, None, max(opset, PER_AXIS_OPSET)
        )
    # Blocked: ONNX wants every axis but the blocked one at full resolution (block size 1 when no axis
    # has blocks of several elements), so the table is repeated along the axes it broadcasts.
    axis = blocked_axes[0] if blocked_axes else varying[0]
    block_size = blocks[axis] if blocked_axes else 1
    target = tuple(math.ceil(size / block_size) if d == axis else size for d, size in enumerate(shape))
    return QdqParameters(
        np.ascontiguousarray(np.broadcast_to(table_scale, target)),
        np.ascontiguousarray(np.broadcast_to(table_zero, target)),
        storage,
        axis,
        block_size,
        max(opset, BLOCKED_OPSET),
    )
