"""qconvert.numerics.calibration against onnxruntime's own quantization functions (1.32), bit for bit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import require_module

from qconvert.numerics import calibration as cal

ONNX_TYPES = {"int8": 3, "uint8": 2, "int16": 5, "uint16": 4, "int4": 22, "uint4": 21, "float8e4m3fn": 17}


def quant_utils():
    return require_module("onnxruntime.quantization.quant_utils")


def edge_ranges(rng: np.random.Generator) -> list[tuple[float, float]]:
    """All-zero, all-positive, all-negative, tiny, huge, float-min sentinels, equal bounds, random."""
    tiny = float(np.finfo(np.float32).tiny)
    fixed = [
        (0.0, 0.0),
        (0.0, 1.0),
        (0.5, 3.0),
        (-3.0, -0.5),
        (-1.5, 2.25),
        (-tiny, tiny),
        (0.0, tiny * 100),
        (-1e-30, 1e-30),
        (-1e-38, 2e-38),
        (-3.4028234663852886e38, 1.0),
        (-3.4028234663852886e38, 3.4028234663852886e38),
        (2.0, 2.0),
        (-7.0, 7.0),
        (-0.0039215686, 1.0),
    ]
    random = [tuple(sorted(rng.standard_normal(2) * 10.0 ** rng.integers(-6, 6))) for _ in range(150)]
    return fixed + random


@pytest.mark.parametrize("quant_type", cal.INTEGER_QUANT_TYPES)
def test_qmin_qmax_matches_onnxruntime(quant_type: str) -> None:
    utils = quant_utils()
    for reduce_range, symmetric in itertools.product((False, True), repeat=2):
        expected = utils.get_qmin_qmax_for_qType(ONNX_TYPES[quant_type], reduce_range, symmetric)
        assert cal.qmin_qmax(quant_type, reduce_range, symmetric) == tuple(int(v) for v in expected)


@pytest.mark.parametrize("quant_type", cal.INTEGER_QUANT_TYPES)
@pytest.mark.parametrize("symmetric", [False, True])
def test_compute_scale_zp_matches_onnxruntime(quant_type: str, symmetric: bool) -> None:
    utils = quant_utils()
    rng = np.random.default_rng(7)
    for reduce_range, min_real_range in ((False, None), (True, None), (False, 0.0001)):
        qmin, qmax = utils.get_qmin_qmax_for_qType(ONNX_TYPES[quant_type], reduce_range, symmetric)
        for low, high in edge_ranges(rng):
            rmin, rmax = np.array(low, np.float32), np.array(high, np.float32)
            zero, scale = utils.compute_scale_zp(rmin, rmax, qmin, qmax, symmetric, min_real_range)
            ours = cal.compute_scale_zp(rmin, rmax, int(qmin), int(qmax), symmetric, min_real_range)
            assert np.asarray(ours.scale).dtype == scale.dtype == np.float32
            assert np.asarray(ours.scale).tobytes() == scale.tobytes(), (low, high, reduce_range)
            assert ours.zero_point == int(zero), (low, high, reduce_range)


def test_compute_scale_zp_float16_matches_onnxruntime() -> None:
    utils = quant_utils()
    rng = np.random.default_rng(3)
    for low, high in [*edge_ranges(rng)[:9], (-1e-06, 1e-06), (-60000.0, 60000.0), (-1e-07, 0.0)]:
        rmin, rmax = np.array(low, np.float16), np.array(high, np.float16)
        for symmetric in (False, True):
            qmin, qmax = utils.get_qmin_qmax_for_qType(3, False, symmetric)
            zero, scale = utils.compute_scale_zp(rmin, rmax, qmin, qmax, symmetric)
            ours = cal.compute_scale_zp(rmin, rmax, int(qmin), int(qmax), symmetric, dtype=np.float16)
            assert np.asarray(ours.scale).dtype == np.float16
            assert np.asarray(ours.scale).tobytes() == scale.tobytes(), (low, high)
            assert ours.zero_point == int(zero)


@pytest.mark.parametrize("quant_type", ["int8", "uint8", "int16", "uint4"])
@pytest.mark.parametrize(("reduce_range", "min_real_range"), [(False, None), (True, None), (False, 0.0001)])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_compute_scales_zero_points_of_many_ranges_match_onnxruntime_one_by_one(
    quant_type: str, reduce_range: bool, min_real_range: float | None, symmetric: bool, dtype: type
) -> None:
    """The array form (MSE's candidates) row by row: edge ranges (scale 0, tiny scales that fall back to
    1, huge ones) side by side with ordinary ones, so no row's special case leaks into another."""
    utils = quant_utils()
    with np.errstate(over="ignore"):
        ranges = np.array(edge_ranges(np.random.default_rng(5)), dtype=np.float32).astype(dtype)
    ranges = ranges[np.isfinite(ranges).all(axis=1)]
    qmin, qmax = utils.get_qmin_qmax_for_qType(ONNX_TYPES[quant_type], reduce_range, symmetric)
    scales, zero_points = cal.compute_scales_zero_points(
        ranges[:, 0], ranges[:, 1], int(qmin), int(qmax), symmetric, min_real_range, dtype
    )
    assert scales.dtype == dtype and zero_points.dtype == np.int64
    for (low, high), scale, zero_point in zip(ranges, scales, zero_points, strict=True):
        zero, expected = utils.compute_scale_zp(low, high, qmin, qmax, symmetric, min_real_range)
        assert scale.tobytes() == np.asarray(expected).tobytes(), (low, high)
        assert zero_point == int(zero), (low, high)


def test_compute_scales_zero_points_names_a_range_that_is_not_finite() -> None:
    with pytest.raises(ValueError, match=r"range \[-inf, 2.0\] is not finite"):
        cal.compute_scales_zero_points(np.array([0.0, -np.inf]), np.array([1.0, 2.0]), -128, 127)


@pytest.mark.parametrize("quant_type", cal.QUANT_TYPES)
def test_weight_quantization_matches_quantize_data(quant_type: str) -> None:
    utils = quant_utils()
    rng = np.random.default_rng(11)
    arrays = [
        rng.standard_normal(300).astype(np.float32) * 0.1,
        np.abs(rng.standard_normal(64)).astype(np.float32),
        np.zeros(10, np.float32),
        np.full(5, -2.5, np.float32),
        np.array([0.5, 0.5 + 2**-20, -0.25], np.float32),
    ]
    for data, symmetric, reduce_range in itertools.product(arrays, (False, True), (False, True)):
        if quant_type == "float8e4m3fn" and (reduce_range or not data.any()):
            continue
        zero, scale, quantized = utils.quantize_data(data, ONNX_TYPES[quant_type], symmetric, reduce_range)
        ours = cal.weight_params(data, quant_type, symmetric, reduce_range)
        assert np.asarray(ours.scale).tobytes() == np.asarray(scale).tobytes()
        assert ours.zero_point == float(zero)
        values = cal.quantize_values(data, ours.scale, ours.zero_point, quant_type)
        assert values.dtype == cal.STORAGE_DTYPES[quant_type]
        assert values.tobytes() == np.asarray(quantized).astype(values.dtype).tobytes()


def test_quantize_values_rounds_ties_to_even_before_adding_zero_point() -> None:
    utils = quant_utils()
    data = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0], np.float32)
    for zero_point in (0, 3, -128, 127):
        expected = utils.quantize_nparray(3, data, np.array(1.0, np.float32), np.array(zero_point, np.int8))
        assert cal.quantize_values(data, np.float32(1.0), zero_point, "int8").tolist() == expected.tolist()


@pytest.mark.parametrize("quant_type", ["int8", "uint8", "int4", "uint4", "int16"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_blocked_weights_match_onnxruntime(quant_type: str, symmetric: bool) -> None:
    utils = quant_utils()
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((45, 6)).astype(np.float32)
    weight[:16, 2] = 0.0  # a degenerate block
    weight[16:32, 3] = np.abs(weight[16:32, 3])  # an all-positive block
    for axis, block_size in ((0, 16), (1, 4), (0, 45), (0, 7)):
        zero, scale = utils.compute_scale_zp_blocked(
            weight, ONNX_TYPES[quant_type], axis, block_size, symmetric
        )
        scales, zero_points = cal.weight_params_blocked(weight, axis, block_size, quant_type, symmetric)
        assert scales.dtype == np.float32 and scales.tobytes() == scale.tobytes()
        assert zero_points.tolist() == zero.astype(np.int64).tolist()
        import onnx  # the reference quantizes an initializer; same values, packed differently for int4

        proto = onnx.numpy_helper.from_array(weight, "w")
        expected = utils.quantize_onnx_initializer(
            proto, ONNX_TYPES[quant_type], zero, scale, axis, block_size=block_size
        )
        expected_values = onnx.numpy_helper.to_array(expected).astype(np.int64)
        ours = cal.quantize_blocked(weight, axis, block_size, scales, zero_points, quant_type)
        assert ours.astype(np.int64).tolist() == expected_values.tolist()


def test_per_channel_weights_match_onnxruntime() -> None:
    utils = quant_utils()
    rng = np.random.default_rng(9)
    weight = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    weight[2] = 0.0
    for axis in (0, 1):
        scales, zero_points = cal.weight_params_per_channel(weight, axis, "int8", True)
        for channel in range(weight.shape[axis]):
            zero, scale, _ = utils.quantize_data(weight.take(channel, axis).ravel(), 3, True)
            assert scales[channel].tobytes() == np.asarray(scale).tobytes()
            assert zero_points[channel] == int(zero)
        import onnx

        proto = onnx.numpy_helper.from_array(weight, "w")
        expected = utils.quantize_onnx_initializer(proto, 3, zero_points.astype(np.int8), scales, axis)
        ours = cal.quantize_per_channel(weight, axis, scales, zero_points, "int8")
        assert ours.tobytes() == onnx.numpy_helper.to_array(expected).tobytes()


def test_float8_scale_matches_onnxruntime() -> None:
    utils = quant_utils()
    for std in (np.float32(0.1), np.float32(3.5), np.float64(0.01), np.float32(1e-20)):
        zero, scale = utils.compute_scale_zp_float8(17, std)
        ours = cal.float8_params(std)
        assert np.asarray(ours.scale).dtype == scale.dtype
        assert np.asarray(ours.scale).tobytes() == scale.tobytes() and ours.zero_point == float(zero)


def test_float8_saturation_is_measured_against_what_ml_dtypes_saturates() -> None:
    """A LayerNorm-like gamma (mean 1, std 0.05) under onnxruntime's std-based scale: every value past the
    limit, and each counted one is one that casting to e4m3fn (saturating) clips; centred data: a tail."""
    ml_dtypes = require_module("ml_dtypes")
    rng = np.random.default_rng(4)
    for data, expected in (((1 + 0.05 * rng.standard_normal(4096)).astype(np.float32), 1.0),
                           (rng.standard_normal(4096).astype(np.float32), None)):  # fmt: skip
        scale = np.float32(cal.float8_params(np.std(data)).scale)
        fraction = cal.float8_saturated_fraction(data, scale)
        clipped = np.abs(data / scale) > float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
        assert fraction == float(np.mean(clipped))
        assert fraction == expected if expected is not None else fraction < 0.01
    channels = np.stack([np.full(8, 1000.0), np.linspace(-1, 1, 8)]).astype(np.float32)  # per channel: axis 0
    assert cal.float8_saturated_fraction(channels, np.array([1.0, 1.0]), axis=0) == 0.5


def test_bias_matches_onnxruntime_quantizer() -> None:
    base = require_module("onnxruntime.quantization.base_quantizer")
    onnx = require_module("onnx")
    rng = np.random.default_rng(13)
    bias = (rng.standard_normal(16) * 3).astype(np.float32)
    bias[3] = 0.0
    input_scale = np.array(0.0123, np.float32)
    graph = onnx.helper.make_graph([], "g", [], [], initializer=[onnx.numpy_helper.from_array(bias, "b")])
    model = onnx.helper.make_model(graph)
    quantizer = base.BaseQuantizer(model, False, False, 3, 3, None, None, None, [])
    for weight_scale, beta in (
        (np.array(0.004, np.float32), 1.0),
        (rng.random(16).astype(np.float32) * 0.01, 0.5),
    ):
        name, _, _, scale_data, _, _ = quantizer.quantize_bias_static_impl(
            "b", input_scale, weight_scale, beta
        )
        expected = {i.name: onnx.numpy_helper.to_array(i) for i in quantizer.model.initializer()}
        scale = cal.bias_scale(input_scale, weight_scale, beta)
        assert scale.astype(np.float32).reshape(-1).tobytes() == scale_data.tobytes()
        assert cal.quantize_bias(bias, scale).tobytes() == expected[name].tobytes()


def test_bias_clips_to_int32() -> None:
    values = cal.quantize_bias(np.array([1e10, -1e10, 2.5, 3.5], np.float32), np.array(1.0, np.float32))
    assert values.tolist() == [2**31 - 1, -(2**31), 2, 4]


def test_weight_scale_adjustment_matches_onnxruntime() -> None:
    qdq = require_module("onnxruntime.quantization.qdq_quantizer")
    onnx = require_module("onnx")
    rng = np.random.default_rng(17)
    for per_channel in (False, True):
        for trial in range(20):
            bias = (rng.standard_normal(4) * 10.0 ** rng.integers(-2, 6)).astype(np.float32)
            weight_scale = (rng.random(4 if per_channel else ()) * 10.0 ** -rng.integers(3, 9)).astype(
                np.float32
            )
            input_scale = np.array(10.0 ** -rng.integers(2, 6), np.float32)
            proto = onnx.numpy_helper.from_array(bias, "b")
            changed, expected = qdq.QDQQuantizer._adjust_weight_scale_for_int32_bias(
                None, input_scale, weight_scale.copy(), "w", proto, per_channel
            )
            ours = cal.adjust_weight_scale_for_int32_bias(input_scale, weight_scale, bias, per_channel)
            assert (ours is not None) == changed, trial
            if changed:
                assert ours.dtype == expected.dtype and ours.tobytes() == np.asarray(expected).tobytes()


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="unknown quantization type"):
        cal.qmin_qmax("int7")
    with pytest.raises(ValueError, match="qmin <= 0 <= qmax"):
        cal.compute_scale_zp(0.0, 1.0, 1, 255)
    with pytest.raises(ValueError, match="not finite"):
        cal.compute_scale_zp(-np.inf, 1.0, -128, 127)
    with pytest.raises(ValueError, match="rank-2"):
        cal.weight_params_blocked(np.zeros((2, 2, 2), np.float32), 0, 2, "int8", True)
    with pytest.raises(ValueError, match="standard deviation"):
        cal.activation_params(0.0, 1.0, "float8e4m3fn")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float8_max_scale_saturates_nothing_where_the_std_scale_saturates_everything(dtype: type) -> None:
    """LayerNorm-gamma-like data (mean 1, std 0.05): onnxruntime's std-based scale puts all of it past
    448; max|x| / 448 puts the largest value on 448 and every value within half a float8 step of itself."""
    rng = np.random.default_rng(11)
    gammas = (1 + 0.05 * rng.standard_normal(4096)).astype(dtype)
    by_std = cal.weight_params(gammas, cal.FLOAT8, True)
    by_max = cal.weight_params(gammas, cal.FLOAT8, True, float8_scale="max")
    assert cal.float8_saturated_fraction(gammas, np.asarray(by_std.scale)) == 1.0
    assert cal.float8_saturated_fraction(gammas, np.asarray(by_max.scale)) == 0.0
    assert np.asarray(by_max.scale).dtype == dtype and by_max.zero_point == 0
    stored = cal.quantize_values(gammas, by_max.scale, 0, cal.FLOAT8).astype(np.float64)
    assert np.abs(stored).max() == cal.float8_limit()
    # e4m3fn's spacing is 2**(e - 3) in [2**e, 2**(e + 1)): half of it bounds the rounding error.
    spacing = np.exp2(np.floor(np.log2(np.abs(stored))) - 3)
    error = np.abs(stored * float(by_max.scale) - gammas.astype(np.float64))
    assert np.all(error <= (spacing / 2 + 1e-6) * float(by_max.scale))
    # The same rule for an activation's range, and an all-zero tensor's scale is 1.
    pair = cal.activation_params(-3.5, 2.0, cal.FLOAT8, float8_scale="max", dtype=dtype)
    assert np.asarray(pair.scale).dtype == dtype and 447.5 < 3.5 / float(pair.scale) <= 448
    assert float(cal.weight_params(np.zeros(8, dtype), cal.FLOAT8, True, float8_scale="max").scale) == 1.0


def test_float8_max_scale_edges() -> None:
    """float16 maximum 3: the float16 scale rounds down, so it is raised until 3 / scale <= 448 in float64;
    a tiny maximum gets the smallest subnormal, never 0; Inf/NaN maxima and unknown rules are refused."""
    pair = cal.float8_params_from_maximum(3.0, np.float16)
    assert np.asarray(pair.scale).dtype == np.float16 and 3.0 / float(pair.scale) <= 448
    assert 3.0 / float(np.nextafter(pair.scale, np.float16(0))) > 448  # the smallest such float16
    assert float(cal.float8_params_from_maximum(1e-9, np.float16).scale) == float(
        np.nextafter(np.float16(0), 1)
    )
    for bad in (np.inf, np.nan):
        with pytest.raises(ValueError, match="not finite"):
            cal.float8_params_from_maximum(bad)
    with pytest.raises(ValueError, match="float8 scale rule 'mean'"):
        cal.weight_params(np.ones(4, np.float32), cal.FLOAT8, True, float8_scale="mean")
