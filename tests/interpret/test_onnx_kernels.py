"""The interpreter's own kernels for generic `onnx.*` ops (qconvert/onnx_kernels.py) against onnxruntime.

Each case is a one-node ONNX model on seeded random inputs, lifted and run by `qconvert.interpret`, and
run by onnxruntime (graph optimizations off). Integer ops (ConvInteger, MatMulInteger) and MaxPool must be
bit-exact. Float ops must agree within a float32 bound: two float32 sums of n terms each differ from the
exact sum by at most `n u S` (u = 2**-24, S = the sum of the terms' magnitudes, which onnxruntime itself
computes on |inputs|), so `|ours - ort| <= 2 (n + 1) u S`. BatchNormalization with a legacy `momentum`
attribute is the case onnx's reference implementation gets wrong; its test asserts that the reference
differs, so the test fails if the interpreter falls back to it.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import ONNX_KERNELS, Interpreter
from qconvert.numerics.integer_accumulation import exact_integer_matmul, float64_is_exact

UNIT_ROUNDOFF = 2.0**-24
RNG_SEED = 20261205


def one_node_model(
    op_type: str,
    feeds: dict[str, np.ndarray | None],
    attributes: dict[str, object] | None = None,
    opset: int = 17,
    outputs: int = 1,
) -> onnx.ModelProto:
    output_names = [f"y{i}" for i in range(outputs)]
    # a None feed is an absent optional input (its name left empty)
    input_names = [name if array is not None else "" for name, array in feeds.items()]
    node = helper.make_node(op_type, input_names, output_names, **(attributes or {}))
    graph = helper.make_graph(
        [node],
        op_type.lower(),
        [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
            for name, array in feeds.items()
            if array is not None
        ],
        [onnx.ValueInfoProto(name=name) for name in output_names],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    feeds = {name: array for name, array in feeds.items() if array is not None}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(value) for value in session.run(None, feeds)]


def run_interpreter(model: onnx.ModelProto, feeds: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    present = {name: array for name, array in feeds.items() if array is not None}
    return list(Interpreter(import_onnx(model)).run(present).values())


def assert_within_sum_bound(
    ours: np.ndarray, reference: np.ndarray, magnitude: np.ndarray, terms: int, what: str
) -> None:
    assert ours.shape == reference.shape and ours.dtype == reference.dtype, (
        what,
        ours.shape,
        reference.shape,
    )
    bound = 2 * (terms + 1) * UNIT_ROUNDOFF * magnitude.astype(np.float64) + 1e-30
    error = np.abs(ours.astype(np.float64) - reference.astype(np.float64))
    worst = int(np.argmax(error - bound))
    assert np.all(error <= bound), (
        f"{what}: |ours - onnxruntime| = {error.flat[worst]:.3g} > bound {bound.flat[worst]:.3g}"
    )


def uniform(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(np.float32)


def integers(rng: np.random.Generator, dtype: type, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.asarray(rng.integers(info.min, info.max + 1, shape), dtype)


# Conv ------------------------------------------------------------------------------------------------
CONV_CASES = {
    "pads_strides_dilations": (
        (2, 4, 11, 10),
        (6, 4, 3, 3),
        {"pads": [1, 2, 0, 1], "strides": [2, 1], "dilations": [1, 2]},
    ),
    "group_2": ((1, 6, 9, 9), (4, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": ((2, 8, 7, 9), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "depthwise_multiplier_2": ((1, 4, 8, 8), (8, 1, 3, 3), {"group": 4}),
    "same_upper_stride_2": ((1, 3, 10, 11), (5, 3, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "same_lower_stride_2": ((1, 3, 10, 11), (5, 3, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    "valid": ((1, 3, 8, 8), (2, 3, 5, 2), {"auto_pad": "VALID"}),
    "conv1d_tts": ((1, 16, 40), (16, 16, 5), {"pads": [2, 2]}),
    "conv1d_dilated_group": ((2, 8, 33), (8, 2, 3), {"dilations": [4], "group": 4, "pads": [4, 4]}),
    "conv3d": ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 2]}),
    "pointwise": ((3, 16, 5, 5), (12, 16, 1, 1), {}),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_matches_onnxruntime_within_float32_bound(case: str, with_bias: bool) -> None:
    rng = np.random.default_rng(RNG_SEED)
    x_shape, w_shape, attributes = CONV_CASES[case]
    feeds = {"x": uniform(rng, *x_shape), "w": uniform(rng, *w_shape)}
    if with_bias:
        feeds["b"] = uniform(rng, w_shape[0])
    model = one_node_model("Conv", feeds, attributes)
    reference = run_onnxruntime(model, feeds)[0]
    magnitude = run_onnxruntime(model, {k: np.abs(v) for k, v in feeds.items()})[0]
    terms = math.prod(w_shape[1:])
    assert_within_sum_bound(run_interpreter(model, feeds)[0], reference, magnitude, terms, f"Conv {case}")


def test_conv_kernel_is_registered_and_used() -> None:
    assert "onnx.Conv" in ONNX_KERNELS and "onnx.BatchNormalization" in ONNX_KERNELS


# ConvInteger -----------------------------------------------------------------------------------------
CONV_INTEGER_CASES = {
    "pads_strides": ((1, 3, 9, 8), (4, 3, 3, 3), {"pads": [1, 1, 0, 2], "strides": [2, 1]}),
    "dilations_group": ((2, 4, 9, 9), (6, 2, 2, 3), {"dilations": [2, 1], "group": 2}),
    "same_lower": ((1, 2, 7, 8), (3, 2, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    "same_upper_1d": ((1, 8, 30), (8, 8, 4), {"auto_pad": "SAME_UPPER"}),
    "depthwise": ((1, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("case", sorted(CONV_INTEGER_CASES))
@pytest.mark.parametrize("types", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_conv_integer_is_bit_exact_with_onnxruntime(case: str, types: tuple[type, type]) -> None:
    rng = np.random.default_rng(RNG_SEED)
    x_shape, w_shape, attributes = CONV_INTEGER_CASES[case]
    x_type, w_type = types
    feeds = {
        "x": integers(rng, x_type, *x_shape),
        "w": integers(rng, w_type, *w_shape),
        "x_zero_point": integers(rng, x_type),
        "w_zero_point": integers(rng, w_type),
    }
    model = one_node_model("ConvInteger", feeds, attributes)
    ours = run_interpreter(model, feeds)[0]
    reference = run_onnxruntime(model, feeds)[0]
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, reference)


def test_conv_integer_per_channel_weight_zero_point_matches_onnxruntime_channel_by_channel() -> None:
    """onnxruntime takes only a per-tensor w_zero_point: each output channel is run alone with its own."""
    rng = np.random.default_rng(RNG_SEED)
    attributes = {"pads": [1, 0, 1, 2], "strides": [1, 2]}
    x = integers(rng, np.uint8, 2, 3, 7, 9)
    w = integers(rng, np.uint8, 5, 3, 3, 3)
    x_zero, w_zero = integers(rng, np.uint8), integers(rng, np.uint8, 5)
    feeds = {"x": x, "w": w, "x_zero_point": x_zero, "w_zero_point": w_zero}
    ours = run_interpreter(one_node_model("ConvInteger", feeds, attributes), feeds)[0]
    for channel in range(5):
        alone = {
            "x": x,
            "w": w[channel : channel + 1],
            "x_zero_point": x_zero,
            "w_zero_point": w_zero[channel : channel + 1],
        }
        reference = run_onnxruntime(one_node_model("ConvInteger", alone, attributes), alone)[0]
        np.testing.assert_array_equal(ours[:, channel : channel + 1], reference, err_msg=f"channel {channel}")


def test_conv_integer_wraps_like_onnxruntime_int32_accumulator() -> None:
    """1x1 kernel over 40,000 channels of +-255 * +-255: sums beyond int32 wrap as onnxruntime's do."""
    channels = 40_000
    x = np.full((1, channels, 1, 2), 255, np.uint8)
    x[0, :, 0, 1] = 0
    w = np.full((1, channels, 1, 1), 255, np.uint8)
    feeds = {"x": x, "w": w, "x_zero_point": np.array(0, np.uint8), "w_zero_point": np.array(0, np.uint8)}
    model = one_node_model("ConvInteger", feeds)
    ours = run_interpreter(model, feeds)[0]
    assert 255 * 255 * channels > 2**31  # the first output position overflows int32
    np.testing.assert_array_equal(ours, run_onnxruntime(model, feeds)[0])


# MatMulInteger ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "types", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.uint8), (np.int8, np.int8)]
)
@pytest.mark.parametrize(
    "shapes", [((7, 33), (33, 5)), ((2, 3, 6, 17), (17, 9)), ((2, 4, 10), (2, 10, 3)), ((17,), (17, 4))]
)
def test_matmul_integer_is_bit_exact_with_onnxruntime(
    types: tuple[type, type], shapes: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    rng = np.random.default_rng(RNG_SEED)
    a_type, b_type = types
    feeds = {
        "a": integers(rng, a_type, *shapes[0]),
        "b": integers(rng, b_type, *shapes[1]),
        "a_zero_point": integers(rng, a_type),
        "b_zero_point": integers(rng, b_type),
    }
    model = one_node_model("MatMulInteger", feeds)
    ours = run_interpreter(model, feeds)[0]
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, run_onnxruntime(model, feeds)[0])


def test_matmul_integer_per_column_b_zero_point_is_bit_exact_with_onnxruntime() -> None:
    rng = np.random.default_rng(RNG_SEED)
    feeds = {
        "a": integers(rng, np.uint8, 2, 5, 12),
        "b": integers(rng, np.int8, 12, 6),
        "a_zero_point": integers(rng, np.uint8),
        "b_zero_point": integers(rng, np.int8, 6),
    }
    model = one_node_model("MatMulInteger", feeds)
    np.testing.assert_array_equal(run_interpreter(model, feeds)[0], run_onnxruntime(model, feeds)[0])


def test_matmul_integer_per_row_a_zero_point_matches_onnxruntime_row_by_row() -> None:
    """The spec allows one a_zero_point per row; onnxruntime takes a scalar: each row runs alone."""
    rng = np.random.default_rng(RNG_SEED)
    a, b = integers(rng, np.uint8, 4, 9), integers(rng, np.uint8, 9, 3)
    a_zero, b_zero = integers(rng, np.uint8, 4), integers(rng, np.uint8)
    feeds = {"a": a, "b": b, "a_zero_point": a_zero, "b_zero_point": b_zero}
    ours = run_interpreter(one_node_model("MatMulInteger", feeds), feeds)[0]
    for row in range(4):
        alone = {"a": a[row : row + 1], "b": b, "a_zero_point": a_zero[row : row + 1], "b_zero_point": b_zero}
        reference = run_onnxruntime(one_node_model("MatMulInteger", alone), alone)[0]
        np.testing.assert_array_equal(ours[row : row + 1], reference, err_msg=f"row {row}")


def test_exact_integer_matmul_takes_int64_past_the_float64_bound() -> None:
    """Operands whose float64 sums could round: the int64 path, equal to Python's exact integers."""
    rng = np.random.default_rng(RNG_SEED)
    a = rng.integers(-(2**40), 2**40, (3, 4), dtype=np.int64)
    b = rng.integers(-(2**20), 2**20, (4, 2), dtype=np.int64)
    assert not float64_is_exact(2**40, 2**20, 4)
    exact = np.array(
        [[sum(int(a[i, k]) * int(b[k, j]) for k in range(4)) for j in range(2)] for i in range(3)]
    )
    np.testing.assert_array_equal(exact_integer_matmul(a, b), exact)


# BatchNormalization ----------------------------------------------------------------------------------
def batch_norm_feeds(rng: np.random.Generator, x_shape: tuple[int, ...], spatial: bool = True) -> dict:
    parameter_shape = (x_shape[1],) if spatial else x_shape[1:]
    return {
        "x": rng.normal(0.5, 2.0, x_shape).astype(np.float32),
        "scale": rng.uniform(0.5, 2.0, parameter_shape).astype(np.float32),
        "bias": uniform(rng, *parameter_shape),
        "mean": uniform(rng, *parameter_shape),
        "var": rng.uniform(0.2, 3.0, parameter_shape).astype(np.float32),
    }


def batch_norm_magnitude(feeds: dict[str, np.ndarray], spatial: bool = True) -> np.ndarray:
    """`|x a| + |mean a| + |bias|` with `a = scale / sqrt(var + eps)`: what the float32 terms sum to."""

    def shaped(values: np.ndarray) -> np.ndarray:
        if not spatial:
            return values[None].astype(np.float64)
        return values.reshape(1, -1, *[1] * (feeds["x"].ndim - 2)).astype(np.float64)

    multiplier = shaped(feeds["scale"]) / np.sqrt(shaped(feeds["var"]) + 1e-5)
    x = feeds["x"].astype(np.float64)
    return np.abs(x * multiplier) + np.abs(shaped(feeds["mean"]) * multiplier) + np.abs(shaped(feeds["bias"]))


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("x_shape", [(2, 3, 4, 5), (4, 6), (1, 2, 3, 2, 2)])
def test_batch_normalization_with_legacy_momentum_runs_inference_like_onnxruntime(
    opset: int, x_shape: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(RNG_SEED)
    feeds = batch_norm_feeds(rng, x_shape)
    attributes = {"epsilon": 1e-5, "momentum": 0.9}  # older exporters write momentum for inference too
    model = one_node_model("BatchNormalization", feeds, attributes, opset=opset)
    reference = run_onnxruntime(model, feeds)[0]
    ours = run_interpreter(model, feeds)[0]
    assert_within_sum_bound(ours, reference, batch_norm_magnitude(feeds), 3, f"BN opset {opset}")
    if opset < 14:  # the reference takes the training path: the old interpreter failed this test
        module = import_onnx(model)
        op = next(op for op in module.walk() if op.name == "onnx.BatchNormalization")  # type: ignore[attr-defined]
        try:
            old = Interpreter(module).run_reference(op, [feeds[name] for name in feeds])[0]
        except InputError:  # opset 7-8: BatchNormalization_6's training path returns a tuple and fails
            return
        assert np.max(np.abs(old - reference)) > 1e-3, "onnx's reference no longer takes the training path"


def test_batch_normalization_opset_7_non_spatial_matches_onnxruntime() -> None:
    rng = np.random.default_rng(RNG_SEED)
    feeds = batch_norm_feeds(rng, (2, 3, 4, 5), spatial=False)
    model = one_node_model("BatchNormalization", feeds, {"spatial": 0, "momentum": 0.9}, opset=7)
    ours = run_interpreter(model, feeds)[0]
    reference = run_onnxruntime(model, feeds)[0]
    assert_within_sum_bound(ours, reference, batch_norm_magnitude(feeds, spatial=False), 3, "BN spatial=0")


@pytest.mark.parametrize(
    ("opset", "attributes", "outputs"), [(9, {"momentum": 0.8}, 5), (15, {"training_mode": 1}, 3)]
)
def test_batch_normalization_training_outputs_match_onnxruntime(
    opset: int, attributes: dict[str, object], outputs: int
) -> None:
    """Training mode (5 outputs before opset 14, training_mode = 1 after): batch statistics, running
    statistics by momentum, and onnxruntime's saved_var (the inverse standard deviation)."""
    rng = np.random.default_rng(RNG_SEED)
    feeds = batch_norm_feeds(rng, (3, 4, 5, 6))
    model = one_node_model("BatchNormalization", feeds, attributes, opset=opset, outputs=outputs)
    ours = run_interpreter(model, feeds)
    reference = run_onnxruntime(model, feeds)
    assert len(ours) == len(reference) == outputs
    for index, (mine, theirs) in enumerate(zip(ours, reference)):
        assert mine.shape == theirs.shape
        # the batch mean and variance sum 90 values: relative 2 * 91 u of their magnitudes, times a few
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5, err_msg=f"output {index}")


# Pools -----------------------------------------------------------------------------------------------
POOL_CASES = {
    "pads_strides": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    "ceil_mode": {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1},
    "ceil_mode_pads": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1},
    "count_include_pad": {"kernel_shape": [3, 3], "pads": [1, 2, 1, 0], "count_include_pad": 1},
    "count_include_pad_ceil": {
        "kernel_shape": [2, 3],
        "strides": [2, 2],
        "pads": [1, 1, 0, 0],
        "count_include_pad": 1,
        "ceil_mode": 1,
    },
    "dilations": {"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 1, 1]},
    # ceil mode's last window would start in the end padding: onnxruntime drops it (5 -> 4 per axis)
    "ceil_mode_end_pads": {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 2, 2], "ceil_mode": 1},
    "same_upper": {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    "same_lower": {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_max_pool_is_bit_exact_with_onnxruntime(case: str) -> None:
    rng = np.random.default_rng(RNG_SEED)
    feeds = {"x": uniform(rng, 2, 3, 11, 10)}
    attributes = {k: v for k, v in POOL_CASES[case].items() if k != "count_include_pad"}
    model = one_node_model("MaxPool", feeds, attributes, opset=19)
    np.testing.assert_array_equal(run_interpreter(model, feeds)[0], run_onnxruntime(model, feeds)[0])


def test_max_pool_of_uint8_is_bit_exact_with_onnxruntime() -> None:
    rng = np.random.default_rng(RNG_SEED)
    feeds = {"x": integers(rng, np.uint8, 1, 2, 9, 9)}
    model = one_node_model("MaxPool", feeds, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=12)
    np.testing.assert_array_equal(run_interpreter(model, feeds)[0], run_onnxruntime(model, feeds)[0])


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_average_pool_matches_onnxruntime_within_float32_bound(case: str) -> None:
    rng = np.random.default_rng(RNG_SEED)
    feeds = {"x": uniform(rng, 2, 3, 11, 10)}
    attributes = POOL_CASES[case]
    opset = 19 if "dilations" in attributes else 17
    model = one_node_model("AveragePool", feeds, attributes, opset=opset)
    reference = run_onnxruntime(model, feeds)[0]
    magnitude = run_onnxruntime(model, {"x": np.abs(feeds["x"])})[0]
    terms = math.prod(attributes["kernel_shape"])  # type: ignore[arg-type]
    ours = run_interpreter(model, feeds)[0]
    assert_within_sum_bound(ours, reference, magnitude, terms, f"AveragePool {case}")


# ConvTranspose ---------------------------------------------------------------------------------------
CONV_TRANSPOSE_CASES = {
    "strides_pads": ((1, 4, 5, 6), (4, 3, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "output_padding": ((2, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 3], "output_padding": [1, 2]}),
    "group_dilations": ((1, 4, 5, 5), (4, 2, 3, 2), {"group": 2, "dilations": [2, 1], "pads": [0, 1, 2, 0]}),
    "conv_transpose_1d_vocoder": ((1, 8, 20), (8, 4, 16), {"strides": [8], "pads": [4, 4]}),
    "auto_pad_same_upper": ((1, 2, 5, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "output_shape": ((1, 2, 4, 4), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 10]}),
}


@pytest.mark.parametrize("case", sorted(CONV_TRANSPOSE_CASES))
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_transpose_matches_onnxruntime_within_float32_bound(case: str, with_bias: bool) -> None:
    rng = np.random.default_rng(RNG_SEED)
    x_shape, w_shape, attributes = CONV_TRANSPOSE_CASES[case]
    feeds = {"x": uniform(rng, *x_shape), "w": uniform(rng, *w_shape)}
    if with_bias:
        feeds["b"] = uniform(rng, w_shape[1] * int(attributes.get("group", 1)))  # type: ignore[call-overload]
    model = one_node_model("ConvTranspose", feeds, attributes)
    reference = run_onnxruntime(model, feeds)[0]
    magnitude = run_onnxruntime(model, {k: np.abs(v) for k, v in feeds.items()})[0]
    terms = w_shape[0] * math.prod(w_shape[2:])
    ours = run_interpreter(model, feeds)[0]
    assert_within_sum_bound(ours, reference, magnitude, terms, f"ConvTranspose {case}")


# Erf, Gelu -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attributes", [{}, {"approximate": "tanh"}])
def test_gelu_matches_onnxruntime_within_a_few_ulps(attributes: dict[str, object]) -> None:
    op_type, opset = "Gelu", 20
    rng = np.random.default_rng(RNG_SEED)
    feeds = {"x": (rng.standard_normal((4, 1000)) * 3).astype(np.float32)}
    model = one_node_model(op_type, feeds, attributes, opset=opset)
    ours = run_interpreter(model, feeds)[0]
    reference = run_onnxruntime(model, feeds)[0]
    # onnxruntime evaluates in float32: Gelu's `0.5 x (1 + t)` cancels for negative x, so its error is a
    # few u of |x| (the terms' magnitude), not of the result; Erf's is a few u of the result
    magnitude = np.abs(reference) + (np.abs(feeds["x"]) if op_type == "Gelu" else 0)
    assert_within_sum_bound(ours, reference, magnitude, 3, op_type)


# Whole model -----------------------------------------------------------------------------------------
def test_whole_model_with_conv_batch_norm_pools_matches_onnxruntime_and_keeps_reused_outputs() -> None:
    """A CNN block from an older exporter (BN with momentum) through `Interpreter.run`; a graph output
    that a later node also reads, and a graph input returned as an output, survive the freeing of dead
    values."""
    rng = np.random.default_rng(RNG_SEED)
    x = uniform(rng, 2, 3, 12, 12)
    weights = {
        "w": uniform(rng, 8, 3, 3, 3),
        "scale": rng.uniform(0.5, 2, 8).astype(np.float32),
        "bias": uniform(rng, 8),
        "mean": uniform(rng, 8),
        "var": rng.uniform(0.5, 2, 8).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["conv", "scale", "bias", "mean", "var"], ["bn"], momentum=0.9, epsilon=1e-5
        ),
        helper.make_node("Relu", ["bn"], ["relu"]),
        helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["pool"], ["avg"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["avg", "pool"], ["sum"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [onnx.ValueInfoProto(name=name) for name in ("pool", "sum", "x")],
        [onnx.numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 8
    ours = Interpreter(import_onnx(model)).run({"x": x})
    reference = run_onnxruntime(model, {"x": x})
    assert list(ours) == ["pool", "sum", "x"]
    np.testing.assert_array_equal(ours["x"], x)
    for name, theirs in zip(("pool", "sum"), reference[:2]):
        # a 27-term convolution and a 3-term normalization of values below ~10: 1e-4 is far above it
        np.testing.assert_allclose(ours[name], theirs, rtol=1e-4, atol=1e-4, err_msg=name)


# Resize ----------------------------------------------------------------------------------------------
RESIZE_CASES = {
    "nearest_asymmetric_floor_x2": (
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        [1, 1, 2, 2],
        None,
    ),
    "nearest_half_pixel_round_prefer_ceil": (
        {"mode": "nearest", "nearest_mode": "round_prefer_ceil"},
        [1, 1, 1.7, 0.6],
        None,
    ),
    "nearest_sizes_default": ({"mode": "nearest"}, None, [2, 3, 13, 5]),
    "linear_pytorch_half_pixel_sizes": (
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
        None,
        [2, 3, 17, 23],
    ),
    "linear_half_pixel_x2": ({"mode": "linear"}, [1, 1, 2, 2], None),
    "linear_align_corners_down": (
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        [1, 1, 0.6, 0.8],
        None,
    ),
    "linear_asymmetric_width_only": (
        {"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
        [1, 1, 1, 1.5],
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(RESIZE_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_resize_is_bit_exact_with_onnxruntime(case: str, dtype: type) -> None:
    """Nearest and bilinear Resize, float32 and the uint8 Resize of QOperator models (whose truncation the
    reference does not reproduce), in onnxruntime's float32 arithmetic: bit-exact."""
    rng = np.random.default_rng(RNG_SEED)
    attributes, scales, sizes = RESIZE_CASES[case]
    x = integers(rng, np.uint8, 2, 3, 9, 10) if dtype == np.uint8 else uniform(rng, 2, 3, 9, 10)
    feeds: dict[str, np.ndarray | None] = {"x": x, "roi": None}  # absent roi and scales, as torch exports
    feeds["scales"] = None if scales is None else np.array(scales, np.float32)
    if sizes is not None:
        feeds["sizes"] = np.array(sizes, np.int64)
    model = one_node_model("Resize", feeds, attributes, opset=13)
    np.testing.assert_array_equal(run_interpreter(model, feeds)[0], run_onnxruntime(model, feeds)[0])


# GatherElements --------------------------------------------------------------------------------------
def test_gather_elements_on_a_long_axis_with_negative_indices_matches_onnxruntime() -> None:
    """BERT's token-type buffer: 512 positions on the gathered axis (the reference's np.choose takes
    at most 32), indices shorter than the data off the axis, some negative."""
    rng = np.random.default_rng(RNG_SEED)
    feeds = {
        "data": rng.integers(0, 2, (3, 512), dtype=np.int64),
        "indices": rng.integers(-512, 512, (2, 16), dtype=np.int64),
    }
    model = one_node_model("GatherElements", feeds, {"axis": 1}, opset=13)
    np.testing.assert_array_equal(run_interpreter(model, feeds)[0], run_onnxruntime(model, feeds)[0])


# Tanh, Sigmoid ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("op_type", ["Tanh", "Sigmoid", "Erf"])
def test_tanh_sigmoid_and_erf_are_bit_exact_with_onnxruntime(op_type: str) -> None:
    """Bit for bit (MLAS's polynomials): an ulp of difference feeding DynamicQuantizeLinear flips roundings
    that cascade through a dynamically quantized model (see test_dynamic_conv_tanh_stack_is_exact)."""
    rng = np.random.default_rng(RNG_SEED)
    values = np.concatenate([rng.standard_normal(50_000) * 4, rng.uniform(-30, 30, 10_000)])
    specials = [0.0, -0.0, 1e-30, -1e-30, 5e-39, 0.921875, -0.921875, 3.725, 3.9, 9.0, -9.0, 18.0, -18.0]
    specials += [1e30, -1e30, np.inf, -np.inf, np.nan]
    feeds = {"x": np.concatenate([values, specials]).astype(np.float32)}
    model = one_node_model(op_type, feeds, opset=13)
    np.testing.assert_array_equal(run_interpreter(model, feeds)[0], run_onnxruntime(model, feeds)[0])


def test_dynamic_conv_tanh_stack_is_exact_end_to_end() -> None:
    """Eight Conv1d-Tanh residual layers quantized by onnxruntime's quantize_dynamic (DynamicQuantizeLinear
    + ConvInteger per layer, the shape of a TTS encoder): the interpreter equals onnxruntime bit for bit
    end to end (with numpy's tanh, one-ulp differences flipped quantization roundings layer after layer)."""
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(RNG_SEED)
    channels, layers = 32, 8
    nodes, weights, previous = [], [], "mel"
    for layer in range(layers):
        w = (rng.standard_normal((channels, channels, 5)) / np.sqrt(channels * 5)).astype(np.float32)
        weights.append(onnx.numpy_helper.from_array(w, f"w{layer}"))
        nodes += [
            helper.make_node(
                "Conv", [previous, f"w{layer}"], [f"c{layer}"], pads=[2, 2], name=f"conv{layer}"
            ),
            helper.make_node("Tanh", [f"c{layer}"], [f"t{layer}"], name=f"tanh{layer}"),
            helper.make_node("Add", [f"t{layer}", previous], [f"h{layer}"], name=f"add{layer}"),
        ]
        previous = f"h{layer}"
    graph = helper.make_graph(
        nodes,
        "conv_tanh_stack",
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, channels, "frames"])],
        [onnx.ValueInfoProto(name=previous)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with tempfile.TemporaryDirectory() as directory:
        float_path, quantized_path = Path(directory) / "float.onnx", Path(directory) / "dynamic.onnx"
        onnx.save(model, float_path)
        quantize_dynamic(
            float_path, quantized_path, weight_type=QuantType.QUInt8, op_types_to_quantize=["Conv"]
        )
        quantized = onnx.load(quantized_path)
    assert sum(node.op_type == "ConvInteger" for node in quantized.graph.node) == layers
    feeds = {"mel": rng.standard_normal((1, channels, 200)).astype(np.float32)}
    np.testing.assert_array_equal(run_interpreter(quantized, feeds)[0], run_onnxruntime(quantized, feeds)[0])


# Softmax family before opset 13 ----------------------------------------------------------------------
@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_family_of_opset_11_normalizes_the_coerced_rows_like_onnxruntime(
    op_type: str, axis: int
) -> None:
    """Opsets 1-12 normalize over every dim from `axis` on; onnx's reference normalized along `axis`
    alone (axis 1 of a 4-D input: 0.78 off onnxruntime)."""
    rng = np.random.default_rng(RNG_SEED)
    feeds = {"x": (rng.standard_normal((2, 3, 4, 5)) * 3).astype(np.float32)}
    model = one_node_model(op_type, feeds, {"axis": axis}, opset=11)
    ours = run_interpreter(model, feeds)[0]
    reference = run_onnxruntime(model, feeds)[0]
    if op_type == "Hardmax":
        np.testing.assert_array_equal(ours, reference)
        return
    row = math.prod(feeds["x"].shape[axis % 4 :])
    # the check's normalization family: 2 (n + 16) eps max|ref|, eps = 2**-23, n = the row length
    bound = 2 * (row + 16) * 2.0**-23 * np.max(np.abs(reference))
    assert np.max(np.abs(ours.astype(np.float64) - reference)) <= bound


# LRN -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 3, 5, 7])  # onnxruntime takes odd sizes only
def test_lrn_matches_onnxruntime_within_float32_rounding(size: int) -> None:
    """onnx's reference LRN is 4.6e-4 off onnxruntime (and off the exact value) on unit inputs."""
    rng = np.random.default_rng(RNG_SEED)
    feeds = {"x": (rng.standard_normal((2, 7, 4, 5)) * 3).astype(np.float32)}
    model = one_node_model("LRN", feeds, {"size": size, "alpha": 0.01, "beta": 0.75, "bias": 2.0}, opset=13)
    reference = run_onnxruntime(model, feeds)[0]
    ours = run_interpreter(model, feeds)[0]
    assert_within_sum_bound(ours, reference, np.abs(reference), size + 4, f"LRN size {size}")


# Einsum ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("bhqd,bhkd->bhqk", [(2, 3, 8, 4), (2, 3, 6, 4)]),
        ("...ij,...jk", [(2, 5, 3), (2, 3, 4)]),
        ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
        ("bii->bi", [(2, 4, 4)]),
        ("i,i", [(7,), (7,)]),
    ],
)
def test_einsum_matches_onnxruntime_within_float32_bound(
    equation: str, shapes: list[tuple[int, ...]]
) -> None:
    rng = np.random.default_rng(RNG_SEED)
    feeds = {f"x{i}": uniform(rng, *shape) for i, shape in enumerate(shapes)}
    model = one_node_model("Einsum", feeds, {"equation": equation}, opset=12)
    reference = run_onnxruntime(model, feeds)[0]
    magnitude = run_onnxruntime(model, {k: np.abs(v) for k, v in feeds.items()})[0]
    terms = max(math.prod(shape) for shape in shapes)  # a generous count of summed products
    assert_within_sum_bound(
        run_interpreter(model, feeds)[0], reference, magnitude, terms, f"Einsum {equation}"
    )


# GridSample ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_matches_onnxruntime(mode: str, padding_mode: str, align_corners: int) -> None:
    """Grid points up to 1.6 outside [-1, 1] (every padding rule is exercised), corners and the centre;
    nearest is bit-exact, bilinear within the 4-term sum bound."""
    rng = np.random.default_rng(RNG_SEED)
    grid = rng.uniform(-1.6, 1.6, (2, 4, 6, 2)).astype(np.float32)
    grid[0, 0, :3] = [[-1, -1], [1, 1], [0, 0]]
    feeds = {"x": uniform(rng, 2, 3, 5, 7), "grid": grid}
    attributes = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    model = one_node_model("GridSample", feeds, attributes, opset=16)
    reference = run_onnxruntime(model, feeds)[0]
    ours = run_interpreter(model, feeds)[0]
    if mode == "nearest":
        np.testing.assert_array_equal(ours, reference)
        return
    magnitude = run_onnxruntime(model, {"x": np.abs(feeds["x"]), "grid": grid})[0]
    assert_within_sum_bound(ours, reference, magnitude, 4, f"GridSample {padding_mode} {align_corners}")


@pytest.mark.parametrize("case", sorted(set(POOL_CASES) - {"count_include_pad", "count_include_pad_ceil"}))
@pytest.mark.parametrize("power", [2, 3])
def test_lp_pool_matches_onnxruntime_within_float32_bound(case: str, power: int) -> None:
    rng = np.random.default_rng(RNG_SEED)
    feeds = {"x": uniform(rng, 2, 3, 11, 10)}
    attributes = {**POOL_CASES[case], "p": power}
    model = one_node_model("LpPool", feeds, attributes, opset=18)
    reference = run_onnxruntime(model, feeds)[0]
    terms = math.prod(attributes["kernel_shape"]) + 4  # type: ignore[arg-type]
    assert_within_sum_bound(
        run_interpreter(model, feeds)[0], reference, np.abs(reference), terms, f"LpPool {case}"
    )
