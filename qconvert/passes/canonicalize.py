"""`--canonicalize`: fold ops, erase dead ones and unique constants, as upstream's greedy driver does.

Runs on every `func.func` body (upstream's pipeline anchors it there:
`builtin.module(func.func(canonicalize))`). What it does, to a fixed point:

* folds the quant casts with upstream's folders (`QuantCastOp.fold`): `dcast(qcast(x))` -> `x`,
  `qcast(dcast(x))` -> `x` when the types agree, `scast(scast(x))` -> `x` when the casts invert each other;
* erases ops that have no side effects (`Operation.is_pure`) and whose results are unused;
* uniques `arith.constant`s (same value and type) and moves them to the start of the function's entry
  block. As upstream's `OperationFolder` does, a constant that is not already in the leading run of
  constants is moved to the very front, so constants scattered through a body come out in reverse order.

Upstream's canonicalization patterns of other dialects (arith's algebraic rewrites, region simplification
of multi-block bodies) are not modelled. With `test-convergence` the pass fails when the body still changes
after upstream's 10 iterations (it cannot with these patterns).

    func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
      %0 = quant.qcast %arg0 : tensor<4xf32> to tensor<4x!quant.uniform<u8:f32, 2.0:128>>
      %1 = quant.dcast %0 : tensor<4x!quant.uniform<u8:f32, 2.0:128>> to tensor<4xf32>
      return %1 : tensor<4xf32>
    }

becomes

    func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
      return %arg0 : tensor<4xf32>
    }
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from qconvert.ir.core import Block, Operation, Region, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.dialects.quant import QuantCastOp
from qconvert.passes import ModulePass, PassResult, register_pass

__all__ = [
    "CANONICALIZE_PATTERNS",
    "CanonicalizePass",
    "FoldQuantCast",
    "GreedyRewriter",
    "canonicalize",
    "canonicalize_function",
    "is_trivially_dead",
]

MAX_ITERATIONS = 10  # upstream's GreedyRewriteConfig::maxIterations


def is_trivially_dead(op: Operation) -> bool:
    """Upstream's `isOpTriviallyDead`: no result is used, and erasing it loses no side effect."""
    if op.is_terminator or any(result.uses for result in op.results):
        return False
    return all(nested.is_pure for nested in op.walk())


class GreedyRewriter:
    """Upstream's greedy pattern driver over one function body: a worklist, a constant folder, erasure."""

    def __init__(self, region: Region, patterns: tuple[FoldQuantCast, ...]) -> None:
        self.region = region
        self.patterns = patterns
        self.worklist: list[Operation] = []
        self.on_worklist: set[Operation] = set()
        self.erased: set[Operation] = set()
        self.constants: dict[tuple[object, object], ConstantOp] = {}  # (value, type) -> the uniqued op
        self.owned_constants: set[Operation] = set()
        self.changed = False

    # Worklist ---------------------------------------------------------------------------------
    def add(self, op: Operation | None) -> None:
        if op is not None and op not in self.on_worklist and op not in self.erased:
            self.worklist.append(op)
            self.on_worklist.add(op)

    def add_operand_producers(self, op: Operation) -> None:
        for operand in op.operands:
            self.add(operand.owner_op())

    # Rewrites (the patterns touch the IR only through these) -----------------------------------
    def erase(self, op: Operation) -> None:
        producers = [operand.owner_op() for operand in op.operands]
        for nested in list(op.walk()):
            self.erased.add(nested)
        op.erase()
        for producer in producers:
            self.add(producer)
        self.changed = True

    def replace(self, op: Operation, values: Sequence[Value]) -> None:
        for result, value in zip(op.results, values, strict=True):
            for user, _ in list(result.uses):
                self.add(user)
            result.replace_all_uses_with(value)
        self.erase(op)

    # Constants (upstream's OperationFolder::insertKnownConstant) -------------------------------
    def insert_known_constant(self, op: ConstantOp) -> bool:
        """Unique `op` and move it to the front of the entry block; False when it was a duplicate."""
        if op in self.owned_constants:
            return True
        key = (op.value, op.result.type)
        existing = self.constants.get(key)
        if existing is not None:
            self.replace(op, [existing.result])
            return False
        entry = self.region.entry
        block = op.parent
        assert block is not None
        position = block.ops.index(op)
        if block is not entry or (position != 0 and block.ops[position - 1] not in self.owned_constants):
            block.ops.remove(op)
            entry.insert(0, op)
            self.changed = True
        self.constants[key] = op
        self.owned_constants.add(op)
        return True

    # Driver -----------------------------------------------------------------------------------
    def process(self, op: Operation) -> None:
        if is_trivially_dead(op):
            self.erase(op)
            return
        for pattern in self.patterns:  # dispatch by class: a pattern's root may be a base class
            if isinstance(op, type(pattern).root) and pattern.match_and_rewrite(op, self):  # type: ignore[arg-type]
                return

    def run_iteration(self) -> bool:
        """One round of upstream's `simplify` loop: populate the worklist post-order, drain it LIFO."""
        self.changed = False
        for op in list(post_order(self.region)):
            if op in self.erased:
                continue
            if isinstance(op, ConstantOp) and not self.insert_known_constant(op):
                continue
            self.add(op)
        while self.worklist:
            op = self.worklist.pop()
            self.on_worklist.discard(op)
            if op not in self.erased and op.parent is not None:
                self.process(op)
        return self.changed

    def run(self) -> tuple[bool, bool]:
        """Iterate to a fixed point: (whether anything changed, whether it converged in time)."""
        changed = False
        for _ in range(MAX_ITERATIONS):
            if not self.run_iteration():
                return changed, True
            changed = True
        return changed, False


def post_order(region: Region) -> list[Operation]:
    """Every op nested in `region`, each after the ops of its own regions (upstream's default walk)."""
    ops: list[Operation] = []

    def visit_block(block: Block) -> None:
        for op in block.ops:
            for nested in op.regions:
                for nested_block in nested.blocks:
                    visit_block(nested_block)
            ops.append(op)

    for block in region.blocks:
        visit_block(block)
    return ops


@dataclass(frozen=True)
class FoldQuantCast:
    """A quant cast whose folder (`QuantCastOp.fold`) finds the value it stands for is replaced by it."""

    root: ClassVar[type[Operation]] = QuantCastOp

    def match_and_rewrite(self, op: QuantCastOp, rewriter: GreedyRewriter) -> bool:
        folded = op.fold()
        if folded is None:
            return False
        rewriter.replace(op, [folded])
        return True


CANONICALIZE_PATTERNS: tuple[FoldQuantCast, ...] = (FoldQuantCast(),)
"""The pass's patterns (the op folders it applies); a `GreedyRewriter` drives them over one body."""


def canonicalize_function(function: FuncOp, *, test_convergence: bool = False) -> bool:
    """Canonicalize one function body to a fixed point; returns whether anything changed.

    Raises:
        VerifyError: with `test_convergence`, when the body still changes after the last iteration.
    """
    if function.is_declaration:
        return False
    changed, converged = GreedyRewriter(function.regions[0], CANONICALIZE_PATTERNS).run()
    if test_convergence and not converged:
        raise function.emit_error(f"canonicalizer did not converge in {MAX_ITERATIONS} iterations")
    return changed


def canonicalize(module: Operation, *, test_convergence: bool = False) -> bool:
    """Canonicalize every function under `module`; returns whether anything changed."""
    changed = False
    for op in list(module.walk()):
        if isinstance(op, FuncOp):
            changed |= canonicalize_function(op, test_convergence=test_convergence)
    return changed


@register_pass
@dataclass(frozen=True, kw_only=True)
class CanonicalizePass(ModulePass):
    """Fold quant casts, erase dead side-effect-free ops and unique constants in every function."""

    name: ClassVar[str] = "canonicalize"
    test_convergence: bool = False

    def run(self, module: Operation) -> PassResult:
        return PassResult(changed=canonicalize(module, test_convergence=self.test_convergence))
