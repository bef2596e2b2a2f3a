"""ONNX node attributes <-> IR attributes, losslessly for every kind an `onnx.*` op can carry.

| ONNX kind | IR attribute                                   |
|-----------|------------------------------------------------|
| INT       | `IntegerAttr(v, i64)`                          |
| FLOAT     | `FloatAttr(v, f32)`                            |
| STRING    | `StringAttr` (UTF-8)                           |
| INTS      | `array<i64: ...>` (DenseArrayAttr)             |
| FLOATS    | `array<f32: ...>` (DenseArrayAttr)             |
| STRINGS   | `[...]` ArrayAttr of StringAttr                |
| TENSOR    | `dense<...> : tensor<...>` (DenseElementsAttr) |
| TENSORS   | ArrayAttr of DenseElementsAttr                 |

GRAPH / GRAPHS (If, Loop, Scan bodies), SPARSE_TENSOR(S) and TYPE_PROTO(S) are not lifted yet: the
lifter reports the node as unsupported rather than drop the attribute. The reverse direction
(`to_onnx_attribute`, in qconvert/onnx_attributes.py so that backends share it) rebuilds the node for
the interpreter and the ONNX backend. Two ambiguities remain: an empty STRINGS and an empty TENSORS
list both become `[]` (read back as STRINGS), and a TENSOR attribute of an unsigned or non-numpy type
is rebuilt from its IR element type plus `onnx.elem_type` where recorded.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, numpy_helper

from qconvert.ir.attributes import (
    ArrayAttr,
    Attribute,
    DenseArrayAttr,
    DenseElementsAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
)
from qconvert.ir.types import F32, I64, RankedTensorType
from qconvert.onnx_attributes import to_onnx_attribute

from .dtypes import ELEMENT_TYPES, UNKNOWN_ELEMENT

__all__ = ["UNSUPPORTED_KINDS", "from_onnx_attribute", "tensor_attr", "to_onnx_attribute"]

UNSUPPORTED_KINDS = {
    AttributeProto.GRAPH: "GRAPH",
    AttributeProto.GRAPHS: "GRAPHS",
    AttributeProto.SPARSE_TENSOR: "SPARSE_TENSOR",
    AttributeProto.SPARSE_TENSORS: "SPARSE_TENSORS",
    AttributeProto.TYPE_PROTO: "TYPE_PROTO",
    AttributeProto.TYPE_PROTOS: "TYPE_PROTOS",
}


def tensor_attr(array: np.ndarray, onnx_type: int) -> DenseElementsAttr:
    """A dense constant of `array`, typed `tensor<shape x element>` with the ONNX type's IR element."""
    entry = ELEMENT_TYPES.get(onnx_type)
    element = entry.ir_type if entry is not None else UNKNOWN_ELEMENT
    array = np.asarray(array)
    array.setflags(write=False)
    return DenseElementsAttr(array, RankedTensorType(tuple(array.shape), element))


def from_onnx_attribute(attribute: AttributeProto) -> Attribute:
    """The IR attribute of one ONNX attribute; raises KeyError for the kinds in UNSUPPORTED_KINDS."""
    kind = attribute.type
    if kind == AttributeProto.INT:
        return IntegerAttr(int(attribute.i), I64)
    if kind == AttributeProto.FLOAT:
        return FloatAttr(float(np.float32(attribute.f)), F32)
    if kind == AttributeProto.STRING:
        return StringAttr(attribute.s.decode("utf-8", errors="surrogateescape"))
    if kind == AttributeProto.INTS:
        return DenseArrayAttr(I64, tuple(int(v) for v in attribute.ints))
    if kind == AttributeProto.FLOATS:
        return DenseArrayAttr(F32, tuple(float(np.float32(v)) for v in attribute.floats))
    if kind == AttributeProto.STRINGS:
        return ArrayAttr(
            tuple(StringAttr(s.decode("utf-8", errors="surrogateescape")) for s in attribute.strings)
        )
    if kind == AttributeProto.TENSOR:
        return tensor_attr(numpy_helper.to_array(attribute.t), attribute.t.data_type)
    if kind == AttributeProto.TENSORS:
        return ArrayAttr(tuple(tensor_attr(numpy_helper.to_array(t), t.data_type) for t in attribute.tensors))
    raise KeyError(UNSUPPORTED_KINDS.get(kind, str(kind)))
