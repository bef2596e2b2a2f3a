"""The `shape` ops that `lower-quant-ops` emits for unranked tensors: shape_of, num_elements, split_at."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from qconvert.ir.core import Operation, Value, register_op
from qconvert.ir.types import Type

if TYPE_CHECKING:
    from qconvert.ir.parser import Parser
    from qconvert.ir.printer import Printer


class UnaryShapeOp(Operation):
    """`shape.<op> %x : T -> R`."""

    __slots__ = ()
    is_pure = True
    has_custom_syntax = True

    def __init__(self, input: Value, result_type: Type) -> None:
        Operation.__init__(self, [input], [result_type])

    def print_custom(self, printer: Printer) -> None:
        printer.print_conversion(self, "->")

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        input, _, result_type = parser.parse_conversion("->")
        return cls(input, result_type)


@register_op
class ShapeOfOp(UnaryShapeOp):
    """`shape.shape_of %t : tensor<*xf32> -> tensor<?xindex>`."""

    __slots__ = ()
    name: ClassVar[str] = "shape.shape_of"


@register_op
class NumElementsOp(UnaryShapeOp):
    """`shape.num_elements %s : tensor<?xindex> -> index`."""

    __slots__ = ()
    name: ClassVar[str] = "shape.num_elements"


@register_op
class SplitAtOp(Operation):
    """`"shape.split_at"(%shape, %index)`: the shape before and from `index`; printed in generic form."""

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "shape.split_at"

    def result_names(self) -> list[str | None]:
        return ["head", "tail"]
