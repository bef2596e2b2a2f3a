"""The IR's structure: values, operations, blocks, regions, the op registry and the rewriter.

NOTE: building an op checks nothing (100k ops must parse fast); `verify.verify(module)` walks once.
Use-lists are insertion-ordered dicts, so every walk, name and printout is deterministic. Only the
methods here mutate the graph (set_operand, replace_all_uses_with, erase, insert).
"""

from __future__ import annotations

import gc
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, ClassVar, TypeVar

from qconvert.errors import Location, VerifyError
from qconvert.ir.types import Type

if TYPE_CHECKING:
    from qconvert.ir.attributes import Attribute
    from qconvert.ir.lexer import SourceText
    from qconvert.ir.parser import Parser
    from qconvert.ir.printer import Printer


class Value:
    """An SSA value: a block argument or an op result. It knows its type and its uses."""

    __slots__ = ("type", "uses")

    def __init__(self, type_: Type) -> None:
        self.type = type_
        self.uses: dict[tuple[Operation, int], None] = {}

    def replace_all_uses_with(self, new: Value) -> None:
        for owner, index in list(self.uses):
            owner.set_operand(index, new)

    @property
    def has_uses(self) -> bool:
        return bool(self.uses)

    def owner_op(self) -> Operation | None:
        return None


class OpResult(Value):
    __slots__ = ("owner", "index")

    def __init__(self, type_: Type, owner: Operation, index: int) -> None:
        self.type = type_  # Value.__init__, inlined: every op makes one per result
        self.uses: dict[tuple[Operation, int], None] = {}
        self.owner = owner
        self.index = index

    def owner_op(self) -> Operation:
        return self.owner


class BlockArgument(Value):
    __slots__ = ("owner", "index")

    def __init__(self, type_: Type, owner: Block, index: int) -> None:
        Value.__init__(self, type_)
        self.owner = owner
        self.index = index


class Operation:
    """An op: operands, results, attributes, regions. Subclasses give the name, syntax and verifier.

    `attributes` hold every attribute, inherent or discardable; the generic form prints them in
    `{...}` sorted by name, as MLIR's DictionaryAttr does.
    """

    __slots__ = (
        "operands",
        "results",
        "attributes",
        "regions",
        "successors",
        "parent",
        "_location",
        "_source",
    )
    name: ClassVar[str]
    # Names of results for the printer's `%name` hints (OpAsmOpInterface); None for numbered results.
    result_name_hint: ClassVar[str | None] = None
    is_terminator: ClassVar[bool] = False
    is_pure: ClassVar[bool] = False  # no side effects: canonicalize erases it when its results are unused

    def __init__(
        self,
        operands: Sequence[Value] = (),
        result_types: Sequence[Type] = (),
        attributes: dict[str, Attribute] | None = None,
        regions: Sequence[Region] = (),
        successors: Sequence[Block] = (),
        location: Location | None = None,
    ) -> None:
        self.operands: list[Value] = list(operands)
        for index, operand in enumerate(self.operands):
            operand.uses[(self, index)] = None
        if len(result_types) == 1:  # most ops
            self.results = [OpResult(result_types[0], self, 0)]
        else:
            self.results = [OpResult(t, self, i) for i, t in enumerate(result_types)]
        self.attributes: dict[str, Attribute] = attributes if attributes is not None else {}
        if regions:
            self.regions: list[Region] = list(regions)
            for region in self.regions:
                region.parent = self
        else:  # most ops: a literal is cheaper than `list(())`
            self.regions = []
        self.successors: list[Block] = list(successors) if successors else []
        self.parent: Block | None = None
        self._location: Location | int | None = location
        # `_source` is set only by the parser, with an offset in `_location`: see `location`.

    @property
    def location(self) -> Location | None:
        """Where the op was written. The parser stores a character offset in `_location` and the buffer in
        `_source`; the line and column are counted at the first request (a diagnostic), not for each of
        100k parsed ops."""
        location = self._location
        if location.__class__ is int:
            source: SourceText = self._source
            location = self._location = source.location(location)  # type: ignore[arg-type]
        return location  # type: ignore[return-value]

    @location.setter
    def location(self, location: Location | None) -> None:
        self._location = location

    # Structure ---------------------------------------------------------------------------------
    @property
    def result(self) -> OpResult:
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    @property
    def operand_types(self) -> list[Type]:
        return [v.type for v in self.operands]

    @property
    def result_types(self) -> list[Type]:
        return [v.type for v in self.results]

    def set_operand(self, index: int, value: Value) -> None:
        old = self.operands[index]
        del old.uses[(self, index)]
        self.operands[index] = value
        value.uses[(self, index)] = None

    def drop_all_references(self) -> None:
        for index, operand in enumerate(self.operands):
            operand.uses.pop((self, index), None)
        self.operands = []
        for region in self.regions:
            for block in region.blocks:
                for op in block.ops:
                    op.drop_all_references()

    def erase(self) -> None:
        """Remove the op from its block; its results must have no uses left."""
        assert all(not r.uses for r in self.results), f"erasing {self.name} whose results are still used"
        self.drop_all_references()
        if self.parent is not None:
            self.parent.ops.remove(self)
            self.parent = None

    def walk(self) -> Iterator[Operation]:
        """Pre-order walk of this op and every op nested in its regions.

        Each block's ops are copied when the walk reaches the block, so the op being visited may be
        erased or replaced. One generator per op that has regions (not one per op, nor `yield from`
        chains as deep as the nesting).
        """
        yield self
        if not self.regions:
            return
        stack = [_nested_ops(self)]
        while stack:
            op = next(stack[-1], None)
            if op is None:
                stack.pop()
                continue
            yield op
            if op.regions:
                stack.append(_nested_ops(op))

    def parent_op(self) -> Operation | None:
        if self.parent is None or self.parent.parent is None:
            return None
        return self.parent.parent.parent

    # Diagnostics -------------------------------------------------------------------------------
    def error(self, message: str) -> VerifyError:
        """An error located at this op, worded as MLIR's `emitOpError`: `'quant.dcast' op <message>`."""
        return VerifyError(f"'{self.name}' op {message}", self.location)

    def emit_error(self, message: str) -> VerifyError:
        """An error located at this op without the op prefix, as MLIR's `emitError` words it."""
        return VerifyError(message, self.location)

    # Syntax and verification hooks (the registered ops override these) -------------------------
    has_custom_syntax: ClassVar[bool] = False

    def print_custom(self, printer: Printer) -> None:
        raise NotImplementedError

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        raise NotImplementedError

    def verify(self) -> None:
        """Check this op's invariants (not its regions' ops); raise `self.error(...)` on failure."""

    def result_names(self) -> Sequence[str | None]:
        """Preferred `%name` of each result (OpAsmOpInterface); None leaves a result numbered."""
        return [self.result_name_hint] * len(self.results)

    def block_argument_names(self, region_index: int) -> Sequence[str | None] | None:
        """Preferred names of a region's entry-block arguments (e.g. linalg's `%in`, `%out`)."""
        return None


def _nested_ops(op: Operation) -> Iterator[Operation]:
    """The ops directly inside `op`'s regions, each block's list copied when it is reached."""
    for region in op.regions:
        for block in region.blocks:
            yield from list(block.ops)


class GenericOp(Operation):
    """Any op we do not model (`"test.custom_op"`, `onnx.*`): name, attributes and regions kept losslessly."""

    __slots__ = ("name",)

    def __init__(self, name: str, *args: object, **kwargs: object) -> None:
        self.name = name  # type: ignore[misc]
        Operation.__init__(self, *args, **kwargs)  # type: ignore[arg-type]


class Block:
    """A list of ops with typed arguments."""

    __slots__ = ("arguments", "ops", "parent")

    def __init__(self, argument_types: Sequence[Type] = ()) -> None:
        self.arguments = [BlockArgument(t, self, i) for i, t in enumerate(argument_types)]
        self.ops: list[Operation] = []
        self.parent: Region | None = None

    def add_argument(self, type_: Type) -> BlockArgument:
        argument = BlockArgument(type_, self, len(self.arguments))
        self.arguments.append(argument)
        return argument

    def append(self, op: Operation) -> Operation:
        op.parent = self
        self.ops.append(op)
        return op

    def insert(self, index: int, op: Operation) -> Operation:
        op.parent = self
        self.ops.insert(index, op)
        return op

    def remove_ops(self, ops: Collection[Operation]) -> None:
        """Take `ops` (already without references) out of the block in one pass; `list.remove` per op would
        be quadratic for a large function."""
        for op in ops:
            op.parent = None
        self.ops[:] = [op for op in self.ops if op.parent is self]

    @property
    def terminator(self) -> Operation | None:
        return self.ops[-1] if self.ops else None


class Region:
    """A list of blocks owned by an op."""

    __slots__ = ("blocks", "parent")

    def __init__(self, blocks: Sequence[Block] = ()) -> None:
        self.blocks: list[Block] = []
        self.parent: Operation | None = None
        for block in blocks:
            self.append(block)

    def append(self, block: Block) -> Block:
        block.parent = self
        self.blocks.append(block)
        return block

    @property
    def entry(self) -> Block:
        return self.blocks[0]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a whole module is parsed or printed.

    Parsing 100k ops allocates millions of objects that all stay alive, and every collection those
    allocations trigger walks them again for nothing (about a quarter of the parse time). Reference
    counting still frees what dies at once; collections resume when the block ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# Registry -------------------------------------------------------------------------------------
OP_REGISTRY: dict[str, type[Operation]] = {}
REGISTERED_DIALECTS: set[str] = {"builtin"}
OpT = TypeVar("OpT", bound=type[Operation])


def register_op(cls: OpT) -> OpT:
    """Class decorator: make `cls` the op class for `cls.name`; a duplicate name is a bug."""
    assert cls.name not in OP_REGISTRY, f"op {cls.name} registered twice"
    OP_REGISTRY[cls.name] = cls
    REGISTERED_DIALECTS.add(cls.name.split(".", 1)[0])
    return cls


# Building and rewriting -----------------------------------------------------------------------
class Builder:
    """Inserts new ops at a point in a block (before `before`, or at the end when it is None)."""

    __slots__ = ("block", "index")

    def __init__(self, block: Block, index: int | None = None) -> None:
        self.block = block
        self.index = len(block.ops) if index is None else index

    @classmethod
    def before(cls, op: Operation) -> Builder:
        assert op.parent is not None
        return cls(op.parent, op.parent.ops.index(op))

    @classmethod
    def after(cls, op: Operation) -> Builder:
        assert op.parent is not None
        return cls(op.parent, op.parent.ops.index(op) + 1)

    @classmethod
    def at_start(cls, block: Block) -> Builder:
        return cls(block, 0)

    def insert(self, op: OpT2) -> OpT2:
        self.block.insert(self.index, op)
        self.index += 1
        return op


OpT2 = TypeVar("OpT2", bound=Operation)


def replace_op(op: Operation, new_values: Sequence[Value]) -> None:
    """Replace every use of `op`'s results with `new_values`, then erase `op`."""
    assert len(new_values) == len(op.results)
    for old, new in zip(op.results, new_values, strict=True):
        old.replace_all_uses_with(new)
    op.erase()
