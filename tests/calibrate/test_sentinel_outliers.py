"""The sentinel guard tells masks (constants) from outliers (the model's own massive activations).

Sentinels are one or a few exact values (-10000, float-min, -Inf), or a round constant added to the bulk
(scores + -10000 mask). Outliers vary: all-MiniLM's FFN output has channel 99 at [CLS] around 192 on every
row, 16+ different values, the rest within ±8. Those must be quantized and reported as outliers, never kept
float as a "padding mask?".
"""

from __future__ import annotations

import numpy as np
import pytest

from qconvert.calibrate.observers import AlignedHistogramObserver
from qconvert.calibrate.sentinel import (
    MagnitudeObserver,
    find_outliers,
    find_sentinels,
    sentinel_guard,
)

FLOAT_MIN = float(np.finfo(np.float32).min)


def massive_activation(rows: int = 32, seed: int = 0) -> np.ndarray:
    """[rows, 16, 64] hidden states within about ±5, channel 13 at position 0 between 185 and 200."""
    rng = np.random.default_rng(seed)
    hidden = (rng.standard_normal((rows, 16, 64)) * 1.2).astype(np.float32)
    hidden[:, 0, 13] = rng.uniform(185.0, 200.0, rows).astype(np.float32)
    return hidden


def scores_with(fill: float) -> np.ndarray:
    rng = np.random.default_rng(1)
    scores = (rng.standard_normal((8, 2, 16, 16)) * 3).astype(np.float32)
    mask = np.zeros((8, 1, 1, 16), np.float32)
    mask[::2, ..., 10:] = fill
    return scores + mask


def observed(*parts: np.ndarray) -> MagnitudeObserver:
    observer = MagnitudeObserver()
    for part in parts:
        observer.observe(part)
    return observer


def test_varying_massive_channel_is_an_outlier_naming_its_channel_not_a_mask() -> None:
    observer = observed(massive_activation())
    assert find_sentinels({"ffn": observer}) == []
    (note,) = find_outliers({"ffn": observer})
    assert note.channels == (13,) and note.count == 32
    assert 185.0 <= note.low < note.high <= 200.0
    _, decision = sentinel_guard({"ffn": [observer]})
    assert decision.keep_float == set()
    assert any("outliers, not a mask" in w and "channel 13" in w for w in decision.warnings)


@pytest.mark.parametrize("fill", [-10000.0, -1000.0, FLOAT_MIN])
def test_masks_added_to_scores_are_still_guarded(fill: float) -> None:
    findings, decision = sentinel_guard({"masked": [observed(scores_with(fill))]})
    assert [f.tensor for f in findings] == ["masked"]
    assert decision.keep_float == {"masked"} and decision.outliers == []


def test_a_constant_cluster_is_a_sentinel_even_off_round_values() -> None:
    """A few exact values far above the bulk (a mask of 0 / -7777 added to nothing) stay guarded."""
    bulk = np.random.default_rng(2).standard_normal(5000).astype(np.float32)
    values = np.concatenate([bulk, np.full(300, -7777.0, np.float32), np.full(20, -5555.5, np.float32)])
    assert [f.tensor for f in find_sentinels({"x": observed(values)})] == ["x"]
    assert find_outliers({"x": observed(values)}) == []


def test_far_state_is_bit_identical_whatever_the_split_and_order() -> None:
    """Mergeable: the kept cluster state (min/max, bounded values and channels) is a function of the union."""
    parts = [massive_activation(8, seed) for seed in range(4)] + [scores_with(-10000.0).reshape(-1, 64)]
    parts.append(np.full((2, 64), 3.0, np.float32))
    whole = observed(*parts)

    def state(observer: MagnitudeObserver) -> dict[int, tuple[object, ...]]:
        return {k: (v.minimum, v.maximum, v.values, v.channels) for k, v in observer.far.items()}

    rng = np.random.default_rng(3)
    for _ in range(4):
        order = rng.permutation(len(parts))
        split = int(rng.integers(1, len(parts)))
        left = observed(*(parts[i] for i in order[:split]))
        left.merge(observed(*(parts[i] for i in order[split:])))
        assert state(left) == state(whole)
    one_by_one = [observed(p) for p in parts[::-1]]
    for other in one_by_one[1:]:
        one_by_one[0].merge(other)
    assert state(one_by_one[0]) == state(whole)


def test_histogram_methods_view_reaches_the_same_verdicts() -> None:
    """The aligned-histogram view (percentile, entropy...) has no values, only bins: same classification."""
    cases = {
        "ffn": massive_activation(),
        "masked": scores_with(-10000.0),
        "float_min": scores_with(FLOAT_MIN),
    }
    views = {}
    for name, values in cases.items():
        histogram = AlignedHistogramObserver(max_bins=4097)
        histogram.observe(values)
        views[name] = MagnitudeObserver.from_aligned(histogram)
    assert {f.tensor for f in find_sentinels(views)} == {"masked", "float_min"}
    (note,) = find_outliers(views)
    assert note.tensor == "ffn" and note.channels is None


def test_calibrate_widens_an_outlier_tensor_to_16_bits_and_keeps_it_integer(tmp_path) -> None:
    """End to end: the Add output carrying a massive channel is quantized (int16), not kept float; the
    QDQ model tracks the float one in onnxruntime."""
    from conftest import require_module

    require_module("onnxruntime")
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from qconvert.calibrate.api import calibrate

    rng = np.random.default_rng(5)
    bias = numpy_helper.from_array((rng.standard_normal(64) * 0.1).astype(np.float32), "bias")
    weight = numpy_helper.from_array((rng.standard_normal((64, 32)) * 0.2).astype(np.float32), "weight")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "bias"], ["residual"], name="add"),
            helper.make_node("MatMul", ["residual", "weight"], ["y"], name="mm"),
        ],
        "outliers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16, 32])],
        [bias, weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model_path, data_path, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "q.onnx"
    onnx.save(model, model_path)
    np.savez(data_path, x=massive_activation(32))
    ranges = tmp_path / "ranges.json"
    result = calibrate(str(model_path), str(data_path), out=str(out), batch_size=8, ranges_path=str(ranges))
    reloaded = tmp_path / "reloaded.onnx"
    calibrate(str(model_path), None, out=str(reloaded), load_ranges=str(ranges))
    assert reloaded.read_bytes() == out.read_bytes()  # the widening is kept in the ranges JSON
    assert "residual" not in result.keep_float
    assert any("residual: outliers, not a mask" in w for w in result.warnings)
    quantized = onnx.load(out)
    initializers = {t.name: t for t in quantized.graph.initializer}
    quantize = [n for n in quantized.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "residual"]
    assert quantize and initializers[quantize[0].input[2]].data_type == TensorProto.INT16
    feeds = {"x": massive_activation(8, seed=9)}
    (ours,) = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(["y"], feeds)
    (theirs,) = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).run(["y"], feeds)
    cosine = (ours * theirs).sum() / np.linalg.norm(ours) / np.linalg.norm(theirs)
    assert cosine > 0.999
