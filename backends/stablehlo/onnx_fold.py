"""Constant folding of onnx ops at conversion time, and the shape queries that only exist folded.

Shape, Size, ConstantOfShape, Range and arithmetic on their results are computed here, at conversion
time, so that static shapes leave no shape arithmetic in the StableHLO module. An op folds when every
present input is a constant: an `arith.constant` of the source, or a value an earlier fold produced (a
`stablehlo.constant` in the new module, found through its producer, so no state is kept). Folding
evaluates the op with onnx's reference implementation (`qconvert.interpret`, at the module's opset),
never with a rule of our own.

Only exact folds happen: ops whose results are integers or booleans, and ops that move or select data
(`EXACT_FLOAT_FOLDS`). Float math (Exp, Erf, Softmax, ...) is left to the engine, whose results we
compare with onnxruntime's: numpy's transcendental functions would be a third opinion.
"""

from __future__ import annotations

import numpy as np

from qconvert.errors import InputError
from qconvert.ir.attributes import DenseElementsAttr
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.onnx import present_positions
from qconvert.ir.types import IntegerType, Signedness, Type, element_type_of

from .lowering import LoweringContext, lowers, lowers_folding, source_shape, static_shape

# `lowers_folding` and the shape guards moved to lowering.py; the onnx_* modules still import them here.
__all__ = ["constant_input", "fold", "lowers_folding", "source_shape", "static_shape"]

# Float-valued ops whose reference result is bit-exact (no rounding, or one IEEE operation per element).
EXACT_FLOAT_FOLDS = frozenset(
    {
        "Identity", "Reshape", "Transpose", "Concat", "Split", "Slice", "Gather", "Unsqueeze", "Squeeze",
        "Flatten", "Expand", "Cast", "Where", "Equal", "Neg", "Abs", "Min", "Max", "Add", "Sub", "Mul",
        "Div", "ConstantOfShape", "Constant", "Shape", "Size", "Range",
    }
)  # fmt: skip
# Above this many elements a folded float result would be a new weight in the module: lower it instead.
MAX_FOLDED_ELEMENTS = 1 << 16


def onnx_op_type(op: Operation) -> str:
    return op.name.removeprefix("onnx.")


def result_element(ctx: LoweringContext, op: Operation, index: int = 0) -> Type:
    """The StableHLO element type of result `index` (known even when its shape is not)."""
    return element_type_of(ctx.convert_type(op.results[index].type))


def _known_producer(ctx: LoweringContext, op: Operation, position: int) -> Operation | None:
    """The op holding ONNX input `position`'s value when it is known at conversion time: the source's
    `arith.constant`, or the `stablehlo.constant` an earlier fold emitted. Reads no data."""
    source = ctx.source_input(op, position)
    producer = source.owner_op() if source is not None else None
    if producer is None:
        return None
    if isinstance(producer, ConstantOp):
        return producer
    lowered = ctx.value_map.get(source)  # type: ignore[arg-type]
    folded = lowered.owner_op() if lowered is not None else None
    if folded is not None and folded.name == "stablehlo.constant":
        return folded
    return None


def constant_input(ctx: LoweringContext, op: Operation, position: int) -> np.ndarray | None:
    """ONNX input `position` as a numpy array when it is known at conversion time, else None.

    Known means: a constant of the source module (read with ONNX's element type, so uint8 stays
    unsigned), or the result of an earlier fold.
    """
    producer = _known_producer(ctx, op, position)
    if producer is None:
        return None
    if isinstance(producer, ConstantOp):
        from qconvert.interpret import constant_array

        try:
            return constant_array(producer)  # type: ignore[arg-type]
        except InputError:  # elided weights
            return None
    attribute = producer.attributes.get("value")
    return np.asarray(attribute.array) if isinstance(attribute, DenseElementsAttr) else None


def _module_of(op: Operation) -> ModuleOp | None:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, ModuleOp):
        parent = parent.parent_op()
    return parent


def _foldable(op: Operation) -> bool:
    if onnx_op_type(op) in EXACT_FLOAT_FOLDS:
        return True
    return all(isinstance(element_type_of(r.type), IntegerType) for r in op.results)


def fold(ctx: LoweringContext, op: Operation) -> list[Value] | None:
    """The op's results as constants when all its inputs are known and folding it is exact, else None."""
    if not _foldable(op):
        return None
    positions = present_positions(op)
    if any(_known_producer(ctx, op, p) is None for p in positions):
        return None  # checked before any weight is read
    arrays = [constant_input(ctx, op, p) for p in positions]
    if any(a is None for a in arrays):
        return None
    module = _module_of(op)
    if module is None:
        return None
    from qconvert.interpret import Interpreter

    results = Interpreter(module).run_onnx(op, arrays)  # type: ignore[arg-type]
    if any(r.size > MAX_FOLDED_ELEMENTS and r.dtype.kind == "f" for r in results):
        return None
    values = []
    for index, array in enumerate(results):
        element = result_element(ctx, op, index)
        if array.dtype.kind == "u" and isinstance(element, IntegerType):
            element = IntegerType(element.width, Signedness.UNSIGNED)
        values.append(ctx.constant(array, element))
    return values


# Shape queries: always constant for static shapes ------------------------------------------------


@lowers("onnx.Shape")
def lower_shape(ctx: LoweringContext, op: Operation) -> list[Value]:
    shape = np.asarray(source_shape(ctx, op, 0), dtype=np.int64)
    start = int(ctx.attribute(op, "start", 0))  # type: ignore[arg-type]
    end = ctx.attribute(op, "end", None)
    rank = len(shape)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    stop = rank if end is None else int(end)  # type: ignore[arg-type]
    stop = min(max(stop + rank if stop < 0 else stop, 0), rank)
    return [ctx.constant(shape[start:stop], result_element(ctx, op))]


@lowers("onnx.Size")
def lower_size(ctx: LoweringContext, op: Operation) -> list[Value]:
    size = int(np.prod(source_shape(ctx, op, 0), dtype=np.int64))
    return [ctx.constant(np.asarray(size, np.int64), result_element(ctx, op))]


@lowers_folding("onnx.ConstantOfShape", "onnx.Range", "onnx.Constant")
def lower_needs_constant_inputs(ctx: LoweringContext, op: Operation) -> list[Value]:
    """Reached only when `fold` could not run: the op's inputs are computed at run time."""
    ctx.unsupported(
        f"{onnx_op_type(op)} needs constant inputs to have a static result; its inputs are computed at run "
        "time"
    )
