"""`linalg.generic` and `linalg.yield`, as `lower-quant-ops` emits them for per-axis and sub-channel casts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from qconvert.ir.attributes import AffineMapAttr, ArrayAttr, DenseArrayAttr, StringAttr
from qconvert.ir.core import Operation, OpResult, Region, Value, register_op
from qconvert.ir.types import I32, Type

if TYPE_CHECKING:
    from qconvert.ir.parser import Parser
    from qconvert.ir.printer import Printer


@register_op
class GenericOp(Operation):
    """`linalg.generic {indexing_maps = [...], iterator_types = [...]} ins(...) outs(...) {^bb0(...): ...}`.

    Iterator types are kept as StringAttr ("parallel"), the way the custom form spells them.
    """

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "linalg.generic"
    has_custom_syntax = True

    @classmethod
    def create(
        cls,
        inputs: Sequence[Value],
        outputs: Sequence[Value],
        result_types: Sequence[Type],
        indexing_maps: Sequence[AffineMapAttr],
        iterator_types: Sequence[str],
        body: Region,
    ) -> GenericOp:
        attributes = {
            "indexing_maps": ArrayAttr(tuple(indexing_maps)),
            "iterator_types": ArrayAttr(tuple(StringAttr(t) for t in iterator_types)),
            "operandSegmentSizes": DenseArrayAttr(I32, (len(inputs), len(outputs))),
        }
        return cls([*inputs, *outputs], result_types, attributes, [body])

    @property
    def num_inputs(self) -> int:
        return self.attributes["operandSegmentSizes"].values[0]  # type: ignore[attr-defined]

    @property
    def inputs(self) -> list[Value]:
        return self.operands[: self.num_inputs]

    @property
    def outputs(self) -> list[Value]:
        return self.operands[self.num_inputs :]

    def print_custom(self, printer: Printer) -> None:
        printer.write("linalg.generic ")
        shown = {
            k: v
            for k, v in self.attributes.items()
            if k in ("indexing_maps", "iterator_types", "doc", "library_call")
        }
        printer.write(printer.attribute_dict_text(shown))
        for keyword, values in (("ins", self.inputs), ("outs", self.outputs)):
            if values:
                printer.write(
                    f" {keyword}({printer.operand_list(values)} : "
                    f"{printer.type_list([v.type for v in values])})"
                )
        others = {k: v for k, v in self.attributes.items() if k not in shown and k != "operandSegmentSizes"}
        if others:
            printer.write(" attrs = " + printer.attribute_dict_text(others))
        printer.write(" ")
        printer.print_region(self.regions[0], print_entry_block_args=True)
        if self.results:
            printer.write(" -> " + printer.type_list(self.result_types))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        attributes = parser.parse_attr_dict()
        segments = []
        operands: list[Value] = []
        for keyword in ("ins", "outs"):
            if parser.parse_optional_keyword((keyword,)):
                parser.expect("(")
                references = parser.parse_operand_references()
                parser.expect(":")
                types = parser.parse_type_list_no_parens()
                parser.expect(")")
                operands += parser.resolve_operands(references, types)
                segments.append(len(references))
            else:
                segments.append(0)
        if parser.parse_optional_keyword(("attrs",)):
            parser.expect("=")
            attributes.update(parser.parse_attr_dict())
        attributes["operandSegmentSizes"] = DenseArrayAttr(I32, tuple(segments))
        op = cls(operands, [], attributes)
        region = parser.parse_region(op, entry_arguments=None)
        op.regions.append(region)
        region.parent = op
        result_types: list[Type] = []
        if parser.try_consume("->"):
            result_types = parser.parse_type_list_no_parens()
        op.results = [OpResult(t, op, i) for i, t in enumerate(result_types)]
        return op

    def block_argument_names(self, region_index: int) -> Sequence[str | None]:
        return ["in"] * self.num_inputs + ["out"] * (len(self.operands) - self.num_inputs)


@register_op
class YieldOp(Operation):
    """`linalg.yield %v : f32`."""

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "linalg.yield"
    has_custom_syntax = True
    is_terminator = True

    def print_custom(self, printer: Printer) -> None:
        printer.print_values_with_types(self)

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        return cls(parser.parse_values_with_types())
