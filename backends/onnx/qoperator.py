"""The QOperator ops the frontend lifts to the `qconvert` dialect (frontends/onnx/qoperator.py), written
back as the ONNX / com.microsoft nodes they came from.

Each op class of qconvert/ir/dialects/qconvert.py names its node (`ONNX_DOMAIN`, `ONNX_OP_TYPE`) and the
node's inputs in schema order (`ONNX_INPUTS`, the same table the frontend reads): a quant-typed operand is
its storage tensor, its scale and its zero point; a quant-typed result adds the output's scale and zero
point (QLinearConv: `x x_scale x_zero_point, w ..., y_scale y_zero_point, [bias]`; the integer ops write
zero points only, their IR scale is 1).

Zero points are always written (zeros where the original node had none: the same computation), and a
one-element scale is written 0-d."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir

from qconvert.errors import InputError
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.qconvert import RESULT, SCALE_SUFFIX, ZERO_POINT_SUFFIX, QGemmOp, QOperatorOp
from qconvert.ir.quant_types import QuantizedType
from qconvert.ir.types import element_type_of

from .qdq import qdq_parameters
from .types import UnwritableType

if TYPE_CHECKING:
    from .write import Writer

Inputs = list[ir.Value | None]


class Layout:
    """Builds one node's inputs from a `qconvert.*` op, through the writer's values and initializers."""

    def __init__(self, writer: Writer, op: Operation, name: str) -> None:
        self.writer = writer
        self.op = op
        self.name = name

    def parameters(self, value: Value, label: str, *, scale: bool = True) -> Inputs:
        quant_type = element_type_of(value.type)
        if not isinstance(quant_type, QuantizedType):
            raise InputError(f"'{self.op.name}' ({self.name}): {label} of type {value.type} is not quantized")
        try:
            params = qdq_parameters(quant_type, value.type, quantize=False)
        except UnwritableType as error:
            raise InputError(f"'{self.op.name}' ({self.name}): {label}: {error}") from None
        zero_point = self.writer.parameter(
            params.zero_point, params.storage, f"{self.name}_{label}_zero_point"
        )
        if not scale:
            return [zero_point]
        return [
            self.writer.parameter(params.scale, params.scale_type, f"{self.name}_{label}_scale"),
            zero_point,
        ]

    def parameter_group(self, owner: str, operands: dict[str, Value], *, scale: bool) -> dict[str, ir.Value]:
        """{"scale": ..., "zero_point": ...} of operand `owner` (or of the result, `y`), under the label the
        writer names their initializers by; empty for QGemm's float result (it has none)."""
        op = self.op
        assert isinstance(op, QOperatorOp)
        if owner == RESULT:
            value = op.results[0]
            if isinstance(op, QGemmOp) and not isinstance(element_type_of(value.type), QuantizedType):
                return {}
        else:
            value = operands[owner]
        written = self.parameters(value, op.PARAMETER_LABELS.get(owner, owner), scale=scale)
        return dict(zip(("scale", "zero_point") if scale else ("zero_point",), written, strict=True))


def node_inputs(layout: Layout) -> Inputs:
    """The node's inputs in the order of the op class's ONNX layout (`ONNX_INPUTS`): an operand's storage
    tensor, its scale / zero point (written together, zero point first, the first time the layout names
    one), the result's, None for an absent optional input; trailing absent inputs are left off."""
    op = layout.op
    assert isinstance(op, QOperatorOp)
    entries = op.onnx_inputs()
    operands = op.named_operands()
    parameters: dict[str, dict[str, ir.Value]] = {}
    inputs: Inputs = []
    for entry in entries:
        if entry in operands:
            inputs.append(layout.writer.values[operands[entry]])
            continue
        owner, part = split_parameter(entry)
        if owner is None:  # an optional operand the op does not have
            inputs.append(None)
            continue
        if owner not in parameters:
            parameters[owner] = layout.parameter_group(owner, operands, scale=owner + SCALE_SUFFIX in entries)
        inputs.append(parameters[owner].get(part))
    while inputs and inputs[-1] is None:
        inputs.pop()
    return inputs


def split_parameter(entry: str) -> tuple[str | None, str]:
    """`x_scale` -> ("x", "scale"), `x_zero_point` -> ("x", "zero_point"), an operand name -> (None, "")."""
    for suffix in (SCALE_SUFFIX, ZERO_POINT_SUFFIX):
        if entry.endswith(suffix):
            return entry.removesuffix(suffix), suffix[1:]
    return None, ""


def qoperator_node(writer: Writer, op: Operation) -> tuple[str, str, Inputs, str] | None:
    """(domain, op type, inputs, node name) of a lifted QOperator op; None for another op."""
    if not isinstance(op, QOperatorOp):
        return None
    name = writer.node_name(op, op.ONNX_OP_TYPE)
    return op.ONNX_DOMAIN, op.ONNX_OP_TYPE, node_inputs(Layout(writer, op, name)), name
