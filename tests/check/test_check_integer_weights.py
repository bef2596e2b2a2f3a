"""`qconvert check --backend stablehlo` on dynamic quantization's integer ops: ConvInteger / MatMulInteger
weights are arguments of the modules XLA compiles (not inlined constants, which an 82M-parameter model took
minutes to print), their zero points stay constants, and the side-by-side cases split into modules of
bounded size still pass bit-exact against onnxruntime with nothing "not run"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.check import check

pytestmark = pytest.mark.engine


def _dynamic_conv_model(rng: np.random.Generator) -> onnx.ModelProto:
    """x -> DynamicQuantizeLinear -> ConvInteger (int8 weight, 32 -> 32 channels, k3) -> Cast -> Mul by the
    scales -> DynamicQuantizeLinear -> MatMulInteger (int8 [20, 16]) -> Cast -> Mul: quantize_dynamic's
    pattern."""
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dq0"),
        helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["c"], name="conv", pads=[1, 1]),
        helper.make_node("Cast", ["c"], ["cf"], name="cast0", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["s0"], name="scale0"),
        helper.make_node("Mul", ["cf", "s0"], ["y0"], name="mul0"),
        helper.make_node("DynamicQuantizeLinear", ["y0"], ["yq", "ys", "yz"], name="dq1"),
        helper.make_node("MatMulInteger", ["yq", "m", "yz", "mz"], ["p"], name="matmul"),
        helper.make_node("Cast", ["p"], ["pf"], name="cast1", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["ys", "ms"], ["s1"], name="scale1"),
        helper.make_node("Mul", ["pf", "s1"], ["out"], name="mul1"),
    ]
    initializers = [
        numpy_helper.from_array(rng.integers(-127, 128, (32, 32, 3)).astype(np.int8), "w"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
        numpy_helper.from_array(rng.integers(-127, 128, (20, 16)).astype(np.int8), "m"),
        numpy_helper.from_array(np.array(3, np.int8), "mz"),
        numpy_helper.from_array(np.array(0.02, np.float32), "ms"),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 20])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 32, 16])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_integer_weights_become_arguments_and_zero_points_stay_constants() -> None:
    from qconvert.check.nodes import integer_weights_as_inputs

    model = _dynamic_conv_model(np.random.default_rng(0))
    weights = integer_weights_as_inputs(model)
    assert sorted(weights) == ["m", "w"]
    assert weights["w"].dtype == np.int8 and weights["w"].shape == (32, 32, 3)
    assert {i.name for i in model.graph.input} == {"x", "m", "w"}
    assert {t.name for t in model.graph.initializer} == {"wz", "ws", "mz", "ms"}


def test_check_passes_on_xla_with_weights_as_arguments_in_small_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One case per module (a batch budget of one byte) and whole-model weights as arguments: PASSED."""
    require_module("jax")
    from qconvert.backends.stablehlo import check as stablehlo  # the runner's batching, patched below

    monkeypatch.setattr(stablehlo, "BATCH_BYTES", 1)
    splits: list[int] = []
    batches = stablehlo.case_batches
    monkeypatch.setattr(
        stablehlo,
        "case_batches",
        lambda cases, limit: splits.append(len(batches(cases, limit))) or batches(cases, limit),
    )
    rng = np.random.default_rng(1)
    path = tmp_path / "dynamic.onnx"
    onnx.save(_dynamic_conv_model(rng), path)
    data = tmp_path / "inputs.npz"
    np.savez(data, x=rng.normal(size=(1, 32, 20)).astype(np.float32))
    report = check(str(path), str(data), backend="stablehlo", engine="xla")
    assert report.verdict == "PASSED", [(g.what, g.example_reason) for g in report.not_run_groups()]
    assert all(output.ours is not None for output in report.outputs.values())
    assert splits and max(splits) > 1, "the cases were not split into several modules"
