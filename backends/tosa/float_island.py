"""Float islands of one quantized input as `tosa.table`: `uniform_quantize(f(uniform_dequantize(q)))` where
`f` is a chain of elementwise float StableHLO ops and splat constants (Sigmoid, Tanh, GELU's erf, HardSwish,
LeakyRelu, Exp, ... as the StableHLO backend lowers them) is one i8 -> i8 lookup: the table holds, for each
of the 256 storage values, `quantize(f(dequantize(x)))`, computed here in float32 with ONNX's quantize and
dequantize (qconvert.numerics), so TABLE gives the float path's value for every input but where the float
ops round differently (an ulp before the quantize).

The StableHLO ops are evaluated by a small numpy interpreter of their elementwise float meaning (`EVALUATE`):
the meaning of the ONNX ops stays the StableHLO backend's, which wrote these ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from qconvert.ir.attributes import OpaqueAttr
from qconvert.ir.core import Operation, Value
from qconvert.ir.quant_types import QuantizedType, UniformQuantizedType, uniform_params
from qconvert.ir.type_parser import numpy_dtype
from qconvert.ir.types import I8, I32, FloatType, RankedTensorType, element_type_of
from qconvert.numerics import dequantize, quantize
from qconvert.numerics.tosa import TosaRounding
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .legalize_quant import rescale_to
from .storage import Refusals, constant_of, quant_type, replace_with_storage, storage_of

__all__ = [
    "EVALUATE",
    "FloatIslandToTable",
    "FloatLinearCombination",
    "FloatPerChannelAffine",
    "splat_value",
    "ties_to_even",
]

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _compare(op: Operation, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    attribute = op.attributes["comparison_direction"]
    text = attribute.text if isinstance(attribute, OpaqueAttr) else str(attribute)
    direction = text.replace(">", " ").split()[-1]
    return {
        "EQ": np.equal,
        "NE": np.not_equal,
        "GE": np.greater_equal,
        "GT": np.greater,
        "LE": np.less_equal,
        "LT": np.less,
    }[direction](lhs, rhs)


def _result_dtype(op: Operation) -> np.dtype:
    return numpy_dtype(element_type_of(op.results[0].type))


def _typed(function: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """numpy's `function`, its result in the op's result type (integers wrap as StableHLO's do)."""

    def evaluate(op: Operation, *operands: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(function(*operands)).astype(_result_dtype(op))

    return evaluate


def _bitcast(op: Operation, operand: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(operand).view(_result_dtype(op))


def _convert(op: Operation, operand: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return operand.astype(_result_dtype(op))


_PRECISIONS = {(8, 23): np.float32, (5, 10): np.float16, (11, 52): np.float64}


def _reduce_precision(op: Operation, operand: np.ndarray) -> np.ndarray:
    bits = (op.attributes["exponent_bits"].value, op.attributes["mantissa_bits"].value)  # type: ignore[attr-defined]
    if bits not in _PRECISIONS:
        raise _NotEvaluable(f"reduce_precision to {bits}")
    with np.errstate(all="ignore"):
        return operand.astype(_PRECISIONS[bits]).astype(operand.dtype)


class _NotEvaluable(Exception):
    """An op of the island this interpreter does not evaluate."""


EVALUATE: dict[str, Callable[..., np.ndarray]] = {
    "stablehlo.add": _typed(np.add),
    "stablehlo.subtract": _typed(np.subtract),
    "stablehlo.multiply": _typed(np.multiply),
    "stablehlo.divide": _typed(np.divide),
    "stablehlo.maximum": _typed(np.maximum),
    "stablehlo.minimum": _typed(np.minimum),
    "stablehlo.power": _typed(np.power),
    "stablehlo.negate": _typed(np.negative),
    "stablehlo.abs": _typed(np.abs),
    "stablehlo.exponential": _typed(np.exp),
    "stablehlo.exponential_minus_one": _typed(np.expm1),
    "stablehlo.log": _typed(np.log),
    "stablehlo.log_plus_one": _typed(np.log1p),
    "stablehlo.logistic": _typed(lambda x: 1 / (1 + np.exp(-x))),
    "stablehlo.tanh": _typed(np.tanh),
    "stablehlo.sqrt": _typed(np.sqrt),
    "stablehlo.rsqrt": _typed(lambda x: 1 / np.sqrt(x)),
    "stablehlo.floor": _typed(np.floor),
    "stablehlo.ceil": _typed(np.ceil),
    "stablehlo.round_nearest_even": _typed(np.rint),
    "stablehlo.sign": _typed(np.sign),
    "stablehlo.and": _typed(np.bitwise_and),
    "stablehlo.or": _typed(np.bitwise_or),
    "stablehlo.xor": _typed(np.bitwise_xor),
    "stablehlo.not": _typed(np.invert),
    "chlo.erf": _typed(lambda x: _erf(x.astype(np.float64))),
    "stablehlo.clamp": _typed(lambda low, x, high: np.minimum(np.maximum(x, low), high)),
    "stablehlo.select": lambda op, c, x, y: np.where(c, x, y).astype(_result_dtype(op)),
    "stablehlo.compare": _compare,
    "stablehlo.convert": _convert,
    "stablehlo.bitcast_convert": _bitcast,
    "stablehlo.reduce_precision": _reduce_precision,
    # integer ops of the island that legalize.py already made TOSA (i32 arithmetic of an emulation)
    "tosa.add": _typed(np.add),
    "tosa.sub": _typed(np.subtract),
    "tosa.maximum": _typed(np.maximum),
    "tosa.minimum": _typed(np.minimum),
}
"""Elementwise StableHLO ops: name -> (op, operand arrays) -> the result array, in the result's dtype."""

_SHAPE_ONLY = ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "tosa.reshape", "tosa.tile")


def splat_value(value: Value) -> np.ndarray | None:
    """The one value of a constant whose elements are all equal (through broadcasts and reshapes, and the
    dequantize of a quantized constant, as onnxruntime's quantizer writes a Pad's value)."""
    producer = value.owner_op()
    while producer is not None and producer.name in _SHAPE_ONLY:
        producer = producer.operands[0].owner_op()
    if producer is None:
        return None
    if producer.name == "stablehlo.uniform_dequantize":
        stored, type_ = constant_of(producer.operands[0]), quant_type(producer.operands[0])
        if stored is None or not isinstance(type_, UniformQuantizedType):
            return None
        params = uniform_params(type_)
        array = dequantize(stored.astype(np.int64).astype(params.storage_dtype), params)
    else:
        array = constant_of(producer.results[0])
    if array is None or array.size == 0 or not np.all(array == array.reshape(-1)[0]):
        return None
    return np.asarray(array.reshape(-1)[0])


class FloatIslandToTable:
    """`uniform_quantize(f(uniform_dequantize(q)))`, `f` elementwise, q and the result i8 per tensor."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        if target is None or quant_type(op.operands[0]) is not None:
            return False
        sources: set[Value] = set()
        memo: dict[Value, np.ndarray | None] = {}
        # TABLE reads entry `x + 128` of signless bits x; an unsigned code is those bits (-1 wraps to 255)
        codes = np.arange(-128, 128, dtype=np.int64)

        def evaluate(value: Value) -> np.ndarray | None:
            """f at every storage code, or None when `value` is not an elementwise function of one input."""
            if value in memo:
                return memo[value]
            memo[value] = None  # a cycle cannot happen in SSA; this guards against re-entry
            result: np.ndarray | None = None
            producer = value.owner_op()
            constant = splat_value(value)
            if constant is not None:
                result = constant
            elif producer is not None and producer.name == "stablehlo.uniform_dequantize":
                source = quant_type(producer.operands[0])
                if isinstance(source, UniformQuantizedType) and source.storage_type.width == 8:  # type: ignore[union-attr]
                    sources.add(producer.operands[0])
                    params = uniform_params(source)
                    result = dequantize(codes.astype(params.storage_dtype), params).astype(np.float32)
            elif producer is not None and producer.name in EVALUATE:
                operands = [evaluate(operand) for operand in producer.operands]
                if all(operand is not None for operand in operands):
                    try:
                        result = EVALUATE[producer.name](producer, *operands)
                    except _NotEvaluable:
                        result = None
            memo[value] = result
            return result

        values = evaluate(op.operands[0])
        if values is None or len(sources) != 1:
            return False  # not an elementwise function of one quantized value: another pattern's, or float
        (source,) = sources
        if not isinstance(target, UniformQuantizedType) or target.storage_type.width != 8:  # type: ignore[union-attr]
            return self.refusals.refuse(op, f"an elementwise function quantized to {target} (i8 tables only)")
        if source.type.shape != op.result.type.shape:  # type: ignore[attr-defined]
            return False  # a broadcast of the input: not one value per element
        assert isinstance(element_type_of(op.operands[0].type), FloatType)
        table = _table(np.broadcast_to(values, codes.shape), target)
        lookup = ops.const(rewriter, table, I8)
        replace_with_storage(rewriter, op, [ops.table(rewriter, storage_of(rewriter, source), lookup)])
        return True


def _table(values: np.ndarray, target: QuantizedType) -> np.ndarray:
    """ONNX's quantize of the function's values: the table entry of each code; a signed-storage view."""
    stored = quantize(np.asarray(values, np.float32), uniform_params(target))
    return stored.astype(np.int64).astype(np.uint8).view(np.int8) if stored.dtype == np.uint8 else stored


_CHANNEL_AXIS = (
    1  # ONNX's channel axis (NC...): where BatchNormalization's and a Mul's per-channel constants vary
)


def _storage_as_i32(b: PatternRewriter, storage: Value, shape: tuple[int, ...], *, unsigned: bool) -> Value:
    """Storage integers widened to i32: a cast, or for unsigned codes 0..255 an exact rescale reading the bits
    as unsigned (a cast would read them as signed)."""
    if not unsigned:
        return ops.cast(b, storage, I32)
    return rescale_to(
        b,
        storage,
        np.array([1.0]),
        0,
        0,
        RankedTensorType(shape, I32),
        TosaRounding.SINGLE,
        input_unsigned=True,
    )


def _shifted_into(
    b: PatternRewriter, total: Value, shift: int, target: UniformQuantizedType, shape: tuple[int, ...]
) -> Value:
    """The i32 `total` times 2**-shift (RESCALE's half up) into the 8-bit `target`'s storage, its zero point
    written as the storage's bits."""
    zero_point = int(uniform_params(target).zero_point)
    return rescale_to(
        b,
        total,
        np.array([2.0**-shift]),
        0,
        zero_point - 256 if zero_point > 127 else zero_point,
        RankedTensorType(shape, I8),
        TosaRounding.SINGLE,
        output_unsigned=not target.is_signed,
    )


class FloatPerChannelAffine:
    """`uniform_quantize(f(uniform_dequantize(q)))` where `f` is elementwise with constants that vary along
    the channel axis only (an unfused BatchNormalization, a per-channel Mul / Add): when f is affine in q per
    channel (checked on every code), `clamp(round((q * m_c + n_c) / 2**k) + zp_out)` in i32: tosa.cast,
    tosa.mul and tosa.add by per-channel constants (signed: a negative gamma is fine), one rescale by 2**-k.
    The integer result is compared at conversion time with onnxruntime's float path on all 256 codes of
    every channel: refused when any is more than one step off."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, rounding: object, refusals: Refusals) -> None:
        self.rounding, self.refusals = rounding, refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        if target is None or quant_type(op.operands[0]) is not None:
            return False
        result_type = op.result.type
        if not isinstance(result_type, RankedTensorType) or result_type.rank < 2:
            return False
        shape = result_type.shape
        sources: set[Value] = set()
        values = _evaluate_per_channel(op.operands[0], shape, sources)
        if values is None or len(sources) != 1:
            return False
        (source,) = sources
        if source.type.shape != shape or not isinstance(target, UniformQuantizedType):  # type: ignore[attr-defined]
            return False
        if target.storage_type.width != 8:  # type: ignore[union-attr]
            return self.refusals.refuse(op, "a per-channel affine function quantized to other than 8 bits")
        channels = shape[_CHANNEL_AXIS]
        real = np.broadcast_to(
            values, (256, *[channels if d == _CHANNEL_AXIS else 1 for d in range(len(shape))])
        )
        real = real.reshape(256, channels).astype(np.float64)  # f(dequantize(code)) per code, per channel
        params = uniform_params(target)
        expected = quantize(real.astype(np.float32), params).astype(np.int64)  # onnxruntime: quantize(f(x))
        source_unsigned = not quant_type(source).is_signed  # type: ignore[union-attr]
        bits = np.arange(-128, 128, dtype=np.int64)  # row r of `real` is the storage whose bits are r - 128
        codes = bits & 0xFF if source_unsigned else bits  # the integer each row stands for
        scale = float(target.scale)
        low_row, high_row, zero_row = (
            int(np.argmin(codes)),
            int(np.argmax(codes)),
            int(np.argmin(np.abs(codes))),
        )
        slope = (
            (real[high_row] - real[low_row]) / (codes[high_row] - codes[low_row]) / scale
        )  # steps per code
        offset = real[zero_row] / scale  # at code 0
        bound = np.abs(slope) * 256 + np.abs(offset) + 1
        shift = int(min(24, np.floor(np.log2(2.0**30 / bound.max()))))
        if shift < 8:
            return self.refusals.refuse(op, "a per-channel affine function too steep for i32")
        multiplier = np.round(slope * 2.0**shift).astype(np.int64)
        addend = np.round(offset * 2.0**shift).astype(np.int64)
        zero_point = int(params.zero_point)
        integer = codes[:, None] * multiplier + addend
        rounded = (integer + (1 << (shift - 1))) >> shift  # half up, as the rescale by 2**-shift
        low, high = (0, 255) if not target.is_signed else (-128, 127)
        got = np.clip(rounded + zero_point, low, high)
        if np.abs(got - expected).max() > 1:
            return self.refusals.refuse(op, "an elementwise per-channel function that is not affine")
        reduced = [channels if d == _CHANNEL_AXIS else 1 for d in range(len(shape))]
        wide = _storage_as_i32(rewriter, storage_of(rewriter, source), shape, unsigned=source_unsigned)
        product = ops.mul(
            rewriter,
            wide,
            ops.const(rewriter, multiplier.reshape(reduced).astype(np.int32), I32),
            ops.zero_point(rewriter, 0, I8),
        )
        total = ops.add(rewriter, product, ops.const(rewriter, addend.reshape(reduced).astype(np.int32), I32))
        value = _shifted_into(rewriter, total, shift, target, shape)
        replace_with_storage(rewriter, op, [value])
        return True


def _evaluate_per_channel(value: Value, shape: tuple[int, ...], sources: set[Value]) -> np.ndarray | None:
    """f at every code, as an array `(256 or 1, *reduced)`: every dim 1 but the channel axis (C or 1).
    None when a value is not elementwise in the one quantized input or varies along another dim."""
    memo: dict[Value, np.ndarray | None] = {}
    rank = len(shape)

    def reduced(array: np.ndarray, leading: int) -> np.ndarray | None:
        """`array` of `(leading, *dims)` with every non-channel dim collapsed, None when it varies there."""
        for axis in range(1, array.ndim):
            if axis - 1 != _CHANNEL_AXIS and array.shape[axis] > 1:
                first = np.take(array, [0], axis=axis)
                if not np.all(array == first):
                    return None
                array = first
        return array

    def constant(array: np.ndarray) -> np.ndarray | None:
        """A constant of the island's rank, reduced; of another (a vector before its broadcast), as it is."""
        if array.ndim != rank:
            return array.reshape(1, *array.shape)
        return reduced(array.reshape(1, *array.shape), 1)

    def evaluate(value: Value) -> np.ndarray | None:
        if value in memo:
            return memo[value]
        memo[value] = None
        result: np.ndarray | None = None
        producer = value.owner_op()
        array = constant_of(value) if producer is not None else None
        if array is not None:
            result = constant(np.asarray(array))
        elif producer is None:
            result = None
        elif producer.name == "stablehlo.uniform_dequantize":
            type_ = quant_type(producer.operands[0])
            stored = constant_of(producer.operands[0])
            if stored is not None and isinstance(type_, QuantizedType):
                params = uniform_params(type_)
                real = dequantize(np.asarray(stored).astype(np.int64).astype(params.storage_dtype), params)
                result = constant(real)
            elif isinstance(type_, UniformQuantizedType) and type_.storage_type.width == 8:  # type: ignore[union-attr]
                sources.add(producer.operands[0])
                params = uniform_params(type_)
                codes = np.arange(-128, 128, dtype=np.int64).astype(params.storage_dtype)
                result = dequantize(codes, params).astype(np.float32).reshape((256,) + (1,) * rank)
        elif producer.name == "stablehlo.broadcast_in_dim":
            inner = evaluate(producer.operands[0])
            dims = [int(d) for d in producer.attributes["broadcast_dimensions"].values]  # type: ignore[attr-defined]
            if inner is not None:
                expanded = [1] * rank
                for index, dim in enumerate(dims):
                    expanded[dim] = inner.shape[1 + index]
                result = reduced(inner.reshape(inner.shape[0], *expanded), inner.shape[0])
        elif producer.name in EVALUATE:
            operands = [evaluate(operand) for operand in producer.operands]
            ranks = {operand.ndim for operand in operands if operand is not None}
            if all(operand is not None for operand in operands) and len(ranks) == 1:
                try:
                    result = EVALUATE[producer.name](producer, *operands)
                except _NotEvaluable:
                    result = None
        memo[value] = result
        return result

    return evaluate(value)


class _Linear:
    """A float value as `sum_i coefficient_i * q_i + constant` over storage integers q_i (arrays that
    broadcast to the value's shape)."""

    def __init__(self, terms: dict[Value, np.ndarray], constant: np.ndarray) -> None:
        self.terms, self.constant = terms, constant

    def scaled(self, factor: np.ndarray) -> _Linear:
        return _Linear({q: c * factor for q, c in self.terms.items()}, self.constant * factor)

    def plus(self, other: _Linear, sign: float = 1.0) -> _Linear:
        terms = dict(self.terms)
        for q, c in other.terms.items():
            terms[q] = terms[q] + sign * c if q in terms else sign * c
        return _Linear(terms, self.constant + sign * other.constant)


def _compressed(array: np.ndarray) -> np.ndarray:
    """`array` with every dim along which it does not vary cut to 1 (it still broadcasts the same)."""
    for axis in range(array.ndim):
        if array.shape[axis] > 1 and np.all(array == np.take(array, [0], axis=axis)):
            array = np.take(array, [0], axis=axis)
    return array


def _linear_form(value: Value, shape: tuple[int, ...]) -> _Linear | None:
    """`value` as a `_Linear` of the quantized values it is computed from, None when it is not linear in
    them (a product of two of them, a function of one) or not elementwise."""
    memo: dict[Value, _Linear | None] = {}
    rank = len(shape)

    def constant_array(value: Value) -> np.ndarray | None:
        producer = value.owner_op()
        if producer is not None and producer.name == "stablehlo.broadcast_in_dim":
            inner = constant_array(producer.operands[0])
            if inner is None:
                return None
            expanded = [1] * rank
            dims = [int(d) for d in producer.attributes["broadcast_dimensions"].values]  # type: ignore[attr-defined]
            for index, dim in enumerate(dims):
                expanded[dim] = inner.shape[index]
            return inner.reshape(expanded)
        if producer is not None and producer.name in ("stablehlo.convert", "stablehlo.reduce_precision"):
            return constant_array(producer.operands[0])
        array = constant_of(value)
        return None if array is None else np.asarray(array, np.float64)

    def form(value: Value) -> _Linear | None:
        if value in memo:
            return memo[value]
        memo[value] = None
        result: _Linear | None = None
        producer = value.owner_op()
        array = constant_array(value)
        if array is not None:
            if array.ndim != rank and array.size != 1:
                result = None  # a vector not yet broadcast: only its broadcast is a term's weight
            else:
                result = _Linear({}, array if array.ndim == rank else array.reshape((1,) * rank))
        elif producer is None:
            result = None
        elif producer.name == "stablehlo.uniform_dequantize":
            type_ = quant_type(producer.operands[0])
            if isinstance(type_, UniformQuantizedType) and type_.storage_type.width == 8:  # type: ignore[union-attr]
                params = uniform_params(type_)
                scale, zero_point = float(params.scale), float(params.zero_point)
                result = _Linear({producer.operands[0]: np.array(scale)}, np.array(-scale * zero_point))
        elif producer.name in ("stablehlo.convert", "stablehlo.reduce_precision"):
            result = form(producer.operands[0])  # float roundings: the quantize's rounding dominates
        elif producer.name in ("stablehlo.add", "stablehlo.subtract"):
            lhs, rhs = form(producer.operands[0]), form(producer.operands[1])
            if lhs is not None and rhs is not None:
                result = lhs.plus(rhs, 1.0 if producer.name == "stablehlo.add" else -1.0)
        elif producer.name == "stablehlo.negate":
            inner = form(producer.operands[0])
            result = None if inner is None else inner.scaled(np.array(-1.0))
        elif producer.name in ("stablehlo.multiply", "stablehlo.divide"):
            lhs, rhs = form(producer.operands[0]), form(producer.operands[1])
            if lhs is not None and rhs is not None:
                if not rhs.terms:
                    factor = rhs.constant if producer.name == "stablehlo.multiply" else 1.0 / rhs.constant
                    result = lhs.scaled(factor)
                elif not lhs.terms and producer.name == "stablehlo.multiply":
                    result = rhs.scaled(lhs.constant)
        memo[value] = result
        return result

    return form(value)


class FloatLinearCombination:
    """`uniform_quantize(sum_i w_i * dequantize(q_i) + d)` with constant (broadcast) weights and offset, q_i
    8-bit per tensor, none a constant: a bilinear Resize, a weighted sum, a scale and shift. In i32 fixed
    point: `clamp(round((sum_i m_i * q_i + n) / 2**k) + zp)` with tosa.mul / tosa.add by integer constants and
    one rescale by 2**-k; the weights are rounded at 2**-k of an output step, so only the quantize's own
    near-ties can round the other way (within a step of onnxruntime's float path)."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        result_type = op.result.type
        if (
            target is None
            or quant_type(op.operands[0]) is not None
            or not isinstance(result_type, RankedTensorType)
        ):
            return False
        linear = _linear_form(op.operands[0], result_type.shape)
        if linear is None or not linear.terms:
            return False
        if any(constant_of(q) is not None for q in linear.terms):
            return False  # a constant's: other patterns fold it
        if not isinstance(target, UniformQuantizedType) or target.storage_type.width != 8:  # type: ignore[union-attr]
            return self.refusals.refuse(op, "a weighted sum quantized to other than 8 bits per tensor")
        shape = result_type.shape
        scale = float(target.scale)
        weights = {q: _compressed(np.broadcast_to(c / scale, shape)) for q, c in linear.terms.items()}
        offset = _compressed(np.broadcast_to(linear.constant / scale, shape))
        extent = sum(np.abs(w).max() * 256 for w in weights.values()) + np.abs(offset).max() + 1
        shift = int(min(24, np.floor(np.log2(2.0**30 / extent))))
        if shift < 12:
            return self.refusals.refuse(op, "a weighted sum too large for i32 fixed point")
        total: Value | None = None
        for q, weight in weights.items():
            if _ranked_shape_of(q) != shape:
                return False
            q_type = quant_type(q)
            unsigned = q_type is not None and not q_type.is_signed
            wide = _storage_as_i32(rewriter, storage_of(rewriter, q), shape, unsigned=unsigned)
            integer = np.round(weight * 2.0**shift).astype(np.int64)
            term = ops.mul(
                rewriter,
                wide,
                ops.const(rewriter, integer.astype(np.int32), I32),
                ops.zero_point(rewriter, 0, I8),
            )
            total = term if total is None else ops.add(rewriter, total, term)
        assert total is not None
        addend = np.round(offset * 2.0**shift).astype(np.int64)
        total = ops.add(rewriter, total, ops.const(rewriter, addend.astype(np.int32), I32))
        total = ties_to_even(rewriter, total, shift, RankedTensorType(shape, I32))
        value = _shifted_into(rewriter, total, shift, target, shape)
        replace_with_storage(rewriter, op, [value])
        return True


def ties_to_even(rewriter: PatternRewriter, total: Value, shift: int, wide: RankedTensorType) -> Value:
    """`total + parity - 1`, parity the lowest bit of `floor(total / 2**shift)`: RESCALE's half-up rounding of
    that by 2**-shift is then onnxruntime's half to even (an exact tie, as bilinear weights of 1/4 make, goes
    to the even neighbour; nothing else moves). Integer ops only: floors by rescales of the shifted value."""
    one = ops.const(rewriter, np.array([1 << (shift - 1)], np.int32).reshape([1] * wide.rank), I32)
    floor = rescale_to(
        rewriter, ops.sub(rewriter, total, one), np.array([2.0**-shift]), 0, 0, wide, TosaRounding.SINGLE
    )  # half up of (t - 2**(k-1)) / 2**k is floor(t / 2**k)
    unit = ops.const(rewriter, np.ones([1] * wide.rank, np.int32), I32)
    half = rescale_to(
        rewriter, ops.sub(rewriter, floor, unit), np.array([0.5]), 0, 0, wide, TosaRounding.SINGLE
    )
    two = ops.const(rewriter, np.full([1] * wide.rank, 2, np.int32), I32)
    parity = ops.sub(rewriter, floor, ops.mul(rewriter, half, two, ops.zero_point(rewriter, 0, I8)))
    return ops.add(rewriter, total, ops.sub(rewriter, parity, unit))


def _ranked_shape_of(value: Value) -> tuple[int, ...]:
    assert isinstance(value.type, RankedTensorType)
    return value.type.shape
