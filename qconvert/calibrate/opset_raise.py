"""Raise a lifted module's default-domain opset, converting every generic `onnx.*` op whose signature
changed on the way (ReduceMean's `axes` attribute becomes an input at 18, Squeeze's at 13, Clip's
min/max at 11, Softmax's 2-D coercion at 13, ...).

NOTE: the module's `onnx.opset_import` says at which opset its generic ops are written; the interpreter,
the StableHLO lowering and the ONNX writer all read the ops at that version, so finalize may not raise
the number without converting the ops. The ops that need it are written as the (unconnected) nodes of
one ONNX model at the old opset, converted by onnx.version_converter (the converter the ONNX writer
uses), lifted back by the ONNX frontend, and each node's ops are spliced in place of its op: the
converter's new Constant nodes become `arith.constant` (named `<node>_<input>`, `rmean_axes`), and a
conversion into several nodes (Softmax 12 -> 13: Shape, Flatten, Softmax, Reshape) becomes several ops.
The op keeps its `onnx.node_name` and its result types. A node the converter cannot convert is an
InputError naming the node, why the opset rises, and the converter's reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import helper, version_converter

from qconvert.backends.onnx import UnwritableType, data_type, shape_of
from qconvert.calibrate.tensor_names import CONSTANT_NAME_ATTR
from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import input_names, output_names
from qconvert.ir.attributes import (
    ArrayAttr,
    Attribute,
    DictionaryAttr,
    IntegerAttr,
    StringAttr,
)
from qconvert.ir.core import BlockArgument, Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp, ReturnOp
from qconvert.ir.dialects.onnx import (
    ABSENT_INPUTS,
    ABSENT_OUTPUTS,
    DEFAULT_DOMAIN_KEY,
    ELEM_TYPE,
    NODE_NAME,
    OPSET_IMPORT,
    main_function,
    node_name,
    present_positions,
    recorded_default_opset,
)
from qconvert.ir.types import I64, element_type_of
from qconvert.onnx_attributes import onnx_node

# Converted without a word but wrongly by onnx.version_converter (checked for the 18 -> 21 step).
_SILENTLY_MISCONVERTED = frozenset({"GroupNormalization"})
# Set by the lifter from the one-node model; the original op's own values are kept instead.
_LIFTED_BOOKKEEPING = (ABSENT_INPUTS, ABSENT_OUTPUTS)


def raise_opset(module: ModuleOp, target: int, reason: str) -> None:
    """Convert the module's generic default-domain ops to opset `target`, then record `target`.

    `reason` says why the opset rises ("int16 Q/DQ need opset 21"), for the error of an op that cannot
    be converted. A module without an opset_import entry, or already at `target` or newer, only gets
    the entry.
    """
    base = recorded_default_opset(module)
    if base is not None and base < target:
        function = main_function(module)
        ops = [
            op
            for op in function.body.ops
            if (op_type := _default_domain_op_type(op)) is not None
            and _changes_between(op_type, base, target)
        ]
        for op in ops:
            if op.regions:  # an If/Loop body would not travel through the one-node model
                raise InputError(
                    f"{_label(op)} has subgraphs: raising the opset from {base} to {target} ({reason}) "
                    f"does not convert them"
                )
            if _default_domain_op_type(op) in _SILENTLY_MISCONVERTED and base < 21 <= target:
                raise InputError(
                    f"{_label(op)} cannot be raised from opset {base} to {target} ({reason}): opset 21 reads "
                    f"its scale and bias per channel, not per group, and onnx.version_converter leaves them "
                    f"as they are"
                )
        if ops:
            _convert_ops(ops, base, target, reason, function)
    opsets = module.attributes.get(OPSET_IMPORT)
    entries = dict(opsets.entries) if isinstance(opsets, DictionaryAttr) else {}
    entries[DEFAULT_DOMAIN_KEY] = IntegerAttr(target, I64)
    module.attributes[OPSET_IMPORT] = DictionaryAttr(tuple(sorted(entries.items())))


def _default_domain_op_type(op: Operation) -> str | None:
    """`ReduceMean` for `"onnx.ReduceMean"`; None for other dialects and other domains."""
    prefix, _, op_type = op.name.partition(".")
    return op_type if prefix == "onnx" and op_type and "." not in op_type else None


def _changes_between(op_type: str, base: int, target: int) -> bool:
    """Whether the operator has a version in (base, target] (or none at all at `target`)."""
    try:
        return onnx.defs.get_schema(op_type, target, "").since_version > base
    except onnx.defs.SchemaError:
        return True  # removed by `target` (Scatter): the converter replaces it or says why not


def _node_name(op: Operation) -> str:
    return node_name(op) or ""


def _label(op: Operation) -> str:
    """`node 'rmean' (ReduceMean)`, for messages."""
    return f"node '{_node_name(op) or '<unnamed>'}' ({_default_domain_op_type(op)})"


@dataclass
class _Batch:
    """The ops to convert as the nodes of one ONNX model (one converter call: each call costs ~15 ms),
    and what each of the model's graph inputs and outputs stands for."""

    ops: list[Operation]
    inputs: dict[str, int] = field(default_factory=dict)  # graph input -> position among the op's operands
    outputs: dict[str, tuple[int, Value]] = field(default_factory=dict)  # graph output -> (op, result)


def _convert_ops(ops: list[Operation], base: int, target: int, reason: str, function: FuncOp) -> None:
    batch = _Batch(ops)
    try:
        lifted = _converted(batch, base, target, function)
    except Exception as batch_error:  # which node: convert them one by one
        for op in ops:
            try:
                _converted(_Batch([op]), base, target, function)
            except Exception as error:
                raise _conversion_error(op, base, target, reason, error) from None
        raise InputError(
            f"cannot convert the model from opset {base} to opset {target} ({reason}): {batch_error}"
        ) from None
    _splice(batch, lifted, function, target)


def _conversion_error(op: Operation, base: int, target: int, reason: str, error: Exception) -> InputError:
    why = (
        f"the converted node does not lift back: {error}"
        if isinstance(error, InputError)
        else f"onnx.version_converter failed: {error}"  # RuntimeError, InferenceError, ...
    )
    return InputError(
        f"{_label(op)} cannot be converted from opset {base} to opset {target} ({reason}): {why}"
    )


def _converted(batch: _Batch, base: int, target: int, function: FuncOp) -> ModuleOp:
    """The batch's ops, written at opset `base`, converted to `target` and lifted back."""
    nodes, inputs, outputs = [], [], []
    for index, op in enumerate(batch.ops):
        node, node_inputs, node_outputs = _node(op, index, batch, function)
        nodes.append(node)
        inputs.extend(node_inputs)
        outputs.extend(node_outputs)
    graph = helper.make_graph(nodes, "convert", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", base)])
    converted = version_converter.convert_version(model, target)
    return import_onnx(converted, resource_threshold=0)


def _node(
    op: Operation, index: int, batch: _Batch, function: FuncOp
) -> tuple[onnx.NodeProto, list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """`op` as node `index` of the batch: operands are graph inputs `node<index>_input_<i>`, results graph
    outputs `node<index>_output_<i>`, absent optional inputs and outputs left empty as the op records."""
    inputs, outputs = [], []
    for position, operand in enumerate(op.operands):
        name = f"node{index}_input_{position}"
        batch.inputs[name] = position
        inputs.append(_value_info(name, operand, function))
    for position, result in enumerate(op.results):
        name = f"node{index}_output_{position}"
        batch.outputs[name] = (index, result)
        outputs.append(_value_info(name, result, function))
    node = onnx_node(op, [info.name for info in inputs], [info.name for info in outputs], _node_name(op))
    return node, inputs, outputs


def _value_info(name: str, value: Value, function: FuncOp) -> onnx.ValueInfoProto:
    """`name` typed as `value` is; untyped when the IR type has no ONNX equivalent (a training-only
    output shape inference left unknown), which the converter does not need."""
    try:
        elem_type = data_type(element_type_of(value.type), _elem_type_attribute(value, function))
        shape = shape_of(value.type)
    except UnwritableType:
        return onnx.ValueInfoProto(name=name)
    dims = None if shape is None else [d if isinstance(d, int) else None for d in shape]
    return helper.make_tensor_value_info(name, int(elem_type), dims)


def _elem_type_attribute(value: Value, function: FuncOp) -> Attribute | None:
    """The ONNX element type the lifter recorded for a value (signless IR integers hide uint8)."""
    producer = value.owner_op()
    if isinstance(producer, ConstantOp):
        return producer.attributes.get(ELEM_TYPE)
    if isinstance(value, BlockArgument) and value.owner is function.body:
        entries = function.attributes.get("arg_attrs")
        elements = entries.elements if isinstance(entries, ArrayAttr) else ()
        entry = elements[value.index] if value.index < len(elements) else None
        if isinstance(entry, DictionaryAttr):
            return dict(entry.entries).get(ELEM_TYPE)
    return None


def _splice(batch: _Batch, lifted: ModuleOp, function: FuncOp, target: int) -> None:
    """Put each op's converted ops in its place, wired to its operands, its results' uses moved to them."""
    block = main_function(lifted).body
    returned = block.terminator
    assert isinstance(returned, ReturnOp)
    # Lifted argument -> the operand position it stands for; read from the op when it is replaced, since
    # an operand produced by an earlier converted op is by then that op's replacement.
    operand_positions: dict[Value, int] = {
        argument: batch.inputs[name] for argument, name in zip(block.arguments, input_names(lifted))
    }
    replacements: list[list[tuple[Value, Value]]] = [[] for _ in batch.ops]  # per op: (result, new)
    owner: dict[Operation, int] = {}  # lifted op -> the op it converts (the outputs it feeds)
    for name, new in zip(output_names(lifted), returned.operands):
        index, result = batch.outputs[name]
        replacements[index].append((result, new))
        stack = [new]
        while stack:
            producer = stack.pop().owner_op()
            if producer is None:
                continue
            if producer in owner:  # reached from another output; the converter shares no node between two
                assert owner[producer] == index, f"converted nodes {owner[producer]} and {index} share a node"
                continue
            owner[producer] = index
            stack.extend(producer.operands)
    groups: list[list[Operation]] = [[] for _ in batch.ops]
    for lifted_op in block.ops:
        if lifted_op in owner:
            groups[owner[lifted_op]].append(lifted_op)
    returned.drop_all_references()
    positions = {op: index for index, op in enumerate(batch.ops)}
    body = function.body
    ops: list[Operation] = []
    for op in body.ops:
        index = positions.get(op)
        if index is None:
            ops.append(op)
            continue
        for moved in groups[index]:
            _adopt(moved, op, operand_positions, target)
            moved.parent = body
            ops.append(moved)
        for result, new in replacements[index]:
            if new in operand_positions:  # converted into a pass-through of its input
                new = op.operands[operand_positions[new]]
            else:
                new.type = result.type  # the original op's result types: what the rest of the module expects
            result.replace_all_uses_with(new)
        op.drop_all_references()
        op.parent = None
    body.ops[:] = ops


def _adopt(moved: Operation, op: Operation, operand_positions: dict[Value, int], target: int) -> None:
    """Wire a lifted op of `op`'s conversion to `op`'s operands and name it after `op`."""
    for position, operand in enumerate(moved.operands):
        if operand in operand_positions:
            moved.set_operand(position, op.operands[operand_positions[operand]])
    name = _node_name(op)
    if _node_name(moved) == name and (name or moved.name == op.name):
        # The converted node itself: it keeps the original's bookkeeping (node name, ...).
        for key, value in op.attributes.items():
            if key.startswith("onnx.") and key not in _LIFTED_BOOKKEEPING:
                moved.attributes[key] = value
    elif isinstance(moved, ConstantOp):
        _name_constant(moved, name, target)
    elif name and not _node_name(moved):
        moved.attributes[NODE_NAME] = StringAttr(f"{name}_{moved.name.removeprefix('onnx.')}")


def _name_constant(constant: ConstantOp, node_name: str, opset: int) -> None:
    """`<node>_<input>` (`rmean_axes`) for a constant the converter made of an attribute: the ONNX writer
    names the initializer after it."""
    for user, index in constant.result.uses:
        position = present_positions(user)[index]
        op_type = _default_domain_op_type(user)
        if op_type is None:
            continue
        try:
            schema = onnx.defs.get_schema(op_type, opset, "")
        except onnx.defs.SchemaError:
            continue
        formal = schema.inputs[min(position, len(schema.inputs) - 1)].name
        constant.attributes[CONSTANT_NAME_ATTR] = StringAttr(f"{node_name}_{formal}" if node_name else formal)
        return
