"""Op shapes shared by several dialects: one operand converted to one result of another type."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from qconvert.ir.core import Operation, Value
from qconvert.ir.types import Type

if TYPE_CHECKING:
    from qconvert.ir.parser import Parser
    from qconvert.ir.printer import Printer


class ConversionOp(Operation):
    """`name %x {attrs}? : T to U` (casts) or `: T -> U` (`separator = "->"`, shape queries)."""

    __slots__ = ()
    has_custom_syntax = True
    separator: ClassVar[str] = "to"

    def __init__(self, input: Value, result_type: Type, **kwargs: object) -> None:
        Operation.__init__(self, [input], [result_type], **kwargs)  # type: ignore[arg-type]

    @property
    def input(self) -> Value:
        return self.operands[0]

    def print_custom(self, printer: Printer) -> None:
        printer.print_conversion(self, self.separator)

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        input, attributes, result_type = parser.parse_conversion(cls.separator)
        return cls(input, result_type, attributes=attributes)
