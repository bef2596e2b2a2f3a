"""`calibrate(..., bias_correction="on")`: each bias gains E[x]·(W - W_q), computed here independently.

E[x] is the layer input's per-channel mean on the first 32 calibration samples (numpy on the data, or on
the float layers before it), W_q the written model's weight as its DequantizeLinear gives it (numpy
(q - zp) · scale from the written initializers); the written bias (a float Add constant, or an int32 Gemm
/ Conv bias) must hold b + E[x]·(W - W_q). Off leaves the written model byte-identical to the default, and
on changes nothing but the biases; the corrected model passes `qconvert check` (interpreter)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.calibrate.api import calibrate
from qconvert.cli import main
from qconvert.errors import InputError

ALPHA, BETA = 0.5, 2.0  # Gemm's: C must change by alpha / beta per unit of A·ΔB


def _mlp(path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """x[N, 16] -> MatMul(W1[16, 24]) -> Add(b1) -> Relu -> Gemm(B[10, 24], transB, C[10], alpha, beta)."""
    rng = np.random.default_rng(3)
    weights = {
        "W1": rng.normal(0, 0.3, (16, 24)).astype(np.float32),
        "b1": rng.normal(0, 0.1, (24,)).astype(np.float32),
        "B": rng.normal(0, 0.3, (10, 24)).astype(np.float32),
        "C": rng.normal(0, 0.1, (10,)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "b1"], ["pre"], name="add"),
        helper.make_node("Relu", ["pre"], ["h"], name="relu"),
        helper.make_node("Gemm", ["h", "B", "C"], ["y"], name="gemm", alpha=ALPHA, beta=BETA, transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    return path, weights


def _conv(path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """x[N, 4, 6, 6] -> Conv(W[6, 2, 3, 3], B[6], group 2) -> y."""
    rng = np.random.default_rng(4)
    weights = {
        "W": rng.normal(0, 0.3, (6, 2, 3, 3)).astype(np.float32),
        "B": rng.normal(0, 0.1, 6).astype(np.float32),
    }
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W", "B"], ["y"], name="conv", group=2)],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6, 4, 4])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    return path, weights


def _written(path: Path) -> tuple[dict[str, np.ndarray], dict[str, onnx.NodeProto]]:
    model = onnx.load(path)
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    dequantizers = {node.output[0]: node for node in model.graph.node if node.op_type == "DequantizeLinear"}
    return constants, dequantizers


def _dequantized(path: Path, quantized: str) -> np.ndarray:
    """The DequantizeLinear reading initializer `quantized`, evaluated in numpy: (q - zp) · scale."""
    constants, dequantizers = _written(path)
    node = next(node for node in dequantizers.values() if node.input[0] == quantized)
    stored = constants[quantized].astype(np.int64)
    scale, zero_point = constants[node.input[1]], constants[node.input[2]].astype(np.int64)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    shape = [1] * stored.ndim
    if scale.size > 1:
        shape[axis] = -1
    return ((stored - zero_point.reshape(shape)) * scale.reshape(shape).astype(np.float64)).astype(np.float32)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray], Path]:
    require_module("onnxruntime")
    folder = tmp_path_factory.mktemp("bias")
    model, weights = _mlp(folder / "mlp.onnx")
    rng = np.random.default_rng(5)  # inputs far from zero mean: E[x]·ΔW is not small
    np.savez(folder / "data.npz", x=rng.normal(1.5, 1.0, (64, 16)).astype(np.float32))
    return model, weights, folder / "data.npz"


def test_matmul_add_and_gemm_biases_hold_the_mean_shift(
    mlp: tuple[Path, dict[str, np.ndarray], Path],
) -> None:
    model, weights, data = mlp
    out = model.with_name("mlp.bc.onnx")
    scheme = {"per_channel": False, "op_types_to_quantize": ["MatMul", "Gemm", "Relu"]}  # Add stays float
    result = calibrate(model, data, scheme=scheme, out=out, bias_correction="on")
    x = np.load(data)["x"][:32].astype(np.float64)  # the first 32 samples (4 batches of 8)
    w1_q = _dequantized(out, "W1_quantized")
    expected_b1 = weights["b1"] + x.mean(axis=0) @ (weights["W1"].astype(np.float64) - w1_q)
    constants, _ = _written(out)
    np.testing.assert_allclose(constants["b1"], expected_b1, rtol=1e-5, atol=1e-7)
    assert np.abs(constants["b1"] - weights["b1"]).max() > 1e-3  # the correction is not negligible
    h = np.maximum(x @ weights["W1"] + weights["b1"], 0.0)  # the float model's Gemm input
    b_q = _dequantized(out, "B_quantized")
    expected_c = weights["C"] + ALPHA / BETA * (h.mean(axis=0) @ (weights["B"].astype(np.float64) - b_q).T)
    c_written = _dequantized(out, "C_quantized").astype(np.float64)  # int32, scale s_h·s_B, beta·C stored
    step = float(constants[next(n for n in constants if n.startswith("C_") and "scale" in n)])
    np.testing.assert_allclose(c_written, BETA * expected_c, atol=step * 0.51 + 1e-6)
    assert np.abs(c_written - BETA * weights["C"]).max() > 4 * step
    assert set(result.bias_correction) == {"b1", "C"}
    assert result.bias_correction["C"]["node"] == "gemm" and result.bias_correction["b1"]["node"] == "mm"
    assert sum("corrected by E[x]" in note for note in result.notes) == 2


def test_conv_bias_per_group(tmp_path: Path) -> None:
    require_module("onnxruntime")
    model, weights = _conv(tmp_path / "conv.onnx")
    rng = np.random.default_rng(6)
    data = tmp_path / "conv.npz"
    x = (
        rng.normal(0, 1, (64, 4, 6, 6)).astype(np.float32)
        + np.array([1, -2, 3, 0.5], np.float32)[:, None, None]
    )
    np.savez(data, x=x)
    out = tmp_path / "conv.bc.onnx"
    result = calibrate(model, data, scheme={"per_channel": False}, out=out, bias_correction="on")
    means = x[:32].astype(np.float64).mean(axis=(0, 2, 3))
    delta = weights["W"].astype(np.float64) - _dequantized(out, "W_quantized")
    expected = weights["B"].astype(np.float64).copy()
    for m in range(6):  # output channels 0-2 read input channels 0-1, 3-5 read 2-3
        group = m // 3
        expected[m] += sum(means[group * 2 + c] * delta[m, c].sum() for c in range(2))
    constants, _ = _written(out)
    step = float(np.max(constants[next(n for n in constants if n.startswith("B_") and "scale" in n)]))
    np.testing.assert_allclose(_dequantized(out, "B_quantized"), expected, atol=step * 0.51 + 1e-6)
    assert np.abs(_dequantized(out, "B_quantized") - weights["B"]).max() > 4 * step
    assert list(result.bias_correction) == ["B"]


def test_off_is_the_default_and_on_changes_only_biases(
    mlp: tuple[Path, dict[str, np.ndarray], Path], tmp_path: Path
) -> None:
    model, _, data = mlp
    default, off, on = tmp_path / "default.onnx", tmp_path / "off.onnx", tmp_path / "on.onnx"
    calibrate(model, data, out=default)
    result = calibrate(model, data, out=off, bias_correction="off")
    assert default.read_bytes() == off.read_bytes()
    assert result.bias_correction == {} and "bias_correction" not in result.to_json()
    calibrate(model, data, out=on, bias_correction=True)
    before, _ = _written(off)
    after, _ = _written(on)
    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    assert changed and changed <= {"b1_quantized", "C_quantized", "b1_scale", "b1_zero_point"}
    assert "C_quantized" in changed


def test_corrected_model_checks_on_the_interpreter(
    mlp: tuple[Path, dict[str, np.ndarray], Path], tmp_path: Path
) -> None:
    import qconvert

    model, _, data = mlp
    out, report = tmp_path / "checked.onnx", tmp_path / "r.json"
    command = ["calibrate", str(model), "--data", str(data), "-o", str(out), "--quiet", "--json", str(report)]
    assert main([*command, "--bias-correction", "on"]) == 0
    assert set(json.loads(report.read_text())["bias_correction"]) == {"b1", "C"}
    checked = qconvert.check(str(out), str(data), max_samples=16)
    assert checked.verdict == "PASSED", checked.verdict


def test_bad_policy_and_search_are_refused(mlp: tuple[Path, dict[str, np.ndarray], Path]) -> None:
    model, _, data = mlp
    with pytest.raises(InputError, match="--bias-correction maybe: expected one of on, off"):
        calibrate(model, data, bias_correction="maybe")
    with pytest.raises(InputError, match="not combined with --target-cosine"):
        calibrate(model, data, bias_correction="on", target_cosine=0.99)


def test_reused_ranges_correct_the_same_and_need_data(
    mlp: tuple[Path, dict[str, np.ndarray], Path], tmp_path: Path
) -> None:
    """--load-ranges with --data: the means come from the data, the model is the one calibrating wrote."""
    model, _, data = mlp
    first, second, ranges = tmp_path / "first.onnx", tmp_path / "second.onnx", tmp_path / "ranges.json"
    calibrate(model, data, out=first, ranges_path=ranges, bias_correction="on")
    result = calibrate(model, data, load_ranges=ranges, out=second, bias_correction="on")
    assert first.read_bytes() == second.read_bytes() and set(result.bias_correction) == {"b1", "C"}
    with pytest.raises(InputError, match="--bias-correction on needs --data"):
        calibrate(model, None, load_ranges=ranges, out=tmp_path / "third.onnx", bias_correction="on")
