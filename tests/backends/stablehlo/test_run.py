"""The StableHLO runner (backends/stablehlo/run.py) against jaxlib's verifier, interpreter and XLA:CPU."""

from __future__ import annotations

import math
import subprocess
import sys
from types import ModuleType

import ml_dtypes
import numpy as np
import pytest
from conftest import require_module

from qconvert.errors import InputError, VerifyError
from qconvert.numerics import Rounding, UniformParams, dequantize, quantize

pytestmark = pytest.mark.engine

QDQ = """module @m {
func.func public @main(%x: tensor<6xf32>) -> (tensor<6xf32>, tensor<6xi8>) {
  %q = stablehlo.uniform_quantize %x : (tensor<6xf32>) -> tensor<6x!quant.uniform<i8:f32, 0.5:3>>
  %y = stablehlo.uniform_dequantize %q : (tensor<6x!quant.uniform<i8:f32, 0.5:3>>) -> tensor<6xf32>
  %i = stablehlo.bitcast_convert %q : (tensor<6x!quant.uniform<i8:f32, 0.5:3>>) -> tensor<6xi8>
  return %y, %i : tensor<6xf32>, tensor<6xi8>
}}"""


def _identity(element: str) -> str:
    tensor = f"tensor<3x{element}>"
    return f"func.func @main(%x: {tensor}) -> {tensor} {{ return %x : {tensor} }}"


@pytest.fixture(scope="module")
def run() -> ModuleType:
    """The module under test, imported after the engine check."""
    require_module("jax")
    from qconvert.backends.stablehlo import run

    return run


def test_verify_accepts_quant_types(run: ModuleType) -> None:
    run.verify(QDQ)


def test_verify_reports_jaxlibs_diagnostic(run: ModuleType) -> None:
    bad = "func.func @main(%x: tensor<3xf32>) -> tensor<3xi8> { return %x : tensor<3xf32> }"
    with pytest.raises(VerifyError, match=r"doesn't match function result type \('tensor<3xi8>'\)"):
        run.verify(bad)


def test_verify_reports_a_bad_quantized_op(run: ModuleType) -> None:
    # Per-axis operands are not allowed on stablehlo.abs (ODS constraint; NOTES.md §6.1).
    bad = """func.func @main(%x: tensor<2x!quant.uniform<i8:f32:0, {0.1:-30, 0.2:-20}>>)
        -> tensor<2x!quant.uniform<i8:f32:0, {0.1:-30, 0.2:-20}>> {
      %y = stablehlo.abs %x : tensor<2x!quant.uniform<i8:f32:0, {0.1:-30, 0.2:-20}>>
      return %y : tensor<2x!quant.uniform<i8:f32:0, {0.1:-30, 0.2:-20}>> }"""
    with pytest.raises(VerifyError, match="operand #0 must be ranked tensor of"):
        run.verify(bad)


def _params() -> UniformParams:
    return UniformParams(
        scale=np.array(0.5, np.float32),
        zero_point=np.array(3, np.int8),
        storage_dtype=np.dtype(np.int8),
        storage_type_min=-128,
        storage_type_max=127,
        quantized_dimension=None,
    )


@pytest.mark.parametrize("engine", ["interpreter", "xla"])
def test_quantize_follows_stablehlo_rounding_on_both_engines(run: ModuleType, engine: str) -> None:
    # Ties with an odd zero point: StableHLO adds zp before rounding (../shared/engines/README.md).
    x = np.array([0.25, 0.75, 1.25, -0.25, 100.0, -100.0], np.float32)
    dequantized, stored = run.run(QDQ, [x], engine=engine)
    expected = quantize(x, _params(), Rounding.STABLEHLO)
    np.testing.assert_array_equal(stored, expected)
    np.testing.assert_array_equal(stored[:4], [4, 4, 6, 2])
    np.testing.assert_array_equal(dequantized, dequantize(expected, _params(), Rounding.STABLEHLO))


def test_legalize_quant_to_math_removes_quant_types(run: ModuleType) -> None:
    lowered = run.legalize_quant_to_math(QDQ)
    assert "!quant" not in lowered
    assert "stablehlo.round_nearest_even" in lowered
    run.verify(lowered)


@pytest.mark.parametrize(
    ("element", "values"),
    [
        ("ui8", np.array([1, 200, 255], np.uint8)),
        ("i4", np.array([1, -8, 7], ml_dtypes.int4)),
        ("ui4", np.array([0, 9, 15], ml_dtypes.uint4)),
        ("bf16", np.array([1.0, -2.5, 3.5], ml_dtypes.bfloat16)),
        ("i1", np.array([True, False, True])),
        ("i64", np.array([2**40, -1, 0], np.int64)),
    ],
)
def test_values_round_trip_through_both_engines(run: ModuleType, element: str, values: np.ndarray) -> None:
    for engine in ("interpreter", "xla"):
        (out,) = run.run(_identity(element), [values], engine=engine)
        assert out.dtype == values.dtype, engine
        np.testing.assert_array_equal(out, values)


@pytest.mark.parametrize("engine", ["interpreter", "xla"])
def test_rank_0_inputs_run_on_both_engines(run: ModuleType, engine: str) -> None:
    """Scalar inputs (a GELU constant's dequantize in the encoder) keep their rank on the way in."""
    text = """module {
  func.func @main(%a: tensor<i8>, %b: tensor<f32>) -> (tensor<i8>, tensor<f32>) {
    return %a, %b : tensor<i8>, tensor<f32>
  }
}"""
    a, b = run.run(text, [np.array(-3, np.int8), np.array(1.5, np.float32)], engine=engine)
    assert a.shape == () and b.shape == ()
    assert int(a) == -3 and float(b) == 1.5


def test_interpreter_runs_a_named_entry(run: ModuleType) -> None:
    text = """func.func @double(%x: tensor<2xi32>) -> tensor<2xi32> {
      %y = stablehlo.add %x, %x : tensor<2xi32>
      return %y : tensor<2xi32> }"""
    (out,) = run.run_interpreter(text, [np.array([3, -4], np.int32)], entry="double")
    np.testing.assert_array_equal(out, [6, -8])


def test_bad_inputs_are_input_errors(run: ModuleType) -> None:
    with pytest.raises(InputError, match="takes 1 inputs, 2 given"):
        run.run_interpreter(_identity("f32"), [np.zeros(3, np.float32)] * 2)
    with pytest.raises(InputError, match="shape"):
        run.run_interpreter(_identity("f32"), [np.zeros(4, np.float32)])
    with pytest.raises(InputError, match="unknown StableHLO engine"):
        run.run(_identity("f32"), [np.zeros(3, np.float32)], engine="gpu")


def test_import_without_jax_fails_only_when_used() -> None:
    # Blocking the jax modules makes `import jax` raise ImportError, as in an install without the extra.
    code = """
import sys
for name in ("jax", "jaxlib"):
    sys.modules[name] = None
from qconvert.backends.stablehlo import run
from qconvert.errors import InputError
try:
    run.verify("module {}")
except InputError as e:
    print("InputError:", e)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "InputError:" in proc.stdout and "qconvert[stablehlo]" in proc.stdout


def test_complex_results_are_refused_before_the_interpreter_aborts(run: ModuleType) -> None:
    text = """func.func @main(%x: tensor<2xf32>) -> tensor<2xcomplex<f32>> {
      %c = stablehlo.complex %x, %x : tensor<2xcomplex<f32>>
      return %c : tensor<2xcomplex<f32>> }"""
    with pytest.raises(run.EngineError, match="aborts the process on complex"):
        run.run_interpreter(text, [np.ones(2, np.float32)])
    (out,) = run.run_xla(text, [np.array([1.0, 2.0], np.float32)])
    np.testing.assert_array_equal(out, [1 + 1j, 2 + 2j])


def test_chlo_ops_run_on_the_interpreter_after_legalization(run: ModuleType) -> None:
    text = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = chlo.erf %x : tensor<4xf32> -> tensor<4xf32>
      return %0 : tensor<4xf32> }"""
    x = np.array([0.1, -0.5, 1.3, 3.0], np.float32)
    expected = np.array([math.erf(v) for v in x.astype(np.float64)])
    for engine in ("interpreter", "xla"):
        (out,) = run.run(text, [x], engine=engine)
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=0, err_msg=engine)


def _unsigned_round_trip(storage: str) -> str:
    quant = f"!quant.uniform<{storage}:f32, 0.5:128>"
    return f"""func.func @main(%x: tensor<6xf32>) -> (tensor<6xui8>, tensor<6xf32>) {{
      %q = stablehlo.uniform_quantize %x : (tensor<6xf32>) -> tensor<6x{quant}>
      %s = stablehlo.bitcast_convert %q : (tensor<6x{quant}>) -> tensor<6xui8>
      %d = stablehlo.uniform_dequantize %q : (tensor<6x{quant}>) -> tensor<6xf32>
      return %s, %d : tensor<6xui8>, tensor<6xf32> }}"""


@pytest.mark.parametrize(
    "storage",
    [
        "ui8",
        pytest.param(
            "u8",
            marks=pytest.mark.xfail(
                reason="jaxlib parses quant storage `u8` as signless i8 (llvm/llvm-project#185952): both the "
                "interpreter and quant-to-math clamp to 127 and read zp 128 as -128; `ui8` is unsigned",
                strict=True,
            ),
        ),
    ],
)
@pytest.mark.parametrize("engine", ["interpreter", "xla"])
def test_unsigned_quant_storage_with_zero_point_128(run: ModuleType, storage: str, engine: str) -> None:
    # onnxruntime's default activation type is uint8 with zero points near 128.
    x = np.array([-70.0, -1.0, 0.0, 1.0, 20.0, 70.0], np.float32)
    params = UniformParams(
        scale=np.array(0.5, np.float32),
        zero_point=np.array(128, np.uint8),
        storage_dtype=np.dtype(np.uint8),
        storage_type_min=0,
        storage_type_max=255,
        quantized_dimension=None,
    )
    stored, dequantized = run.run(_unsigned_round_trip(storage), [x], engine=engine)
    expected = quantize(x, params, Rounding.STABLEHLO)
    np.testing.assert_array_equal(stored, expected)
    np.testing.assert_array_equal(dequantized, dequantize(expected, params, Rounding.STABLEHLO))


def _divide_by_constant(barrier: bool) -> str:
    divisor = "%b" if barrier else "%c"
    hidden = "%b = stablehlo.optimization_barrier %c : tensor<1000xf32>" if barrier else ""
    return f"""func.func @main(%x: tensor<1000xf32>) -> tensor<1000xf32> {{
      %c = stablehlo.constant dense<0.0123> : tensor<1000xf32>
      {hidden}
      %y = stablehlo.divide %x, {divisor} : tensor<1000xf32>
      return %y : tensor<1000xf32> }}"""


def _run_xla_as_written(run: ModuleType, text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """XLA:CPU on `text` exactly as given (no quant-to-math, no division barriers): what a user who
    compiles our output with XLA gets."""
    return run._execute(run._compile(text), inputs)


def test_xla_divides_by_a_constant_with_a_reciprocal_unless_the_divisor_is_hidden(run: ModuleType) -> None:
    """Engine fact the emitters rely on (ops.exact_divide): XLA:CPU's simplifier turns
    `x / splat(c)` (and `x / broadcast(c)`) into `x * (1 / c)`, off by an ulp for many x, which moves
    quantize ties; an optimization_barrier on the divisor keeps the correctly rounded division."""
    x = np.random.default_rng(0).uniform(-2, 2, 1000).astype(np.float32)
    exact = x / np.float32(0.0123)
    (rewritten,) = _run_xla_as_written(run, _divide_by_constant(barrier=False), [x])
    assert np.count_nonzero(rewritten != exact) > 100
    for engine in ("xla", "interpreter"):
        (divided,) = run.run(_divide_by_constant(barrier=True), [x], engine=engine)
        np.testing.assert_array_equal(divided, exact, err_msg=engine)
    # run_xla puts the barrier in itself, so the program's division is exact there too.
    (divided,) = run.run_xla(_divide_by_constant(barrier=False), [x])
    np.testing.assert_array_equal(divided, exact)


def _quantize_linear_ties() -> tuple[object, np.ndarray]:
    """An ONNX QuantizeLinear (scale 0.0123, int8, zero point 0) and inputs heavy in ties: each k + 0.5
    step of the scale, its float neighbours on both sides, and random values."""
    from onnx import TensorProto, helper, numpy_helper

    scale = np.float32(0.0123)
    ties = ((np.arange(-120, 120) + 0.5) * scale).astype(np.float32)
    random = np.random.default_rng(0).uniform(-1.4, 1.4, 2000).astype(np.float32)
    x = np.concatenate(
        [ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf)), random]
    )
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["q"])],
        "quantize_ties",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
        [helper.make_tensor_value_info("q", TensorProto.INT8, [x.size])],
        [
            numpy_helper.from_array(np.array(scale), "scale"),
            numpy_helper.from_array(np.array(0, np.int8), "zero_point"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model, x


def test_quantized_form_quantize_ties_match_onnxruntime_on_xla(run: ModuleType) -> None:
    """The `quantized` form keeps stablehlo.uniform_quantize; quant-to-math turns it into
    `chlo.broadcast_divide(x, scale)`, which XLA alone would turn into `x * (1 / scale)`."""
    ort = require_module("onnxruntime")
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    model, x = _quantize_linear_ties()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    text = stablehlo_text(import_onnx(model), form="quantized", inline_weights=True)
    assert "stablehlo.uniform_quantize" in text
    (as_written,) = _run_xla_as_written(run, run.legalize_quant_to_math(text), [x])
    assert np.count_nonzero(as_written != expected) > 50  # the case exercises XLA's rewrite
    for engine in ("xla", "interpreter"):
        (stored,) = run.run(text, [x], engine=engine)
        np.testing.assert_array_equal(stored, expected, err_msg=engine)


def test_per_axis_quantize_ties_on_xla_match_the_interpreter(run: ModuleType) -> None:
    # Per-axis quant-to-math divides with broadcast_dimensions: the expansion must map the scales to dim 1.
    quant = "!quant.uniform<i8:f32:1, {0.0123:1, 0.0371:-2}>"
    text = f"""func.func @main(%x: tensor<600x2xf32>) -> tensor<600x2xi8> {{
      %q = stablehlo.uniform_quantize %x : (tensor<600x2xf32>) -> tensor<600x2x{quant}>
      %i = stablehlo.bitcast_convert %q : (tensor<600x2x{quant}>) -> tensor<600x2xi8>
      return %i : tensor<600x2xi8> }}"""
    scales = np.array([0.0123, 0.0371], np.float32)
    ties = ((np.arange(-100, 100)[:, None] + 0.5) * scales).astype(np.float32)
    x = np.concatenate(
        [ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))]
    )
    (expected,) = run.run_interpreter(text, [x])
    (as_written,) = _run_xla_as_written(run, run.legalize_quant_to_math(text), [x])
    assert np.count_nonzero(as_written != expected) > 10
    (stored,) = run.run_xla(text, [x])
    np.testing.assert_array_equal(stored, expected)


DIVISIONS = """func.func @main(
    %x: tensor<1000xf32>, %y: tensor<1000xf32>, %z: tensor<1000xf32>, %n: tensor<1000xi32>
  ) -> (tensor<1000xf32>, tensor<1000xf32>, tensor<1000xi32>) {
  %xy = stablehlo.divide %x, %y : tensor<1000xf32>
  %xyz = stablehlo.divide %xy, %z : tensor<1000xf32>
  %seven = stablehlo.constant dense<7> : tensor<1000xi32>
  %n7 = stablehlo.divide %n, %seven : tensor<1000xi32>
  return %xy, %xyz, %n7 : tensor<1000xf32>, tensor<1000xf32>, tensor<1000xi32> }"""


def test_division_barriers_keep_other_results(run: ModuleType) -> None:
    rng = np.random.default_rng(1)
    x, y, z = ((rng.uniform(0.1, 3, 1000) * rng.choice([-1, 1], 1000)).astype(np.float32) for _ in range(3))
    n = rng.integers(-1000, 1000, 1000, dtype=np.int32)
    text = run.xla_text(DIVISIONS)
    assert text.count("stablehlo.optimization_barrier") == 2  # float divisions only
    quotient, nested, integer = run.run_xla(DIVISIONS, [x, y, z, n])
    as_written = _run_xla_as_written(run, DIVISIONS, [x, y, z, n])
    # A division by a non-constant tensor and an integer division were already exact: unchanged.
    np.testing.assert_array_equal(quotient, as_written[0])
    np.testing.assert_array_equal(quotient, x / y)
    np.testing.assert_array_equal(integer, as_written[2])
    np.testing.assert_array_equal(integer, np.sign(n) * (np.abs(n) // 7))  # truncates toward zero
    # `(x / y) / z` is two correctly rounded divisions, as on the interpreter; XLA alone rewrites it to
    # `x / (y * z)`, which differs for many elements. (The barrier must cover the dividend for this.)
    assert np.count_nonzero(as_written[1] != (x / y) / z) > 50
    np.testing.assert_array_equal(nested, (x / y) / z)
    np.testing.assert_array_equal(nested, run.run_interpreter(DIVISIONS, [x, y, z, n])[1])
