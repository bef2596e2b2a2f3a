"""What passes modelled on upstream's dialect conversion share: visit order, folds, where it reports.

NOTE: `OperationConverter::convertOperations` collects ops with a pre-order walk whose blocks come from
`ForwardDominanceIterator`: a depth-first pre-order over successors from each region's entry block. So a
block that no branch reaches is never visited, and the ops in it keep their types; passes modelled on a
conversion reproduce that (upstream then fails to verify what it left, and so do we).

Before applying patterns to an op that is not legal, upstream tries the op's folder (the quant casts have
one). Folds see the IR as it was before the conversion, since replacements take effect when it ends; but
an op converted later reads a folded result as the value it folds to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from qconvert.errors import Location
from qconvert.ir.core import Block, BlockArgument, Operation, OpResult, Region, Value
from qconvert.ir.dialects.quant import QuantCastOp


def reachable_blocks(region: Region) -> list[Block]:
    """The blocks of `region` reachable from its entry, in depth-first pre-order over successors."""
    if not region.blocks:
        return []
    order: list[Block] = []
    seen: set[Block] = set()
    stack = [region.entry]
    while stack:
        block = stack.pop()
        if block in seen:
            continue
        seen.add(block)
        order.append(block)
        terminator = block.terminator
        # Pushed in reverse so the first successor is visited first, as llvm::depth_first does.
        stack.extend(reversed(terminator.successors if terminator is not None else []))
    return order


def walk_in_conversion_order(root: Operation) -> Iterator[Operation]:
    """`root`, then every op nested in it, pre-order, skipping blocks no branch reaches."""
    yield root
    for region in root.regions:
        for block in reachable_blocks(region):
            for op in list(block.ops):
                yield from walk_in_conversion_order(op)


def value_location(value: Value) -> Location | None:
    """Where upstream reports about `value` (and locates its casts): its defining op, or for a block argument
    the op owning the block (we keep no per-argument locations)."""
    if isinstance(value, OpResult):
        return value.owner.location
    assert isinstance(value, BlockArgument)
    region = value.owner.parent
    owner = region.parent if region is not None else None
    return owner.location if owner is not None else None


def fold_casts(ops: Iterable[Operation], needs_conversion: Callable[[Operation], bool]) -> dict[Value, Value]:
    """The results of the casts among `ops` that upstream folds, each with the value it folds to.

    `needs_conversion` is the conversion's view of an op: only such ops are folded (an op the target
    calls legal is left alone). Call this before changing anything: folds read the original IR.
    """
    folds: dict[Value, Value] = {}
    for op in ops:
        if isinstance(op, QuantCastOp) and needs_conversion(op):
            folded = op.fold()
            if folded is not None:
                folds[op.result] = folded
    return folds


def resolve_fold(value: Value, folds: Mapping[Value, Value]) -> Value:
    """The value `value` stands for once folds apply (a cast may fold to another folded cast's result)."""
    while value in folds:
        value = folds[value]
    return value


def replace_folded(
    folds: Mapping[Value, Value], view: Callable[[Value], Value] = lambda value: value
) -> None:
    """Apply `folds` as upstream does at the end: every use of a folded cast reads the value it folds to
    (through `view`, which may substitute a retyped value's cast), then the casts are erased."""
    for result in folds:
        result.replace_all_uses_with(view(resolve_fold(result, folds)))
    for result in reversed(list(folds)):
        cast = result.owner_op()
        assert cast is not None, "a fold's key is a cast's result"
        cast.erase()
