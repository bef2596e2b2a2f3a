"""Token ids: an int64 model input read as TOSA's i32, and the gather it feeds (an embedding lookup).

TOSA has no 64-bit integers in PRO-INT / PRO-FP and `tosa.gather` takes i32 indices. So an i64 argument of
`@main` becomes i32 (its `qconvert.note` says so; the values must lie in [-2**31, 2**31), as token ids do),
the integer arithmetic ONNX's Gather does on it (negative indices wrapped: compare, add, select) is i32
TOSA, and a `stablehlo.gather` of whole rows at those run-time indices is one `tosa.gather`. Until the
patterns have run, the narrowed values are handed to the i64 ops through the same materializing casts as
storage (storage.py), which `fold_casts` removes.
"""

from __future__ import annotations

import re
from typing import ClassVar

import numpy as np

from qconvert.ir.attributes import OpaqueAttr, StringAttr
from qconvert.ir.core import Builder, Operation, Value
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.dialects.qconvert import NOTE
from qconvert.ir.types import I32, I64, IntegerType, RankedTensorType, element_type_of
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .storage import CAST, Refusals, constant_of, materialize, replace_with_storage, storage_of

__all__ = ["INDEX_NOTE", "as_i32", "index_patterns", "narrow_index_arguments", "note_arguments"]

INDEX_NOTE = (
    "ONNX int64 input taken as i32 (TOSA has no i64): its values must lie in [-2**31, 2**31), as token ids do"
)


def _is_i64(value: Value) -> bool:
    return element_type_of(value.type) == I64


def narrow_index_arguments(function: FuncOp) -> list[int]:
    """Every i64 argument of `function` becomes i32, read by the i64 ops through a cast; returns their
    positions (the caller notes them among the argument attributes)."""
    from qconvert.ir.types import FunctionType

    body = function.body
    inputs = list(function.function_type.inputs)
    narrowed = []
    for index, argument in enumerate(body.arguments):
        if not _is_i64(argument) or not isinstance(argument.type, RankedTensorType):
            continue
        wide_type = argument.type
        users = list(argument.uses)
        argument.type = inputs[index] = wide_type.with_element_type(I32)
        wide = materialize(Builder.at_start(body), argument, wide_type)
        for user, position in users:
            user.set_operand(position, wide)
        narrowed.append(index)
    function.function_type = FunctionType(tuple(inputs), tuple(function.function_type.results))
    return narrowed


def _is_narrowed(value: Value) -> bool:
    """Whether an i64 value is an i32 one read through a cast (a narrowed argument, or computed from one)."""
    producer = value.owner_op()
    return (
        producer is not None and producer.name == CAST and element_type_of(producer.operands[0].type) == I32
    )


def as_i32(b: Builder, value: Value) -> Value | None:
    """The i32 of an i64 value: the narrowed value its cast reads, or a constant that fits; else None."""
    producer = value.owner_op()
    if producer is not None and producer.name == CAST and element_type_of(producer.operands[0].type) == I32:
        return producer.operands[0]
    array = constant_of(value)
    if array is None or np.any(np.abs(np.asarray(array, np.int64)) >= 2**31):
        return None
    return ops.const(b, np.asarray(array, np.int64).astype(np.int32), I32)


def _direction(op: Operation) -> str:
    attribute = op.attributes["comparison_direction"]
    text = attribute.text if isinstance(attribute, OpaqueAttr) else str(attribute)
    return text.replace(">", " ").split()[-1]


class _Pattern:
    roots: ClassVar[tuple[Root, ...]]

    def __init__(self, refusals: Refusals) -> None:
        self.refusals = refusals


class IndexArithmeticToI32(_Pattern):
    """add / subtract / maximum / minimum / compare / select / reshape / broadcast of narrowed i64 values (the
    negative-index wrap of ONNX Gather) as the same i32 TOSA ops; the i64 result read through a cast."""

    roots = (
        "stablehlo.add",
        "stablehlo.subtract",
        "stablehlo.maximum",
        "stablehlo.minimum",
        "stablehlo.compare",
        "stablehlo.select",
        "stablehlo.reshape",
        "stablehlo.broadcast_in_dim",
    )

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        wide = [operand for operand in op.operands if _is_i64(operand)]
        if not wide:
            return False
        if op.name == "stablehlo.broadcast_in_dim":
            return self._broadcast(op, rewriter)
        if not any(_is_narrowed(operand) for operand in wide):
            return False  # i64 arithmetic of constants only (a float island's emulation): not token ids
        narrow = {operand: as_i32(rewriter, operand) for operand in wide}
        if any(value is None for value in narrow.values()):
            return False
        operands = [narrow.get(operand, operand) for operand in op.operands]
        if op.name == "stablehlo.reshape":
            shape = op.result.type.shape  # type: ignore[attr-defined]
            result = ops.reshape(rewriter, operands[0], shape)  # type: ignore[arg-type]
        elif op.name == "stablehlo.compare":
            lhs, rhs = operands
            direction = _direction(op)
            if direction in ("LT", "LE"):
                lhs, rhs = rhs, lhs
            name = {"LT": "tosa.greater", "GT": "tosa.greater", "LE": "tosa.greater_equal"}.get(
                direction, {"GE": "tosa.greater_equal", "EQ": "tosa.equal", "NE": "tosa.equal"}.get(direction)
            )
            if name is None:
                return self.refusals.refuse(op, f"a comparison {direction} of indices")
            result = ops.compare(rewriter, name, lhs, rhs)  # type: ignore[arg-type]
            if direction == "NE":
                result = ops.logical_not(rewriter, result)
            rewriter.replace_op(op, [result])
            return True
        elif op.name == "stablehlo.select":
            condition, on_true, on_false = operands
            result = ops.select(rewriter, storage_of(rewriter, condition), on_true, on_false)  # type: ignore[arg-type]
        else:
            from .legalize import ELEMENTWISE

            result = ELEMENTWISE[op.name](rewriter, *operands)  # type: ignore[arg-type]
        replace_with_storage(rewriter, op, [result])
        return True

    def _broadcast(self, op: Operation, rewriter: PatternRewriter) -> bool:
        """A constant's broadcast (the wrap's bound) read by narrowed values: an i32 constant of the result's
        shape."""
        if not any(
            _is_narrowed(other) for user, _ in op.result.uses for other in user.operands if _is_i64(other)
        ):
            return False
        array = constant_of(op.operands[0])
        if array is None or array.size != 1 or abs(int(array.reshape(-1)[0])) >= 2**31:
            return False
        shape = op.result.type.shape  # type: ignore[attr-defined]
        constant = ops.const(rewriter, np.full(shape, int(array.reshape(-1)[0]), np.int32), I32)
        replace_with_storage(rewriter, op, [constant])
        return True


def _rows_gather(op: Operation) -> int | None:
    """The axis when a `stablehlo.gather` takes whole slices along one axis at run-time indices whose last
    dim is the index vector (of size 1): `result = indices.shape[:-1] + operand.shape without axis`."""
    attribute = op.attributes.get("dimension_numbers")
    text = getattr(attribute, "text", "")
    fields = dict(re.findall(r"(\w+) = (\[[^\]]*\]|\d+)", text))
    if set(fields) != {"offset_dims", "collapsed_slice_dims", "start_index_map", "index_vector_dim"}:
        return None
    operand, indices = op.operands[0].type, op.operands[1].type
    if not isinstance(operand, RankedTensorType) or not isinstance(indices, RankedTensorType):
        return None
    collapsed = [int(v) for v in re.findall(r"-?\d+", fields["collapsed_slice_dims"])]
    start_map = [int(v) for v in re.findall(r"-?\d+", fields["start_index_map"])]
    offsets = [int(v) for v in re.findall(r"-?\d+", fields["offset_dims"])]
    if len(collapsed) != 1 or start_map != collapsed or collapsed[0] != 0:
        return None  # rows of the first axis (an embedding table): the one form seen
    if int(fields["index_vector_dim"]) != indices.rank - 1 or indices.shape[-1] != 1:
        return None
    batch = indices.rank - 1
    if offsets != list(range(batch, batch + operand.rank - 1)):
        return None
    sizes = [int(v) for v in op.attributes["slice_sizes"].values]  # type: ignore[attr-defined]
    if sizes != [1, *operand.shape[1:]]:
        return None
    return 0


class RowGatherToGather(_Pattern):
    """`stablehlo.gather` of whole rows of a table at run-time i32 (narrowed) indices as one `tosa.gather`
    on `[1, rows, row size]` (an index out of range: StableHLO clamps, TOSA's result is unpredictable; ONNX
    Gather calls it an error)."""

    roots = ("stablehlo.gather",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        indices = op.operands[1]
        if _rows_gather(op) is None or element_type_of(op.result.type) == IntegerType(1):
            return False  # constant indices of another form: legalize.py's GatherToGather; i1: BooleanOps
        narrow = as_i32(rewriter, indices) if _is_i64(indices) else indices
        if narrow is None or element_type_of(narrow.type) != I32:
            return self.refusals.refuse(op, "a gather at run-time indices that are not i32 (or narrowed i64)")
        table_type = op.operands[0].type
        assert isinstance(table_type, RankedTensorType)
        rows = table_type.shape[0]
        width = int(np.prod(table_type.shape[1:]))
        count = int(np.prod(narrow.type.shape))  # type: ignore[attr-defined]
        values = ops.reshape(rewriter, storage_of(rewriter, op.operands[0]), [1, rows, width])
        gathered = ops.gather(rewriter, values, ops.reshape(rewriter, narrow, [1, count]))
        result = ops.reshape(rewriter, gathered, op.result.type.shape)  # type: ignore[attr-defined]
        replace_with_storage(rewriter, op, [result])
        return True


def _gather_values(op: Operation, operand: np.ndarray, indices: np.ndarray) -> np.ndarray | None:
    """StableHLO gather of single elements (every slice size 1, no offset dims): each index vector picks
    one element, clamped into range as StableHLO does; None for other forms."""
    text = getattr(op.attributes.get("dimension_numbers"), "text", "")
    fields = dict(re.findall(r"(\w+) = (\[[^\]]*\]|\d+)", text))
    sizes = [int(v) for v in op.attributes["slice_sizes"].values]  # type: ignore[attr-defined]
    start_map = [int(v) for v in re.findall(r"-?\d+", fields.get("start_index_map", ""))]
    if "offset_dims" in fields or any(size != 1 for size in sizes) or len(start_map) != operand.ndim:
        return None
    vector_dim = int(fields.get("index_vector_dim", indices.ndim))
    if vector_dim != indices.ndim - 1:
        return None
    position = [np.zeros(indices.shape[:-1], np.int64)] * operand.ndim
    for k, dim in enumerate(start_map):
        position[dim] = np.clip(indices[..., k], 0, operand.shape[dim] - 1)
    return operand[tuple(position)]


def _evaluate_indices(value: Value, depth: int = 0) -> np.ndarray | None:
    """The array of an integer value computed from constants only (iota, broadcast, reshape, concatenate,
    a gather of single elements, elementwise arithmetic): the indices a Gather's shape computation makes
    (position ids); None when it depends on the function's arguments."""
    from .float_island import EVALUATE

    array = constant_of(value)
    if array is not None:
        return np.asarray(array)
    producer = value.owner_op()
    if producer is None or depth > 32 or not isinstance(value.type, RankedTensorType):
        return None
    shape = value.type.shape
    if producer.name == "stablehlo.iota":
        dimension = producer.attributes["iota_dimension"].value  # type: ignore[attr-defined]
        ramp = np.arange(shape[dimension]).reshape([-1 if d == dimension else 1 for d in range(len(shape))])
        return np.broadcast_to(ramp, shape).astype(np.int64)
    data = producer.operands[:1] if producer.name in ("tosa.reshape", "tosa.tile") else producer.operands
    operands = [_evaluate_indices(operand, depth + 1) for operand in data]
    if any(operand is None for operand in operands):
        return None
    if producer.name in ("stablehlo.reshape", "tosa.reshape"):
        return operands[0].reshape(shape)  # type: ignore[union-attr]
    if producer.name == "tosa.tile":
        source = operands[0]
        assert source is not None
        return np.tile(source, [n // m for n, m in zip(shape, source.shape, strict=True)])
    if producer.name == "tosa.concat":
        return np.concatenate(operands, axis=producer.attributes["axis"].value)  # type: ignore[arg-type,attr-defined]
    if producer.name == "tosa.transpose":
        perms = [int(p) for p in producer.attributes["perms"].values]  # type: ignore[attr-defined]
        return np.transpose(operands[0], perms)  # type: ignore[arg-type]
    if producer.name == "stablehlo.broadcast_in_dim":
        dims = [int(d) for d in producer.attributes["broadcast_dimensions"].values]  # type: ignore[attr-defined]
        expanded = [1] * len(shape)
        for index, dim in enumerate(dims):
            expanded[dim] = operands[0].shape[index]  # type: ignore[union-attr]
        return np.broadcast_to(operands[0].reshape(expanded), shape)  # type: ignore[union-attr]
    if producer.name == "stablehlo.concatenate":
        axis = producer.attributes["dimension"].value  # type: ignore[attr-defined]
        return np.concatenate(operands, axis=axis)  # type: ignore[arg-type]
    if producer.name == "stablehlo.gather":
        return _gather_values(producer, *operands)  # type: ignore[arg-type]
    if producer.name in EVALUATE and producer.name.startswith("stablehlo."):
        return np.asarray(EVALUATE[producer.name](producer, *operands)).reshape(shape)
    return None


class ConstantIndices(_Pattern):
    """A gather whose indices are computed from constants only (position ids: an iota, a slice of a
    constant buffer, a negative-index wrap): the indices become one constant, read by the gather patterns."""

    roots = ("stablehlo.gather",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        indices = op.operands[1]
        if constant_of(indices) is not None:
            return False
        array = _evaluate_indices(indices)
        if array is None:
            return False
        element = element_type_of(indices.type)
        if isinstance(element, IntegerType) and element.width == 64:
            folded = ops.const(rewriter, np.asarray(array, np.int64), I64)
        else:
            folded = ops.const(rewriter, np.asarray(array).astype(np.int32), I32)
        op.set_operand(1, folded)
        return True


class BooleanOps(_Pattern):
    """Attention masks: `convert` of narrowed token-id-like integers to i1 (`!= 0`, tosa.cast), `and` of i1
    (tosa.logical_and), and a row gather of an i1 table (through i8: TOSA gathers no booleans)."""

    roots = ("stablehlo.convert", "stablehlo.and", "stablehlo.gather")

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        result = element_type_of(op.result.type)
        if result != IntegerType(1):
            return False
        if op.name == "stablehlo.convert":
            if not _is_narrowed(op.operands[0]):
                return False  # an i64 of a float island's emulation: the island's pattern reads it
            narrow = as_i32(rewriter, op.operands[0])
            if narrow is None:
                return False
            replace_with_storage(rewriter, op, [ops.cast(rewriter, narrow, IntegerType(1))])
            return True
        if op.name == "stablehlo.and":
            if not all(_is_tosa(operand) for operand in op.operands):
                return False  # a float island's emulation (its compares): the island's pattern reads it
            lhs, rhs = (_boolean(rewriter, operand) for operand in op.operands)
            replace_with_storage(rewriter, op, [_logical_and(rewriter, lhs, rhs)])
            return True
        if _rows_gather(op) is None:
            return False
        indices = op.operands[1]
        narrow = as_i32(rewriter, indices) if _is_i64(indices) else indices
        if narrow is None or element_type_of(narrow.type) != I32:
            return False
        table = op.operands[0].type
        assert isinstance(table, RankedTensorType)
        width = int(np.prod(table.shape[1:]))
        count = int(np.prod(narrow.type.shape))  # type: ignore[attr-defined]
        values = ops.cast(rewriter, storage_of(rewriter, op.operands[0]), IntegerType(8))
        values = ops.reshape(rewriter, values, [1, table.shape[0], width])
        gathered = ops.gather(rewriter, values, ops.reshape(rewriter, narrow, [1, count]))
        gathered = ops.cast(rewriter, gathered, IntegerType(1))
        replace_with_storage(rewriter, op, [ops.reshape(rewriter, gathered, op.result.type.shape)])  # type: ignore[attr-defined]
        return True


def _is_tosa(value: Value) -> bool:
    """Whether a value is already TOSA's (through the cast back to its type)."""
    producer = value.owner_op()
    if producer is not None and producer.name == CAST:
        producer = producer.operands[0].owner_op()
    return producer is not None and producer.name.startswith("tosa.")


def _boolean(rewriter: PatternRewriter, value: Value) -> Value:
    """An i1 operand as TOSA reads it: through the tile of a broadcast (TOSA broadcasts dims of 1)."""
    stored = storage_of(rewriter, value)
    producer = stored.owner_op()
    return producer.operands[0] if producer is not None and producer.name == "tosa.tile" else stored


def _logical_and(rewriter: PatternRewriter, lhs: Value, rhs: Value) -> Value:
    result = ops.compare(rewriter, "tosa.logical_and", lhs, rhs)  # i1 of the broadcast shape
    return result


def index_patterns(refusals: Refusals) -> list[object]:
    return [
        ConstantIndices(refusals),
        IndexArithmeticToI32(refusals),
        RowGatherToGather(refusals),
        BooleanOps(refusals),
    ]


def note_arguments(function: FuncOp, positions: list[int]) -> None:
    """`qconvert.note` on each narrowed argument's attributes."""
    from qconvert.ir.attributes import ArrayAttr, DictionaryAttr

    if not positions:
        return
    count = len(function.function_type.inputs)
    existing = function.attributes.get("arg_attrs")
    entries = list(existing.elements) if isinstance(existing, ArrayAttr) else [DictionaryAttr(())] * count
    for index in positions:
        kept = dict(entries[index].entries) if isinstance(entries[index], DictionaryAttr) else {}
        kept[NOTE] = StringAttr(INDEX_NOTE)
        entries[index] = DictionaryAttr(tuple(sorted(kept.items())))
    function.attributes["arg_attrs"] = ArrayAttr(tuple(entries))
