"""QOperator nodes: lifted to quant-typed `qconvert.*` ops, printed and parsed back, and interpreted
bit-exactly as onnxruntime's CPU kernels compute them (graph optimizations off), on random data with
rounding ties and saturation, uint8 and int8, per-tensor and per-channel weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import interpret
from qconvert.ir import ParserOptions, parse_module, print_module, verify
from qconvert.ir.dialects.qconvert import QOperatorOp
from qconvert.ir.quant_types import QuantizedType, UniformQuantizedPerAxisType
from qconvert.ir.types import element_type_of

MS = "com.microsoft"
DTYPES = [np.uint8, np.int8]


def random_q(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def build(
    node: onnx.NodeProto, inputs: dict[str, np.ndarray], initializers: dict[str, np.ndarray], opset: int = 21
) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for name, a in inputs.items()
        ],
        [onnx.ValueInfoProto(name=name) for name in node.output if name],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in initializers.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 10
    return onnx.shape_inference.infer_shapes(model)


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def check_bit_exact(
    node: onnx.NodeProto,
    inputs: dict[str, np.ndarray],
    initializers: dict[str, np.ndarray],
    lifted_as: str,
    opset: int = 21,
) -> object:
    """Lift, print, parse back, interpret the parsed module, compare every output with onnxruntime."""
    model = build(node, inputs, initializers, opset)
    expected = onnxruntime_outputs(model, inputs)
    module = import_onnx(model)
    text = print_module(module)
    parsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    # NOTE: uint8 constants print as 200 and parse back as -56 (same bits in a signless i8 tensor; the
    # parser's choice, not this frontend's), so the first round trip can respell them: require the
    # second to be a fixed point and interpret the *parsed* module.
    again = print_module(parsed)
    assert print_module(parse_module(again, options=ParserOptions(allow_unregistered_dialect=True))) == again
    assert again.count("qconvert.") == text.count("qconvert.")
    names = [op.name for op in module.body.ops[0].body.ops]  # type: ignore[attr-defined]
    assert lifted_as in names and not any(n.startswith("onnx.") for n in names), names
    # Both the lifted and the parsed ops are the dialect's classes, and pass its verifier.
    for lifted in (module, parsed):
        verify(lifted)
        lifted_op = next(op for op in lifted.walk() if op.name == lifted_as)
        assert isinstance(lifted_op, QOperatorOp) and lifted_op.name == lifted_as
    ours = interpret(parsed, inputs)  # type: ignore[arg-type]
    for name, reference in zip([o for o in node.output if o], expected):
        result = np.asarray(ours[name])
        assert result.dtype == reference.dtype, name
        assert result.shape == reference.shape, name
        mismatches = (
            int(np.sum(result.view(np.uint8) != reference.view(np.uint8)))
            if result.dtype.itemsize == 1
            else int(np.sum(result != reference))
        )
        assert mismatches == 0, f"{name}: {mismatches} of {reference.size} differ"
    return module


def lifted_op(module: object, name: str) -> object:
    return next(op for op in module.body.ops[0].body.ops if op.name == name)  # type: ignore[attr-defined]


# QLinearConv ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_conv(dtype: type, per_channel: bool, ties: bool) -> None:
    rng = np.random.default_rng(1)
    x = random_q(rng, dtype, (2, 4, 9, 9))
    w = random_q(rng, np.int8, (6, 2, 3, 3))
    channels = 6
    if ties:  # multiplier 0.5: every odd accumulator is a tie; small y scale also saturates
        x_scale, w_scale, y_scale = (
            np.float32(0.5),
            np.ones(channels if per_channel else (), np.float32),
            np.float32(1.0),
        )
    else:
        x_scale = np.float32(0.02)
        w_scale = rng.uniform(0.001, 0.05, channels if per_channel else ()).astype(np.float32)
        y_scale = np.float32(rng.uniform(0.05, 0.5))
    w_zero = np.zeros(channels if per_channel else (), np.int8)
    bias = rng.integers(-2000, 2000, channels).astype(np.int32)
    node = helper.make_node(
        "QLinearConv",
        ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
        ["y"],
        name="conv",
        group=2,
        pads=[1, 0, 1, 2],
        strides=[2, 1],
        dilations=[1, 2],
    )
    initializers = {
        "xs": x_scale,
        "xz": np.array(3 if dtype is np.uint8 else -5, dtype),
        "w": w,
        "ws": w_scale,
        "wz": w_zero,
        "ys": y_scale,
        "yz": np.array(128 if dtype is np.uint8 else 1, dtype),
        "b": bias,
    }
    module = check_bit_exact(node, {"x": x}, initializers, "qconvert.qlinear_conv")
    weight_type = element_type_of(lifted_op(module, "qconvert.qlinear_conv").operands[1].type)  # type: ignore[attr-defined]
    assert isinstance(weight_type, UniformQuantizedPerAxisType) == per_channel


# QLinearMatMul, MatMulInteger ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_matmul(dtype: type, per_column: bool, ties: bool) -> None:
    rng = np.random.default_rng(2)
    a = random_q(rng, dtype, (2, 3, 5, 16))
    b = random_q(rng, dtype, (16, 8))
    shape = (8,) if per_column else ()
    if ties:
        scales = (np.float32(0.5), np.ones(shape, np.float32), np.float32(2.0))
    else:
        scales = (np.float32(0.03), rng.uniform(0.001, 0.02, shape).astype(np.float32), np.float32(0.1))
    b_zero = random_q(rng, dtype, shape) // 4
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name="mm")
    initializers = {
        "as": scales[0],
        "az": np.array(7, dtype),
        "b": b,
        "bs": scales[1],
        "bz": b_zero.astype(dtype),
        "ys": scales[2],
        "yz": np.array(3, dtype),
    }
    check_bit_exact(node, {"a": a}, initializers, "qconvert.qlinear_matmul")


def test_qlinear_matmul_float32_requantization_not_float64() -> None:
    """The element onnx's reference evaluator gets wrong (float64 multiplier) is right here."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        a = random_q(rng, np.uint8, (16, 64))
        b = random_q(rng, np.uint8, (64, 16))
        scales = [np.float32(rng.uniform(0.001, 0.1)) for _ in range(3)]
        node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
        initializers = {
            "as": scales[0],
            "az": np.array(120, np.uint8),
            "b": b,
            "bs": scales[1],
            "bz": np.array(131, np.uint8),
            "ys": scales[2],
            "yz": np.array(128, np.uint8),
        }
        check_bit_exact(node, {"a": a}, initializers, "qconvert.qlinear_matmul")


@pytest.mark.parametrize("b_dtype", DTYPES)
def test_matmul_integer(b_dtype: type) -> None:
    rng = np.random.default_rng(4)
    a = random_q(rng, np.uint8, (3, 4, 16))
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"], name="mmi")
    initializers = {
        "b": random_q(rng, b_dtype, (16, 8)),
        "az": np.array(200, np.uint8),
        "bz": random_q(rng, b_dtype, (8,)),
    }
    check_bit_exact(node, {"a": a}, initializers, "qconvert.matmul_integer")


def test_matmul_integer_with_dynamic_zero_point_stays_generic() -> None:
    node = helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"], name="mmi")
    model = build(
        node,
        {"a": np.zeros((2, 4), np.uint8), "az": np.zeros((), np.uint8)},
        {"b": np.ones((4, 3), np.uint8)},
    )
    names = [op.name for op in import_onnx(model).body.ops[0].body.ops]  # type: ignore[attr-defined]
    assert "onnx.MatMulInteger" in names


def test_conv_integer() -> None:
    rng = np.random.default_rng(5)
    x = random_q(rng, np.uint8, (1, 3, 8, 8))
    node = helper.make_node(
        "ConvInteger", ["x", "w", "xz", "wz"], ["y"], name="ci", pads=[1, 1, 1, 1], strides=[2, 2]
    )
    initializers = {
        "w": random_q(rng, np.uint8, (4, 3, 3, 3)),
        "xz": np.array(100, np.uint8),
        "wz": np.array(7, np.uint8),
    }
    check_bit_exact(node, {"x": x}, initializers, "qconvert.conv_integer")


# com.microsoft element-wise --------------------------------------------------------------------------
SHAPES = [
    ((64,), (64,)),
    ((4, 37), (37,)),
    ((4, 37), (4, 1)),
    ((4, 1), (4, 37)),
    ((5,), (1,)),
    ((1,), (9,)),
    ((2, 3, 33), (2, 3, 33)),
]


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", SHAPES)
def test_qlinear_add_mul(op_type: str, dtype: type, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    rng = np.random.default_rng(6)
    for trial in range(6):
        a, b = random_q(rng, dtype, shapes[0]), random_q(rng, dtype, shapes[1])
        if trial == 0:  # ties: ratios 0.5, odd zero points
            scales = [np.float32(0.5), np.float32(0.25), np.float32(1.0)]
        elif trial == 1:  # saturation
            scales = [np.float32(0.5), np.float32(0.5), np.float32(0.01)]
        else:
            scales = [np.float32(rng.uniform(0.001, 0.1)) for _ in range(3)]
        zeros = [random_q(rng, dtype, ()) for _ in range(3)]
        node = helper.make_node(
            op_type, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["c"], domain=MS, name="bin"
        )
        initializers = {
            "as": scales[0],
            "az": zeros[0],
            "bs": scales[1],
            "bz": zeros[1],
            "cs": scales[2],
            "cz": zeros[2],
        }
        check_bit_exact(
            node,
            {"a": a, "b": b},
            initializers,
            f"qconvert.{'qlinear_add' if op_type == 'QLinearAdd' else 'qlinear_mul'}",
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_concat(dtype: type) -> None:
    rng = np.random.default_rng(7)
    inputs = {f"x{i}": random_q(rng, dtype, (2, 3 + i, 5)) for i in range(3)}
    node = helper.make_node(
        "QLinearConcat",
        ["ys", "yz", "x0", "s0", "z0", "x1", "s1", "z1", "x2", "s2", "z2"],
        ["y"],
        domain=MS,
        axis=1,
    )
    initializers = {
        "ys": np.float32(0.05),
        "yz": np.array(5, dtype),
        "s0": np.float32(0.05),
        "z0": np.array(5, dtype),  # same as the output: copied
        "s1": np.float32(0.025),  # ties after the ratio
        "z1": np.array(3, dtype),
        "s2": np.float32(0.3),  # saturates
        "z2": np.array(-1 if dtype is np.int8 else 1, dtype),
    }
    check_bit_exact(node, inputs, initializers, "qconvert.qlinear_concat")


@pytest.mark.parametrize("op_type", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_lookup_table_ops(op_type: str, dtype: type) -> None:
    x = np.arange(256, dtype=np.uint8).view(dtype).reshape(4, 64)  # every table entry
    rng = np.random.default_rng(8)
    for _ in range(10):
        attributes = {"alpha": float(rng.uniform(0.01, 0.5))} if op_type == "QLinearLeakyRelu" else {}
        node = helper.make_node(op_type, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, **attributes)
        initializers = {
            "xs": np.float32(rng.uniform(0.01, 0.1)),
            "xz": random_q(rng, dtype, ()),
            "ys": np.float32(rng.uniform(0.002, 0.05)),
            "yz": random_q(rng, dtype, ()),
        }
        name = "qconvert.qlinear_sigmoid" if op_type == "QLinearSigmoid" else "qconvert.qlinear_leaky_relu"
        check_bit_exact(node, {"x": x}, initializers, name)


# Pooling ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(dtype: type, channels_last: int) -> None:
    rng = np.random.default_rng(9)
    x = random_q(rng, dtype, (2, 5, 6, 3) if channels_last else (2, 3, 5, 6))
    node = helper.make_node(
        "QLinearGlobalAveragePool",
        ["x", "xs", "xz", "ys", "yz"],
        ["y"],
        domain=MS,
        channels_last=channels_last,
    )
    for y_scale in (np.float32(0.05), np.float32(0.0501), np.float32(0.02)):
        initializers = {
            "xs": np.float32(0.05),
            "xz": np.array(9, dtype),
            "ys": y_scale,
            "yz": np.array(2, dtype),
        }
        check_bit_exact(node, {"x": x}, initializers, "qconvert.qlinear_global_average_pool")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_qlinear_average_pool(dtype: type, count_include_pad: int, ceil_mode: int) -> None:
    rng = np.random.default_rng(10)
    x = random_q(rng, dtype, (2, 3, 8, 7))
    node = helper.make_node(
        "QLinearAveragePool",
        ["x", "xs", "xz", "ys", "yz"],
        ["y"],
        domain=MS,
        kernel_shape=[3, 2],
        strides=[2, 2],
        pads=[1, 0, 1, 1],
        count_include_pad=count_include_pad,
        ceil_mode=ceil_mode,
    )
    for y_scale in (np.float32(0.1), np.float32(0.05), np.float32(0.013)):
        initializers = {
            "xs": np.float32(0.1),
            "xz": np.array(3, dtype),
            "ys": y_scale,
            "yz": np.array(5, dtype),
        }
        check_bit_exact(node, {"x": x}, initializers, "qconvert.qlinear_average_pool")


# QGemm, dynamic quantization ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("quantized_output", [False, True])
def test_qgemm(dtype: type, per_column: bool, quantized_output: bool) -> None:
    rng = np.random.default_rng(11)
    a = random_q(rng, dtype, (5, 16))
    shape = (8,) if per_column else ()
    inputs = ["a", "as", "az", "b", "bs", "bz", "c"] + (["ys", "yz"] if quantized_output else [])
    node = helper.make_node("QGemm", inputs, ["y"], domain=MS, transB=1, alpha=0.75)
    initializers = {
        "as": np.float32(0.02),
        "az": np.array(4, dtype),
        "b": random_q(rng, dtype if dtype is np.int8 else np.int8, (8, 16)),
        "bs": rng.uniform(0.001, 0.03, shape).astype(np.float32),
        "bz": np.zeros(shape, np.int8),
        "c": rng.integers(-3000, 3000, 8).astype(np.int32),
    }
    if quantized_output:
        initializers.update({"ys": np.float32(0.07), "yz": np.array(6, dtype)})
    check_bit_exact(node, {"a": a}, initializers, "qconvert.qgemm")


def test_dynamic_quantize_linear() -> None:
    rng = np.random.default_rng(12)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"])
    for scale in (1.0, 0.01, 40.0):
        x = (rng.standard_normal((3, 17)) * scale).astype(np.float32)
        check_bit_exact(node, {"x": x}, {}, "qconvert.dynamic_quantize_linear")
    check_bit_exact(node, {"x": np.abs(x)}, {}, "qconvert.dynamic_quantize_linear")


@pytest.mark.parametrize("b_dtype", DTYPES)
@pytest.mark.parametrize("per_column", [False, True])
def test_dynamic_quantize_matmul(b_dtype: type, per_column: bool) -> None:
    rng = np.random.default_rng(13)
    a = rng.standard_normal((2, 4, 16)).astype(np.float32)
    shape = (8,) if per_column else ()
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], ["y"], domain=MS)
    initializers = {
        "b": random_q(rng, b_dtype, (16, 8)),
        "bs": rng.uniform(0.001, 0.03, shape).astype(np.float32),
        "bz": (random_q(rng, b_dtype, shape) // 8).astype(b_dtype),
        "bias": rng.standard_normal(8).astype(np.float32),
    }
    check_bit_exact(node, {"a": a}, initializers, "qconvert.dynamic_quantize_matmul")


def test_lifted_operands_and_results_are_quant_typed() -> None:
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name="mm")
    initializers = {
        "as": np.float32(0.5),
        "az": np.array(1, np.uint8),
        "b": np.ones((4, 3), np.uint8),
        "bs": np.array([0.25, 0.5, 1.0], np.float32),
        "bz": np.array([0, 1, 2], np.uint8),
        "ys": np.float32(2.0),
        "yz": np.array(3, np.uint8),
    }
    module = import_onnx(build(node, {"a": np.zeros((2, 4), np.uint8)}, initializers))
    op = lifted_op(module, "qconvert.qlinear_matmul")
    types = [element_type_of(v.type) for v in [*op.operands, *op.results]]  # type: ignore[attr-defined]
    assert all(isinstance(t, QuantizedType) for t in types)
    assert isinstance(types[1], UniformQuantizedPerAxisType) and types[1].quantized_dimension == 1
    assert len(op.operands) == 2  # type: ignore[attr-defined]
    assert "!quant.uniform<u8:f32, 2.000000e+00:3>" in print_module(module)


@pytest.mark.parametrize("name", ["digits_cnn", "tiny_encoder"])
def test_qoperator_sample_models_lift_fully_typed_and_round_trip(name: str) -> None:
    """Every QOperator node of the committed QOp models is lifted; the contrib outputs (and the ops after
    them) get types from `infer_contrib_shapes`, so the text parses back."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "models" / f"{name}.qop.onnx"
    module = import_onnx(str(path))
    text = print_module(module)
    assert "onnx.com.microsoft" not in text and "unknown" not in text and "tensor<*x" not in text
    parsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    again = print_module(parsed)
    assert print_module(parse_module(again, options=ParserOptions(allow_unregistered_dialect=True))) == again


def test_contrib_output_with_dynamic_dims_still_types_what_follows() -> None:
    """A QOperator ViT with a dynamic batch: QLinearAdd -> Transpose -> DequantizeLinear failed to lift
    ('the element type of input ... is unknown'); the element type flows without the dims, and the
    pinned model runs as onnxruntime does."""
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    zero = numpy_helper.from_array(np.array(128, np.uint8), "z")
    nodes = [
        helper.make_node(
            "QLinearAdd",
            ["a", "s", "z", "b", "s", "z", "s", "z"],
            ["sum"],
            domain="com.microsoft",
            name="add",
        ),
        helper.make_node("Transpose", ["sum"], ["t"], perm=[1, 0], name="transpose"),
        helper.make_node("DequantizeLinear", ["t", "s", "z"], ["y"], name="dq"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, ["batch", 3]),
            helper.make_tensor_value_info("b", onnx.TensorProto.UINT8, ["batch", 3]),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [scale, zero],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    import_onnx(model)  # raised before: the DequantizeLinear's input had no element type
    rng = np.random.default_rng(0)
    feeds = {name: rng.integers(0, 256, (2, 3), dtype=np.uint8) for name in ("a", "b")}
    ours = interpret(import_onnx(model, {"a": (2, 3), "b": (2, 3)}), feeds)["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(ours, session.run(None, feeds)[0])
