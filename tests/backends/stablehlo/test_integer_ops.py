"""StableHLO lowerings of the integer quantization ops (onnx_integer.py, onnx_qoperator.py) against
onnxruntime, bit for bit: each one-node model is converted in every form (quantized, integer, qdq), run on
XLA:CPU through backends/stablehlo/run.py, and every output compared with onnxruntime's CPU kernels
(graph optimizations off) on seeded random data with ties, saturation, per-channel / per-column zero
points, uint8 and int8. Then whole models: the QOperator samples and dynamic quantizations of the float
samples (onnxruntime.quantization.quantize_dynamic, made in tmp_path), and a weight-only int8 model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from frontend.test_qoperator import DTYPES, MS, build, onnxruntime_outputs, random_q
from onnx import helper, numpy_helper

from qconvert.frontends.onnx import import_onnx

pytestmark = pytest.mark.engine

FORMS = ("quantized", "integer", "qdq")
BOTH_ENGINES = ("xla", "interpreter")
"""The ops whose exactness rests on float arithmetic (emulated FMAs, products rounded on their bits, exact
divisions) also run on StableHLO's reference interpreter: the numbers must not depend on XLA's rewrites."""
MODELS = Path(__file__).resolve().parents[3] / "models"


def run_forms(
    model: onnx.ModelProto, inputs: dict[str, np.ndarray], forms: tuple[str, ...] = FORMS, engine: str = "xla"
) -> dict:
    """Convert `model` in each form, run it on `engine` (XLA:CPU or the interpreter); {form: outputs}."""
    require_module("jax")
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text

    module = import_onnx(model, {name: array.shape for name, array in inputs.items()})
    results = {}
    for form in forms:
        text = stablehlo_text(module, form=form, inline_weights=True)
        results[form] = [np.asarray(a) for a in run.run(text, list(inputs.values()), engine=engine)]
    return results


def assert_bit_exact(label: str, actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype.kind == expected.dtype.kind or expected.dtype.itemsize == 1, (
        f"{label}: {actual.dtype} vs {expected.dtype}"
    )
    assert actual.dtype.itemsize == expected.dtype.itemsize, f"{label}: {actual.dtype} vs {expected.dtype}"
    # Bytes, so that a u8 result read back as i8 still compares (and -0.0 / NaN bit patterns count).
    mismatches = int(
        np.sum(actual.view(f"u{actual.dtype.itemsize}") != expected.view(f"u{actual.dtype.itemsize}"))
    )
    assert mismatches == 0, f"{label}: {mismatches} of {expected.size} elements differ from onnxruntime"


def check_node(
    node: onnx.NodeProto,
    inputs: dict[str, np.ndarray],
    initializers: dict[str, np.ndarray],
    lowered_as: str,
    forms: tuple[str, ...] = FORMS,
    engines: tuple[str, ...] = ("xla",),
) -> None:
    """One-node model -> every form on each engine, each output bit-exact with onnxruntime."""
    model = build(node, inputs, initializers)
    expected = onnxruntime_outputs(model, inputs)
    # onnx's shape inference stops at com.microsoft ops: type the outputs as onnxruntime returned them.
    del model.graph.output[:]
    for name, reference in zip([o for o in node.output if o], expected):
        reference = np.asarray(reference)
        elem_type = helper.np_dtype_to_tensor_dtype(reference.dtype)
        model.graph.output.append(helper.make_tensor_value_info(name, elem_type, list(reference.shape)))
    names = [op.name for op in import_onnx(model).walk()]  # type: ignore[attr-defined]
    assert lowered_as in names, names
    for engine in engines:
        for form, outputs in run_forms(model, inputs, forms, engine).items():
            assert len(outputs) == len(expected)
            for name, actual, reference in zip([o for o in node.output if o], outputs, expected):
                assert_bit_exact(f"{engine}, {form}: {name}", actual, np.asarray(reference))


# MatMulInteger, ConvInteger ---------------------------------------------------------------------------
@pytest.mark.parametrize("b_dtype", DTYPES)
@pytest.mark.parametrize("per_column", [False, True])
def test_matmul_integer(b_dtype: type, per_column: bool) -> None:
    rng = np.random.default_rng(4)
    a = random_q(rng, np.uint8, (3, 4, 16))
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"], name="mmi")
    initializers = {
        "b": random_q(rng, b_dtype, (16, 8)),
        "az": np.array(200, np.uint8),
        "bz": random_q(rng, b_dtype, (8,) if per_column else ()),
    }
    check_node(node, {"a": a}, initializers, "qconvert.matmul_integer")


@pytest.mark.parametrize("a_dtype", DTYPES)
def test_matmul_integer_with_run_time_zero_points(a_dtype: type) -> None:
    """Zero points as graph inputs keep the generic onnx.MatMulInteger (as after DynamicQuantizeLinear);
    extreme values: all-255 / all-0 rows against zero points at the other end of the range."""
    rng = np.random.default_rng(14)
    a = random_q(rng, a_dtype, (2, 5, 32))
    info = np.iinfo(a_dtype)
    a[0, 0] = info.max
    a[0, 1] = info.min
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"], name="mmi")
    inputs = {"a": a, "az": np.array(info.min, a_dtype)}
    initializers = {"b": random_q(rng, np.int8, (32, 6)), "bz": random_q(rng, np.int8, (6,))}
    check_node(node, inputs, initializers, "onnx.MatMulInteger", forms=("integer",))


@pytest.mark.parametrize("w_dtype", DTYPES)
def test_conv_integer(w_dtype: type) -> None:
    rng = np.random.default_rng(5)
    x = random_q(rng, np.uint8, (2, 4, 8, 9))
    node = helper.make_node(
        "ConvInteger", ["x", "w", "xz", "wz"], ["y"], name="ci", pads=[1, 0, 2, 1], strides=[2, 1], group=2
    )
    initializers = {
        "w": random_q(rng, w_dtype, (6, 2, 3, 3)),
        "xz": np.array(100, np.uint8),
        "wz": np.array(7, w_dtype),
    }
    check_node(node, {"x": x}, initializers, "qconvert.conv_integer")


def test_conv_integer_with_run_time_zero_point() -> None:
    rng = np.random.default_rng(15)
    x = random_q(rng, np.uint8, (1, 3, 7, 7))
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], name="ci", pads=[1, 1, 1, 1])
    inputs = {"x": x, "xz": np.array(255, np.uint8)}
    initializers = {"w": random_q(rng, np.int8, (4, 3, 3, 3)), "wz": np.array(-3, np.int8)}
    check_node(node, inputs, initializers, "onnx.ConvInteger", forms=("integer",))


# Dynamic quantization ----------------------------------------------------------------------------------
def dynamic_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """Normal data at three magnitudes, all positive, all negative, all zero, one value, and exact ties
    (x / scale = k + 0.5 for the scale the data gives)."""
    cases = [(rng.standard_normal((3, 17)) * s).astype(np.float32) for s in (1.0, 0.01, 40.0)]
    cases.append(np.abs(cases[0]))
    cases.append(-np.abs(cases[1]))
    cases.append(np.zeros((4, 5), np.float32))
    cases.append(np.full((2, 3), 0.7, np.float32))
    ties = np.array([[-127.5, 0.5, 1.5, 2.5, 127.5, -0.5]], np.float32)  # range 255: scale 1, zp 128
    cases.append(ties)
    return cases


def test_dynamic_quantize_linear() -> None:
    rng = np.random.default_rng(12)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"])
    for x in dynamic_inputs(rng):
        check_node(node, {"x": x}, {}, "qconvert.dynamic_quantize_linear", engines=BOTH_ENGINES)


@pytest.mark.parametrize("b_dtype", DTYPES)
@pytest.mark.parametrize("per_column", [False, True])
def test_dynamic_quantize_matmul(b_dtype: type, per_column: bool) -> None:
    rng = np.random.default_rng(13)
    shape = (8,) if per_column else ()
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], ["y"], domain=MS)
    initializers = {
        "b": random_q(rng, b_dtype, (16, 8)),
        "bs": rng.uniform(0.001, 0.03, shape).astype(np.float32),
        "bz": (random_q(rng, b_dtype, shape) // 8).astype(b_dtype),
        "bias": rng.standard_normal(8).astype(np.float32),
    }
    for scale in (1.0, 30.0):
        a = (rng.standard_normal((2, 4, 16)) * scale).astype(np.float32)
        check_node(node, {"a": a}, initializers, "qconvert.dynamic_quantize_matmul", engines=BOTH_ENGINES)


# QLinearConv, QLinearMatMul, QGemm ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_conv(dtype: type, per_channel: bool, ties: bool) -> None:
    rng = np.random.default_rng(1)
    x = random_q(rng, dtype, (2, 4, 9, 9))
    channels = 6
    if ties:  # multiplier 0.5: every odd accumulator is a tie; a small y scale also saturates
        x_scale, w_scale, y_scale = np.float32(0.5), np.ones(channels if per_channel else (), np.float32), 1.0
    else:
        x_scale = np.float32(0.02)
        w_scale = rng.uniform(0.001, 0.05, channels if per_channel else ()).astype(np.float32)
        y_scale = rng.uniform(0.05, 0.5)
    node = helper.make_node(
        "QLinearConv",
        ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
        ["y"],
        name="conv",
        group=2,
        pads=[1, 0, 1, 2],
        strides=[2, 1],
        dilations=[1, 2],
    )
    initializers = {
        "xs": x_scale,
        "xz": np.array(3 if dtype is np.uint8 else -5, dtype),
        "w": random_q(rng, np.int8, (channels, 2, 3, 3)),
        "ws": w_scale,
        "wz": np.zeros(channels if per_channel else (), np.int8),
        "ys": np.float32(y_scale),
        "yz": np.array(128 if dtype is np.uint8 else 1, dtype),
        "b": rng.integers(-2000, 2000, channels).astype(np.int32),
    }
    # The interpreter too: its quantized i8 convolution wraps, so the quantized form must not use one.
    check_node(node, {"x": x}, initializers, "qconvert.qlinear_conv", engines=BOTH_ENGINES)


@pytest.mark.parametrize(
    ("dtype", "b_dtype"), [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8)]
)
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_matmul(dtype: type, b_dtype: type, per_column: bool, ties: bool) -> None:
    rng = np.random.default_rng(2)
    a = random_q(rng, dtype, (2, 3, 5, 16))
    shape = (8,) if per_column else ()
    if ties:
        scales = (np.float32(0.5), np.ones(shape, np.float32), np.float32(2.0))
    else:
        scales = (np.float32(0.03), rng.uniform(0.001, 0.02, shape).astype(np.float32), np.float32(0.1))
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name="mm")
    initializers = {
        "as": scales[0],
        "az": np.array(7, dtype),
        "b": random_q(rng, b_dtype, (16, 8)),
        "bs": scales[1],
        "bz": (random_q(rng, b_dtype, shape) // 4).astype(b_dtype),
        "ys": scales[2],
        "yz": np.array(3, dtype),
    }
    check_node(node, {"a": a}, initializers, "qconvert.qlinear_matmul")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("quantized_output", [False, True])
@pytest.mark.parametrize("trans_a", [0, 1])
def test_qgemm(dtype: type, per_column: bool, quantized_output: bool, trans_a: int) -> None:
    rng = np.random.default_rng(11)
    a = random_q(rng, dtype, (16, 5) if trans_a else (5, 16))
    shape = (8,) if per_column else ()
    inputs = ["a", "as", "az", "b", "bs", "bz", "c"] + (["ys", "yz"] if quantized_output else [])
    node = helper.make_node("QGemm", inputs, ["y"], domain=MS, transA=trans_a, transB=1, alpha=0.75)
    initializers = {
        "as": np.float32(0.02),
        "az": np.array(4, dtype),
        "b": random_q(rng, dtype if dtype is np.int8 else np.int8, (8, 16)),
        "bs": rng.uniform(0.001, 0.03, shape).astype(np.float32),
        "bz": np.zeros(shape, np.int8),
        "c": rng.integers(-3000, 3000, 8).astype(np.int32),
    }
    if quantized_output:
        initializers.update({"ys": np.float32(0.07), "yz": np.array(6, dtype)})
    check_node(node, {"a": a}, initializers, "qconvert.qgemm")


# Element-wise, lookup tables, concat ---------------------------------------------------------------------
BINARY_SHAPES = [((4, 37), (4, 37)), ((4, 37), (37,)), ((4, 1), (4, 37)), ((1,), (9,)), ((2, 3, 5), (3, 1))]


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", BINARY_SHAPES)
def test_qlinear_add_mul(op_type: str, dtype: type, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    rng = np.random.default_rng(6)
    for trial in range(3):
        a, b = random_q(rng, dtype, shapes[0]), random_q(rng, dtype, shapes[1])
        if trial == 0:  # ties: ratios 0.5, odd zero points
            scales = [np.float32(0.5), np.float32(0.25), np.float32(1.0)]
        elif trial == 1:  # saturation
            scales = [np.float32(0.5), np.float32(0.5), np.float32(0.01)]
        else:
            scales = [np.float32(rng.uniform(0.001, 0.1)) for _ in range(3)]
        zeros = [random_q(rng, dtype, ()) for _ in range(3)]
        node = helper.make_node(
            op_type, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["c"], domain=MS, name="bin"
        )
        initializers = dict(
            zip(
                ["as", "az", "bs", "bz", "cs", "cz"],
                [scales[0], zeros[0], scales[1], zeros[1], scales[2], zeros[2]],
            )
        )
        lowered_as = "qconvert.qlinear_add" if op_type == "QLinearAdd" else "qconvert.qlinear_mul"
        check_node(node, {"a": a, "b": b}, initializers, lowered_as, engines=BOTH_ENGINES)


@pytest.mark.parametrize("op_type", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_lookup_table_ops(op_type: str, dtype: type) -> None:
    x = np.arange(256, dtype=np.uint8).view(dtype).reshape(4, 64)  # every table entry
    rng = np.random.default_rng(8)
    for _ in range(3):
        attributes = {"alpha": float(rng.uniform(0.01, 0.5))} if op_type == "QLinearLeakyRelu" else {}
        node = helper.make_node(op_type, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, **attributes)
        initializers = {
            "xs": np.float32(rng.uniform(0.01, 0.1)),
            "xz": random_q(rng, dtype, ()),
            "ys": np.float32(rng.uniform(0.002, 0.05)),
            "yz": random_q(rng, dtype, ()),
        }
        name = "qconvert.qlinear_sigmoid" if op_type == "QLinearSigmoid" else "qconvert.qlinear_leaky_relu"
        check_node(node, {"x": x}, initializers, name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_concat(dtype: type) -> None:
    rng = np.random.default_rng(7)
    inputs = {f"x{i}": random_q(rng, dtype, (2, 3 + i, 5)) for i in range(3)}
    node = helper.make_node(
        "QLinearConcat",
        ["ys", "yz", "x0", "s0", "z0", "x1", "s1", "z1", "x2", "s2", "z2"],
        ["y"],
        domain=MS,
        axis=-2,
    )
    initializers = {
        "ys": np.float32(0.05),
        "yz": np.array(5, dtype),
        "s0": np.float32(0.05),
        "z0": np.array(5, dtype),  # same as the output: copied
        "s1": np.float32(0.025),  # ties after the ratio
        "z1": np.array(3, dtype),
        "s2": np.float32(0.3),  # saturates
        "z2": np.array(-1 if dtype is np.int8 else 1, dtype),
    }
    check_node(node, inputs, initializers, "qconvert.qlinear_concat")


# Pooling -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(dtype: type, channels_last: int) -> None:
    rng = np.random.default_rng(9)
    x = random_q(rng, dtype, (2, 5, 6, 3) if channels_last else (2, 3, 5, 6))
    node = helper.make_node(
        "QLinearGlobalAveragePool",
        ["x", "xs", "xz", "ys", "yz"],
        ["y"],
        domain=MS,
        channels_last=channels_last,
    )
    for y_scale in (np.float32(0.05), np.float32(0.0501), np.float32(0.02)):
        initializers = {
            "xs": np.float32(0.05),
            "xz": np.array(9, dtype),
            "ys": y_scale,
            "yz": np.array(2, dtype),
        }
        check_node(node, {"x": x}, initializers, "qconvert.qlinear_global_average_pool")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("ceil_mode", [0, 1])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_average_pool(
    dtype: type, count_include_pad: int, ceil_mode: int, channels_last: int
) -> None:
    rng = np.random.default_rng(10)
    x = random_q(rng, dtype, (2, 8, 7, 3) if channels_last else (2, 3, 8, 7))
    node = helper.make_node(
        "QLinearAveragePool",
        ["x", "xs", "xz", "ys", "yz"],
        ["y"],
        domain=MS,
        kernel_shape=[3, 2],
        strides=[2, 2],
        pads=[1, 0, 1, 1],
        count_include_pad=count_include_pad,
        ceil_mode=ceil_mode,
        channels_last=channels_last,
    )
    for y_scale in (np.float32(0.1), np.float32(0.013)):
        initializers = {
            "xs": np.float32(0.1),
            "xz": np.array(3, dtype),
            "ys": y_scale,
            "yz": np.array(5, dtype),
        }
        check_node(node, {"x": x}, initializers, "qconvert.qlinear_average_pool")


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_qlinear_average_pool_drops_a_ceil_mode_window_that_starts_in_the_end_padding(
    count_include_pad: int,
) -> None:
    """kernel 3, stride 3, pads (1, 2) over 8 and 7: ceil mode gives 3 windows per axis, not 4
    (onnxruntime's PoolAttributes rule, qconvert/onnx_semantics.window_geometry); the interpreter is
    checked too, since check_node's forms compare with onnxruntime only."""
    from qconvert.interpret import Interpreter

    rng = np.random.default_rng(11)
    x = random_q(rng, np.uint8, (2, 3, 8, 7))
    node = helper.make_node(
        "QLinearAveragePool",
        ["x", "xs", "xz", "ys", "yz"],
        ["y"],
        domain=MS,
        kernel_shape=[3, 3],
        strides=[3, 3],
        pads=[1, 1, 2, 2],
        count_include_pad=count_include_pad,
        ceil_mode=1,
    )
    initializers = {
        "xs": np.float32(0.1),
        "xz": np.array(3, np.uint8),
        "ys": np.float32(0.013),
        "yz": np.array(5, np.uint8),
    }
    check_node(node, {"x": x}, initializers, "qconvert.qlinear_average_pool", engines=("xla", "interpreter"))
    model = build(node, {"x": x}, initializers)
    (expected,) = onnxruntime_outputs(model, {"x": x})
    (interpreted,) = Interpreter(import_onnx(model)).run({"x": x}).values()
    assert_bit_exact("qconvert's interpreter", interpreted, np.asarray(expected))


# Whole models --------------------------------------------------------------------------------------------
JUDGED_OP_TYPES = (
    "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul", "QLinearAdd",
    "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearAveragePool",
    "QLinearGlobalAveragePool", "QGemm", "DynamicQuantizeMatMul", "Cast", "Mul",
)  # fmt: skip
MIN_SQNR_DB = 40.0
"""The models keep float ops (LayerNorm, Softmax, Erf, pooling, the dynamic models' Cast -> Mul by the
scales and bias Add) that XLA:CPU computes in another order or contracts into FMAs, so a value can land on
the other side of a later quantization tie and the difference cascades. Each quantized / integer node
whose every input is bit-equal in both runs must give bit-equal outputs (exposed as graph outputs); the
model outputs must keep an SQNR against onnxruntime of at least MIN_SQNR_DB (an 8-bit model's own noise
is near 40 dB below the signal: one flipped rounding stays far above that)."""


def sample_inputs(model_name: str, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    data = np.load(MODELS / f"{model_name}.inputs.npz")
    return {i.name: data[i.name] for i in model.graph.input}


def expose(model: onnx.ModelProto, names: list[str], inputs: dict[str, np.ndarray]) -> onnx.ModelProto:
    """`model` with `names` (typed by shape inference, contrib outputs included) as extra graph outputs,
    its graph inputs pinned to the shapes of `inputs` (exports have dynamic axes)."""
    from qconvert.frontends.onnx.qoperator import infer_contrib_shapes

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for graph_input in model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        for dim, size in zip(dims, inputs[graph_input.name].shape):
            dim.Clear()
            dim.dim_value = size
    inferred = infer_contrib_shapes(onnx.shape_inference.infer_shapes(model, data_prop=True))
    known = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    present = {o.name for o in inferred.graph.output}
    for name in dict.fromkeys(names):
        info = known.get(name)
        dims = info.type.tensor_type.shape.dim if info is not None else []
        is_static = (
            info is not None
            and info.type.tensor_type.HasField("shape")
            and all(d.HasField("dim_value") for d in dims)
        )
        if name not in present and is_static:  # values onnx's inference cannot type stay unexposed
            inferred.graph.output.append(info)
    return inferred


def sqnr_db(actual: np.ndarray, reference: np.ndarray) -> float:
    noise = float(np.sum((actual.astype(np.float64) - reference) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(signal / noise)


def compare_model(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, int]:
    """Every form on XLA against onnxruntime (see MIN_SQNR_DB); returns {form: nodes judged bit for bit}."""
    model_outputs = [o.name for o in model.graph.output]
    constants = {t.name for t in model.graph.initializer} | {
        o for n in model.graph.node if n.op_type == "Constant" for o in n.output
    }
    nodes = [n for n in model.graph.node if n.op_type in JUDGED_OP_TYPES]
    values = [v for n in nodes for v in [*n.input, *n.output] if v and v not in constants and v not in inputs]
    model = expose(model, values, inputs)
    names = [o.name for o in model.graph.output]
    expected = dict(zip(names, (np.asarray(r) for r in onnxruntime_outputs(model, inputs))))
    judged = {}
    for form, outputs in run_forms(model, inputs).items():
        actual = dict(zip(names, outputs))
        actual.update(inputs)
        expected.update(inputs)

        def same(name: str, actual: dict[str, np.ndarray] = actual) -> bool:
            return name in constants or bool(np.array_equal(actual[name], expected[name]))

        judged[form] = 0
        for node in nodes:
            seen = all(name in constants or name in actual for name in [*node.input, *node.output] if name)
            if seen and all(same(name) for name in node.input if name):
                judged[form] += 1
                for name in [o for o in node.output if o]:
                    assert_bit_exact(
                        f"{form}: {node.op_type} '{node.name}' output {name}", actual[name], expected[name]
                    )
        for name in model_outputs:
            if expected[name].dtype.kind == "f":
                quality = sqnr_db(actual[name], expected[name])
                assert quality >= MIN_SQNR_DB, f"{form}: {name} SQNR {quality:.1f} dB against onnxruntime"
            else:
                assert_bit_exact(f"{form}: {name}", actual[name], expected[name])
    return judged


@pytest.mark.parametrize("model_name", ["digits_cnn", "tiny_encoder"])
def test_qoperator_models(model_name: str) -> None:
    """The QOperator samples (41 QLinear ops in the encoder, which gave "41 unsupported op(s)")."""
    model = onnx.load(MODELS / f"{model_name}.qop.onnx")
    judged = compare_model(model, sample_inputs(model_name, model))
    qoperator_nodes = sum(n.op_type.startswith("QLinear") or n.op_type == "QGemm" for n in model.graph.node)
    assert all(count >= qoperator_nodes // 2 for count in judged.values()), (judged, qoperator_nodes)


@pytest.mark.parametrize("model_name", ["digits_cnn", "tiny_encoder"])
@pytest.mark.parametrize(
    ("weight_type", "per_channel"), [("QInt8", False), ("QUInt8", False), ("QInt8", True)]
)
def test_dynamic_quantized_models(
    model_name: str, weight_type: str, per_channel: bool, tmp_path: Path
) -> None:
    """onnxruntime's quantize_dynamic of the float samples (DynamicQuantizeLinear, MatMulInteger,
    ConvInteger, then Cast -> Mul by the scales); per channel, the weights' zero points are vectors."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = tmp_path / f"{model_name}.dynamic.onnx"
    quantize_dynamic(
        MODELS / f"{model_name}.onnx", quantized, weight_type=QuantType[weight_type], per_channel=per_channel
    )
    model = onnx.load(quantized)
    integer_nodes = sum(n.op_type in ("MatMulInteger", "ConvInteger") for n in model.graph.node)
    assert integer_nodes, "quantize_dynamic left no integer op"
    judged = compare_model(model, sample_inputs(model_name, model))
    assert all(count >= 2 for count in judged.values()), (
        judged
    )  # the input's DynamicQuantizeLinear and its op


def weight_only_int8(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Every Conv / MatMul / Gemm weight as an int8 initializer -> Cast(to float) -> Mul by its per-output-
    channel scale (symmetric, max / 127), as weight-only exports write it; returns the dequantized names."""
    initializers = {t.name: t for t in model.graph.initializer}
    nodes, dequantized = [], []
    for node in model.graph.node:
        if node.op_type in ("Conv", "MatMul", "Gemm") and node.input[1] in initializers:
            weight = numpy_helper.to_array(initializers[node.input[1]]).astype(np.float32)
            axis = 1 if node.op_type == "MatMul" or (node.op_type == "Gemm" and not _trans_b(node)) else 0
            reduce_axes = tuple(a for a in range(weight.ndim) if a != axis)
            scale = (np.abs(weight).max(axis=reduce_axes, keepdims=True) / 127).astype(np.float32)
            scale[scale == 0] = 1
            stored = np.clip(np.rint(weight / scale), -127, 127).astype(np.int8)
            name = node.input[1]
            model.graph.initializer.remove(initializers[name])
            model.graph.initializer.extend(
                [
                    numpy_helper.from_array(stored, f"{name}_int8"),
                    numpy_helper.from_array(scale, f"{name}_scale"),
                ]
            )
            nodes.append(
                helper.make_node("Cast", [f"{name}_int8"], [f"{name}_cast"], to=onnx.TensorProto.FLOAT)
            )
            nodes.append(helper.make_node("Mul", [f"{name}_cast", f"{name}_scale"], [f"{name}_dequantized"]))
            node.input[1] = f"{name}_dequantized"
            dequantized.append(f"{name}_dequantized")
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model, dequantized


def _trans_b(node: onnx.NodeProto) -> bool:
    return any(a.name == "transB" and a.i for a in node.attribute)


@pytest.mark.parametrize("model_name", ["digits_cnn", "tiny_encoder"])
def test_weight_only_int8_models(model_name: str) -> None:
    """int8 initializer -> Cast -> Mul: each Cast and Mul of a weight is judged bit for bit."""
    model, dequantized = weight_only_int8(onnx.load(MODELS / f"{model_name}.onnx"))
    assert dequantized
    judged = compare_model(model, sample_inputs(model_name, model))
    assert all(count >= 2 * len(dequantized) for count in judged.values()), judged


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "axis", "opset"), [((2, 3, 16), -1, 13), ((2, 5, 4), 1, 13), ((3, 4, 6), 1, 12)]
)
def test_qlinear_softmax(dtype: type, shape: tuple[int, ...], axis: int, opset: int) -> None:
    """Lifted (qconvert.qlinear_softmax), interpreted and lowered: each bit-exact with onnxruntime."""
    from qconvert.interpret import interpret

    rng = np.random.default_rng(16)
    info = np.iinfo(dtype)
    node = helper.make_node(
        "QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, axis=axis, opset=opset
    )
    for trial, y_scale in enumerate((1 / 256, np.float32(0.013))):
        x = random_q(rng, dtype, shape)
        if trial == 0:  # a dominant element: the probability saturates at qmax
            x[..., 0] = info.max
        initializers = {
            "xs": np.float32(rng.uniform(0.02, 0.2)),
            "xz": np.array(0, dtype),
            "ys": np.float32(y_scale),
            "yz": np.array(info.min, dtype),
        }
        check_node(node, {"x": x}, initializers, "qconvert.qlinear_softmax", engines=BOTH_ENGINES)
        model = build(node, {"x": x}, initializers)
        expected = onnxruntime_outputs(model, {"x": x})[0]
        assert_bit_exact("interpreter", np.asarray(interpret(import_onnx(model), {"x": x})["y"]), expected)


@pytest.mark.parametrize("op_type", ["QLinearMatMul", "QGemm"])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("y_zero", [0, -3])
def test_quantized_form_contracts_with_quantized_ops(op_type: str, per_column: bool, y_zero: int) -> None:
    """Signed 8-bit operands with weight zero points 0: the quantized form is a quantized dot_general into
    an i32 accumulator type (then uniform_quantize for y_zero 0, onnxruntime's requantize written out
    otherwise), bit-exact like the written-out forms."""
    require_module("jax")
    from qconvert.backends.stablehlo.convert import stablehlo_text

    rng = np.random.default_rng(17)
    shape = (8,) if per_column else ()
    a = random_q(rng, np.int8, (6, 16))
    initializers = {
        "as": np.float32(0.03),
        "az": np.array(-5, np.int8),
        "bs": rng.uniform(0.001, 0.02, shape).astype(np.float32),
        "bz": np.zeros(shape, np.int8),
        "ys": np.float32(0.05),
        "yz": np.array(y_zero, np.int8),
    }
    if op_type == "QLinearMatMul":
        initializers["b"] = random_q(rng, np.int8, (16, 8))
        names = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
        node = helper.make_node(op_type, names, ["y"], name="mm")
    else:  # transposed B and an int32 bias
        initializers["b"] = random_q(rng, np.int8, (8, 16))
        initializers["c"] = rng.integers(-3000, 3000, 8).astype(np.int32)
        names = ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"]
        node = helper.make_node(op_type, names, ["y"], domain=MS, name="mm", transB=1)
    lowered_as = "qconvert.qlinear_matmul" if op_type == "QLinearMatMul" else "qconvert.qgemm"
    check_node(node, {"a": a}, initializers, lowered_as, engines=BOTH_ENGINES)
    text = stablehlo_text(import_onnx(build(node, {"a": a}, initializers)), form="quantized")
    dots = [line for line in text.splitlines() if '"stablehlo.dot_general"' in line]
    assert len(dots) == 1 and "-> tensor<6x8x!quant.uniform<i32:f32" in dots[0], dots
    assert ("stablehlo.uniform_quantize" in text) == (y_zero == 0)
