"""ONNX tensor names of the values of a lifted module (calibration ranges are keyed by them).

NOTE: the ONNX frontend keeps node names (`onnx.node_name`) and graph input/output names, not the names
of intermediate tensors. Each generic `onnx.*` op is one ONNX node, emitted in graph order, with its
present inputs as operands and present outputs as results; so pairing those ops with the model's nodes
in order names every operand and result, initializers and Constant outputs included. Nodes the
frontend lifts to something else (Constant, QuantizeLinear, DequantizeLinear, QOperator ops) name no
op here; their outputs are named where a generic op consumes them.
"""

from __future__ import annotations

import os

import onnx
from onnx import ModelProto

from qconvert.errors import InputError
from qconvert.frontends.onnx.load import MICROSOFT_DOMAIN
from qconvert.ir.attributes import StringAttr
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import ReturnOp
from qconvert.ir.dialects.onnx import DEFAULT_DOMAINS, main_function, node_name, signature_names

TENSOR_NAME_ATTR = "onnx.tensor_name"
"""On a calibrated/quantized `quant.qcast`: the ONNX name of the tensor it quantizes."""

CONSTANT_NAME_ATTR = "onnx.name"
"""On an `arith.constant`: the ONNX initializer (or Constant output) it came from."""

_DEFAULT_DOMAINS = DEFAULT_DOMAINS


def _load(model: ModelProto | str | os.PathLike[str]) -> ModelProto:
    if isinstance(model, ModelProto):
        return model
    try:
        return onnx.load(os.fspath(model), load_external_data=False)
    except Exception as error:  # protobuf/OS errors: report, never a traceback
        raise InputError(f"{model}: cannot read the ONNX model to name tensors: {error}") from None


def tensor_values(
    module: ModuleOp, model: ModelProto | str | os.PathLike[str] | None = None
) -> dict[str, Value]:
    """ONNX tensor name -> IR value of `module`'s @main; intermediate values need the source `model`.

    Also stamps `onnx.name` on each `arith.constant` the model names (if not already there).
    """
    function = main_function(module)
    block = function.regions[0].entry
    values: dict[str, Value] = {}
    for name, argument in zip(signature_names(function, "inputs"), block.arguments):
        if name:
            values[name] = argument
    terminator = block.ops[-1] if block.ops else None
    if isinstance(terminator, ReturnOp):
        for name, operand in zip(signature_names(function, "outputs"), terminator.operands):
            if name:
                values.setdefault(name, operand)
    if model is None:
        return values
    graph = _load(model).graph
    ops = [op for op in block.ops if op.name.startswith("onnx.") and node_name(op) is not None]
    # Generic ops follow their nodes' order; a node lifted to something else (a Constant with a tensor
    # value, Q/DQ with constant parameters, QOperator ops) has no generic op and is skipped.
    position = 0
    for node in graph.node:
        if node.op_type == "Constant" and any(a.name == "value" for a in node.attribute):
            continue
        if position == len(ops) or not _same(node, ops[position]):
            if node.domain in (*_DEFAULT_DOMAINS, MICROSOFT_DOMAIN):
                continue  # lifted to a quant cast or a qconvert.* op; a wrong model leaves ops unmatched
            raise InputError(
                f"the module does not come from this model: node '{node.name}' ({node.op_type}) has no op"
            )
        op = ops[position]
        position += 1
        inputs = [name for name in node.input if name]
        outputs = [name for name in node.output if name]
        for name, operand in zip(inputs, op.operands):
            values.setdefault(name, operand)
            _stamp_constant(operand, name)
        for name, result in zip(outputs, op.results):
            values.setdefault(name, result)
    if position != len(ops):
        op = ops[position]
        raise InputError(
            f"the module does not come from this model: op {op.name} ('{node_name(op)}') matches no node"
        )
    return values


def _same(node: onnx.NodeProto, op: Operation) -> bool:
    expected = (
        f"onnx.{node.op_type}" if node.domain in _DEFAULT_DOMAINS else f"onnx.{node.domain}.{node.op_type}"
    )
    return op.name == expected and node_name(op) == node.name


def _stamp_constant(value: Value, name: str) -> None:
    producer = value.owner_op()
    if isinstance(producer, ConstantOp) and CONSTANT_NAME_ATTR not in producer.attributes:
        producer.attributes[CONSTANT_NAME_ATTR] = StringAttr(name)


def constant_name(op: Operation) -> str | None:
    attribute = op.attributes.get(CONSTANT_NAME_ATTR)
    return attribute.value if isinstance(attribute, StringAttr) else None
