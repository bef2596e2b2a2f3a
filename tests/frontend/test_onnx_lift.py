"""The ONNX frontend on models built here: the IR it produces, its numerics against onnxruntime, and
every bad input it must refuse with a clear error naming the node (or file)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import interpret
from qconvert.ir import ParserOptions, parse_module, print_module, verify
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp, StorageCastOp
from qconvert.ir.quant_types import UniformQuantizedPerAxisType

F32 = TensorProto.FLOAT


def tensor(name: str, array: object, dtype: object = None) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=dtype), name)


def model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[int]]],
    outputs: list[tuple[str, int, list[int] | None]],
    initializers: list[TensorProto] = (),  # type: ignore[assignment]
    opset: int = 21,
    extra_opsets: dict[str, int] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(initializers),
    )
    opsets = [helper.make_opsetid("", opset)] + [
        helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()
    ]
    result = helper.make_model(graph, opset_imports=opsets)
    result.ir_version = 10 if opset >= 21 else 8
    return result


def q_model(
    scale: object, zero_point: object | None, x_shape: list[int], opset: int = 21, **attributes: object
) -> onnx.ModelProto:
    inputs = ["x", "s"] + (["zp"] if zero_point is not None else [])
    initializers = [tensor("s", scale, np.float32)]
    if zero_point is not None:
        initializers.append(zero_point if isinstance(zero_point, TensorProto) else tensor("zp", zero_point))
    out_type = initializers[-1].data_type if zero_point is not None else TensorProto.UINT8
    node = helper.make_node("QuantizeLinear", inputs, ["y"], name="quant_x", **attributes)
    return model([node], [("x", F32, x_shape)], [("y", out_type, x_shape)], initializers, opset)


def dq_model(
    x_type: int, scale: object, zero_point: object | None, x_shape: list[int], **attrs: object
) -> onnx.ModelProto:
    inputs = ["x", "s"] + (["zp"] if zero_point is not None else [])
    initializers = [tensor("s", scale, np.float32)]
    if zero_point is not None:
        initializers.append(zero_point if isinstance(zero_point, TensorProto) else tensor("zp", zero_point))
    node = helper.make_node("DequantizeLinear", inputs, ["y"], name="dequant_x", **attrs)
    return model([node], [("x", x_type, x_shape)], [("y", F32, x_shape)], initializers)


def round_trip(module: object) -> object:
    verify(module)  # type: ignore[arg-type]
    text = print_module(module)  # type: ignore[arg-type]
    parsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    verify(parsed)
    assert print_module(parsed) == text
    return parsed


def run_onnxruntime(proto: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def assert_matches_onnxruntime(proto: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    module = import_onnx(proto)
    ours = [interpret(m, feed) for m in (module, round_trip(module))]  # type: ignore[arg-type]
    theirs = run_onnxruntime(proto, feed)
    for output, value in zip(proto.graph.output, theirs):
        for result in ours:
            mine = result[output.name]
            if value.dtype == np.uint8 and mine.dtype == np.dtype(ml_dtypes.float8_e4m3fn):
                mine = mine.view(np.uint8)
            assert mine.dtype == value.dtype and mine.tobytes() == value.tobytes(), (
                f"{output.name}: ours {mine!r}, onnxruntime {value!r}"
            )
    return ours[0]


# The IR the lifter produces ---------------------------------------------------------------------------
def test_weight_initializer_feeding_dequantize_becomes_a_storage_constant() -> None:
    weights = np.array([[-3, 7, 127], [0, -128, 5]], np.int8)
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "w_s", "w_zp"], ["w_f"], axis=0, name="dq_w"),
        helper.make_node("MatMul", ["x", "w_f"], ["y"], name="mm"),
    ]
    proto = model(
        nodes,
        [("x", F32, [1, 2])],
        [("y", F32, [1, 3])],
        [tensor("w", weights), tensor("w_s", [0.5, 0.25], np.float32), tensor("w_zp", [0, 1], np.int8)],
    )
    module = import_onnx(proto)
    ops = list(module.walk())
    constant = next(op for op in ops if isinstance(op, ConstantOp))
    assert np.array_equal(constant.value.array, weights)  # type: ignore[attr-defined]
    assert str(constant.result.type) == "tensor<2x3xi8>"
    scast = next(op for op in ops if isinstance(op, StorageCastOp))
    assert scast.input is constant.result
    quant_type = scast.result.type.element_type  # type: ignore[attr-defined]
    assert isinstance(quant_type, UniformQuantizedPerAxisType)
    assert (quant_type.scales, quant_type.zero_points, quant_type.quantized_dimension) == (
        (0.5, 0.25),
        (0, 1),
        0,
    )
    assert any(isinstance(op, DequantizeCastOp) and op.input is scast.result for op in ops)
    assert any(op.name == "onnx.MatMul" for op in ops)
    assert_matches_onnxruntime(proto, {"x": np.array([[2.0, -4.0]], np.float32)})


def test_quantize_then_dequantize_shares_the_quantized_value() -> None:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq"),
    ]
    proto = model(
        nodes, [("x", F32, [4])], [("y", F32, [4])], [tensor("s", 0.5, np.float32), tensor("zp", 3, np.int8)]
    )
    module = import_onnx(proto)
    ops = list(module.walk())
    qcast = next(op for op in ops if isinstance(op, QuantizeCastOp))
    dcast = next(op for op in ops if isinstance(op, DequantizeCastOp))
    assert dcast.input is qcast.result
    assert not any(isinstance(op, StorageCastOp) for op in ops), "the unused scast pair should be gone"


def test_other_ops_keep_attributes_names_and_absent_inputs() -> None:
    nodes = [
        helper.make_node("Clip", ["x", "", "hi"], ["c"], name="clip"),
        helper.make_node("Transpose", ["c"], ["t"], name="tr", perm=[1, 0]),
        helper.make_node("LeakyRelu", ["t"], ["y"], name="lr", alpha=0.25),
    ]
    proto = model(
        nodes, [("x", F32, [2, 3])], [("y", F32, [3, 2])], [tensor("hi", 1.0, np.float32)], opset=13
    )
    text = print_module(import_onnx(proto))
    assert '"onnx.Clip"' in text and "onnx.absent_inputs = array<i64: 1>" in text
    assert "perm = array<i64: 1, 0>" in text and "alpha = 2.500000e-01 : f32" in text
    assert 'onnx.node_name = "tr"' in text
    x = np.array([[-2.0, 0.5, 3.0], [1.5, -0.25, 0.0]], np.float32)
    assert_matches_onnxruntime(proto, {"x": x})


def test_non_default_domain_ops_are_prefixed_with_their_domain() -> None:
    nodes = [helper.make_node("Gelu", ["x"], ["y"], name="g", domain="com.microsoft")]
    proto = model(nodes, [("x", F32, [3])], [("y", F32, [3])], extra_opsets={"com.microsoft": 1})
    text = print_module(import_onnx(proto))
    assert '"onnx.com.microsoft.Gelu"' in text
    assert "{ai.onnx = 21 : i64, com.microsoft = 1 : i64}" in text


# Numerics against onnxruntime -----------------------------------------------------------------------
@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23, 25])
def test_quantize_dequantize_per_tensor_matches_onnxruntime_at_every_opset(opset: int) -> None:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq"),
    ]
    proto = model(
        nodes,
        [("x", F32, [8])],
        [("q", TensorProto.INT8, [8]), ("y", F32, [8])],
        [tensor("s", 0.5, np.float32), tensor("zp", 3, np.int8)],
        opset=opset,
    )
    x = np.array([0.25, 0.75, 1.25, -0.25, 100.0, -100.0, 1.0e-3, 63.75], np.float32)
    ours = assert_matches_onnxruntime(proto, {"x": x})
    assert ours["q"][:4].tolist() == [3, 5, 5, 3]  # ties round before the odd zero point is added


@pytest.mark.parametrize("opset", [13, 21])
def test_per_axis_quantize_matches_onnxruntime(opset: int) -> None:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], axis=1, name="q")]
    proto = model(
        nodes,
        [("x", F32, [2, 3, 2])],
        [("y", TensorProto.UINT8, [2, 3, 2])],
        [tensor("s", [0.5, 0.1, 3.0], np.float32), tensor("zp", [0, 128, 255], np.uint8)],
        opset=opset,
    )
    x = np.random.default_rng(0).normal(0, 40, (2, 3, 2)).astype(np.float32)
    assert_matches_onnxruntime(proto, {"x": x})


def test_storage_limit_zero_points_and_special_values_match_onnxruntime() -> None:
    x = np.array([np.inf, -np.inf, np.nan, 0.5, -0.5, 1.5, 2.5, 1e9], np.float32)
    for zero_point in (np.int8(-128), np.int8(127), np.uint8(0), np.uint8(255)):
        proto = q_model(0.5, np.array(zero_point), [8])
        assert_matches_onnxruntime(proto, {"x": x})


def test_float16_input_follows_onnxruntime_which_divides_in_float32() -> None:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], name="q")]
    proto = model(
        nodes,
        [("x", TensorProto.FLOAT16, [4096])],
        [("y", TensorProto.UINT8, [4096])],
        [tensor("s", 0.3, np.float16), tensor("zp", 3, np.uint8)],
    )
    x = np.random.default_rng(1).normal(0, 40, 4096).astype(np.float16)
    assert_matches_onnxruntime(proto, {"x": x})


@pytest.mark.parametrize("saturate", [0, 1])
def test_float8_saturate_matches_onnxruntime(saturate: int) -> None:
    zero = helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, [], [0.0])
    proto = q_model(1.0, zero, [7], saturate=saturate)
    x = np.array([np.inf, -np.inf, np.nan, 1e6, -300.0, 3.3, 448.0], np.float32)
    module = import_onnx(proto)
    assert f"saturate = {'true' if saturate else 'false'}" in print_module(module)
    assert_matches_onnxruntime(proto, {"x": x})


def test_blocked_dequantize_of_int4_weights_matches_onnxruntime() -> None:
    weights = np.random.default_rng(2).integers(-8, 8, (4, 6)).astype(ml_dtypes.int4)
    w = numpy_helper.from_array(weights, "w")
    scales = np.random.default_rng(3).uniform(0.01, 1.0, (4, 2)).astype(np.float32)
    # The dequantized weights are the output: a float MatMul after them would round differently in the
    # onnx reference and in onnxruntime, which says nothing about the quantization.
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=1, block_size=3, name="dq_w"),
        helper.make_node("Relu", ["wf"], ["y"], name="relu"),
    ]
    proto = model(nodes, [], [("wf", F32, [4, 6]), ("y", F32, [4, 6])], [w, tensor("ws", scales)])
    text = print_module(import_onnx(proto))
    assert "!quant.uniform<i4:f32:{0:1, 1:3}" in text
    assert_matches_onnxruntime(proto, {})


# Bad input --------------------------------------------------------------------------------------------
def test_truncated_protobuf_is_refused(tmp_path: Path) -> None:
    data = q_model(0.5, np.uint8(3), [4]).SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"truncated\.onnx: not a valid ONNX model"):
        import_onnx(path)


def test_garbage_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x00\xffthis is not an onnx model\xfe")
    with pytest.raises(InputError, match=r"garbage\.onnx: not a valid ONNX model"):
        import_onnx(path)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such model file"):
        import_onnx(tmp_path / "absent.onnx")


def test_missing_initializer_is_refused_naming_the_node() -> None:
    nodes = [helper.make_node("Add", ["x", "bias"], ["y"], name="add_bias")]
    proto = model(nodes, [("x", F32, [2])], [("y", F32, [2])])
    with pytest.raises(InputError, match=r"node 'add_bias' \(Add\): input 'bias' .*missing initializer"):
        import_onnx(proto)


@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan"), float("inf")])
def test_bad_scale_is_refused_naming_the_node(scale: float) -> None:
    with pytest.raises(
        InputError, match=r"node 'quant_x' \(QuantizeLinear, opset 21\): scale must be finite and > 0"
    ):
        import_onnx(q_model(scale, np.uint8(3), [4]))


def test_scale_outside_the_expressed_type_is_refused() -> None:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], name="q16")]
    proto = model(
        nodes, [("x", TensorProto.FLOAT16, [2])], [("y", TensorProto.UINT8, [2])],
        [tensor("s", 1e-30, np.float32), tensor("zp", 0, np.uint8)], opset=23,
    )  # fmt: skip
    with pytest.raises(InputError, match=r"node 'q16' .*scale .* out of expressed type range"):
        import_onnx(proto)


def test_zero_point_out_of_the_storage_range_is_refused() -> None:
    proto = dq_model(TensorProto.INT8, 0.5, np.int16(300), [4])
    with pytest.raises(InputError, match=r"node 'dequant_x' .*zero point 300 is out of range \[-128, 127\]"):
        import_onnx(proto)


def test_nonzero_float8_zero_point_is_refused() -> None:
    zero = helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, [], [2.0])
    with pytest.raises(InputError, match=r"node 'quant_x' .*zero point must be 0 for float storage"):
        import_onnx(q_model(1.0, zero, [4]))


def test_axis_out_of_range_is_refused() -> None:
    proto = q_model([0.5, 0.25, 1.0], np.array([1, 2, 3], np.uint8), [2, 3], axis=2)
    with pytest.raises(InputError, match=r"node 'quant_x' .*axis 2 is out of range \[-2, 1\]"):
        import_onnx(proto)


def test_mismatched_per_axis_lengths_are_refused() -> None:
    proto = q_model([0.5, 0.25, 1.0, 2.0], np.array([1, 2, 3, 4], np.uint8), [2, 3], axis=1)
    with pytest.raises(InputError, match=r"per-axis scale has 4 elements but input dimension 1 .* size 3"):
        import_onnx(proto)


def test_zero_point_shape_must_match_scale_shape() -> None:
    proto = q_model([0.5, 0.25, 1.0], np.array([1, 2], np.uint8), [2, 3], axis=1)
    with pytest.raises(InputError, match=r"zero point shape \[2\] does not match scale shape \[3\]"):
        import_onnx(proto)


def test_ragged_blocks_lift_padded_to_whole_blocks() -> None:
    """A block size that does not divide the axis (ONNX's shorter last block): the quant type is the padded
    tensor's (MLIR wants whole blocks); tests/frontend/test_ragged_blocks.py runs such models."""
    proto = q_model(np.ones((2, 2), np.float32), np.zeros((2, 2), np.uint8), [2, 5], axis=1, block_size=3)
    ops = [op.name for op in import_onnx(proto).walk()]
    assert ops.index("onnx.Pad") < ops.index("quant.qcast") < ops.index("onnx.Slice")


def test_run_time_scale_stays_a_generic_quantize_linear() -> None:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="dyn")]
    proto = model(nodes, [("x", F32, [2]), ("s", F32, [])], [("y", TensorProto.UINT8, [2])])
    names = [op.name for op in import_onnx(proto).walk()]
    assert "onnx.QuantizeLinear" in names and "quant.qcast" not in names


def test_every_unsupported_op_is_listed_at_once() -> None:
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["o"])], "b", [], [helper.make_tensor_value_info("o", F32, [2])]
    )
    nodes = [
        helper.make_node("NoSuchOp", ["x"], ["a"], name="typo"),
        helper.make_node("If", ["cond"], ["b"], name="branchy", then_branch=branch, else_branch=branch),
        helper.make_node("Fancy", ["x"], ["c"], name="custom", domain="my.domain"),
        helper.make_node("Relu", ["x"], ["y"], name="fine"),
    ]
    proto = model(nodes, [("x", F32, [2]), ("cond", TensorProto.BOOL, [])], [("y", F32, [2])])
    with pytest.raises(InputError) as caught:
        import_onnx(proto)
    message = str(caught.value)
    assert "3 unsupported node(s)" in message
    assert "'typo' (onnx.NoSuchOp, opset 21)" in message
    assert "'branchy' (onnx.If, opset 21): GRAPH attributes" in message
    assert "'custom' (onnx.my.domain.Fancy, opset None): domain 'my.domain'" in message
    assert "fine" not in message


def test_external_data_outside_the_model_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    weights = np.arange(4, dtype=np.float32)
    (tmp_path / "secret.bin").write_bytes(weights.tobytes())
    w = tensor("w", weights)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "16")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    path = folder / "m.onnx"
    onnx.save_model(model(nodes, [("x", F32, [4])], [("y", F32, [4])], [w]), str(path))
    with pytest.raises(
        InputError, match=r"initializer 'w': external data location '\.\./secret\.bin' is outside"
    ):
        import_onnx(path)


def test_external_data_inside_the_model_folder_loads(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    proto = model(nodes, [("x", F32, [4])], [("y", F32, [4])], [tensor("w", np.arange(4, dtype=np.float32))])
    path = tmp_path / "m.onnx"
    onnx.save_model(proto, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    outputs = interpret(import_onnx(path), {"x": np.ones(4, np.float32)})
    assert outputs["y"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_input_shape_override_fixes_dynamic_dims() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    proto = model(nodes, [("x", F32, ["batch", 4])], [("y", F32, None)])  # type: ignore[list-item]
    assert "tensor<?x4xf32>" in print_module(import_onnx(proto))
    assert "tensor<2x4xf32>" in print_module(import_onnx(proto, input_shapes={"x": (2, 4)}))
    with pytest.raises(InputError, match="'nope', which is not a graph input"):
        import_onnx(proto, input_shapes={"nope": (1,)})


@pytest.mark.parametrize("saturate", [0, 1])
def test_float8_e5m2_storage_matches_onnxruntime_through_a_cast(saturate: int) -> None:
    zero = helper.make_tensor("zp", TensorProto.FLOAT8E5M2, [], [0.0])
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q", saturate=saturate),
        helper.make_node("Cast", ["q"], ["y"], to=F32, name="to_float"),  # onnxruntime cannot return it
    ]
    proto = model(nodes, [("x", F32, [8])], [("y", F32, [8])], [tensor("s", 0.25, np.float32), zero])
    x = np.array([0.0, -0.0, 1.3, -77.0, 1e5, np.nan, np.inf, -np.inf], np.float32)
    assert_matches_onnxruntime(proto, {"x": x})


def test_int32_dequantize_matches_onnxruntime() -> None:
    proto = dq_model(TensorProto.INT32, 0.001, None, [4])
    x = np.array([0, -(2**31), 2**31 - 1, 12345], np.int32)
    text = print_module(import_onnx(proto))
    assert "!quant.uniform<i32:f32, 0.0010000000474974513>" in text
    assert_matches_onnxruntime(proto, {"x": x})


@pytest.mark.parametrize("storage", [TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2FNUZ])
def test_fnuz_float8_storage_stays_generic_and_matches_the_onnx_reference(storage: int) -> None:
    zero = helper.make_tensor("zp", storage, [], [0.0])
    proto = q_model(0.5, zero, [4])
    module = import_onnx(proto)
    names = [op.name for op in module.walk()]
    assert "onnx.QuantizeLinear" in names and "quant.qcast" not in names  # MLIR has no FNUZ quant storage
    x = np.array([0.3, -7.0, 1e6, float("nan")], np.float32)
    expected = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    (actual,) = interpret(module, {"x": x}).values()
    assert actual.tobytes() == np.asarray(expected).tobytes()


def test_onnxruntime_quantize_static_qdq_model_lifts_and_runs(tmp_path: Path) -> None:
    """A small CNN quantized by onnxruntime's own tool (QDQ, per-channel int8 weights, int32 bias)."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "W2"], ["y"], name="fc"),
    ]
    initializers = [
        tensor("W", rng.normal(0, 0.3, (4, 3, 3, 3)), np.float32),
        tensor("B", rng.normal(0, 0.1, 4), np.float32),
        tensor("W2", rng.normal(0, 0.3, (4 * 6 * 6, 5)), np.float32),
    ]
    float_model = model(nodes, [("x", F32, [1, 3, 6, 6])], [("y", F32, [1, 5])], initializers, opset=17)
    onnx.save(float_model, str(tmp_path / "f.onnx"))
    batches = iter([{"x": rng.normal(0, 1, (1, 3, 6, 6)).astype(np.float32)} for _ in range(4)])

    class Reader(quantization.CalibrationDataReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(batches, None)

    quantization.quantize_static(
        str(tmp_path / "f.onnx"),
        str(tmp_path / "q.onnx"),
        Reader(),
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=True,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8,
    )
    module = import_onnx(tmp_path / "q.onnx")
    parsed = round_trip(module)
    text = print_module(module)
    assert "!quant.uniform<i8:f32:0, {" in text  # per-output-channel conv weights
    assert "!quant.uniform<i32:f32" in text  # the bias
    x = rng.normal(0, 1, (1, 3, 6, 6)).astype(np.float32)
    ours = interpret(parsed, {"x": x})["y"]  # type: ignore[arg-type]
    theirs = run_onnxruntime(onnx.load(str(tmp_path / "q.onnx")), {"x": x})[0]
    # End to end only closeness is promised: float Conv / MatMul round differently per engine.
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=0.05 * float(np.abs(theirs).max()))
