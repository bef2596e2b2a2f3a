"""ONNX tensor element types <-> IR element types and numpy dtypes (one table, both directions).

NOTE: ONNX integer types map to MLIR's *signless* integers (`uint8` and `int8` are both `i8`), as the
quant dialect's storage types are signless (`!quant.uniform<u8:f32, ...>` stores in `i8`, so
`quant.scast` requires `i8`). The signedness of a quantized tensor lives in its quant type; where a
non-quantized unsigned tensor is visible (constants, function arguments and results), the lifter
records the ONNX type name in an `onnx.elem_type` attribute, so nothing is lost.
"""

from __future__ import annotations

from qconvert.ir.dialects.onnx import ELEMENT_TYPES, ELEMENT_TYPES_BY_NAME, OnnxElement, element_type
from qconvert.ir.types import OpaqueType

# The table itself is the lifted-ONNX contract's (qconvert/ir/dialects/onnx.py), which backends and
# the interpreter read too; these are the frontend's names for it.
ElementType = OnnxElement
BY_NAME = ELEMENT_TYPES_BY_NAME
UNKNOWN_ELEMENT = OpaqueType("onnx", "unknown")
"""The element type of a tensor whose ONNX type shape inference could not decide."""

# Storage types QuantizeLinear / DequantizeLinear may use, by ONNX name (int32: DequantizeLinear only).
INTEGER_STORAGE = {"int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32"}
FLOAT_STORAGE = {"float8e4m3fn", "float8e5m2", "float4e2m1"}
# MLIR's quant storage syntax has no FNUZ float8 (only f8E5M2, f8E4M3FN, f4E2M1FN parse), so a module
# holding them would print text that does not parse back: the lifter refuses them, naming the node.
UNREPRESENTABLE_STORAGE = {"float8e4m3fnuz", "float8e5m2fnuz"}
EXPRESSED = {"float", "float16", "bfloat16", "double"}


def is_signed_storage(name: str) -> bool:
    return not name.startswith("uint")


__all__ = [
    "BY_NAME",
    "ELEMENT_TYPES",
    "EXPRESSED",
    "FLOAT_STORAGE",
    "INTEGER_STORAGE",
    "UNKNOWN_ELEMENT",
    "UNREPRESENTABLE_STORAGE",
    "ElementType",
    "element_type",
    "is_signed_storage",
]
