"""The float-op coverage of real exports (backends/stablehlo/onnx_{math,logic,norm,resize,index,layout,
reduce_more,einsum}.py) against onnxruntime, on XLA:CPU and, for the cheap graphs, the StableHLO
interpreter.

Each test builds one ONNX graph holding many cases (one compile per graph), lifts it with the
frontend, converts it to StableHLO (qdq form, weights inline), runs it and compares every output with
onnxruntime's on the same seeded inputs.

Bounds, per output:
- "exact": integer, boolean and index results, data movement, and float results of one IEEE operation
  per element in onnxruntime's order (Floor, Round, HardSigmoid, PRelu, Mod, nearest Resize, Pad...).
- "ulps": `ULPS` ulps of the expected value: one transcendental function (Log, Sin, Softplus...),
  whose approximation differs between MLAS/Eigen and XLA.
- "absolute": `ABSOLUTE` times the largest |expected| (at least 1): sums whose order differs from
  onnxruntime's (normalizations, reductions, Einsum, linear Resize), and formulas that cancel near zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import helper, numpy_helper

pytestmark = pytest.mark.engine

ULPS = 4
ABSOLUTE = 4e-6
RNG = np.random.default_rng(11)


@dataclass(frozen=True)
class Output:
    """A graph output and how it must match onnxruntime: "exact", "ulps" or "absolute"."""

    name: str
    match: str = "exact"


def rand(*shape: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def ints(*shape: int, low: int = -5, high: int = 5, dtype: type = np.int64) -> np.ndarray:
    return RNG.integers(low, high, shape).astype(dtype)


def const(name: str, array: object, dtype: type = np.int64) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(array, dtype=dtype), name)
    )


def make_model(
    nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: Sequence[Output], opset: int
) -> onnx.ModelProto:
    ordered = [n for n in nodes if n.op_type == "Constant"] + [n for n in nodes if n.op_type != "Constant"]
    graph = helper.make_graph(
        ordered,
        "cases",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for n, a in inputs.items()
        ],
        [onnx.ValueInfoProto(name=o.name) for o in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)


def assert_matches(name: str, match: str, actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    if match == "exact" or expected.dtype.kind in "biu":
        assert actual.dtype == expected.dtype, f"{name}: {actual.dtype} vs {expected.dtype}"
        np.testing.assert_array_equal(actual, expected, err_msg=name)
        return
    assert actual.dtype == expected.dtype, f"{name}: {actual.dtype} vs {expected.dtype}"
    assert np.array_equal(np.isnan(actual), np.isnan(expected)), f"{name}: NaNs differ"
    finite = ~np.isnan(expected)
    actual, expected = actual[finite], expected[finite]
    if match == "ulps":
        tolerance = ULPS * np.spacing(np.abs(expected).astype(np.float32))
    else:
        largest = float(np.abs(expected).max()) if expected.size else 1.0
        tolerance = np.full(expected.shape, ABSOLUTE * max(largest, 1.0))
    difference = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    worst = int(np.argmax(difference - tolerance)) if difference.size else 0
    assert np.all(difference <= tolerance), (
        f"{name}: |difference| up to {difference.max():.3g} (tolerance {tolerance.reshape(-1)[worst]:.3g} "
        f"at flat index {worst}: {actual.reshape(-1)[worst]!r} vs {expected.reshape(-1)[worst]!r})"
    )


def check(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, np.ndarray],
    outputs: Sequence[Output],
    opset: int = 17,
    engines: Sequence[str] = ("xla",),
) -> str:
    """Convert the graph, run it on each engine, compare each output with onnxruntime; returns the text."""
    require_module("jax")
    import onnxruntime as ort

    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    model = make_model(nodes, inputs, outputs, opset)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run([o.name for o in outputs], inputs)
    text = stablehlo_text(import_onnx(model), form="qdq", inline_weights=True)
    assert '"onnx.' not in text, "an onnx op was left in the module"
    for engine in engines:
        actual = run.run(text, list(inputs.values()), engine=engine)
        assert len(actual) == len(outputs)
        for output, a, e in zip(outputs, actual, expected):
            assert_matches(f"{engine}: {output.name}", output.match, np.asarray(a), np.asarray(e))
    return text


n = helper.make_node


def test_math_and_activations() -> None:
    x = rand(3, 4, 5)
    x[0, 0, :4] = [0.5, -0.5, 2.5, -1.5]  # Round's ties go to even
    positive = rand(3, 4, 5, low=0.05, high=4.0)
    slope, slope_channel = rand(5), rand(4, 1)
    a, b = ints(4, 6, low=-20, high=20), ints(4, 6, low=1, high=7) * np.where(RNG.random((4, 6)) < 0.5, -1, 1)
    nodes = [
        n("Log", ["positive"], ["log"]),
        n("Reciprocal", ["x"], ["reciprocal"]),
        n("Floor", ["x"], ["floor"]),
        n("Ceil", ["x"], ["ceil"]),
        n("Round", ["x"], ["round"]),
        n("Sign", ["x"], ["sign"]),
        n("Sign", ["a"], ["sign_int"]),
        n("Sin", ["x"], ["sin"]),
        n("Cos", ["x"], ["cos"]),
        n("Tan", ["x"], ["tan"]),
        n("Atan", ["x"], ["atan"]),
        n("Softplus", ["x"], ["softplus"]),
        n("Softsign", ["x"], ["softsign"]),
        n("Elu", ["x"], ["elu"], alpha=0.7),
        n("Selu", ["x"], ["selu"]),
        n("Celu", ["x"], ["celu"], alpha=1.3),
        n("ThresholdedRelu", ["x"], ["thresholded"], alpha=0.4),
        n("PRelu", ["x", "slope"], ["prelu"]),
        n("PRelu", ["x", "slope_channel"], ["prelu_channel"]),
        n("Mish", ["x"], ["mish"]),
        n("HardSigmoid", ["x"], ["hard_sigmoid"]),
        n("HardSigmoid", ["x"], ["hard_sigmoid_attrs"], alpha=0.3, beta=0.4),
        n("HardSwish", ["x"], ["hard_swish"]),
        n("Shrink", ["x"], ["shrink"], lambd=0.8, bias=0.3),
        n("Mod", ["a", "b"], ["mod"]),
        n("Mod", ["a", "b"], ["fmod_int"], fmod=1),
        n("Mod", ["x", "positive"], ["fmod"], fmod=1),
        n("Sum", ["x", "slope", "positive"], ["sum"]),
        n("Mean", ["x", "slope_channel", "positive"], ["mean"]),
        n("Sum", ["x"], ["sum_one"]),
    ]
    exact = ["reciprocal", "floor", "ceil", "round", "sign", "sign_int", "thresholded", "prelu"]
    exact += ["prelu_channel", "shrink", "mod", "hard_sigmoid", "hard_sigmoid_attrs", "hard_swish"]
    exact += ["fmod_int", "fmod", "sum", "mean", "sum_one", "softsign"]
    ulps = ["log", "sin", "cos", "atan", "tan"]
    # Softplus/Elu/Selu/Celu/Mish: exp/log1p/tanh approximations, and exp(x) - 1 cancels near zero.
    absolute = ["softplus", "elu", "selu", "celu", "mish"]
    outputs = [Output(o) for o in exact] + [Output(o, "ulps") for o in ulps]
    outputs += [Output(o, "absolute") for o in absolute]
    inputs = {"x": x, "positive": positive, "slope": slope, "slope_channel": slope_channel, "a": a, "b": b}
    check(nodes, inputs, outputs, opset=18, engines=("xla", "interpreter"))


def test_comparisons_and_logic() -> None:
    x, y = rand(3, 4), rand(4)
    y[1] = x[0, 1]  # equal values
    special = np.array([0.0, np.inf, -np.inf, np.nan, 1.0, -2.0], np.float32)
    p, q = RNG.random((3, 4)) < 0.5, RNG.random((1, 4)) < 0.5
    i, j = ints(3, 4), ints(3, 1)
    u = np.array([1, 2, 200, 7], np.uint8)
    shift = np.array([1, 0, 3, 7], np.uint8)
    nodes = [
        n("Greater", ["x", "y"], ["greater"]),
        n("GreaterOrEqual", ["x", "y"], ["greater_equal"]),
        n("Less", ["x", "y"], ["less"]),
        n("LessOrEqual", ["i", "j"], ["less_equal_int"]),
        n("Greater", ["special", "zero"], ["greater_special"]),
        const("zero", 0.0, np.float32),
        n("And", ["p", "q"], ["and"]),
        n("Or", ["p", "q"], ["or"]),
        n("Xor", ["p", "q"], ["xor"]),
        n("Not", ["p"], ["not"]),
        n("IsNaN", ["special"], ["is_nan"]),
        n("IsInf", ["special"], ["is_inf"]),
        n("IsInf", ["special"], ["is_pos_inf"], detect_negative=0),
        n("IsInf", ["special"], ["is_neg_inf"], detect_positive=0),
        n("BitShift", ["u", "shift"], ["shift_left"], direction="LEFT"),
        n("BitShift", ["u", "shift"], ["shift_right"], direction="RIGHT"),
    ]
    names = ["greater", "greater_equal", "less", "less_equal_int", "greater_special", "and", "or", "xor"]
    names += ["not", "is_nan", "is_inf", "is_pos_inf", "is_neg_inf", "shift_left", "shift_right"]
    inputs = {"x": x, "y": y, "special": special, "p": p, "q": q, "i": i, "j": j, "u": u, "shift": shift}
    check(nodes, inputs, [Output(o) for o in names], opset=17, engines=("xla", "interpreter"))


def initializer_nodes(arrays: dict[str, np.ndarray]) -> list[onnx.NodeProto]:
    return [const(name, array, array.dtype.type) for name, array in arrays.items()]


def test_normalizations() -> None:
    x = rand(2, 6, 5, 4)
    parameters = {
        "scale": rand(6),
        "bias": rand(6),
        "mean": rand(6, low=-1, high=1),
        "var": rand(6, low=0.2, high=2.0),
        "group_scale": rand(3),
        "group_bias": rand(3),
    }
    nodes = [
        *initializer_nodes(parameters),
        n("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["batch_norm"], epsilon=1e-3),
        n("InstanceNormalization", ["x", "scale", "bias"], ["instance_norm"], epsilon=1e-4),
        n("GroupNormalization", ["x", "group_scale", "group_bias"], ["group_norm"], num_groups=3),
        n("LogSoftmax", ["x"], ["log_softmax"]),
        n("LogSoftmax", ["x"], ["log_softmax_axis1"], axis=1),
        n("Hardmax", ["x"], ["hardmax"], axis=2),
    ]
    outputs = [Output("batch_norm"), Output("instance_norm", "absolute"), Output("group_norm", "absolute")]
    outputs += [Output("log_softmax", "absolute"), Output("log_softmax_axis1", "absolute"), Output("hardmax")]
    check(nodes, {"x": x}, outputs, opset=18, engines=("xla", "interpreter"))


def test_batch_norm_legacy_attributes_are_ignored_in_inference() -> None:
    """Opset 7: momentum, spatial=1 and is_test (opset 6) change nothing at inference; spatial=0 takes
    per-sample parameters (C x H x W) that broadcast over the batch."""
    x = rand(2, 3, 4, 5)
    parameters = {
        "scale": rand(3), "bias": rand(3), "mean": rand(3), "var": rand(3, low=0.2, high=2.0),
        "sample_scale": rand(3, 4, 5), "sample_bias": rand(3, 4, 5), "sample_mean": rand(3, 4, 5),
        "sample_var": rand(3, 4, 5, low=0.2, high=2.0),
    }  # fmt: skip
    nodes = [
        *initializer_nodes(parameters),
        n("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["momentum"], momentum=0.7),
        n("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["spatial"], spatial=1, epsilon=0.01),
        n(
            "BatchNormalization",
            ["x", "sample_scale", "sample_bias", "sample_mean", "sample_var"],
            ["per_sample"],
            spatial=0,
        ),
    ]
    outputs = [Output(o) for o in ("momentum", "spatial", "per_sample")]
    check(nodes, {"x": x}, outputs, opset=7)


def test_indexing() -> None:
    x = rand(3, 5, 4)
    x[1, 2, :] = x[1, 0, :]  # ties for ArgMax/TopK along axis 1
    ints_x = ints(3, 5, 4, low=-3, high=3)
    gather_elements = ints(3, 2, 4, low=-5, high=5)
    gather_nd = np.array([[0, 1], [2, -1], [1, 3]], np.int64)
    gather_nd_batch = np.array([[[1], [0]], [[4], [-2]], [[2], [2]]], np.int64)
    scatter_nd = np.array([[2, 1], [0, 4]], np.int64)
    scatter_updates = rand(2, 4)
    scatter_elements = np.array([[[0, 1, 2, 3]], [[4, 3, 2, 1]], [[1, 1, 0, 0]]], np.int64)
    scatter_elements_updates = rand(3, 1, 4)
    hot = np.array([[0, 3, -1], [2, 7, -5]], np.int64)
    nodes = [
        n("ArgMax", ["x"], ["argmax"], axis=1),
        n("ArgMax", ["x"], ["argmax_last"], axis=1, select_last_index=1, keepdims=0),
        n("ArgMin", ["ints_x"], ["argmin_int"], axis=-1),
        n("ArgMin", ["ints_x"], ["argmin_last"], axis=0, select_last_index=1),
        const("k", [3]),
        n("TopK", ["x", "k"], ["top_values", "top_indices"], axis=1),
        n("TopK", ["ints_x", "k"], ["bottom_values", "bottom_indices"], largest=0),
        n("GatherElements", ["x", "gather_elements"], ["gather_elements_out"], axis=1),
        # Constant data and indices smaller than the data on the other axis (BERT's token-type ids).
        const("table", RNG.integers(0, 9, (3, 8)), np.int64),
        const("positions", [[5, 0, 7, 2]]),
        n("GatherElements", ["table", "positions"], ["gather_elements_constant"], axis=1),
        n("GatherND", ["x", "gather_nd"], ["gather_nd_out"]),
        n("GatherND", ["x", "gather_nd_batch"], ["gather_nd_batch_out"], batch_dims=1),
        n("ScatterND", ["x", "scatter_nd", "scatter_updates"], ["scatter_nd_out"]),
        n("ScatterND", ["x", "scatter_nd", "scatter_updates"], ["scatter_nd_add"], reduction="add"),
        n(
            "ScatterElements",
            ["x", "scatter_elements", "scatter_elements_updates"],
            ["scatter_elements_out"],
            axis=1,
        ),
        const("depth", 6),
        const("on_off", [-1.5, 2.0], np.float32),
        n("OneHot", ["hot", "depth", "on_off"], ["one_hot"]),
        n("OneHot", ["hot", "depth", "on_off"], ["one_hot_axis0"], axis=0),
        n("Trilu", ["x"], ["triu"]),
        const("minus_one", -1),
        n("Trilu", ["x", "minus_one"], ["tril"], upper=0),
        const("one", 1),
        n("Trilu", ["x", "one"], ["triu_k"]),
        const("axis1", 1),
        n("CumSum", ["ints_x", "axis1"], ["cumsum_int"]),
        n("CumSum", ["x", "axis1"], ["cumsum"]),
        n("CumSum", ["ints_x", "axis1"], ["cumsum_exclusive_reverse"], exclusive=1, reverse=1),
        const("repeats", [2, 1, 3]),
        n("Tile", ["x", "repeats"], ["tile"]),
    ]
    names = ["argmax", "argmax_last", "argmin_int", "argmin_last", "top_values", "top_indices"]
    names += [
        "bottom_values",
        "bottom_indices",
        "gather_elements_out",
        "gather_nd_out",
        "gather_nd_batch_out",
    ]
    names += [
        "gather_elements_constant",
        "scatter_nd_out",
        "scatter_nd_add",
        "scatter_elements_out",
        "one_hot",
        "one_hot_axis0",
    ]
    names += ["triu", "tril", "triu_k", "cumsum_int", "cumsum_exclusive_reverse", "tile"]
    outputs = [Output(o) for o in names] + [Output("cumsum", "absolute")]
    inputs = {
        "x": x, "ints_x": ints_x, "gather_elements": gather_elements, "gather_nd": gather_nd,
        "gather_nd_batch": gather_nd_batch, "scatter_nd": scatter_nd, "scatter_updates": scatter_updates,
        "scatter_elements": scatter_elements, "scatter_elements_updates": scatter_elements_updates,
        "hot": hot,
    }  # fmt: skip
    check(nodes, inputs, outputs, opset=18, engines=("xla", "interpreter"))


def resize(
    output: str, mode: str, *, scales: str = "", sizes: str = "", roi: str = "", **attributes: object
) -> onnx.NodeProto:
    return n("Resize", ["x", roi, scales, sizes], [output], mode=mode, **attributes)


def test_resize_modes_torch_emits() -> None:
    """Nearest with each coordinate transform and nearest_mode, linear and cubic with each transform
    torch's interpolate emits (align_corners, half_pixel, pytorch_half_pixel, asymmetric); scales and
    sizes, up and down: all bit-exact."""
    x = rand(2, 3, 5, 7)
    nodes = [
        const("up2", [1, 1, 2, 2], np.float32),
        const("odd", [1, 1, 1.5, 0.6], np.float32),
        const("down", [1, 1, 0.5, 0.75], np.float32),
        const("sizes", [2, 3, 8, 3]),
        const("sizes_one", [2, 3, 1, 9]),
        resize("nearest_torch", "nearest", scales="up2", coordinate_transformation_mode="asymmetric",
               nearest_mode="floor"),
        resize("nearest_half_pixel", "nearest", scales="odd"),
        resize("nearest_ceil", "nearest", scales="odd", nearest_mode="round_prefer_ceil",
               coordinate_transformation_mode="align_corners"),
        resize("nearest_sizes", "nearest", sizes="sizes", coordinate_transformation_mode="pytorch_half_pixel",
               nearest_mode="ceil"),
        resize("nearest_down", "nearest", scales="down", coordinate_transformation_mode="half_pixel",
               nearest_mode="floor"),
        resize("linear_half_pixel", "linear", scales="up2"),
        resize("linear_align_corners", "linear", sizes="sizes",
               coordinate_transformation_mode="align_corners"),
        resize("linear_pytorch", "linear", sizes="sizes_one",
               coordinate_transformation_mode="pytorch_half_pixel"),
        resize("linear_asymmetric_down", "linear", scales="down",
               coordinate_transformation_mode="asymmetric"),
        resize("linear_odd", "linear", scales="odd"),
    ]  # fmt: skip
    exact = ["nearest_torch", "nearest_half_pixel", "nearest_ceil", "nearest_sizes", "nearest_down"]
    linear = [
        "linear_half_pixel",
        "linear_align_corners",
        "linear_pytorch",
        "linear_asymmetric_down",
        "linear_odd",
    ]
    # Bicubic: the default a = -0.75, torch's align_corners, exclude_outside with another a.
    nodes.append(resize("cubic", "cubic", scales="odd"))
    nodes.append(
        resize("cubic_align", "cubic", sizes="sizes", coordinate_transformation_mode="align_corners")
    )
    nodes.append(resize("cubic_exclude", "cubic", scales="up2", cubic_coeff_a=-0.5, exclude_outside=1))
    exact += ["cubic", "cubic_align", "cubic_exclude"]
    # A larger image, where a fused multiply-add anywhere would show.
    nodes.append(const("big_scales", [1, 1, 2.3, 1.7], np.float32))
    nodes.append(n("Resize", ["big", "", "big_scales"], ["linear_big"], mode="linear"))
    outputs = [Output(o) for o in [*exact, *linear, "linear_big"]]
    check(nodes, {"x": x, "big": rand(1, 3, 24, 32)}, outputs, opset=13, engines=("xla", "interpreter"))


def test_resize_of_other_opsets() -> None:
    x = rand(1, 2, 4, 6)
    # Opset 11: tf_half_pixel_for_nn (deprecated since 13).
    nodes = [
        const("up", [1, 1, 2.5, 1.5], np.float32),
        const("roi", np.zeros(0), np.float32),  # Resize-11's roi may not be omitted
        resize(
            "tf_nn", "nearest", roi="roi", scales="up", coordinate_transformation_mode="tf_half_pixel_for_nn"
        ),
        resize(
            "linear_11", "linear", roi="roi", scales="up", coordinate_transformation_mode="pytorch_half_pixel"
        ),
    ]
    check(nodes, {"x": x}, [Output("tf_nn"), Output("linear_11")], opset=11)
    # Opset 18: axes and keep_aspect_ratio_policy.
    nodes = [
        const("hw", [3, 9]),
        const("scale_w", [1.5], np.float32),
        resize("not_larger", "nearest", sizes="hw", axes=[2, 3], keep_aspect_ratio_policy="not_larger"),
        resize("not_smaller", "linear", sizes="hw", axes=[2, 3], keep_aspect_ratio_policy="not_smaller"),
        resize("axis_scale", "nearest", scales="scale_w", axes=[-1]),
    ]
    outputs = [Output("not_larger"), Output("not_smaller"), Output("axis_scale")]
    check(nodes, {"x": x}, outputs, opset=18)
    # Opset 10 Resize and opset 9 Upsample: scales input, asymmetric coordinates, truncated nearest.
    for opset, op_type in ((10, "Resize"), (9, "Upsample")):
        nodes = [
            const("up", [1, 1, 2, 1.5], np.float32),
            const("down", [1, 1, 0.5, 0.5], np.float32),
            n(op_type, ["x", "up"], ["nearest"], mode="nearest"),
            n(op_type, ["x", "up"], ["linear"], mode="linear"),
        ]
        outputs = [Output("nearest"), Output("linear")]
        if op_type == "Resize":
            nodes.append(n(op_type, ["x", "down"], ["nearest_down"], mode="nearest"))
            outputs.append(Output("nearest_down"))
        check(nodes, {"x": x}, outputs, opset=opset)
    # Opset 7 Upsample: scales as an attribute.
    nodes = [
        n("Upsample", ["x"], ["nearest"], mode="nearest", scales=[1.0, 1.0, 2.0, 3.0]),
        n("Upsample", ["x"], ["linear"], mode="linear", scales=[1.0, 1.0, 2.0, 2.0]),
    ]
    check(nodes, {"x": x}, [Output("nearest"), Output("linear")], opset=7)


def test_pad_and_depth_moves() -> None:
    x = rand(2, 3, 4, 5)
    i = ints(3, 6)
    nodes = [
        const("pads", [0, 0, 1, 2, 0, 1, 2, 1]),
        const("pads_crop", [0, 1, -1, 2, 1, 0, 2, -2]),
        const("pads_int", [1, 2, 2, 0]),
        const("fill", 1.5, np.float32),
        const("fill_int", [7]),
        const("axes", [-1, 2]),
        const("pads_axes", [1, 3, 2, 0]),
        n("Pad", ["x", "pads"], ["constant"]),
        n("Pad", ["x", "pads_crop", "fill"], ["constant_crop"]),
        n("Pad", ["x", "pads"], ["reflect"], mode="reflect"),
        n("Pad", ["x", "pads_crop"], ["reflect_crop"], mode="reflect"),
        n("Pad", ["x", "pads"], ["edge"], mode="edge"),
        n("Pad", ["x", "pads_crop"], ["edge_crop"], mode="edge"),
        n("Pad", ["x", "pads"], ["wrap"], mode="wrap"),
        n("Pad", ["i", "pads_int", "fill_int"], ["constant_int"]),
        n("Pad", ["x", "pads_axes", "fill", "axes"], ["constant_axes"]),
        n("Pad", ["x", "pads_axes", "", "axes"], ["reflect_axes"], mode="reflect"),
    ]
    names = ["constant", "constant_crop", "reflect", "reflect_crop", "edge", "edge_crop", "wrap"]
    names += ["constant_int", "constant_axes", "reflect_axes"]
    check(nodes, {"x": x, "i": i}, [Output(o) for o in names], opset=19, engines=("xla", "interpreter"))
    # SpaceToDepth / DepthToSpace (CRD since opset 11).
    y = rand(2, 8, 4, 6)
    nodes = [
        n("SpaceToDepth", ["y"], ["space_to_depth"], blocksize=2),
        n("DepthToSpace", ["y"], ["depth_to_space"], blocksize=2),
        n("DepthToSpace", ["y"], ["depth_to_space_crd"], blocksize=2, mode="CRD"),
    ]
    names = ["space_to_depth", "depth_to_space", "depth_to_space_crd"]
    check(nodes, {"y": y}, [Output(o) for o in names], opset=13)
    # Pad with attributes (opset 2 to 10).
    nodes = [
        n("Pad", ["y"], ["pad_attribute"], pads=[0, 1, 2, 0, 0, 0, 1, 3], value=-2.0),
        n("Pad", ["y"], ["pad_reflect_attribute"], pads=[0, 0, 1, 2, 0, 0, 2, 1], mode="reflect"),
    ]
    check(nodes, {"y": y}, [Output("pad_attribute"), Output("pad_reflect_attribute")], opset=10)


def test_more_reductions() -> None:
    x = rand(3, 4, 5, low=0.1, high=2.0)
    signed = rand(3, 4, 5)
    i = ints(3, 4, 5, low=-3, high=4)
    nodes = [
        const("axes", [1]),
        const("axes_two", [0, -1]),
        const("no_axes", np.zeros(0, np.int64)),
        n("ReduceMin", ["signed", "axes"], ["min"]),
        n("ReduceMin", ["i", "axes_two"], ["min_int"], keepdims=0),
        n("ReduceProd", ["x", "axes"], ["prod"]),
        n("ReduceProd", ["i", "axes"], ["prod_int"]),
        n("ReduceL1", ["signed", "axes_two"], ["l1"]),
        n("ReduceL2", ["signed", "axes"], ["l2"], keepdims=0),
        n("ReduceSumSquare", ["signed"], ["sum_square_all"]),
        n("ReduceLogSum", ["x", "axes"], ["log_sum"]),
        n("ReduceLogSumExp", ["signed", "axes_two"], ["log_sum_exp"]),
        n("ReduceL2", ["signed", "no_axes"], ["l2_noop"], noop_with_empty_axes=1),
    ]
    exact = ["min", "min_int", "prod_int", "l2_noop"]
    absolute = ["prod", "l1", "l2", "sum_square_all", "log_sum", "log_sum_exp"]
    outputs = [Output(o) for o in exact] + [Output(o, "absolute") for o in absolute]
    check(nodes, {"x": x, "signed": signed, "i": i}, outputs, opset=18, engines=("xla", "interpreter"))
    # Opset 13: axes as attributes.
    nodes = [n("ReduceMin", ["signed"], ["min"], axes=[2]), n("ReduceL2", ["signed"], ["l2"], axes=[0, 1])]
    check(nodes, {"signed": signed}, [Output("min"), Output("l2", "absolute")], opset=13)


def test_einsum_equations() -> None:
    inputs = {
        "q": rand(2, 3, 4, 5),
        "k": rand(2, 3, 6, 5),
        "a": rand(4, 5),
        "b": rand(5, 6),
        "v": rand(4),
        "w": rand(6),
        "t": rand(2, 4, 5),
        "c": rand(6, 2),
        "square": rand(2, 4, 4),
    }
    nodes = [
        n("Einsum", ["q", "k"], ["attention"], equation="bhqd,bhkd->bhqk"),
        n("Einsum", ["a", "b"], ["matmul"], equation="ij,jk->ik"),
        n("Einsum", ["a"], ["transpose"], equation="ij->ji"),
        n("Einsum", ["a"], ["row_sums"], equation="ij->i"),
        n("Einsum", ["v", "w"], ["outer"], equation="i,j->ij"),
        n("Einsum", ["t", "b"], ["batched_weight"], equation="bij,jk->bik"),
        n("Einsum", ["q", "k"], ["ellipsis"], equation="...qd,...kd->...qk"),
        n("Einsum", ["a", "b"], ["implicit"], equation="ij,jk"),
        n("Einsum", ["a", "b", "c"], ["chain"], equation="ij,jk,kl->il"),
        n("Einsum", ["t", "a"], ["total"], equation="bij,ij->"),
        n("Einsum", ["square"], ["diagonal"], equation="bii->bi"),
        n("Einsum", ["square"], ["trace"], equation="...ii->..."),
        n("Einsum", ["square", "t"], ["diagonal_product"], equation="bii,bij->bj"),
    ]
    names = ["attention", "matmul", "transpose", "row_sums", "outer", "batched_weight", "ellipsis"]
    names += ["implicit", "chain", "total", "diagonal", "trace", "diagonal_product"]
    check(nodes, inputs, [Output(o, "absolute") for o in names], opset=13, engines=("xla", "interpreter"))


def test_linear_resize_of_8_bit_integers() -> None:
    """QOperator models resize int8 / uint8 directly: float32 taps, then truncation (onnxruntime)."""
    nodes = [
        const("odd", [1, 1, 1.7, 0.6], np.float32),
        const("sizes", [1, 2, 9, 11]),
        resize("u8_half_pixel", "linear", scales="odd"),
        resize("u8_align_corners", "linear", sizes="sizes", coordinate_transformation_mode="align_corners"),
        n("Resize", ["s", "", "odd"], ["s8_pytorch"], mode="linear",
          coordinate_transformation_mode="pytorch_half_pixel"),
    ]  # fmt: skip
    inputs = {"x": ints(1, 2, 6, 7, low=0, high=256, dtype=np.uint8)}
    inputs["s"] = ints(1, 2, 6, 7, low=-128, high=128, dtype=np.int8)
    outputs = [Output("u8_half_pixel"), Output("u8_align_corners"), Output("s8_pytorch")]
    check(nodes, inputs, outputs, opset=13, engines=("xla", "interpreter"))


def test_more_functions_bitwise_and_casts() -> None:
    x = rand(3, 4, low=-0.9, high=0.9)
    above_one = rand(3, 4, low=1.1, high=3.0)
    i, j = ints(3, 4, low=-100, high=100, dtype=np.int32), ints(3, 4, low=-100, high=100, dtype=np.int32)
    like = np.zeros((1,), np.int32)
    nodes = [
        n("Asin", ["x"], ["asin"]),
        n("Acos", ["x"], ["acos"]),
        n("Sinh", ["x"], ["sinh"]),
        n("Cosh", ["x"], ["cosh"]),
        n("Asinh", ["x"], ["asinh"]),
        n("Acosh", ["above_one"], ["acosh"]),
        n("Atanh", ["x"], ["atanh"]),
        n("BitwiseAnd", ["i", "j"], ["bit_and"]),
        n("BitwiseOr", ["i", "j"], ["bit_or"]),
        n("BitwiseXor", ["i", "j"], ["bit_xor"]),
        n("BitwiseNot", ["i"], ["bit_not"]),
        n("CastLike", ["above_one", "like"], ["cast_like"]),
        n("EyeLike", ["x"], ["eye"], k=1),
        n("EyeLike", ["x"], ["eye_int"], k=-1, dtype=7),
        const("keep", [True, False, True], np.bool_),
        n("Compress", ["x", "keep"], ["compress"], axis=0),
        n("Compress", ["x", "keep"], ["compress_flat"]),
        n("LRN", ["image"], ["lrn"], size=3, alpha=0.01, beta=0.6, bias=1.5),
        n("LRN", ["image"], ["lrn_wide"], size=5),
    ]
    exact = [
        "bit_and",
        "bit_or",
        "bit_xor",
        "bit_not",
        "cast_like",
        "eye",
        "eye_int",
        "compress",
        "compress_flat",
    ]
    ulps = ["asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh"]
    outputs = [Output(o) for o in exact] + [Output(o, "ulps") for o in ulps]
    outputs += [Output("lrn", "absolute"), Output("lrn_wide", "absolute")]
    inputs = {"x": x, "above_one": above_one, "i": i, "j": j, "like": like, "image": rand(2, 5, 3, 3)}
    check(nodes, inputs, outputs, opset=18, engines=("xla", "interpreter"))


def test_data_dependent_ops_fold_or_are_refused_with_the_reason() -> None:
    require_module("jax")
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.errors import InputError
    from qconvert.frontends.onnx import import_onnx

    # NonZero of a constant folds: the gather it feeds sees constant indices.
    nodes = [
        const("mask", [[0, 3, 0], [1, 0, 2]]),
        n("NonZero", ["mask"], ["where"]),
        n("Cast", ["where"], ["where_float"], to=1),
        n("Add", ["x", "where_float"], ["shifted"]),
    ]
    text = check(nodes, {"x": rand(2, 3)}, [Output("shifted")], opset=13)
    assert "NonZero" not in text
    # NonZero of a graph input and Compress with a computed condition: refused, named, with the reason.
    nodes = [
        n("NonZero", ["x"], ["where"], name="nonzero_of_input"),
        n("Greater", ["x", "zero"], ["positive"]),
        const("zero", 0.0, np.float32),
        n("Compress", ["x", "positive"], ["kept"], name="compress_computed"),
    ]
    model = make_model(nodes, {"x": rand(2, 3)}, [Output("where"), Output("kept")], opset=13)
    with pytest.raises(InputError) as caught:
        stablehlo_text(import_onnx(model), form="qdq")
    message = str(caught.value)
    assert "nonzero_of_input" in message and "compress_computed" in message
    assert "depend on the data" in message


def test_sigmoid_and_tanh_are_onnxruntimes_bit_for_bit() -> None:
    """f32 Sigmoid and Tanh emit MLAS's polynomials (onnxruntime's x86-64 kernels); SiLU-style x *
    sigmoid(x) follows."""
    x = np.concatenate([rand(4000, low=-12, high=12), rand(96, low=-30, high=30)]).reshape(64, 64)
    x[0, :6] = [0.0, -0.0, 9.0, -18.0, 25.0, 1e-30]
    nodes = [
        n("Sigmoid", ["x"], ["sigmoid"]),
        n("Tanh", ["x"], ["tanh"]),
        n("Mul", ["x", "sigmoid"], ["silu"]),
    ]
    check(
        nodes, {"x": x}, [Output("sigmoid"), Output("tanh"), Output("silu")], engines=("xla", "interpreter")
    )


def test_com_microsoft_float_ops_of_optimized_transformers() -> None:
    """What onnxruntime's transformer optimizer writes: FastGelu, BiasGelu, Gelu, QuickGelu,
    SkipLayerNormalization (with its input + skip + bias output), SkipSimplifiedLayerNormalization."""
    require_module("jax")
    import onnxruntime as ort

    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    ms = "com.microsoft"
    x, skip = rand(2, 5, 16), rand(2, 5, 16)
    weights = {"bias": rand(16), "gamma": rand(16), "beta": rand(16)}
    nodes = [
        n("FastGelu", ["x"], ["fast_gelu"], domain=ms),
        n("FastGelu", ["x", "bias"], ["fast_gelu_bias"], domain=ms),
        n("BiasGelu", ["x", "bias"], ["bias_gelu"], domain=ms),
        n("Gelu", ["x"], ["gelu"], domain=ms),
        n("QuickGelu", ["x"], ["quick_gelu"], domain=ms, alpha=1.5),
        n("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], ["skip_ln", "", "", "skip_sum"],
          domain=ms, epsilon=1e-5),
        n("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["skip_rms"], domain=ms, epsilon=1e-6),
    ]  # fmt: skip
    exact = ["fast_gelu", "fast_gelu_bias", "quick_gelu", "skip_sum"]
    absolute = ["bias_gelu", "gelu", "skip_ln", "skip_rms"]
    graph = helper.make_graph(
        nodes,
        "contrib",
        [helper.make_tensor_value_info(name, 1, list(a.shape)) for name, a in (("x", x), ("skip", skip))],
        [helper.make_tensor_value_info(o, 1, None) for o in exact + absolute],
        initializer=[numpy_helper.from_array(a, name) for name, a in weights.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(exact + absolute, {"x": x, "skip": skip})
    text = stablehlo_text(import_onnx(model), form="qdq", inline_weights=True)
    for engine in ("xla", "interpreter"):
        actual = run.run(text, [x, skip], engine=engine)
        for name, a, e in zip(exact + absolute, actual, expected):
            assert_matches(f"{engine}: {name}", "exact" if name in exact else "absolute", np.asarray(a), e)


def test_grid_sample() -> None:
    """Linear and nearest, every padding mode, with and without align_corners; grid points reach ±1.6
    so that zeros, border and reflection padding all matter."""
    x, grid = rand(2, 3, 5, 6), rand(2, 4, 7, 2, low=-1.6, high=1.6)
    grid[0, 0, :4] = [[-1, -1], [1, 1], [0, 0], [1.0, -1.0]]  # corners and the centre exactly
    nodes, names = [], []
    for mode in ("bilinear", "nearest"):
        for padding in ("zeros", "border", "reflection"):
            for align in (0, 1):
                name = f"{mode}_{padding}_{align}"
                nodes.append(
                    n(
                        "GridSample",
                        ["x", "grid"],
                        [name],
                        mode=mode,
                        padding_mode=padding,
                        align_corners=align,
                    )
                )
                names.append(name)
    outputs = [Output(name, "exact" if name.startswith("nearest") else "absolute") for name in names]
    check(nodes, {"x": x, "grid": grid}, outputs, opset=16, engines=("xla", "interpreter"))
    # Opset 20 spells bilinear "linear".
    nodes = [n("GridSample", ["x", "grid"], ["linear"], mode="linear", padding_mode="reflection")]
    check(nodes, {"x": x, "grid": grid}, [Output("linear", "absolute")], opset=20)


def test_max_pool_indices_and_max_unpool() -> None:
    """Indices into the whole input (row-major, or spatially column-major with storage_order=1), the
    first maximum among ties, padding never chosen; MaxUnpool puts the values back."""
    x = np.round(rand(2, 3, 8, 6), 1)  # rounded: ties inside windows
    nodes = [
        n("MaxPool", ["x"], ["pooled", "indices"], kernel_shape=[2, 2], strides=[2, 2]),
        n("MaxPool", ["x"], ["padded", "padded_indices"], kernel_shape=[3, 3], strides=[2, 2],
          pads=[1, 1, 1, 1]),
        n("MaxPool", ["x"], ["ceil", "ceil_indices"], kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1),
        n("MaxPool", ["x"], ["column", "column_indices"], kernel_shape=[2, 2], storage_order=1),
        n("MaxPool", ["x"], ["dilated", "dilated_indices"], kernel_shape=[2, 2], dilations=[2, 2]),
        n("MaxUnpool", ["pooled", "indices"], ["unpooled"], kernel_shape=[2, 2], strides=[2, 2]),
        const("unpool_shape", [2, 3, 8, 7]),
        n("MaxUnpool", ["pooled", "indices", "unpool_shape"], ["unpooled_shape"], kernel_shape=[2, 2],
          strides=[2, 2]),
    ]  # fmt: skip
    names = [
        "pooled",
        "indices",
        "padded",
        "padded_indices",
        "ceil",
        "ceil_indices",
        "column",
        "column_indices",
    ]
    names += ["dilated", "dilated_indices", "unpooled", "unpooled_shape"]
    check(nodes, {"x": x}, [Output(o) for o in names], opset=12, engines=("xla", "interpreter"))


def test_dft_and_stft() -> None:
    """DFT forward / inverse / onesided, real and complex, dft_length padding and cutting; STFT with a
    Hann window and without, onesided and full: the log-spectrogram front-end of speech models."""
    real = rand(2, 12, 1)
    complex_signal = rand(2, 12, 2)
    signal = rand(2, 64, 1)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype(np.float32)
    nodes = [
        n("DFT", ["real"], ["dft"]),
        n("DFT", ["real"], ["rfft"], onesided=1),
        n("DFT", ["complex_signal"], ["dft_complex"]),
        n("DFT", ["complex_signal"], ["idft"], inverse=1),
        const("padded_length", 16),
        n("DFT", ["real", "padded_length"], ["dft_padded"]),
        const("cut_length", 8),
        n("DFT", ["complex_signal", "cut_length"], ["dft_cut"]),
        const("step", 8),
        const("window", window, np.float32),
        # onesided explicit: onnx's shape inference takes its default as 0 and declares 16 bins.
        n("STFT", ["signal", "step", "window"], ["stft"], onesided=1),
        const("frame_length", 10),
        n("STFT", ["signal", "step", "", "frame_length"], ["stft_full"], onesided=0),
    ]
    names = ["dft", "rfft", "dft_complex", "idft", "dft_padded", "dft_cut", "stft", "stft_full"]
    inputs = {"real": real, "complex_signal": complex_signal, "signal": signal}
    check(nodes, inputs, [Output(o, "absolute") for o in names], opset=17, engines=("xla", "interpreter"))
    # Window generators with a constant size, one feeding an STFT.
    nodes = [
        const("size", 16),
        n("HannWindow", ["size"], ["hann"]),
        n("HammingWindow", ["size"], ["hamming"], periodic=0),
        n("BlackmanWindow", ["size"], ["blackman"]),
        const("step", 8),
        n("STFT", ["signal", "step", "hann"], ["stft_hann"], onesided=1),
    ]
    outputs = [Output(o, "absolute") for o in ("hann", "hamming", "blackman", "stft_hann")]
    check(nodes, {"signal": signal}, outputs, opset=17)
    # Opset 20: the axis is an input.
    nodes = [const("axis", 1), n("DFT", ["complex_signal", "", "axis"], ["dft_axis"])]
    check(nodes, {"complex_signal": complex_signal}, [Output("dft_axis", "absolute")], opset=20)


def test_com_microsoft_attention() -> None:
    """onnxruntime's fused Attention as its optimizer writes it for BERT: a (batch, sequence) 0/1 mask,
    and the unidirectional (causal) form."""
    require_module("jax")
    import onnxruntime as ort

    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    ms = "com.microsoft"
    x = rand(2, 5, 8, low=-1, high=1)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)
    weights = {"weights": rand(8, 24, low=-0.5, high=0.5), "bias": rand(24, low=-0.1, high=0.1)}
    nodes = [
        n("Attention", ["x", "weights", "bias", "mask"], ["masked"], domain=ms, num_heads=2),
        n("Attention", ["x", "weights", "bias"], ["causal"], domain=ms, num_heads=4, unidirectional=1),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            helper.make_tensor_value_info("x", 1, list(x.shape)),
            helper.make_tensor_value_info("mask", 6, [2, 5]),
        ],
        [helper.make_tensor_value_info(o, 1, None) for o in ("masked", "causal")],
        initializer=[numpy_helper.from_array(a, name) for name, a in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(["masked", "causal"], {"x": x, "mask": mask})
    text = stablehlo_text(import_onnx(model), form="qdq", inline_weights=True)
    for engine in ("xla", "interpreter"):
        actual = run.run(text, [x, mask], engine=engine)
        for name, a, e in zip(("masked", "causal"), actual, expected):
            assert_matches(f"{engine}: {name}", "absolute", np.asarray(a), e)
