"""The `arith` ops that passes emit: constants, float/integer binary ops, min/max, and conversions."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from qconvert.ir.attributes import Attribute, BoolAttr, DenseElementsAttr, FloatAttr, IntegerAttr
from qconvert.ir.core import Operation, Value, register_op
from qconvert.ir.dialects.common import ConversionOp
from qconvert.ir.types import FloatType, IndexType, IntegerType, Type, element_type_of

if TYPE_CHECKING:
    from qconvert.ir.parser import Parser
    from qconvert.ir.printer import Printer


@register_op
class ConstantOp(Operation):
    """`arith.constant 10 : i8`, `arith.constant dense<[1.0, 2.0]> : tensor<2xf32>`."""

    __slots__ = ()
    name: ClassVar[str] = "arith.constant"
    has_custom_syntax = True
    is_pure = True

    @classmethod
    def create(cls, value: Attribute) -> ConstantOp:
        return cls([], [attribute_type(value)], {"value": value})

    @property
    def value(self) -> Attribute:
        return self.attributes["value"]

    def print_custom(self, printer: Printer) -> None:
        printer.write("arith.constant")
        printer.print_optional_attr_dict(self.attributes, elided={"value"})
        printer.write(" " + printer.attribute_text(self.value))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        attributes = parser.parse_optional_attr_dict()
        position = parser.token.start
        value = parser.parse_attribute()
        attributes["value"] = value
        try:
            result_type = attribute_type(value)
        except ValueError:  # `arith.constant f16`: upstream's TypedAttr constraint, as it words it
            raise parser.error(
                "custom op 'arith.constant' invalid kind of attribute specified", position
            ) from None
        return cls([], [result_type], attributes)

    def result_names(self) -> list[str | None]:
        value = self.value
        if isinstance(value, BoolAttr):
            return ["true" if value.value else "false"]
        if isinstance(value, IntegerAttr):
            if isinstance(value.type, IndexType):
                return [f"c{value.value}"]
            return [f"c{value.value}_{value.type}"]
        return ["cst"]

    def verify(self) -> None:
        if attribute_type(self.value) != self.result.type:
            raise self.error("value type must match result type")


def attribute_type(value: Attribute) -> Type:
    """The type of a typed attribute (the result type of an `arith.constant` holding it)."""
    if isinstance(value, BoolAttr):
        return IntegerType(1)
    if isinstance(value, IntegerAttr | FloatAttr | DenseElementsAttr):
        return value.type
    type_ = getattr(value, "type", None)
    if isinstance(type_, Type):
        return type_
    raise ValueError(f"attribute {value} has no type")


class BinaryOp(Operation):
    """`arith.addf %lhs, %rhs : T`: two operands and a result of one type."""

    __slots__ = ()
    has_custom_syntax = True
    is_pure = True
    element_kind: ClassVar[type]

    def __init__(self, lhs: Value, rhs: Value, **kwargs: object) -> None:
        Operation.__init__(self, [lhs, rhs], [lhs.type], **kwargs)  # type: ignore[arg-type]

    def print_custom(self, printer: Printer) -> None:
        printer.write(f"{self.name} {printer.operand_list(self.operands)}")
        printer.print_optional_attr_dict(self.attributes)
        printer.write(" : " + printer.type_text(self.result.type))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        lhs = parser.parse_operand_reference()
        parser.expect(",")
        rhs = parser.parse_operand_reference()
        attributes = parser.parse_optional_attr_dict()
        parser.expect(":")
        type_ = parser.parse_type()
        return cls(
            parser.resolve_operand(lhs, type_), parser.resolve_operand(rhs, type_), attributes=attributes
        )

    def verify(self) -> None:
        if not (self.operands[0].type == self.operands[1].type == self.result.type):
            raise self.error("requires the same type for all operands and results")
        if not isinstance(element_type_of(self.result.type), self.element_kind):
            kind = "floating-point" if self.element_kind is FloatType else "signless-integer-like"
            raise self.error(f"operand #0 must be {kind}, but got '{self.operands[0].type}'")


class CastOp(ConversionOp):
    """`arith.sitofp %x : i8 to f32`: one operand, one result of another element type."""

    __slots__ = ()
    has_custom_syntax = True
    is_pure = True
    source_kind: ClassVar[type]
    result_kind: ClassVar[type]

    def verify(self) -> None:
        source, result = element_type_of(self.operands[0].type), element_type_of(self.result.type)
        if not isinstance(source, self.source_kind) or not isinstance(result, self.result_kind):
            raise self.error(
                f"operand type '{self.operands[0].type}' and result type '{self.result.type}' "
                "are cast incompatible"
            )


@register_op
class NegFOp(Operation):
    """`arith.negf %x : T`: float negation."""

    __slots__ = ()
    name: ClassVar[str] = "arith.negf"
    has_custom_syntax = True
    is_pure = True

    def print_custom(self, printer: Printer) -> None:
        printer.write(f"{self.name} {printer.operand_list(self.operands)}")
        printer.print_optional_attr_dict(self.attributes)
        printer.write(" : " + printer.type_text(self.result.type))

    @classmethod
    def parse_custom(cls, parser: Parser, num_results: int) -> Operation:
        operand = parser.parse_operand_reference()
        attributes = parser.parse_optional_attr_dict()
        parser.expect(":")
        type_ = parser.parse_type()
        return cls([parser.resolve_operand(operand, type_)], [type_], attributes)

    def verify(self) -> None:
        if self.operands[0].type != self.result.type:
            raise self.error("requires the same type for all operands and results")
        if not isinstance(element_type_of(self.result.type), FloatType):
            raise self.error(f"operand #0 must be floating-point-like, but got '{self.operands[0].type}'")


def _binary(op_name: str, kind: type, doc: str) -> type[BinaryOp]:
    cls = type(
        op_name.split(".")[1].title().replace("_", "") + "Op",
        (BinaryOp,),
        {"__slots__": (), "name": op_name, "element_kind": kind, "__doc__": doc},
    )
    return register_op(cls)


def _cast(op_name: str, source: type, result: type, doc: str) -> type[CastOp]:
    cls = type(
        op_name.split(".")[1].title() + "Op",
        (CastOp,),
        {"__slots__": (), "name": op_name, "source_kind": source, "result_kind": result, "__doc__": doc},
    )
    return register_op(cls)


AddFOp = _binary("arith.addf", FloatType, "Float addition.")
SubFOp = _binary("arith.subf", FloatType, "Float subtraction.")
MulFOp = _binary("arith.mulf", FloatType, "Float multiplication.")
DivFOp = _binary("arith.divf", FloatType, "Float division.")
MaximumFOp = _binary("arith.maximumf", FloatType, "Float maximum (NaN-propagating).")
MinimumFOp = _binary("arith.minimumf", FloatType, "Float minimum (NaN-propagating).")
MaxNumFOp = _binary("arith.maxnumf", FloatType, "Float maximum returning the non-NaN operand (IEEE maxNum).")
MinNumFOp = _binary("arith.minnumf", FloatType, "Float minimum returning the non-NaN operand (IEEE minNum).")
AddIOp = _binary("arith.addi", IntegerType, "Integer addition.")
SubIOp = _binary("arith.subi", IntegerType, "Integer subtraction.")
MulIOp = _binary("arith.muli", IntegerType, "Integer multiplication.")
MaxSIOp = _binary("arith.maxsi", IntegerType, "Signed integer maximum.")
MinSIOp = _binary("arith.minsi", IntegerType, "Signed integer minimum.")
MaxUIOp = _binary("arith.maxui", IntegerType, "Unsigned integer maximum.")
MinUIOp = _binary("arith.minui", IntegerType, "Unsigned integer minimum.")

SIToFPOp = _cast("arith.sitofp", IntegerType, FloatType, "Signed integer to float.")
UIToFPOp = _cast("arith.uitofp", IntegerType, FloatType, "Unsigned integer to float.")
FPToSIOp = _cast("arith.fptosi", FloatType, IntegerType, "Float to signed integer, truncating toward zero.")
FPToUIOp = _cast("arith.fptoui", FloatType, IntegerType, "Float to unsigned integer, truncating toward zero.")
ExtSIOp = _cast("arith.extsi", IntegerType, IntegerType, "Sign extension.")
ExtUIOp = _cast("arith.extui", IntegerType, IntegerType, "Zero extension.")
TruncIOp = _cast("arith.trunci", IntegerType, IntegerType, "Integer truncation.")
ExtFOp = _cast("arith.extf", FloatType, FloatType, "Float extension.")
TruncFOp = _cast("arith.truncf", FloatType, FloatType, "Float truncation.")
