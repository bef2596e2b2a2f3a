"""Blocked Q/DQ whose block size does not divide the dimension (issue 23): ONNX gives the scale ceil(D/B)
blocks along the axis, the last one shorter. The lifter types the tensor padded to whole blocks (MLIR's
verifier wants them whole), pads before the cast and slices after it; the interpreter and the StableHLO
backend (XLA) then agree with onnxruntime bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.cli import main
from qconvert.errors import InputError
from qconvert.frontends.onnx.lift import import_onnx
from qconvert.interpret import interpret
from qconvert.ir import ParserOptions, parse_module, print_module, verify


def activation_and_weight_model(rng: np.random.Generator) -> onnx.ModelProto:
    """x [2, 10] quantized in blocks of 4 along axis 1 (4, 4, 2), and an int8 weight [10, 4] in blocks of 4
    along axis 0, with zero points, into a MatMul."""
    arrays = {
        "w": rng.integers(-128, 128, (10, 4)).astype(np.int8),
        "ws": rng.uniform(0.01, 0.1, (3, 4)).astype(np.float32),
        "wz": rng.integers(-3, 3, (3, 4)).astype(np.int8),
        "xs": rng.uniform(0.01, 0.1, (2, 3)).astype(np.float32),
        "xz": rng.integers(-3, 3, (2, 3)).astype(np.int8),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], axis=1, block_size=4, name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], axis=1, block_size=4, name="dq_x"),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0, block_size=4, name="dq_w"),
        helper.make_node("MatMul", ["xd", "wf"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "ragged",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(array, name) for name, array in arrays.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def int4_weight_model(rng: np.random.Generator, scale: np.ndarray | None = None) -> onnx.ModelProto:
    """An int4 weight [4, 10] in blocks of 4 along axis 1, no zero point, with negative scales among them
    (as onnxruntime's symmetric n-bit quantizer writes)."""
    if scale is None:
        scale = rng.uniform(0.01, 0.1, (4, 3)) * rng.choice([-1, 1], (4, 3))
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=1, block_size=4, name="dq_w"),
        helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "ragged_int4",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])],
        [
            helper.make_tensor("w", TensorProto.INT4, [4, 10], rng.integers(-8, 8, 40)),
            numpy_helper.from_array(np.asarray(scale, np.float32), "ws"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ort = require_module("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    # every intermediate too: the quantized activation's storage and the dequantized weight
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def with_intermediates(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed = onnx.shape_inference.infer_shapes(exposed)
    known = {info.name: info for info in exposed.graph.value_info}
    for name in names:
        exposed.graph.output.append(known[name])
    return exposed


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ragged_blocks_interpret_bit_exact_with_onnxruntime(seed: int) -> None:
    rng = np.random.default_rng(seed)
    model = activation_and_weight_model(rng)
    feeds = {"x": (rng.standard_normal((2, 10)) * 3).astype(np.float32)}
    expected = onnxruntime_outputs(with_intermediates(model, ["xq", "wf"]), feeds)
    module = import_onnx(with_intermediates(model, ["xq", "wf"]))
    text = print_module(module)
    assert "tensor<2x12x!quant.uniform<i8:f32:{0:1, 1:4}" in text  # the padded type, whole blocks
    verify(module)
    parsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    verify(parsed)  # MLIR's rule: every block whole (an unpadded ragged type fails here)
    assert print_module(parsed) == text
    got = interpret(module, feeds)
    for name in ("xq", "wf", "y"):
        assert got[name].shape == expected[name].shape, name
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_ragged_int4_weight_with_negative_scales_is_bit_exact() -> None:
    rng = np.random.default_rng(3)
    model = int4_weight_model(rng)
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32)}
    expected = onnxruntime_outputs(with_intermediates(model, ["wf"]), feeds)
    got = interpret(import_onnx(with_intermediates(model, ["wf"])), feeds)
    np.testing.assert_array_equal(got["wf"], expected["wf"])
    np.testing.assert_array_equal(got["y"], expected["y"])


@pytest.mark.parametrize("which", ["activation_and_weight", "int4_weight"])
def test_ragged_blocks_check_passes_on_xla(which: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """qconvert check --backend stablehlo (XLA): every node and the output against onnxruntime."""
    require_module("jaxlib")
    rng = np.random.default_rng(4)
    model = activation_and_weight_model(rng) if which == "activation_and_weight" else int4_weight_model(rng)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    code = main(["check", str(path), "--backend", "stablehlo", "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "0 failed, 0 not run" in out.out
    assert main(["convert", str(path), "--to", "stablehlo", "-o", str(tmp_path / "m.mlir")]) == 0
    assert "stablehlo.pad" in (tmp_path / "m.mlir").read_text() or which == "int4_weight"


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf"), -0.5])
def test_ragged_blocks_bad_scales_stay_refused(bad: float) -> None:
    """Scales of 0, NaN, Inf or below 0 on an activation's blocks: refused as before (onnxruntime
    computes garbage with them); a weight's negative or zero scales are the n-bit quantizer's signs."""
    rng = np.random.default_rng(5)
    model = activation_and_weight_model(rng)
    scale = next(t for t in model.graph.initializer if t.name == "xs")
    values = numpy_helper.to_array(scale).copy()
    values[1, 2] = bad
    scale.CopyFrom(numpy_helper.from_array(values, "xs"))
    with pytest.raises(InputError, match="scale must be finite and > 0"):
        import_onnx(model)
