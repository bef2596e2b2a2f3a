"""What passes modelled on upstream's dialect conversion share: the order it visits ops, where it reports.

NOTE: `OperationConverter::convertOperations` collects ops with a pre-order walk whose blocks come from
`ForwardDominanceIterator`: a depth-first pre-order over successors from each region's entry block. So a
block that no branch reaches is never visited, and the ops in it keep their types; passes modelled on a
conversion reproduce that (upstream then fails to verify what it left, and so do we).
"""

from __future__ import annotations

from collections.abc import Iterator

from qconvert.errors import Location
from qconvert.ir.core import Block, BlockArgument, Operation, OpResult, Region, Value


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
