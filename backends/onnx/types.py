"""IR types -> ONNX element types, shapes and arrays (the writer's half of frontends/onnx/dtypes.py).

IR integers are signless (`i8` is int8 and uint8 alike, see frontends/onnx/dtypes.py), so the ONNX type
of an integer tensor needs a second source: the signedness of its quant type (`!quant.uniform<u8:f32,
...>` stores in uint8), an `onnx.elem_type` attribute the frontend recorded ("uint8"), or MLIR's
explicit `ui8`. Without one, a signless integer is written signed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from qconvert.errors import InputError
from qconvert.ir.attributes import Attribute, StringAttr
from qconvert.ir.dialects.onnx import ELEMENT_TYPES
from qconvert.ir.quant_types import CalibratedQuantizedType, QuantizedType
from qconvert.ir.types import (
    DYNAMIC,
    FloatType,
    IntegerType,
    OpaqueType,
    RankedTensorType,
    Type,
    UnrankedTensorType,
    element_type_of,
)

# The contract's element-type table (qconvert/ir/dialects/onnx.py) read backwards, as onnx_ir enums.
FLOAT_TYPES: dict[str, ir.DataType] = {
    e.ir_type.name: ir.DataType(e.onnx_type)
    for e in ELEMENT_TYPES.values()
    if isinstance(e.ir_type, FloatType)
}
SIGNED_INTEGERS: dict[int, ir.DataType] = {
    e.ir_type.width: ir.DataType(e.onnx_type)
    for e in ELEMENT_TYPES.values()
    if isinstance(e.ir_type, IntegerType) and e.name.startswith("int")
}
UNSIGNED_INTEGERS: dict[int, ir.DataType] = {
    e.ir_type.width: ir.DataType(e.onnx_type)
    for e in ELEMENT_TYPES.values()
    if isinstance(e.ir_type, IntegerType) and e.is_unsigned_integer
}


SUB_BYTE_INTEGER_DTYPES = frozenset(
    np.dtype(d) for d in (ml_dtypes.int2, ml_dtypes.uint2, ml_dtypes.int4, ml_dtypes.uint4)
)


class UnwritableType(Exception):
    """A type with no ONNX equivalent; the writer turns it into an InputError naming the value."""


def integer_data_type(width: int, signed: bool) -> ir.DataType:
    if width == 1:
        return ir.DataType.BOOL
    table = SIGNED_INTEGERS if signed else UNSIGNED_INTEGERS
    if width not in table:
        raise UnwritableType(f"{'' if signed else 'u'}int{width} has no ONNX tensor type")
    return table[width]


def named_data_type(name: str) -> ir.DataType:
    """`"uint8"` (an `onnx.elem_type` attribute) -> DataType.UINT8."""
    try:
        return ir.DataType[name.upper()]
    except KeyError:
        raise UnwritableType(f"onnx.elem_type '{name}' is not an ONNX element type") from None


def data_type(element: Type, elem_type: Attribute | None = None) -> ir.DataType:
    """The ONNX element type of an IR element type; a quant type is its storage (signedness kept)."""
    if isinstance(elem_type, StringAttr):
        return named_data_type(elem_type.value)
    if isinstance(element, CalibratedQuantizedType):
        raise UnwritableType(
            f"{element} is a calibration range, not a quantized type: finalize the calibration first"
        )
    if isinstance(element, QuantizedType):
        storage = element.storage_type
        if isinstance(storage, IntegerType):
            return integer_data_type(storage.width, element.is_signed and not storage.is_unsigned)
        return data_type(storage)
    if isinstance(element, FloatType):
        if element.name not in FLOAT_TYPES:
            raise UnwritableType(f"{element} has no ONNX tensor type")
        return FLOAT_TYPES[element.name]
    if isinstance(element, IntegerType):
        return integer_data_type(element.width, not element.is_unsigned)
    if isinstance(element, OpaqueType) and element.dialect == "onnx" and element.body == "string":
        return ir.DataType.STRING
    raise UnwritableType(f"{element} has no ONNX tensor type")


def shape_of(type_: Type) -> ir.Shape | None:
    """`tensor<2x?xf32>` -> Shape([2, None]); None for an unranked tensor."""
    if isinstance(type_, RankedTensorType):
        return ir.Shape([None if d == DYNAMIC else d for d in type_.shape])
    if isinstance(type_, UnrankedTensorType):
        return None
    if isinstance(type_, IntegerType | FloatType | QuantizedType):
        return ir.Shape([])  # a scalar: a 0-d tensor in ONNX
    raise UnwritableType(f"{type_} is not a tensor type")


def tensor_type(type_: Type, elem_type: Attribute | None = None) -> tuple[ir.TensorType, ir.Shape | None]:
    return ir.TensorType(data_type(element_type_of(type_), elem_type)), shape_of(type_)


def is_signless_narrow_integer(type_: Type) -> bool:
    """An `i8` / `i16` / `i4` / `i2` tensor: int or uint in ONNX, which the IR type alone cannot say."""
    element = element_type_of(type_)
    return isinstance(element, IntegerType) and element.is_signless and element.width in (2, 4, 8, 16)


def is_integer_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in "iu" or dtype in SUB_BYTE_INTEGER_DTYPES


def as_storage_array(array: np.ndarray, target: ir.DataType) -> np.ndarray:
    """`array` as the numpy dtype of `target`: a view when the bytes already match (int8 -> uint8, a
    memory-mapped weight stays mapped), else a two's-complement wrap (int8 -> int4 keeps -8..7)."""
    dtype = np.dtype(target.numpy())
    if array.dtype == dtype:
        return array
    if array.dtype.kind in "iu" and dtype.kind in "iu" and array.dtype.itemsize == dtype.itemsize:
        return array.view(dtype)
    if is_integer_dtype(array.dtype) and is_integer_dtype(dtype):
        info = ml_dtypes.iinfo(dtype)
        values = array.astype(np.int64) & ((1 << info.bits) - 1)
        if info.min < 0:
            values = np.where(values > info.max, values - (1 << info.bits), values)
        return values.astype(dtype)
    return array.astype(dtype)


def check_writable(type_: Type, where: str) -> None:
    """InputError naming `where` when `type_` cannot appear in an ONNX model."""
    element = element_type_of(type_)
    if isinstance(element, CalibratedQuantizedType):
        raise InputError(
            f"{where} has type {type_}: a !quant.calibrated range cannot be written to ONNX; "
            f"finalize the calibration (choose scales and zero points) first"
        )
