"""finalize: the IR it produces, its options and its errors (onnxruntime parity: test_minmax_parity.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from calibrate.parity_support import (
    MODELS,
    batches,
    finalized_qdq,
    lowest_cosines,
    minmax_ranges,
    onnxruntime_qdq,
)
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.backends.onnx import write_onnx
from qconvert.calibrate.api import calibrate
from qconvert.calibrate.attach import attach_ranges
from qconvert.calibrate.finalize import finalize
from qconvert.calibrate.opset_raise import raise_opset
from qconvert.calibrate.ranges import CalibrationRanges, TensorRange
from qconvert.calibrate.scheme import DEFAULT_OP_TYPES, Scheme
from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import interpret
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp
from qconvert.ir.parser import ParserOptions, parse_module
from qconvert.ir.printer import print_module
from qconvert.ir.quant_types import CalibratedQuantizedType, UniformQuantizedType
from qconvert.ir.types import element_type_of
from qconvert.ir.verify import verify
from qconvert.numerics.calibration import float8_params

CNN = MODELS / "digits_cnn.onnx"
ENCODER = MODELS / "tiny_encoder.onnx"


def calibrated(path: Path, count: int = 2) -> tuple[object, CalibrationRanges]:
    ranges = minmax_ranges(path, batches(path.stem, count))
    module = import_onnx(path)
    attach_ranges(module, ranges)
    return module, ranges


def opset(module: object) -> int:
    entries = dict(module.attributes["onnx.opset_import"].entries)  # type: ignore[attr-defined]
    return entries["ai.onnx"].value


def test_result_has_no_calibrated_types_and_round_trips_as_text() -> None:
    module, _ = calibrated(CNN)
    finalize(module, Scheme(per_channel=True))
    for op in module.walk():  # type: ignore[attr-defined]
        for value in [*op.operands, *op.results]:
            assert not isinstance(element_type_of(value.type), CalibratedQuantizedType)
    # The Relus are folded into the Conv outputs, as onnxruntime does.
    assert not [op for op in module.walk() if op.name == "onnx.Relu"]  # type: ignore[attr-defined]
    text = print_module(module)
    assert "!quant.uniform<i8:f32:0, {" in text  # per-channel Conv weights
    assert "!quant.uniform<i32:f32:0, {" in text  # int32 biases
    reparsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    verify(reparsed)
    assert print_module(reparsed) == text


def gemm_model(beta: float) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 3, "b")
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="gemm", transB=1, beta=beta, alpha=0.75)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [weight, bias],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("per_channel", [False, True])
def test_gemm_beta_goes_into_the_stored_bias_not_its_scale(per_channel: bool, tmp_path: Path) -> None:
    """onnxruntime's bias scale is s_in * s_w * beta (so its beta 0.5 Gemm adds C, test_placement.py); ours
    is s_in * s_w for a stored beta * C. Every other Q/DQ is onnxruntime's."""
    require_module("onnxruntime")
    path = tmp_path / "gemm.onnx"
    onnx.save(gemm_model(beta=0.5), path)
    rng = np.random.default_rng(2)
    data = [{"x": rng.standard_normal((3, 6)).astype(np.float32)} for _ in range(3)]
    expected = onnxruntime_qdq(path, data, tmp_path, per_channel=per_channel)
    module = import_onnx(path)
    attach_ranges(module, minmax_ranges(path, data))
    finalize(module, Scheme(per_channel=per_channel))
    ours = finalized_qdq(module)
    bias = ours.pop("b_DequantizeLinear")
    theirs = expected.pop("b_DequantizeLinear")
    assert ours == expected
    assert [scale * 0.5 for scale in bias.scale] == list(theirs.scale)  # beta 0.5: exact in float32
    (gemm,) = [op for op in module.walk() if op.name == "onnx.Gemm"]  # type: ignore[attr-defined]
    assert gemm.attributes["beta"].value == 1.0
    assert gemm.attributes["alpha"].value == 0.75


def test_quantized_tensor_without_range_is_an_input_error() -> None:
    module, ranges = calibrated(CNN)
    module = import_onnx(CNN)
    partial = CalibrationRanges(
        {n: r for n, r in ranges.ranges.items() if n != "/gap/GlobalAveragePool_output_0"}
    )
    attach_ranges(module, partial, CNN)
    with pytest.raises(InputError, match=r"no calibrated range for 1 tensor.*'/gap/GlobalAveragePool:0'"):
        finalize(module, Scheme())


def test_opset_rises_to_what_the_quantization_needs() -> None:
    module, _ = calibrated(CNN)
    finalize(module, Scheme(activation_type="int16"))
    assert opset(module) == 21
    module, _ = calibrated(CNN)
    finalize(module, Scheme())
    assert opset(module) == 17  # int8 per-tensor: the model's own opset


def test_per_channel_raises_an_old_opset_to_13(tmp_path: Path) -> None:
    model = gemm_model(beta=1.0)
    model.opset_import[0].version = 11
    path = tmp_path / "gemm11.onnx"
    onnx.save(model, path)
    data = [{"x": np.linspace(-1, 1, 18, dtype=np.float32).reshape(3, 6)}]
    module = import_onnx(path)
    attach_ranges(module, minmax_ranges(path, data))
    finalize(module, Scheme(per_channel=True))
    assert opset(module) == 13


def _opset_raise_case(
    nodes: list[onnx.NodeProto],
    weights: dict[str, np.ndarray],
    shapes: tuple[list[int], list[int]],
    version: int,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "raise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shapes[0])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shapes[1])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    return model


def _calibrated_through_a_raised_opset(
    model: onnx.ModelProto, scheme: dict, raised: int, tmp_path: Path
) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """Calibrate `model` with the public API; the written model must pass onnx's checker at opset
    `raised`, run in onnxruntime and stay close to the float model there."""
    ort = require_module("onnxruntime")
    source, written_path = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(model, source)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(5)
    data = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
    calibrate(source, data, scheme=scheme, out=written_path)
    written = onnx.load(written_path)
    onnx.checker.check_model(written, full_check=True)
    assert {o.domain: o.version for o in written.opset_import}[""] == raised
    for batch in data:
        expected = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, batch)[0]
        got = ort.InferenceSession(str(written_path), providers=["CPUExecutionProvider"]).run(None, batch)[0]
        cosine = float(np.dot(expected.ravel(), got.ravel()) / np.linalg.norm(expected) / np.linalg.norm(got))
        assert cosine > 0.99, cosine
    return written, data


def test_int16_raises_opset_14_and_converts_reduce_mean_axes_to_an_input(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], name="rmean", axes=[1], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["centered"], name="sub"),
        helper.make_node("MatMul", ["centered", "w"], ["y"], name="mm"),
    ]
    weights = {"w": rng.standard_normal((8, 6)).astype(np.float32)}
    model = _opset_raise_case(nodes, weights, ([4, 8], [4, 6]), 14)
    written, data = _calibrated_through_a_raised_opset(model, {"activation_type": "int16"}, 21, tmp_path)
    (reduce_mean,) = [n for n in written.graph.node if n.op_type == "ReduceMean"]
    assert reduce_mean.name == "rmean" and [a.name for a in reduce_mean.attribute] == ["keepdims"]
    axes = {t.name: numpy_helper.to_array(t) for t in written.graph.initializer}[reduce_mean.input[1]]
    assert axes.tolist() == [1]
    # The finalized module itself is at opset 21 with converted ops: the interpreter, which runs the
    # float ops at the module's opset, agrees with onnxruntime on the module written as it is.
    ort = require_module("onnxruntime")
    source = tmp_path / "float.onnx"
    module = import_onnx(source)
    attach_ranges(module, minmax_ranges(source, data))
    finalize(module, Scheme(activation_type="int16"))
    assert opset(module) == 21
    proto = write_onnx(module)
    options = ort.SessionOptions()  # node by node, as the interpreter runs (no fused Q/DQ kernels)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        interpret(module, data[0])["y"], session.run(None, data[0])[0], rtol=1e-5, atol=1e-5
    )


def test_per_channel_raises_opset_11_and_converts_squeeze_axes_to_an_input(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["conv"], ["pooled"], name="gap"),
        helper.make_node("Squeeze", ["pooled"], ["flat"], name="squeeze", axes=[2, 3]),
        helper.make_node("MatMul", ["flat", "fc"], ["y"], name="fc"),
    ]
    weights = {
        "w": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32),
        "b": (rng.standard_normal(4) * 0.1).astype(np.float32),
        "fc": rng.standard_normal((4, 5)).astype(np.float32),
    }
    model = _opset_raise_case(nodes, weights, ([2, 3, 6, 6], [2, 5]), 11)
    written, _ = _calibrated_through_a_raised_opset(model, {"per_channel": True}, 13, tmp_path)
    (squeeze,) = [n for n in written.graph.node if n.op_type == "Squeeze"]
    assert squeeze.name == "squeeze" and not squeeze.attribute and len(squeeze.input) == 2
    axes = {t.name: numpy_helper.to_array(t) for t in written.graph.initializer}[squeeze.input[1]]
    assert axes.tolist() == [2, 3]
    assert any(n.op_type == "DequantizeLinear" and n.attribute for n in written.graph.node)  # per-axis


def test_opset_raise_splices_a_conversion_into_several_ops() -> None:
    # Softmax over axis 1 of a 3-D tensor means "flatten from axis 1" before opset 13: the converter
    # writes Shape, Flatten, Softmax, Reshape; the raised module must compute what the old one did.
    ort = require_module("onnxruntime")
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["square"], name="square"),
        helper.make_node("Softmax", ["square"], ["y"], name="softmax", axis=1),
    ]
    model = _opset_raise_case(nodes, {}, ([2, 3, 4], [2, 3, 4]), 11)
    module = import_onnx(model)
    raise_opset(module, 13, "a test")
    assert opset(module) == 13
    names = [op.name for op in module.walk()]  # type: ignore[attr-defined]
    assert {"onnx.Shape", "onnx.Flatten", "onnx.Reshape"} <= set(names)
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(2, 3, 4)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(interpret(module, {"x": x})["y"], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(expected.reshape(2, 12).sum(axis=1), 1.0, rtol=1e-5)  # not per axis 1


def test_a_node_the_opset_raise_cannot_convert_is_named(tmp_path: Path) -> None:
    # BatchNormalization's training outputs (mean, var, saved mean, saved var) are gone at opset 14:
    # onnx's converter refuses the node, and the error says which node, why the opset rises and why not.
    require_module("onnxruntime")
    channels = 2
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv"], name="conv"),
        helper.make_node(
            "BatchNormalization", ["conv", "s", "b", "mu", "var"], ["y", "m", "v", "sm", "sv"], name="bn"
        ),
    ]
    weights = {
        "w": np.eye(channels, dtype=np.float32).reshape(channels, channels, 1, 1),
        "s": np.ones(channels, np.float32),
        "b": np.zeros(channels, np.float32),
        "mu": np.zeros(channels, np.float32),
        "var": np.ones(channels, np.float32),
    }
    model = _opset_raise_case(nodes, weights, ([1, channels, 3, 3], [1, channels, 3, 3]), 11)
    data = [{"x": np.linspace(-1, 1, channels * 9, dtype=np.float32).reshape(1, channels, 3, 3)}]
    out = tmp_path / "quantized.onnx"
    with pytest.raises(
        InputError,
        match=r"node 'bn' \(BatchNormalization\) cannot be converted from opset 11 to opset 21 \(Q/DQ nodes "
        r"with int16 storage need opset 21\): onnx.version_converter failed: .*outputs 4 and 5",
    ):
        calibrate(model, data, scheme={"activation_type": "int16"}, out=out)
    assert not out.exists()


def test_group_normalization_is_not_raised_past_its_opset_21_change(tmp_path: Path) -> None:
    # onnx's converter takes GroupNormalization-18 to 21 without a word, but 21 reads scale and bias per
    # channel (18: per group; onnx's checker now calls 18 deprecated, exporters still write it): the raise
    # is refused, naming the node.
    nodes = [
        helper.make_node("GroupNormalization", ["x", "s", "b"], ["g"], name="gn", num_groups=2),
        helper.make_node("Mul", ["g", "k"], ["y"], name="mul"),
    ]
    weights = {"s": np.ones(2, np.float32), "b": np.zeros(2, np.float32), "k": np.full(1, 2.0, np.float32)}
    graph = helper.make_graph(
        nodes,
        "group_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    data = [{"x": np.linspace(-1, 1, 36, dtype=np.float32).reshape(1, 4, 3, 3)}]
    out = tmp_path / "quantized.onnx"
    with pytest.raises(
        InputError, match=r"node 'gn' \(GroupNormalization\) cannot be raised from opset 18 to 21"
    ):
        calibrate(model, data, scheme={"activation_type": "int16"}, out=out, sentinel="off")
    assert not out.exists()


def test_keep_float_leaves_the_tensor_and_what_depends_on_it_in_float() -> None:
    module, _ = calibrated(CNN)
    notes: list[str] = []
    finalize(module, Scheme(keep_float={"/Relu_output_0": "user choice"}), notes)
    names = set(finalized_qdq(module))
    assert "/Relu_output_0_QuantizeLinear" not in names
    # MaxPool shares its input's parameters: with the input in float, its output stays float too,
    # and the Conv that reads it quantizes its own input (onnxruntime's generic rule), so conv2's bias
    # still has an input scale.
    assert "/pool/MaxPool_output_0_QuantizeLinear" in names
    assert "conv2.bias_DequantizeLinear" in names
    assert any("'/Relu_output_0' left in float: user choice" in note for note in notes)


def test_shared_parameters_follow_the_provider() -> None:
    module, _ = calibrated(ENCODER)
    finalize(module, Scheme())
    found = finalized_qdq(module)
    # Reshape and Transpose outputs reuse their input's scale and zero point.
    assert (
        found["/layers.0/Reshape_output_0_QuantizeLinear"] == found["/layers.0/q/Add_output_0_QuantizeLinear"]
    )
    assert (
        found["/layers.0/Transpose_output_0_QuantizeLinear"]
        == found["/layers.0/q/Add_output_0_QuantizeLinear"]
    )
    # Softmax outputs are [0, 1] whatever was observed: scale 1/255, zero point -128.
    softmax = found["/layers.0/Softmax_output_0_QuantizeLinear"]
    assert softmax.scale == (float(np.float32(1 / 255)),) and softmax.zero_point == (-128,)


def test_blocked_weights_and_fallback_notes() -> None:
    module, _ = calibrated(CNN)
    notes: list[str] = []
    finalize(module, Scheme(block_size=16), notes)
    assert any("conv1.weight" in note and "needs rank 2" in note for note in notes)
    assert opset(module) == 21
    module, _ = calibrated(ENCODER)
    finalize(module, Scheme(op_types_to_quantize={"MatMul"}, block_size=16, per_channel=False))  # axis 0
    text = print_module(module)
    assert "!quant.uniform<i8:f32:{0:16, 1:1}" in text or "!quant.uniform<i8:f32:{0:16" in text


def test_ragged_blocks_are_refused_with_the_weight_name() -> None:
    module, _ = calibrated(ENCODER)
    with pytest.raises(InputError, match="block_size 24 does not divide"):
        finalize(module, Scheme(op_types_to_quantize={"MatMul"}, block_size=24))


def test_float8_scales_come_from_the_standard_deviation() -> None:
    module = import_onnx(CNN)
    ranges = minmax_ranges(CNN, batches("digits_cnn", 1))
    for tensor_range in ranges.ranges.values():
        tensor_range.std = (tensor_range.max - tensor_range.min) / 4
    attach_ranges(module, ranges)
    finalize(module, Scheme(activation_type="float8e4m3fn", weight_type="float8e4m3fn"))
    assert opset(module) == 19
    quantize = next(
        op
        for op in module.walk()  # type: ignore[attr-defined]
        if isinstance(op, QuantizeCastOp) and op.attributes["onnx.tensor_name"].value == "image"
    )
    element = element_type_of(quantize.result.type)
    assert isinstance(element, UniformQuantizedType) and element.storage_type.name == "f8E4M3FN"
    expected = float8_params(np.float32(ranges["image"].std))
    assert element.scale == float(expected.scale) and element.zero_point == 0
    assert not [
        op for op in module.walk() if isinstance(op, DequantizeCastOp) and "bias" in str(op.attributes)
    ]


def test_float8_without_std_is_an_input_error() -> None:
    module, _ = calibrated(CNN)
    with pytest.raises(InputError, match=r"standard deviation.*--method distribution"):
        finalize(module, Scheme(activation_type="float8e4m3fn", weight_type="float8e4m3fn"))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"activation_type": "int8", "weight_type": "uint8"}, "int8 activations with uint8 weights"),
        ({"activation_type": "float8e4m3fn"}, "float8e4m3fn must be used for both"),
        ({"weight_type": "int7"}, "weight_type 'int7' is not one of"),
        ({"block_size": -1}, "block_size must be 0"),
        ({"float8_scale": "mean"}, "float8_scale 'mean' is not one of std, max"),
        ({"float8_scale": "max"}, "float8_scale 'max' applies to float8e4m3fn storage only"),
        (
            {"reduce_range": True, "activation_type": "float8e4m3fn", "weight_type": "float8e4m3fn"},
            "reduce_range",
        ),
    ],
)
def test_scheme_refuses_what_onnxruntime_refuses(settings: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        Scheme(**settings)


def test_scheme_accepts_onnxruntime_type_names_and_applies_its_weight_symmetry_rule() -> None:
    scheme = Scheme(activation_type="QUInt8", weight_type="QUInt8")
    assert (scheme.activation_type, scheme.weight_type) == ("uint8", "uint8")
    assert scheme.weight_is_symmetric is False
    assert Scheme(weight_type="QInt4").weight_is_symmetric is True
    assert Scheme(weight_type="uint8", activation_type="uint8", weight_symmetric=True).weight_is_symmetric
    assert Scheme(activation_type="int16").needs_opset21 and not Scheme().needs_opset21


def test_infinite_range_is_an_input_error_naming_the_tensor() -> None:
    module = import_onnx(CNN)
    ranges = minmax_ranges(CNN, batches("digits_cnn", 1))
    ranges.add(TensorRange("/gap/GlobalAveragePool_output_0", float("-inf"), 1.0))
    attach_ranges(module, ranges)
    with pytest.raises(InputError, match=r"tensor '/gap/GlobalAveragePool_output_0'.*not finite.*keep_float"):
        finalize(module, Scheme())


def test_infinite_range_kept_in_float_finalizes() -> None:
    module = import_onnx(CNN)
    ranges = minmax_ranges(CNN, batches("digits_cnn", 1))
    ranges.add(TensorRange("/gap/GlobalAveragePool_output_0", float("-inf"), 1.0, sentinel="-inf"))
    attach_ranges(module, ranges)
    finalize(module, Scheme(keep_float={"/gap/GlobalAveragePool_output_0": "-inf sentinel"}))
    names = set(finalized_qdq(module))
    assert "/gap/GlobalAveragePool_output_0_QuantizeLinear" not in names
    assert "logits_QuantizeLinear" in names


def test_float8_model_keeps_relu_and_runs_close_to_float(tmp_path: Path) -> None:
    """float8 Q/DQ have no zero point to clamp at 0, so the Relus stay (onnxruntime would fold them).

    Run with graph optimizations off: onnxruntime 1.32's default optimizations drop a Relu between a
    float8 DequantizeLinear and QuantizeLinear (measured: cosine 0.05 instead of 0.998 on this model).
    """
    from qconvert.calibrate.api import calibrate

    data = batches("digits_cnn")
    out = tmp_path / "f8.onnx"
    scheme = Scheme(activation_type="float8e4m3fn", weight_type="float8e4m3fn")
    calibrate(CNN, data, method="distribution", scheme=scheme, out=out, sentinel="off")
    written = onnx.load(out)
    assert sum(node.op_type == "Relu" for node in written.graph.node) == 2
    assert lowest_cosines(CNN, out, data, "ORT_DISABLE_ALL")["logits"] > 0.99


@pytest.mark.parametrize("storage", ["int4", "uint4"])
def test_four_bit_activations_run_in_onnxruntime_and_the_maxpool_limit_is_noted(
    storage: str, tmp_path: Path
) -> None:
    """Every activation and weight in 4 bits (Q/DQ at opset 21). onnxruntime's extended optimizations drop
    the pair around MaxPool and then refuse a 4-bit MaxPool: the note says so, and the model runs at
    ORT_ENABLE_BASIC. Measured per batch: cosine to float 0.85-0.93 (int4), 0.95-0.98 (uint4)."""
    from qconvert.calibrate.api import calibrate

    data = batches("digits_cnn")
    out = tmp_path / f"{storage}.onnx"
    scheme = Scheme(activation_type=storage, weight_type=storage)
    result = calibrate(CNN, data, scheme=scheme, out=out, sentinel="off")
    assert [note for note in result.notes if "MaxPool '/pool/MaxPool'" in note and "ORT_ENABLE_BASIC" in note]
    written = onnx.load(out)
    storage_types = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
    zero_points = [i for i in written.graph.initializer if i.name.endswith("_zero_point")]
    not_bias = {i.name: i.data_type for i in zero_points if not i.name.endswith("bias_quantized_zero_point")}
    assert len(not_bias) >= 8 and set(not_bias.values()) <= storage_types  # biases stay int32
    assert lowest_cosines(CNN, out, data, "ORT_ENABLE_BASIC")["logits"] > 0.8


def float16_model(weight_scale: float) -> onnx.ModelProto:
    """Gemm (+ bias) -> Relu -> MatMul in float16; small weights make the f16 bias scale underflow."""
    rng = np.random.default_rng(1)
    initializers = [
        numpy_helper.from_array((rng.standard_normal((4, 6)) * weight_scale).astype(np.float16), "w"),
        numpy_helper.from_array((rng.standard_normal(4) * 3).astype(np.float16), "b"),
        numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np.float16), "w2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="gemm", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, 5])],
        initializers,
    )
    # Opset 19: float16 Q/DQ scales need it (onnxruntime keeps the model's opset and would write an
    # invalid model at 17; our writer raises it).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("weight_scale", [1.0, 1e-3])
@pytest.mark.parametrize("per_channel", [False, True])
def test_float16_model_matches_onnxruntime(weight_scale: float, per_channel: bool, tmp_path: Path) -> None:
    """f16 ranges, f16 scales, and (tiny weights) onnxruntime's f32 bias scale + Cast back to f16."""
    ort = require_module("onnxruntime")
    from qconvert.backends.onnx import save_onnx

    path = tmp_path / "f16.onnx"
    onnx.save(float16_model(weight_scale), path)
    rng = np.random.default_rng(2)
    data = [{"x": (rng.standard_normal((3, 6)) * weight_scale).astype(np.float16)} for _ in range(3)]
    expected = onnxruntime_qdq(path, data, tmp_path, per_channel=per_channel)
    module = import_onnx(path)
    attach_ranges(module, minmax_ranges(path, data))
    finalize(module, Scheme(per_channel=per_channel))
    assert finalized_qdq(module) == expected
    written = save_onnx(module, tmp_path / "ours.onnx")
    casts = [n.name for n in onnx.load(written).graph.node if n.op_type == "Cast"]
    assert casts == (["b_Cast"] if weight_scale < 1 else [])
    theirs = ort.InferenceSession(str(tmp_path / "ort.qdq.onnx"), providers=["CPUExecutionProvider"])
    ours = ort.InferenceSession(str(written), providers=["CPUExecutionProvider"])
    for batch in data:
        assert theirs.run(None, batch)[0].tobytes() == ours.run(None, batch)[0].tobytes()


def test_sharing_with_a_float_tensor_leaves_the_output_float_with_a_note() -> None:
    """The Gather output shares the embedding table's parameters; with the table kept float it stays
    float too (onnxruntime would loop forever waiting for the table's parameters)."""
    module, _ = calibrated(ENCODER)
    notes: list[str] = []
    finalize(module, Scheme(keep_float={"tok.weight": "user choice"}), notes)
    names = set(finalized_qdq(module))
    assert "tok.weight_DequantizeLinear" not in names
    assert "/tok/Gather_output_0_QuantizeLinear" not in names
    assert "/Add_output_0_QuantizeLinear" in names
    assert any("'/tok/Gather_output_0' left in float: the tensor it shares" in note for note in notes)


def test_quantized_op_types_are_the_selection_without_the_excluded() -> None:
    assert Scheme().quantized_op_types == DEFAULT_OP_TYPES
    assert Scheme(op_types_to_exclude={"Conv"}).quantized_op_types == DEFAULT_OP_TYPES - {"Conv"}
    chosen = Scheme(op_types_to_quantize={"Conv", "Gemm"}, op_types_to_exclude={"Gemm"})
    assert chosen.quantized_op_types == {"Conv"}
