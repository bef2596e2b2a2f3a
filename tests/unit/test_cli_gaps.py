"""The CLI gaps issue 22 left: check's -o, defaults shown as values, a misspelled verb's wording, and inspect
listing a QOperator model's weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from qconvert.cli import main
from qconvert.cli_help import WORKFLOW_ORDER

MODELS = Path(__file__).resolve().parents[2] / "models"
DIGITS_QDQ = MODELS / "digits_cnn.qdq.onnx"
DIGITS_QOP = MODELS / "digits_cnn.qop.onnx"
DIGITS_DATA = MODELS / "digits_cnn.inputs.npz"
# QLinearConv, QLinearMatMul and com.microsoft's QGemm read their weight, its scale and zero point at 3, 4, 5
WEIGHT_READERS = ("QLinearConv", "QLinearMatMul", "QGemm")


def test_a_misspelled_verb_is_no_such_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrat", str(DIGITS_QDQ)]) == 2
    error = " ".join(capsys.readouterr().err.replace("│", "").split())
    assert "No such command 'calibrat'. Did you mean 'calibrate'?" in error
    assert "Invalid value" not in error and "internal error" not in error


@pytest.mark.parametrize("verb", [verb for verb in WORKFLOW_ORDER if verb != "opt"])
def test_defaults_given_as_text_read_as_values(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([verb, "-h"]) == 0
    text = capsys.readouterr().out
    assert "[default: (" not in text
    if verb == "calibrate":
        assert "[default: minmax]" in text and "[default: local]" in text


def test_check_output_is_its_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-o/--output writes what --json writes (the JSON report); both given is refused, nothing written."""
    common = ["check", str(DIGITS_QDQ), "--data", str(DIGITS_DATA), "--quiet"]
    written = tmp_path / "check.json"
    assert main([*common, "-o", str(written)]) == 0
    report = json.loads(written.read_text())
    assert report["verdict"] == "PASSED" and report["model"] == str(DIGITS_QDQ)
    capsys.readouterr()
    assert main([*common, "--output", "-"]) == 0
    on_stdout = json.loads(capsys.readouterr().out)
    assert on_stdout.keys() == report.keys() and on_stdout["verdict"] == report["verdict"]
    both = tmp_path / "both.json"
    assert main([*common, "-o", str(both), "--json", str(tmp_path / "other.json")]) == 2
    assert "--json and -o/--output" in capsys.readouterr().err
    assert not both.exists() and not (tmp_path / "other.json").exists()
    assert main(["check", "-h"]) == 0
    assert "--output" in capsys.readouterr().out


def test_inspect_lists_a_qoperator_models_weights(capsys: pytest.CaptureFixture[str]) -> None:
    """Each QLinear node's weight is listed by its initializer's name, with the node's own scales and zero
    points (read from the ONNX model), beside the activations."""
    model = onnx.load(str(DIGITS_QOP))
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    readers = [node for node in model.graph.node if node.op_type in WEIGHT_READERS]
    assert len(readers) == 3
    assert main(["inspect", str(DIGITS_QOP), "--json", "-"]) == 0
    tensors = {entry["tensor"]: entry for entry in json.loads(capsys.readouterr().out)["quantized_tensors"]}
    for node in readers:
        weight, scale, zero_point = node.input[3:6]
        entry = tensors[weight]
        assert entry["storage"] == "i8"
        scales = np.atleast_1d(initializers[scale])
        zero_points = np.atleast_1d(initializers[zero_point])
        if entry["scheme"] == "per-axis":
            np.testing.assert_array_equal(np.float32(entry["scales"]), scales)
            np.testing.assert_array_equal(entry["zero_points"], zero_points)
        else:
            assert np.float32(entry["scale"]) == scales[0] and entry["zero_point"] == zero_points[0]
    assert main(["inspect", str(DIGITS_QOP), "--verbose"]) == 0
    text = capsys.readouterr().out
    assert f"quantized tensors ({len(tensors)})" in text
    assert all(f"  {node.input[3]}: i8" in text for node in readers)
