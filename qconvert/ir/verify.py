"""Verification: one walk over a module, each op checking its own invariants (`Operation.verify`)."""

from __future__ import annotations

from qconvert.errors import VerifyError
from qconvert.ir.core import GenericOp, Operation
from qconvert.ir.dialects.func import CallOp, FuncOp


def verify(root: Operation) -> None:
    """Raise the first `VerifyError`, located at the failing op, in pre-order (as MLIR's verifier reports).

    Symbol uses (`func.call` against its callee) are checked after every op, as MLIR's symbol table does.
    """
    calls: list[CallOp] = []
    for op in root.walk():
        op.verify()
        if isinstance(op, FuncOp) and not op.is_declaration:
            check_terminators(op)
        elif isinstance(op, CallOp):
            calls.append(op)
    for call in calls:
        call.verify_symbol_uses()


def check_terminators(function: FuncOp) -> None:
    """Every block of a function ends in a terminator (an unregistered op may stand in for one)."""
    for block in function.regions[0].blocks:
        last = block.terminator
        if last is None:
            raise VerifyError("empty block: expect at least a terminator", function.location)
        if not last.is_terminator and not isinstance(last, GenericOp):
            raise VerifyError(f'block with no terminator, has "{last.name}"', last.location)
