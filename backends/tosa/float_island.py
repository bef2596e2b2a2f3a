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
from qconvert.ir.types import I8, FloatType, element_type_of
from qconvert.numerics import dequantize, quantize
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .storage import Refusals, constant_of, quant_type, replace_with_storage, storage_of

__all__ = ["EVALUATE", "FloatIslandToTable", "splat_value"]

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
