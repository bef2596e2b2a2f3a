"""Outlier channels widened to int16 by default (qconvert/calibrate/channel_spread.py, issue 26)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qconvert.calibrate.channel_spread import (
    OUTLIER_SPREAD,
    ChannelSpread,
    channel_first_tensors,
    channel_maxima,
    choose_widened,
    spread_of,
)


def _outlier_model(tmp_path):
    """x -> MatMul -> hidden (channel 7 about 100x the others, varying: no far cluster for the guard) ->
    MatMul (reading channel 7 at 1/100 weight) -> y, and 64 samples: an 8-bit scale for hidden crushes
    the channels y depends on."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    first = (rng.standard_normal((32, 32)) * 0.2).astype(np.float32)
    first[:, 7] *= 100.0
    second = (rng.standard_normal((32, 16)) * 0.2).astype(np.float32)
    second[7] *= 0.01
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["hidden"], name="up"),
            helper.make_node("MatMul", ["hidden", "w2"], ["y"], name="down"),
        ],
        "outlier_channels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, 16])],
        [numpy_helper.from_array(a, n) for a, n in ((first, "w1"), (second, "w2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model_path, data_path = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(model, model_path)
    np.savez(data_path, x=rng.standard_normal((64, 8, 32)).astype(np.float32))
    return model_path, data_path


def test_spread_is_largest_over_median_channel_on_the_channel_axis() -> None:
    values = np.ones((4, 3, 16), np.float32)
    values[2, 1, 5] = -40.0
    maxima = channel_maxima(values, -1)
    assert maxima is not None and maxima.shape == (16,)
    assert spread_of(maxima) == (40.0, 5)
    nchw = np.moveaxis(values, -1, 1)  # the same values with channels on axis 1
    assert spread_of(channel_maxima(nchw, 1)) == (40.0, 5)  # type: ignore[arg-type]
    dead = maxima.copy()
    dead[8:] = 0.0  # all-zero channels (a dead ReLU) are left out of the median
    assert spread_of(dead) == (40.0, 5)
    assert spread_of(np.array([1.0, 50.0, 1.0])) is None  # too few channels to speak of a spread
    assert channel_maxima(np.ones(5, np.float32), -1) is None


def test_choose_widened_takes_the_largest_spreads_within_the_share() -> None:
    spreads = {f"t{i}": ChannelSpread(f"t{i}", float(s), 0, -1) for i, s in enumerate([40, 200, 31, 90, 33])}
    chosen = choose_widened(spreads, list(spreads), quantized=30)  # 10% of 30: 3
    assert [c.tensor for c in chosen] == ["t1", "t3", "t0"]
    assert all(c.spread >= OUTLIER_SPREAD for c in chosen)
    assert [c.tensor for c in choose_widened(spreads, list(spreads), quantized=30, already=2)] == ["t1"]
    assert [c.tensor for c in choose_widened(spreads, ["t2", "t4"], quantized=4)] == ["t4"]  # at least 1


def test_convolution_layout_is_channel_first_through_elementwise_ops() -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Add", ["r", "c"], ["s"]),
            helper.make_node("Flatten", ["s"], ["f"]),
            helper.make_node("Relu", ["f"], ["g"]),
        ],
        "layout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 384])],
        [helper.make_tensor("w", TensorProto.FLOAT, [6, 3, 1, 1], np.ones(18).tolist())],
    )
    from onnx import shape_inference

    model = shape_inference.infer_shapes(helper.make_model(graph))
    assert channel_first_tensors(model) == {"x", "c", "r", "s"}  # f and g are rank 2: last axis


def test_calibrate_widens_the_outlier_channel_tensor_by_default(tmp_path) -> None:
    """Default: the tensor whose channel 7 dwarfs the others is int16 symmetric in the written model, with
    a note and the JSON entry; the decision is kept in the ranges JSON; `off` leaves it 8-bit, and the
    outputs track the float model better widened (onnxruntime)."""
    from conftest import require_module

    require_module("onnxruntime")
    import onnx

    from qconvert.calibrate.api import calibrate

    model, data = _outlier_model(tmp_path)
    out, ranges, result_json = tmp_path / "q.onnx", tmp_path / "r.json", tmp_path / "res.json"
    result = calibrate(
        str(model), str(data), out=str(out), ranges_path=str(ranges), json_path=str(result_json),
        batch_size=8, evaluate_samples=32,
    )  # fmt: skip
    (widened,) = result.widened_outliers
    assert widened == "hidden"
    assert result.widened_outliers[widened].startswith("outlier channels: spread ")
    assert "(channel 7)" in result.widened_outliers[widened]
    assert any(f"{widened}: widened to int16 symmetric (outlier channels" in n for n in result.notes)
    assert json.loads(result_json.read_text())["widened_outliers"] == result.widened_outliers
    assert result.quantization[widened] == {**result.quantization[widened], "storage": "i16", "zero_point": 0}
    written = onnx.load(out)
    quantized = {node.input[0] for node in written.graph.node if node.op_type == "QuantizeLinear"}
    assert widened in quantized
    reloaded = tmp_path / "reloaded.onnx"
    calibrate(str(model), None, out=str(reloaded), load_ranges=str(ranges))
    assert reloaded.read_bytes() == out.read_bytes()  # the decision is in the ranges JSON
    off = calibrate(
        str(model), str(data), out=str(tmp_path / "off.onnx"), batch_size=8, evaluate_samples=32,
        outlier_channels="off",
    )  # fmt: skip
    assert off.widened_outliers == {} and off.quantization[widened]["storage"] == "i8"
    assert result.agreement is not None and off.agreement is not None
    (on_output,), (off_output,) = result.agreement.outputs, off.agreement.outputs
    assert on_output.mean_cosine > off_output.mean_cosine  # type: ignore[operator]
    assert on_output.max_abs_error < off_output.max_abs_error  # type: ignore[operator]


def test_the_decision_does_not_depend_on_the_workers(tmp_path) -> None:
    from conftest import require_module

    require_module("onnxruntime")
    from qconvert.calibrate.api import calibrate

    model, data = _outlier_model(tmp_path)
    one = calibrate(str(model), str(data), batch_size=8, ranges_path=str(tmp_path / "one.json"))
    two = calibrate(str(model), str(data), batch_size=8, workers=2, ranges_path=str(tmp_path / "two.json"))
    assert one.ranges.metadata["widened_outliers"] == two.ranges.metadata["widened_outliers"]
    assert len(one.ranges.metadata["widened_outliers"]) == 1  # type: ignore[arg-type]


def test_the_comparison_reusing_the_float_run_matches_one_running_the_float_model(tmp_path) -> None:
    """evaluate() given the float run's outputs reports what it reports running the float model itself."""
    from conftest import require_module

    require_module("onnxruntime")
    from qconvert.calibrate.api import calibrate
    from qconvert.calibrate.channel_spread import float_run
    from qconvert.calibrate.collect import load_float_model
    from qconvert.calibrate.dataset import open_dataset
    from qconvert.calibrate.evaluate import evaluate

    model, data = _outlier_model(tmp_path)
    out = tmp_path / "q.onnx"
    calibrate(str(model), str(data), out=str(out), batch_size=8)
    loaded = load_float_model(str(model))
    run = float_run(loaded, ["x", "hidden"], open_dataset(str(data), loaded.model, 8))
    assert run.batch_sizes == [8, 8, 8, 8] and set(run.spreads) == {"x", "hidden"}
    assert run.spreads["hidden"].spread > 50 > run.spreads["x"].spread
    dataset = open_dataset(str(data), loaded.model, 8)
    computed = list(zip(run.batch_sizes, run.outputs))
    reused = evaluate(str(model), str(out), dataset, 48, reference_outputs=computed)  # 2 batches more
    fresh = evaluate(str(model), str(out), dataset, 48)
    assert reused.samples == fresh.samples == 48
    (mine,), (theirs,) = reused.outputs, fresh.outputs
    assert mine.mean_cosine == pytest.approx(theirs.mean_cosine, abs=1e-9)
    assert mine.max_abs_error == pytest.approx(theirs.max_abs_error, rel=1e-5)


def test_unknown_policy_is_refused_before_any_work(tmp_path) -> None:
    from qconvert.calibrate.api import calibrate
    from qconvert.errors import InputError

    with pytest.raises(InputError, match="--outlier-channels widden: expected one of widen, off"):
        calibrate(str(tmp_path / "missing.onnx"), None, outlier_channels="widden")
