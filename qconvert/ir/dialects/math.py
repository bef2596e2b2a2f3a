"""The `math` ops that passes emit: `math.roundeven` (round half to even, ONNX's rounding)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from qconvert.ir.core import Operation, Value, register_op
from qconvert.ir.types import FloatType, element_type_of

if TYPE_CHECKING:
    from qconvert.ir.parser import Parser
    from qconvert.ir.printer import Printer


@register_op
class RoundEvenOp(Operation):
    """`math.roundeven %x : f32`: round to the nearest integer, ties to even."""

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "math.roundeven"
    has_custom_syntax = True

    def __init__(self, input: Value, **kwargs: object) -> None:
        Operation.__init__(self, [input], [input.type], **kwargs)  # type: ignore[arg-type]

    def print_custom(self, printer: Printer) -> None:
        printer.write(f"{self.name} {printer.value_name(self.operands[0])}")
        printer.print_optional_attr_dict(self.attributes)
        printer.write(" : " + printer.type_text(self.result.type))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        reference = parser.parse_operand_reference()
        attributes = parser.parse_optional_attr_dict()
        parser.expect(":")
        return cls(parser.resolve_operand(reference, parser.parse_type()), attributes=attributes)

    def verify(self) -> None:
        if not isinstance(element_type_of(self.result.type), FloatType):
            raise self.error(f"operand #0 must be floating-point-like, but got '{self.operands[0].type}'")
