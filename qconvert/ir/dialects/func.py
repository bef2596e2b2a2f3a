"""The `func` dialect: `func.func`, `func.return`, `func.call`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from qconvert.errors import VerifyError
from qconvert.ir.attributes import ArrayAttr, Attribute, DictionaryAttr, StringAttr, SymbolRefAttr, TypeAttr
from qconvert.ir.core import Block, Operation, Region, Value, register_op
from qconvert.ir.types import FunctionType, Type

if TYPE_CHECKING:
    from qconvert.ir.parser import Parser
    from qconvert.ir.printer import Printer


@register_op
class FuncOp(Operation):
    """`func.func [private] @name(%arg0: T) -> R attributes {...} { ... }`; no body for a declaration."""

    __slots__ = ()
    name: ClassVar[str] = "func.func"
    has_custom_syntax = True
    default_dialect: ClassVar[str] = "func"

    @classmethod
    def create(cls, sym_name: str, function_type: FunctionType, *, visibility: str | None = None) -> FuncOp:
        attributes: dict[str, Attribute] = {
            "sym_name": StringAttr(sym_name),
            "function_type": TypeAttr(function_type),
        }
        if visibility is not None:
            attributes["sym_visibility"] = StringAttr(visibility)
        op = cls(attributes=attributes, regions=[Region()])
        return op

    @property
    def sym_name(self) -> str:
        return self.attributes["sym_name"].value  # type: ignore[attr-defined]

    @property
    def function_type(self) -> FunctionType:
        return self.attributes["function_type"].value  # type: ignore[attr-defined]

    @function_type.setter
    def function_type(self, value: FunctionType) -> None:
        self.attributes["function_type"] = TypeAttr(value)

    @property
    def is_declaration(self) -> bool:
        return not self.regions[0].blocks

    @property
    def body(self) -> Block:
        return self.regions[0].entry

    def print_custom(self, printer: Printer) -> None:
        printer.write("func.func ")
        visibility = self.attributes.get("sym_visibility")
        if isinstance(visibility, StringAttr):
            printer.write(f"{visibility.value} ")
        printer.write(f"@{self.sym_name}(")
        function_type = self.function_type
        arg_attrs = self.attributes.get("arg_attrs")
        for index, input_type in enumerate(function_type.inputs):
            if index:
                printer.write(", ")
            if not self.is_declaration:
                printer.write(f"{printer.value_name(self.body.arguments[index])}: ")
            printer.write(printer.type_text(input_type))
            if isinstance(arg_attrs, ArrayAttr):
                entry = arg_attrs.elements[index]
                if isinstance(entry, DictionaryAttr) and entry.entries:
                    printer.write(" " + printer.attribute_text(entry))
        printer.write(")")
        results = function_type.results
        result_attrs = self.attributes.get("res_attrs")
        has_result_attrs = isinstance(result_attrs, ArrayAttr) and any(
            isinstance(e, DictionaryAttr) and e.entries for e in result_attrs.elements
        )
        if results:
            printer.write(" -> ")
            if len(results) == 1 and not isinstance(results[0], FunctionType) and not has_result_attrs:
                printer.write(printer.type_text(results[0]))
            else:
                parts = []
                for index, result_type in enumerate(results):
                    text = printer.type_text(result_type)
                    if has_result_attrs:
                        entry = result_attrs.elements[index]  # type: ignore[union-attr]
                        if isinstance(entry, DictionaryAttr) and entry.entries:
                            text += " " + printer.attribute_text(entry)
                    parts.append(text)
                printer.write(f"({', '.join(parts)})")
        printer.print_optional_attr_dict(
            self.attributes,
            elided={"sym_name", "function_type", "sym_visibility", "arg_attrs", "res_attrs"},
            with_keyword=True,
        )
        if not self.is_declaration:
            printer.write(" ")
            printer.print_region(self.regions[0], print_entry_block_args=False)

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        visibility = parser.parse_optional_keyword(("private", "public", "nested"))
        sym_name = parser.parse_symbol_name()
        arguments, input_types, arg_attrs = parser.parse_function_arguments()
        result_types: list[Type] = []
        res_attrs: list[DictionaryAttr] = []
        if parser.try_consume("->"):
            result_types, res_attrs = parser.parse_function_result_list()
        attributes = parser.parse_optional_attr_dict_with_keyword()
        attributes["sym_name"] = StringAttr(sym_name)
        attributes["function_type"] = TypeAttr(FunctionType(tuple(input_types), tuple(result_types)))
        if visibility is not None:
            attributes["sym_visibility"] = StringAttr(visibility)
        if any(a.entries for a in arg_attrs):
            attributes["arg_attrs"] = ArrayAttr(tuple(arg_attrs))
        if any(a.entries for a in res_attrs):
            attributes["res_attrs"] = ArrayAttr(tuple(res_attrs))
        op = cls(attributes=attributes, regions=[Region()])
        if parser.peek("{"):
            if arguments is None:
                raise parser.error("expected SSA identifier")  # a body needs named arguments
            op.regions[0] = parser.parse_region(op, entry_arguments=arguments)
            op.regions[0].parent = op
        return op

    def verify(self) -> None:
        if self.is_declaration:
            visibility = self.attributes.get("sym_visibility")
            if not (isinstance(visibility, StringAttr) and visibility.value != "public"):
                raise self.error("symbol declaration cannot have public visibility")
            return
        entry_types = [a.type for a in self.body.arguments]
        if entry_types != list(self.function_type.inputs):
            raise self.error("type of entry block arguments must match the function signature")


@register_op
class ReturnOp(Operation):
    """`return %a, %b : T, U` (the terminator of a `func.func`)."""

    __slots__ = ()
    name: ClassVar[str] = "func.return"
    has_custom_syntax = True
    is_terminator = True

    def print_custom(self, printer: Printer) -> None:
        printer.print_values_with_types(self)

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        return cls(parser.parse_values_with_types())

    def verify(self) -> None:
        function = self.parent_op()
        if not isinstance(function, FuncOp):
            return
        results = function.function_type.results
        if len(results) != len(self.operands):
            raise self.error(
                f"has {len(self.operands)} operands, but enclosing function (@{function.sym_name}) "
                f"returns {len(results)}"
            )
        for index, (operand, expected) in enumerate(zip(self.operands, results, strict=True)):
            if operand.type != expected:
                # Upstream words this one with emitError, so it has no `'func.return' op` prefix.
                raise VerifyError(
                    f"type of return operand {index} ('{operand.type}') doesn't match function result type "
                    f"('{expected}') in function @{function.sym_name}",
                    self.location,
                )


@register_op
class CallOp(Operation):
    """`%r:2 = call @callee(%a, %b) : (T, U) -> (V, W)`."""

    __slots__ = ()
    name: ClassVar[str] = "func.call"
    has_custom_syntax = True

    @classmethod
    def create(cls, callee: str, operands: Sequence[Value], result_types: Sequence[Type]) -> CallOp:
        return cls(operands, result_types, {"callee": SymbolRefAttr(callee)})

    @property
    def callee(self) -> str:
        return self.attributes["callee"].root  # type: ignore[attr-defined]

    def print_custom(self, printer: Printer) -> None:
        printer.write(
            f"{printer.op_name_in_context(self)} @{self.callee}({printer.operand_list(self.operands)})"
        )
        printer.print_optional_attr_dict(self.attributes, elided={"callee"})
        function_type = FunctionType(tuple(self.operand_types), tuple(self.result_types))
        printer.write(" : " + printer.type_text(function_type))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        callee = parser.parse_symbol_name()
        parser.expect("(")
        references = parser.parse_operand_references()
        parser.expect(")")
        attributes = parser.parse_optional_attr_dict()
        parser.expect(":")
        function_type = parser.parse_function_type()
        operands = parser.resolve_operands(references, function_type.inputs)
        attributes["callee"] = SymbolRefAttr(callee)
        return cls(operands, function_type.results, attributes)

    def verify_symbol_uses(self) -> None:
        """Upstream's `CallOp::verifySymbolUses`: the callee exists and its signature matches the call.

        The verifier runs it after every op's own checks, as MLIR verifies symbol uses last.
        """
        callee = lookup_symbol(self, self.callee)
        if not isinstance(callee, FuncOp):
            raise self.error(f"'{self.callee}' does not reference a valid function")
        function_type = callee.function_type
        if len(function_type.inputs) != len(self.operands):
            raise self.error("incorrect number of operands for callee")
        for index, (expected, operand) in enumerate(zip(function_type.inputs, self.operands, strict=True)):
            if operand.type != expected:
                raise self.error(
                    f"operand type mismatch: expected operand type '{expected}', but provided "
                    f"'{operand.type}' for operand number {index}"
                )
        if len(function_type.results) != len(self.results):
            raise self.error("incorrect number of results for callee")
        for index, (expected, result) in enumerate(zip(function_type.results, self.results, strict=True)):
            if result.type != expected:
                # Upstream attaches two notes (`op result types: ...`, `function result types: ...`).
                raise self.error(f"result type mismatch at index {index}")


def lookup_symbol(op: Operation, name: str) -> Operation | None:
    """The op named `@name` in the symbol table nearest to `op` (its enclosing `builtin.module`)."""
    table = op.parent_op()
    while table is not None and table.name != "builtin.module":
        table = table.parent_op()
    if table is None or not table.regions or not table.regions[0].blocks:
        return None
    for candidate in table.regions[0].blocks[0].ops:
        symbol = candidate.attributes.get("sym_name")
        if isinstance(symbol, StringAttr) and symbol.value == name:
            return candidate
    return None
