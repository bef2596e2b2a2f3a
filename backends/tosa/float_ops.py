"""`--allow-float`: what the integer patterns leave of StableHLO's quantized form, as float TOSA (PRO-FP).

Run after every integer pattern has had its go, so only what cannot be integer is float: LayerNormalization's
mean / variance / rsqrt, Softmax's exp and sum, a Div or a Pow between a dequantize and a quantize. Each
StableHLO op becomes the f32 TOSA op(s) of the same meaning (the meaning stays the StableHLO backend's, which
wrote these ops); the islands' edges are

    dequantize  (q - zp) * s:            tosa.cast to f32, tosa.sub of the zero point, tosa.mul by s
    quantize    clamp(rne(x / s) + zp):  tosa.mul by 1/s, tosa.clamp to the storage's range less zp, tosa.add
                                         of zp, tosa.cast to the storage (TOSA: half to even); unsigned:
                                         cast to i32, then tosa.rescale by 1 adding zp

(x * (1/s) can differ from onnxruntime's x / s by an ulp: a step only at an exact half). Every op made here
carries a `qconvert.note` naming the ONNX node it computes, which `island_nodes` collects for the module's
note; the module then needs PRO-FP besides PRO-INT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from qconvert.ir.attributes import DenseArrayAttr, StringAttr
from qconvert.ir.core import Block, Operation, Value
from qconvert.ir.dialects.qconvert import NOTE
from qconvert.ir.quant_types import UniformQuantizedPerAxisType, UniformQuantizedType, uniform_params
from qconvert.ir.types import F32, I8, I32, I64, FloatType, RankedTensorType, element_type_of
from qconvert.numerics import dequantize, quantize
from qconvert.numerics.tosa import TosaRounding
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .float_island import splat_value
from .index_ops import as_i32
from .legalize_quant import rescale_to
from .storage import Refusals, constant_of, quant_type, replace_with_storage, storage_of, storage_type

__all__ = ["FLOAT_NOTE", "float_patterns", "island_nodes", "labelled_lowerings"]

FLOAT_NOTE = "float island (PRO-FP)"
"""How every note of a float op made here begins; the rest names the ONNX node."""

Labels = dict[Operation, str]


def labelled_lowerings(labels: Labels) -> object:
    """The StableHLO backend's lowering table, each rule recording in `labels` which ONNX node the ops it
    inserts compute (`onnx.LayerNormalization 'ln_1'`): the float islands' notes name them."""
    from qconvert.backends.stablehlo import stablehlo_lowerings
    from qconvert.ir.dialects.onnx import node_name

    table = stablehlo_lowerings()
    for name in table.names():
        rule = table.rule(name)
        assert rule is not None

        def recorded(context: object, op: Operation, function: Callable = rule.function) -> object:
            builder = context.builder  # type: ignore[attr-defined]
            block, start = builder.block, builder.index
            lowered = function(context, op)
            label = f"{op.name.removeprefix('onnx.')} '{node_name(op) or '?'}'"
            for new in block.ops[start : builder.index]:
                labels.setdefault(new, label)
            return lowered

        table.replace(name, recorded, folds=rule.folds)
    return table


def _is_float(value: Value) -> bool:
    return isinstance(element_type_of(value.type), FloatType) and quant_type(value) is None


def _ranked(value: Value) -> RankedTensorType:
    assert isinstance(value.type, RankedTensorType), value.type
    return value.type


def _float_constant(rewriter: PatternRewriter, array: np.ndarray, rank: int) -> Value:
    array = np.asarray(array, np.float32)
    if array.size == 1:
        array = array.reshape((1,) * rank)
    if array.ndim < rank:
        array = array.reshape((1,) * (rank - array.ndim) + array.shape)
    return ops.const(rewriter, array, F32)


class _FloatPattern:
    """A float pattern: its result, and every new float TOSA op it made, noted with the source node."""

    roots: ClassVar[tuple[Root, ...]]

    def __init__(self, refusals: Refusals, labels: Labels) -> None:
        self.refusals, self.labels = refusals, labels

    def note_for(self, op: Operation) -> str:
        label = self.labels.get(op)
        return (
            f"{FLOAT_NOTE}: ONNX {label}" if label else f"{FLOAT_NOTE}: {op.name.removeprefix('stablehlo.')}"
        )

    def finish(self, rewriter: PatternRewriter, op: Operation, value: Value, *inner: Value) -> bool:
        """Note the new float ops computing `value` or the `inner` values (the float ops before an integer
        edge), those without a note yet; then replace `op` by `value`."""
        text = self.note_for(op)
        pending = [value, *inner]
        seen: set[int] = set()
        while pending:
            producer = pending.pop().owner_op()
            if producer is None or id(producer) in seen or NOTE in producer.attributes:
                continue
            seen.add(id(producer))
            if not producer.name.startswith("tosa.") or producer.name in ("tosa.const", "tosa.const_shape"):
                continue
            if not any(_is_float(v) for v in [*producer.operands, *producer.results]):
                continue  # an integer op (PRO-INT): an edge's rescale, or another pattern's
            producer.attributes[NOTE] = StringAttr(text)
            pending.extend(producer.operands)
        replace_with_storage(rewriter, op, [value])
        return True


class DequantizeToFloat(_FloatPattern):
    """`uniform_dequantize(q)`: `(float(q) - zp) * s` in f32 (per axis: s and zp vary along its axis)."""

    roots = ("stablehlo.uniform_dequantize",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        source = op.operands[0]
        type_ = quant_type(source)
        if type_ is None:
            return False
        params = uniform_params(type_)  # type: ignore[arg-type]
        shape = _ranked(source).shape
        rank = len(shape)
        scales = np.asarray(params.scale, np.float32)
        zero_points = np.asarray(params.zero_point, np.float32)
        if isinstance(type_, UniformQuantizedPerAxisType):
            expanded = [1] * rank
            expanded[type_.quantized_dimension] = shape[type_.quantized_dimension]
            scales, zero_points = scales.reshape(expanded), zero_points.reshape(expanded)
        stored = constant_of(source)
        if stored is not None:  # a constant's dequantize: ONNX's rule in numpy, one f32 constant
            real = dequantize(np.asarray(stored).astype(np.int64).astype(params.storage_dtype), params)
            real = np.asarray(real, np.float32).reshape(_ranked(op.result).shape)
            replace_with_storage(rewriter, op, [ops.const(rewriter, real, F32)])
            return True
        storage = storage_of(rewriter, source)
        if not type_.is_signed:  # unsigned codes: their bits read as unsigned, exactly, into i32
            storage = rescale_to(
                rewriter,
                storage,
                np.array([1.0]),
                0,
                0,
                RankedTensorType(shape, I32),
                TosaRounding.SINGLE,
                input_unsigned=True,
            )
        real = ops.cast(rewriter, storage, F32)
        if np.any(zero_points != 0):
            real = ops.sub(rewriter, real, _float_constant(rewriter, zero_points, rank))
        real = ops.mul(
            rewriter, real, _float_constant(rewriter, scales, rank), ops.zero_point(rewriter, 0, I8)
        )
        return self.finish(rewriter, op, real)


class QuantizeFromFloat(_FloatPattern):
    """`uniform_quantize(x)`, x float, as ONNX QuantizeLinear: `x * (1/s)` clamped to the storage's range less
    zp, plus zp, cast to the storage (half to even); unsigned storage: cast to i32, then a rescale by 1 adding
    the zero point into the unsigned storage."""

    roots = ("stablehlo.uniform_quantize",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        if target is None or not _is_float(op.operands[0]):
            return False
        if not isinstance(target, UniformQuantizedType):
            return self.refusals.refuse(op, f"a float value quantized per axis ({target})")
        width = target.storage_type.width  # type: ignore[union-attr]
        if width not in (8, 16):
            return self.refusals.refuse(op, f"a float value quantized to {width}-bit storage")
        rank = _ranked(op.result).rank
        params = uniform_params(target)
        real = constant_of(op.operands[0])
        if real is not None:  # a constant's quantize: ONNX's rule in numpy, its storage's bits
            stored = np.asarray(quantize(np.asarray(real, np.float32), params)).astype(np.int64)
            if not target.is_signed:
                stored = np.where(stored >= 1 << (width - 1), stored - (1 << width), stored)
            array = stored.astype(np.int8 if width == 8 else np.int16).reshape(_ranked(op.result).shape)
            replace_with_storage(
                rewriter, op, [ops.const(rewriter, array, storage_type(op.result.type).element_type)]
            )
            return True
        scaled = ops.mul(
            rewriter,
            storage_of(rewriter, op.operands[0]),
            _float_constant(rewriter, np.float32(1.0) / np.float32(params.scale), rank),
            ops.zero_point(rewriter, 0, I8),
        )
        zero_point = int(params.zero_point)
        # clamped to the storage's range less zp (integers: clamping before rounding is clamping after), so
        # that the cast and the rescale below never saturate on a large or infinite value
        low, high = target.storage_type_min - zero_point, target.storage_type_max - zero_point
        clamped = ops.clamp(rewriter, scaled, low, high)
        if target.is_signed:  # rne(v) + zp == rne(v + zp): |v + zp| is within the storage, exact in f32
            shifted = ops.add(rewriter, clamped, _float_constant(rewriter, np.float32(zero_point), rank))
            stored = ops.cast(rewriter, shifted, storage_type(op.result.type).element_type)
            return self.finish(rewriter, op, stored)
        rounded = ops.cast(rewriter, clamped, I32)
        stored = rescale_to(  # unsigned storage: the output zero point written as the storage's bits
            rewriter,
            rounded,
            np.array([1.0]),
            0,
            zero_point - (1 << width) if zero_point >= 1 << (width - 1) else zero_point,
            storage_type(op.result.type),
            TosaRounding.SINGLE,
            output_unsigned=True,
        )
        return self.finish(rewriter, op, stored, rounded)


_BINARY: dict[str, Callable[..., Value]] = {
    "stablehlo.add": ops.add,
    "stablehlo.subtract": ops.sub,
    "stablehlo.maximum": ops.maximum,
    "stablehlo.minimum": ops.minimum,
    "stablehlo.power": ops.power,
}
_UNARY = {
    "stablehlo.exponential": "tosa.exp",
    "stablehlo.rsqrt": "tosa.rsqrt",
    "stablehlo.tanh": "tosa.tanh",
    "stablehlo.logistic": "tosa.sigmoid",
    "chlo.erf": "tosa.erf",
    "stablehlo.log": "tosa.log",
    "stablehlo.abs": "tosa.abs",
    "stablehlo.floor": "tosa.floor",
    "stablehlo.ceil": "tosa.ceil",
}


def _operand(value: Value) -> Value:
    """A float operand as TOSA reads it: through the tile of a broadcast (TOSA broadcasts dims of 1)."""
    producer = value.owner_op()
    if producer is not None and producer.name == "tosa.tile":
        return producer.operands[0]
    return value


def _legalized(value: Value) -> bool:
    """Whether a float operand is already TOSA's (or the function's argument)."""
    producer = value.owner_op()
    return (
        producer is None
        or producer.name.startswith("tosa.")
        or producer.name == "builtin.unrealized_conversion_cast"
    )


class ElementwiseToFloat(_FloatPattern):
    """add / subtract / multiply / divide / maximum / minimum / power and exp / rsqrt / sqrt / tanh /
    logistic / erf / log / abs / floor / ceil / negate of f32 values as the f32 TOSA ops (divide: times the
    reciprocal, of a constant computed here; sqrt: pow(x, 0.5); negate: times -1)."""

    roots = (
        *_BINARY,
        *_UNARY,
        "stablehlo.multiply",
        "stablehlo.divide",
        "stablehlo.sqrt",
        "stablehlo.negate",
    )

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if not _is_float(op.result) or not all(_legalized(operand) for operand in op.operands):
            return False
        operands = [_operand(operand) for operand in op.operands]
        rank = _ranked(op.result).rank
        zero_shift = ops.zero_point(rewriter, 0, I8)
        if op.name in _BINARY:
            value = _BINARY[op.name](rewriter, *operands)
        elif op.name in _UNARY:
            value = ops.unary(rewriter, _UNARY[op.name], operands[0])
        elif op.name == "stablehlo.multiply":
            value = ops.mul(rewriter, *operands, zero_shift)
        elif op.name == "stablehlo.divide":
            divisor = splat_value(op.operands[1])
            if divisor is not None:
                inverse = _float_constant(rewriter, np.float32(1.0) / np.float32(divisor), rank)
            else:
                inverse = ops.unary(rewriter, "tosa.reciprocal", operands[1])
            value = ops.mul(rewriter, operands[0], inverse, zero_shift)
        elif op.name == "stablehlo.sqrt":
            value = ops.power(rewriter, operands[0], _float_constant(rewriter, np.float32(0.5), rank))
        else:  # negate
            value = ops.mul(
                rewriter, operands[0], _float_constant(rewriter, np.float32(-1.0), rank), zero_shift
            )
        if _ranked(value).shape != _ranked(op.result).shape:  # both operands read through broadcasts
            value = ops.tile(
                rewriter,
                value,
                [r // s for r, s in zip(_ranked(op.result).shape, _ranked(value).shape, strict=True)],
            )
        return self.finish(rewriter, op, value)


def _ints(op: Operation, name: str) -> list[int]:
    attribute = op.attributes.get(name)
    if isinstance(attribute, DenseArrayAttr):
        return [int(v) for v in attribute.values]
    raise AssertionError(f"{op.name} has no {name}")


class DataMovementToFloat(_FloatPattern):
    """transpose / reshape / broadcast_in_dim / slice / concatenate of f32 values (inside a float island)."""

    roots = (
        "stablehlo.transpose",
        "stablehlo.reshape",
        "stablehlo.broadcast_in_dim",
        "stablehlo.slice",
        "stablehlo.concatenate",
    )

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if not _is_float(op.result) or not all(_legalized(operand) for operand in op.operands):
            return False
        source = op.operands[0]
        result_shape = _ranked(op.result).shape
        if op.name == "stablehlo.transpose":
            value = ops.transpose(rewriter, source, _ints(op, "permutation"))
        elif op.name == "stablehlo.reshape":
            value = ops.reshape(rewriter, source, result_shape)
        elif op.name == "stablehlo.slice":
            start, limit = _ints(op, "start_indices"), _ints(op, "limit_indices")
            strides = _ints(op, "strides") if "strides" in op.attributes else [1] * len(start)
            if any(s != 1 for s in strides):
                return self.refusals.refuse(op, "a strided float slice")
            value = ops.slice_(
                rewriter, source, start, [hi - lo for lo, hi in zip(start, limit, strict=True)]
            )
        elif op.name == "stablehlo.concatenate":
            value = ops.concat(rewriter, list(op.operands), _ints(op, "dimension")[0])
        else:
            dims = _ints(op, "broadcast_dimensions")
            if dims != sorted(dims):
                return self.refusals.refuse(op, "a float broadcast that also transposes")
            shape = [1] * len(result_shape)
            for index, dim in enumerate(dims):
                shape[dim] = _ranked(source).shape[index]
            value = source
            if tuple(shape) != _ranked(source).shape:
                value = ops.reshape(rewriter, value, shape)
            multiples = [r // s for r, s in zip(result_shape, shape, strict=True)]
            if any(m != 1 for m in multiples):
                value = ops.tile(rewriter, value, multiples)
            if value is source:
                rewriter.replace_op(op, [source])
                return True
        return self.finish(rewriter, op, value)


_REDUCTIONS = {"stablehlo.add": ("tosa.reduce_sum", 0.0), "stablehlo.maximum": ("tosa.reduce_max", -np.inf)}


class ReduceToFloat(_FloatPattern):
    """`stablehlo.reduce` of f32 by add / maximum over some dims (init 0 / -inf): one TOSA reduce per dim
    (each keeps a dim of 1), then a reshape to the result."""

    roots = ("stablehlo.reduce",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if len(op.operands) != 2 or not _is_float(op.results[0]) or not _legalized(op.operands[0]):
            return False
        body = op.regions[0].entry
        if len(body.ops) != 2 or body.ops[0].name not in _REDUCTIONS:
            return self.refusals.refuse(op, "a float reduction other than a sum or a maximum")
        name, identity = _REDUCTIONS[body.ops[0].name]
        init = splat_value(op.operands[1])
        if init is None or float(init) != identity:
            return self.refusals.refuse(op, f"a float reduction whose initial value is not {identity}")
        value = op.operands[0]
        for axis in sorted(_ints(op, "dimensions"), reverse=True):
            value = ops.reduce(rewriter, name, value, axis)
        value = ops.reshape(rewriter, value, _ranked(op.results[0]).shape)
        return self.finish(rewriter, op, value)


class DotGeneralToFloat(_FloatPattern):
    """`dot_general` of f32 values as a float `tosa.matmul` (`[batch, free, contract]` by `[batch, contract,
    free]`), as DotGeneralToMatmul does on storage."""

    roots = ("stablehlo.dot_general",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if not _is_float(op.result) or not all(_legalized(operand) for operand in op.operands):
            return False
        from qconvert.backends.stablehlo import DotDimensionNumbers

        numbers = DotDimensionNumbers.parse(op.attributes["dot_dimension_numbers"])
        lhs_type, rhs_type = _ranked(op.operands[0]), _ranked(op.operands[1])
        lhs_batch, rhs_batch = list(numbers.lhs_batching), list(numbers.rhs_batching)
        lhs_contract, rhs_contract = list(numbers.lhs_contracting), list(numbers.rhs_contracting)
        lhs_free = [d for d in range(lhs_type.rank) if d not in lhs_batch + lhs_contract]
        rhs_free = [d for d in range(rhs_type.rank) if d not in rhs_batch + rhs_contract]

        def size(type_: RankedTensorType, dims: list[int]) -> int:
            return int(np.prod([type_.shape[d] for d in dims]))

        def arranged(value: Value, order: list[int]) -> Value:
            return value if order == sorted(order) else ops.transpose(rewriter, value, order)

        batch = size(lhs_type, lhs_batch)
        lhs = arranged(op.operands[0], lhs_batch + lhs_free + lhs_contract)
        lhs = ops.reshape(rewriter, lhs, [batch, size(lhs_type, lhs_free), size(lhs_type, lhs_contract)])
        rhs = arranged(op.operands[1], rhs_batch + rhs_contract + rhs_free)
        rhs = ops.reshape(rewriter, rhs, [batch, size(rhs_type, rhs_contract), size(rhs_type, rhs_free)])
        zero = ops.const(rewriter, np.zeros((1,), np.float32), F32)
        product = ops.float_matmul(rewriter, lhs, rhs, zero)
        return self.finish(rewriter, op, ops.reshape(rewriter, product, _ranked(op.result).shape))


class SelectAndConvertToFloat(_FloatPattern):
    """`select(i1, f32, f32)` as tosa.select; `convert` of integers (storage-free: token ids, a mask) to f32
    as tosa.cast (an i64 narrowed to i32 first, index_ops.py)."""

    roots = ("stablehlo.select", "stablehlo.convert")

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if not _is_float(op.result):
            return False
        if op.name == "stablehlo.select":
            if not all(_legalized(operand) for operand in op.operands):
                return False
            condition, on_true, on_false = (_operand(operand) for operand in op.operands)
            value = ops.select(rewriter, condition, on_true, on_false)
        else:
            source = op.operands[0]
            if _is_float(source) or quant_type(source) is not None:
                return False
            narrow = as_i32(rewriter, source) if element_type_of(source.type) == I64 else source
            if narrow is None or not _legalized(narrow):
                return False
            value = ops.cast(rewriter, narrow, F32)
        if _ranked(value).shape != _ranked(op.result).shape:
            value = ops.tile(
                rewriter,
                value,
                [r // s for r, s in zip(_ranked(op.result).shape, _ranked(value).shape, strict=True)],
            )
        return self.finish(rewriter, op, value)


def float_patterns(refusals: Refusals, labels: Labels) -> list[object]:
    """The patterns of `--allow-float`, run once the integer patterns are done."""
    return [
        pattern(refusals, labels)
        for pattern in (
            DequantizeToFloat,
            QuantizeFromFloat,
            ElementwiseToFloat,
            DataMovementToFloat,
            ReduceToFloat,
            DotGeneralToFloat,
            SelectAndConvertToFloat,
        )
    ]


def island_nodes(body: Block) -> list[str]:
    """The ONNX nodes float ops compute (from their notes), in order of first appearance; the islands'
    edges (the DequantizeLinear / QuantizeLinear around them, `quant.dcast` / `quant.qcast`) last."""
    found: dict[str, None] = {}
    for op in body.ops:
        note = op.attributes.get(NOTE)
        if isinstance(note, StringAttr) and note.value.startswith(f"{FLOAT_NOTE}: ONNX "):
            found.setdefault(note.value.removeprefix(f"{FLOAT_NOTE}: ONNX "), None)
    edges = [name for name in found if name.startswith("quant.")]
    return [name for name in found if not name.startswith("quant.")] + edges


def profile_note(nodes: list[str]) -> str:
    """The module's note: which profiles it needs and which ONNX nodes are float."""
    if not nodes:
        return "integer-only TOSA: needs PRO-INT alone"
    inner = [name for name in nodes if not name.startswith("quant.")]
    edges = len(nodes) - len(inner)
    return (
        f"needs PRO-INT + PRO-FP: {len(inner)} ONNX nodes kept float (--allow-float): {', '.join(inner)}"
        f"; and {edges} DequantizeLinear / QuantizeLinear at their edges in f32"
    )
