"""Lowering of the quant casts (`quant.qcast`, `quant.dcast`, `quant.scast`) in the three forms (the
quantized form's fusion is the pass of legalize_qdq_to_quantized_op.py).

- `qdq` / `quantized`: `quant.dcast` -> `stablehlo.uniform_dequantize` (its arithmetic,
  `f32(i32(q) - zp) * s`, is onnxruntime's DequantizeLinear bit for bit); `quant.scast` ->
  `stablehlo.bitcast_convert` between the storage integers and the `!quant.uniform` type; `quant.qcast`
  -> `stablehlo.uniform_quantize` when it computes ONNX's numbers, else (under `--semantics onnx`)
  ONNX-exact arithmetic then a bitcast to the quantized type, the op marked `qconvert.note = "..."`.
- `integer`: no quant types: qcast / dcast are the arithmetic, scast disappears (values are storage).

Decisions, one line each (measured on jaxlib 0.10.2 unless said otherwise):
- quantized constants are `stablehlo.constant` of the storage + `bitcast_convert` (both engines run it;
  a quant-typed constant over a storage `dense<>` also parses, but the bitcast keeps `dense_resource`
  weights as they are);
- under the jaxlib engine profile (the default, `engine_profile.JAXLIB`), u8 storage, per-axis types whose
  axis is not the last, and f16 / bf16 expressed types are written out in every form: quant-to-math (the
  interpreter's and XLA's path) reads u8 as signed, fails on such an axis, and accepts f32 only
  (`engine_limitation`); with no profile they stay quantized types;
- sub-channel (blocked) and float8 storage have no StableHLO quantized type: arithmetic in every form,
  block parameters expanded to full constants; f4E2M1FN is refused (no onnxruntime kernel to check it);

When uniform_quantize equals ONNX's QuantizeLinear: StableHLO computes `rne(clamp(x / s + zp))`, ONNX
`clamp(rne(x / s) + zp)`. With every zero point 0 the two agree for every non-NaN input (the bounds are
integers, so clamp and rounding commute); with any non-zero zero point `x / s + zp` can round to a
different integer (a tie when zp is odd, or a fraction lost in the f32 addition, e.g. zp = 2 and
x / s = 1.5 - 2**-23), so those quantizes are written out. The divide is f32 in both, as onnxruntime
divides (numerics `_quantize_onnx_integer`). NaN (ONNX: qmin, StableHLO engines: 0) is the one
difference left in the zero-zp case; `predicted_mismatches` counts it with the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qconvert.ir.attributes import BoolAttr
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.qconvert import FloatStorageCastOp
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp, StorageCastOp
from qconvert.ir.quant_types import (
    UNIFORM_TYPES,
    CalibratedQuantizedType,
    QuantizedType,
    uniform_params,
)
from qconvert.ir.types import F32, F64, FloatType, IntegerType, RankedTensorType, Type, element_type_of
from qconvert.numerics import Rounding, UniformParams, broadcast_params, quantize

from . import ops as hlo
from .lowering import Form, LoweringContext, Semantics, has_stablehlo_type, lowers, storage_element_type

FLOAT_STORAGE = ("f8E4M3FN", "f8E5M2")
"""Float storage StableHLO and XLA:CPU hold (the FNUZ types stay generic ONNX ops in the frontend; f4E2M1FN
has no onnxruntime kernel to check against)."""

NOTE_ONNX_ROUNDING = (
    "ONNX QuantizeLinear written out: clamp(round_nearest_even(x / s) + zp); uniform_quantize adds the "
    "zero point before rounding"
)
NOTE_NO_TYPE = "written out: StableHLO has no quantized type for sub-channel (blocked) or float storage"


# Parameters ----------------------------------------------------------------------------------------
def uniform_type(ctx: LoweringContext, type_: Type) -> QuantizedType:
    """The `!quant.uniform` element type of `type_` (per-tensor, per-axis or sub-channel), or
    `ctx.unsupported`; the container must be a static tensor."""
    element = element_type_of(type_)
    if isinstance(element, CalibratedQuantizedType):
        ctx.unsupported(f"{element} holds a calibrated range, not parameters: finalize the calibration first")
    if not isinstance(element, UNIFORM_TYPES):
        ctx.unsupported(f"no StableHLO lowering for the quantized type {element}")
    if isinstance(element.storage_type, FloatType) and element.storage_type.name not in FLOAT_STORAGE:
        ctx.unsupported(f"StableHLO has no {element.storage_type} element type to store {element}")
    if not isinstance(type_, RankedTensorType) or not type_.has_static_shape():
        ctx.unsupported(f"StableHLO needs a static shape, got {type_}")
    return element


def engine_limitation(ctx: LoweringContext, quant_type: QuantizedType, type_: Type) -> str | None:
    """Why uniform_quantize / uniform_dequantize of this type cannot be emitted, or None: StableHLO has no
    such type, or the engine profile says its engines get it wrong (`engine_profile.py`). The quantization
    is then written out as arithmetic whatever the form."""
    if not has_stablehlo_type(quant_type):
        return NOTE_NO_TYPE
    profile = ctx.engine_profile
    return profile.limitation(quant_type, type_) if profile is not None else None


def rounding_can_differ(quant_type: QuantizedType) -> bool:
    """True when `stablehlo.uniform_quantize` can give other numbers than ONNX's QuantizeLinear (non-NaN
    inputs): any non-zero zero point (see the module docstring)."""
    return bool(np.any(uniform_params(quant_type).zero_point != 0))


def predicted_mismatches(quant_type: QuantizedType, x: np.ndarray) -> int:
    """How many elements of `quantize(x)` differ between ONNX's rounding and `stablehlo.uniform_quantize`
    (numerics' two rules), for `x` the float input of one quantize node."""
    params = uniform_params(quant_type)
    onnx = quantize(x, params, Rounding.ONNX)
    stablehlo = quantize(x, params, Rounding.STABLEHLO)
    return int(np.count_nonzero(onnx != stablehlo))


def _parameter(
    ctx: LoweringContext, params: UniformParams, values: np.ndarray, element_type: Type, shape: Sequence[int]
) -> Value:
    """Parameter `values` (from `_scales` / `_zero_points`, or derived from them) as a tensor of `shape`:
    broadcast_in_dim of the per-tensor scalar or per-axis 1-D constant; sub-channel values are already
    expanded to `shape` (StableHLO cannot repeat blocks, and a ragged last block is allowed)."""
    if params.is_sub_channel:
        return ctx.constant(values, element_type)
    constant = ctx.constant(values, element_type)
    axis = params.quantized_dimension
    return hlo.broadcast_in_dim(ctx.builder, constant, shape, [] if axis is None else [axis])


def _scales(params: UniformParams, shape: Sequence[int]) -> np.ndarray:
    """The scales as the expressed type holds them (numerics `_scale_in`), in float64; sub-channel ones
    expanded to `shape` by numerics' rule."""
    scale = broadcast_params(params, tuple(shape))[0] if params.is_sub_channel else params.scale
    return scale.astype(params.expressed_dtype).astype(np.float64)


def _zero_points(params: UniformParams, shape: Sequence[int]) -> np.ndarray:
    """The zero points (int64); sub-channel ones expanded to `shape`."""
    return broadcast_params(params, tuple(shape))[1] if params.is_sub_channel else params.zero_point


def _compute_type(quant_type: QuantizedType) -> FloatType:
    """onnxruntime divides and multiplies in f32 (f16 / bf16 upcast); f64 stays f64 (numerics)."""
    return F64 if quant_type.expressed_type == F64 else F32


def _scale(ctx: LoweringContext, params: UniformParams, compute: FloatType, shape: Sequence[int]) -> Value:
    return _parameter(ctx, params, _scales(params, shape), compute, shape)


# Arithmetic -------------------------------------------------------------------------------------------
def quantize_arithmetic(
    ctx: LoweringContext, x: Value, quant_type: QuantizedType, semantics: Semantics, *, saturate: bool = True
) -> Value:
    """`x` (float) -> storage values, as ONNX (`clamp(rne(x / s) + zp)`, NaN -> qmin) or as
    uniform_quantize (`rne(clamp(x / s + zp))`) computes it, in plain StableHLO ops. Float8 storage:
    `convert(x / s)` (round to nearest even), clamped to the finite range first when `saturate`."""
    b = ctx.builder
    params = uniform_params(quant_type)
    shape = hlo.tensor_type(x).shape
    storage = storage_element_type(quant_type)
    compute = _compute_type(quant_type)
    quotient = hlo.exact_divide(b, ctx.convert(x, compute), _scale(ctx, params, compute, shape))
    low, high = params.storage_type_min, params.storage_type_max
    if isinstance(storage, FloatType):
        if saturate:  # stablehlo.clamp propagates NaN, as numpy's clip does in numerics
            quotient = hlo.clamp(b, ctx.scalar(low, compute), quotient, ctx.scalar(high, compute))
        return hlo.convert(b, quotient, storage)
    zero_point = _zero_points(params, shape)
    has_zero_point = bool(np.any(zero_point != 0))

    def parameter(values: np.ndarray, element_type: Type) -> Value:
        return _parameter(ctx, params, values, element_type, shape)

    if semantics is Semantics.STABLEHLO:
        shifted = quotient
        if has_zero_point:
            shifted = hlo.add(b, quotient, parameter(zero_point.astype(np.float64), compute))
        clamped = hlo.clamp(b, ctx.scalar(low, compute), shifted, ctx.scalar(high, compute))
        return hlo.convert(b, hlo.round_nearest_even(b, clamped), storage)
    rounded = hlo.round_nearest_even(b, quotient)
    if storage.width > 16 or compute == F64:  # type: ignore[union-attr]
        # Sum and clamp in f64, exact for 32-bit storage (numerics adds zp in float64 too).
        wide = ctx.convert(rounded, F64)
        if has_zero_point:
            wide = hlo.add(b, wide, parameter(zero_point.astype(np.float64), F64))
        is_nan = hlo.compare(b, "NE", wide, wide)
        wide = hlo.select(b, is_nan, ctx.splat(low, F64, shape), wide)
        clamped = hlo.clamp(b, ctx.scalar(low, F64), wide, ctx.scalar(high, F64))
        return hlo.convert(b, clamped, storage)
    # 8/16-bit storage: clamp the rounded quotient to [qmin - zp, qmax - zp] (exact f32 integers), add
    # zp in i32. NaN takes qmin - zp, so it stores qmin, as onnxruntime does.
    is_nan = hlo.compare(b, "NE", rounded, rounded)
    if params.is_per_tensor:
        low_shifted = ctx.scalar(low - int(zero_point), compute)
        high_shifted = ctx.scalar(high - int(zero_point), compute)
        nan_value = hlo.broadcast_in_dim(b, low_shifted, shape, [])
    else:
        low_shifted = parameter((low - zero_point).astype(np.float64), compute)
        high_shifted = parameter((high - zero_point).astype(np.float64), compute)
        nan_value = low_shifted
    cleaned = hlo.select(b, is_nan, nan_value, rounded)
    clamped = hlo.clamp(b, low_shifted, cleaned, high_shifted)
    integers = hlo.convert(b, clamped, IntegerType(32))
    if has_zero_point:
        integers = hlo.add(b, integers, parameter(zero_point, IntegerType(32)))
    return hlo.convert(b, integers, storage)


def dequantize_arithmetic(
    ctx: LoweringContext, q: Value, quant_type: QuantizedType, result_type: Type
) -> Value:
    """Storage values -> float: `compute(i32(q) - zp) * s`, then the expressed type (onnxruntime's
    DequantizeLinear and quant-to-math's uniform_dequantize alike); float8 storage `compute(q) * s`."""
    b = ctx.builder
    params = uniform_params(quant_type)
    shape = hlo.tensor_type(q).shape
    compute = _compute_type(quant_type)
    if isinstance(quant_type.storage_type, FloatType):
        values = ctx.convert(q, compute)
    else:
        integers = ctx.convert(q, IntegerType(32))
        zero_point = _zero_points(params, shape)
        if np.any(zero_point != 0):
            integers = hlo.subtract(b, integers, _parameter(ctx, params, zero_point, IntegerType(32), shape))
        values = ctx.convert(integers, compute)
    product = hlo.multiply(b, values, _scale(ctx, params, compute, shape))
    return ctx.convert(product, element_type_of(result_type))


# Lowerings ---------------------------------------------------------------------------------------------
def _saturate(op: Operation) -> bool:
    attribute = op.attributes.get("saturate")
    return attribute.value if isinstance(attribute, BoolAttr) else True


@lowers(QuantizeCastOp)
def lower_qcast(ctx: LoweringContext, op: Operation) -> list[Value]:
    (x,) = ctx.operands(op)
    result_type = op.result.type
    quant_type = uniform_type(ctx, result_type)
    if ctx.form is Form.INTEGER or not has_stablehlo_type(quant_type):
        return [quantize_arithmetic(ctx, x, quant_type, ctx.semantics, saturate=_saturate(op))]
    note = engine_limitation(ctx, quant_type, result_type)
    if note is None and ctx.semantics is Semantics.ONNX and rounding_can_differ(quant_type):
        note = NOTE_ONNX_ROUNDING
    if note is None:
        return [hlo.uniform_quantize(ctx.builder, x, result_type)]
    storage = quantize_arithmetic(ctx, x, quant_type, ctx.semantics)
    quantized = hlo.bitcast_convert(ctx.builder, storage, result_type)
    ctx.note(quantized, note)
    ctx.quantize_sources[quantized] = x
    return [quantized]


@lowers(DequantizeCastOp)
def lower_dcast(ctx: LoweringContext, op: Operation) -> list[Value]:
    (q,) = ctx.operands(op)
    quant_type = uniform_type(ctx, op.operands[0].type)
    if ctx.form is Form.INTEGER or not has_stablehlo_type(quant_type):
        return [dequantize_arithmetic(ctx, q, quant_type, op.result.type)]
    note = engine_limitation(ctx, quant_type, op.operands[0].type)
    if note is None:
        return [hlo.uniform_dequantize(ctx.builder, q, op.result.type)]
    storage_type = hlo.tensor_type(q).with_element_type(storage_element_type(quant_type))
    storage = hlo.bitcast_convert(ctx.builder, q, storage_type)
    result = dequantize_arithmetic(ctx, storage, quant_type, op.result.type)
    ctx.note(result, note)
    ctx.dequantize_sources[result] = q
    return [result]


@lowers(StorageCastOp)
def lower_scast(ctx: LoweringContext, op: Operation) -> list[Value]:
    (value,) = ctx.operands(op)
    source_type, result_type = op.operands[0].type, op.result.type
    quantized = source_type if isinstance(element_type_of(source_type), QuantizedType) else result_type
    uniform_type(ctx, quantized)
    target = ctx.convert_type(result_type)
    if isinstance(element_type_of(target), IntegerType):
        # quant -> storage: the storage type StableHLO spells (`ui8` for unsigned storage).
        target = target.with_element_type(storage_element_type(element_type_of(quantized)))  # type: ignore[attr-defined,arg-type]
    if value.type == target:
        return [value]
    # i8 <-> ui8 in the integer form, storage <-> !quant.uniform otherwise: a reinterpretation of the bits.
    return [hlo.bitcast_convert(ctx.builder, value, target)]


@lowers(FloatStorageCastOp)
def lower_float_storage_cast(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Float8 storage <-> its quant type: the values are the storage in every form, nothing to do."""
    (value,) = ctx.operands(op)
    source_type, result_type = op.operands[0].type, op.result.type
    quantized = source_type if isinstance(element_type_of(source_type), QuantizedType) else result_type
    uniform_type(ctx, quantized)
    return [value]
