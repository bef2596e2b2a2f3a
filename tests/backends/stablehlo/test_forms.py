"""The StableHLO backend's three forms, run on jaxlib's interpreter and XLA:CPU, against onnxruntime.

Small QDQ models are built here with onnx.helper, lifted with `import_onnx`, converted, run on both
engines and compared with onnxruntime (graph optimizations off, the spec oracle): bit-exact under
`--semantics onnx`; under `--semantics stablehlo` the number of differing elements equals what
`quant.predicted_mismatches` predicts from numerics' two rounding rules.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.backends.stablehlo.lowering import LoweringTable
from qconvert.errors import InputError
from qconvert.ir.core import Operation, Value
from qconvert.ir.parser import ParserOptions, parse_module
from qconvert.ir.printer import print_module

pytestmark = pytest.mark.engine

ENGINES = ("interpreter", "xla")
FORMS = ("quantized", "integer", "qdq")


@pytest.fixture(scope="module")
def run() -> ModuleType:
    require_module("jax")
    from qconvert.backends.stablehlo import run

    return run


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def convert_text(model: onnx.ModelProto, form: str, semantics: str = "onnx") -> str:
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    return stablehlo_text(import_onnx(model), form, semantics, inline_weights=True)


# The framework ------------------------------------------------------------------------------------------
def example_table() -> LoweringTable:
    """The StableHLO table with the example of lowering.py's docstring added under a test-only name (a
    table of this test's own: nothing is registered anywhere else)."""
    from qconvert.backends.stablehlo import ops as hlo
    from qconvert.backends.stablehlo.convert import stablehlo_lowerings
    from qconvert.backends.stablehlo.lowering import LoweringContext

    def lower_add(ctx: LoweringContext, op: Operation) -> list[Value]:
        lhs, rhs = ctx.broadcast_operands(ctx.operands(op), ctx.result_type(op).shape)
        return [hlo.add(ctx.builder, lhs, rhs)]

    table = stablehlo_lowerings()
    table.add("test.Add", lower_add)
    return table


BROADCAST_ADD = """
func.func @main(%a: tensor<2x3xf32> {onnx.name = "a"}, %b: tensor<3xf32>)
    -> (tensor<2x3xf32> {onnx.name = "y"}) {
  %c = arith.constant dense<[[1.5], [-2.0]]> : tensor<2x1xf32>
  %unused_shape = arith.constant dense<[6]> : tensor<1xi64>
  %0 = "test.Add"(%a, %b) : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %1 = "test.Add"(%0, %c) : (tensor<2x3xf32>, tensor<2x1xf32>) -> tensor<2x3xf32>
  return %1 : tensor<2x3xf32>
}"""


@pytest.mark.parametrize("engine", ENGINES)
def test_example_lowering_broadcasts_like_numpy(run: ModuleType, engine: str) -> None:
    from qconvert.backends.stablehlo.convert import convert_to_stablehlo

    text = print_module(convert_to_stablehlo(parse_module(BROADCAST_ADD), lowerings=example_table()))
    assert '{onnx.name = "a"}' in text and '{onnx.name = "y"}' in text
    assert "tensor<1xi64>" not in text  # a constant no lowering used is not emitted
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([10.0, 20.0, 30.0], np.float32)
    (result,) = run.run(text, [a, b], engine)
    np.testing.assert_array_equal(result, a + b + np.array([[1.5], [-2.0]], np.float32))


def test_every_unsupported_op_is_listed_at_once() -> None:
    from qconvert.backends.stablehlo.convert import convert_to_stablehlo

    text = BROADCAST_ADD.replace(
        "  return %1",
        '  %2 = "onnx.NoSuchOp"(%1) {onnx.node_name = "first"} : (tensor<2x3xf32>) -> tensor<2x3xf32>\n'
        '  %3 = "onnx.OtherOp"(%2) {onnx.node_name = "second"} : (tensor<2x3xf32>) -> tensor<2x3xf32>\n'
        "  return %1",
    )
    with pytest.raises(InputError) as error:
        options = ParserOptions(allow_unregistered_dialect=True)
        convert_to_stablehlo(parse_module(text, options=options), lowerings=example_table())
    message = str(error.value)
    assert "2 unsupported op(s)" in message
    assert "onnx.NoSuchOp (node 'first')" in message and "onnx.OtherOp (node 'second')" in message


def test_tables_are_built_explicitly_from_the_listed_modules() -> None:
    """Every onnx_*.py of the package is listed (a module left out would silently lower nothing); a table
    is new each time, so adding to one (the example's) leaves the next one as it was."""
    from qconvert.backends.stablehlo import convert

    package = Path(convert.__file__).parent
    on_disk = {path.stem for path in package.glob("onnx_*.py")}
    assert on_disk <= set(convert.LOWERING_MODULES)
    assert "test.Add" in example_table()
    fresh = convert.stablehlo_lowerings()
    assert "test.Add" not in fresh and "onnx.Conv" in fresh and "quant.qcast" in fresh
    conv, qcast = fresh.rule("onnx.Conv"), fresh.rule("quant.qcast")
    assert conv is not None and conv.folds and qcast is not None and not qcast.folds


def test_a_table_keys_by_op_class_and_refuses_a_name_twice() -> None:
    from qconvert.ir.dialects.quant import QuantizeCastOp

    def lowering(ctx: object, op: Operation) -> list[Value]:
        return []

    table = LoweringTable()
    table.add(QuantizeCastOp, lowering)
    assert "quant.qcast" in table and QuantizeCastOp in table
    with pytest.raises(AssertionError, match="registered twice"):
        table.add("quant.qcast", lowering)


# Quantize / dequantize models ------------------------------------------------------------------------------
def qdq_model(
    zero_point: int, storage: int, axis: int | None, shape: tuple[int, ...] = (4, 8)
) -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> y, the stored q as an output, and a dequantized weight."""
    dtype = np.int8 if storage == TensorProto.INT8 else np.uint8
    if axis is None:
        scale, zero = np.array(0.5, np.float32), np.array(zero_point, dtype)
        attributes = {}
    else:
        size = shape[axis]
        scale = (0.5 * (1 + np.arange(size) % 2)).astype(np.float32)
        zero = ((np.arange(size) * zero_point) % 7).astype(dtype)
        attributes = {"axis": axis}
    weight = (np.arange(int(np.prod(shape))) % 50 - 25).astype(dtype).reshape(shape)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attributes),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attributes),
        helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wd"], **attributes),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("q", storage, shape),
            helper.make_tensor_value_info("wd", TensorProto.FLOAT, shape),
        ],
        initializer=[
            numpy_helper.from_array(scale, "s"),
            numpy_helper.from_array(zero, "z"),
            numpy_helper.from_array(weight, "w"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(
    ("storage", "axis", "note"),
    [
        pytest.param(TensorProto.UINT8, None, "reads u8 storage as signed", id="u8"),
        pytest.param(TensorProto.INT8, 0, "axis is not the last", id="per-axis-0"),
    ],
)
def test_no_engine_profile_keeps_the_quantized_types_jaxlib_needs_written_out(
    storage: int, axis: int | None, note: str
) -> None:
    """jaxlib's profile (the default) writes u8 and per-axis-not-last quantizations out and guards divisions;
    without a profile the module keeps `uniform_quantize` / `uniform_dequantize` of those types and has no
    barrier (the pure quantized form a TOSA legalizer takes), and jaxlib still parses it."""
    require_module("jax")
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    model = qdq_model(3, storage, axis)
    jaxlib = stablehlo_text(import_onnx(model), "quantized", "onnx")
    pure = stablehlo_text(import_onnx(model), "quantized", "onnx", engine_profile=None)
    spelled = "!quant.uniform<u8:f32" if storage == TensorProto.UINT8 else "!quant.uniform<i8:f32:0,"
    assert note in jaxlib and note not in pure
    assert "stablehlo.optimization_barrier" in jaxlib and "optimization_barrier" not in pure
    assert "qconvert.exact_divide" not in jaxlib + pure  # the mark is settled either way
    assert '"stablehlo.uniform_dequantize"(%' in pure and spelled in pure
    assert "uniform_dequantize" not in jaxlib
    run.verify(pure)


def tie_heavy_input(shape: tuple[int, ...] = (4, 8)) -> np.ndarray:
    """Multiples of 0.25 at scale 0.5 (or smaller): many exact ties, where the two roundings differ."""
    rng = np.random.default_rng(0)
    return (rng.integers(-300, 300, shape) * 0.25).astype(np.float32)


QDQ_CASES = [
    pytest.param(3, TensorProto.INT8, None, id="i8-odd-zp"),
    pytest.param(0, TensorProto.INT8, None, id="i8-zero-zp"),
    pytest.param(3, TensorProto.INT8, 0, id="i8-per-axis-0"),
    pytest.param(3, TensorProto.INT8, 1, id="i8-per-axis-last"),
    pytest.param(131, TensorProto.UINT8, None, id="u8-odd-zp"),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("zero_point", "storage", "axis"), QDQ_CASES)
def test_quantize_dequantize_bit_exact_with_onnxruntime(
    run: ModuleType, engine: str, form: str, zero_point: int, storage: int, axis: int | None
) -> None:
    model = qdq_model(zero_point, storage, axis)
    x = tie_heavy_input()
    reference = onnxruntime_outputs(model, {"x": x})
    outputs = run.run(convert_text(model, form), [x], engine)
    for name, ours, expected in zip(("y", "q", "wd"), outputs, reference, strict=True):
        assert ours.dtype == expected.dtype, name
        np.testing.assert_array_equal(ours, expected, err_msg=f"{name} ({form}, {engine})")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("zero_point", "storage", "axis"), [QDQ_CASES[0], QDQ_CASES[3], QDQ_CASES[4]])
def test_stablehlo_semantics_mismatches_match_prediction(
    run: ModuleType, engine: str, form: str, zero_point: int, storage: int, axis: int | None
) -> None:
    from qconvert.backends.stablehlo import predicted_mismatches
    from qconvert.frontends.onnx import import_onnx

    model = qdq_model(zero_point, storage, axis)
    x = tie_heavy_input()
    qcast = next(op for op in import_onnx(model).walk() if op.name == "quant.qcast")
    predicted = predicted_mismatches(qcast.result.type.element_type, x)  # type: ignore[attr-defined]
    reference = onnxruntime_outputs(model, {"x": x})
    outputs = run.run(convert_text(model, form, "stablehlo"), [x], engine)
    measured = int(np.count_nonzero(outputs[1] != reference[1]))
    assert measured == predicted
    if zero_point % 2:  # odd zero point on ties: the prediction is not vacuous
        assert predicted > 0


def test_quantized_form_writes_out_quantizes_that_would_differ() -> None:
    odd = convert_text(qdq_model(3, TensorProto.INT8, None), "quantized")
    assert "stablehlo.uniform_quantize" not in odd
    assert "qconvert.note" in odd and "zero point before rounding" in odd
    assert "stablehlo.uniform_dequantize" in odd
    zero = convert_text(qdq_model(0, TensorProto.INT8, None), "quantized")
    assert "stablehlo.uniform_quantize" in zero and "qconvert.note" not in zero
    kept = convert_text(qdq_model(3, TensorProto.INT8, None), "quantized", "stablehlo")
    assert "stablehlo.uniform_quantize" in kept


def test_integer_form_has_no_quant_types() -> None:
    for case in QDQ_CASES:
        text = convert_text(qdq_model(*case.values), "integer")  # type: ignore[arg-type]
        assert "!quant" not in text and "uniform_quantize" not in text


# The sample models ----------------------------------------------------------------------------------------
MODELS = Path(__file__).resolve().parents[3] / "models"
# XLA compiles the encoder (2,000 ops) in ~8 s and the interpreter runs it in ~30 s: the CNN covers every
# form on both engines, the encoder runs the two forms with most arithmetic on XLA and verifies the third.
MODEL_CASES = [
    *(pytest.param("digits_cnn", f, e, id=f"digits_cnn-{f}-{e}") for f in FORMS for e in ENGINES),
    *(pytest.param("tiny_encoder", f, e, id=f"tiny_encoder-{f}-{e}") for f in FORMS for e in ENGINES),
]


@functools.cache
def model_reference(name: str) -> tuple[dict[str, np.ndarray], list[np.ndarray], list[float], list[float]]:
    """Inputs, onnxruntime's outputs (optimizations off), the noise floor (max |default - off| per
    output) and one quantization step of each output (its DequantizeLinear's scale)."""
    import onnxruntime as ort

    path = str(MODELS / f"{name}.qdq.onnx")
    model = onnx.load(path)
    data = np.load(MODELS / f"{name}.inputs.npz")
    feeds = {i.name: data[i.name] for i in model.graph.input}
    reference = onnxruntime_outputs(model, feeds)
    default = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    floor = [float(np.max(np.abs(a - b))) for a, b in zip(reference, default, strict=True)]
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    steps = []
    for output in model.graph.output:
        node = producers[output.name]
        assert node.op_type == "DequantizeLinear", "the sample models end in DequantizeLinear"
        steps.append(float(np.max(initializers[node.input[1]])))
    return feeds, reference, floor, steps


@functools.cache
def converted_model(name: str, form: str) -> tuple[str, int, frozenset[str]]:
    """The module's text, the number of fused ops, and which stablehlo ops compute on quantized values."""
    from qconvert.backends.stablehlo.convert import convert_with_stats
    from qconvert.frontends.onnx import import_onnx
    from qconvert.ir.quant_types import QuantizedType
    from qconvert.ir.types import element_type_of

    source = import_onnx(str(MODELS / f"{name}.qdq.onnx"))
    module, stats = convert_with_stats(source, form, inline_weights=True)
    quantized_ops = frozenset(
        op.name.removeprefix("stablehlo.")
        for op in module.walk()
        if op.results and isinstance(element_type_of(op.results[0].type), QuantizedType)
    )
    return print_module(module), stats.fused_ops, quantized_ops


@pytest.mark.parametrize(("name", "form", "engine"), MODEL_CASES)
def test_sample_model_matches_onnxruntime(run: ModuleType, name: str, form: str, engine: str | None) -> None:
    """End to end within the noise floor (onnxruntime default vs optimizations off) or one output step,
    whichever is larger; measured here: 0 differing elements in every form on both engines."""
    feeds, reference, floor, steps = model_reference(name)
    text, fused, quantized_ops = converted_model(name, form)
    run.verify(text)
    assert ("!quant" in text) == (form != "integer")
    if form == "quantized":
        assert fused > 0  # the data-movement ops (pooling, flatten, reshape, transpose) run quantized
        expected = {"digits_cnn": {"reduce_window", "reshape"}, "tiny_encoder": {"transpose", "gather"}}
        assert expected[name] <= quantized_ops
    if engine is None:
        return
    outputs = run.run(text, list(feeds.values()), engine)
    for ours, expected, noise, step in zip(outputs, reference, floor, steps, strict=True):
        difference = float(np.max(np.abs(ours.astype(np.float64) - expected)))
        assert difference <= max(noise, step), (difference, noise, step)


# ONNX's own Q/DQ node tests that StableHLO has no quantized type for ----------------------------------------
WRITTEN_OUT_CASES = [
    "test_quantizelinear_blocked_asymmetric",  # sub-channel: expanded parameters, arithmetic in every form
    "test_dequantizelinear_blocked",
    "test_quantizelinear_e4m3fn",  # float8 storage: convert with saturation
    "test_dequantizelinear_e5m2",
    "test_quantizelinear_uint4",  # sub-byte storage: uniform types in the quantized form
]


@pytest.mark.parametrize("form", ["quantized", "integer"])
@pytest.mark.parametrize("case_name", WRITTEN_OUT_CASES)
def test_onnx_node_cases_without_a_stablehlo_type_run_bit_exact(
    run: ModuleType, case_name: str, form: str
) -> None:
    """Bit-exact with the suite's expected outputs, which tests/frontend pins equal to onnxruntime's."""
    from frontend.onnx_cases import bits_equal, constant_inputs_model, expected_outputs, quantization_cases

    case = quantization_cases()[case_name]
    model, feed = constant_inputs_model(case)
    outputs = run.run(convert_text(model, form), list(feed.values()), "xla")
    for ours, expected in zip(outputs, expected_outputs(case).values(), strict=True):
        assert bits_equal(ours, expected), (ours, expected)


def test_float4_storage_is_refused_with_the_reason() -> None:
    from frontend.onnx_cases import constant_inputs_model, quantization_cases

    model, _ = constant_inputs_model(quantization_cases()["test_quantizelinear_float4e2m1"])
    with pytest.raises(InputError, match="StableHLO has no f4E2M1FN element type"):
        convert_text(model, "integer")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("form", ["quantized", "integer"])
@pytest.mark.parametrize(("zero_point", "storage", "axis"), [QDQ_CASES[0], QDQ_CASES[3], QDQ_CASES[4]])
def test_nan_infinity_and_overflow_quantize_as_onnxruntime(
    run: ModuleType, engine: str, form: str, zero_point: int, storage: int, axis: int | None
) -> None:
    """NaN stores qmin in onnxruntime (uniform_quantize gives 0 on the engines); written out it stays qmin."""
    model = qdq_model(zero_point, storage, axis)
    x = tie_heavy_input()
    x[0, :4] = [np.nan, np.inf, -np.inf, 1e30]
    x[1, :2] = [-1e30, -0.0]
    reference = onnxruntime_outputs(model, {"x": x})
    outputs = run.run(convert_text(model, form), [x], engine)
    np.testing.assert_array_equal(outputs[1], reference[1])
    np.testing.assert_array_equal(outputs[0], reference[0])


def data_movement_model(storage: int = TensorProto.INT8) -> onnx.ModelProto:
    """x -> Q -> DQ, then Transpose / Slice / Concat / Expand / Reshape / MaxPool, each followed by Q -> DQ
    with the same parameters (how onnxruntime's quantizer leaves data-movement ops)."""
    dtype = np.int8 if storage == TensorProto.INT8 else np.uint8
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
        helper.make_node("Transpose", ["d"], ["t"], perm=[1, 0]),
        helper.make_node("Slice", ["d", "starts", "ends", "axes"], ["sl"]),
        helper.make_node("Concat", ["d", "d"], ["c"], axis=0),
        helper.make_node("Expand", ["d", "expand_shape"], ["e"]),
        helper.make_node("Reshape", ["d", "reshape_shape"], ["r"]),
        helper.make_node("Reshape", ["d", "image_shape"], ["image"]),
        helper.make_node("QuantizeLinear", ["image", "s", "z"], ["image_q"]),
        helper.make_node("DequantizeLinear", ["image_q", "s", "z"], ["image_d"]),
        helper.make_node("MaxPool", ["image_d"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    outputs = []
    moved = (
        ("t", (8, 4)),
        ("sl", (4, 3)),
        ("c", (8, 8)),
        ("e", (2, 4, 8)),
        ("r", (32,)),
        ("mp", (1, 1, 2, 4)),
    )
    for name, shape in moved:
        nodes.append(helper.make_node("QuantizeLinear", [name, "s", "z"], [f"{name}_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", "s", "z"], [f"{name}_out"]))
        outputs.append(helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, shape))
    initializers = [
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
        numpy_helper.from_array(np.array(3 if storage == TensorProto.INT8 else 131, dtype), "z"),
        numpy_helper.from_array(np.array([2], np.int64), "starts"),
        numpy_helper.from_array(np.array([8], np.int64), "ends"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
        numpy_helper.from_array(np.array([2, 4, 8], np.int64), "expand_shape"),
        numpy_helper.from_array(np.array([32], np.int64), "reshape_shape"),
        numpy_helper.from_array(np.array([1, 1, 4, 8], np.int64), "image_shape"),
    ]
    graph = helper.make_graph(
        nodes, "moves", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 8))], outputs, initializers
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("storage", [TensorProto.INT8, TensorProto.UINT8], ids=["i8", "u8"])
def test_data_movement_runs_on_quantized_values_bit_exact(run: ModuleType, engine: str, storage: int) -> None:
    """Seven ops fused for i8; for u8 max pooling stays float: the engines compare u8 storage as signed."""
    from qconvert.backends.stablehlo.convert import convert_with_stats
    from qconvert.frontends.onnx import import_onnx

    model = data_movement_model(storage)
    module, stats = convert_with_stats(import_onnx(model), "quantized", inline_weights=True)
    assert stats.fused_ops == (7 if storage == TensorProto.INT8 else 6)
    x = tie_heavy_input((4, 8))
    outputs = run.run(print_module(module), [x], engine)
    for ours, expected in zip(outputs, onnxruntime_outputs(model, {"x": x}), strict=True):
        np.testing.assert_array_equal(ours, expected)


def test_calibrated_types_ask_for_finalized_calibration() -> None:
    from qconvert.backends.stablehlo.convert import convert_to_stablehlo

    calibrated = "tensor<4x!quant.calibrated<f32<-1.0:1.0>>>"
    text = f"""func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {{
  %q = quant.qcast %x {{onnx.node_name = "x_QuantizeLinear"}} : tensor<4xf32> to {calibrated}
  %y = quant.dcast %q : {calibrated} to tensor<4xf32>
  return %y : tensor<4xf32>
}}"""
    with pytest.raises(
        InputError, match=r"quant\.qcast \(node 'x_QuantizeLinear'\): .*finalize the calibration"
    ):
        convert_to_stablehlo(parse_module(text))
