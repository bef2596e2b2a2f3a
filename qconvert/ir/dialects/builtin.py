"""`builtin.module`: the top-level container."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from qconvert.ir.attributes import Attribute, StringAttr
from qconvert.ir.core import Block, Operation, Region, register_op

if TYPE_CHECKING:
    from qconvert.ir.parser import Parser
    from qconvert.ir.printer import Printer


@register_op
class ModuleOp(Operation):
    """`module @name attributes {...} { ... }`: one region, one block, no terminator."""

    __slots__ = ()
    name: ClassVar[str] = "builtin.module"
    has_custom_syntax = True

    @classmethod
    def create(cls, sym_name: str | None = None) -> ModuleOp:
        attributes: dict[str, Attribute] = {"sym_name": StringAttr(sym_name)} if sym_name is not None else {}
        return cls(attributes=attributes, regions=[Region([Block()])])

    @property
    def body(self) -> Block:
        return self.regions[0].entry

    @property
    def sym_name(self) -> str | None:
        attribute = self.attributes.get("sym_name")
        return attribute.value if isinstance(attribute, StringAttr) else None

    def print_custom(self, printer: Printer) -> None:
        printer.write("module")
        if self.sym_name is not None:
            printer.write(f" @{self.sym_name}")
        printer.print_optional_attr_dict(self.attributes, elided={"sym_name"}, with_keyword=True)
        printer.write(" ")
        printer.print_region(self.regions[0], print_entry_block_args=False)

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        sym_name = parser.parse_optional_symbol_name()
        attributes = parser.parse_optional_attr_dict_with_keyword()
        if sym_name is not None:
            attributes["sym_name"] = StringAttr(sym_name)
        op = cls(attributes=attributes)
        op.regions.append(parser.parse_region(op, entry_arguments=()))
        op.regions[0].parent = op
        if not op.regions[0].blocks:
            op.regions[0].append(Block())
        return op

    def verify(self) -> None:
        if len(self.regions) != 1 or len(self.regions[0].blocks) != 1:
            raise self.error("expects one region with one block")
