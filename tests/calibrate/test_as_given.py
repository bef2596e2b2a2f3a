"""`--batch-size given`: each item of the data is one run of the model, fed as stored (dataset.py).

The models here are the ones the rank rule cannot feed: a sequence-first input x[S, B, 4] (axis 0 is not
the batch) beside a scalar input with no batch axis at all. Items as given are what onnxruntime's
CalibrationDataReader feeds, so the written Q/DQ parameters are compared with `quantize_static`'s on the
same items, and the written model is run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from calibrate.parity_support import onnxruntime_qdq, written_qdq
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.calibrate.api import calibrate
from qconvert.calibrate.dataset import AS_GIVEN, open_dataset
from qconvert.cli import main
from qconvert.errors import InputError


def sequence_first_model(path: Path) -> Path:
    """y[S, B, 3] = MatMul(Relu(MatMul(x, W1) + b) * scale, W2), x[S, B, 4] with S and B dynamic, scale a
    scalar input."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="add"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "scale"], ["rs"], name="mul"),
        helper.make_node("MatMul", ["rs", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "sequence_first",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", "B", 4]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["S", "B", 3])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def runs(count: int = 6) -> list[dict[str, np.ndarray]]:
    """Items of different sequence lengths, two sequences each, and a scale per run."""
    rng = np.random.default_rng(1)
    return [
        {
            "x": (rng.standard_normal((3 + 2 * (k % 3), 2, 4)) * (1 + 0.1 * k)).astype(np.float32),
            "scale": np.asarray(0.5 + 0.3 * k, dtype=np.float32),
        }
        for k in range(count)
    ]


def save_folder(folder: Path, items: list[dict[str, np.ndarray]]) -> Path:
    folder.mkdir()
    for k, item in enumerate(items):
        np.savez(folder / f"run_{k:02d}.npz", **item)
    return folder


def test_written_qdq_equals_quantize_static_on_the_same_items(tmp_path: Path) -> None:
    model = sequence_first_model(tmp_path / "model.onnx")
    items = runs()
    out = tmp_path / "ours.onnx"
    scheme = {"per_channel": False}  # onnxruntime's default scheme
    calibrate(model, items, batch_size=AS_GIVEN, out=out, scheme=scheme, outlier_channels="off")
    ours = written_qdq(onnx.load(out))
    theirs = onnxruntime_qdq(model, items, tmp_path)
    assert ours == theirs
    # both inputs and the activations are quantized: Q/DQ pairs named after their tensors
    assert {f"{name}_QuantizeLinear" for name in ("x", "scale", "r", "rs")} <= set(ours)
    ort = pytest.importorskip("onnxruntime")
    sessions = [
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for path in (out, tmp_path / "ort.qdq.onnx", model)
    ]
    for item in items:
        got, onnxruntime_got, want = (session.run(None, item)[0] for session in sessions)
        assert got.shape == want.shape == (*item["x"].shape[:2], 3)
        assert got.tobytes() == onnxruntime_got.tobytes()
        cosine = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
        assert cosine > 0.99


def test_files_a_stacked_npz_and_a_function_give_the_same_ranges(tmp_path: Path) -> None:
    model = sequence_first_model(tmp_path / "model.onnx")
    items = runs()
    same_length = [item for item in items if item["x"].shape[0] == 3]
    stacked = tmp_path / "stacked.npz"  # runs of one length stacked on a new axis 0: rank 4 for x[S, B, 4]
    np.savez(
        stacked, x=np.stack([i["x"] for i in same_length]), scale=np.stack([i["scale"] for i in same_length])
    )
    from_stack = calibrate(model, stacked, batch_size=AS_GIVEN).ranges.to_json()["tensors"]
    from_list = calibrate(model, same_length, batch_size=AS_GIVEN).ranges.to_json()["tensors"]
    assert from_stack == from_list
    folder = save_folder(tmp_path / "runs", items)
    from_files = calibrate(model, folder, batch_size=AS_GIVEN)
    assert from_files.stats is not None and from_files.stats.samples_used == len(items)
    assert (
        from_files.ranges.to_json()["tensors"]
        == calibrate(model, items, batch_size=AS_GIVEN).ranges.to_json()["tensors"]
    )


def test_two_workers_give_the_ranges_of_one(tmp_path: Path) -> None:
    model = sequence_first_model(tmp_path / "model.onnx")
    folder = save_folder(tmp_path / "runs", runs(7))
    one = calibrate(model, folder, batch_size=AS_GIVEN, method="entropy")
    two = calibrate(model, folder, batch_size=AS_GIVEN, method="entropy", workers=2)
    assert one.ranges.to_json()["tensors"] == two.ranges.to_json()["tensors"]


def test_ray_gives_the_ranges_of_one_process(tmp_path: Path) -> None:
    ray = require_module("ray")
    model = sequence_first_model(tmp_path / "model.onnx")
    folder = save_folder(tmp_path / "runs", runs(5))
    one = calibrate(model, folder, batch_size=AS_GIVEN, method="distribution")
    on_ray = calibrate(model, folder, batch_size=AS_GIVEN, method="distribution", workers=2, engine="ray")
    assert one.ranges.to_json()["tensors"] == on_ray.ranges.to_json()["tensors"]
    assert on_ray.stats is not None and on_ray.stats.samples_used == 5
    assert not ray.is_initialized()  # the local instance was shut down


def test_without_given_a_scalar_input_is_refused_with_the_way_out(tmp_path: Path) -> None:
    model = sequence_first_model(tmp_path / "model.onnx")
    with pytest.raises(InputError, match=r"'scale' is a scalar.*--batch-size given"):
        calibrate(model, runs())


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (np.zeros((2, 4), np.float32), r"rank 2 \(shape \[2, 4\]\).*give rank 3 \(one run, as fed\) or 4"),
        (np.zeros((3, 2, 5), np.float32), r"read as one run of shape \[3, 2, 5\].*dim 2 differs"),
    ],
)
def test_items_of_the_wrong_rank_or_shape_are_named(tmp_path: Path, x: np.ndarray, message: str) -> None:
    model = onnx.load(sequence_first_model(tmp_path / "model.onnx"))
    dataset = open_dataset([{"x": x, "scale": np.float32(1.0)}], model, AS_GIVEN)
    with pytest.raises(InputError, match=message):
        list(dataset.batches())


def test_a_nan_run_is_left_out_whole_and_counted_as_a_run(tmp_path: Path) -> None:
    model = onnx.load(sequence_first_model(tmp_path / "model.onnx"))
    items = runs(4)
    items[1]["x"][0, 0, 0] = np.nan
    dataset = open_dataset(items, model, AS_GIVEN)
    stats_batches = list(dataset.batches())
    assert [batch.size for batch in stats_batches] == [1, 1, 1]
    assert stats_batches[1].arrays["x"].shape == items[2]["x"].shape  # fed as stored, no axis added
    with pytest.raises(InputError, match="--batch-size 4x: expected 1 or more samples, or 'given'"):
        open_dataset(items, model, "4x")


def test_the_cli_calibrates_compares_and_reports_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = sequence_first_model(tmp_path / "model.onnx")
    folder = save_folder(tmp_path / "runs", runs())
    out, report = tmp_path / "out.onnx", tmp_path / "result.json"
    command = ["calibrate", str(model), "--data", str(folder), "--batch-size", "given", "-o", str(out)]
    assert main([*command, "--evaluate", "4", "--json", str(report)]) == 0
    assert "calibrated 6 runs (each item of the data as given)" in capsys.readouterr().out
    result = json.loads(report.read_text())
    assert result["samples"]["batch_size"] == "given" and result["samples"]["used"] == 6
    assert result["agreement"]["samples"] == 4  # runs
    (agreement,) = result["agreement"]["outputs"]
    assert agreement["mean_cosine"] > 0.99 and agreement["lowest_cosine"] > 0.98
    for bad in ("-2", "²", "8.0"):  # '²' is a digit to str.isdigit, not to int()
        assert main([*command[:4], "--batch-size", bad, "-o", str(out)]) == 2
        assert f"--batch-size {bad}: expected 1 or more samples, or 'given'" in capsys.readouterr().err
