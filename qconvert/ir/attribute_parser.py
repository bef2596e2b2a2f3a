"""Attribute syntax: builtin attributes, attribute dictionaries, aliases, and opaque dialect attributes.

    attribute       ::= `true` | `false` | `unit` | number-attr | string-literal (`:` type)?
                      | `[` (attribute (`,` attribute)*)? `]` | attr-dict | symbol-ref
                      | dense-attr | dense-resource-attr | array-attr | affine-map-attr
                      | `#` alias-name | `#` dialect (`.` name)? body? (`:` type)? | type
    number-attr     ::= `-`? (integer | float-literal) (`:` type)?
    symbol-ref      ::= `@` name (`::` `@` name)*
    dense-attr      ::= `dense` `<` (dense-literal | hex-string)? `>` `:` shaped-type
    dense-literal   ::= `[` (dense-literal (`,` dense-literal)*)? `]` | `true` | `false` | `-`? number
    dense-resource-attr ::= `dense_resource` `<` bare-id `>` `:` type
    array-attr      ::= `array` `<` type (`:` number (`,` number)*)? `>`
    affine-map-attr ::= `affine_map` `<` `(` dims `)` (`[` symbols `]`)? `->` `(` results `)` `>`
    attr-dict       ::= `{` (attr-entry (`,` attr-entry)*)? `}`
    attr-entry      ::= (bare-id | string-literal) (`=` attribute)?

Integer literals follow MLIR's APInt rules (`fit_integer`); messages are upstream's (mlir/lib/AsmParser).
"""

from __future__ import annotations

import math
import re

import numpy as np

from qconvert.errors import ParseError, QConvertError
from qconvert.ir.attributes import (
    AffineMapAttr,
    ArrayAttr,
    Attribute,
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    DenseResourceAttr,
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    LazyElements,
    OpaqueAttr,
    StringAttr,
    SymbolRefAttr,
    TypeAttr,
    UnitAttr,
)
from qconvert.ir.float_format import bits_to_float, round_to_float_type
from qconvert.ir.lexer import Token, integer_literal_value, split_top_level, unescape_string
from qconvert.ir.type_parser import TypeParser, numpy_dtype, shareable
from qconvert.ir.types import IndexType, IntegerType, RankedTensorType, Signedness, Type, VectorType

INTEGER_LITERAL = re.compile(r"0x[0-9a-fA-F]+|[0-9]+")
# The largest `dense<...>` array parsed into memory (a 1 GiB splat); larger constants go in dense_resource
# blobs, which are read lazily.
MAX_ELEMENTS_BYTES = 1 << 30


class AttributeParser(TypeParser):
    """The attribute productions, over a `TypeParser`; `Parser` adds ops, regions and values."""

    def __init__(self, text: str, filename: str = "-", *, line_offset: int = 0) -> None:
        super().__init__(text, filename, line_offset=line_offset)
        self.attribute_aliases: dict[str, Attribute] = {}
        # `dense<...>` attributes by their body's source text and their type (see `_parse_dense`).
        self._attribute_cache: dict[tuple[str, Type], Attribute] = {}

    def parse_attribute(self, type_hint: Type | None = None) -> Attribute:
        token = self.token
        if token.kind == "punct" and token.text in "[{":  # nested attributes: bounded depth
            self.enter_nesting()
            try:
                return self._parse_attribute(token)
            finally:
                self.exit_nesting()
        return self._parse_attribute(token)

    def _parse_attribute(self, token: Token) -> Attribute:
        kind, text = token.kind, token.text
        if kind == "bare":
            if text in ("true", "false"):
                self.advance()
                return BoolAttr(text == "true")
            if text == "unit":
                self.advance()
                return UnitAttr()
            if text == "dense":
                return self._parse_dense()
            if text == "dense_resource":
                return self._parse_dense_resource()
            if text == "array":
                return self._parse_dense_array()
            if text == "affine_map":
                return self._parse_affine_map()
            return TypeAttr(self.parse_type())
        if kind in ("integer", "float") or (text == "-" and kind == "punct"):
            return self._parse_number_attribute()
        if kind == "string":
            value = self.parse_string()
            if self.try_consume(":"):
                self.parse_type()
            return StringAttr(value)
        if text == "[" and kind == "punct":
            self.advance()
            elements: list[Attribute] = []
            if not self.try_consume("]"):
                elements.append(self.parse_attribute())
                while self.try_consume(","):
                    elements.append(self.parse_attribute())
                self.expect("]")
            return ArrayAttr(tuple(elements))
        if text == "{" and kind == "punct":
            return DictionaryAttr(tuple(self.parse_attr_dict().items()))
        if kind == "at":
            return self._parse_symbol_ref()
        if kind == "hash":
            return self._parse_extended_attribute()
        if kind == "bang" or text == "(":
            return TypeAttr(self.parse_type())
        raise self.error("expected attribute value")

    def _parse_number_attribute(self) -> Attribute:
        negative = self.try_consume("-")
        token = self.advance()
        if token.kind not in ("integer", "float"):
            raise self.error("expected attribute value", token.start)
        type_: Type | None = self.parse_type() if self.try_consume(":") else None
        from qconvert.ir.types import FloatType

        if token.kind == "float" or isinstance(type_, FloatType):
            float_type = type_ if isinstance(type_, FloatType) else FloatType("f64")
            if token.kind == "integer" and token.text.startswith("0x"):
                value = self.hex_float(token.text, float_type.name, token.start)
            else:
                value = round_to_float_type(float(token.text), float_type.name)
            return FloatAttr(-value if negative else value, float_type)
        type_ = type_ if type_ is not None else IntegerType(64)
        magnitude = integer_literal_value(token.text)
        if magnitude is None:
            raise self.error("integer value too large", token.start)
        value = self.fit_integer(-magnitude if negative else magnitude, type_, token.start)
        if isinstance(type_, IntegerType) and type_.width == 1 and type_.is_signless:
            return BoolAttr(bool(value))
        return IntegerAttr(value, type_)

    def hex_float(self, text: str, float_type: str, position: int) -> float:
        """The float whose bits a `0x...` literal gives, or MLIR's error when they do not fit the type."""
        try:
            return bits_to_float(int(text, 16), float_type)
        except ValueError:
            raise self.error("hexadecimal float constant out of range for type", position) from None

    def fit_integer(self, value: int, type_: Type, position: int, what: str = "attribute") -> int:
        """The value an integer literal stores in `type_`: signless literals may use the unsigned range
        and read back signed (`32768 : i16` is -32768), as MLIR's APInt does; out of range is an error."""
        if not isinstance(type_, IntegerType | IndexType):
            return value
        width = type_.width if isinstance(type_, IntegerType) else 64
        if isinstance(type_, IntegerType) and type_.is_unsigned:
            if value < 0:
                raise self.error("negative integer literal not valid for unsigned integer type", position)
            low, high = 0, (1 << width) - 1
        elif isinstance(type_, IntegerType) and type_.signedness is Signedness.SIGNED:
            low, high = -(1 << (width - 1)), (1 << (width - 1)) - 1
        else:
            low, high = -(1 << (width - 1)), (1 << width) - 1
        if not low <= value <= high:
            raise self.error(f"integer constant out of range for {what}", position)
        if not (isinstance(type_, IntegerType) and type_.is_unsigned) and value >= 1 << (width - 1):
            value -= 1 << width
        return value

    def _parse_symbol_ref(self) -> SymbolRefAttr:
        parts = [self.parse_symbol_name()]
        while self.token.text == ":" and self.text.startswith("::", self.token.start):
            self.reset(self.token.start + 2)
            parts.append(self.parse_symbol_name())
        return SymbolRefAttr(parts[0], tuple(parts[1:]))

    def parse_symbol_name(self) -> str:
        if self.token.kind != "at":
            raise self.error("expected valid '@'-identifier for symbol name")
        text = self.advance().text[1:]
        return unescape_string(text) if text.startswith('"') else text

    def parse_optional_symbol_name(self) -> str | None:
        return self.parse_symbol_name() if self.token.kind == "at" else None

    def _parse_extended_attribute(self) -> Attribute:
        token = self.advance()
        identifier = token.text[1:]
        if not self.text.startswith("<", token.end) and "." not in identifier:
            if identifier not in self.attribute_aliases:
                raise self.error(f"undefined symbol alias id '{identifier}'", token.start)
            return self.attribute_aliases[identifier]
        end = self._scan_dialect_body(token.end) if self.text.startswith("<", token.end) else token.end
        self.reset(end)
        text = self.text[token.start : end]
        if self.try_consume(":"):
            text += " : " + str(self.parse_type())
        return OpaqueAttr(text)

    def _parse_affine_map(self) -> AffineMapAttr:
        start = self.advance().end
        end = self._scan_dialect_body(start)
        body = self.text[start + 1 : end - 1]
        self.reset(end)
        match = re.fullmatch(r"\s*\(([^)]*)\)\s*(?:\[([^\]]*)\])?\s*->\s*\((.*)\)\s*", body, re.S)
        if match is None:
            raise self.error("expected affine map", start)
        dims = [d.strip() for d in match.group(1).split(",") if d.strip()]
        symbols = [s.strip() for s in (match.group(2) or "").split(",") if s.strip()]
        renames = {name: f"d{i}" for i, name in enumerate(dims)} | {
            name: f"s{i}" for i, name in enumerate(symbols)
        }
        results = [
            re.sub(
                r"[a-zA-Z_][a-zA-Z0-9_]*", lambda m: renames.get(m.group(), m.group()), " ".join(r.split())
            )
            for r in split_top_level(match.group(3))
        ]
        return AffineMapAttr(len(dims), len(symbols), tuple(r for r in results if r))

    def _parse_dense_array(self) -> DenseArrayAttr:
        self.advance()
        self.expect("<")
        element_type = self.parse_type()
        values: list[int | float] = []
        if self.try_consume(":"):
            while True:
                if self.token.text in ("true", "false"):
                    values.append(int(self.advance().text == "true"))
                elif isinstance(element_type, IntegerType):
                    values.append(self.parse_integer())
                else:
                    values.append(self.parse_float())
                if not self.try_consume(","):
                    break
        self.expect(">")
        return DenseArrayAttr(element_type, tuple(values))

    def _parse_dense(self) -> DenseElementsAttr:
        """dense-attr, looked up by its source text first (models repeat a few constants many times)."""
        keyword = self.token
        self.advance()
        body_end = self._angle_bracket_end(self.token.start) if self.token.text == "<" else None
        if body_end is None:
            return self._parse_dense_body()[0]
        key_text = self.text[keyword.start : body_end]
        after_keyword = self.token
        self.reset(body_end)
        try:
            type_ = self.parse_type() if self.try_consume(":") else None
        except ParseError:  # a malformed type: the full parse reports it, or an earlier error
            type_ = None
        if type_ is not None:
            cached = self._attribute_cache.get((key_text, type_))
            if cached is not None:
                return cached  # type: ignore[return-value]
        self.token = after_keyword
        attribute, close_end = self._parse_dense_body()
        if type_ is not None and close_end == body_end and shareable(attribute):
            self._attribute_cache[(key_text, type_)] = attribute
        return attribute

    def _parse_dense_body(self) -> tuple[DenseElementsAttr, int]:
        """`<` (dense-literal | hex-string)? `>` `:` shaped-type, after `dense`; and where the `>` ends."""
        self.expect("<")
        start = self.token.start
        literal: object = None
        hex_blob: str | None = None
        if self.token.kind == "string":
            hex_blob = self.parse_string()
        elif not self.peek(">"):
            literal = self._parse_dense_literal()
        close_end = self.token.end
        self.expect(">")
        self.expect(":")
        type_ = self.parse_type()
        if not isinstance(type_, RankedTensorType | VectorType):
            raise self.error("elements literal must be a shaped type", start)
        try:
            dtype = numpy_dtype(type_.element_type)
        except QConvertError as error:  # located at the literal, as a parse error
            raise self.error(error.message, start) from None
        shape = tuple(type_.shape)
        if any(size < 0 for size in shape):
            raise self.error("elements literal type must have static shape", start)
        count = math.prod(shape)
        if count * dtype.itemsize > MAX_ELEMENTS_BYTES:  # a splat's few characters would fill the memory
            raise self.error(
                f"elements literal of {count} elements ({count * dtype.itemsize} bytes) is larger than "
                f"qconvert holds in memory ({MAX_ELEMENTS_BYTES} bytes); use dense_resource",
                start,
            )
        if hex_blob is not None:
            try:
                if not hex_blob.startswith("0x"):
                    raise ValueError
                array = np.frombuffer(bytes.fromhex(hex_blob[2:]), dtype=dtype)
            except ValueError:
                raise self.error("expected string containing hex digits starting with `0x`", start) from None
            if array.size not in (1, count):
                raise self.error("elements hex data size is invalid for provided type", start)
            array = np.broadcast_to(array, shape) if array.size == 1 else array.reshape(shape)
        elif literal is None:  # `dense<>`: only a type with no elements (tosa.const_shape of rank 0)
            if math.prod(shape) != 0:
                raise self.error(
                    f"elements literal has no elements, but the type has {math.prod(shape)}", start
                )
            array = np.zeros(shape, dtype=dtype)
        else:
            array = self._dense_array(literal, type_, dtype, start)
        array = np.array(array)
        array.setflags(write=False)
        return DenseElementsAttr(array, type_), close_end

    def _parse_dense_literal(self) -> object:
        if self.peek("["):
            self.enter_nesting()
            try:
                return self._parse_dense_literal_list()
            finally:
                self.exit_nesting()
        return self._parse_dense_literal_element()

    def _parse_dense_literal_list(self) -> list[object]:
        self.expect("[")
        items: list[object] = []
        if not self.try_consume("]"):
            items.append(self._parse_dense_literal())
            while self.try_consume(","):
                items.append(self._parse_dense_literal())
            self.expect("]")
        return items

    def _parse_dense_literal_element(self) -> object:
        if self.token.text in ("true", "false"):
            return self.advance().text == "true"
        negative = self.try_consume("-")
        token = self.advance()
        if token.kind not in ("integer", "float"):
            raise self.error("expected element literal of primitive type", token.start)
        return ("-" if negative else "") + token.text

    def _dense_array(
        self, literal: object, type_: RankedTensorType | VectorType, dtype: np.dtype, start: int
    ) -> np.ndarray:
        from qconvert.ir.types import FloatType

        element_type = type_.element_type

        def convert(item: object) -> object:
            if isinstance(item, bool):
                return item
            text = str(item)
            if isinstance(element_type, FloatType):
                body = text.lstrip("-")
                value = (
                    self.hex_float(body, element_type.name, start) if body.startswith("0x") else float(body)
                )
                return -value if text.startswith("-") else value
            body = text.lstrip("-")
            if not INTEGER_LITERAL.fullmatch(body):
                raise self.error("expected integer elements, but parsed floating-point", start)
            magnitude = integer_literal_value(body)
            if magnitude is None:
                raise self.error("integer value too large", start)
            return self.fit_integer(
                -magnitude if text.startswith("-") else magnitude, element_type, start, "type"
            )

        def flatten(item: object) -> tuple[list[object], tuple[int, ...]]:
            if isinstance(item, list):
                parts = [flatten(i) for i in item]
                shapes = {p[1] for p in parts}
                if len(shapes) > 1:
                    raise self.error(
                        "tensor literal is invalid; ranks are not consistent between elements", start
                    )
                inner = parts[0][1] if parts else ()
                return [v for p in parts for v in p[0]], (len(item), *inner)
            return [convert(item)], ()

        values, shape = flatten(literal)
        if shape != () and tuple(shape) != tuple(type_.shape):
            raise self.error(
                f"inferred shape of elements literal ([{', '.join(map(str, shape))}]) does not match type "
                f"([{', '.join(map(str, type_.shape))}])",
                start,
            )
        with np.errstate(over="ignore"):  # a float beyond the type's range is its infinity, as in MLIR
            if shape == ():
                return np.full(type_.shape, values[0], dtype=dtype)
            return np.array(values, dtype=dtype).reshape(shape)

    def _parse_dense_resource(self) -> DenseResourceAttr:
        self.advance()
        self.expect("<")
        name = self.parse_keyword()
        self.expect(">")
        self.expect(":")
        type_ = self.parse_type()
        return DenseResourceAttr(name, type_, self.resource_elements(name, type_))

    def resource_elements(self, name: str, type_: Type) -> LazyElements | None:
        """The lazily decoded blob of `dense_resource<name>`; a bare attribute parser has none."""
        return None

    def parse_attr_dict(self) -> dict[str, Attribute]:
        """attr-dict ::= `{` (name (`=` attribute)?) (`,` ...)* `}`"""
        self.expect("{")
        attributes: dict[str, Attribute] = {}
        if self.try_consume("}"):
            return attributes
        while True:
            token = self.token
            if token.kind == "bare":
                name = self.advance().text
            elif token.kind == "string":
                name = self.parse_string()
            else:
                raise self.error("expected attribute name")
            if name in attributes:
                raise self.error(f"duplicate key '{name}' in dictionary attribute", token.start)
            attributes[name] = self.parse_attribute() if self.try_consume("=") else UnitAttr()
            if not self.try_consume(","):
                break
        self.expect("}")
        return attributes

    def parse_optional_attr_dict(self) -> dict[str, Attribute]:
        token = self.token
        return self.parse_attr_dict() if token.text == "{" and token.kind == "punct" else {}

    def parse_optional_attr_dict_with_keyword(self) -> dict[str, Attribute]:
        if self.parse_optional_keyword(("attributes",)):
            return self.parse_attr_dict()
        return {}
