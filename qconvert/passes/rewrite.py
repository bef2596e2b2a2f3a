"""The rewrite framework every pass and backend post-pass shares: patterns, the rewriters, the drivers.

Two drivers, as MLIR has them:

- `apply_partial_conversion(root, patterns)`: dialect conversion (`applyPartialConversion`). Every op of a
  pattern's root class must go; replacements take effect when the conversion commits, so every fold and
  pattern sees the original IR; a failure leaves the IR as it was (`ConversionRewriter`).
- `apply_patterns(root, patterns)`: greedy rewriting (`applyPatternsGreedily`). Each op is offered to the
  patterns whose root matches it; a pattern changes the IR at once, through the `PatternRewriter` it is
  given (insert before, replace, erase, set an attribute); sweeps repeat until one changes nothing.

A pattern's `roots` name what it matches: op classes (dispatch by `isinstance`), or, for ops that have no
class (the `stablehlo.*` ops are generic), their names. Only the rewriters and `qconvert.ir.core` mutate IR.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar, Protocol, TypeVar

from qconvert.ir.attributes import Attribute
from qconvert.ir.core import Block, Builder, Operation, Value
from qconvert.passes.conversion import walk_in_conversion_order

__all__ = [
    "ConversionPattern",
    "ConversionRewriter",
    "PatternRewriter",
    "RewritePattern",
    "apply_partial_conversion",
    "apply_patterns",
    "matches",
]

OpT = TypeVar("OpT", bound=Operation)
Root = type[Operation] | str
"""What a pattern matches: an op class, or the name of an op that has no class."""


def matches(op: Operation, roots: Sequence[Root]) -> bool:
    """Whether `op` is an instance of one of the classes in `roots` or bears one of its names."""
    return any(op.name == root if isinstance(root, str) else isinstance(op, root) for root in roots)


# Dialect conversion ---------------------------------------------------------------------------------
class ConversionRewriter:
    """What a pattern may do to the IR, as MLIR's ConversionPatternRewriter allows it.

    New ops go before the op being converted; `replace_op` records a replacement that takes effect only
    when the conversion commits, so every fold and pattern sees the original IR (operands of later ops
    still name the original results). `rollback` removes everything inserted, leaving the IR untouched.
    """

    def __init__(self) -> None:
        self._builder: Builder | None = None
        self._inserted: list[Operation] = []
        self._replacements: list[tuple[Operation, list[Value]]] = []

    def set_insertion_point_before(self, op: Operation) -> None:
        self._builder = Builder.before(op)

    def insert(self, op: OpT) -> OpT:
        assert self._builder is not None, "no insertion point"
        self._inserted.append(op)
        return self._builder.insert(op)

    def replace_op(self, op: Operation, values: Sequence[Value]) -> None:
        assert len(values) == len(op.results), f"{op.name} has {len(op.results)} results"
        self._replacements.append((op, list(values)))

    def commit(self) -> None:
        """Apply the replacements (following chains: a fold may return a value that is itself replaced)."""
        replacement_of: dict[Value, Value] = {}
        for op, values in self._replacements:
            replacement_of.update(zip(op.results, values, strict=True))

        def resolve(value: Value) -> Value:
            while value in replacement_of:
                value = replacement_of[value]
            return value

        for op, _ in self._replacements:
            for result in op.results:
                result.replace_all_uses_with(resolve(result))
        for op, _ in reversed(self._replacements):
            op.erase()
        self._reset()

    def rollback(self) -> None:
        """Erase every inserted op (their results are used only by each other) and forget replacements."""
        for op in reversed(self._inserted):
            op.erase()
        self._reset()

    def _reset(self) -> None:
        self._builder = None
        self._inserted.clear()
        self._replacements.clear()


class ConversionPattern(Protocol):
    """Rewrites one op class: inserts ops through the rewriter, replaces the op, returns True."""

    root: ClassVar[type[Operation]]

    def match_and_rewrite(self, op: Operation, rewriter: ConversionRewriter) -> bool: ...


def apply_partial_conversion(
    root: Operation,
    patterns: Sequence[ConversionPattern],
    fold: Callable[[Operation], Value | None] = lambda op: None,
) -> bool:
    """Make every op of a pattern's root class disappear, as MLIR's `applyPartialConversion` does.

    Ops are visited in upstream's order (pre-order; blocks no branch reaches are skipped). Each is first
    folded (`fold(op)`, the op's folder where it has one), else rewritten by the first pattern that
    matches. Replacements take effect at the end, so folds and patterns see the original IR. Returns
    whether anything changed.

    Raises `VerifyError` at an op nothing can convert (upstream's "failed to legalize operation" text) or
    that a pattern rejects; the IR is then left as it was.
    """
    roots = tuple(pattern.root for pattern in patterns)
    targets = [op for op in walk_in_conversion_order(root) if isinstance(op, roots)]
    if not targets:
        return False
    rewriter = ConversionRewriter()
    try:
        for op in targets:
            rewriter.set_insertion_point_before(op)
            folded = fold(op)
            if folded is not None:
                rewriter.replace_op(op, [folded])
                continue
            if not any(p.match_and_rewrite(op, rewriter) for p in patterns if isinstance(op, p.root)):
                raise op.emit_error(
                    f"failed to legalize operation '{op.name}' that was explicitly marked illegal"
                )
    except BaseException:
        rewriter.rollback()
        raise
    rewriter.commit()
    return True


# Greedy rewriting -----------------------------------------------------------------------------------
class PatternRewriter(Builder):
    """What a greedy pattern may do to the IR, each change taking effect at once (MLIR's PatternRewriter).

    It is a `Builder` whose insertion point is before the op being matched, so op constructors
    (`backends/stablehlo/ops.py`) insert through it. `changed` records whether anything was done.
    """

    __slots__ = ("_anchor", "changed")

    def __init__(self, op: Operation) -> None:
        assert op.parent is not None, f"{op.name} is not in a block"
        Builder.__init__(self, op.parent, -1)  # the index is found on the first insert: most matches fail
        self._anchor = op
        self.changed = False

    def set_insertion_point_before(self, op: Operation) -> None:
        assert op.parent is not None, f"{op.name} is not in a block"
        self.block, self.index, self._anchor = op.parent, -1, op

    def insert(self, op: OpT) -> OpT:  # type: ignore[override]
        if self.index < 0:
            self.index = self.block.ops.index(self._anchor)
        self.changed = True
        return Builder.insert(self, op)  # type: ignore[return-value]

    def replace_all_uses_with(self, old: Value, new: Value) -> None:
        """Every use of `old` reads `new` instead (`old`'s producer stays, for `dce` to erase)."""
        if old.uses:
            self.changed = True
        old.replace_all_uses_with(new)

    def replace_op(self, op: Operation, values: Sequence[Value]) -> None:
        """Every use of `op`'s results reads `values` instead, then `op` is erased."""
        assert len(values) == len(op.results), f"{op.name} has {len(op.results)} results"
        for result, value in zip(op.results, values, strict=True):
            result.replace_all_uses_with(value)
        self.erase_op(op)

    def erase_op(self, op: Operation) -> None:
        """Remove `op`, whose results must be unused (before the insertion point: the point stays put)."""
        block = op.parent
        if self.index >= 0 and block is self.block and block is not None and block.ops.index(op) < self.index:
            self.index -= 1
        op.erase()
        self.changed = True

    def set_attribute(self, op: Operation, name: str, value: Attribute) -> None:
        op.attributes[name] = value
        self.changed = True


class RewritePattern(Protocol):
    """Rewrites an op that `roots` names: changes the IR through the rewriter, returns whether it did."""

    roots: ClassVar[tuple[Root, ...]]

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool: ...


def _ops_to_visit(root: Operation | Block, nested: bool) -> Iterator[Operation]:
    if isinstance(root, Block):
        for op in list(root.ops):
            yield from (op.walk() if nested else (op,))
        return
    yield from (root.walk() if nested else (root,))


def apply_patterns(
    root: Operation | Block,
    patterns: Sequence[RewritePattern],
    *,
    nested: bool = True,
    max_sweeps: int = 10,
) -> int:
    """Offer every op of `root` to the patterns that match it, in order, until one rewrites it; repeat the
    sweep while one changed something, at most `max_sweeps` times. Returns how many rewrites succeeded.

    The ops of a sweep are those present when it starts, in pre-order (`nested=False`: a block's own ops
    only); an op erased during the sweep is skipped, ops inserted are seen by the next sweep.
    """
    rewrites = 0
    for _ in range(max_sweeps):
        rewrites_before = rewrites
        for op in list(_ops_to_visit(root, nested)):
            if op.parent is None and op is not root:
                continue  # erased by an earlier rewrite of this sweep
            for pattern in patterns:
                if not matches(op, pattern.roots):
                    continue
                rewriter = PatternRewriter(op) if op.parent is not None else None
                if rewriter is not None and pattern.match_and_rewrite(op, rewriter):
                    rewrites += 1
                    break
        if rewrites == rewrites_before:
            break
    return rewrites
