"""Quantized values as their storage integers while StableHLO is legalized to TOSA, op by op.

The legalization patterns (legalize_quant.py, legalize.py) replace one StableHLO op at a time. A TOSA op
computes on storage (`tensor<...xi8>`), but the StableHLO ops not yet legalized still read quantized
values (`tensor<...x!quant.uniform<i8:f32, ...>>`), whose parameters the patterns need. So a pattern's
storage result is handed to them through a materialization, MLIR's `builtin.unrealized_conversion_cast`
(storage -> quantized type), and a pattern reads an operand's storage through `storage_of`, which sees
through that cast. When every op is legalized, `fold_casts` removes the casts: none may remain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qconvert.ir.attributes import DenseElementsAttr, DenseResourceAttr
from qconvert.ir.core import Builder, GenericOp, Operation, Value
from qconvert.ir.quant_types import QuantizedType, UniformQuantizedPerAxisType, UniformQuantizedType
from qconvert.ir.types import IntegerType, RankedTensorType, Type, element_type_of
from qconvert.passes.rewrite import PatternRewriter

CAST = "builtin.unrealized_conversion_cast"


def quant_type(value: Value | Type) -> QuantizedType | None:
    """The quantized element type of a value (or a tensor type), None when it is not quantized."""
    element = element_type_of(value.type if isinstance(value, Value) else value)
    return element if isinstance(element, QuantizedType) else None


def is_uniform(type_: object) -> bool:
    return isinstance(type_, UniformQuantizedType | UniformQuantizedPerAxisType)


def storage_element(type_: Type) -> Type:
    """The storage element type of a quantized element type, signless as TOSA takes integers; a float as it
    is."""
    element = element_type_of(type_)
    if isinstance(element, QuantizedType):
        assert isinstance(element.storage_type, IntegerType), f"float storage {element}"
        return IntegerType(element.storage_type.width)
    if isinstance(element, IntegerType) and element.width > 1:
        return IntegerType(element.width)  # ui8 / si8 -> i8: TOSA's integers are signless
    return element


def storage_type(type_: Type) -> RankedTensorType:
    """The tensor type of the storage of a (possibly quantized) tensor type."""
    assert isinstance(type_, RankedTensorType), f"TOSA needs ranked tensors, got {type_}"
    return type_.with_element_type(storage_element(type_))


def materialize(b: Builder, value: Value, type_: Type) -> Value:
    """`value` seen as `type_` (storage -> quantized, or back) until the casts are folded."""
    if value.type == type_:
        return value
    return b.insert(GenericOp(CAST, [value], [type_])).result


def storage_of(b: Builder, value: Value) -> Value:
    """The storage integers of `value` (itself when it is not quantized): the operand of the cast a pattern
    made, else a cast to the storage type that `fold_casts` resolves once the producer is legalized."""
    if quant_type(value) is None:
        return value
    producer = value.owner_op()
    if producer is not None and producer.name == CAST and quant_type(producer.operands[0]) is None:
        return producer.operands[0]
    return materialize(b, value, storage_type(value.type))


def replace_with_storage(rewriter: PatternRewriter, op: Operation, values: Sequence[Value]) -> None:
    """Replace `op`'s results by storage `values`, cast back to the results' types for the ops that read
    them and are not legalized yet."""
    rewriter.replace_op(
        op,
        [materialize(rewriter, value, result.type) for value, result in zip(values, op.results, strict=True)],
    )


def broadcast_source(value: Value) -> Value:
    """The input of the tile a broadcast made (TOSA's elementwise ops broadcast dims of 1 themselves)."""
    producer = value.owner_op()
    return producer.operands[0] if producer is not None and producer.name == "tosa.tile" else value


def constant_of(value: Value) -> np.ndarray | None:
    """The array of a `tosa.const` / `stablehlo.constant` (through casts), None when not a constant."""
    producer = value.owner_op()
    while producer is not None and producer.name == CAST:
        producer = producer.operands[0].owner_op()
    if producer is None or producer.name not in ("tosa.const", "stablehlo.constant"):
        return None
    attribute = producer.attributes["values" if producer.name == "tosa.const" else "value"]
    if isinstance(attribute, DenseElementsAttr):
        return np.asarray(attribute.array)
    if isinstance(attribute, DenseResourceAttr) and attribute.elements is not None:
        return np.asarray(attribute.elements.get())
    return None


def fold_casts(block_ops: Sequence[Operation]) -> int:
    """Every use of `cast(cast(x))` whose outer type is `x`'s reads `x`; returns how many values changed.
    The casts left unused are erased by the caller's dead-code pass."""
    folded = 0
    for op in block_ops:
        if op.name != CAST or op.parent is None:
            continue
        source = op.operands[0]
        producer = source.owner_op()
        is_round_trip = producer is not None and producer.name == CAST
        if is_round_trip and op.result.uses and producer.operands[0].type == op.result.type:  # type: ignore[union-attr]
            op.result.replace_all_uses_with(producer.operands[0])  # type: ignore[union-attr]
            folded += 1
    return folded


class Refusals:
    """Why a pattern left an op as it was, by op: the one InputError at the end lists them all."""

    def __init__(self) -> None:
        self.reasons: dict[int, str] = {}

    def refuse(self, op: Operation, reason: str) -> bool:
        """Record `reason` for `op`; returns False (the pattern did not rewrite), for `return refuse(...)`."""
        self.reasons[id(op)] = reason
        return False

    def reason(self, op: Operation) -> str | None:
        return self.reasons.get(id(op))
