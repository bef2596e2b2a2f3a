"""Per-tensor overrides (onnxruntime's TensorQuantOverrides form): the CLI file, and what is refused.

Parity with `quantize_static` given the same overrides is in test_minmax_parity.py (variants
`overrides_cnn`, `overrides_encoder`, also written and run in onnxruntime).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from calibrate.parity_support import MODELS, batches, lowest_cosines, save_npz, written_qdq
from calibrate.test_minmax_parity import CNN_OVERRIDES
from onnx import TensorProto, helper, numpy_helper

from qconvert.calibrate.api import calibrate
from qconvert.calibrate.overrides import TensorOverride, parse_overrides
from qconvert.calibrate.scheme import Scheme
from qconvert.cli import main
from qconvert.errors import InputError

DIGITS = MODELS / "digits_cnn.onnx"


def test_the_cli_file_gives_the_apis_model(tmp_path: Path) -> None:
    data = batches("digits_cnn", 2)
    overrides = tmp_path / "overrides.json"
    overrides.write_text(json.dumps(CNN_OVERRIDES))
    by_cli, by_api = tmp_path / "cli.onnx", tmp_path / "api.onnx"
    npz = save_npz(tmp_path / "data.npz", data)
    arguments = ["calibrate", str(DIGITS), "--data", str(npz), "--overrides", str(overrides), "--quiet"]
    assert main([*arguments, "-o", str(by_cli)]) == 0
    calibrate(DIGITS, data, out=by_api, scheme=Scheme(tensor_overrides=CNN_OVERRIDES))
    cli_params, api_params = written_qdq(onnx.load(by_cli)), written_qdq(onnx.load(by_api))
    assert cli_params == api_params
    assert cli_params["/Relu_output_0_QuantizeLinear"].zero_point_type == onnx.TensorProto.UINT16
    assert cli_params["logits_QuantizeLinear"].scale == (0.25,)
    assert onnx.load(by_cli).opset_import[0].version == 21  # one 16-bit override raises the opset


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"imag": [{"symmetric": True}]}, "name no tensor of the model: 'imag' (did you mean 'image'?)"),
        ({"conv1.bias": [{"quant_type": "QInt8"}]}, "'conv1.bias': a bias"),
        (
            {"image": [{"reduce_range": True}]},
            "'image': 'reduce_range' and 'axis' apply to initializers only",
        ),
        ({"fc.weight": [{"axis": 0}, {"axis": 0}]}, "per-channel override lists"),
        ({"image": [{"convert": {"quant_type": "QUInt16"}}]}, "'convert'"),
        ({"image": [{"scale": 0.1}]}, "give both 'scale' and 'zero_point'"),
        ({"image": [{"scale": 0.1, "zero_point": 0, "rmin": 0.0}]}, "['rmin'] cannot be combined"),
        ({"image": [{"bits": 8}]}, "unknown override key(s) ['bits']"),
        ({"image": [{"quant_type": "QInt7"}]}, "quant_type 'QInt7' is not one of"),
        ({"image": [{"quant_type": "QFLOAT8E4M3FN"}]}, "float8e4m3fn overrides are not supported"),
        ({"image": [{"symmetric": "yes"}]}, "expected true or false"),
        ({"conv2.weight": [{"axis": 1}]}, "axis 1 is not the output-channel axis (0) of its weight"),
        ({"conv2.weight": [{"axis": 0, "rmin": -1.0}]}, "['rmin'] with 'axis' would set one channel"),
        ({"logits": [{"scale": 0.1, "zero_point": 300}]}, "zero_point 300 is outside int8's [-128, 127]"),
        (
            {"logits": [{"scale": 1e39, "zero_point": 0}]},
            "scale 1e+39 is not a positive finite float32 value",
        ),
        ({"image": []}, "expected a non-empty list"),
        ([["image"]], "expected an object of tensor name"),
    ],
)
def test_bad_overrides_exit_2_naming_the_tensor_and_write_nothing(
    overrides: object, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "overrides.json"
    path.write_text(json.dumps(overrides))
    npz = save_npz(tmp_path / "data.npz", batches("digits_cnn", 1))
    out = tmp_path / "out.onnx"
    code = main(["calibrate", str(DIGITS), "--data", str(npz), "--overrides", str(path), "-o", str(out)])
    error = capsys.readouterr().err
    assert code == 2 and message in error and "Traceback" not in error
    assert not out.exists()


def test_overrides_placement_leaves_without_effect_are_noted_and_uncalibrated_ones_refused(
    tmp_path: Path,
) -> None:
    data = batches("digits_cnn", 1)
    ineffective = {
        "/conv1/Conv_output_0": [{"symmetric": True}],
        "/Flatten_output_0": [{"quant_type": "QUInt16"}],
    }
    result = calibrate(DIGITS, data, out=tmp_path / "out.onnx", scheme={"tensor_overrides": ineffective})
    assert [note for note in result.notes if "has no effect" in note] == [
        "override of '/Flatten_output_0' has no effect: it shares the Q/DQ parameters of "
        "'/gap/GlobalAveragePool_output_0'",
        "override of '/conv1/Conv_output_0' has no effect: Relu '/Relu' is folded into it: its output's Q/DQ "
        "is used",
    ]
    assert onnx.load(tmp_path / "out.onnx").opset_import[0].version == 21  # the uint16 is still asked for
    scheme = {
        "op_types_to_quantize": {"Conv"},
        "tensor_overrides": {"/gap/GlobalAveragePool_output_0": [{"symmetric": True}]},
    }
    with pytest.raises(InputError, match="'/gap/GlobalAveragePool_output_0': not a calibrated tensor"):
        calibrate(DIGITS, data, out=tmp_path / "never.onnx", scheme=scheme)
    assert not (tmp_path / "never.onnx").exists()


def test_mse_refuses_overrides_that_change_a_tensors_storage(tmp_path: Path) -> None:
    scheme = {"tensor_overrides": {"/Relu_output_0": [{"quant_type": "QUInt16"}]}}
    with pytest.raises(InputError, match=r"--method mse searches every range for the scheme's int8"):
        calibrate(DIGITS, batches("digits_cnn", 1), method="mse", scheme=scheme)
    # Weights, the scheme's own settings and given scales leave mse's searches as they are.
    harmless = {
        "conv1.weight": [{"symmetric": False, "quant_type": "QInt4"}],
        "/Relu_output_0": [{"quant_type": "QInt8", "symmetric": False}],
        "logits": [{"quant_type": "QUInt16", "scale": 0.25, "zero_point": 3}],
    }
    result = calibrate(DIGITS, batches("digits_cnn", 1), method="mse", scheme={"tensor_overrides": harmless})
    assert result.method == "mse"


def test_a_conv_transpose_weight_takes_an_axis_override_onnxruntime_runs_unfused(tmp_path: Path) -> None:
    """Conv/Gemm refuse a per-channel axis off their output channels (onnxruntime's fused kernels read it
    wrong); ConvTranspose, which onnxruntime does not fuse, runs either axis correctly."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", ["x", "W"], ["y"], name="ct")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 7, 7])],
        [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "W")],
    )
    model = tmp_path / "ct.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    data = [{"x": rng.standard_normal((4, 4, 5, 5)).astype(np.float32)}]
    out = tmp_path / "out.onnx"
    calibrate(model, data, out=out, scheme={"tensor_overrides": {"W": [{"axis": 0}]}})
    assert written_qdq(onnx.load(out))["W_DequantizeLinear"].axis == 0
    assert lowest_cosines(model, out, data)["y"] > 0.999


def test_initializer_overrides_without_effect_are_noted(tmp_path: Path) -> None:
    """An initializer the selection leaves float, and an axis on a constant of an op without per-channel
    quantization (onnxruntime writes per-channel scales there; we quantize per tensor and say so)."""
    data = batches("digits_cnn", 1)
    scheme = {"op_types_to_quantize": {"Conv"}, "tensor_overrides": {"fc.weight": [{"symmetric": True}]}}
    result = calibrate(DIGITS, data, out=tmp_path / "conv.onnx", scheme=scheme)
    assert "override of 'fc.weight' has no effect: the initializer gets no Q/DQ" in result.notes
    encoder = MODELS / "tiny_encoder.onnx"
    scheme = {"tensor_overrides": {"pos": [{"axis": 1}]}}
    result = calibrate(encoder, batches("tiny_encoder", 1), out=tmp_path / "encoder.onnx", scheme=scheme)
    assert any(note.startswith("override of 'pos': its 'axis' has no effect") for note in result.notes)


def test_an_unreadable_overrides_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "overrides.json"
    path.write_text("{not json")
    npz = save_npz(tmp_path / "data.npz", batches("digits_cnn", 1))
    assert main(["calibrate", str(DIGITS), "--data", str(npz), "--overrides", str(path)]) == 2
    assert f"--overrides {path}: cannot read it as JSON" in capsys.readouterr().err


def test_parsed_overrides_round_trip_through_their_json_form() -> None:
    parsed = parse_overrides(CNN_OVERRIDES)
    assert parsed["conv1.weight"] == TensorOverride(quant_type="int4", axis=0)
    assert parse_overrides({name: [o.to_json()] for name, o in parsed.items()}) == parsed
    with pytest.raises(InputError, match=r"tensor 'image': rmin 2\.0 is above rmax 1\.0"):
        parse_overrides({"image": [{"rmin": 2.0, "rmax": 1.0}]})
