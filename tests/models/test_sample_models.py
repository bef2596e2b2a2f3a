"""The committed sample models in models/: valid, runnable on their inputs.npz, quantized as documented.

Built by models/build_cnn.py and models/build_transformer.py (onnxruntime quantize_static, QDQ with
per-channel int8 weights, and QOperator). These tests read the committed files only; the rebuild test at the
end needs torch and scikit-learn and is skipped without them.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import require_module
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"

CNN, ENCODER = "digits_cnn", "tiny_encoder"
VARIANTS = ("", ".qdq", ".qop")
ALL_MODELS = [f"{stem}{v}.onnx" for stem in (CNN, ENCODER) for v in VARIANTS]

# Labels of the 8 images in digits_cnn.inputs.npz (the first 8 of the stratified 25% test split, seed 0).
CNN_SAMPLE_LABELS = [2, 0, 4, 9, 4, 1, 2, 4]


def load(name: str) -> onnx.ModelProto:
    return onnx.load(str(MODELS / name))


def inputs_for(name: str) -> dict[str, np.ndarray]:
    stem = name.split(".")[0]
    with np.load(MODELS / f"{stem}.inputs.npz") as data:
        return {k: data[k] for k in data.files}


def run(name: str) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(MODELS / name), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(out) for out in sess.run(None, inputs_for(name))]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def int_attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(onnx.helper.get_attribute_value(a))
    return default


def op_types(model: onnx.ModelProto) -> Counter[str]:
    return Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node
    )


# ----------------------------------------------------------------------------------------------------
# Every model: valid, small, opset 17, runs on its inputs.npz


@pytest.mark.parametrize("name", ALL_MODELS)
def test_model_is_valid_and_runs_on_its_inputs(name: str) -> None:
    model = load(name)
    onnx.checker.check_model(model, full_check=True)
    assert {o.domain: o.version for o in model.opset_import}.get("") == 17
    data = inputs_for(name)
    graph_inputs = {
        i.name: i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
    }
    assert set(data) == set(graph_inputs), "inputs.npz must hold exactly one array per graph input"
    for input_name, value in data.items():
        tt = graph_inputs[input_name].type.tensor_type
        assert value.dtype == onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        assert list(value.shape) == [d.dim_value for d in tt.shape.dim], "static input shapes"
    outputs = run(name)
    assert len(outputs) == len(model.graph.output)
    for out in outputs:
        assert out.size > 0 and np.isfinite(out).all()


def test_committed_models_are_small() -> None:
    total = sum(p.stat().st_size for p in MODELS.iterdir() if p.suffix in (".onnx", ".npz"))
    assert total < 3_000_000, f"models/ holds {total} bytes of models and inputs; keep it to a few MB"


# ----------------------------------------------------------------------------------------------------
# QDQ: Q/DQ pairs, int8 activations, per-channel int8 weights on every Conv / Gemm / MatMul


@pytest.mark.parametrize("stem", [CNN, ENCODER])
def test_qdq_model_has_per_channel_weights(stem: str) -> None:
    model = load(f"{stem}.qdq.onnx")
    ops = op_types(model)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    inits = initializers(model)
    dq_by_output = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}

    # Activations: QuantizeLinear to int8 (onnxruntime's default QInt8), zero point from calibration.
    q_nodes = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert all(inits[n.input[2]].dtype == np.int8 for n in q_nodes)

    weighted = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    assert weighted
    checked = 0
    for node in weighted:
        dq = dq_by_output.get(node.input[1])
        if dq is None or dq.input[0] not in inits:
            assert node.op_type == "MatMul", f"{node.name}: weight is not a quantized initializer"
            continue  # activation x activation MatMul (attention scores / context)
        weight, scale, zp = (inits[i] for i in dq.input[:3])
        axis = int_attr(dq, "axis", 1)
        assert weight.dtype == np.int8 and zp.dtype == np.int8
        assert scale.ndim == 1 and scale.size > 1, f"{node.name}: weight scale is not per-channel"
        expected_axis = {"Conv": 0, "Gemm": 0 if int_attr(node, "transB", 0) else 1, "MatMul": 1}[
            node.op_type
        ]
        assert axis == expected_axis and scale.size == weight.shape[axis]
        assert (zp == 0).all(), "int8 weights are symmetric by default"
        assert (scale > 0).all()
        checked += 1
    assert checked == {CNN: 3, ENCODER: 13}[stem]


# ----------------------------------------------------------------------------------------------------
# QOperator: QLinear* ops replace the float compute ops


def test_cnn_qop_model_uses_qlinear_ops() -> None:
    model = load(f"{CNN}.qop.onnx")
    ops = op_types(model)
    assert ops["QLinearConv"] == 2
    assert ops["com.microsoft.QGemm"] == 1
    assert ops["com.microsoft.QLinearGlobalAveragePool"] == 1
    assert ops["Conv"] == 0 and ops["Gemm"] == 0
    inits = initializers(model)
    for node in (n for n in model.graph.node if n.op_type == "QLinearConv"):
        w, w_scale = inits[node.input[3]], inits[node.input[4]]
        assert w.dtype == np.int8 and w_scale.size == w.shape[0] > 1, "per-channel QLinearConv weights"


def test_encoder_qop_model_uses_qlinear_ops() -> None:
    model = load(f"{ENCODER}.qop.onnx")
    ops = op_types(model)
    assert ops["QLinearMatMul"] == 17 and ops["MatMul"] == 0
    assert ops["com.microsoft.QLinearAdd"] > 0 and ops["Add"] == 0
    assert ops["com.microsoft.QLinearMul"] > 0
    inits = initializers(model)
    per_channel = [
        n
        for n in model.graph.node
        if n.op_type == "QLinearMatMul" and inits.get(n.input[4], np.zeros(1)).size > 1
    ]
    assert len(per_channel) == 13, "every weight MatMul has per-channel b_scale"


# ----------------------------------------------------------------------------------------------------
# Quantized outputs stay close to float


@pytest.mark.parametrize("variant", [".qdq", ".qop"])
def test_cnn_quantized_predictions_match_float(variant: str) -> None:
    (ref,) = run(f"{CNN}.onnx")
    (got,) = run(f"{CNN}{variant}.onnx")
    assert ref.argmax(1).tolist() == CNN_SAMPLE_LABELS, "the float model classifies the sample images"
    agree = int((got.argmax(1) == ref.argmax(1)).sum())
    assert agree >= 7, f"quantized argmax agrees with float on {agree}/8 images"
    assert cosine(got, ref) > 0.99


@pytest.mark.parametrize("variant", [".qdq", ".qop"])
def test_encoder_quantized_hidden_states_close_to_float(variant: str) -> None:
    ref_hidden, ref_logits = run(f"{ENCODER}.onnx")
    hidden, logits = run(f"{ENCODER}{variant}.onnx")
    assert hidden.shape == ref_hidden.shape == (2, 16, 64)
    assert cosine(hidden, ref_hidden) > 0.99  # measured 0.999 (README)
    assert (logits.argmax(-1) == ref_logits.argmax(-1)).mean() >= 0.9


# ----------------------------------------------------------------------------------------------------
# The build scripts regenerate the same kind of models (bit-identical on one machine; float training may
# round differently on another CPU, so only the structure is compared here).


@pytest.mark.slow
@pytest.mark.parametrize(("script", "stem"), [("build_cnn.py", CNN), ("build_transformer.py", ENCODER)])
def test_build_script_regenerates_models(script: str, stem: str, tmp_path: Path) -> None:
    require_module("torch")
    require_module("sklearn")
    result = subprocess.run(
        [sys.executable, str(MODELS / script), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for variant in VARIANTS:
        rebuilt = onnx.load(str(tmp_path / f"{stem}{variant}.onnx"))
        onnx.checker.check_model(rebuilt, full_check=True)
        assert op_types(rebuilt) == op_types(load(f"{stem}{variant}.onnx"))
    with np.load(tmp_path / f"{stem}.inputs.npz") as new, np.load(MODELS / f"{stem}.inputs.npz") as old:
        assert new.files == old.files
        for k in new.files:
            np.testing.assert_array_equal(new[k], old[k])
