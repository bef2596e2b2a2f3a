"""backends/stablehlo/float32_rounding.py on hard cases, on XLA:CPU and StableHLO's interpreter:
`round_to_float32` against numpy's f64 -> f32 conversion (ties to even, carries into the exponent,
negative values), `rounded_product` followed by an add against numpy's twice-rounded `a * b + c` (XLA:CPU
contracts the plain forms into one FMA), `float32_fma` against numerics' `float32_fma` (itself pinned
against onnxruntime's QLinearAdd), where one rounding and two differ."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from conftest import require_module

from qconvert.backends.stablehlo import ops as hlo
from qconvert.backends.stablehlo.float32_rounding import float32_fma, round_to_float32, rounded_product
from qconvert.backends.stablehlo.lowering import Form, LoweringContext, Semantics
from qconvert.ir.core import Block, Builder, Value
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp, ReturnOp
from qconvert.ir.printer import print_module
from qconvert.ir.types import F32, F64, FunctionType, RankedTensorType, Type
from qconvert.numerics import float32_fma as numerics_fma

pytestmark = pytest.mark.engine


def emit(argument_types: list[Type], result_type: Type, body: Callable[..., Value]) -> str:
    """A `@main` whose body is `body(ctx, *arguments)`, as MLIR text."""
    function = FuncOp.create("main", FunctionType(tuple(argument_types), (result_type,)))
    block = function.regions[0].append(Block(argument_types))
    ctx = LoweringContext(Builder(block), Form.INTEGER, Semantics.ONNX)
    result = body(ctx, *block.arguments)
    ctx.builder.insert(ReturnOp([result]))
    module = ModuleOp.create()
    module.body.append(function)
    return print_module(module)


@pytest.mark.parametrize("engine", ["xla", "interpreter"])
def test_round_to_float32_is_numpys_conversion(engine: str) -> None:
    require_module("jax")
    from qconvert.backends.stablehlo import run

    rng = np.random.default_rng(18)
    low = rng.uniform(-1e6, 1e6, 300).astype(np.float32)
    high = np.nextafter(low, np.float32(np.inf))
    middle = (low.astype(np.float64) + high.astype(np.float64)) / 2  # exact ties: even wins
    values = np.concatenate(
        [
            middle,
            np.nextafter(middle, np.inf),
            np.nextafter(middle, -np.inf),
            rng.standard_normal(300) * 10.0 ** rng.integers(-30, 30, 300),
            [0.0, -0.0, 1.0 - 2.0**-25, 2.0**24 + 1, -(2.0**24 + 1), (2.0 - 2.0**-24) * 2.0**10],
        ]
    )
    size = values.size
    text = emit(
        [RankedTensorType((size,), F64)],
        RankedTensorType((size,), F32),
        lambda ctx, x: round_to_float32(ctx, x),
    )
    (actual,) = run.run(text, [values], engine=engine)
    expected = values.astype(np.float32)
    assert np.asarray(actual).view(np.uint32).tolist() == expected.view(np.uint32).tolist()


def near_cancelling_operands(seed: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """f32 `a`, `b`, `c` where half the `c` cancel `a * b` to within a few ulp: there, rounding the product
    before the add and rounding `a * b + c` once give different results."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-255, 256, size).astype(np.float32)  # stored 8-bit values, as QLinearAdd feeds them
    b = rng.uniform(0.001, 4.0, size).astype(np.float32)
    c = rng.uniform(-300.0, 300.0, size).astype(np.float32)
    product = a.astype(np.float64) * b
    c[::2] = (-product[::2] + rng.uniform(-1e-3, 1e-3, size // 2)).astype(np.float32)
    return a, b, c


@pytest.mark.parametrize("engine", ["xla", "interpreter"])
def test_rounded_product_is_not_fused_into_a_following_add(engine: str) -> None:
    require_module("jax")
    from qconvert.backends.stablehlo import run

    a, b, c = near_cancelling_operands(17, 4000)
    shaped = RankedTensorType((a.size,), F32)
    text = emit(
        [shaped] * 3,
        shaped,
        lambda ctx, x, y, z: hlo.add(ctx.builder, rounded_product(ctx, x, y), z),
    )
    (actual,) = run.run(text, [a, b, c], engine=engine)
    expected = (a * b) + c  # numpy rounds the product, then the sum
    assert np.count_nonzero(expected != numerics_fma(a, b, c)) > 100  # the cases do tell the two apart
    assert np.asarray(actual).view(np.uint32).tolist() == expected.view(np.uint32).tolist()


@pytest.mark.parametrize("engine", ["xla", "interpreter"])
def test_float32_fma_rounds_once_as_numerics_does(engine: str) -> None:
    require_module("jax")
    from qconvert.backends.stablehlo import run

    a, b, c = near_cancelling_operands(19, 4000)
    shaped = RankedTensorType((a.size,), F32)
    text = emit([shaped] * 3, shaped, lambda ctx, x, y, z: float32_fma(ctx, x, y, z))
    (actual,) = run.run(text, [a, b, c], engine=engine)
    expected = numerics_fma(a, b, c)
    twice_rounded = (a * b).astype(np.float32) + c
    assert np.count_nonzero(expected != twice_rounded) > 100  # the cases do tell the two apart
    assert np.asarray(actual).view(np.uint32).tolist() == expected.view(np.uint32).tolist()
