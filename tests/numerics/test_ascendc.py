"""qconvert.numerics.ascendc: the AscendC quantization APIs as documented (quantization reference, section 5).

No Ascend hardware, toolkit or simulator exists here, so the oracles are the documentation's own worked
examples (the SDK sample's golden `round(src * 2.0 + 0.9)` computed in float16, appendix A.4), vectors
computed by hand below, step-by-step re-computations with numpy's float16 / float32 scalars (each op rounded
as the Vector unit's op is), and onnxruntime's QuantizeLinear for the claim that `predicted_mismatch` marks
exactly the elements where the half pipeline and ONNX disagree.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import require_module

from qconvert.numerics import UniformParams, quantize
from qconvert.numerics.ascendc import (
    FLOAT4_E1M2,
    HIFLOAT8,
    AscendQuantMode,
    AscendRoundMode,
    antiquant_parameters_from_onnx,
    ascend_antiquant,
    ascend_dequant,
    ascend_quant,
    decode_float4_e1m2,
    dequant_scale_from_onnx,
    effective_round_mode,
    encode_float4_e1m2,
    float_parameters_after_call,
    pack_deq_scale,
    predicted_mismatch,
    quant_parameters_from_onnx,
    round_to_grid,
    unpack_deq_scale,
)
from qconvert.numerics.hifloat8 import encode_hifloat8

INT8 = np.int8
RNG_SEED = 20261205


@pytest.fixture(scope="module")
def rng() -> np.random.Generator:
    return np.random.default_rng(RNG_SEED)


# --- AscendQuant ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("src_dtype", [np.float16, np.float32])
def test_sdk_golden_round_src_times_2_plus_0_9(src_dtype: type, rng: np.random.Generator) -> None:
    """The SDK sample's golden: `np.round(src_fp16 * 2.0 + 0.9)` in float16 arithmetic, saturated to int8."""
    src = (rng.standard_normal(4096) * 50).astype(src_dtype)
    half = src.astype(np.float16)
    golden = np.clip(np.round(half * np.float16(2.0) + np.float16(0.9)), -128, 127).astype(INT8)
    result = ascend_quant(src, 2.0, 0.9, mode=AscendQuantMode.PER_TENSOR, dst_dtype=INT8)
    np.testing.assert_array_equal(result, golden)


def test_appendix_a4_half_pipeline_differs_from_onnx() -> None:
    """s = 0.02: ONNX rne(113.4749...) = 113; AscendC half(x) = 2.26953125, half(2.26953125 * 50) = 113.5 ->
    114."""
    x = np.array([2.269498825073242], np.float32)
    scale, offset = quant_parameters_from_onnx(np.float32(0.02), 0, src_dtype=np.float32)
    assert float(scale) == 50.0 and float(offset) == 0.0
    assert ascend_quant(x, scale, offset, mode="per_tensor", dst_dtype=INT8).tolist() == [114]
    params = UniformParams(
        scale=0.02, zero_point=0, storage_dtype=np.dtype(INT8), storage_type_min=-128, storage_type_max=127
    )
    assert quantize(x, params).tolist() == [113]
    assert predicted_mismatch(x, np.float32(0.02), 0).tolist() == [True]


# Hand-computed: value (exact in half) -> int8 per round mode, scale 1, offset 0.
ROUND_MODE_VECTORS = np.array(
    [2.5, -2.5, 3.5, 2.25, -2.75, 0.5, -0.5, 127.5, -128.5, 300.0, -300.0], np.float16
)
ROUND_MODE_EXPECTED = {
    AscendRoundMode.RINT: [2, -2, 4, 2, -3, 0, 0, 127, -128, 127, -128],
    AscendRoundMode.NONE: [2, -2, 4, 2, -3, 0, 0, 127, -128, 127, -128],
    AscendRoundMode.ROUND: [3, -3, 4, 2, -3, 1, -1, 127, -128, 127, -128],
    AscendRoundMode.FLOOR: [2, -3, 3, 2, -3, 0, -1, 127, -128, 127, -128],
    AscendRoundMode.CEIL: [3, -2, 4, 3, -2, 1, 0, 127, -128, 127, -128],
    AscendRoundMode.TRUNC: [2, -2, 3, 2, -2, 0, 0, 127, -128, 127, -128],
    # ODD and HYBRID are not int8 modes: the API falls back to CAST_RINT.
    AscendRoundMode.ODD: [2, -2, 4, 2, -3, 0, 0, 127, -128, 127, -128],
    AscendRoundMode.HYBRID: [2, -2, 4, 2, -3, 0, 0, 127, -128, 127, -128],
}


@pytest.mark.parametrize("mode", list(AscendRoundMode))
def test_round_modes_and_saturation_int8(mode: AscendRoundMode) -> None:
    result = ascend_quant(ROUND_MODE_VECTORS, 1.0, 0.0, mode="per_tensor", dst_dtype=INT8, round_mode=mode)
    assert result.tolist() == ROUND_MODE_EXPECTED[mode]


def test_int4_destination_saturates_to_its_range() -> None:
    values = np.array([7.4, 7.6, -8.4, -9.0, 100.0, 2.5], np.float16)
    result = ascend_quant(values, 1.0, 0.0, mode="per_tensor", dst_dtype=ml_dtypes.int4)
    assert result.dtype == np.dtype(ml_dtypes.int4)
    assert result.astype(np.int64).tolist() == [7, 7, -8, -8, 7, 2]


def test_effective_round_mode_per_destination() -> None:
    assert effective_round_mode(INT8, "floor") is AscendRoundMode.FLOOR
    assert effective_round_mode(INT8, "hybrid") is AscendRoundMode.RINT
    assert effective_round_mode(ml_dtypes.float8_e4m3fn, "round") is AscendRoundMode.RINT
    assert effective_round_mode(HIFLOAT8, "rint") is AscendRoundMode.ROUND
    assert effective_round_mode(HIFLOAT8, "hybrid") is AscendRoundMode.HYBRID
    assert effective_round_mode(ml_dtypes.float4_e2m1fn, "ceil") is AscendRoundMode.CEIL
    with pytest.raises(ValueError, match="destination"):
        effective_round_mode(np.uint8, "rint")


def half_steps(x: float, scale: float, offset: float) -> float:
    """One element of the A2/A3 pipeline with numpy float16 scalars, each op rounded to half."""
    product = np.float16(np.float16(x) * np.float16(scale))
    return float(np.float16(product + np.float16(offset)))


def test_per_channel_recycles_parameters_every_scale_count(rng: np.random.Generator) -> None:
    channels, rows = 32, 6
    src = (rng.standard_normal((rows, channels)) * 30).astype(np.float32)
    scale = rng.uniform(0.5, 4.0, channels).astype(np.float32)
    offset = rng.integers(-10, 11, channels).astype(np.float32)
    result = ascend_quant(src, scale, offset, mode="per_channel", dst_dtype=INT8)
    expected = [
        [
            int(np.clip(np.rint(half_steps(src[i, j], scale[j], offset[j])), -128, 127))
            for j in range(channels)
        ]
        for i in range(rows)
    ]
    assert result.tolist() == expected
    flat = ascend_quant(src.reshape(-1), scale, offset, mode="per_channel", dst_dtype=INT8)
    np.testing.assert_array_equal(flat.reshape(rows, channels), result)
    scalar_offset = ascend_quant(src, scale, 3.0, mode="per_channel", dst_dtype=INT8)
    np.testing.assert_array_equal(
        scalar_offset, ascend_quant(src, scale, np.full(channels, 3.0), mode="per_channel", dst_dtype=INT8)
    )
    with pytest.raises(ValueError, match="multiple"):
        ascend_quant(src[:, :20], scale, offset, mode="per_channel", dst_dtype=INT8)


def test_tiles_give_the_whole_tensor(rng: np.random.Generator) -> None:
    """Tile by tile (each tile a multiple of scaleCount, parameters resident) equals one call on
    everything."""
    channels = 64
    src = (rng.standard_normal(channels * 40) * 80).astype(np.float32)
    scale = rng.uniform(0.1, 3.0, channels).astype(np.float32)
    offset = rng.integers(-20, 21, channels).astype(np.float32)
    whole = ascend_quant(src, scale, offset, mode="per_channel", dst_dtype=INT8)
    tile = channels * 8
    tiles = [
        ascend_quant(src[i : i + tile], scale, offset, mode="per_channel", dst_dtype=INT8)
        for i in range(0, src.size, tile)
    ]
    np.testing.assert_array_equal(np.concatenate(tiles), whole)


def float32_steps(x: float, scale: float, offset: float | None) -> float:
    """One element of the 950 float32 pipeline with numpy float32 scalars."""
    value = np.float32(np.float32(x) * np.float32(scale))
    return float(value if offset is None else np.float32(value + np.float32(offset)))


@pytest.mark.parametrize("with_offset", [True, False])
def test_per_token_float32_scale(with_offset: bool, rng: np.random.Generator) -> None:
    rows, columns = 8, 32
    src = (rng.standard_normal((rows, columns)) * 10).astype(np.float16)
    scale = rng.uniform(1.0, 8.0, rows).astype(np.float32)
    offset = rng.uniform(-3, 3, rows).astype(np.float32) if with_offset else None
    result = ascend_quant(src, scale, offset, mode="per_token", dst_dtype=INT8, round_mode="round")
    for i in range(rows):
        for j in range(columns):
            value = float32_steps(src[i, j], scale[i], None if offset is None else offset[i])
            magnitude = np.floor(abs(value) + 0.5)  # ties away, by hand
            assert result[i, j] == int(np.clip(np.copysign(magnitude, value), -128, 127))
    np.testing.assert_array_equal(
        result,
        ascend_quant(
            src, scale.reshape(rows, 1), offset, mode="per_token", dst_dtype=INT8, round_mode="round"
        ),
    )


@pytest.mark.parametrize("k_dim", [0, 1])
def test_per_group_layouts(k_dim: int, rng: np.random.Generator) -> None:
    rows, columns, group = 64, 96, 32
    src = (rng.standard_normal((rows, columns)) * 4).astype(np.float32)
    shape = (rows // group, columns) if k_dim == 0 else (rows, columns // group)
    scale = rng.uniform(0.5, 2.0, shape).astype(np.float32)
    offset = rng.uniform(-1, 1, shape).astype(np.float32)
    result = ascend_quant(src, scale, offset, mode="per_group", group_size=group, axis=k_dim, dst_dtype=INT8)
    for i in range(rows):
        for j in range(columns):
            index = (i // group, j) if k_dim == 0 else (i, j // group)
            value = float32_steps(src[i, j], scale[index], offset[index])
            assert result[i, j] == int(np.clip(np.rint(value), -128, 127))
    with pytest.raises(ValueError, match="must have shape"):
        ascend_quant(src, scale.T, offset.T, mode="per_group", group_size=group, axis=k_dim, dst_dtype=INT8)
    with pytest.raises(ValueError, match="group_size"):
        ascend_quant(src, scale, offset, mode="per_group", dst_dtype=INT8)


def test_per_group_with_a_ragged_last_group() -> None:
    src = np.arange(1, 41, dtype=np.float32).reshape(1, 40)
    scale = np.array([[1.0, 0.5]], np.float32)  # groups of 32: columns 0..31, then 32..39
    result = ascend_quant(src, scale, None, mode="per_group", group_size=32, axis=1, dst_dtype=INT8)
    assert result[0, :32].tolist() == list(range(1, 33))
    assert result[0, 32:].tolist() == [16, 17, 18, 18, 18, 19, 20, 20]  # 16.5 -> 16, 17.5 -> 18 (even)


def test_per_group_bfloat16_scale_computes_in_bfloat16() -> None:
    """int8 destinations compute in scaleT: bf16(3.499) = 3.5 (8 significant bits) -> RINT 4; float32 gives
    3."""
    src = np.full((1, 32), 3.499, np.float32)
    scale = np.ones((1, 1), np.float32)
    as_bf16 = ascend_quant(
        src, scale, None, mode="per_group", group_size=32, dst_dtype=INT8, scale_dtype=ml_dtypes.bfloat16
    )
    as_float = ascend_quant(src, scale, None, mode="per_group", group_size=32, dst_dtype=INT8)
    assert set(as_bf16[0].tolist()) == {4} and set(as_float[0].tolist()) == {3}
    scaled = ascend_quant(
        np.ones((1, 32), np.float32),
        np.full((1, 1), 3.499, np.float32),
        None,
        mode="per_group",
        group_size=32,
        dst_dtype=INT8,
        scale_dtype=ml_dtypes.bfloat16,
    )
    assert set(scaled[0].tolist()) == {4}


@pytest.mark.parametrize(
    ("dtype", "largest"), [(ml_dtypes.float8_e4m3fn, 448.0), (ml_dtypes.float8_e5m2, 57344.0)]
)
def test_fp8_destinations_compute_in_float32_and_saturate(dtype: type, largest: float) -> None:
    src = np.array([1e6, -1e6, np.inf, -np.inf, np.nan, 1.0, 0.1, 300.0], np.float32)
    result = ascend_quant(src, 1.5, 0.25, mode="per_tensor", dst_dtype=dtype, round_mode="floor")
    assert result.dtype == np.dtype(dtype)
    values = result.astype(np.float32)
    assert values[:4].tolist() == [largest, -largest, largest, -largest]
    assert np.isnan(values[4])
    expected = (np.float32(src[5:]) * np.float32(1.5) + np.float32(0.25)).astype(
        dtype
    )  # RINT (floor ignored)
    np.testing.assert_array_equal(values[5:], expected.astype(np.float32))


def test_hifloat8_destination_is_the_half_pipeline_then_ties_away(rng: np.random.Generator) -> None:
    src = (rng.standard_normal(2048) * 1000).astype(np.float32)
    result = ascend_quant(src, 3.0, 0.5, mode="per_tensor", dst_dtype=HIFLOAT8)
    halves = np.array([half_steps(v, 3.0, 0.5) for v in src], np.float32)
    np.testing.assert_array_equal(result, encode_hifloat8(halves, saturate=True))
    assert result.dtype == np.uint8


FP4_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("rint", [2.0, 4.0, 6.0, -2.0, 0.0, 1.0, -6.0]),
        ("round", [3.0, 6.0, 6.0, -3.0, 0.5, 1.0, -6.0]),
        ("floor", [2.0, 4.0, 6.0, -3.0, 0.0, 1.0, -6.0]),
        ("ceil", [3.0, 6.0, 6.0, -2.0, 0.5, 1.5, -6.0]),
        ("trunc", [2.0, 4.0, 6.0, -2.0, 0.0, 1.0, -6.0]),
    ],
)
def test_fp4_round_modes_by_hand(mode: str, expected: list[float]) -> None:
    values = np.array([2.5, 5.0, 7.0, -2.5, 0.25, 1.2, -100.0])
    grid = round_to_grid(values, FP4_GRID, mode)
    assert grid.tolist() == expected
    src = values.reshape(1, 7).astype(np.float32)
    result = ascend_quant(
        src,
        np.ones((1, 1), np.float32),
        None,
        mode="per_group",
        group_size=32,
        dst_dtype=ml_dtypes.float4_e2m1fn,
        round_mode=mode,
    )
    assert result.astype(np.float64).ravel().tolist() == expected


def test_fp4_destinations_round_through_bfloat16_first() -> None:
    """The value is cast to bf16 (RINT) before the fp4 cast: 2.5000002 -> 2.5 -> RINT 2 (direct: 3); 2.498 ->
    2.5 -> ROUND 3 (direct: 2)."""
    ones = np.ones((1, 1), np.float32)
    above_tie = np.full((1, 32), np.nextafter(np.float32(2.5), np.float32(3)), np.float32)
    below_tie = np.full((1, 32), 2.498, np.float32)
    dst = ml_dtypes.float4_e2m1fn
    rint = ascend_quant(above_tie, ones, None, mode="per_group", group_size=32, dst_dtype=dst)
    assert set(rint.astype(np.float32).ravel().tolist()) == {2.0}
    away = ascend_quant(
        below_tie, ones, None, mode="per_group", group_size=32, dst_dtype=dst, round_mode="round"
    )
    assert set(away.astype(np.float32).ravel().tolist()) == {3.0}
    e1m2 = ascend_quant(
        np.full((1, 32), 0.3745, np.float32),
        ones,
        None,
        mode="per_group",
        group_size=32,
        dst_dtype=FLOAT4_E1M2,
        round_mode="round",
    )  # bf16(0.3745) = 0.375 -> ties away: 0.5
    assert set(decode_float4_e1m2(e1m2).ravel().tolist()) == {0.5}


def test_fp4_rint_grid_matches_ml_dtypes(rng: np.random.Generator) -> None:
    values = rng.uniform(-8, 8, 20000)
    values[:100] = np.repeat(FP4_GRID[:-1] + np.diff(FP4_GRID) / 2, 100 // 7 + 1)[:100]  # every tie
    expected = values.astype(np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
    np.testing.assert_array_equal(round_to_grid(values, FP4_GRID, "rint"), expected)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("rint", [0.0, 0.5, 0.5, 1.75, 1.75, -0.25, -0.0, 0.0, 1.0]),
        ("round", [0.25, 0.5, 0.75, 1.75, 1.75, -0.25, -0.25, 0.0, 1.0]),
        ("floor", [0.0, 0.25, 0.5, 1.75, 1.75, -0.25, -0.25, 0.0, 1.0]),
        ("ceil", [0.25, 0.5, 0.75, 1.75, 1.75, -0.0, -0.0, 0.0, 1.0]),
        ("trunc", [0.0, 0.25, 0.5, 1.75, 1.75, -0.0, -0.0, 0.0, 1.0]),
    ],
)
def test_float4_e1m2_by_hand(mode: str, expected: list[float]) -> None:
    """Grid 0, 0.25, ..., 1.75 (bias 1): ties at 0.125 / 0.375 / 0.625, saturation at 1.75, signed zero."""
    values = np.array([0.125, 0.375, 0.625, 1.9, 100.0, -0.2, -0.125, np.nan, 1.0], np.float32)
    codes = encode_float4_e1m2(values, mode)
    decoded = decode_float4_e1m2(codes)
    assert decoded.tolist() == expected
    assert np.signbit(decoded).tolist() == [np.signbit(v) for v in expected]
    src = values.reshape(1, 9)
    quantized = ascend_quant(
        src,
        np.ones((1, 1), np.float32),
        None,
        mode="per_group",
        group_size=32,
        dst_dtype=FLOAT4_E1M2,
        round_mode=mode,
    )
    np.testing.assert_array_equal(quantized.ravel(), codes)


@pytest.mark.engine
def test_float4_e1m2_matches_en_dtypes(rng: np.random.Generator) -> None:
    en_dtypes = require_module("en_dtypes")
    codes = np.arange(16, dtype=np.uint8)
    np.testing.assert_array_equal(
        decode_float4_e1m2(codes), codes.view(en_dtypes.float4_e1m2).astype(np.float32)
    )
    values = np.concatenate([rng.uniform(-2.5, 2.5, 20000), np.arange(-17, 17) * 0.125, [np.inf, -np.inf]])
    values = values.astype(np.float32)
    np.testing.assert_array_equal(
        encode_float4_e1m2(values), values.astype(en_dtypes.float4_e1m2).view(np.uint8)
    )


def test_unknown_destination_and_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="destination"):
        ascend_quant(np.zeros(32, np.float32), 1.0, 0.0, mode="per_tensor", dst_dtype=np.int16)
    with pytest.raises(ValueError, match="2-D"):
        ascend_quant(np.zeros(32, np.float32), np.ones(32), None, mode="per_token", dst_dtype=INT8)
    with pytest.raises(ValueError, match="one per row"):
        ascend_quant(np.zeros((4, 32), np.float32), np.ones(3), None, mode="per_token", dst_dtype=INT8)


def test_resident_float_parameters_are_clobbered_by_the_a2_per_channel_call(rng: np.random.Generator) -> None:
    """The A2/A3 T = float PER_CHANNEL form converts the scale tensor to half in place: the buffer's first
    half holds the halves' bits, so a second call reading it as float32 computes garbage."""
    scale = (np.arange(1, 33, dtype=np.float32) * 0.25).astype(np.float32)
    after = float_parameters_after_call(scale)
    np.testing.assert_array_equal(after[16:], scale[16:])  # beyond 2 n bytes: untouched
    np.testing.assert_array_equal(after[:16].view(np.float16), scale.astype(np.float16))
    src = (rng.standard_normal((4, 32)) * 50).astype(np.float32)
    first = ascend_quant(src, scale, 0.0, mode="per_channel", dst_dtype=INT8)
    second = ascend_quant(src, after, 0.0, mode="per_channel", dst_dtype=INT8)
    assert (first != second).mean() > 0.2


# --- parameters from ONNX ---------------------------------------------------------------------------------


def test_parameters_from_onnx() -> None:
    scale, offset = quant_parameters_from_onnx(np.array([0.5, 0.1], np.float32), np.array([3, -7]))
    assert scale.dtype == np.float32 and scale.tolist() == [2.0, np.float32(1.0) / np.float32(0.1)]
    assert offset.tolist() == [3.0, -7.0]
    half_scale, _ = quant_parameters_from_onnx(0.1, 0, src_dtype=np.float16)
    assert half_scale.dtype == np.float16 and float(half_scale) == 10.0
    with pytest.raises(ValueError, match="half's range"):
        quant_parameters_from_onnx(1e-6, 0)
    with pytest.raises(ValueError, match="positive"):
        quant_parameters_from_onnx(0.0, 0)
    anti_scale, anti_offset = antiquant_parameters_from_onnx(np.float32(0.25), np.array([5, -3]))
    assert float(anti_scale) == 0.25 and anti_offset.tolist() == [-5.0, 3.0]
    assert anti_offset.dtype == np.float16
    deq = dequant_scale_from_onnx(np.float32(0.02), np.array([0.005, 0.01], np.float32))
    assert deq.tolist() == (np.float32(0.02) * np.array([0.005, 0.01], np.float32)).tolist()
    assert unpack_deq_scale(dequant_scale_from_onnx(0.02, 0.005, packed=True)) == deq[0]


# --- predicted_mismatch against onnxruntime ---------------------------------------------------------------


def onnxruntime_quantize_per_axis(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """onnxruntime's QuantizeLinear (opset 21, axis 1, int8) on `x` [rows, channels]."""
    require_module("onnx")
    ort = require_module("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], axis=1)
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT8, list(x.shape))],
        [
            numpy_helper.from_array(scale.astype(np.float32), "s"),
            numpy_helper.from_array(zero_point.astype(INT8), "zp"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def random_scale_case(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Section 5.8's measurement: s log-uniform in [1e-3, 1e-1], zp in [-20, 20], x ~ N(0, (50 s)^2)."""
    channels, rows = 64, 3000
    scale = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), channels)).astype(np.float32)
    zero_point = rng.integers(-20, 21, channels)
    x = (rng.standard_normal((rows, channels)) * 50 * scale).astype(np.float32)
    api_scale, api_offset = quant_parameters_from_onnx(scale, zero_point)
    emulated = ascend_quant(x, api_scale, api_offset, mode="per_channel", dst_dtype=INT8)
    return {"x": x, "scale": scale, "zero_point": zero_point, "emulated": emulated}


@pytest.mark.engine
def test_predicted_mismatch_is_exactly_where_the_emulator_differs_from_onnxruntime(
    random_scale_case: dict[str, np.ndarray],
) -> None:
    case = random_scale_case
    reference = onnxruntime_quantize_per_axis(case["x"], case["scale"], case["zero_point"])
    differs = reference != case["emulated"]
    predicted = predicted_mismatch(case["x"], case["scale"], case["zero_point"])
    np.testing.assert_array_equal(predicted, differs)
    assert 0.012 < differs.mean() < 0.025  # section 5.8 measured 1.8 %
    assert np.abs(reference.astype(np.int16) - case["emulated"]).max() == 1  # never more than one step


def test_predicted_mismatch_matches_the_onnx_rule_in_every_round_mode(
    random_scale_case: dict[str, np.ndarray],
) -> None:
    case = random_scale_case
    params = UniformParams(
        scale=case["scale"],
        zero_point=case["zero_point"],
        storage_dtype=np.dtype(INT8),
        storage_type_min=-128,
        storage_type_max=127,
        quantized_dimension=1,
    )
    reference = quantize(case["x"], params)
    api_scale, api_offset = quant_parameters_from_onnx(case["scale"], case["zero_point"])
    for mode in ("round", "floor", "trunc"):
        emulated = ascend_quant(
            case["x"], api_scale, api_offset, mode="per_channel", dst_dtype=INT8, round_mode=mode
        )
        predicted = predicted_mismatch(case["x"], case["scale"], case["zero_point"], round_mode=mode)
        np.testing.assert_array_equal(predicted, reference != emulated)


@pytest.mark.engine
@pytest.mark.parametrize("scale_dtype", [np.float32, ml_dtypes.bfloat16])
def test_predicted_mismatch_for_the_950_per_token_form(scale_dtype: type, rng: np.random.Generator) -> None:
    """PER_TOKEN computes in the scale's type: float32 rarely differs from ONNX (divide vs multiply near
    ties), bfloat16 (8 significant bits) often; the prediction marks exactly those elements."""
    rows, columns = 256, 64
    scale = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), rows)).astype(np.float32)
    zero_point = rng.integers(-20, 21, rows)
    x = (rng.standard_normal((rows, columns)) * 50 * scale[:, None]).astype(np.float32)
    api_scale, api_offset = quant_parameters_from_onnx(scale, zero_point)
    emulated = ascend_quant(
        x, api_scale, api_offset, mode="per_token", dst_dtype=INT8, scale_dtype=scale_dtype
    )
    params = UniformParams(
        scale=scale,
        zero_point=zero_point,
        storage_dtype=np.dtype(INT8),
        storage_type_min=-128,
        storage_type_max=127,
        quantized_dimension=0,
    )
    differs = quantize(x, params) != emulated
    predicted = predicted_mismatch(x, scale[:, None], zero_point[:, None], compute_dtype=scale_dtype)
    np.testing.assert_array_equal(predicted, differs)
    assert differs.mean() < 0.001 if scale_dtype is np.float32 else differs.mean() > 0.05


def test_predicted_mismatch_on_sources_beyond_half_range() -> None:
    """The float -> half source cast saturates: 1e6 becomes 65504, times 1/1000 -> 65.5 -> 66, where ONNX
    saturates 1000 to 127. Both the emulator and the prediction say so."""
    x = np.array([1e6, -1e6, np.inf, 3.0e4], np.float32)
    scale = np.float32(1000.0)
    api_scale, api_offset = quant_parameters_from_onnx(scale, 0)
    emulated = ascend_quant(x, api_scale, api_offset, mode="per_tensor", dst_dtype=INT8)
    assert emulated.tolist() == [66, -66, 66, 30]
    params = UniformParams(
        scale=1000.0, zero_point=0, storage_dtype=np.dtype(INT8), storage_type_min=-128, storage_type_max=127
    )
    assert quantize(x, params).tolist() == [127, -128, 127, 30]
    assert predicted_mismatch(x, scale, 0).tolist() == [True, True, True, False]


def test_power_of_two_scales_on_half_inputs_are_exact(rng: np.random.Generator) -> None:
    """An exact reciprocal, half-representable inputs and zp 0: nothing is rounded before the final RINT."""
    channels = 64
    scale = np.exp2(rng.integers(-10, -2, channels)).astype(np.float32)
    zero_point = np.zeros(channels, np.int64)
    x = (rng.uniform(-140, 140, (2000, channels)) * scale).astype(np.float16).astype(np.float32)
    x[0] = (np.arange(channels) - 31.5).astype(np.float32) * scale  # exact ties
    api_scale, api_offset = quant_parameters_from_onnx(scale, zero_point)
    emulated = ascend_quant(x, api_scale, api_offset, mode="per_channel", dst_dtype=INT8)
    np.testing.assert_array_equal(emulated, onnxruntime_quantize_per_axis(x, scale, zero_point))
    assert not predicted_mismatch(x, scale, zero_point).any()


# --- AscendDequant ----------------------------------------------------------------------------------------


def test_dequant_per_channel_float32_and_packed_scales(rng: np.random.Generator) -> None:
    rows, columns = 4, 64
    acc = rng.integers(-(2**30), 2**30, (rows, columns), dtype=np.int32)
    acc[0, 0] = 2**24 + 1  # not a float32: rounds to even, 2**24
    deq = rng.uniform(1e-5, 1e-3, columns).astype(np.float32)
    deq[0] = 1.0
    result = ascend_dequant(acc, deq, mode="per_channel")
    expected = acc.astype(np.float32) * deq
    np.testing.assert_array_equal(result, expected)
    assert result[0, 0] == np.float32(2**24)
    packed = pack_deq_scale(deq, control_bits=0xABCD1234)
    assert packed.dtype == np.uint64 and int(packed[1]) >> 32 == 0xABCD1234
    np.testing.assert_array_equal(unpack_deq_scale(packed), deq)
    np.testing.assert_array_equal(ascend_dequant(acc, packed, mode="per_channel"), expected)
    as_half = ascend_dequant(
        acc[:, :32] // 65536, packed, mode="per_channel", dst_dtype=np.float16, cal_count=16
    )
    assert as_half.shape == (rows, 16) and as_half.dtype == np.float16
    np.testing.assert_array_equal(
        as_half, ((acc[:, :16] // 65536).astype(np.float32) * deq[:16]).astype(np.float16)
    )
    with pytest.raises(ValueError, match="calCount"):
        ascend_dequant(acc, deq, mode="per_channel", cal_count=65)


def test_dequant_float32_result_has_no_negative_zero() -> None:
    acc = np.array([[0, -5, 7, 0, 0, 0, 0, 0]], np.int32)
    result = ascend_dequant(acc, np.float32(-0.5), mode="per_tensor")
    assert result.tolist() == [[0.0, 2.5, -3.5, 0.0, 0.0, 0.0, 0.0, 0.0]]
    assert not np.signbit(result[0, 0])  # 0 * -0.5 = -0, copied out by Adds(x, 0) as +0


def test_dequant_per_tensor_and_per_token_to_bfloat16(rng: np.random.Generator) -> None:
    acc = rng.integers(-50000, 50000, (8, 32), dtype=np.int32)
    per_tensor = ascend_dequant(acc, np.float32(0.0123), mode="per_tensor", dst_dtype=ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        per_tensor, (acc.astype(np.float32) * np.float32(0.0123)).astype(ml_dtypes.bfloat16)
    )
    token = rng.uniform(0.001, 0.01, 8).astype(np.float32)
    per_token = ascend_dequant(acc, token, mode="per_token")
    np.testing.assert_array_equal(per_token, acc.astype(np.float32) * token[:, None])


# --- AscendAntiQuant --------------------------------------------------------------------------------------


def test_antiquant_half_per_channel_step_by_step(rng: np.random.Generator) -> None:
    k, n = 64, 32
    weight = rng.integers(-128, 128, (k, n)).astype(INT8)
    scale = rng.uniform(0.001, 0.05, n).astype(np.float16)
    offset = -rng.integers(-10, 10, n).astype(np.float16)
    result = ascend_antiquant(weight, scale, offset, mode="per_channel")
    assert result.dtype == np.float16
    for i in range(k):
        for j in range(n):
            assert result[i, j] == np.float16(np.float16(np.float16(weight[i, j]) + offset[j]) * scale[j])
    transposed = ascend_antiquant(
        weight.T.copy(), scale.reshape(n, 1), offset.reshape(n, 1), mode="per_channel", is_transpose=True
    )
    np.testing.assert_array_equal(transposed, result.T)


def test_antiquant_groups_along_k() -> None:
    weight = np.arange(-64, 64, dtype=INT8).reshape(8, 16)
    scale = np.array([[0.5] * 16, [2.0] * 16], np.float16)  # G = 8 / 2 = 4 rows per group
    offset = np.array([[1.0] * 16, [-1.0] * 16], np.float16)
    result = ascend_antiquant(weight, scale, offset, mode="per_channel")
    np.testing.assert_array_equal(result[:4], ((weight[:4].astype(np.float32) + 1) * 0.5).astype(np.float16))
    np.testing.assert_array_equal(result[4:], ((weight[4:].astype(np.float32) - 1) * 2.0).astype(np.float16))


def test_antiquant_bfloat16_goes_through_float32(rng: np.random.Generator) -> None:
    weight = rng.integers(-128, 128, (32, 32)).astype(INT8)
    scale = rng.uniform(0.001, 0.05, 32).astype(ml_dtypes.bfloat16)
    offset = rng.integers(-5, 5, 32).astype(ml_dtypes.bfloat16)
    result = ascend_antiquant(weight, scale, offset, mode="per_channel", dst_dtype=ml_dtypes.bfloat16)
    sum32 = weight.astype(np.float32) + offset.astype(np.float32)
    np.testing.assert_array_equal(result, (sum32 * scale.astype(np.float32)).astype(ml_dtypes.bfloat16))


def test_antiquant_int4_and_per_tensor() -> None:
    weight = np.arange(-8, 8).astype(ml_dtypes.int4).reshape(1, 16)
    result = ascend_antiquant(weight, np.float16(0.1), np.float16(2.0), mode="per_tensor")
    expected = [np.float16(np.float16(v + 2.0) * np.float16(0.1)) for v in range(-8, 8)]
    assert result.ravel().tolist() == [float(v) for v in expected]


def test_antiquant_fp4_per_group_with_e8m0_scales() -> None:
    """Weight [K, N] = [64, 2], groups of 32 along K: scale [2, 2] as e8m0 (2**(e-127)); one product in the
    output type. Transposed ([N, K], scale [N, 2]) gives the transpose."""
    column = np.tile(FP4_GRID, 8)  # 64 values of K
    weight = np.stack([column, -column], axis=1).astype(ml_dtypes.float4_e2m1fn)
    exponents = np.array([[-3, 5], [14, -130]], np.float64)  # 2**-130 is below e8m0's 2**-127: use 0x00
    scale = np.exp2(np.maximum(exponents, -127)).astype(ml_dtypes.float8_e8m0fnu)
    assert scale.view(np.uint8)[1, 1] == 0  # the 0x00 code, 2**-127
    expected_scale = np.repeat(np.exp2(np.maximum(exponents, -127)), 32, axis=0)
    values = weight.astype(np.float64)
    as_bf16 = ascend_antiquant(
        weight, scale, None, mode="per_group", group_size=32, dst_dtype=ml_dtypes.bfloat16
    )
    np.testing.assert_array_equal(as_bf16.astype(np.float64), values * expected_scale)  # exact in bf16
    as_half = ascend_antiquant(weight, scale, None, mode="per_group", group_size=32, dst_dtype=np.float16)
    # half: 2**14 * 6 = 98304 overflows to Inf; 2**-127 flushes to 0 when converted to half.
    half_scale = np.where(expected_scale < 2.0**-25, 0.0, expected_scale)
    with np.errstate(over="ignore"):
        expected_half = (values * half_scale).astype(np.float16)
    np.testing.assert_array_equal(as_half, expected_half)
    transposed = ascend_antiquant(
        weight.T.copy(),
        scale.T.copy(),
        None,
        mode="per_group",
        group_size=32,
        dst_dtype=ml_dtypes.bfloat16,
        is_transpose=True,
    )
    np.testing.assert_array_equal(transposed, as_bf16.T)
    with pytest.raises(ValueError, match="groups of 16"):
        ascend_antiquant(weight, scale, None, mode="per_group", group_size=16)


def test_antiquant_float4_e1m2_weights() -> None:
    codes = np.tile(np.arange(16, dtype=np.uint8), 4).reshape(32, 2)  # K = 32, N = 2
    scale = np.array([[2.0**-2, 2.0**3]], np.float32).astype(ml_dtypes.float8_e8m0fnu)
    result = ascend_antiquant(
        codes,
        scale,
        None,
        mode="per_group",
        group_size=32,
        dst_dtype=ml_dtypes.bfloat16,
        weight_dtype=FLOAT4_E1M2,
    )
    expected = decode_float4_e1m2(codes).astype(np.float64) * np.array([[2.0**-2, 2.0**3]])
    np.testing.assert_array_equal(result.astype(np.float64), expected)


def test_antiquant_per_token_in_float32() -> None:
    weight = np.arange(-64, 64, dtype=INT8).reshape(4, 32)
    scale = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    offset = np.array([1.0, -1.0, 0.5, 0.0], np.float32)
    result = ascend_antiquant(weight, scale, offset, mode="per_token", dst_dtype=ml_dtypes.bfloat16)
    expected = ((weight.astype(np.float32) + offset[:, None]) * scale[:, None]).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(result, expected)


def test_antiquant_hifloat8_weights() -> None:
    codes = np.arange(0, 128, dtype=np.uint8)[8:40].reshape(1, 32)  # D0 .. D2 codes
    result = ascend_antiquant(
        codes, np.float16(0.5), np.float16(1.0), mode="per_tensor", weight_dtype=HIFLOAT8
    )
    from qconvert.numerics.hifloat8 import decode_hifloat8

    expected = ((decode_hifloat8(codes) + np.float32(1.0)) * np.float32(0.5)).astype(np.float16)
    np.testing.assert_array_equal(result, expected)
