"""Range methods against onnxruntime's calibrators (same data, or the same histogram), and the MSE search.

onnxruntime's histograms grow with the data (re-binning approximately) and ours are power-of-two aligned,
so the histogram methods are compared on one histogram handed to both: onnxruntime's own
`HistogramCollector` builds it and our computations run on it, and our aligned histogram (in the layout
each method reads) goes through onnxruntime's entropy / percentile / distribution computation.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import calibrate

from qconvert.calibrate.entropy import entropy_threshold
from qconvert.calibrate.methods import (
    METHODS,
    DistributionMethod,
    EntropyMethod,
    Method,
    MinMaxMethod,
    MseMethod,
    PercentileMethod,
    aligned_bins,
    entropy_layout,
    histogram_avg_std,
    make_method,
    percentile_range,
)
from qconvert.calibrate.observers import AlignedHistogramObserver
from qconvert.errors import InputError
from qconvert.numerics import UniformParams, dequantize, quantize
from qconvert.numerics.calibration import STORAGE_DTYPES, activation_params, full_range

# --- onnxruntime's MinMaxCalibrater on a tiny model ---------------------------------------------------


def _tiny_model(path: Path) -> list[str]:
    """X[n,16] -> MatMul -> Add -> Relu -> MatMul -> Sigmoid; returns every float tensor's name."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["mm1"], name="mm1"),
        helper.make_node("Add", ["mm1", "b1"], ["add1"], name="add1"),
        helper.make_node("Relu", ["add1"], ["relu1"], name="relu1"),
        helper.make_node("MatMul", ["relu1", "w2"], ["mm2"], name="mm2"),
        helper.make_node("Sigmoid", ["mm2"], ["y"], name="sig"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return ["x", "mm1", "add1", "relu1", "mm2", "y"]


def _batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [
        {"x": (rng.standard_normal((4, 16)) * scale + shift).astype(np.float32)}
        for scale, shift in [(1, 0), (3, 1), (0.5, -2), (2, 0.3), (1.5, 0), (4, -1), (0.2, 0.1)]
    ]


class _Reader(calibrate.CalibrationDataReader):
    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self.items = iter(batches)

    def get_next(self) -> dict[str, np.ndarray]:
        return next(self.items, {})  # onnxruntime stops at the first empty (falsy) batch


def _intermediates(path: Path, names: list[str], batches: list[dict[str, np.ndarray]]) -> list[dict]:
    """Every named tensor of every batch, from onnxruntime with those tensors made graph outputs."""
    model = onnx.load(path)
    existing = {output.name for output in model.graph.output}
    for name in names:
        if name not in existing and name != "x":
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    outputs = [output.name for output in session.get_outputs()]
    results = []
    for batch in batches:
        values = dict(zip(outputs, session.run(None, batch), strict=True))
        values["x"] = batch["x"]
        results.append(values)
    return results


def _ours(method: Method, per_batch: list[dict], names: list[str]) -> dict[str, tuple[float, float]]:
    ranges = {}
    for name in names:
        first = method.first_pass_observer()
        for values in per_batch:
            first.observe(values[name])
        result = method.compute_range(first, None)
        assert result is not None
        ranges[name] = (result.min, result.max)
    return ranges


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("moving_average", [False, True])
def test_minmax_matches_onnxruntime_calibrater(tmp_path: Path, symmetric: bool, moving_average: bool) -> None:
    path = tmp_path / "tiny.onnx"
    names = _tiny_model(path)
    batches = _batches()
    calibrator = calibrate.create_calibrator(
        path,
        augmented_model_path=str(tmp_path / "augmented.onnx"),
        calibrate_method=calibrate.CalibrationMethod.MinMax,
        extra_options={"symmetric": symmetric, "moving_average": moving_average},
    )
    calibrator.collect_data(_Reader(batches))
    theirs = calibrator.compute_data()
    method = make_method("moving-average" if moving_average else "minmax", symmetric=symmetric)
    ours = _ours(method, _intermediates(path, names, batches), names)
    assert set(theirs.keys()) == set(names)
    for name in names:
        low, high = (float(np.asarray(v).reshape(())) for v in theirs[name].range_value)
        if moving_average:
            # onnxruntime sums float32 batch extremes in float32; ours is the exact mean: within 2 ulp.
            np.testing.assert_allclose(ours[name], (low, high), rtol=2.5e-7, atol=0, err_msg=name)
        else:
            assert ours[name] == (low, high), name


# --- the same histogram through onnxruntime's HistogramCollector and through ours -------------------------


def _samples(kind: int, size: int, rng: np.random.Generator) -> np.ndarray:
    if kind == 0:  # Gaussian with one outlier: the case onnxruntime's default entropy settings miss
        values = rng.standard_normal(size)
        values[0] = 20.0
    elif kind == 1:  # ReLU output
        values = np.maximum(rng.standard_normal(size), 0)
    elif kind == 2:  # heavy tails
        values = rng.standard_t(3, size)
    else:  # two separated modes
        values = rng.standard_normal(size) * 0.1 + rng.choice([-1.0, 1.5], size)
    return values.astype(np.float32)


def _collector(method: str, symmetric: bool, num_bins: int, num_quantized_bins: int, percentile: float):
    return calibrate.HistogramCollector(method, symmetric, num_bins, num_quantized_bins, percentile, "same")


# onnxruntime's own search takes ~1 s on 2048 bins (a Python loop per candidate), so most cases are smaller.
ENTROPY_CASES = [
    (0, 20_000, 2048, 128),
    (1, 50_000, 1024, 128),
    (2, 5_000, 1024, 64),
    (3, 20_000, 1001, 16),
    (0, 200_000, 512, 128),
    (2, 50_000, 600, 7),
]


@pytest.mark.parametrize(("kind", "size", "num_bins", "num_quantized_bins"), ENTROPY_CASES)
def test_entropy_threshold_equals_onnxruntime_on_the_same_histogram(
    kind: int, size: int, num_bins: int, num_quantized_bins: int
) -> None:
    rng = np.random.default_rng(kind * 1000 + size + num_bins)
    collector = _collector("entropy", False, num_bins, num_quantized_bins, 99.999)
    collector.collect({"t": [_samples(kind, size, rng)]})
    histogram = collector.histogram_dict["t"]
    low, high = collector.get_entropy_threshold(histogram, num_quantized_bins)
    counts, edges, minimum, maximum, _ = histogram
    assert entropy_threshold(counts, edges, minimum, maximum, num_quantized_bins) == (float(low), float(high))


@pytest.mark.parametrize("seed", range(4))
def test_entropy_threshold_equals_onnxruntime_on_small_random_histograms(seed: int) -> None:
    # Small histograms reach the corners: one-bin windows (1 quantized bin), odd bin counts, merged bins
    # that are all empty, windows whose outlier folding turns an empty end bin non-empty.
    rng = np.random.default_rng(seed)
    for case in range(30):
        num_bins = int(rng.integers(2, 60))
        num_quantized_bins = int(rng.integers(1, num_bins + 1))
        if num_quantized_bins // 2 > num_bins // 2:
            continue
        values = rng.standard_normal(int(rng.integers(1, 200))) * rng.uniform(0.1, 3) + rng.uniform(-1, 1)
        if case % 3 == 0:
            values = np.round(values)
        collector = _collector("entropy", False, num_bins, num_quantized_bins, 99.999)
        collector.collect({"t": [values.astype(np.float32)]})
        histogram = collector.histogram_dict["t"]
        low, high = collector.get_entropy_threshold(histogram, num_quantized_bins)
        counts, edges, minimum, maximum, _ = histogram
        ours = entropy_threshold(counts, edges, minimum, maximum, num_quantized_bins)
        assert ours == (float(low), float(high)), (num_bins, num_quantized_bins, case)


def test_entropy_defaults_search_where_onnxruntime_defaults_return_minmax() -> None:
    values = _samples(0, 100_000, np.random.default_rng(5))  # N(0, 1) with one 20.0
    default = _collector("entropy", False, 128, 128, 99.999)  # create_calibrator's defaults
    default.collect({"t": [values]})
    low, high = default.compute_entropy()["t"][:2]
    assert (float(low), float(high)) == (float(values.min()), float(values.max()))

    method = EntropyMethod()
    first = method.first_pass_observer()
    first.observe(values)
    assert method.second_pass_observer(first) is None  # one pass
    ours = method.compute_range(first, None)
    assert ours is not None
    # A searched threshold: the outlier 20.0 is clipped, the bulk of N(0, 1) (|x| < 4.4 here) is kept.
    assert float(values.min()) <= ours.min < -3.5 and 3.5 < ours.max < 10.0


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("kind", range(4))
@pytest.mark.parametrize("percentile", [99.999, 99.9, 90.0])
def test_percentile_equals_onnxruntime_on_the_same_histogram(
    kind: int, symmetric: bool, percentile: float
) -> None:
    values = _samples(kind, 30_000, np.random.default_rng(kind))
    collector = _collector("percentile", symmetric, 2048, 128, percentile)
    collector.collect({"t": [values]})
    low, high = collector.compute_percentile()["t"][:2]
    counts, edges, minimum, maximum = collector.histogram_dict["t"][:4]
    ours = percentile_range(counts, edges, minimum, maximum, percentile, symmetric)
    assert ours == (float(low), float(high))


@pytest.mark.parametrize("scenario", ["same", "p3"])
@pytest.mark.parametrize("kind", range(4))
def test_distribution_statistics_equal_onnxruntime_on_the_same_histogram(kind: int, scenario: str) -> None:
    values = _samples(kind, 30_000, np.random.default_rng(10 + kind))
    collector = calibrate.HistogramCollector("distribution", False, 2048, 128, 99.999, scenario)
    collector.collect({"t": [values]})
    theirs = collector.compute_distribution()["t"]
    counts, edges = collector.histogram_dict["t"][:2]
    avg, std = histogram_avg_std(counts, edges, scenario)
    assert (np.float32(avg), np.float32(std)) == (theirs.avg, theirs.std)


# --- MSE ------------------------------------------------------------------------------------------------


def _quantization_mse(values: np.ndarray, low: float, high: float, quant_type: str, symmetric: bool) -> float:
    pair = activation_params(low, high, quant_type, symmetric)
    storage_min, storage_max = full_range(quant_type)
    params = UniformParams(
        scale=np.array(pair.scale, dtype=np.float64),
        zero_point=np.array(pair.zero_point, dtype=np.int64),
        storage_dtype=STORAGE_DTYPES[quant_type],
        storage_type_min=storage_min,
        storage_type_max=storage_max,
    )
    error = dequantize(quantize(values, params), params).astype(np.float64) - values
    return float(np.mean(error * error))


def _run(method: Method, values: np.ndarray) -> tuple[float, float]:
    first = method.first_pass_observer()
    first.observe(values)
    second = method.second_pass_observer(first)  # type: ignore[arg-type]
    if second is not None:
        second.observe(values)
    result = method.compute_range(first, second)
    assert result is not None
    return result.min, result.max


@pytest.mark.parametrize(("quant_type", "symmetric"), [("int8", False), ("uint8", False), ("int8", True)])
def test_mse_range_beats_minmax_and_scaled_ranges(quant_type: str, symmetric: bool) -> None:
    rng = np.random.default_rng(42)
    values = rng.standard_normal(1_000_000).astype(np.float32)
    values[:3] = [50.0, -30.0, 41.0]
    low, high = _run(MseMethod(quant_type=quant_type, symmetric=symmetric), values)
    chosen = _quantization_mse(values, low, high, quant_type, symmetric)
    minmax = _quantization_mse(values, float(values.min()), float(values.max()), quant_type, symmetric)
    assert chosen < 0.9 * minmax
    for factor in (2.0, 0.5):
        assert chosen < _quantization_mse(values, low * factor, high * factor, quant_type, symmetric), factor


def test_mse_keeps_minmax_when_nothing_is_worth_clipping() -> None:
    # Uniform data: clipping any end costs more than the finer step saves, so the range stays near min/max.
    values = np.random.default_rng(3).uniform(-1, 1, 200_000).astype(np.float32)
    low, high = _run(MseMethod(), values)
    assert low < -0.95 and high > 0.95


# --- the method contract ---------------------------------------------------------------------------------


def test_registry_names_are_the_cli_names() -> None:
    assert list(METHODS) == ["minmax", "moving-average", "percentile", "entropy", "mse", "distribution"]
    assert not any(METHODS[name]().needs_second_pass for name in METHODS)  # every method is single-pass
    with pytest.raises(ValueError, match="unknown calibration method 'kl'"):
        make_method("kl")
    with pytest.raises(ValueError, match="has no option symmetric"):
        make_method("entropy", symmetric=True)
    with pytest.raises(ValueError, match="more than one candidate"):
        make_method("entropy", num_bins=128, num_quantized_bins=128)


@pytest.mark.parametrize(
    ("name", "lowest", "highest"),
    [("percentile", 16, 65536), ("mse", 16, 65536), ("distribution", 512, 65536), ("entropy", 16, 16384)],
)
def test_num_bins_limits_are_refused_with_their_reason(name: str, lowest: int, highest: int) -> None:
    """Each limit is accepted; one past it is refused, saying why (entropy: the search's bins²)."""
    assert make_method(name, num_bins=highest).num_bins == highest  # type: ignore[attr-defined]
    options = {"num_quantized_bins": 8} if name == "entropy" else {}
    assert make_method(name, num_bins=lowest, **options).num_bins == lowest  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=f"num_bins must be at most {highest} for {name} ") as error:
        make_method(name, num_bins=highest + 1)
    assert ("num_bins² per tensor" if name == "entropy" else "int64 counts") in str(error.value)
    with pytest.raises(ValueError, match=f"num_bins must be at least {lowest} for {name} "):
        make_method(name, num_bins=lowest - 1, **options)
    with pytest.raises(ValueError, match=f"num_bins must be at least {lowest} for {name} .*got -5"):
        make_method(name, num_bins=-5, **options)


def test_method_options_of_the_wrong_type_are_refused_naming_the_option() -> None:
    cases = {
        "option percentile must be a number, got str 'high'": ("percentile", {"percentile": "high"}),
        "option num_bins must be an integer, got float 2048.0": ("entropy", {"num_bins": 2048.0}),
        "option num_bins must be an integer, got bool True": ("mse", {"num_bins": True}),
        "option symmetric must be true or false, got int 1": ("minmax", {"symmetric": 1}),
        "option scenario must be a string, got int 3": ("distribution", {"scenario": 3}),
    }
    for message, (name, options) in cases.items():
        with pytest.raises(ValueError, match=f"method '{name}' {message}"):
            make_method(name, **options)
    # Numbers of the right kind, numpy's too, are taken as they are.
    assert make_method("percentile", percentile=99).percentile == 99  # type: ignore[attr-defined]
    assert make_method("percentile", num_bins=np.int64(512)).num_bins == 512  # type: ignore[attr-defined]


def test_calibrate_refuses_a_wrong_option_type_as_bad_input_and_writes_nothing(tmp_path: Path) -> None:
    from qconvert.calibrate.api import calibrate

    images = np.random.default_rng(3).random((8, 1, 8, 8), dtype=np.float32)
    out = tmp_path / "out.onnx"
    model = Path(__file__).resolve().parents[2] / "models" / "digits_cnn.onnx"
    options = {"percentile": "high"}
    with pytest.raises(InputError, match="--method percentile: method 'percentile' option percentile must"):
        calibrate(model, [{"image": images}], method="percentile", method_options=options, out=out)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", list(METHODS))
def test_two_workers_give_the_range_of_one(name: str) -> None:
    rng = np.random.default_rng(9)
    batches = [(rng.standard_normal((8, 32)) * (1 + i % 3)).astype(np.float32) for i in range(10)]
    batches[3][0, 0] = 25.0
    method = make_method(name)

    def run(shares: list[list[np.ndarray]]) -> object:
        firsts = [method.first_pass_observer() for _ in shares]
        for observer, share in zip(firsts, shares, strict=True):
            for batch in share:
                observer.observe(batch)
        first = firsts[0]
        for other in firsts[1:]:
            first.merge(other)  # type: ignore[arg-type]
        seconds = [method.second_pass_observer(first) for _ in shares]  # type: ignore[arg-type]
        if seconds[0] is None:
            return method.compute_range(first, None)
        for observer, share in zip(seconds, shares, strict=True):
            for batch in share:
                observer.observe(batch)  # type: ignore[union-attr]
        for other in seconds[1:]:
            seconds[0].merge(other)  # type: ignore[union-attr, arg-type]
        return method.compute_range(first, seconds[0])

    one = run([batches])
    two = run([batches[1::2], batches[::2]])
    assert one == two
    assert one is not None


def test_constant_and_non_finite_tensors() -> None:
    for name in METHODS:
        method = make_method(name)
        first = method.first_pass_observer()
        first.observe(np.full(10, 1.5, np.float32))
        assert method.second_pass_observer(first) is None  # type: ignore[arg-type]
        result = method.compute_range(first, None)
        assert result is not None and (result.min, result.max) == (1.5, 1.5)
        if name == "distribution":
            assert result.std == 1.5  # no spread: max|x|, so the float8 scale is not zero

        empty = method.first_pass_observer()
        empty.observe(np.array([np.nan, np.inf], np.float32))
        assert method.compute_range(empty, None) is None
        with pytest.raises(InputError, match="tensor 'bad': no finite value observed \\(1 NaN, 1 Inf of 2"):
            method.range("bad", [empty], [empty])


def test_distribution_std_stays_positive_when_every_value_shares_a_bin() -> None:
    # Aligned bins over a tensor's own range always occupy its first and last bin; one occupied bin comes
    # from a sentinel-clipped range inside wide bins (api.py replaces min/max, as here).
    values = np.array([-1000.0, 3.0, 3.0001, 3.0002], np.float32)
    method = make_method("distribution")
    first = method.first_pass_observer()
    first.observe(values)
    spread = method.compute_range(first, None)
    assert spread is not None and spread.std == pytest.approx(np.std(values), rel=1e-3)
    assert (spread.min, spread.max) == (-1000.0, 1000.0)
    clipped = copy.copy(first)
    clipped.minimum, clipped.maximum = 3.0, 3.0002  # 3.0.. share one bin of width 2**-1
    bins = aligned_bins(clipped, (3.0, 3.0002))
    assert bins is not None and np.count_nonzero(bins.counts) == 1
    result = method.compute_range(clipped, None)
    assert result is not None and result.std == np.float32(3.0002)


def test_list_adapters_build_a_tensor_range() -> None:
    values = np.linspace(-1, 3, 4001, dtype=np.float32)
    values[5] = np.nan
    method = make_method("percentile", percentile=99.0)
    first = method.first_pass("t")
    first[0].observe(values)  # type: ignore[attr-defined]
    assert method.passes == 1 and method.next_pass(1, "t", first) == []
    tensor_range = method.range("t", first, first)
    assert (tensor_range.name, tensor_range.method, tensor_range.nan_count) == ("t", "percentile", 1)
    assert -1.0 < tensor_range.min < -0.95 and 2.95 < tensor_range.max < 3.0
    assert MinMaxMethod().range("t", first, first).max == 3.0


# --- the aligned histogram's layouts through onnxruntime's own computations --------------------------


def _aligned(method: Method, values: np.ndarray) -> AlignedHistogramObserver:
    first = method.first_pass_observer()
    assert isinstance(first, AlignedHistogramObserver)
    for part in np.array_split(values, 3):  # a growing range: the bins coarsen as data arrives
        first.observe(part)
    return first


# (kind, size, num_bins, num_quantized_bins): onnxruntime's search is a Python loop per candidate (~1 s
# for 2048 bins), and the layout has up to 2·num_bins bins, so only one case uses the default 2048.
ALIGNED_ENTROPY_CASES = [
    (0, 20_000, 2048, 128),
    (1, 30_000, 512, 128),
    (2, 5_000, 256, 16),
    (3, 20_000, 300, 7),
]


@pytest.mark.parametrize(("kind", "size", "num_bins", "num_quantized_bins"), ALIGNED_ENTROPY_CASES)
def test_entropy_equals_onnxruntime_on_the_aligned_histogram(
    kind: int, size: int, num_bins: int, num_quantized_bins: int
) -> None:
    values = _samples(kind, size, np.random.default_rng(20 + kind))
    method = EntropyMethod(num_bins=num_bins, num_quantized_bins=num_quantized_bins)
    first = _aligned(method, values)
    bounds = (float(values.min()), float(values.max()))
    bins = aligned_bins(first, bounds)
    assert bins is not None
    layout = entropy_layout(bins, num_bins)
    edges, half = layout.edges, layout.counts.size // 2
    assert edges[half] == 0 and edges[0] == -edges[-1] and layout.counts.sum() == size
    # Bins at most twice as wide as onnxruntime's num_bins over [-t, t], and no more of them.
    t = max(abs(bounds[0]), abs(bounds[1]))
    assert edges[1] - edges[0] <= 4 * t / num_bins and num_bins // 4 <= half < num_bins // 2
    # The largest such merge: K lands near num_bins / 4 (the search costs about K² operations).
    fine_half = bins.symmetric().counts.size // 2
    if fine_half > num_bins // 2:
        assert half <= 3 * num_bins // 8 + 1
    collector = _collector("entropy", False, num_bins, num_quantized_bins, 99.999)
    histogram = (layout.counts, edges, values.min(), values.max(), np.float32(t))  # numpy scalars, as its own
    low, high = collector.get_entropy_threshold(histogram, num_quantized_bins)
    result = method.compute_range(first, None)
    assert result is not None
    assert (result.min, result.max) == (float(np.float32(low)), float(np.float32(high)))


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("kind", range(4))
def test_percentile_equals_onnxruntime_on_the_aligned_histogram(kind: int, symmetric: bool) -> None:
    values = _samples(kind, 30_000, np.random.default_rng(30 + kind))
    method = PercentileMethod(percentile=99.9, symmetric=symmetric)
    first = _aligned(method, values)
    bounds = (float(values.min()), float(values.max()))
    bins = aligned_bins(first, bounds)
    assert bins is not None
    if symmetric:
        bins = bins.absolute()
        assert bins.edges[1] < max(abs(bounds[0]), abs(bounds[1])) / 2048  # finer than onnxruntime's |x| bins
    else:
        assert bins.edges[1] - bins.edges[0] < (bounds[1] - bounds[0]) / 2048
    collector = _collector("percentile", symmetric, 2048, 128, 99.9)
    collector.histogram_dict = {"t": (bins.counts, bins.edges, *bounds)}
    low, high = collector.compute_percentile()["t"][:2]
    result = method.compute_range(first, None)
    assert result is not None
    assert (result.min, result.max) == (float(np.float32(low)), float(np.float32(high)))


@pytest.mark.parametrize("scenario", ["same", "p3"])
@pytest.mark.parametrize("kind", range(4))
def test_distribution_equals_onnxruntime_on_the_aligned_histogram(kind: int, scenario: str) -> None:
    values = _samples(kind, 30_000, np.random.default_rng(40 + kind))
    method = DistributionMethod(scenario=scenario)
    first = _aligned(method, values)
    bins = aligned_bins(first, (float(values.min()), float(values.max())))
    assert bins is not None
    collector = calibrate.HistogramCollector("distribution", False, 2048, 128, 99.999, scenario)
    collector.histogram_dict = {"t": (bins.counts, bins.edges.astype(np.float32))}
    theirs = collector.compute_distribution()["t"]
    result = method.compute_range(first, None)
    assert result is not None
    assert (np.float32(result.avg), np.float32(result.std)) == (theirs.avg, theirs.std)


def test_an_entropy_pick_that_clips_most_values_gives_way_to_min_max(tmp_path: Path) -> None:
    """Negative values that keep away from 0 (-|N| - 1): windows centred on 0 that hold none of them inside
    have a KL of ~0 (onnxruntime's search picks one too, at other offsets); the pick would clip nearly all
    of them, so the range is min/max, with a note that reaches the ranges file and a warning. The same
    values made positive meet the search's extra right-hand bin and get an ordinary pick: no note."""
    from qconvert.calibrate.api import calibrate as qconvert_calibrate
    from qconvert.calibrate.ranges import CalibrationRanges

    values = (-(np.abs(np.random.default_rng(0).standard_normal(64 * 64)) + 1)).astype(np.float32)
    method = EntropyMethod()
    result = method.compute_range(_aligned(method, values), None)
    assert result is not None and (result.min, result.max) == (float(values.min()), float(values.max()))
    assert result.note is not None and "would clip 99." in result.note
    positive = method.compute_range(_aligned(method, -values), None)
    assert positive is not None and positive.note is None and 1.0 <= positive.min < positive.max
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(np.ones((64, 4), np.float32), "W")],
    )
    model = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    ranges = tmp_path / "ranges.json"
    calibrated = qconvert_calibrate(
        model, [{"x": values.reshape(64, 64)}], method="entropy", ranges_path=ranges
    )
    assert any(w.startswith("x: entropy's pick") for w in calibrated.warnings)
    assert CalibrationRanges.load(ranges)["x"].note == calibrated.ranges["x"].note is not None


def test_an_entropy_pick_clipping_a_masks_ones_gives_way_to_min_max() -> None:
    """A 0/1 mask with 60% zeros: the search picks [0, ~0.15], which clips every 1 (40% of the values)."""
    values = (np.random.default_rng(3).random(4096) > 0.6).astype(np.float32)
    method = EntropyMethod()
    result = method.compute_range(_aligned(method, values), None)
    assert result is not None and (result.min, result.max) == (0.0, 1.0)
    assert result.note is not None and "would clip 4" in result.note
