"""The `qconvert` dialect (qconvert/ir/dialects/qconvert.py): every op the frontend lifts is built as its
class, prints in the generic form and parses back to the same class and the same text; the verifier refuses
a wrong operand count or element type with a message naming the op; the ONNX layout is the frontend's."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qconvert.errors import VerifyError
from qconvert.frontends.onnx import import_onnx
from qconvert.ir import ParserOptions, parse_module, print_module, verify
from qconvert.ir.dialects import qconvert as dialect
from qconvert.ir.dialects.builtin import ModuleOp

MS = "com.microsoft"


def every_qoperator_model() -> onnx.ModelProto:
    """One small graph with a node of each QOperator kind the frontend lifts, and a float8 Q/DQ pair."""
    make = helper.make_node
    params = {
        "s": np.array(0.05, np.float32),
        "z": np.array(128, np.uint8),
        "w": np.arange(-4, 4, dtype=np.int8).reshape(4, 2, 1, 1),
        "ws": np.array(0.02, np.float32),
        "wz": np.array(0, np.int8),
        "bias": np.array([1, -2, 3, -4], np.int32),
        "b": (np.arange(12, dtype=np.uint8) * 20).reshape(4, 3),
        "bi": np.arange(-6, 6, dtype=np.int8).reshape(4, 3),
        "c": np.array([5, -5, 7], np.int32),
        "f8s": np.array(0.5, np.float32),
        "f8z": numpy_helper.from_array(np.array(0, ml_dtypes.float8_e4m3fn), "f8z"),
    }
    nodes = [
        make("QLinearConv", ["x", "s", "z", "w", "ws", "wz", "s", "z", "bias"], ["conv"], name="conv"),
        make("ConvInteger", ["x", "w", "z", "wz"], ["convi"], name="convi"),
        make("QLinearGlobalAveragePool", ["conv", "s", "z", "s", "z"], ["gap"], domain=MS, name="gap"),
        make(
            "QLinearAveragePool",
            ["conv", "s", "z", "s", "z"],
            ["pool"],
            domain=MS,
            kernel_shape=[2, 2],
            name="pool",
        ),
        make("QLinearSigmoid", ["conv", "s", "z", "s", "z"], ["sig"], domain=MS, name="sig"),
        make("QLinearLeakyRelu", ["conv", "s", "z", "s", "z"], ["leaky"], domain=MS, alpha=0.1, name="leaky"),
        make("QLinearAdd", ["sig", "s", "z", "leaky", "s", "z", "s", "z"], ["add"], domain=MS, name="add"),
        make("QLinearMul", ["sig", "s", "z", "leaky", "s", "z", "s", "z"], ["mul"], domain=MS, name="mul"),
        make(
            "QLinearConcat",
            ["s", "z", "add", "s", "z", "mul", "s", "z"],
            ["cat"],
            domain=MS,
            axis=1,
            name="cat",
        ),
        make(
            "QLinearSoftmax",
            ["conv", "s", "z", "s", "z"],
            ["soft"],
            domain=MS,
            axis=-1,
            opset=13,
            name="soft",
        ),
        make("QLinearMatMul", ["a", "s", "z", "b", "s", "z", "s", "z"], ["qmm"], name="qmm"),
        make("MatMulInteger", ["a", "b", "z", "z"], ["mmi"], name="mmi"),
        make("QGemm", ["a", "s", "z", "b", "s", "z", "c", "s", "z"], ["gemm_q"], domain=MS, name="gemm_q"),
        make("QGemm", ["a", "s", "z", "b", "s", "z"], ["gemm_f"], domain=MS, name="gemm_f"),
        make("DynamicQuantizeMatMul", ["f", "bi", "ws", "wz"], ["dqmm"], domain=MS, name="dqmm"),
        make("DynamicQuantizeLinear", ["f"], ["dq_y", "dq_s", "dq_z"], name="dql"),
        make("QuantizeLinear", ["f", "f8s", "f8z"], ["f8"], name="q8"),
        make("DequantizeLinear", ["f8", "f8s", "f8z"], ["f8_back"], name="dq8"),
    ]
    outputs = [
        "convi", "gap", "pool", "cat", "soft", "qmm", "mmi", "gemm_q", "gemm_f", "dqmm",
        "dq_y", "dq_s", "dq_z", "f8", "f8_back",
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "every_qoperator",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, 2, 4, 4]),
            helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, [2, 4]),
            helper.make_tensor_value_info("f", onnx.TensorProto.FLOAT, [2, 4]),
        ],
        [onnx.ValueInfoProto(name=name) for name in outputs],
        [v if isinstance(v, onnx.TensorProto) else numpy_helper.from_array(v, k) for k, v in params.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def parse(text: str) -> ModuleOp:
    return parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))


@pytest.fixture(scope="module")
def lifted() -> ModuleOp:
    return import_onnx(every_qoperator_model())


def test_every_lifted_op_is_its_class_and_round_trips_byte_identically(lifted: ModuleOp) -> None:
    built = {type(op) for op in lifted.walk() if op.name.startswith("qconvert.")}
    assert built == {*dialect.QOPERATOR_OPS, dialect.FloatStorageCastOp}, built
    verify(lifted)
    text = print_module(lifted)
    again = parse(text)
    parsed = {type(op) for op in again.walk() if op.name.startswith("qconvert.")}
    assert parsed == built
    verify(again)
    assert print_module(again) == text
    assert '"qconvert.qlinear_conv"(' in text  # the generic form, as when the ops were unregistered


def test_named_operands_are_the_onnx_layout_of_the_lifted_ops(lifted: ModuleOp) -> None:
    ops = {type(op): op for op in lifted.walk() if isinstance(op, dialect.QOperatorOp)}
    conv = ops[dialect.QLinearConvOp]
    assert isinstance(conv, dialect.QLinearConvOp)
    assert [conv.x, conv.w, conv.bias] == conv.operands
    gemm = [op for op in lifted.walk() if isinstance(op, dialect.QGemmOp)]
    assert [g.c is None for g in gemm] == [False, True]  # QGemm with C and without
    dqmm = ops[dialect.DynamicQuantizeMatMulOp]
    assert isinstance(dqmm, dialect.DynamicQuantizeMatMulOp) and dqmm.bias is None
    assert dialect.QLinearConvOp.onnx_positions("w") == (3, 4, 5)
    assert dialect.QGemmOp.onnx_parameter_positions() == (1, 2, 4, 5, 7, 8)
    assert dialect.MatMulIntegerOp.onnx_positions("b") == (1, None, 3)
    concat = ops[dialect.QLinearConcatOp]
    assert concat.onnx_inputs() == (
        "y_scale", "y_zero_point", "x0", "x0_scale", "x0_zero_point", "x1", "x1_scale", "x1_zero_point"
    )  # fmt: skip


def verify_error(text: str) -> str:
    with pytest.raises(VerifyError) as caught:
        verify(parse(text))
    return str(caught.value)


U8 = "!quant.uniform<u8:f32, 5.000000e-02:128>"
I8 = "!quant.uniform<i8:f32, 5.000000e-02>"


def test_a_wrong_operand_count_is_refused_naming_the_op() -> None:
    message = verify_error(f"""
func.func @main(%a: tensor<2x4x{U8}>) -> tensor<2x4x{U8}> {{
  %y = "qconvert.qlinear_matmul"(%a) : (tensor<2x4x{U8}>) -> tensor<2x4x{U8}>
  return %y : tensor<2x4x{U8}>
}}""")
    assert "'qconvert.qlinear_matmul' op expects 2 operands (a, b), but got 1" in message


def test_a_plain_operand_where_a_quantized_one_is_expected_is_refused() -> None:
    message = verify_error(f"""
func.func @main(%x: tensor<4xf32>, %b: tensor<4x{U8}>) -> tensor<4x{U8}> {{
  %y = "qconvert.qlinear_add"(%x, %b) : (tensor<4xf32>, tensor<4x{U8}>) -> tensor<4x{U8}>
  return %y : tensor<4x{U8}>
}}""")
    assert "'qconvert.qlinear_add' op operand #0 (a) must be a tensor of quantized type" in message


def test_operands_of_one_onnx_type_variable_must_share_their_storage() -> None:
    message = verify_error(f"""
func.func @main(%a: tensor<4x{U8}>, %b: tensor<4x{I8}>) -> tensor<4x{U8}> {{
  %y = "qconvert.qlinear_mul"(%a, %b) : (tensor<4x{U8}>, tensor<4x{I8}>) -> tensor<4x{U8}>
  return %y : tensor<4x{U8}>
}}""")
    assert "'qconvert.qlinear_mul' op operands a and b and y must share one storage type" in message


def test_an_integer_op_with_a_quantized_result_is_refused() -> None:
    message = verify_error(f"""
func.func @main(%a: tensor<2x4x{U8}>, %b: tensor<4x3x{U8}>) -> tensor<2x3x{U8}> {{
  %y = "qconvert.matmul_integer"(%a, %b) : (tensor<2x4x{U8}>, tensor<4x3x{U8}>) -> tensor<2x3x{U8}>
  return %y : tensor<2x3x{U8}>
}}""")
    assert "'qconvert.matmul_integer' op result must not be quantized" in message


def test_the_float_storage_cast_refuses_integer_storage() -> None:
    message = verify_error(f"""
func.func @main(%x: tensor<4xi8>) -> tensor<4x{I8}> {{
  %y = "qconvert.storage_cast"(%x) : (tensor<4xi8>) -> tensor<4x{I8}>
  return %y : tensor<4x{I8}>
}}""")
    assert "'qconvert.storage_cast' op storage type of" in message and "use quant.scast" in message


def test_the_float_storage_cast_of_float8_verifies() -> None:
    f8 = "!quant.uniform<f8E4M3FN:f32, 5.000000e-01>"
    module = parse(f"""
func.func @main(%x: tensor<4xf8E4M3FN>) -> tensor<4x{f8}> {{
  %y = "qconvert.storage_cast"(%x) : (tensor<4xf8E4M3FN>) -> tensor<4x{f8}>
  return %y : tensor<4x{f8}>
}}""")
    verify(module)
    assert any(isinstance(op, dialect.FloatStorageCastOp) for op in module.walk())
