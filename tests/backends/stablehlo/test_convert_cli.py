"""`qconvert convert MODEL --to stablehlo`: output verified by jaxlib, exit codes, no partial output file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.cli import main


def quantize_model(shape: tuple[int, ...] = (2, 16)) -> onnx.ModelProto:
    """x -> QuantizeLinear(zp 3) -> DequantizeLinear -> y, plus a 64-element dequantized weight."""
    initializers = [
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
        numpy_helper.from_array(np.array(3, np.int8), "z"),
        numpy_helper.from_array((np.arange(64) - 32).astype(np.int8).reshape(4, 16), "w"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize_x"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequantize_x"),
        helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wd"], name="dequantize_w"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", shape[1]])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", shape[1]]),
            helper.make_tensor_value_info("wd", TensorProto.FLOAT, (4, 16)),
        ],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def save(model: onnx.ModelProto, folder: Path, name: str = "model.onnx") -> str:
    path = folder / name
    onnx.save(model, path)
    return str(path)


@pytest.mark.engine
@pytest.mark.parametrize("form", ["quantized", "integer", "qdq"])
def test_convert_writes_a_module_jaxlib_runs(tmp_path: Path, form: str) -> None:
    require_module("jax")
    from qconvert.backends.stablehlo import run

    model = save(quantize_model(), tmp_path)
    output = tmp_path / "out.mlir"
    arguments = ["convert", model, "--to", "stablehlo", "--form", form, "--input-shape", "x=2x16"]
    assert main([*arguments, "--inline-weights", "-o", str(output)]) == 0
    text = output.read_text()
    assert "tensor<2x16xf32>" in text  # --input-shape fixed the dynamic batch
    assert ("!quant" in text) == (form != "integer")
    x = (np.arange(32, dtype=np.float32).reshape(2, 16) - 16) * 0.25
    y, weight = run.run(text, [x], "xla")
    np.testing.assert_array_equal(weight, ((np.arange(64) - 32 - 3) * 0.5).astype(np.float32).reshape(4, 16))
    assert y.shape == (2, 16)


def test_convert_default_keeps_weights_as_resources_or_elides_them(tmp_path: Path) -> None:
    model = save(quantize_model(), tmp_path)
    output = tmp_path / "out.mlir"
    assert main(["convert", model, "--input-shape", "x=2x16", "-o", str(output)]) == 0
    text = output.read_text()
    assert "dense_resource<w>" in text and "dialect_resources" in text
    assert main(["convert", model, "--input-shape", "x=2x16", "--elide-weights", "-o", str(output)]) == 0
    elided = output.read_text()
    assert "dense_resource<__elided__>" in elided and "dialect_resources" not in elided


def test_unsupported_ops_exit_2_listing_each_and_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [
        helper.make_node("Det", ["x"], ["d1"], name="first_det"),
        helper.make_node("Det", ["x"], ["d2"], name="second_det"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 3))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ()) for n in ("d1", "d2")],
    )
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path)
    output = tmp_path / "out.mlir"
    assert main(["convert", model, "-o", str(output)]) == 2
    message = capsys.readouterr().err
    # Grouped by op type and reason (issue 18): one line for both Det nodes, with their names.
    assert "onnx.Det x2 (nodes 'first_det', 'second_det'): no StableHLO lowering for this op" in message
    assert not output.exists() and not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    ("option", "value"), [("--to", "tosa-nope"), ("--form", "fused"), ("--semantics", "ieee")]
)
def test_bad_option_values_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    model = save(quantize_model(), tmp_path)
    assert main(["convert", model, option, value, "-o", str(tmp_path / "out.mlir")]) == 2
    assert f"{option} '{value}'" in capsys.readouterr().err


def test_missing_model_exits_2(tmp_path: Path) -> None:
    assert main(["convert", str(tmp_path / "absent.onnx"), "-o", str(tmp_path / "out.mlir")]) == 2


def test_convert_to_onnx_writes_a_model_onnxruntime_runs_identically(tmp_path: Path) -> None:
    import onnxruntime as ort

    model = save(quantize_model(), tmp_path)
    output = tmp_path / "round_trip.onnx"
    assert main(["convert", model, "--to", "onnx", "-o", str(output)]) == 0
    x = (np.arange(32, dtype=np.float32).reshape(2, 16) - 16) * 0.3
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    original = ort.InferenceSession(model, options).run(None, {"x": x})
    written = ort.InferenceSession(str(output), options).run(None, {"x": x})
    for a, b in zip(original, written, strict=True):
        np.testing.assert_array_equal(a, b)


def test_convert_to_onnx_needs_an_output_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = save(quantize_model(), tmp_path)
    assert main(["convert", model, "--to", "onnx"]) == 2
    assert "give -o PATH" in capsys.readouterr().err


def test_dynamic_input_names_the_input_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = save(quantize_model(), tmp_path)
    assert main(["convert", model, "-o", str(tmp_path / "out.mlir")]) == 2
    message = capsys.readouterr().err
    assert "input 'x' has type tensor<?x16xf32>" in message and "--input-shape" in message
