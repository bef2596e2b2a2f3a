"""stablehlo-quant-legalize-to-tosa-rescale: every change of scale in StableHLO's quantized form becomes a
`tosa.rescale` (32-bit multiplier and shift from `qconvert.numerics.tosa.compute_multiplier_and_shift`).

- `uniform_quantize` of a quantized value (the i32 accumulator of a fused convolution / dot_general / add,
  or an i8 / i16 value requantized): one rescale, per channel when either side is per-axis (on the last
  dim, where NHWC puts the channels), then a clamp when the result's storage range is narrowed.
- The mean over spatial dims the quantized form leaves as a float island (GlobalAveragePool, ReduceMean:
  `uniform_dequantize -> reduce add -> divide by N -> [reshape] -> uniform_quantize`): the storage less its
  zero point in i32, `tosa.reduce_sum` per reduced dim, one rescale by `s_in / (N * s_out)`, so the result
  is rounded once, as onnxruntime's float mean quantized is.

Quantize / dequantize at the function boundary are convert.py's (storage in and out).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from qconvert.ir.attributes import DenseArrayAttr
from qconvert.ir.core import Builder, GenericOp, Operation, Value
from qconvert.ir.quant_types import (
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedType,
    uniform_params,
)
from qconvert.ir.types import I8, I32, I64, FloatType, IntegerType, RankedTensorType, element_type_of
from qconvert.numerics.tosa import TosaRounding, compute_multiplier_and_shift
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .storage import (
    Refusals,
    broadcast_source,
    constant_of,
    is_uniform,
    materialize,
    quant_type,
    replace_with_storage,
    storage_of,
    storage_type,
)

__all__ = [
    "INT16_ZERO_POINT",
    "FloatClampToClamp",
    "FloatConvToQuantizedConv",
    "FloatDotToQuantizedDot",
    "FloatMeanToReduceSum",
    "FloatProductToMul",
    "FloatSumToAccumulatorAdd",
    "PerChannelWeightZeroPoints",
    "RequantizeToRescale",
    "rescale_to",
    "exact_to_i32",
    "storage_zero_point",
]


I16 = IntegerType(16)
INT16_ZERO_POINT = (
    "a 16-bit activation with a non-zero zero point (TOSA's int16 ops take zero point 0: quantize 16-bit "
    "activations symmetrically, e.g. onnxruntime's ActivationSymmetric=True)"
)


def storage_zero_point(type_: QuantizedType) -> np.ndarray:
    """The zero point(s) as TOSA's signless storage holds them (an unsigned 200 of 8 bits is -56)."""
    params = uniform_params(type_)
    width = type_.storage_type.width  # type: ignore[union-attr]
    zero_points = np.asarray(params.zero_point, np.int64).reshape(-1)
    return np.where(zero_points >= 1 << (width - 1), zero_points - (1 << width), zero_points)


def _scales(type_: QuantizedType) -> np.ndarray:
    return np.asarray(uniform_params(type_).scale, np.float64).reshape(-1)


def _width(type_: object) -> int:
    element = element_type_of(type_)  # type: ignore[arg-type]
    if isinstance(element, QuantizedType):
        return element.storage_type.width  # type: ignore[union-attr]
    assert isinstance(element, IntegerType), f"not an integer: {element}"
    return element.width


def rescale_to(
    b: Builder,
    storage: Value,
    scale: np.ndarray,
    input_zp: int,
    output_zp: int,
    result_type: RankedTensorType,
    rounding: TosaRounding,
    *,
    input_unsigned: bool = False,
    output_unsigned: bool = False,
) -> Value:
    """`tosa.rescale` of storage integers by `scale` (one value, or one per channel of the last dim).

    ValueError when TOSA cannot take the scale (too large for a 32-bit multiplier)."""
    input_element = element_type_of(storage.type)
    if output_unsigned and _width(input_element) > 16:
        # TOSA: no RESCALE from i32 to an unsigned output (ERROR_IF): to i8 re-centred by 128, then an
        # exact i8 -> u8 rescale (both exact: the second only reads the bits as unsigned)
        centred = (output_zp & 0xFF) - 128
        signed = rescale_to(b, storage, scale, input_zp, centred, result_type, rounding)
        return rescale_to(
            b, signed, np.array([1.0]), centred, output_zp, result_type, rounding, output_unsigned=True
        )
    if input_unsigned and _width(result_type) > 16:
        # TOSA: no RESCALE from an unsigned input to i32 (ERROR_IF): to i8 re-centred by 128 first (exact)
        centred = (input_zp & 0xFF) - 128
        signed = rescale_to(
            b,
            storage,
            np.array([1.0]),
            input_zp,
            centred,
            storage.type,  # type: ignore[arg-type]
            rounding,
            input_unsigned=True,
        )
        return rescale_to(b, signed, scale, centred, output_zp, result_type, rounding)
    multiplier, shift = compute_multiplier_and_shift(np.asarray(scale, np.float64).reshape(-1))
    per_channel = multiplier.size > 1
    if per_channel and multiplier.size != result_type.shape[-1]:
        raise ValueError(f"{multiplier.size} scales for {result_type.shape[-1]} channels")
    return ops.rescale(
        b,
        storage,
        ops.const(b, multiplier, I32),
        ops.const(b, shift, I8),
        ops.zero_point(b, input_zp, input_element),
        ops.zero_point(b, output_zp, result_type.element_type),
        result_type,
        rounding=rounding,
        per_channel=per_channel,
        input_unsigned=input_unsigned,
        output_unsigned=output_unsigned,
    )


def clamp_to_range(b: Builder, storage: Value, type_: QuantizedType) -> Value:
    """A clamp to the type's storage range when it is narrower than its integers' (`i8<-127:127>`)."""
    width = type_.storage_type.width  # type: ignore[union-attr]
    low, high = (
        (0, (1 << width) - 1) if not type_.is_signed else (-(1 << (width - 1)), (1 << (width - 1)) - 1)
    )
    if (type_.storage_type_min, type_.storage_type_max) == (low, high):
        return storage
    if not type_.is_signed:
        raise ValueError(f"a narrowed unsigned storage range ({type_}) is not supported yet")
    return ops.clamp(b, storage, type_.storage_type_min, type_.storage_type_max)


def rescale_into(
    b: Builder,
    storage: Value,
    scale: np.ndarray,
    input_zp: int,
    target: QuantizedType,
    result_type: RankedTensorType,
    rounding: TosaRounding,
    *,
    input_unsigned: bool = False,
) -> Value:
    """`rescale_to` the storage of `target` (its zero point, signedness and shape `result_type`'s), clamped
    to its storage range. ValueError as `rescale_to` and `clamp_to_range`."""
    rescaled = rescale_to(
        b,
        storage,
        scale,
        input_zp,
        int(storage_zero_point(target)[0]),
        storage_type(result_type),
        rounding,
        input_unsigned=input_unsigned,
        output_unsigned=not target.is_signed,
    )
    return clamp_to_range(b, rescaled, target)


def _refuse_unless_rescalable(
    refusals: Refusals, op: Operation, source: QuantizedType, target: QuantizedType, rank: int
) -> str | None:
    """Why TOSA cannot rescale `source` to `target` (None when it can)."""
    for type_ in (source, target):
        if not is_uniform(type_):
            return f"{type_} is not a uniform quantized type"
        if isinstance(type_, UniformQuantizedPerAxisType) and type_.quantized_dimension != rank - 1:
            return f"per-axis quantization on dim {type_.quantized_dimension}, not the last (channels)"
    if _width(source) not in (8, 16, 32) or _width(target) not in (8, 16, 32):
        return "storage widths other than 8, 16 or 32 bits"
    for type_, side in ((source, "input"), (target, "output")):
        zero_points = storage_zero_point(type_)
        if np.any(zero_points != zero_points[0]):
            return f"per-channel {side} zero points"
        if _width(type_) != 8 and not (zero_points == 0).all():
            return f"a non-zero {side} zero point on {_width(type_)}-bit storage"
    return None


class RequantizeToRescale:
    """`uniform_quantize(x: quantized) -> quantized` as `tosa.rescale(storage(x))`."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, rounding: TosaRounding, refusals: Refusals) -> None:
        self.rounding, self.refusals = rounding, refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        source, target = quant_type(op.operands[0]), quant_type(op.result)
        if source is None or target is None:
            return False  # a quantize of a float: the boundary or a float island
        result_type = op.result.type
        assert isinstance(result_type, RankedTensorType)
        reason = _refuse_unless_rescalable(self.refusals, op, source, target, result_type.rank)
        if reason is not None:
            return self.refusals.refuse(op, reason)
        scale = _scales(source) / _scales(target)
        try:
            rescaled = rescale_into(
                rewriter,
                storage_of(rewriter, op.operands[0]),
                scale,
                int(storage_zero_point(source)[0]),
                target,
                result_type,
                self.rounding,
                input_unsigned=not source.is_signed,
            )
        except ValueError as error:
            return self.refusals.refuse(op, str(error))
        replace_with_storage(rewriter, op, [rescaled])
        return True


def _producer(value: Value, name: str) -> Operation | None:
    producer = value.owner_op()
    return producer if producer is not None and producer.name == name else None


def _is_add_reduction(op: Operation) -> bool:
    """A `stablehlo.reduce` whose body adds its two arguments and whose init value is the constant 0."""
    body = op.regions[0].entry if op.regions and op.regions[0].blocks else None
    if body is None or len(body.ops) != 2 or body.ops[0].name != "stablehlo.add":
        return False
    if set(body.ops[0].operands) != set(body.arguments):
        return False
    init = constant_of(op.operands[1])
    return init is not None and init.size == 1 and float(init.reshape(-1)[0]) == 0.0


class FloatMeanToReduceSum:
    """`uniform_quantize(reshape?(divide(reduce_add(uniform_dequantize(q)), N)))` as integer sums and one
    rescale by `s_in / (N * s_out)`."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, rounding: TosaRounding, refusals: Refusals) -> None:
        self.rounding, self.refusals = rounding, refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        if target is None or quant_type(op.operands[0]) is not None:
            return False
        value = op.operands[0]
        reshape = _producer(value, "stablehlo.reshape")
        if reshape is not None:
            value = reshape.operands[0]
        divide = _producer(value, "stablehlo.divide")
        if divide is None:
            return False
        reduce = _producer(divide.operands[0], "stablehlo.reduce")
        divisor = constant_of(divide.operands[1])
        if reduce is None or divisor is None or not _is_add_reduction(reduce):
            return False
        dequantize = _producer(reduce.operands[0], "stablehlo.uniform_dequantize")
        if dequantize is None:
            return False
        source = quant_type(dequantize.operands[0])
        input_type = dequantize.operands[0].type
        assert isinstance(input_type, RankedTensorType) and source is not None
        dimensions = [int(d) for d in reduce.attributes["dimensions"].values]  # type: ignore[attr-defined]
        count = int(np.prod([input_type.shape[d] for d in dimensions]))
        if not np.all(divisor == divisor.reshape(-1)[0]) or float(divisor.reshape(-1)[0]) != float(count):
            return False  # a divide by something else than the element count: not a mean
        for type_ in (source, target):
            if isinstance(type_, UniformQuantizedPerAxisType) or not is_uniform(type_):
                return self.refusals.refuse(op, f"a mean of per-axis or non-uniform values ({type_})")
            if _width(type_) not in (8, 16):
                return self.refusals.refuse(op, "a mean of other than 8 / 16-bit values")
            if _width(type_) == 16 and int(storage_zero_point(type_)[0]) != 0:
                return self.refusals.refuse(op, INT16_ZERO_POINT)
        if not isinstance(element_type_of(reduce.operands[0].type), FloatType):
            return False
        wide_type = RankedTensorType(input_type.shape, I32)
        sums = rescale_to(
            rewriter,
            storage_of(rewriter, dequantize.operands[0]),
            np.array([1.0]),
            int(storage_zero_point(source)[0]),
            0,
            wide_type,
            self.rounding,
            input_unsigned=not source.is_signed,
        )
        for dimension in dimensions:
            sums = ops.reduce_sum(rewriter, sums, dimension)
        result_type = op.result.type
        assert isinstance(result_type, RankedTensorType)
        sums = ops.reshape(rewriter, sums, result_type.shape)
        scale = _scales(source) / (count * _scales(target))
        try:
            mean = rescale_into(rewriter, sums, scale, 0, target, result_type, self.rounding)
        except ValueError as error:
            return self.refusals.refuse(op, str(error))
        replace_with_storage(rewriter, op, [mean])
        return True


_FLOAT_WRAPPERS = ("stablehlo.convert", "stablehlo.reduce_precision")
"""Ops the StableHLO backend wraps a float product in to round it as onnxruntime does (to f64 and back):
the integer product below is exact, so they are looked through."""


def _unwrapped(value: Value) -> Value:
    producer = value.owner_op()
    while producer is not None and producer.name in _FLOAT_WRAPPERS:
        value = producer.operands[0]
        producer = value.owner_op()
    return value


def _dequantized_operand(value: Value) -> tuple[Value, list[int] | None] | None:
    """`(q, dims)` when `value` is `uniform_dequantize(q)`, possibly broadcast (`dims`: its broadcast
    dimensions); None otherwise."""
    value = _unwrapped(value)
    producer = value.owner_op()
    dims = None
    if producer is not None and producer.name == "stablehlo.broadcast_in_dim":
        dims = [int(d) for d in producer.attributes["broadcast_dimensions"].values]  # type: ignore[attr-defined]
        value = _unwrapped(producer.operands[0])
        producer = value.owner_op()
    if producer is None or producer.name != "stablehlo.uniform_dequantize":
        return None
    source = producer.operands[0]
    broadcast = source.owner_op()
    if dims is None and broadcast is not None and broadcast.name == "stablehlo.broadcast_in_dim":
        # the broadcast moved onto the quantized value (DequantizeThroughDataMovement), not yet legalized
        dims = [int(d) for d in broadcast.attributes["broadcast_dimensions"].values]  # type: ignore[attr-defined]
        source = broadcast.operands[0]
    return source, dims


class FloatProductToMul:
    """`uniform_quantize(dequantize(a) * dequantize(b))` (b possibly broadcast, the product possibly
    wrapped in float conversions) as `rescale(mul(a - za, b - zb) in i32, s_a * s_b / s_out)`: exact
    products, one rounding (upstream's stablehlo-quant-legalize-to-tosa-rescale multiplies the same way)."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, rounding: TosaRounding, refusals: Refusals) -> None:
        self.rounding, self.refusals = rounding, refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        if target is None or quant_type(op.operands[0]) is not None:
            return False
        product = _unwrapped(op.operands[0]).owner_op()
        if product is None or product.name != "stablehlo.multiply":
            return False
        operands = [_dequantized_operand(operand) for operand in product.operands]
        if any(operand is None for operand in operands):
            return False
        result_type = op.result.type
        assert isinstance(result_type, RankedTensorType)
        factors = []
        for source, dims in operands:  # type: ignore[misc]
            type_ = quant_type(source)
            if (
                not is_uniform(type_)
                or isinstance(type_, UniformQuantizedPerAxisType)
                or _width(type_) not in (8, 16)
            ):
                return self.refusals.refuse(op, f"a product of {type_} values (per-tensor i8 / i16 only)")
            storage = broadcast_source(storage_of(rewriter, source))  # TOSA's mul broadcasts dims of 1
            source_type = storage.type
            assert isinstance(source_type, RankedTensorType) and type_ is not None
            wide = rescale_to(
                rewriter,
                storage,
                np.array([1.0]),
                int(storage_zero_point(type_)[0]),
                0,
                RankedTensorType(source_type.shape, I32),
                self.rounding,
                input_unsigned=not type_.is_signed,
            )
            if dims is not None:
                shape = [1] * result_type.rank
                for index, dim in enumerate(dims):
                    shape[dim] = source_type.shape[index]
                wide = ops.reshape(rewriter, wide, shape)
            elif source_type.rank != result_type.rank:
                return self.refusals.refuse(op, "a product of tensors of different ranks")
            factors.append((wide, float(_scales(type_)[0])))
        (lhs, lhs_scale), (rhs, rhs_scale) = factors
        integer_product = ops.mul(rewriter, lhs, rhs, ops.zero_point(rewriter, 0, I8))
        try:
            value = rescale_into(
                rewriter,
                integer_product,
                np.array([lhs_scale * rhs_scale]) / _scales(target),
                0,
                target,
                result_type,
                self.rounding,
            )
        except ValueError as error:
            return self.refusals.refuse(op, str(error))
        replace_with_storage(rewriter, op, [value])
        return True


class FloatDotToQuantizedDot:
    """`uniform_quantize(dot_general(dequantize(a), dequantize(b)))` (attention's activation x activation
    products, which StableHLO's quantized dot_general cannot take with a non-zero rhs zero point) as the
    quantized `dot_general(a, b)` into an i32 accumulator of scale `s_a * s_b`, then `uniform_quantize` of it:
    the next sweep makes them tosa.matmul (both zero points its operands) and one rescale."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        dot = _unwrapped(op.operands[0]).owner_op()
        bias_add = dot if dot is not None and dot.name == "stablehlo.add" else None
        if bias_add is not None:
            dot = self._biased_dot(bias_add)
        if target is None or dot is None or dot.name != "stablehlo.dot_general":
            return False
        sources = []
        for operand in dot.operands:
            producer = _unwrapped(operand).owner_op()
            if producer is None or producer.name != "stablehlo.uniform_dequantize":
                return False
            sources.append(producer.operands[0])
        types = [quant_type(source) for source in sources]
        dot_type = dot.results[0].type
        assert isinstance(dot_type, RankedTensorType)
        per_axis_rhs = isinstance(types[1], UniformQuantizedPerAxisType) and _width(types[1]) == 8
        if not isinstance(types[0], UniformQuantizedType) or _width(types[0]) not in (8, 16):
            return self.refusals.refuse(op, f"a float product of {types} (per-tensor 8 / 16-bit lhs only)")
        if _width(types[0]) == 16 and int(storage_zero_point(types[0])[0]) != 0:
            return self.refusals.refuse(op, INT16_ZERO_POINT)
        if not (isinstance(types[1], UniformQuantizedType) and _width(types[1]) == 8) and not per_axis_rhs:
            return self.refusals.refuse(op, f"a float product of {types} (8-bit rhs only)")
        if bias_add is not None and _width(types[0]) != 16:
            return False  # 8-bit Gemm / MatMul + bias: the StableHLO fusion's or the later patterns' case
        accumulator: QuantizedType
        if per_axis_rhs:  # constant weights per output column (MatMul's per-channel weights)
            output_dim = PerChannelWeightZeroPoints.output_dim(dot, types[1].quantized_dimension)  # type: ignore[union-attr]
            if output_dim is None:
                return self.refusals.refuse(op, "per-axis weights on another dim than the outputs")
            accumulator = UniformQuantizedPerAxisType(
                storage_type=I32,
                expressed_type=types[0].expressed_type,
                scales=tuple(float(types[0].scale) * float(s) for s in _scales(types[1])),  # type: ignore[union-attr]
                zero_points=(0,) * _scales(types[1]).size,  # type: ignore[arg-type]
                quantized_dimension=output_dim,
            )
        else:
            accumulator = UniformQuantizedType(
                storage_type=I32,
                expressed_type=types[0].expressed_type,
                scale=float(types[0].scale) * float(types[1].scale),  # type: ignore[union-attr]
            )
        quantized_dot = GenericOp(
            "stablehlo.dot_general", sources, [dot_type.with_element_type(accumulator)], dict(dot.attributes)
        )
        product = rewriter.insert(quantized_dot).result
        if bias_add is not None:  # a 16-bit activation's Gemm / MatMul + bias: the i32 bias added there
            added = self._add_bias(bias_add, dot, product, rewriter)
            if added is None:
                return self.refusals.refuse(op, "a product's bias not an int32 at the accumulator's scale")
            product = added
        requantize = GenericOp("stablehlo.uniform_quantize", [product], [op.result.type])
        rewriter.replace_op(op, [rewriter.insert(requantize).result])
        return True

    @staticmethod
    def _biased_dot(add: Operation) -> Operation | None:
        """The dot_general of `add(dot_general, broadcast_in_dim(bias))` (either order), else None."""
        for operand in add.operands:
            producer = _unwrapped(operand).owner_op()
            if producer is not None and producer.name == "stablehlo.dot_general":
                return producer
        return None

    @staticmethod
    def _add_bias(add: Operation, dot: Operation, product: Value, rewriter: PatternRewriter) -> Value | None:
        """`product` + the add's int32 bias along the output's last dim, when the bias's scales are the
        accumulator's (onnxruntime's s_x * s_w) and its zero points 0; None when it is not such a bias."""
        other = next(v for v in add.operands if _unwrapped(v).owner_op() is not dot)
        broadcast = _unwrapped(other).owner_op()
        if broadcast is None or broadcast.name != "stablehlo.broadcast_in_dim":
            return None
        bias = _dequantized(broadcast.operands[0])
        accumulator_type = product.type
        assert isinstance(accumulator_type, RankedTensorType)
        rank = accumulator_type.rank
        dims = tuple(broadcast.attributes["broadcast_dimensions"].values)  # type: ignore[attr-defined]
        bias_type = quant_type(bias) if bias is not None else None
        if bias is None or bias_type is None or not is_uniform(bias_type) or _width(bias_type) != 32:
            return None
        channels = accumulator_type.shape[-1]
        if dims != (rank - 1,) or _ranked_shape(bias) != (channels,):
            return None
        scales = _scales(quant_type(product))  # type: ignore[arg-type]
        if np.any(storage_zero_point(bias_type) != 0):
            return None
        if not _close(np.broadcast_to(_scales(bias_type), scales.shape), scales):
            return None
        accumulator = quant_type(product)
        if (
            isinstance(accumulator, UniformQuantizedPerAxisType)
            and accumulator.quantized_dimension != rank - 1
        ):
            return None
        widened = GenericOp(
            "stablehlo.broadcast_in_dim",
            [bias],
            [accumulator_type],
            {"broadcast_dimensions": DenseArrayAttr(I64, (rank - 1,))},
        )
        added = GenericOp("stablehlo.add", [product, rewriter.insert(widened).result], [accumulator_type])
        return rewriter.insert(added).result


def _dequantized(value: Value) -> Value | None:
    """q when `value` is `uniform_dequantize(q)` (through float conversions), else None."""
    producer = _unwrapped(value).owner_op()
    if producer is None or producer.name != "stablehlo.uniform_dequantize":
        return None
    return producer.operands[0]


def _close(lhs: np.ndarray, rhs: np.ndarray) -> bool:
    return lhs.shape == rhs.shape and bool(np.all(np.abs(lhs - rhs) <= 1e-6 * np.abs(rhs)))


class FloatConvToQuantizedConv:
    """`uniform_quantize(convolution(dequantize(x), dequantize(w)) [+ broadcast(dequantize(bias))])`, which
    the quantized form leaves float (unsigned storage, which quant-to-math misreads), as the quantized
    convolution into an i32 accumulator of scales `s_x * s_w` in NHWC, the i32 bias added, its requantize
    and a transpose back: the next sweeps make them conv2d (unsigned operands re-centred), add, rescale."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        from qconvert.backends.stablehlo import ConvDimensionNumbers

        target = quant_type(op.result)
        value = _unwrapped(op.operands[0])
        producer = value.owner_op()
        if target is None or producer is None:
            return False
        bias = None
        if producer.name == "stablehlo.add":
            conv_value, bias_value = producer.operands
            bias_broadcast = _unwrapped(bias_value).owner_op()
            if bias_broadcast is None or bias_broadcast.name != "stablehlo.broadcast_in_dim":
                return False
            bias = _dequantized(bias_broadcast.operands[0])
            producer = _unwrapped(conv_value).owner_op()
            if bias is None or producer is None:
                return False
        if producer.name != "stablehlo.convolution":
            return False
        sources = [_dequantized(operand) for operand in producer.operands]
        if sources[0] is None or sources[1] is None:
            return False
        input_type, kernel_type = quant_type(sources[0]), quant_type(sources[1])
        if not isinstance(input_type, UniformQuantizedType) or not is_uniform(kernel_type):
            return self.refusals.refuse(op, "a float convolution of other than per-tensor activations")
        numbers = ConvDimensionNumbers.parse(producer.attributes["dimension_numbers"])
        if len(numbers.output) != 4:
            return False
        kernel_scales = _scales(kernel_type)  # type: ignore[arg-type]
        per_axis = isinstance(kernel_type, UniformQuantizedPerAxisType)
        if per_axis and kernel_type.quantized_dimension != numbers.kernel.index("o"):  # type: ignore[union-attr]
            return self.refusals.refuse(op, "per-axis weights on another dim than the output channels")
        scales = float(input_type.scale) * kernel_scales
        channels_last = ("b", 0, 1, "f")
        old_shape = _ranked_shape(producer.results[0])
        shape = tuple(old_shape[numbers.output.index(d)] for d in channels_last)
        channels = shape[3]
        if scales.size == 1:
            accumulator: QuantizedType = UniformQuantizedType(
                storage_type=I32, expressed_type=input_type.expressed_type, scale=float(scales[0])
            )
        else:
            accumulator = UniformQuantizedPerAxisType(
                storage_type=I32,
                expressed_type=input_type.expressed_type,
                scales=tuple(float(v) for v in scales),
                zero_points=(0,) * channels,
                quantized_dimension=3,
            )
        attributes = dict(producer.attributes)
        attributes["dimension_numbers"] = ConvDimensionNumbers(
            numbers.input, numbers.kernel, channels_last
        ).attribute()
        accumulator_type = RankedTensorType(shape, accumulator)
        result: Value = rewriter.insert(
            GenericOp("stablehlo.convolution", list(sources), [accumulator_type], attributes)
        ).result
        if bias is not None:
            bias_type = quant_type(bias)
            bias_scales = np.broadcast_to(_scales(bias_type), scales.shape) if bias_type is not None else None  # type: ignore[arg-type]
            if bias_type is None or _width(bias_type) != 32 or not _close(bias_scales, scales):  # type: ignore[arg-type]
                return self.refusals.refuse(op, "a float convolution's bias not at the accumulator's scale")
            if np.any(storage_zero_point(bias_type) != 0) or _ranked_shape(bias) != (channels,):
                return self.refusals.refuse(
                    op, "a float convolution's bias with a zero point or of another shape"
                )
            broadcast = GenericOp(
                "stablehlo.broadcast_in_dim",
                [bias],
                [accumulator_type],
                {"broadcast_dimensions": DenseArrayAttr(I64, (3,))},
            )
            added = GenericOp(
                "stablehlo.add", [result, rewriter.insert(broadcast).result], [accumulator_type]
            )
            result = rewriter.insert(added).result
        target_type = RankedTensorType(shape, target)
        requantized = rewriter.insert(GenericOp("stablehlo.uniform_quantize", [result], [target_type])).result
        perms = [channels_last.index(d) for d in numbers.output]
        back = GenericOp(
            "stablehlo.transpose",
            [requantized],
            [op.result.type],
            {"permutation": DenseArrayAttr(I64, tuple(perms))},
        )
        rewriter.replace_op(op, [rewriter.insert(back).result])
        return True


def _ranked_shape(value: Value) -> tuple[int, ...]:
    assert isinstance(value.type, RankedTensorType)
    return value.type.shape


class FloatSumToAccumulatorAdd:
    """`uniform_quantize(dequantize(a) + dequantize(b))` (or `-`), left float (unsigned storage), as the
    fused form writes a quantized add: both requantized to one i32 scale (`2 max(s_a, s_b) / 2**20`, as
    upstream's rescale legalization), added in i32, requantized: each rounding at 2**-19 of a step."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        producer = _unwrapped(op.operands[0]).owner_op()
        if target is None or producer is None or producer.name not in ("stablehlo.add", "stablehlo.subtract"):
            return False
        sources = [_dequantized(operand) for operand in producer.operands]
        if sources[0] is None or sources[1] is None:
            return False
        types = [quant_type(source) for source in sources]
        result_type = op.result.type
        assert isinstance(result_type, RankedTensorType)
        if not all(isinstance(t, UniformQuantizedType) and _width(t) in (8, 16) for t in types):
            return self.refusals.refuse(op, f"a float sum of {types} (per-tensor 8 / 16-bit only)")
        if any(_ranked_shape(source) != result_type.shape for source in sources):
            return False  # a broadcast operand: not this pattern's
        if any(_width(t) == 16 and int(storage_zero_point(t)[0]) != 0 for t in types):  # type: ignore[arg-type]
            return self.refusals.refuse(op, INT16_ZERO_POINT)
        # upstream's input shift: 20 for 8-bit operands, 15 for 16-bit ones (|q| * 2**14 stays in i32)
        input_shift = 15 if any(_width(t) == 16 for t in types) else 20
        scale = 2 * max(float(t.scale) for t in types) / 2**input_shift  # type: ignore[union-attr]
        common = RankedTensorType(
            result_type.shape,
            UniformQuantizedType(storage_type=I32, expressed_type=types[0].expressed_type, scale=scale),  # type: ignore[union-attr]
        )
        wide = [
            rewriter.insert(GenericOp("stablehlo.uniform_quantize", [source], [common])).result
            for source in sources
        ]
        total = rewriter.insert(GenericOp(producer.name, wide, [common])).result
        rewriter.replace_op(
            op, [rewriter.insert(GenericOp("stablehlo.uniform_quantize", [total], [result_type])).result]
        )
        return True


def _with_zero_points_zero(type_: QuantizedType) -> QuantizedType:
    """The per-axis type with its zero points 0 (the same storage read as centred on 0)."""
    assert isinstance(type_, UniformQuantizedPerAxisType)
    return UniformQuantizedPerAxisType(
        storage_type=type_.storage_type,
        expressed_type=type_.expressed_type,
        is_signed=type_.is_signed,
        storage_type_min=type_.storage_type_min,
        storage_type_max=type_.storage_type_max,
        scales=type_.scales,
        zero_points=(0,) * len(type_.scales),
        quantized_dimension=type_.quantized_dimension,
    )


class PerChannelWeightZeroPoints:
    """A quantized `convolution` / `dot_general` whose constant weights have per-channel zero points (TOSA's
    conv2d / matmul take one) as the same op on the weights read with zero points 0, less `z_c` times the
    sum of the centred activations each output sees: `sum (x - z_x)(w - z_c) = sum (x - z_x) w - z_c sum
    (x - z_x)`, the window sums the same op with an all-ones i8 kernel. Exact in i32, so the one rescale
    after it rounds what onnxruntime's dequantized weights give."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.convolution", "stablehlo.dot_general")

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        weight_type, result_type = quant_type(op.operands[1]), quant_type(op.result)
        if not isinstance(weight_type, UniformQuantizedPerAxisType) or result_type is None:
            return False
        zero_points = storage_zero_point(weight_type)
        if np.all(zero_points == zero_points[0]) or _width(weight_type) != 8 or not weight_type.is_signed:
            return False
        if constant_of(op.operands[1]) is None:
            return self.refusals.refuse(op, "per-channel zero points on weights that are not constants")
        weight_shape = _ranked_shape(op.operands[1])
        output_dim = self.output_dim(op, weight_type.quantized_dimension)
        if output_dim is None:
            return self.refusals.refuse(op, "per-channel weight zero points on another dim than the outputs")
        centred = materialize(
            rewriter,
            storage_of(rewriter, op.operands[1]),
            _tensor(weight_shape, _with_zero_points_zero(weight_type)),
        )
        main = rewriter.insert(
            GenericOp(op.name, [op.operands[0], centred], [op.result.type], dict(op.attributes))
        ).result
        ones_type = UniformQuantizedType(
            storage_type=I8, expressed_type=weight_type.expressed_type, scale=1.0
        )
        ones = materialize(
            rewriter,
            ops.const(rewriter, np.ones(weight_shape, np.int8), I8),
            _tensor(weight_shape, ones_type),
        )
        input_type = quant_type(op.operands[0])
        assert input_type is not None
        sums_type = UniformQuantizedType(
            storage_type=I32, expressed_type=weight_type.expressed_type, scale=float(_scales(input_type)[0])
        )
        result_shape = _ranked_shape(op.result)
        sums = rewriter.insert(
            GenericOp(
                op.name, [op.operands[0], ones], [_tensor(result_shape, sums_type)], dict(op.attributes)
            )
        ).result
        shape = [1] * len(result_shape)
        shape[output_dim] = result_shape[output_dim]
        weighted = ops.mul(
            rewriter,
            storage_of(rewriter, sums),
            ops.const(rewriter, zero_points.astype(np.int32).reshape(shape), I32),
            ops.zero_point(rewriter, 0, I8),
        )
        corrected = ops.sub(rewriter, storage_of(rewriter, main), weighted)
        replace_with_storage(rewriter, op, [corrected])
        return True

    @staticmethod
    def output_dim(op: Operation, weight_dim: int) -> int | None:
        """The result dim the weights' quantized dim becomes (None when it is not an output dim)."""
        if op.name == "stablehlo.convolution":
            from qconvert.backends.stablehlo import ConvDimensionNumbers

            numbers = ConvDimensionNumbers.parse(op.attributes["dimension_numbers"])
            # grouped / depthwise too: the all-ones kernel of the same groups sums each output's own inputs
            return numbers.output.index("f") if numbers.kernel[weight_dim] == "o" else None
        from qconvert.backends.stablehlo import DotDimensionNumbers

        dims = DotDimensionNumbers.parse(op.attributes["dot_dimension_numbers"])
        lhs_rank = len(_ranked_shape(op.operands[0]))
        rhs_rank = len(_ranked_shape(op.operands[1]))
        lhs_free = lhs_rank - len(dims.lhs_batching) - len(dims.lhs_contracting)
        rhs_free = [d for d in range(rhs_rank) if d not in (*dims.rhs_batching, *dims.rhs_contracting)]
        if weight_dim not in rhs_free:
            return None
        return len(dims.lhs_batching) + lhs_free + rhs_free.index(weight_dim)


def _tensor(shape: tuple[int, ...], element: QuantizedType) -> RankedTensorType:
    return RankedTensorType(shape, element)


def exact_to_i32(b: Builder, accumulator: Value) -> Value:
    """An i48 accumulator (TOSA's i16 x i8 conv2d, i16 x i16 matmul) as i32: a rescale by 1.0 with a 16-bit
    multiplier (scale32 = false, which i48 inputs need: 2**14 >> 14, exact), saturating at i32's range."""
    accumulator_type = accumulator.type
    assert isinstance(accumulator_type, RankedTensorType)
    multiplier, shift = compute_multiplier_and_shift(np.array([1.0]), scale_width=16)
    return ops.rescale(
        b,
        accumulator,
        ops.const(b, multiplier.astype(np.int16), I16),
        ops.const(b, shift, I8),
        ops.zero_point(b, 0, accumulator_type.element_type),
        ops.zero_point(b, 0, I32),
        accumulator_type.with_element_type(I32),
        rounding=TosaRounding.SINGLE,
        per_channel=False,
        scale32=False,
    )


class FloatClampToClamp:
    """`uniform_quantize(maximum / minimum(dequantize(q), c))` (a Relu / Clip the quantized form leaves float,
    e.g. on 16-bit values) with the same type in and out, as `tosa.clamp` of the storage at the bounds
    quantized by ONNX's rule: quantizing is monotone and gives `q` back, so the two are equal."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        from qconvert.numerics import quantize

        target = quant_type(op.result)
        if not isinstance(target, UniformQuantizedType) or not target.is_signed:
            return False
        value = op.operands[0]
        low, high = target.storage_type_min, target.storage_type_max
        while (producer := value.owner_op()) is not None and producer.name in (
            "stablehlo.maximum",
            "stablehlo.minimum",
        ):
            bound = constant_of(producer.operands[1])
            if bound is None or not np.all(bound == bound.reshape(-1)[0]):
                return False
            level = int(quantize(np.asarray(bound.reshape(-1)[:1], np.float32), uniform_params(target))[0])
            if producer.name == "stablehlo.maximum":
                low = max(low, level)
            else:
                high = min(high, level)
            value = producer.operands[0]
        source = _dequantized(value)
        if source is None or value is op.operands[0]:
            return False
        source_type = quant_type(source)
        if source_type != target:
            # 8 <-> 16 bits (a Relu whose output an int16 override widened): requantize, then clamp; exact,
            # as rounding is monotone and keeps 0 (quantize(max(x, 0)) = max(quantize(x), quantize(0)))
            if not isinstance(source_type, UniformQuantizedType) or 16 not in (
                _width(source_type),
                _width(target),
            ):
                return False
            shape = _ranked_shape(source)
            requantize = GenericOp("stablehlo.uniform_quantize", [source], [RankedTensorType(shape, target)])
            source = rewriter.insert(requantize).result
        storage = storage_of(rewriter, source)
        replace_with_storage(rewriter, op, [ops.clamp(rewriter, storage, low, high)])
        return True
