"""An add / sub of an i8 value and a quantized splat constant, requantized to i8 (MiniLM's GELU `erf(x) + 1`),
as one `tosa.table` of onnxruntime's float32 result at each of the 256 input codes.

The fused form adds both in the i32 accumulator and rescales once (exact, then half up). With onnxruntime's
quantizer's scales that exact sum sits on a half step for every code (erf at 2/255, 1.0 stored at 1/255 zero
point -128, the sum at 2/255: x + 127.5), and onnxruntime lands beside it by float32 error (`float32(255 /
255)` is 1.0, `1.0 / float32(2 / 255)` is 127.49999): measured 231 of 256 codes one step off. The table holds
`quantize(dequantize(x) + dequantize(c))` in onnxruntime's float32 arithmetic (qconvert.numerics), so every
code gives onnxruntime's bits. Integer TOSA (PRO-INT), one op instead of three rescales and an add.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from qconvert.ir.core import Operation, Value
from qconvert.ir.quant_types import UniformQuantizedType, uniform_params
from qconvert.ir.types import I8, RankedTensorType
from qconvert.numerics import dequantize, quantize
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .storage import CAST, constant_of, quant_type, replace_with_storage, storage_of

__all__ = ["ConstantSumToTable"]

_CODES = np.arange(-128, 128, dtype=np.int64)  # TABLE's entry `x + 128` of signless bits x


def _widened_source(value: Value) -> Value | None:
    """The quantized value an accumulator operand widens (`uniform_quantize` to i32, maybe broadcast)."""
    producer = value.owner_op()
    while producer is not None and producer.name == "stablehlo.broadcast_in_dim":
        producer = producer.operands[0].owner_op()
    if producer is None or producer.name != "stablehlo.uniform_quantize":
        return None
    return producer.operands[0]


def _constant_storage(value: Value) -> np.ndarray | None:
    """The stored integers of a quantized constant (`bitcast_convert` / a cast of a constant, or the quantize
    of a float constant: onnxruntime's quantizer writes MiniLM's `1.0` as QuantizeLinear of a float)."""
    producer = value.owner_op()
    target = quant_type(value)
    if producer is not None and producer.name == "stablehlo.uniform_quantize" and target is not None:
        float_constant = constant_of(producer.operands[0])
        if float_constant is None or quant_type(producer.operands[0]) is not None:
            return None
        return quantize(np.asarray(float_constant, np.float32), uniform_params(target))
    while producer is not None and producer.name in ("stablehlo.bitcast_convert", CAST):
        value = producer.operands[0]
        producer = value.owner_op()
    return constant_of(value)


def _is_i8(type_: object) -> bool:
    return isinstance(type_, UniformQuantizedType) and type_.storage_type.width == 8  # type: ignore[attr-defined]


class ConstantSumToTable:
    """`uniform_quantize(add(widen(x), widen(c)))` (or subtract, either order) to i8, x i8 per tensor of the
    result's shape, c an i8 splat constant: `tosa.table(x)` (the module's docstring)."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target, accumulator = quant_type(op.result), quant_type(op.operands[0])
        producer = op.operands[0].owner_op()
        if not _is_i8(target) or accumulator is None or producer is None:
            return False
        if producer.name not in ("stablehlo.add", "stablehlo.subtract"):
            return False
        sources = [_widened_source(operand) for operand in producer.operands]
        if sources[0] is None or sources[1] is None:
            return False
        constants = [_constant_storage(source) for source in sources]  # type: ignore[arg-type]
        variable = [index for index, constant in enumerate(constants) if constant is None]
        if len(variable) != 1:
            return False  # two variables (the accumulator add's), or two constants (folded elsewhere)
        (index,) = variable
        source = sources[index]
        constant_stored = constants[1 - index]
        constant_type = quant_type(sources[1 - index])  # type: ignore[arg-type]
        source_type = quant_type(source)  # type: ignore[arg-type]
        result_type = op.result.type
        assert source is not None and constant_stored is not None
        assert isinstance(result_type, RankedTensorType)
        if not (_is_i8(source_type) and _is_i8(constant_type)) or source.type.shape != result_type.shape:  # type: ignore[attr-defined]
            return False
        if constant_stored.size == 0 or not np.all(constant_stored == constant_stored.reshape(-1)[0]):
            return False  # a constant that varies by element: not one function of the code
        source_params, constant_params = uniform_params(source_type), uniform_params(constant_type)  # type: ignore[arg-type]
        codes = dequantize(_CODES.astype(source_params.storage_dtype), source_params).astype(np.float32)
        stored = np.asarray(constant_stored.reshape(-1)[:1]).astype(np.int64)
        constant = dequantize(stored.astype(constant_params.storage_dtype), constant_params)
        constant = constant.astype(np.float32)
        operands = (codes, constant) if index == 0 else (constant, codes)
        values = np.add(*operands) if producer.name == "stablehlo.add" else np.subtract(*operands)
        table = quantize(values.astype(np.float32), uniform_params(target))  # type: ignore[arg-type]
        if table.dtype == np.uint8:
            table = table.astype(np.int64).astype(np.uint8).view(np.int8)
        lookup = ops.const(rewriter, table.astype(np.int8), I8)
        replace_with_storage(rewriter, op, [ops.table(rewriter, storage_of(rewriter, source), lookup)])
        return True
