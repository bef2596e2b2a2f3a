"""Integer Softmax (`--backend-option integer_softmax=true`): the float island the StableHLO backend writes
for an 8-bit ONNX Softmax over its last axis,

    uniform_quantize(e * broadcast(1 / reduce_add(e))),  e = exp(x - broadcast(reduce_max(x))),
    x = uniform_dequantize(q),

as integer TOSA (PRO-INT), in the manner of TFLite -> TOSA's convertSoftmaxOp (max subtracted in i32, exp as
a table, the sum in i32), with the reciprocal as one integer division:

    d = q - max(q) in [-255, 0]             tosa.cast (unsigned: a rescale) to i32, reduce_max, sub
    e = 256 hi[d + 255] + lo[d + 255] + 128 two i8 TABLEs of d + 127 (PRO-INT, no int16 extension) holding the
                                            bytes of E[i] = round(32767 * exp(s_in * (i - 255)))
    S = reduce_sum(e)                       i32
    D = rescale(S, s_out * 2**m)            round(S * s_out * 2**m), m as large as int32 allows
    q_out = intdiv(2**(m+1) e + D, 2 D)     round half up of e / (S * s_out); tosa.intdiv, then a rescale
            + zp                            by 1 adding the output zero point (saturating)

This is ONNX's Softmax quantized (the spec's float path, check's oracle): the exp has 15 bits relative to the
row's maximum, and the result differs from the float path by a step only near a tie of the quantization.
onnxruntime's optimized session runs the QDQ Softmax as com.microsoft QLinearSoftmax, which multiplies by
floor(1 / s_out) instead of 1 / s_out (254 for the usual 1/255): against it, a step off where that factor
moves a value across a rounding boundary (about 1.4% of elements at s_out = 1/255, measured).
On by default (`integer_softmax=false`: the float island, under --allow-float).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.quant_types import UniformQuantizedType
from qconvert.ir.types import I8, I32, RankedTensorType
from qconvert.numerics.tosa import TosaRounding
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .legalize_quant import rescale_to
from .storage import Refusals, constant_of, quant_type, replace_with_storage, storage_of

__all__ = ["EXP_UNIT", "IntegerSoftmax", "exp_tables"]

EXP_UNIT = 32767
"""exp(0) in the i16 exp table: the largest int16."""


def _producer(value: Value, name: str) -> Operation | None:
    producer = value.owner_op()
    while producer is not None and producer.name == "stablehlo.broadcast_in_dim" and name != producer.name:
        producer = producer.operands[0].owner_op()
    return producer if producer is not None and producer.name == name else None


def _reduction(op: Operation | None, body_op: str, init: float) -> tuple[Value, list[int]] | None:
    """The input and dims of a `stablehlo.reduce` by `body_op` from `init`, else None."""
    if op is None or op.name != "stablehlo.reduce" or len(op.operands) != 2:
        return None
    body = op.regions[0].entry if op.regions and op.regions[0].blocks else None
    if body is None or len(body.ops) != 2 or body.ops[0].name != body_op:
        return None
    if set(body.ops[0].operands) != set(body.arguments):
        return None
    start = constant_of(op.operands[1])
    if start is None or start.size != 1 or float(start.reshape(-1)[0]) != init:
        return None
    return op.operands[0], [int(d) for d in op.attributes["dimensions"].values]  # type: ignore[attr-defined]


def exp_tables(input_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The two i8[256] TABLEs of E[i] = round(EXP_UNIT * exp(s_in * (i - 255))) at i = 0..255 (the steps below
    a row's maximum): its high byte (0..127) and its low byte less 128, so that E = 256 hi + lo + 128."""
    steps = np.arange(256, dtype=np.float64) - 255
    exponentials = np.round(EXP_UNIT * np.exp(np.float64(input_scale) * steps)).astype(np.int64)
    return (exponentials >> 8).astype(np.int8), ((exponentials & 0xFF) - 128).astype(np.int8)


def _headroom(count: int, output_scale: float) -> int | None:
    """The largest m <= 14 with `e * 2**(m+1) + D` and `2 D` within int32 and D < 2**28 (RESCALE's REQUIRE on
    its input's range) for e <= EXP_UNIT, S <= count * EXP_UNIT, D = S * s_out * 2**m, and D >= 2**12 (its
    rounding then moves a quotient by at most 2**-13 of a step); None when there is none."""
    for m in range(14, -1, -1):
        largest, smallest = count * EXP_UNIT * output_scale * 2.0**m, EXP_UNIT * output_scale * 2.0**m
        if largest < 2**28 and EXP_UNIT * 2.0 ** (m + 1) + largest < 2**31 - 1 and smallest >= 2**12:
            return m
    return None


class IntegerSoftmax:
    """The StableHLO backend's 8-bit Softmax over the last axis as integer TOSA (the module's docstring)."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals

    def _match(self, op: Operation) -> tuple[Value, int] | None:
        """The quantized input of the Softmax `op` quantizes, and its axis; None for anything else."""
        product = _producer(op.operands[0], "stablehlo.multiply")
        if product is None:
            return None
        for exp_side, reciprocal_side in (product.operands, reversed(product.operands)):
            exponential = _producer(exp_side, "stablehlo.exponential")
            divide = _producer(reciprocal_side, "stablehlo.divide")
            if exponential is None or divide is None:
                continue
            one = constant_of(divide.operands[0])
            summed = _reduction(divide.operands[1].owner_op(), "stablehlo.add", 0.0)
            if one is None or not np.all(one == 1.0) or summed is None or summed[0] != exponential.results[0]:
                continue
            difference = _producer(exponential.operands[0], "stablehlo.subtract")
            if difference is None:
                continue
            maximum = _reduction(
                _producer(difference.operands[1], "stablehlo.reduce"), "stablehlo.maximum", -math.inf
            )
            if maximum is None or maximum[0] != difference.operands[0] or maximum[1] != summed[1]:
                continue
            dequantize = difference.operands[0].owner_op()
            if dequantize is None or dequantize.name != "stablehlo.uniform_dequantize":
                continue
            rank = len(dequantize.results[0].type.shape)  # type: ignore[attr-defined]
            if summed[1] != [rank - 1]:
                continue
            return dequantize.operands[0], rank - 1
        return None

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        if target is None or quant_type(op.operands[0]) is not None:
            return False
        matched = self._match(op)
        if matched is None:
            return False
        source, axis = matched
        source_type = quant_type(source)
        for type_ in (source_type, target):
            if not isinstance(type_, UniformQuantizedType) or type_.storage_type.width != 8:  # type: ignore[union-attr]
                return self.refusals.refuse(op, f"an integer Softmax of {type_} (8-bit per tensor only)")
        assert isinstance(source_type, UniformQuantizedType) and isinstance(target, UniformQuantizedType)
        shape = tuple(source.type.shape)  # type: ignore[attr-defined]
        count = shape[axis]
        output_scale = float(target.scale)
        m = _headroom(count, output_scale)
        if m is None:
            return self.refusals.refuse(op, f"an integer Softmax of {count} elements to scale {output_scale}")
        wide_type = RankedTensorType(shape, I32)
        storage = storage_of(rewriter, source)
        if source_type.is_signed:
            wide = ops.cast(rewriter, storage, I32)
        else:  # the bits read as unsigned (a cast reads them signed); the differences are what counts
            wide = rescale_to(
                rewriter, storage, np.array([1.0]), 0, 0, wide_type, TosaRounding.SINGLE, input_unsigned=True
            )
        ones = [1] * len(shape)

        def constant(value: int) -> Value:
            return ops.const(rewriter, np.full(ones, value, np.int32), I32)

        shift = ops.zero_point(rewriter, 0, I8)
        largest = ops.reduce(rewriter, "tosa.reduce_max", wide, axis)
        below = ops.sub(rewriter, wide, largest)  # d in [-255, 0]
        index = ops.cast(rewriter, ops.add(rewriter, below, constant(127)), I8)  # TABLE reads entry d + 255
        high, low = (ops.const(rewriter, table, I8) for table in exp_tables(float(source_type.scale)))
        high_byte = ops.cast(rewriter, ops.table(rewriter, index, high), I32)
        low_byte = ops.cast(rewriter, ops.table(rewriter, index, low), I32)
        exponentials = ops.add(
            rewriter,
            ops.mul(rewriter, high_byte, constant(256), shift),
            ops.add(rewriter, low_byte, constant(128)),
        )
        total = ops.reduce_sum(rewriter, exponentials, axis)
        reduced_type = RankedTensorType(tuple(1 if d == axis else n for d, n in enumerate(shape)), I32)
        divisor = rescale_to(  # D = round(S * s_out * 2**m)
            rewriter, total, np.array([output_scale * 2.0**m]), 0, 0, reduced_type, TosaRounding.SINGLE
        )
        numerator = ops.add(rewriter, ops.mul(rewriter, exponentials, constant(2 ** (m + 1)), shift), divisor)
        quotient = ops.intdiv(rewriter, numerator, ops.add(rewriter, divisor, divisor))
        zero_point = int(target.zero_point)
        stored = rescale_to(
            rewriter,
            quotient,
            np.array([1.0]),
            0,
            zero_point - 256 if zero_point > 127 else zero_point,
            RankedTensorType(shape, I8),
            TosaRounding.SINGLE,
            output_unsigned=not target.is_signed,
        )
        replace_with_storage(rewriter, op, [stored])
        return True
