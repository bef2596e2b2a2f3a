"""Builders of quantized StableHLO arithmetic through i32 accumulators, as onnxruntime's integer kernels
(QLinearConv, QLinearMatMul, QGemm) compute it; used by the fusion pass (legalize_qdq_to_quantized_op.py,
`--fuse-arithmetic`) and by the QOperator lowerings (onnx_qoperator.py). Reference §3.3, §3.4.

A contraction's quantized result is an i32 accumulator `!quant.uniform<i32:f32[:axis], f32(s_x * s_w)>`
(zero point 0), so quant-to-math's combined scale `s_x s_w / s_acc` is 1 within 1e-7 and the accumulation
stays exact (no float shortcut); the int32 bias is added in that domain (a quantized `add` of identical
types is an integer add), then the accumulator is requantized to the output type. quant-to-math
requantizes with `rne(clamp(f32(acc) * f32(s_acc / s_y) + zp))`, onnxruntime (numerics `requantize_mlas`)
with `clamp(rne(f32(acc) * f32(s_x s_w / s_y))) + zp`: the multipliers are the same float (s_acc is the
f32 product, and a double quotient of two floats rounded to f32 is the f32 quotient); adding the zero
point before rounding can differ on ties when zp is odd. Under `--semantics onnx` a requantize whose
zero point is not 0 is therefore written out as `requantize_mlas` (like lower_quant's quantizes); under
`--semantics stablehlo` it is a `uniform_quantize`.

What does not qualify raises `NotFused` with the reason (the fusion writes it to the float op's note).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from qconvert import numerics
from qconvert.ir.attributes import Attribute
from qconvert.ir.core import Builder, GenericOp, Value
from qconvert.ir.quant_types import QuantizedType, UniformQuantizedPerAxisType, UniformQuantizedType
from qconvert.ir.types import F32, IntegerType, RankedTensorType, Type, element_type_of

from . import ops as hlo
from .lowering import Semantics, attach_note, dense_constant, numpy_dtype


class HasSemantics(Protocol):
    """What `requantize` reads of its context: a LoweringContext, or the fusion's QdqSources."""

    semantics: Semantics


I32 = IntegerType(32)
SCALE_TOLERANCE = 1e-6
"""Relative difference allowed between the bias scale and f32(s_x * s_w) (onnxruntime's quantizer writes
the f32 product; the integer kernels add the bias without looking at its scale)."""


def typed_op(
    b: Builder, name: str, operands: list[Value], result_type: Type, **attributes: Attribute
) -> Value:
    """An op with an explicit result type (ops.py's constructors derive it, which loses quant types)."""
    return b.insert(GenericOp(name, operands, [result_type], attributes)).result


class NotFused(Exception):
    """Why a matched QDQ pattern is left unfused (written to the float op's `qconvert.note`)."""


def per_tensor_signed_8bit(type_: Type, what: str) -> UniformQuantizedType:
    element = element_type_of(type_)
    if not isinstance(element, UniformQuantizedType):
        raise NotFused(f"{what} is {element}, StableHLO needs it per-tensor")
    check_storage(element, what)
    return element


def check_storage(element: QuantizedType, what: str) -> None:
    if not element.is_signed:
        raise NotFused(f"{what} has unsigned storage, which quant-to-math reads as signed")
    if element.storage_type != IntegerType(8) or element.expressed_type != F32:
        raise NotFused(f"{what} is {element}; fused contractions take i8 storage, f32 expressed")


def weight_scales(element: QuantizedType, axis_wanted: int, what: str) -> tuple[np.ndarray, bool]:
    """The weight's scales (float64 values of f32 numbers) and whether it is per-axis; checks zp == 0
    and that a per-axis weight is quantized on `axis_wanted`."""
    check_storage(element, what)
    if isinstance(element, UniformQuantizedType):
        if element.zero_point != 0:
            raise NotFused(f"{what} has zero point {element.zero_point}; StableHLO needs 0")
        return np.asarray([element.scale], np.float64), False
    if not isinstance(element, UniformQuantizedPerAxisType):
        raise NotFused(f"{what} is {element}")
    if any(zp != 0 for zp in element.zero_points):
        raise NotFused(f"{what} has non-zero zero points; StableHLO needs 0")
    if element.quantized_dimension != axis_wanted:
        raise NotFused(
            f"{what} is quantized on axis {element.quantized_dimension}, not on the output feature "
            f"axis {axis_wanted}"
        )
    return np.asarray(element.scales, np.float64), True


def accumulator_type(
    lhs: UniformQuantizedType,
    weight_scales: np.ndarray,
    per_axis: bool,
    axis: int,
    features: int,
    bias: Value | None,
) -> QuantizedType:
    """`i32:f32[:axis]` with scales f32(s_x * s_w) (what onnxruntime multiplies in f32), zero point 0.
    A bias must be `features` int32 values with zero point 0 and those scales (within SCALE_TOLERANCE)."""
    scales = numerics.accumulator_scale_onnxruntime(lhs.scale, weight_scales).astype(np.float64)
    if bias is not None:
        bias_type = element_type_of(bias.type)
        if hlo.tensor_type(bias).shape != (features,):
            raise NotFused(f"the bias has shape {list(hlo.tensor_type(bias).shape)}, not [{features}]")
        if not isinstance(bias_type, QuantizedType) or bias_type.storage_type != I32:
            raise NotFused(f"the bias is {bias_type}, not int32")
        if isinstance(bias_type, UniformQuantizedPerAxisType):
            bias_scales, bias_zps = np.asarray(bias_type.scales), np.asarray(bias_type.zero_points)
        elif isinstance(bias_type, UniformQuantizedType):
            bias_scales, bias_zps = np.asarray([bias_type.scale]), np.asarray([bias_type.zero_point])
        else:
            raise NotFused(f"the bias is {bias_type}")
        if np.any(bias_zps != 0):
            raise NotFused("the bias has a non-zero zero point")
        if not np.allclose(bias_scales, scales, rtol=SCALE_TOLERANCE, atol=0):
            raise NotFused("the bias scale is not s_input * s_weight")
    common = {"storage_type": I32, "expressed_type": F32, "is_signed": True}
    if per_axis:
        return UniformQuantizedPerAxisType(
            **common,
            scales=tuple(float(s) for s in scales),
            zero_points=(0,) * scales.size,
            quantized_dimension=axis,
        )  # type: ignore[arg-type]
    return UniformQuantizedType(**common, scale=float(scales[0]), zero_point=0)  # type: ignore[arg-type]


# Emission ------------------------------------------------------------------------------------------------
def with_axis(element: QuantizedType, axis: int) -> QuantizedType:
    if isinstance(element, UniformQuantizedPerAxisType):
        return dataclasses.replace(element, quantized_dimension=axis)
    return element


def transpose_quantized(b: Builder, value: Value, permutation: list[int]) -> Value:
    """A transpose that moves a per-axis type's axis with its dim."""
    element = element_type_of(value.type)
    if isinstance(element, UniformQuantizedPerAxisType):
        element = with_axis(element, permutation.index(element.quantized_dimension))
    shape = hlo.tensor_type(value).shape
    result_type = RankedTensorType(tuple(shape[p] for p in permutation), element)
    return typed_op(b, "stablehlo.transpose", [value], result_type, permutation=hlo.i64_array(permutation))


def reinterpret(b: Builder, value: Value, element: Type) -> Value:
    """`value`'s storage bits under another element type (quantized -> storage -> quantized)."""
    source = element_type_of(value.type)
    shape = hlo.tensor_type(value).shape
    if isinstance(source, QuantizedType):
        value = hlo.bitcast_convert(b, value, RankedTensorType(shape, source.storage_type))
    if element_type_of(value.type) == element:
        return value
    return hlo.bitcast_convert(b, value, RankedTensorType(shape, element))


def add_bias(b: Builder, acc: Value, bias: Value, axis: int) -> Value:
    """acc + bias (1-D along `axis`), the bias reinterpreted as the accumulator's type: an exact i32 add."""
    acc_type = element_type_of(acc.type)
    assert isinstance(acc_type, QuantizedType)
    bias_value = reinterpret(b, bias, with_axis(acc_type, 0))
    broadcast = typed_op(
        b,
        "stablehlo.broadcast_in_dim",
        [bias_value],
        RankedTensorType(hlo.tensor_type(acc).shape, acc_type),
        broadcast_dimensions=hlo.i64_array([axis]),
    )
    return hlo.add(b, acc, broadcast)


def requantize(
    ctx: HasSemantics, b: Builder, acc: Value, output: UniformQuantizedType, result_shape: tuple[int, ...]
) -> Value:
    """The accumulator requantized to `output`: uniform_quantize, or (`--semantics onnx` and zp != 0)
    numerics' `requantize_mlas` written out: `clamp(rne(f32(acc) * m), qmin - zp, qmax - zp) + zp`."""
    result_type = RankedTensorType(result_shape, output)
    if ctx.semantics is Semantics.STABLEHLO or output.zero_point == 0:
        return hlo.uniform_quantize(b, acc, result_type)
    acc_type = element_type_of(acc.type)
    assert isinstance(acc_type, QuantizedType)
    if isinstance(acc_type, UniformQuantizedPerAxisType):
        acc_scales, axis = np.asarray(acc_type.scales, np.float64), [acc_type.quantized_dimension]
    else:
        acc_scales, axis = np.asarray([acc_type.scale], np.float64), None  # type: ignore[attr-defined]
    multiplier = numerics.requantize_multiplier_onnxruntime(acc_scales, output.scale)
    integers = reinterpret(b, acc, I32)
    values = hlo.convert(b, integers, F32)
    if axis is None:
        scalar = dense_constant(b, np.asarray(float(multiplier[0])), F32)
        factor = hlo.broadcast_in_dim(b, scalar, result_shape, [])
    else:
        factor = hlo.broadcast_in_dim(b, dense_constant(b, multiplier, F32), result_shape, axis)
    product = hlo.multiply(b, values, factor)
    zp = output.zero_point
    low = dense_constant(b, np.asarray(float(output.storage_type_min - zp)), F32)
    high = dense_constant(b, np.asarray(float(output.storage_type_max - zp)), F32)
    rounded = hlo.round_nearest_even(b, hlo.clamp(b, low, product, high))
    rounded_integers = hlo.convert(b, rounded, I32)
    zero_points = dense_constant(b, np.full(tuple(result_shape), zp, dtype=numpy_dtype(I32)), I32)
    shifted = hlo.add(b, rounded_integers, zero_points)
    storage = hlo.convert(b, shifted, output.storage_type)
    quantized = hlo.bitcast_convert(b, storage, result_type)
    attach_note(
        quantized,
        "requantize written out as onnxruntime's MlasRequantizeOutput (zero point added after rounding)",
    )
    return quantized
