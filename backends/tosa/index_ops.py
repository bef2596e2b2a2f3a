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
from qconvert.ir.types import I32, I64, RankedTensorType, element_type_of
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .storage import CAST, Refusals, constant_of, materialize, replace_with_storage, storage_of

__all__ = ["INDEX_NOTE", "index_patterns", "narrow_index_arguments"]

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


def _as_i32(b: Builder, value: Value) -> Value | None:
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
        narrow = {operand: _as_i32(rewriter, operand) for operand in wide}
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
        if _rows_gather(op) is None:
            return False  # constant indices of another form: legalize.py's GatherToGather
        narrow = _as_i32(rewriter, indices) if _is_i64(indices) else indices
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


def index_patterns(refusals: Refusals) -> list[object]:
    return [IndexArithmeticToI32(refusals), RowGatherToGather(refusals)]


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
