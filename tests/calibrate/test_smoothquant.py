"""SmoothQuant on the float model: same outputs up to rounding, flatter activations, folding where exact."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.calibrate.smoothquant import (
    ChannelAbsMaxObserver,
    observe_channel_maxima,
    search_alphas,
    smooth_quant,
    smoothable_inputs,
)
from qconvert.errors import InputError

WIDTH, HIDDEN = 16, 24


def build_model() -> onnx.ModelProto:
    """x -> LayerNorm -> MatMul (sole consumer: folds); Relu -> MatMul and Gemm(transB) (+ an Add reading the
    Relu: a Mul is inserted); channel 3 of x carries a massive activation."""
    rng = np.random.default_rng(0)

    def constant(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    initializers = [
        constant("gamma", WIDTH, scale=1.0),
        constant("beta", WIDTH),
        constant("w1", WIDTH, HIDDEN),
        constant("w2", HIDDEN, WIDTH),
        constant("w3", WIDTH, HIDDEN),  # Gemm transB: [N, K]
        constant("b3", WIDTH),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["normed"], axis=-1, name="ln"),
        helper.make_node("MatMul", ["normed", "w1"], ["hidden"], name="mm1"),
        helper.make_node("Relu", ["hidden"], ["relu"], name="relu"),
        helper.make_node("MatMul", ["relu", "w2"], ["y"], name="mm2"),
        helper.make_node("Gemm", ["relu", "w3", "b3"], ["z"], transB=1, name="gemm"),
        helper.make_node("ReduceSum", ["relu"], ["side"], keepdims=0, name="side"),
    ]
    graph = helper.make_graph(
        nodes,
        "smooth",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, WIDTH])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, WIDTH]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, WIDTH]),
            helper.make_tensor_value_info("side", TensorProto.FLOAT, []),
        ],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def batches(count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        x = rng.standard_normal((8, WIDTH)).astype(np.float32)
        x[:, 3] *= 40.0
        out.append({"x": x})
    return out


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(names, feeds)


@pytest.fixture(scope="module")
def smoothed() -> tuple[onnx.ModelProto, onnx.ModelProto, dict[str, ChannelAbsMaxObserver], list]:
    require_module("onnxruntime")
    model = build_model()
    maxima = observe_channel_maxima(model, batches(4), smoothable_inputs(model))
    result, done = smooth_quant(model, maxima, alpha=0.5)
    onnx.checker.check_model(result, full_check=True)
    return model, result, maxima, done


def test_float_outputs_unchanged_up_to_rounding(smoothed) -> None:
    model, result, _, _ = smoothed
    for feeds in batches(2, seed=7):  # held-out rows
        for ours, theirs in zip(
            run(result, feeds, ["y", "z", "side"]), run(model, feeds, ["y", "z", "side"])
        ):
            np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-5 * float(np.abs(theirs).max()))


def test_layernorm_absorbs_the_scale_and_a_mul_serves_a_shared_input(smoothed) -> None:
    model, result, _, done = smoothed
    by_tensor = {d.tensor: d for d in done}
    assert by_tensor["normed"].folded_into == "ln"
    assert by_tensor["relu"].folded_into == "Mul" and set(by_tensor["relu"].consumers) == {"mm2", "gemm"}
    assert [n.op_type for n in result.graph.node].count("Mul") == 1
    gamma = numpy_helper.to_array(next(t for t in result.graph.initializer if t.name == "gamma"))
    original = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "gamma"))
    assert not np.allclose(gamma, original)


def test_smoothing_flattens_the_outlier_channel(smoothed) -> None:
    """The MatMul input after smoothing: its largest channel max over its median shrinks (alpha 0.5)."""
    model, result, _, _ = smoothed
    feeds = batches(1, seed=9)[0]
    before_maxima = observe_channel_maxima(model, [feeds], ["normed"])["normed"].maxima
    after_maxima = observe_channel_maxima(result, [feeds], ["normed"])["normed"].maxima
    assert before_maxima is not None and after_maxima is not None

    def spread(m: np.ndarray) -> float:
        return float(m.max() / np.median(m))

    assert spread(after_maxima) < spread(before_maxima)


def test_channel_maxima_merge_equals_observing_the_union() -> None:
    parts = [b["x"] for b in batches(5)]
    whole = ChannelAbsMaxObserver()
    for part in parts:
        whole.observe(part)
    left, right = ChannelAbsMaxObserver(), ChannelAbsMaxObserver()
    for part in parts[:2]:
        left.observe(part)
    for part in parts[2:]:
        right.observe(part)
    right.merge(left)
    assert whole.maxima is not None and right.maxima is not None
    np.testing.assert_array_equal(right.maxima, whole.maxima)
    np.testing.assert_array_equal(whole.maxima, np.abs(np.concatenate(parts)).max(axis=0))


def test_alpha_outside_zero_one_is_an_input_error() -> None:
    with pytest.raises(InputError, match="alpha"):
        smooth_quant(build_model(), {}, alpha=1.5)


def test_calibrate_smooth_quant_writes_the_smoothed_qdq_model(tmp_path) -> None:
    """`calibrate(..., smooth_quant=0.5)` quantizing MatMul/Gemm: the QDQ model carries the inserted Mul and
    folded LayerNorm, and tracks the float model on held-out rows; with the default op set the Relu's output
    is quantized before any Mul could divide it, so that input is left alone (and the summary says so)."""
    require_module("onnxruntime")
    from qconvert.calibrate.api import calibrate

    model_path, data_path, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "q.onnx"
    onnx.save(build_model(), model_path)
    np.savez(data_path, x=np.concatenate([b["x"] for b in batches(4)]))
    scheme = {"op_types_to_quantize": ["MatMul", "Gemm"]}
    calibrate(str(model_path), str(data_path), out=str(out), smooth_quant=0.5, batch_size=8, scheme=scheme)
    quantized = onnx.load(out)
    assert any(node.name == "relu_smooth_mul" for node in quantized.graph.node)
    assert any(node.op_type == "QuantizeLinear" for node in quantized.graph.node)
    feeds = batches(1, seed=11)[0]
    (ours,), (theirs,) = run(quantized, feeds, ["y"]), run(build_model(), feeds, ["y"])
    cosine = (ours * theirs).sum() / np.linalg.norm(ours) / np.linalg.norm(theirs)
    assert cosine > 0.99
    default = calibrate(str(model_path), str(data_path), out=str(tmp_path / "d.onnx"), smooth_quant=0.5)
    assert not any(node.name == "relu_smooth_mul" for node in onnx.load(tmp_path / "d.onnx").graph.node)
    assert any("'relu' not smoothed: nothing absorbs 1/s, and its producer" in n for n in default.notes)
    with pytest.raises(InputError, match="--smooth-quant needs --data"):
        calibrate(str(model_path), None, out=str(tmp_path / "r.onnx"), smooth_quant=0.5)


def test_cli_smooth_quant_flag_and_a_bad_alpha(tmp_path, capsys) -> None:
    """`calibrate --smooth-quant 0.5` writes the smoothed QDQ model; alpha 2 exits 2, nothing written."""
    require_module("onnxruntime")
    from qconvert.cli import main

    model_path, data_path = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(build_model(), model_path)
    np.savez(data_path, x=np.concatenate([b["x"] for b in batches(2)]))
    out, bad = tmp_path / "q.onnx", tmp_path / "bad.onnx"
    assert (
        main(
            [
                "calibrate",
                *(str(model_path), "--data", str(data_path), "-o", str(out), "--smooth-quant", "0.5"),
                *("--op-types", "MatMul,Gemm"),
            ]
        )
        == 0
    )
    assert any(node.name == "relu_smooth_mul" for node in onnx.load(out).graph.node)
    assert (
        main(["calibrate", str(model_path), "--data", str(data_path), "-o", str(bad), "--smooth-quant", "2"])
        == 2
    )
    assert "alpha must lie in [0, 1]" in capsys.readouterr().err and not bad.exists()


def test_alpha_search_picks_the_least_product_error_per_input() -> None:
    """`search_alphas`: per input, the grid's alpha (or none) whose Q/DQ product error on the sample is least;
    the searched model still computes the same in float."""
    require_module("onnxruntime")
    from qconvert.calibrate.smoothquant import ALPHA_GRID, _product_error, _scales, _weight_rows

    model = build_model()
    samples: dict[str, np.ndarray] = {}
    maxima = observe_channel_maxima(model, batches(4), smoothable_inputs(model), samples)
    assert set(samples) == {"normed", "relu"} and samples["normed"].shape == (32, WIDTH)
    chosen = search_alphas(model, maxima, samples, per_channel=True)
    weights = {t.name: t for t in model.graph.initializer}
    for tensor, nodes in smoothable_inputs(model).items():
        weight = np.concatenate([_weight_rows(weights[n.input[1]], n) for n in nodes], axis=1)
        maximum = maxima[tensor].maxima
        assert maximum is not None
        errors = {None: _product_error(samples[tensor], weight, np.ones(weight.shape[0], np.float32), True)}
        for alpha in ALPHA_GRID:
            errors[alpha] = _product_error(
                samples[tensor], weight, _scales(maximum, np.abs(weight).max(1), alpha), True
            )
        assert errors[chosen[tensor]] == min(errors.values())
    # the massive channel 3 makes smoothing the LayerNorm's output worth it
    assert chosen["normed"] is not None
    result, _ = smooth_quant(model, maxima, chosen)
    feeds = batches(1, seed=13)[0]
    np.testing.assert_allclose(
        run(result, feeds, ["y"])[0], run(model, feeds, ["y"])[0], rtol=1e-4, atol=1e-4
    )
