"""The `tensor` ops that `lower-quant-ops` emits: splat, dim, empty, from_elements, reshape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from qconvert.ir.core import Operation, Value, register_op
from qconvert.ir.types import DYNAMIC, INDEX, RankedTensorType, Type

if TYPE_CHECKING:
    from qconvert.ir.parser import Parser
    from qconvert.ir.printer import Printer


@register_op
class SplatOp(Operation):
    """`tensor.splat %v[%d0] : tensor<?x4xf32>`: one sized operand per dynamic dimension."""

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "tensor.splat"
    has_custom_syntax = True
    result_name_hint = "splat"

    def __init__(self, input: Value, dynamic_sizes: Sequence[Value], result_type: Type) -> None:
        Operation.__init__(self, [input, *dynamic_sizes], [result_type])

    def print_custom(self, printer: Printer) -> None:
        printer.write(f"tensor.splat {printer.value_name(self.operands[0])}")
        if len(self.operands) > 1:
            printer.write(f"[{printer.operand_list(self.operands[1:])}]")
        printer.print_optional_attr_dict(self.attributes)
        printer.write(" : " + printer.type_text(self.result.type))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        input_reference = parser.parse_operand_reference()
        sizes = []
        if parser.try_consume("["):
            sizes = parser.parse_operand_references()
            parser.expect("]")
        parser.parse_optional_attr_dict()
        parser.expect(":")
        result_type = parser.parse_type()
        if not isinstance(result_type, RankedTensorType):
            raise parser.error("expected ranked tensor type")
        return cls(
            parser.resolve_operand(input_reference, result_type.element_type),
            parser.resolve_operands(sizes, [INDEX] * len(sizes)),
            result_type,
        )

    def verify(self) -> None:
        result_type = self.result.type
        assert isinstance(result_type, RankedTensorType)
        if result_type.shape.count(DYNAMIC) != len(self.operands) - 1:
            raise self.error(
                "incorrect number of dynamic sizes, has "
                f"{len(self.operands) - 1}, expected {result_type.shape.count(DYNAMIC)}"
            )


@register_op
class DimOp(Operation):
    """`tensor.dim %t, %index : tensor<?x4xf32>`: the size of one dimension, as an `index`."""

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "tensor.dim"
    has_custom_syntax = True
    result_name_hint = "dim"

    def __init__(self, source: Value, index: Value) -> None:
        Operation.__init__(self, [source, index], [INDEX])

    def print_custom(self, printer: Printer) -> None:
        printer.write(f"tensor.dim {printer.operand_list(self.operands)}")
        printer.print_optional_attr_dict(self.attributes)
        printer.write(" : " + printer.type_text(self.operands[0].type))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        source = parser.parse_operand_reference()
        parser.expect(",")
        index = parser.parse_operand_reference()
        parser.parse_optional_attr_dict()
        parser.expect(":")
        source_type = parser.parse_type()
        return cls(parser.resolve_operand(source, source_type), parser.resolve_operand(index, INDEX))


@register_op
class EmptyOp(Operation):
    """`tensor.empty(%d0, %d1) : tensor<?x?xi8>`: an uninitialised tensor (a `linalg.generic` init)."""

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "tensor.empty"
    has_custom_syntax = True

    def __init__(self, dynamic_sizes: Sequence[Value], result_type: Type) -> None:
        Operation.__init__(self, list(dynamic_sizes), [result_type])

    def print_custom(self, printer: Printer) -> None:
        printer.write(f"tensor.empty({printer.operand_list(self.operands)})")
        printer.print_optional_attr_dict(self.attributes)
        printer.write(" : " + printer.type_text(self.result.type))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        parser.expect("(")
        sizes = parser.parse_operand_references()
        parser.expect(")")
        parser.parse_optional_attr_dict()
        parser.expect(":")
        result_type = parser.parse_type()
        return cls(parser.resolve_operands(sizes, [INDEX] * len(sizes)), result_type)

    def verify(self) -> None:
        result_type = self.result.type
        if not isinstance(result_type, RankedTensorType):
            raise self.error(f"result #0 must be ranked tensor of any type values, but got '{result_type}'")
        if result_type.shape.count(DYNAMIC) != len(self.operands):
            raise self.error(
                "incorrect number of dynamic sizes, has "
                f"{len(self.operands)}, expected {result_type.shape.count(DYNAMIC)}"
            )


@register_op
class FromElementsOp(Operation):
    """`tensor.from_elements %a, %b : tensor<2xindex>`."""

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "tensor.from_elements"
    has_custom_syntax = True
    result_name_hint = "from_elements"

    def __init__(self, elements: Sequence[Value], result_type: Type) -> None:
        Operation.__init__(self, list(elements), [result_type])

    def print_custom(self, printer: Printer) -> None:
        printer.write(f"tensor.from_elements {printer.operand_list(self.operands)}")
        printer.print_optional_attr_dict(self.attributes)
        printer.write(" : " + printer.type_text(self.result.type))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        elements = parser.parse_operand_references()
        parser.parse_optional_attr_dict()
        parser.expect(":")
        result_type = parser.parse_type()
        if not isinstance(result_type, RankedTensorType):
            raise parser.error("expected ranked tensor type")
        return cls(parser.resolve_operands(elements, [result_type.element_type] * len(elements)), result_type)


@register_op
class ReshapeOp(Operation):
    """`tensor.reshape %src(%shape) : (tensor<*xf32>, tensor<1xindex>) -> tensor<?xf32>`."""

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "tensor.reshape"
    has_custom_syntax = True
    result_name_hint = "reshape"

    def __init__(self, source: Value, shape: Value, result_type: Type) -> None:
        Operation.__init__(self, [source, shape], [result_type])

    def print_custom(self, printer: Printer) -> None:
        source, shape = self.operands
        printer.write(f"tensor.reshape {printer.value_name(source)}({printer.value_name(shape)})")
        printer.print_optional_attr_dict(self.attributes)
        printer.write(
            f" : ({printer.type_text(source.type)}, {printer.type_text(shape.type)}) -> "
            f"{printer.type_text(self.result.type)}"
        )

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        source = parser.parse_operand_reference()
        parser.expect("(")
        shape = parser.parse_operand_reference()
        parser.expect(")")
        parser.parse_optional_attr_dict()
        parser.expect(":")
        function_type = parser.parse_function_type()
        if len(function_type.inputs) != 2 or len(function_type.results) != 1:
            raise parser.error("expected (source, shape) -> result type")
        return cls(
            parser.resolve_operand(source, function_type.inputs[0]),
            parser.resolve_operand(shape, function_type.inputs[1]),
            function_type.results[0],
        )
