"""SmoothQuant's 1/s folded into the producer: through BERT's attention (value projection -> Add -> Reshape ->
Transpose -> Softmax·V -> Transpose -> Reshape -> output dense), a Gemm through Relu; left alone after a
Reshape of a producer that cannot take it (onnxruntime 1.32 would refuse the Mul there at opset 21)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.calibrate.smoothquant import (
    NOT_SMOOTHED,
    observe_channel_maxima,
    smooth_quant,
    smoothable_inputs,
    smoothing_notes,
)

BATCH, SEQ, HEADS, HEAD, ROWS = 2, 5, 2, 4, 6
WIDTH = HEADS * HEAD
OUTPUTS = ["y", "z", "u"]


def _split(tensor: str, prefix: str, last_perm: list[int]) -> list[onnx.NodeProto]:
    """tensor [B, S, W] -> Transpose(Reshape(tensor, Concat(B, S, -1, HEAD))) as BERT exports it: the shape
    built from Shape/Gather of the input (not constant), the head count inferred (-1)."""
    return [
        helper.make_node(
            "Concat", ["batch_dim", "seq_dim", "minus_one", "head"], [f"{prefix}_shape"], axis=0
        ),
        helper.make_node("Reshape", [tensor, f"{prefix}_shape"], [f"{prefix}_4d"]),
        helper.make_node("Transpose", [f"{prefix}_4d"], [f"{prefix}_heads"], perm=last_perm),
    ]


def build_model() -> onnx.ModelProto:
    """x [B, S, W]: attention (q, k, v projections with biases, Softmax·V, output dense y); x2 [ROWS, W]:
    Gemm(transB, bias) -> Relu -> MatMul (z); x2 -> Sigmoid -> Reshape -> MatMul (u: no producer can take
    1/s). Value column 5 and Gemm row 3 are large, so the MatMuls' inputs carry outlier channels."""
    rng = np.random.default_rng(0)

    def constant(name: str, *shape: int, scale: float = 0.4) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    value = constant("wv", WIDTH, WIDTH)
    value_array = numpy_helper.to_array(value).copy()
    value_array[:, 5] *= 30.0
    gemm = numpy_helper.to_array(constant("wg", 2 * WIDTH, WIDTH)).copy()
    gemm[3] *= 25.0
    initializers = [
        constant("wq", WIDTH, WIDTH),
        constant("bq", WIDTH),
        constant("wk", WIDTH, WIDTH),
        constant("bk", WIDTH),
        numpy_helper.from_array(value_array, "wv"),
        constant("bv", WIDTH),
        constant("wo", WIDTH, WIDTH),
        numpy_helper.from_array(gemm, "wg"),
        constant("bg", 2 * WIDTH),
        constant("w2", 2 * WIDTH, WIDTH),
        constant("wu", 2 * WIDTH, 3),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        numpy_helper.from_array(np.array([HEAD], np.int64), "head"),
        numpy_helper.from_array(np.array([-1, 2 * WIDTH], np.int64), "rows_shape"),
        numpy_helper.from_array(np.float32(1.0 / np.sqrt(HEAD)), "temperature"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "zero"], ["batch_dim"], axis=0),
        helper.make_node("Gather", ["x_shape", "one"], ["seq_dim"], axis=0),
    ]
    for name in "qkv":
        nodes += [
            helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}_mm"], name=f"{name}_proj"),
            helper.make_node("Add", [f"b{name}", f"{name}_mm"], [f"{name}_add"], name=f"{name}_bias"),
        ]
        nodes += _split(f"{name}_add", name, [0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])
    # a Shape of the value path, as T5's export builds its reshapes: it reads no values, the fold stays exact
    nodes.append(helper.make_node("Shape", ["v_add"], ["v_extents"]))
    nodes += [
        helper.make_node("MatMul", ["q_heads", "k_heads"], ["scores"]),
        helper.make_node("Mul", ["scores", "temperature"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v_heads"], ["context_heads"], name="probs_v"),
        helper.make_node("Transpose", ["context_heads"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["batch_dim", "seq_dim", "minus_one"], ["merged_shape"], axis=0),
        helper.make_node("Reshape", ["context_t", "merged_shape"], ["context"]),
        helper.make_node("MatMul", ["context", "wo"], ["y"], name="dense"),
        helper.make_node("Gemm", ["x2", "wg", "bg"], ["gemm_out"], transB=1, name="gemm"),
        helper.make_node("Relu", ["gemm_out"], ["relu"], name="relu"),
        helper.make_node("MatMul", ["relu", "w2"], ["z"], name="after_relu"),
        helper.make_node("Sigmoid", ["x2"], ["gate"]),
        helper.make_node("Concat", ["x2", "gate"], ["joined"], axis=1),
        helper.make_node("Reshape", ["joined", "rows_shape"], ["rows"]),
        helper.make_node("MatMul", ["rows", "wu"], ["u"], name="after_reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SEQ, WIDTH]),
            helper.make_tensor_value_info("x2", TensorProto.FLOAT, [ROWS, WIDTH]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", SEQ, WIDTH]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [ROWS, WIDTH]),
            helper.make_tensor_value_info("u", TensorProto.FLOAT, [ROWS, 3]),
        ],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def batches(count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.standard_normal((BATCH, SEQ, WIDTH)).astype(np.float32),
            "x2": rng.standard_normal((ROWS, WIDTH)).astype(np.float32),
        }
        for _ in range(count)
    ]


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], level: str = "ORT_DISABLE_ALL") -> list:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(OUTPUTS, feeds)


@pytest.fixture(scope="module")
def folded() -> tuple[onnx.ModelProto, onnx.ModelProto, dict]:
    require_module("onnxruntime")
    model = build_model()
    maxima = observe_channel_maxima(model, batches(3), smoothable_inputs(model))
    result, done = smooth_quant(model, maxima, alpha=0.5)
    onnx.checker.check_model(result)
    return model, result, {entry.tensor: entry for entry in done}


def test_each_input_is_folded_where_exact_and_reported(folded) -> None:
    _, result, done = folded
    assert done["context"].folded_into == "v_proj"
    assert done["context"].through == ("Add", "Reshape", "Transpose", "MatMul", "Transpose", "Reshape")
    assert done["relu"].folded_into == "gemm" and done["relu"].through == ("Relu",)
    assert done["x"].folded_into == "Mul"  # a graph input: nothing produces it
    assert done["rows"].folded_into == NOT_SMOOTHED
    assert [n.op_type for n in result.graph.node].count("Mul") == 3  # the model's own, x's and x2's
    notes = smoothing_notes(done.values())
    assert any("'context'" in n and "folded into 'v_proj' through Add -> Reshape" in n for n in notes)
    assert any("'rows' not smoothed" in n for n in notes)


def test_float_outputs_unchanged_and_the_scales_land_where_the_mapping_says(folded) -> None:
    """Same outputs on held-out rows (and another batch size: the Reshapes' -1 re-inferred); the value
    projection's column 5 (the outlier) shrank by the same factor as its bias, and the output dense's row 5
    grew by its inverse: the channel mapping through Reshape/Transpose/Softmax·V is the identity here."""
    model, result, _ = folded
    rng = np.random.default_rng(7)
    for batch in (BATCH, 3):
        feeds = {
            "x": rng.standard_normal((batch, SEQ, WIDTH)).astype(np.float32) * 2,
            "x2": rng.standard_normal((ROWS, WIDTH)).astype(np.float32),
        }
        for ours, theirs in zip(run(result, feeds), run(model, feeds), strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5 * float(np.abs(theirs).max()))
    before = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in result.graph.initializer}
    column = after["wv"] / before["wv"]  # rows of wv were scaled by x's s too: divide that out per row
    column = column / column[:, :1]
    inverse = after["bv"] / before["bv"]
    np.testing.assert_allclose(column[0], inverse / inverse[0], rtol=1e-4)
    np.testing.assert_allclose(after["wo"] / before["wo"], np.outer(1 / inverse, np.ones(WIDTH)), rtol=1e-4)
    assert inverse[5] == inverse.min()  # the outlier channel is divided the most


def test_a_transpose_moving_the_channel_to_the_rows_does_not_fold() -> None:
    """x·W -> Transpose -> MatMul: the producer's columns become the next MatMul's rows of input (its
    contracted axis is the old row axis): no fold, and the input after a Transpose is left unsmoothed."""
    require_module("onnxruntime")
    rng = np.random.default_rng(3)
    weights = [
        numpy_helper.from_array(rng.standard_normal((6, 6)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
        helper.make_node("Transpose", ["h"], ["ht"], perm=[1, 0]),
        helper.make_node("MatMul", ["ht", "w2"], ["y"], name="second"),
    ]
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = [{"x": rng.standard_normal((6, 6)).astype(np.float32)}]
    _, done = smooth_quant(model, observe_channel_maxima(model, data, smoothable_inputs(model)), 0.5)
    assert {d.tensor: d.folded_into for d in done}["ht"] == NOT_SMOOTHED


def test_calibrated_smoothed_model_with_int16_loads_at_every_onnxruntime_level(tmp_path) -> None:
    """Regression (onnxruntime 1.32): a smoothed model calibrated with an int16 tensor (opset 21) loads
    at ORT_ENABLE_EXTENDED and ORT_ENABLE_ALL (a Mul after the context's Reshape made its Q/DQ propagation
    build a QuantizeLinear of mismatched types) and tracks the float model."""
    require_module("onnxruntime")
    from qconvert.calibrate.api import calibrate

    model_path, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(build_model(), model_path)
    data = batches(4)
    result = calibrate(
        str(model_path),
        data,
        out=str(out),
        json_path=str(tmp_path / "result.json"),
        smooth_quant=0.5,
        batch_size="given",
        scheme={
            "op_types_to_quantize": ["MatMul"],
            "per_channel": True,
            "tensor_overrides": {"probs": [{"quant_type": "QInt16", "symmetric": True}]},
        },
    )
    quantized = onnx.load(out)
    assert next(o.version for o in quantized.opset_import if o.domain in ("", "ai.onnx")) >= 21
    feeds = batches(1, seed=11)[0]
    expected = run(build_model(), feeds)
    for level in ("ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"):
        for ours, theirs in zip(run(quantized, feeds, level), expected, strict=True):
            cosine = (ours * theirs).sum() / np.linalg.norm(ours) / np.linalg.norm(theirs)
            assert cosine > 0.99
    assert any("'context' divided by s, 1/s folded into 'v_proj'" in note for note in result.notes)
    written = json.loads((tmp_path / "result.json").read_text())
    assert [n for n in written["notes"] if n.startswith("SmoothQuant: ")] == smoothing_notes_of(result.notes)


def smoothing_notes_of(notes: list[str]) -> list[str]:
    return [note for note in notes if note.startswith("SmoothQuant: ")]


def test_a_model_without_matmuls_is_calibrated_unsmoothed(tmp_path) -> None:
    """No MatMul/Gemm with a constant weight (a Conv model): nothing observed or smoothed, a note says so
    (onnxruntime's run([]) returns every output, which the observer read as its tensors)."""
    require_module("onnxruntime")
    from qconvert.calibrate.api import calibrate

    rng = np.random.default_rng(5)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [weight],
    )
    model_path, out = tmp_path / "conv.onnx", tmp_path / "conv.qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model_path)
    data = [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(2)]
    result = calibrate(str(model_path), data, out=str(out), smooth_quant="auto", batch_size="given")
    assert any(node.op_type == "QuantizeLinear" for node in onnx.load(out).graph.node)
    assert "SmoothQuant: nothing smoothed" in result.notes[0]


def test_an_override_of_a_smoothed_input_goes_to_what_its_matmuls_read(tmp_path) -> None:
    """`--overrides` naming x (read by the q/k/v MatMuls, now through the inserted Mul): the int16 override
    moves to x / s, which those MatMuls read (x itself is no longer quantized: it would be refused as 'not
    a calibrated tensor')."""
    require_module("onnxruntime")
    from qconvert.calibrate.api import calibrate

    model_path, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(build_model(), model_path)
    overrides = {"x": [{"quant_type": "QInt16", "symmetric": True}]}
    scheme = {"op_types_to_quantize": ["MatMul", "Gemm"], "tensor_overrides": overrides}
    calibrate(str(model_path), batches(2), out=str(out), smooth_quant=0.5, batch_size="given", scheme=scheme)
    int16 = {t.name for t in onnx.load(out).graph.initializer if t.data_type == TensorProto.INT16}
    assert int16 == {"x_smoothed_zero_point"}
