"""`dce`: erase ops whose results are unused and that have no side effects, as xDSL's
`dead-code-elimination` (xdsl/transforms/dead_code_elimination.py) and MLIR's trivially-dead-op erasure do.

An op is removable when its class says it is pure (`is_pure`), or when it is a generic op of a dialect
the pass is told is pure (`pure-dialects`, default `stablehlo,chlo`: every such op we emit is pure, and
those ops have no class here). Each block is swept last op to first, so an op used only by dead ops
goes in the same sweep; nested regions are swept before the op that owns them.

Example (`qconvert opt --dce`):

    func.func @f(%arg0: tensor<2xf32>) -> tensor<2xf32> {
      %0 = "stablehlo.negate"(%arg0) : (tensor<2xf32>) -> tensor<2xf32>
      %1 = "stablehlo.abs"(%0) : (tensor<2xf32>) -> tensor<2xf32>
      return %arg0 : tensor<2xf32>
    }

becomes the function with its `return` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from qconvert.ir.core import Block, GenericOp, Operation
from qconvert.passes import ModulePass, PassResult, register_pass

__all__ = ["DeadCodeEliminationPass", "erase_nested", "erase_unused"]


def erase_unused(block: Block, is_removable: Callable[[Operation], bool]) -> int:
    """Erase the ops of `block` whose results are unused and that `is_removable` allows, last to first (an
    op used only by dead ops goes too), in one pass over the block; returns how many."""
    dead: list[Operation] = []
    for op in reversed(block.ops):
        if op.is_terminator or not op.results or any(r.uses for r in op.results) or not is_removable(op):
            continue
        op.drop_all_references()
        dead.append(op)
    if dead:
        block.remove_ops(dead)
    return len(dead)


@register_pass
@dataclass(frozen=True, kw_only=True)
class DeadCodeEliminationPass(ModulePass):
    name: ClassVar[str] = "dce"
    pure_dialects: str = "stablehlo,chlo"  # comma-separated dialects whose generic ops are all pure

    def run(self, module: Operation) -> PassResult:
        dialects = frozenset(d.strip() for d in self.pure_dialects.split(",") if d.strip())

        def is_removable(op: Operation) -> bool:
            return op.is_pure or (isinstance(op, GenericOp) and op.name.split(".", 1)[0] in dialects)

        return PassResult(changed=erase_nested(module, is_removable) > 0)


def erase_nested(op: Operation, is_removable: Callable[[Operation], bool]) -> int:
    """Erase the dead ops nested in `op` (innermost blocks first); returns how many."""
    erased = 0
    for region in op.regions:
        for block in region.blocks:
            for nested in block.ops:
                erased += erase_nested(nested, is_removable)
            erased += erase_unused(block, is_removable)
    return erased
