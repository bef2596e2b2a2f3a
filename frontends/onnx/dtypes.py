"""ONNX tensor element types <-> IR element types and numpy dtypes (one table, both directions).

NOTE: ONNX integer types map to MLIR's *signless* integers (`uint8` and `int8` are both `i8`), as the
quant dialect's storage types are signless (`!quant.uniform<u8:f32, ...>` stores in `i8`, so
`quant.scast` requires `i8`). The signedness of a quantized tensor lives in its quant type; where a
non-quantized unsigned tensor is visible (constants, function arguments and results), the lifter
records the ONNX type name in an `onnx.elem_type` attribute, so nothing is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from qconvert.ir.types import FloatType, IntegerType, OpaqueType, Type


@dataclass(frozen=True, slots=True)
class ElementType:
    """One ONNX element type: its enum value, spelled name, IR type and numpy dtype."""

    onnx_type: int
    name: str
    ir_type: Type
    dtype: np.dtype | None

    @property
    def is_unsigned_integer(self) -> bool:
        return self.name.startswith("uint")


def _entry(onnx_type: int, name: str, ir_type: Type) -> ElementType:
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))
    except (KeyError, TypeError, ValueError):
        dtype = None
    return ElementType(onnx_type, name, ir_type, dtype)


T = TensorProto
ELEMENT_TYPES: dict[int, ElementType] = {
    e.onnx_type: e
    for e in (
        _entry(T.FLOAT, "float", FloatType("f32")),
        _entry(T.UINT8, "uint8", IntegerType(8)),
        _entry(T.INT8, "int8", IntegerType(8)),
        _entry(T.UINT16, "uint16", IntegerType(16)),
        _entry(T.INT16, "int16", IntegerType(16)),
        _entry(T.INT32, "int32", IntegerType(32)),
        _entry(T.INT64, "int64", IntegerType(64)),
        _entry(T.STRING, "string", OpaqueType("onnx", "string")),
        _entry(T.BOOL, "bool", IntegerType(1)),
        _entry(T.FLOAT16, "float16", FloatType("f16")),
        _entry(T.DOUBLE, "double", FloatType("f64")),
        _entry(T.UINT32, "uint32", IntegerType(32)),
        _entry(T.UINT64, "uint64", IntegerType(64)),
        _entry(T.COMPLEX64, "complex64", OpaqueType("onnx", "complex64")),
        _entry(T.COMPLEX128, "complex128", OpaqueType("onnx", "complex128")),
        _entry(T.BFLOAT16, "bfloat16", FloatType("bf16")),
        _entry(T.FLOAT8E4M3FN, "float8e4m3fn", FloatType("f8E4M3FN")),
        _entry(T.FLOAT8E4M3FNUZ, "float8e4m3fnuz", FloatType("f8E4M3FNUZ")),
        _entry(T.FLOAT8E5M2, "float8e5m2", FloatType("f8E5M2")),
        _entry(T.FLOAT8E5M2FNUZ, "float8e5m2fnuz", FloatType("f8E5M2FNUZ")),
        _entry(T.UINT4, "uint4", IntegerType(4)),
        _entry(T.INT4, "int4", IntegerType(4)),
        _entry(T.FLOAT4E2M1, "float4e2m1", FloatType("f4E2M1FN")),
        _entry(T.FLOAT8E8M0, "float8e8m0", FloatType("f8E8M0FNU")),
        _entry(T.UINT2, "uint2", IntegerType(2)),
        _entry(T.INT2, "int2", IntegerType(2)),
    )
}
BY_NAME: dict[str, ElementType] = {e.name: e for e in ELEMENT_TYPES.values()}
UNKNOWN_ELEMENT = OpaqueType("onnx", "unknown")
"""The element type of a tensor whose ONNX type shape inference could not decide."""

# Storage types QuantizeLinear / DequantizeLinear may use, by ONNX name (int32: DequantizeLinear only).
INTEGER_STORAGE = {"int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32"}
FLOAT_STORAGE = {"float8e4m3fn", "float8e5m2", "float4e2m1"}
# MLIR's quant storage syntax has no FNUZ float8 (only f8E5M2, f8E4M3FN, f4E2M1FN parse), so a module
# holding them would print text that does not parse back: the lifter refuses them, naming the node.
UNREPRESENTABLE_STORAGE = {"float8e4m3fnuz", "float8e5m2fnuz"}
EXPRESSED = {"float", "float16", "bfloat16", "double"}


def element_type(onnx_type: int) -> ElementType | None:
    """The table entry of an ONNX element type, or None for UNDEFINED / unknown values."""
    return ELEMENT_TYPES.get(onnx_type)


def is_signed_storage(name: str) -> bool:
    return not name.startswith("uint")
