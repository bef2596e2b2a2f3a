"""`--target-cosine`: the search widens exactly the tensor with an outlier channel, measured by onnxruntime on
held-out samples, and the model it writes passes `qconvert check` node by node."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qconvert
from qconvert.calibrate.api import calibrate
from qconvert.calibrate.search import channel_loss
from qconvert.cli import main
from qconvert.errors import InputError

TARGET = 0.99


@pytest.fixture(scope="module")
def outlier_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """x -> MatMul -> h -> MatMul -> y; h's channel 0 is ~50x the others (a large weight column) and the
    second MatMul ignores it (a zero weight row), so int8 on h crushes the channels y is made of."""
    folder = tmp_path_factory.mktemp("target_cosine")
    rng = np.random.default_rng(0)
    first = rng.normal(size=(16, 16)).astype(np.float32)
    first[:, 0] *= 50
    second = rng.normal(size=(16, 8)).astype(np.float32)
    second[0] = 0
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2"),
        ],
        "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(first, "w1"), numpy_helper.from_array(second, "w2")],
    )
    model = folder / "outlier.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    data = folder / "data.npz"
    np.savez(data, x=rng.normal(size=(64, 16)).astype(np.float32))
    return model, data


def zero_point_types(path: Path) -> list[int]:
    """The element types of the zero points of the written QuantizeLinear nodes (activations only)."""
    model = onnx.load(path)
    initializers = {tensor.name: tensor.data_type for tensor in model.graph.initializer}
    return sorted(
        initializers[node.input[2]] for node in model.graph.node if node.op_type == "QuantizeLinear"
    )


def test_search_widens_only_the_outlier_tensor_and_the_model_checks_exact(
    outlier_model: tuple[Path, Path], tmp_path: Path
) -> None:
    model, data = outlier_model
    out, report = tmp_path / "out.qdq.onnx", tmp_path / "out.json"
    result = calibrate(
        model, data, scheme={"per_channel": True}, out=out, json_path=report, target_cosine=TARGET
    )
    search = result.search
    assert search is not None and search.reached
    assert search.ranked[0][0] == "h"  # the per-channel loss puts the outlier tensor first
    assert search.widened == ["h"] and search.kept_float == []
    baseline = search.steps[0]
    assert baseline.widened == 0 and not baseline.passed  # plain int8 misses the target
    assert search.eval_samples == 16 and search.calibration_samples == 48  # the last quarter held out
    assert result.stats is not None and result.stats.samples_used == 48
    # The written model, measured by onnxruntime on the held-out samples, reaches the target.
    assert result.agreement is not None and result.agreement.samples == 16
    (output,) = result.agreement.outputs
    assert output.mean_cosine is not None and output.mean_cosine >= TARGET > baseline.mean_cosine
    storages = {name: written["storage"] for name, written in result.quantization.items()}
    assert storages == {"x": "i8", "h": "i16", "y": "i8"}
    assert zero_point_types(out) == sorted([TensorProto.INT8, TensorProto.INT8, TensorProto.INT16])
    written = json.loads(report.read_text())["search"]
    assert written["widened_to_int16"] == ["h"] and len(written["steps"]) == len(search.steps)
    assert any("held-out" in note and "not used for calibration" in note for note in result.notes)
    checked = qconvert.check(str(out), str(data), max_samples=16)
    assert checked.verdict == "PASSED", checked.verdict


def test_eval_data_is_held_out_as_given(outlier_model: tuple[Path, Path], tmp_path: Path) -> None:
    model, data = outlier_model
    rng = np.random.default_rng(5)
    held_out = [{"x": rng.normal(size=(8, 16)).astype(np.float32)} for _ in range(3)]
    out = tmp_path / "out.qdq.onnx"
    result = calibrate(
        model, data, scheme={"per_channel": True}, out=out, target_cosine=TARGET, eval_data=held_out
    )
    assert result.search is not None and result.search.eval_source == "--eval-data"
    assert result.search.eval_samples == 24 and result.search.calibration_samples == 64
    assert result.search.widened == ["h"]


def test_cli_flags_and_refusals(outlier_model: tuple[Path, Path], tmp_path: Path) -> None:
    model, data = outlier_model
    report = tmp_path / "cli.json"
    command = ["calibrate", str(model), "--data", str(data), "--per-channel", "--quiet"]
    assert (
        main(
            [*command, "--target-cosine", str(TARGET), "-o", str(tmp_path / "m.onnx"), "--json", str(report)]
        )
        == 0
    )
    assert json.loads(report.read_text())["search"]["widened_to_int16"] == ["h"]
    assert json.loads(report.read_text())["search"]["outputs"] == ["y"]
    assert main([*command, "--eval-data", str(data), "-o", str(tmp_path / "n.onnx")]) == 2  # no target
    assert main([*command, "--target-cosine", "1.5", "-o", str(tmp_path / "o.onnx")]) == 2
    bad = main([*command, "--target-cosine", "0.9", "--target-output", "z", "-o", str(tmp_path / "p.onnx")])
    assert bad == 2 and not (tmp_path / "p.onnx").exists()  # not an output: named, nothing written
    with pytest.raises(InputError, match="held-out split needs two or more"):
        calibrate(model, [{"x": np.zeros((8, 16), np.float32)}], target_cosine=TARGET)


def test_channel_loss_sees_the_crushed_channels_a_whole_tensor_error_hides() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(size=(64, 8))
    values[:, 0] *= 100
    step = np.abs(values).max() / 127
    restored = np.round(values / step) * step
    whole = np.linalg.norm(values - restored) / np.linalg.norm(values)
    assert whole < 0.05 < channel_loss(values, restored)
