"""run.py's `_fast_integer_products`: before XLA:CPU compiles, an integer convolution runs as f32
convolutions of base-2**b digits (each digit's sums below 2**24) and an integer dot_general whose sums stay
below 2**53 runs in f64 (XLA:CPU has no fast integer nor f64 convolution). Exactness is checked
against onnxruntime's ConvInteger / MatMulInteger, bit for bit, on large reductions with operands at
their extremes (the largest sums 8-bit operands can make), and the rewrite is shown to happen (f32 / f64
in the text XLA compiles) or not to happen when the operands' range is unknown (i32 arguments)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_module
from frontend.test_qoperator import build, onnxruntime_outputs
from onnx import helper

from qconvert.frontends.onnx import import_onnx

pytestmark = pytest.mark.engine


def _xla_text_and_outputs(model, inputs: dict[str, np.ndarray]) -> tuple[str, list[np.ndarray]]:
    """`model` converted (integer form, weights inline), the text XLA compiles, and XLA's outputs."""
    require_module("jax")
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text

    module = import_onnx(model, {name: array.shape for name, array in inputs.items()})
    text = stablehlo_text(module, form="integer", inline_weights=True)
    return run.xla_text(text), [np.asarray(a) for a in run.run_xla(text, list(inputs.values()))]


def _extremes(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Mostly the dtype's two ends (the largest products), some values in between."""
    info = np.iinfo(dtype)
    values = rng.choice(np.array([info.min, info.max], dtype), size=shape)
    middle = rng.random(shape) < 0.2
    values[middle] = rng.integers(info.min, info.max, size=int(middle.sum()), endpoint=True)
    return values.astype(dtype)


def test_conv_integer_large_reduction_runs_in_f32_digits_bit_exact() -> None:
    """512 input channels x kernel 3 (1536 products per output, |sum| up to 1536 * 255 * 255): exact."""
    rng = np.random.default_rng(7)
    x = np.full((1, 512, 40), 255, np.uint8)
    x[:, :, ::3] = 0
    x[:, 1::2, :] = 255 - x[:, 1::2, :]
    inputs = {"x": x, "xz": np.array(0, np.uint8)}
    weights = np.where(rng.random((64, 512, 3)) < 0.9, np.int8(-128), np.int8(127)).astype(np.int8)
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], name="ci", pads=[1, 1])
    model = build(node, inputs, {"w": weights, "wz": np.array(127, np.int8)})  # w - wz down to -255
    (expected,) = onnxruntime_outputs(model, inputs)
    assert np.abs(expected).max() > 2**24, "the test should need more than f32's exact integers"
    text, (actual,) = _xla_text_and_outputs(model, inputs)
    assert "tensor<64x512x3xf32>" in text, "the convolution was not rewritten to f32"
    assert "xi32>) -> tensor<1x64x40xi32>" not in text, "an i32 convolution is left"
    assert actual.dtype == np.int32
    np.testing.assert_array_equal(actual, expected)


def test_matmul_integer_large_reduction_runs_in_f64_bit_exact() -> None:
    """K = 4096 with per-column zero points: exact against onnxruntime's MatMulInteger."""
    rng = np.random.default_rng(11)
    a = _extremes(rng, np.uint8, (8, 4096))
    inputs = {"a": a, "az": np.array(3, np.uint8)}
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"], name="mi")
    b = _extremes(rng, np.int8, (4096, 16))
    model = build(node, inputs, {"b": b, "bz": _extremes(rng, np.int8, (16,))})
    (expected,) = onnxruntime_outputs(model, inputs)
    text, (actual,) = _xla_text_and_outputs(model, inputs)
    assert "xf64>" in text and "dot_general" in text
    np.testing.assert_array_equal(actual, expected)


def test_i32_arguments_keep_the_integer_product() -> None:
    """Operands of unknown range (i32 arguments) could exceed 2**53: the dot stays i32 and wraps as i32."""
    require_module("jax")
    from qconvert.backends.stablehlo import run

    text = """module {
  func.func @main(%a: tensor<2x3xi32>, %b: tensor<3x2xi32>) -> tensor<2x2xi32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]
      : (tensor<2x3xi32>, tensor<3x2xi32>) -> tensor<2x2xi32>
    return %0 : tensor<2x2xi32>
  }
}"""
    assert "f64" not in run.xla_text(text)
    a = np.array([[2**30, 2**30, 5], [-7, 1, 2**31 - 1]], np.int32)
    b = np.array([[3, 1], [2, -1], [4, 2**30]], np.int32)
    expected = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)  # numpy's cast wraps
    np.testing.assert_array_equal(run.run_xla(text, [a, b])[0], expected)


def test_conv_integer_needing_three_digits_bit_exact() -> None:
    """2048 channels x k3, groups of 2: each digit's f32 sums must stay below 2**24, so the centered input
    (up to 510 in magnitude) is split into three digits; the i32 recombination is exact."""
    rng = np.random.default_rng(5)
    x = _extremes(rng, np.uint8, (1, 4096, 12))
    inputs = {"x": x, "xz": np.array(255, np.uint8)}  # x - xz down to -255
    node = helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], name="ci", pads=[1, 1], group=2)
    model = build(node, inputs, {"w": _extremes(rng, np.int8, (8, 2048, 3))})
    (expected,) = onnxruntime_outputs(model, inputs)
    text, (actual,) = _xla_text_and_outputs(model, inputs)
    assert text.count("stablehlo.convolution") == 3, "expected three f32 digit convolutions"
    assert "tensor<1x4096x12xf32>" in text
    np.testing.assert_array_equal(actual, expected)
