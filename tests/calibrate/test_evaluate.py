"""`evaluate_samples` / `--evaluate`: the written QDQ model against the float model, both in onnxruntime.

Every figure calibrate reports is recomputed here from onnxruntime runs of the written file, sample by
sample, with plain numpy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from calibrate.parity_support import MODELS, batches, save_npz
from onnx import TensorProto, helper, numpy_helper

from qconvert.calibrate.api import calibrate
from qconvert.calibrate.dataset import open_dataset
from qconvert.calibrate.evaluate import evaluate, nonfinite_mismatches, sample_cosines
from qconvert.cli import main


def runs(model: Path, feeds: list[dict[str, np.ndarray]], level: str = "ORT_ENABLE_ALL") -> list[list]:
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return [session.run(None, feed) for feed in feeds]


def digits_command(tmp_path: Path, data: list[dict[str, np.ndarray]]) -> list[str]:
    """`qconvert calibrate` of digits_cnn on `data` (saved as one .npz), writing m.onnx."""
    npz = save_npz(tmp_path / "data.npz", data)
    return ["calibrate", str(MODELS / "digits_cnn.onnx"), "--data", str(npz), "-o", str(tmp_path / "m.onnx")]


def test_the_reported_agreement_is_what_onnxruntime_gives_sample_by_sample(tmp_path: Path) -> None:
    data = batches("digits_cnn")  # 4 batches of 8; 12 samples to compare means the first 2 batches
    out = tmp_path / "digits.qdq.onnx"
    result = calibrate(MODELS / "digits_cnn.onnx", data, method="entropy", out=out, evaluate_samples=12)
    agreement = result.agreement
    assert agreement is not None and agreement.level == "ORT_ENABLE_ALL" and agreement.samples == 16
    # The float outputs of these batches are calibrate's outlier-channel run's (optimizations off).
    want = [run[0] for run in runs(MODELS / "digits_cnn.onnx", data[:2], "ORT_DISABLE_ALL")]
    got = [run[0] for run in runs(out, data[:2])]
    cosines = [
        float(f @ q / (np.linalg.norm(f) * np.linalg.norm(q)))
        for batch_want, batch_got in zip(want, got)
        for f, q in zip(batch_want.astype(np.float64), batch_got.astype(np.float64))
    ]
    (logits,) = agreement.outputs
    assert logits.name == "logits" and logits.matching is None
    assert logits.mean_cosine == pytest.approx(np.mean(cosines), abs=1e-12)
    assert logits.lowest_cosine == pytest.approx(min(cosines), abs=1e-12)
    errors = [np.abs(f.astype(np.float64) - q).max() for f, q in zip(want, got)]
    assert logits.max_abs_error == max(errors)
    assert 0.99 < logits.lowest_cosine < 1.0  # a real comparison: quantization moves the logits


def test_an_integer_output_reports_the_fraction_of_equal_elements(tmp_path: Path) -> None:
    """MatMul -> ArgMax: the class ids agree or not; the float scores get cosines."""
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((16, 6)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["scores"], name="mm"),
            helper.make_node("ArgMax", ["scores"], ["label"], name="argmax", axis=1, keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 6]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["n"]),
        ],
        [numpy_helper.from_array(weight, "W")],
    )
    model = tmp_path / "argmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    data = [{"x": rng.standard_normal((64, 16)).astype(np.float32)}]
    out = tmp_path / "out.onnx"
    result = calibrate(model, data, out=out, evaluate_samples=64, scheme={"activation_type": "int4"})
    assert result.agreement is not None
    outputs = {output.name: output for output in result.agreement.outputs}
    ((want_scores, want_labels),), ((got_scores, got_labels),) = runs(model, data), runs(out, data)
    assert (
        outputs["label"].matching == np.mean(want_labels == got_labels)
        and outputs["label"].mean_cosine is None
    )
    assert outputs["label"].matching < 1.0  # 4-bit scores flip some of the 64 labels
    cosines = sample_cosines(want_scores, got_scores, per_sample=True)
    assert outputs["scores"].lowest_cosine == pytest.approx(cosines.min(), abs=1e-12)


def test_a_model_onnxruntime_cannot_optimize_is_compared_at_basic_level(tmp_path: Path) -> None:
    """int4 around digits' MaxPool: ORT_ENABLE_ALL refuses the model, ORT_ENABLE_BASIC runs it. Finalize
    says so in a note, so the comparison runs at BASIC; without that advice it falls back to BASIC."""
    data = batches("digits_cnn", 1)
    out = tmp_path / "int4.onnx"
    scheme = {"activation_type": "int4", "weight_type": "int4"}
    result = calibrate(MODELS / "digits_cnn.onnx", data, out=out, scheme=scheme, evaluate_samples=8)
    assert result.agreement is not None and result.agreement.level == "ORT_ENABLE_BASIC"
    assert any("ORT_ENABLE_BASIC" in note for note in result.notes) and not result.agreement.warnings
    with pytest.raises(Exception, match="int4"):
        runs(out, data)
    dataset = open_dataset(data, onnx.load(MODELS / "digits_cnn.onnx"))
    unadvised = evaluate(str(MODELS / "digits_cnn.onnx"), str(out), dataset, 8)
    assert unadvised.level == "ORT_ENABLE_BASIC" and unadvised.outputs == result.agreement.outputs
    assert "onnxruntime (ORT_ENABLE_ALL) cannot run the written model" in unadvised.warnings[0]
    ((want,),), ((got,),) = (
        runs(MODELS / "digits_cnn.onnx", data, "ORT_ENABLE_BASIC"),
        runs(out, data, "ORT_ENABLE_BASIC"),
    )
    assert result.agreement.outputs[0].lowest_cosine == pytest.approx(
        sample_cosines(want, got, per_sample=True).min(), abs=1e-12
    )


def test_cli_prints_the_comparison_by_default_and_skips_it_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    common = digits_command(tmp_path, batches("digits_cnn"))
    assert main([*common, "--json", str(tmp_path / "default.json")]) == 0
    shown = capsys.readouterr().out
    assert "QDQ model against float in onnxruntime (ORT_ENABLE_ALL), first 32 samples" in shown
    default = json.loads((tmp_path / "default.json").read_text())["agreement"]
    assert default["samples"] == 32 and default["outputs"][0]["name"] == "logits"
    assert main([*common, "--json", str(tmp_path / "skipped.json"), "--evaluate", "0"]) == 0
    assert "QDQ model against float" not in capsys.readouterr().out
    assert json.loads((tmp_path / "skipped.json").read_text())["agreement"] is None
    refused = tmp_path / "refused.onnx"
    assert main([*common[:-1], str(refused), "--evaluate", "-1"]) == 2 and not refused.exists()
    assert "--evaluate -1" in capsys.readouterr().err


def test_sample_cosines_count_the_elements_finite_in_both() -> None:
    reference = np.array(
        [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [np.nan, 1.0, 1.0], [np.inf, 1.0, 5.0]]
    )
    candidate = np.array(
        [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, np.nan, 5.0]]
    )
    cosines = sample_cosines(reference, candidate, per_sample=True)
    # Rows 3 and 4 compare their finite pairs: (1, 1) with (1, 1), and (5) alone, which says nothing.
    assert cosines[:4] == pytest.approx([np.sqrt(0.5), 1.0, 0.0, 1.0]) and np.isnan(cosines[4])
    assert nonfinite_mismatches(reference, candidate) == 3  # NaN vs 1, Inf vs 1, 1 vs NaN
    assert nonfinite_mismatches(np.array([np.inf, np.nan]), np.array([-np.inf, np.nan])) == 1
    # Without a batch axis: one cosine for the whole output.
    assert sample_cosines(np.array([3.0, 4.0]), np.array([3.0, 4.0]), per_sample=False).tolist() == [1.0]


def test_loaded_ranges_are_compared_on_the_data_given(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--load-ranges with --data: the data serves the comparison only (and is refused without one)."""
    npz = save_npz(tmp_path / "data.npz", batches("digits_cnn", 2))
    ranges, first, second = tmp_path / "ranges.json", tmp_path / "first.json", tmp_path / "second.json"
    model = str(MODELS / "digits_cnn.onnx")
    out = ["-o", str(tmp_path / "m.onnx"), "--quiet"]
    assert (
        main(["calibrate", model, "--data", str(npz), "--ranges", str(ranges), "--json", str(first), *out])
        == 0
    )
    assert (
        main(
            [
                "calibrate",
                model,
                "--load-ranges",
                str(ranges),
                "--data",
                str(npz),
                "--json",
                str(second),
                *out,
            ]
        )
        == 0
    )
    reloaded = json.loads(second.read_text())["agreement"]
    assert reloaded == json.loads(first.read_text())["agreement"] and reloaded["samples"] == 16
    capsys.readouterr()
    skipped = ["calibrate", model, "--load-ranges", str(ranges), "--data", str(npz), "--evaluate", "0", *out]
    assert main(skipped) == 2 and "--data would have no effect" in capsys.readouterr().err
    wrong = save_npz(tmp_path / "wrong.npz", [{"pixels": batches("digits_cnn", 1)[0]["image"]}])
    written = tmp_path / "never.onnx"
    assert (
        main(["calibrate", model, "--load-ranges", str(ranges), "--data", str(wrong), "-o", str(written)])
        == 2
    )
    assert "pixels" in capsys.readouterr().err and not written.exists()


def test_each_activations_own_loss_is_its_quantize_dequantize_error(tmp_path: Path) -> None:
    """Recomputed here from the written model's QuantizeLinear parameters and onnxruntime's float values."""
    data = batches("digits_cnn", 2)
    out = tmp_path / "digits.qdq.onnx"
    result = calibrate(MODELS / "digits_cnn.onnx", data, out=out, evaluate_samples=16, evaluate_tensors=True)
    assert result.agreement is not None and result.agreement.tensors is not None
    losses = {loss.name: loss for loss in result.agreement.tensors}
    written = onnx.load(out)
    constants = {t.name: numpy_helper.to_array(t) for t in written.graph.initializer}
    # A graph output keeps its name after its DequantizeLinear: its QuantizeLinear reads a renamed tensor.
    outputs = {output.name for output in written.graph.output}
    dequantized = {n.input[0]: n.output[0] for n in written.graph.node if n.op_type == "DequantizeLinear"}
    quantize = {
        dequantized[n.output[0]] if dequantized[n.output[0]] in outputs else n.input[0]: n
        for n in written.graph.node
        if n.op_type == "QuantizeLinear"
    }
    assert set(losses) == set(quantize) and len(losses) >= 5
    exposed = onnx.load(MODELS / "digits_cnn.onnx")
    exposed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in losses if name != "image")
    exposed_path = tmp_path / "exposed.onnx"
    onnx.save(exposed, exposed_path)
    options = ort.SessionOptions()  # unoptimized, as calibration runs the float model
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(exposed_path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    for name, loss in losses.items():
        errors = []
        for feed in data:
            values = feed["image"] if name == "image" else session.run(names, feed)[names.index(name)]
            scale, zero = constants[quantize[name].input[1]], constants[quantize[name].input[2]]
            info = np.iinfo(zero.dtype)
            stored = np.clip(np.rint(values / scale) + zero.astype(np.float32), info.min, info.max)
            restored = ((stored - zero.astype(np.float32)) * scale).astype(np.float64)
            for x, x_hat in zip(values.astype(np.float64), restored):
                errors.append(np.linalg.norm(x - x_hat) / np.linalg.norm(x))
        assert loss.mean_relative_error == pytest.approx(np.mean(errors), rel=1e-9), name
        assert loss.largest_relative_error == pytest.approx(max(errors), rel=1e-9), name
    worst = result.agreement.worst_tensors(3)
    assert [w.mean_relative_error for w in worst] == sorted(
        (loss.mean_relative_error for loss in losses.values()), reverse=True
    )[:3]
    assert worst[0].mean_relative_error > 0.001  # int8 loses something real


def test_cli_lists_the_worst_tensors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    json_path = tmp_path / "result.json"
    arguments = digits_command(tmp_path, batches("digits_cnn", 2))
    assert main([*arguments, "--worst-tensors", "2", "--json", str(json_path)]) == 0
    shown = capsys.readouterr().out.split("activations losing most to their own Q/DQ")
    assert len(shown) == 2 and len([line for line in shown[1].splitlines() if "│" in line]) == 2
    tensors = json.loads(json_path.read_text())["agreement"]["tensors"]
    assert {"name", "mean_relative_error", "largest_relative_error"} == set(tensors[0])
    assert main([*arguments, "--json", str(json_path)]) == 0  # off by default
    assert json.loads(json_path.read_text())["agreement"]["tensors"] is None


def small_model(tmp_path: Path, nodes: list, outputs: list, initializers: dict[str, np.ndarray]) -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        outputs,
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_an_output_turning_infinite_is_counted_and_warned_about(tmp_path: Path) -> None:
    """1 / MatMul(x): the small products of the first batch quantize to 0 beside the second batch's large
    ones, and their quotients become Inf (Div is not quantized)."""
    weight = np.full((6, 1), 1e-4, dtype=np.float32)
    model = small_model(
        tmp_path,
        [
            helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
            helper.make_node("Div", ["one", "m"], ["y"], name="div"),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
        {"W": weight, "one": np.ones(1, np.float32)},
    )
    data = [{"x": np.full((4, 6), value, dtype=np.float32)} for value in (0.5, 1000.0)]
    out = tmp_path / "out.onnx"
    # The guard would keep both clusters' tensors in float (4+ empty octaves apart): off, to quantize them.
    result = calibrate(model, data, out=out, evaluate_samples=8, batch_size=4, sentinel="off")
    assert result.agreement is not None
    (y,) = result.agreement.outputs
    ((want,),), ((got,),) = runs(model, data[:1]), runs(out, data[:1])
    assert np.isfinite(want).all() and np.isinf(got).all()  # the first batch: 4 of the 8 samples
    assert y.nonfinite_mismatches == 4 and y.max_abs_error is not None  # the second batch stays finite
    assert any(f"output 'y': {y.nonfinite_mismatches} element(s) are Inf/NaN" in w for w in result.warnings)


def test_an_output_without_a_batch_axis_is_one_sample_per_batch(tmp_path: Path) -> None:
    """A column mean [6] with batches of 6: its 6 values are not 6 samples (each would score cosine 1)."""
    rng = np.random.default_rng(5)
    model = small_model(
        tmp_path,
        [
            helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
            helper.make_node("ReduceMean", ["m"], ["mean"], name="mean", axes=[0], keepdims=0),
        ],
        [
            helper.make_tensor_value_info("m", TensorProto.FLOAT, ["n", 6]),
            helper.make_tensor_value_info("mean", TensorProto.FLOAT, [6]),
        ],
        {"W": rng.standard_normal((6, 6)).astype(np.float32)},
    )
    data = [{"x": rng.standard_normal((6, 6)).astype(np.float32)} for _ in range(3)]
    out = tmp_path / "out.onnx"
    result = calibrate(model, data, out=out, evaluate_samples=18, batch_size=6)
    assert result.agreement is not None
    outputs = {output.name: output for output in result.agreement.outputs}
    want, got = runs(model, data), runs(out, data)
    per_batch = [sample_cosines(w[1], g[1], per_sample=False)[0] for w, g in zip(want, got)]
    assert outputs["mean"].mean_cosine == pytest.approx(np.mean(per_batch), abs=1e-12)
    per_sample = np.concatenate([sample_cosines(w[0], g[0], per_sample=True) for w, g in zip(want, got)])
    assert outputs["m"].lowest_cosine == pytest.approx(per_sample.min(), abs=1e-12)


def test_data_that_reads_once_skips_the_comparison_with_a_warning(tmp_path: Path) -> None:
    feeds = iter(batches("digits_cnn", 2))  # a function handing out the same iterator: empty the 2nd time
    out = tmp_path / "out.onnx"
    result = calibrate(MODELS / "digits_cnn.onnx", lambda: feeds, out=out, evaluate_samples=16)
    assert out.exists() and result.agreement is not None and result.agreement.level == "not run"
    assert any("reading --data again failed" in w and "--evaluate 0" in w for w in result.warnings)
