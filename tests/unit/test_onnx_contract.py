"""qconvert/ir/dialects/onnx.py: the one reader of what the ONNX lifter writes into the IR."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx
from qconvert.ir.dialects import onnx as contract
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.parser import ParserOptions
from qconvert.ir.parser import parse_module as _parse


def parse_module(text: str):
    return _parse(text, options=ParserOptions(allow_unregistered_dialect=True))


def _generic(module_text: str, name: str):
    module = parse_module(module_text)
    return module, next(op for op in contract.main_function(module).body.ops if op.name == name)


def test_element_types_are_onnx_enum_values_names_and_dtypes() -> None:
    for onnx_type, entry in contract.ELEMENT_TYPES.items():
        assert entry.onnx_type == onnx_type
        assert helper.tensor_dtype_to_string(onnx_type) == f"TensorProto.{entry.name.upper()}"
        assert np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type)) == entry.dtype, entry.name
    assert contract.FLOAT16 == TensorProto.FLOAT16
    assert contract.element_type(TensorProto.UNDEFINED) is None
    assert contract.ELEMENT_TYPES_BY_NAME["uint8"].is_unsigned_integer
    assert not contract.ELEMENT_TYPES_BY_NAME["int8"].is_unsigned_integer


def _lifted(opset: int | None, node: onnx.NodeProto, inputs, outputs, initializers=()):
    graph = helper.make_graph([node], "g", inputs, outputs, list(initializers))
    imports = [] if opset is None else [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=imports)
    return import_onnx(model)


def test_absent_inputs_of_a_lifted_clip() -> None:
    """Clip(x, "", max): operand 0 is position 0, operand 1 is position 2; position 1 is absent."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    high = helper.make_tensor("high", TensorProto.FLOAT, [], [1.0])
    node = helper.make_node("Clip", ["x", "", "high"], ["y"], name="clip")
    module = _lifted(13, node, [x], [y], [high])
    op = next(o for o in contract.main_function(module).body.ops if o.name == "onnx.Clip")
    assert contract.absent_positions(op) == {1}
    assert contract.present_positions(op) == [0, 2]
    assert contract.onnx_input(op, 0) is op.operands[0]
    assert contract.onnx_input(op, 1) is None
    assert contract.onnx_input(op, 2) is op.operands[1]
    assert contract.onnx_input(op, 3) is None  # past the last input
    assert contract.by_position(op, ["a", "b"]) == ["a", None, "b"]
    assert contract.node_name(op) == "clip"
    assert contract.node_label(op) == "node 'clip'"
    assert contract.op_label(op) == "'onnx.Clip' (node 'clip')"
    assert contract.default_opset(module) == 13
    assert contract.op_default_opset(op) == 13


def test_trailing_absent_inputs() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    module = _lifted(13, helper.make_node("Clip", ["x", "", ""], ["y"]), [x], [y])
    op = next(o for o in contract.main_function(module).body.ops if o.name == "onnx.Clip")
    assert contract.present_positions(op) == [0]
    assert contract.by_position(op, [7]) == [7, None, None]
    assert contract.node_label(op) == "node ''"  # the lifter records ONNX's empty name
    assert contract.op_label(op) == "'onnx.Clip'"


def test_unsigned_marks_on_constants_and_arguments() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [2])
    y = helper.make_tensor_value_info("y", TensorProto.UINT8, [2])
    offset = helper.make_tensor("offset", TensorProto.UINT8, [2], [1, 200])
    module = _lifted(21, helper.make_node("Add", ["x", "offset"], ["y"]), [x], [y], [offset])
    function = contract.main_function(module)
    constant = next(o for o in function.body.ops if o.name == "arith.constant")
    assert contract.elem_type_name(constant) == "uint8"
    assert contract.is_unsigned(constant)
    argument_attributes = function.attributes["arg_attrs"].elements[0]
    assert contract.is_unsigned(argument_attributes)
    assert contract.signature_names(function) == ["x"]
    assert contract.signature_names(function, "outputs") == ["y"]
    add = next(o for o in function.body.ops if o.name == "onnx.Add")
    assert not contract.is_unsigned(add)
    assert contract.elem_type_name(None) is None


MODULE_WITHOUT_OPSET = """
func.func private @helper(%x: tensor<2xf32>) -> tensor<2xf32>
func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "onnx.com.microsoft.Gelu"(%x) : (tensor<2xf32>) -> tensor<2xf32>
  %1 = "onnx.Relu"(%0) {onnx.node_name = "r"} : (tensor<2xf32>) -> tensor<2xf32>
  return %1 : tensor<2xf32>
}
"""


def test_defaults_without_opset_import_and_names() -> None:
    module, gelu = _generic(MODULE_WITHOUT_OPSET, "onnx.com.microsoft.Gelu")
    assert contract.opset_imports(module) == {}
    assert contract.recorded_default_opset(module) is None
    assert contract.default_opset(module) == contract.DEFAULT_OPSET == 21
    assert contract.op_domain(gelu) == "com.microsoft"
    assert contract.node_name(gelu) is None
    assert contract.node_label(gelu) == "unnamed node"
    assert contract.signature_names(contract.main_function(module)) == [None]  # no onnx.name recorded
    _, relu = _generic(MODULE_WITHOUT_OPSET, "onnx.Relu")
    assert contract.op_domain(relu) == ""
    assert contract.node_name(relu) == "r"


def test_main_function_rule() -> None:
    module = parse_module(MODULE_WITHOUT_OPSET)
    main = contract.main_function(module)
    assert isinstance(main, FuncOp) and main.sym_name == "main"
    only = parse_module("func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }")
    assert contract.main_function(only).sym_name == "f"  # the only defined function
    declarations = parse_module("func.func private @main(%x: tensor<2xf32>) -> tensor<2xf32>")
    with pytest.raises(InputError, match=r"no func.func @main to run \(functions: @main\)"):
        contract.main_function(declarations, "to run")
    two = parse_module("func.func @f() { return }\nfunc.func @g() { return }")
    with pytest.raises(InputError, match="functions: @f, @g"):
        contract.main_function(two)


def test_absent_outputs_of_a_lifted_lstm() -> None:
    """LSTM(X, W, R) with outputs ("", Y_h, ""): only Y_h is a result, at ONNX output position 1."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 3])
    y_h = helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [1, 1, 4])
    w = onnx.numpy_helper.from_array(rng.normal(size=(1, 16, 3)).astype(np.float32), "w")
    r = onnx.numpy_helper.from_array(rng.normal(size=(1, 16, 4)).astype(np.float32), "r")
    node = helper.make_node("LSTM", ["x", "w", "r"], ["", "y_h", ""], hidden_size=4)
    module = _lifted(14, node, [x], [y_h], [w, r])
    op = next(o for o in contract.main_function(module).body.ops if o.name == "onnx.LSTM")
    assert contract.absent_positions(op, "outputs") == {0, 2}
    assert contract.present_positions(op, "outputs") == [1]
    assert contract.by_position(op, ["h"], "outputs") == [None, "h", None]
    assert contract.absent_positions(op) == set()
    assert contract.present_positions(op) == [0, 1, 2]
