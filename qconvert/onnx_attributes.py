"""IR attributes -> ONNX node attributes: the one reverse mapping, shared by the interpreter and the
ONNX backend (frontends and backends may not import each other, DESIGN.md; both may import this).

The forward direction and the table of kinds live in frontends/onnx/attributes.py, which re-exports
`to_onnx_attribute` from here.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from qconvert.ir.attributes import (
    ArrayAttr,
    Attribute,
    DenseArrayAttr,
    DenseElementsAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
)
from qconvert.ir.types import FloatType


def _to_tensor(name: str, attribute: DenseElementsAttr) -> TensorProto:
    return numpy_helper.from_array(np.asarray(attribute.array), name)


def to_onnx_attribute(name: str, attribute: Attribute) -> AttributeProto:
    """The ONNX attribute an `onnx.*` op's IR attribute came from (see frontends/onnx/attributes.py)."""
    if isinstance(attribute, IntegerAttr):
        return helper.make_attribute(name, int(attribute.value), attr_type=AttributeProto.INT)
    if isinstance(attribute, FloatAttr):
        return helper.make_attribute(name, float(attribute.value), attr_type=AttributeProto.FLOAT)
    if isinstance(attribute, StringAttr):
        return helper.make_attribute(name, attribute.value, attr_type=AttributeProto.STRING)
    if isinstance(attribute, DenseArrayAttr):
        if isinstance(attribute.element_type, FloatType):
            return helper.make_attribute(name, list(attribute.values), attr_type=AttributeProto.FLOATS)
        return helper.make_attribute(name, [int(v) for v in attribute.values], attr_type=AttributeProto.INTS)
    if isinstance(attribute, DenseElementsAttr):
        return helper.make_attribute(name, _to_tensor(name, attribute), attr_type=AttributeProto.TENSOR)
    if isinstance(attribute, ArrayAttr):
        if attribute.elements and all(isinstance(e, DenseElementsAttr) for e in attribute.elements):
            tensors = [_to_tensor(name, e) for e in attribute.elements]  # type: ignore[arg-type]
            return helper.make_attribute(name, tensors, attr_type=AttributeProto.TENSORS)
        strings = [e.value for e in attribute.elements if isinstance(e, StringAttr)]
        return helper.make_attribute(name, strings, attr_type=AttributeProto.STRINGS)
    raise TypeError(f"attribute '{name}' = {attribute} has no ONNX equivalent")
