"""Float32 arithmetic rounded where onnxruntime rounds it, whatever the engine fuses: the one place that
guards against XLA:CPU's floating-point contractions. Every lowering that needs a product rounded on its
own, or an FMA rounded once, imports it from here.

What XLA:CPU (jaxlib 0.10.2, measured) does to float32 arithmetic:
- it contracts an f32 `multiply` feeding an `add` into one FMA (77 % of random `a * b + c` rounded once
  where onnxruntime rounds twice);
- LLVM folds `fptrunc(fmul(fpext a, fpext b))` back into an f32 multiply, which is then contracted the
  same way: computing the product in f64 and converting it to f32 is not enough (999 of 4,096 random
  `a * b + c * d` rounded once); an `optimization_barrier` does not stop it either (XLA removes barriers
  before code generation);
- `stablehlo.reduce_precision` is bit manipulation in the emitted code, which no contraction sees
  through: an exact f64 product narrowed to f32's format by it, then converted (now exactly), is
  rounded once and never fused. That is the rule here (`round_to_float32`).
- (Division by a constant becomes a multiply by the reciprocal: `ops.exact_divide` guards that.)

Pinned by tests/backends/stablehlo/test_float32_rounding.py (on XLA:CPU and StableHLO's interpreter)
and, through the lowerings, by the bit-exact tests of tests/recurrent and
tests/backends/stablehlo/test_integer_ops.py against onnxruntime.
"""

from __future__ import annotations

from qconvert.ir.core import Value
from qconvert.ir.types import F32, F64, I64, RankedTensorType, element_type_of

from . import ops as hlo
from .lowering import LoweringContext

F32_EXPONENT_BITS = 8
F32_MANTISSA_BITS = 23


def round_to_float32(ctx: LoweringContext, value: Value) -> Value:
    """An f64 tensor rounded to the nearest f32 (ties to even), as an f32 tensor: `reduce_precision` to
    f32's format, then a conversion that is exact. Unlike `convert` alone, it stays one rounding when
    the f64 value is a product of f32 operands and an add follows (see the module docstring). Exact for
    results in f32's normal range; below 2**-126 `reduce_precision` flushes to (signed) zero where a
    conversion would give a subnormal (measured on XLA:CPU and StableHLO's interpreter alike)."""
    narrowed = hlo.reduce_precision(ctx.builder, value, F32_EXPONENT_BITS, F32_MANTISSA_BITS)
    return ctx.convert(narrowed, F32)


def rounded_product(ctx: LoweringContext, a: Value, b: Value) -> Value:
    """`a * b` for a product that feeds an add. In f32: computed in f64, where it is exact (24 + 24
    significant bits), rounded once by `round_to_float32` and never fused into the add. Other element
    types: a plain multiply (no guard needed)."""
    if element_type_of(a.type) != F32:
        return hlo.multiply(ctx.builder, a, b)
    product = hlo.multiply(ctx.builder, ctx.convert(a, F64), ctx.convert(b, F64))
    return round_to_float32(ctx, product)


def float32_fma(ctx: LoweringContext, a: Value, b: Value, c: Value) -> Value:
    """numerics `float32_fma`: `fma(a, b, c)` of f32 tensors with one rounding, as `vfmadd*ps` computes it
    (onnxruntime's QLinearAdd, MLAS's logistic / tanh polynomials), whether or not the engine contracts.
    The product is exact in f64 (two f32 of 24 significant bits each); the f64 sum is rounded to odd
    (two-sum error term; one step toward it when the rounded sum is even), so that converting it to f32
    rounds correctly."""
    builder = ctx.builder
    shape = hlo.tensor_type(a).shape
    product = hlo.multiply(builder, ctx.convert(a, F64), ctx.convert(b, F64))
    addend = ctx.convert(c, F64)
    total = hlo.add(builder, product, addend)
    virtual = hlo.subtract(builder, total, product)
    error = hlo.add(
        builder,
        hlo.subtract(builder, product, hlo.subtract(builder, total, virtual)),
        hlo.subtract(builder, addend, virtual),
    )
    zero = ctx.splat(0.0, F64, shape)
    bits = hlo.bitcast_convert(builder, total, RankedTensorType(tuple(shape), I64))
    low_bit = hlo.and_(builder, bits, ctx.splat(1, I64, shape))
    is_even = hlo.compare(builder, "EQ", low_bit, ctx.splat(0, I64, shape))
    inexact = hlo.compare(builder, "NE", error, zero)
    # nextafter(total, sign(error) * inf): the bit pattern moves up when error and total have one sign.
    error_positive = hlo.compare(builder, "GT", error, zero)
    same_sign = hlo.compare(builder, "EQ", error_positive, hlo.compare(builder, "GT", total, zero))
    step = hlo.select(builder, same_sign, ctx.splat(1, I64, shape), ctx.splat(-1, I64, shape))
    odd = hlo.bitcast_convert(builder, hlo.add(builder, bits, step), RankedTensorType(tuple(shape), F64))
    rounded_to_odd = hlo.select(builder, hlo.and_(builder, inexact, is_even), odd, total)
    return hlo.convert(builder, rounded_to_odd, F32)
