"""Where placement and finalize leave onnxruntime's rules because they give a wrong model or none.

onnxruntime folds a Relu/Clip into its producer's Q/DQ whenever activations are asymmetric, and gives a
single-consumer Relu/Clip input the output's range. Both are right for MinMax ranges of ordinary graphs
(tests/calibrate/test_minmax_parity.py) and wrong here: a symmetric range lets negatives through a folded
Relu, a Clip whose lower bound is not 0 is not a Q/DQ clamp, and an input that is also a graph output
loses its negatives. An initializer holding Inf or NaN has no scale: onnxruntime fails, finalize leaves
it in float. A graph input that is also an output (which the ONNX writer refused once calibration put a
Q/DQ pair on it) is written as the input. Where onnxruntime's own graph optimizations break a correct
model (float8 Relus, 4-bit MaxPool), finalize notes the level to run it at. A Gemm with beta != 1 gets
the bias it adds; a normalization bias is not stored coarser than its output. Each case runs in
onnxruntime and is compared with the float model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from calibrate.parity_support import MODELS, batches, lowest_cosines, save_npz
from onnx import TensorProto, helper, numpy_helper

from qconvert.calibrate.api import calibrate
from qconvert.errors import InputError


def op_types(path: Path) -> list[str]:
    return [node.op_type for node in onnx.load(path).graph.node]


def one_node_model(
    tmp_path: Path,
    node: onnx.NodeProto,
    shapes: tuple[list, list],
    weights: dict[str, np.ndarray],
    element_type: int = TensorProto.FLOAT,
) -> Path:
    """`node` alone, reading graph input x and `weights`, writing graph output y (x, y shaped `shapes`)."""
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", element_type, shapes[0])],
        [helper.make_tensor_value_info("y", element_type, shapes[1])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    path = tmp_path / f"{node.op_type.lower()}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_symmetric_relu_range_keeps_the_relu(tmp_path: Path) -> None:
    """Distribution gives int8 ranges symmetric about 0: a Q/DQ over [-a, a] does not clamp at 0."""
    data = batches("digits_cnn")
    out = tmp_path / "distribution.onnx"
    calibrate(MODELS / "digits_cnn.onnx", data, method="distribution", out=out)
    assert op_types(out).count("Relu") == 2
    assert lowest_cosines(MODELS / "digits_cnn.onnx", out, data)["logits"] > 0.999
    # MinMax ranges of the same Relus start at 0: folded, as onnxruntime does.
    calibrate(MODELS / "digits_cnn.onnx", data, out=tmp_path / "minmax.onnx")
    assert "Relu" not in op_types(tmp_path / "minmax.onnx")


def small_graph(tmp_path: Path, nodes: list, outputs: list[str], extra: dict[str, np.ndarray]) -> Path:
    """x [2, 16] -> MatMul W -> m, then `nodes`; every name in `outputs` is a graph output ([2, 8] but x)."""
    rng = np.random.default_rng(5)
    weights = {"W": (rng.standard_normal((16, 8)) * 0.4).astype(np.float32), **extra}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"), *nodes],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 16 if name == "x" else 8])
            for name in outputs
        ],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    path = tmp_path / "graph.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def feeds(count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(6)
    return [{"x": rng.standard_normal((2, 16)).astype(np.float32)} for _ in range(count)]


def test_a_relu_input_that_is_a_graph_output_keeps_its_negatives(tmp_path: Path) -> None:
    model = small_graph(tmp_path, [helper.make_node("Relu", ["m"], ["r"], name="relu")], ["m", "r"], {})
    out = tmp_path / "out.onnx"
    calibrate(model, feeds(), out=out)
    lowest = lowest_cosines(model, out, feeds())
    assert lowest["m"] > 0.999 and lowest["r"] > 0.999  # onnxruntime's m: 0.52


def test_a_relu_whose_output_gets_no_qdq_is_kept(tmp_path: Path) -> None:
    """Kept in float (an override) or with Relu outputs excluded: no Q/DQ to hand the clamp to."""
    model = small_graph(tmp_path, [helper.make_node("Relu", ["m"], ["r"], name="relu")], ["r"], {})
    for settings in (
        {"sentinel_overrides": ["r=keep"]},
        {"scheme": {"op_types_to_exclude_output_quantization": ["Relu"]}},
    ):
        out = tmp_path / "out.onnx"
        calibrate(model, feeds(), out=out, **settings)
        assert "Relu" in op_types(out), settings
        assert lowest_cosines(model, out, feeds())["r"] > 0.999, settings


def test_a_clip_not_at_zero_is_kept(tmp_path: Path) -> None:
    """Clip(0.25, 1): a Q/DQ over [0, 1] would let (0, 0.25) through; Clip(-1, 1) clamps as its Q/DQ does."""
    clip = [helper.make_node("Clip", ["m", "low", "high"], ["c"], name="clip")]
    for low, folded in ((0.25, False), (-1.0, True)):
        bounds = {"low": np.array(low, np.float32), "high": np.array(1.0, np.float32)}
        model = small_graph(tmp_path, clip, ["c"], bounds)
        out = tmp_path / f"clip_{low}.onnx"
        calibrate(model, feeds(), out=out)
        assert ("Clip" not in op_types(out)) == folded, low
        assert lowest_cosines(model, out, feeds())["c"] > 0.999, low


def test_an_initializer_holding_inf_or_nan_stays_float(tmp_path: Path) -> None:
    """m * C with two -Inf in C: C stays float (noted), x and m are still quantized."""
    constant = np.array([1.0, 2.0, -np.inf, 3.0] * 2, np.float32)
    model = small_graph(
        tmp_path, [helper.make_node("Mul", ["m", "C"], ["y"], name="mul")], ["y"], {"C": constant}
    )
    out = tmp_path / "out.onnx"
    result = calibrate(model, feeds(), out=out)
    assert "initializer 'C' left in float: it holds 2 Inf/NaN value(s)" in result.notes
    written = onnx.load(out)
    quantized = {node.input[0] for node in written.graph.node if node.op_type == "QuantizeLinear"}
    assert {"x", "m"} <= quantized and "C" not in quantized
    assert "C" in {i.name for i in written.graph.initializer}  # as it was: float
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    quantized_run = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for feed in feeds():
        want, got = reference.run(None, feed)[0], quantized_run.run(None, feed)[0]
        np.testing.assert_array_equal(np.isfinite(want), np.isfinite(got))
        finite = np.isfinite(want)
        assert np.abs(want[finite] - got[finite]).max() < 0.05 * np.abs(want[finite]).max()


def test_a_graph_input_that_is_also_a_graph_output_is_returned_as_it_came(tmp_path: Path) -> None:
    """ONNX names that output after the input: it is the input, exactly, beside the quantized outputs."""
    relu = helper.make_node("Relu", ["m"], ["r"], name="relu")
    model = small_graph(tmp_path, [relu], ["r", "x"], {})
    out = tmp_path / "out.onnx"
    calibrate(model, feeds(), out=out)
    written = onnx.load(out)
    assert [o.name for o in written.graph.output] == ["r", "x"]
    assert "QuantizeLinear" in op_types(out)
    quantized_run = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for feed in feeds():
        _, x = quantized_run.run(None, feed)
        np.testing.assert_array_equal(x, feed["x"])
    assert lowest_cosines(model, out, feeds())["r"] > 0.999


def test_a_graph_input_without_a_range_is_named_in_the_error(tmp_path: Path) -> None:
    """finalize names a missing range's tensor: a graph input by its ONNX name (was '<argument 0>')."""
    from qconvert.calibrate.attach import attach_ranges
    from qconvert.calibrate.finalize import finalize
    from qconvert.calibrate.ranges import CalibrationRanges
    from qconvert.calibrate.scheme import Scheme
    from qconvert.errors import InputError
    from qconvert.frontends.onnx import import_onnx

    ranges_path = tmp_path / "ranges.json"
    calibrate(MODELS / "digits_cnn.onnx", batches("digits_cnn"), ranges_path=ranges_path)
    ranges = CalibrationRanges.load(ranges_path)
    module = import_onnx(MODELS / "digits_cnn.onnx")
    partial = CalibrationRanges({n: r for n, r in ranges.ranges.items() if n != "image"})
    attach_ranges(module, partial, MODELS / "digits_cnn.onnx")
    with pytest.raises(
        InputError, match=r"no calibrated range for 1 tensor\(s\) that must be quantized: 'image'"
    ):
        finalize(module, Scheme())


def test_float8_relus_are_kept_and_the_optimization_level_they_need_is_noted(tmp_path: Path) -> None:
    """float8 Q/DQ do not clamp at 0, so the Relus stay; onnxruntime's extended optimizations would still
    drop them, which the notes say. At ORT_ENABLE_BASIC the model runs close to float."""
    from qconvert.calibrate.scheme import Scheme

    data = batches("digits_cnn")
    out = tmp_path / "float8.onnx"
    scheme = Scheme(activation_type="float8e4m3fn", weight_type="float8e4m3fn")
    result = calibrate(MODELS / "digits_cnn.onnx", data, method="distribution", scheme=scheme, out=out)
    kept = [
        note for note in result.notes if "kept between float8 Q/DQ" in note and "ORT_ENABLE_BASIC" in note
    ]
    assert len(kept) == op_types(out).count("Relu") == 2
    assert lowest_cosines(MODELS / "digits_cnn.onnx", out, data, "ORT_ENABLE_BASIC")["logits"] > 0.99


def test_float8_saturation_under_onnxruntimes_rule_is_noted(tmp_path: Path) -> None:
    """onnxruntime's float8 scale is std / std(e4m3fn): LayerNorm gammas (near 1, small std) saturate
    whole, and Softmax outputs saturate at ~0.23. The scales stay onnxruntime's; the notes say what breaks
    (tiny_encoder's output cosine to float is 0.3-0.5 with these scales)."""
    from qconvert.calibrate.scheme import Scheme

    scheme = Scheme(activation_type="float8e4m3fn", weight_type="float8e4m3fn")
    model = MODELS / "tiny_encoder.onnx"
    out = tmp_path / "float8.onnx"
    result = calibrate(model, batches("tiny_encoder"), method="distribution", scheme=scheme, out=out)
    gammas = {n.input[1] for n in onnx.load(model).graph.node if n.op_type == "LayerNormalization"}
    saturated = {note.split("'")[1] for note in result.notes if "saturates 100.0% of its values" in note}
    assert saturated == gammas and len(gammas) == 5
    softmax = [note for note in result.notes if "Softmax_output_0': onnxruntime's float8 scale" in note]
    assert len(softmax) == 2 and all("its range is [0, 1]" in note for note in softmax)


def test_float8_max_scales_keep_the_encoder_close_to_float(tmp_path: Path) -> None:
    """`--float8-scale max` (max|x| / 448, from any method's range): nothing saturates, so no note, and
    tiny_encoder's outputs stay near float in onnxruntime, where onnxruntime's std-based scales (same
    data, run beside it) lose them. A method without std under the std rule is refused before any work."""
    from qconvert.cli import main

    model, data = MODELS / "tiny_encoder.onnx", batches("tiny_encoder")
    float8 = ["--activation-type", "float8e4m3fn", "--weight-type", "float8e4m3fn"]
    npz = save_npz(tmp_path / "data.npz", data)
    by_max, by_std = tmp_path / "max.onnx", tmp_path / "std.onnx"
    common = ["calibrate", str(model), "--data", str(npz), "--quiet", *float8]
    json_path = tmp_path / "max.json"
    assert (
        main(
            [
                *common,
                "--method",
                "minmax",
                "--float8-scale",
                "max",
                "-o",
                str(by_max),
                "--json",
                str(json_path),
            ]
        )
        == 0
    )
    assert main([*common, "--method", "distribution", "-o", str(by_std)]) == 0
    assert not [note for note in json.loads(json_path.read_text())["notes"] if "saturates" in note]
    near, lost = lowest_cosines(model, by_max, data), lowest_cosines(model, by_std, data)
    assert min(near.values()) > 0.95 and max(lost.values()) < 0.5, (near, lost)
    refused = tmp_path / "refused.onnx"
    assert main([*common, "--method", "minmax", "-o", str(refused)]) == 2 and not refused.exists()
    # A misspelt method is named as such, not as a method without the std the float8 rule needs.
    with pytest.raises(InputError, match="--method minmx: unknown calibration method"):
        calibrate(
            model,
            data,
            method="minmx",
            scheme={"activation_type": "float8e4m3fn", "weight_type": "float8e4m3fn"},
        )


@pytest.mark.parametrize("adjust", [True, False])
def test_a_bias_holding_inf_stays_float(adjust: bool, tmp_path: Path) -> None:
    """Gemm with a +Inf in its bias: no int32 holds it, and the default weight-scale adjustment for the
    bias would make the weight's scale Inf (an internal error once); the bias stays float, the Inf stays."""
    rng = np.random.default_rng(7)
    bias = rng.standard_normal(8).astype(np.float32)
    bias[3] = np.inf
    weights = {"W": rng.standard_normal((8, 16)).astype(np.float32), "C": bias}
    gemm = helper.make_node("Gemm", ["x", "W", "C"], ["y"], name="gemm", transB=1)
    model = one_node_model(tmp_path, gemm, ([2, 16], [2, 8]), weights)
    out = tmp_path / "out.onnx"
    scheme = {"adjust_weight_scale_for_int32_bias": adjust}
    result = calibrate(model, feeds(), out=out, scheme=scheme)  # the guard keeps y (+Inf) in float
    assert "bias 'C' left in float: it holds Inf/NaN values (int32 has none)" in result.notes
    quantized = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for feed in feeds():
        want, got = reference.run(None, feed)[0], quantized.run(None, feed)[0]
        assert np.array_equal(np.isinf(want), np.isinf(got)) and np.isinf(got[:, 3]).all()
        finite = np.isfinite(want)
        assert np.abs(want[finite] - got[finite]).max() < 0.05 * np.abs(want[finite]).max()


def test_weights_alone_quantized_is_not_reported_as_nothing_quantized(tmp_path: Path) -> None:
    """Every activation kept in float: the MatMul weight still gets its DequantizeLinear (onnxruntime's
    rule), so the model is not the float one and calibrate does not say it is."""
    model = small_graph(tmp_path, [helper.make_node("Relu", ["m"], ["r"], name="relu")], ["r"], {})
    out = tmp_path / "out.onnx"
    keep = {name: "kept by the test" for name in ("x", "m", "r")}
    result = calibrate(model, feeds(), out=out, scheme={"keep_float": keep})
    assert op_types(out).count("DequantizeLinear") == 1 and "QuantizeLinear" not in op_types(out)
    assert not [warning for warning in result.warnings if "nothing was quantized" in warning]


@pytest.mark.parametrize("beta", [2.0, 0.25])
def test_a_gemm_bias_is_stored_as_what_the_gemm_adds(beta: float, tmp_path: Path) -> None:
    """Gemm adds beta * C; the written Gemm has beta 1, so its int32 bias must dequantize to beta * C in
    units of s_in * s_w (onnxruntime's QGemm fusion reads it so). onnxruntime's quantize_static stores C
    with scale s_in * s_w * beta: its model, run beside ours, adds C."""
    from calibrate.parity_support import Reader
    from onnxruntime.quantization import QuantFormat, quantize_static

    rng = np.random.default_rng(0)
    weights = {
        "W": (rng.standard_normal((20, 12)) * 0.3).astype(np.float32),
        "C": rng.standard_normal(12).astype(np.float32),
    }
    gemm = helper.make_node("Gemm", ["x", "W", "C"], ["y"], name="gemm", beta=beta)
    model = one_node_model(tmp_path, gemm, (["n", 20], ["n", 12]), weights)
    data = [{"x": rng.standard_normal((16, 20)).astype(np.float32)} for _ in range(2)]
    ours, theirs = tmp_path / "ours.onnx", tmp_path / "theirs.onnx"
    calibrate(model, data, out=ours)
    quantize_static(str(model), str(theirs), Reader(data), quant_format=QuantFormat.QDQ)
    gemm = next(node for node in onnx.load(ours).graph.node if node.op_type == "Gemm")
    assert helper.get_attribute_value(next(a for a in gemm.attribute if a.name == "beta")) == 1.0
    assert lowest_cosines(model, ours, data)["y"] > 0.999
    assert lowest_cosines(model, theirs, data)["y"] < 0.98  # onnxruntime's adds C, not beta * C


@pytest.mark.parametrize("case", ["grouped_conv_transpose", "gemm_2d_bias"])
def test_a_bias_without_one_entry_per_weight_channel_stays_float(case: str, tmp_path: Path) -> None:
    """--per-channel: a grouped ConvTranspose's weight has C_out / group scales for C_out bias entries, and
    a Gemm C of shape [M, N] has rows: no per-channel int32 form (onnxruntime fails on both). The bias
    stays float with a note; the rest is quantized and the model stays close to float."""
    rng = np.random.default_rng(0)
    if case == "grouped_conv_transpose":
        node = helper.make_node("ConvTranspose", ["x", "W", "b"], ["y"], name="op", group=2, strides=[2, 2])
        shapes = {"x": ["n", 4, 5, 5], "y": ["n", 6, 10, 10], "W": (4, 3, 2, 2), "b": (6,)}
    else:
        node = helper.make_node("Gemm", ["x", "W", "b"], ["y"], name="op", transB=1)
        shapes = {"x": [6, 12], "y": [6, 10], "W": (10, 12), "b": (6, 10)}
    weights = {name: (rng.standard_normal(shapes[name]) * 0.3).astype(np.float32) for name in ("W", "b")}
    model = one_node_model(tmp_path, node, (shapes["x"], shapes["y"]), weights)
    batch = [6 if case == "gemm_2d_bias" else 8, *shapes["x"][1:]]
    data = [{"x": rng.standard_normal(batch).astype(np.float32)} for _ in range(2)]
    out = tmp_path / "out.onnx"
    result = calibrate(model, data, out=out, scheme={"per_channel": True})
    assert any(note.startswith("bias 'b' left in float: its weight has") for note in result.notes)
    assert op_types(out).count("DequantizeLinear") == 3  # x, W (per channel) and y; not b
    assert lowest_cosines(model, out, data)["y"] > 0.999


def test_a_normalization_bias_coarser_than_its_output_step_stays_float(tmp_path: Path) -> None:
    """LayerNorm of inputs of magnitude 3000: onnxruntime's int32 bias step s_in * s_gamma (0.77) is 27
    output steps, so biases of ~0.3 dequantize to 0 or 0.77. The bias added after normalizing stays float
    (with a note); its model, run beside ours, loses that bias."""
    from calibrate.parity_support import Reader
    from onnxruntime.quantization import QuantFormat, quantize_static

    rng = np.random.default_rng(0)
    weights = {
        "g": (1 + 0.1 * rng.standard_normal(64)).astype(np.float32),
        "b": (0.3 * rng.standard_normal(64)).astype(np.float32),
    }
    norm = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], name="ln", axis=-1)
    model = one_node_model(tmp_path, norm, (["n", 64], ["n", 64]), weights)
    data = [{"x": (3000 * rng.standard_normal((32, 64))).astype(np.float32)}]
    ours, theirs = tmp_path / "ours.onnx", tmp_path / "theirs.onnx"
    result = calibrate(model, data, out=ours)
    assert any(note.startswith("bias 'b' left in float: its int32 step") for note in result.notes)
    quantize_static(str(model), str(theirs), Reader(data), quant_format=QuantFormat.QDQ)
    assert lowest_cosines(model, ours, data)["y"] > 0.999 > 0.98 > lowest_cosines(model, theirs, data)["y"]


def test_a_float16_tensor_whose_scale_vanishes_is_noted(tmp_path: Path) -> None:
    """|x| ~ 3e-6 in float16: its scale (2e-8) is below float16's smallest, onnxruntime's rule makes it 1
    and every value quantizes to 0. The scale stays onnxruntime's; the note says so and suggests float."""
    rng = np.random.default_rng(0)
    matmul = helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")
    weights = {"W": rng.standard_normal((16, 8)).astype(np.float16)}
    model = one_node_model(tmp_path, matmul, (["n", 16], ["n", 8]), weights, TensorProto.FLOAT16)
    data = [{"x": (rng.standard_normal((16, 16)) * 1e-6).astype(np.float16)}]
    out = tmp_path / "out.onnx"
    result = calibrate(model, data, out=out)
    assert [
        note.split(":")[0] for note in result.notes if "quantizes every value to the zero point" in note
    ] == ["tensor 'x'"]
    quantized = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, data[0])[0]
    assert not quantized.any()  # what the note warns of, in onnxruntime
    # Per channel: one weight column of magnitude 1e-6 gets scale 1, the note counts it.
    weights["W"][:, 2] *= np.float16(1e-6)
    model = one_node_model(tmp_path, matmul, (["n", 16], ["n", 8]), weights, TensorProto.FLOAT16)
    normal = [{"x": rng.standard_normal((16, 16)).astype(np.float16)}]
    result = calibrate(model, normal, out=out, scheme={"per_channel": True})
    assert "weight 'W': 1 of its 8 channels have scales below float16's smallest" in " ".join(result.notes)


def test_a_normalization_bias_is_measured_against_the_folded_relus_output(tmp_path: Path) -> None:
    """BatchNormalization then Relu: the Relu folds into it, so its output's Q/DQ is the Relu's. Inputs of
    3000 make onnxruntime's bias step coarse: the bias stays float here too."""
    rng = np.random.default_rng(1)
    channels = 8
    weights = {
        "s": (1 + 0.1 * rng.standard_normal(channels)).astype(np.float32),
        "b": (0.3 * rng.standard_normal(channels)).astype(np.float32),
        "mean": (100 * rng.standard_normal(channels)).astype(np.float32),
        "var": np.full(channels, 3000.0**2, np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["n"], name="bn"),
            helper.make_node("Relu", ["n"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", channels, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", channels, 4, 4])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = tmp_path / "bn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    data = [{"x": (3000 * rng.standard_normal((16, channels, 4, 4))).astype(np.float32)}]
    out = tmp_path / "out.onnx"
    result = calibrate(model, data, out=out)
    assert "Relu" not in op_types(out)  # folded
    assert any(note.startswith("bias 'b' left in float: its int32 step") for note in result.notes)
    assert lowest_cosines(model, out, data)["y"] > 0.999


def test_the_weight_scale_adjustment_fits_the_bias_the_gemm_adds(tmp_path: Path) -> None:
    """Tiny inputs and weights, a bias of 0.1 at beta 2: beta * C / (s_in * s_w) passes int32's range
    though C / (s_in * s_w) does not; the weight scale grows for beta * C, so the int32 bias holds it."""
    rng = np.random.default_rng(2)
    # |x|, |W| <= 1.04e-3: s_in * s_w = 6.7e-11, so C / (s_in * s_w) = 1.5e9 fits int32, beta * C does not.
    weight, x = rng.uniform(-1, 1, (8, 4)), rng.uniform(-1, 1, (16, 8))
    weight[0, 0] = x[0, 0] = 1.0
    x[0, 1] = -1.0
    weights = {"W": (weight * 1.04e-3).astype(np.float32), "C": np.full(4, 0.1, np.float32)}
    gemm = helper.make_node("Gemm", ["x", "W", "C"], ["y"], name="gemm", beta=2.0)
    model = one_node_model(tmp_path, gemm, (["n", 8], ["n", 4]), weights)
    data = [{"x": (x * 1.04e-3).astype(np.float32)}]
    out = tmp_path / "out.onnx"
    calibrate(model, data, out=out)
    written = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    bias = written["C_quantized"].astype(np.float64) * written["C_quantized_scale"].astype(np.float64)
    assert np.abs(written["C_quantized"]).max() < 2**31 - 1  # not clipped
    np.testing.assert_allclose(bias, 0.2, rtol=1e-3)  # beta * C
    assert lowest_cosines(model, out, data)["y"] > 0.999
