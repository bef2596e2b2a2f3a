"""`qconvert import` and `qconvert inspect`: output that `qconvert opt` parses back, exit code 2 on bad
input with a one-line message, no traceback and no output file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconvert.cli import main


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["xd"], name="dq"),
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=1, name="dq_w"),
        helper.make_node("MatMul", ["xd", "wf"], ["y"], name="mm"),
    ]
    initializers = [
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
        numpy_helper.from_array(np.array(3, np.uint8), "zp"),
        numpy_helper.from_array(np.arange(-16, 16, dtype=np.int8).reshape(4, 8), "w"),
        numpy_helper.from_array(np.full(8, 0.25, np.float32), "ws"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    return path


@pytest.mark.parametrize("elide", [False, True])
def test_import_writes_ir_that_opt_parses_back(model_path: Path, tmp_path: Path, elide: bool) -> None:
    out = tmp_path / "out.mlir"
    arguments = ["import", str(model_path), "-o", str(out), "--input-shape", "x=2x4"]
    assert main([*arguments, "--elide-weights"] if elide else arguments) == 0
    text = out.read_text()
    assert "tensor<2x4xf32>" in text and "quant.qcast" in text
    assert ("dense_resource<__elided__>" in text) == elide
    assert main(["opt", str(out), "--allow-unregistered-dialect", "-o", str(tmp_path / "again.mlir")]) == 0


def test_inspect_summarizes_schemes_and_storage(model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(model_path)]) == 0
    printed = capsys.readouterr().out
    assert "per-axis: 1" in printed and "per-tensor: 2" in printed
    assert "u8: 2" in printed and "i8: 1" in printed


def test_bad_model_exits_2_without_traceback_or_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffnot a model")
    out = tmp_path / "out.mlir"
    assert main(["import", str(bad), "-o", str(out)]) == 2
    error = capsys.readouterr().err
    assert "not a valid ONNX model" in error and "Traceback" not in error
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [bad]


def test_malformed_input_shape_exits_2(model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(model_path), "--input-shape", "x=2xq"]) == 2
    assert "expected NAME=D0xD1x" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["import", "convert"])
@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("missing/out.mlir", "does not exist"),
        ("m.onnx", "would overwrite MODEL"),
        (".", "is a folder"),
    ],
)
def test_unwritable_output_exits_2_before_any_work(
    model_path: Path, verb: str, target: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new user's `-o /no/such/dir/x.mlir` was an internal error (exit 3) after the whole conversion."""
    before = model_path.read_bytes()
    output = model_path.parent / target
    assert main([verb, str(model_path), "--input-shape", "x=2x4", "-o", str(output)]) == 2
    error = capsys.readouterr().err
    assert message in error and "internal error" not in error
    assert model_path.read_bytes() == before
    assert sorted(p.name for p in model_path.parent.iterdir()) == ["m.onnx"]
