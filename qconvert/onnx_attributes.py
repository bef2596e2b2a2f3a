"""IR attributes -> ONNX node attributes: the one reverse mapping, shared by the interpreter and the
ONNX backend (frontends and backends may not import each other, DESIGN.md; both may import this); and
where a generic `onnx.*` op's operands and results sit among its node's ONNX inputs and outputs.

The forward direction and the table of kinds live in frontends/onnx/attributes.py, which re-exports
`to_onnx_attribute` from here. Which positions are absent is the lifted-ONNX contract's
(qconvert/ir/dialects/onnx.py); `absent_positions` is re-exported from there.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, NodeProto, TensorProto, helper, numpy_helper

from qconvert.ir.attributes import (
    ArrayAttr,
    Attribute,
    DenseArrayAttr,
    DenseElementsAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
)
from qconvert.ir.core import Operation
from qconvert.ir.dialects.onnx import absent_positions, by_position
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


def _with_absent(op: Operation, names: list[str], kind: str) -> list[str]:
    """`names` of the present positions, with "" at the absent ones."""
    return [name or "" for name in by_position(op, names, kind)]


def onnx_node(op: Operation, input_names: list[str], output_names: list[str], name: str = "") -> NodeProto:
    """The generic `onnx.[<domain>.]<Op>` op as an ONNX node over the given names of its operands and
    results (absent optional positions left empty), with its ONNX attributes (not the `onnx.*` ones)."""
    _, _, qualified = op.name.partition(".")
    domain, _, op_type = qualified.rpartition(".")
    node = helper.make_node(
        op_type,
        _with_absent(op, input_names, "inputs"),
        _with_absent(op, output_names, "outputs"),
        name=name,
        domain=domain,
    )
    node.attribute.extend(
        to_onnx_attribute(key, value) for key, value in op.attributes.items() if not key.startswith("onnx.")
    )
    return node


__all__ = ["absent_positions", "onnx_node", "to_onnx_attribute"]
