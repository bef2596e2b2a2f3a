"""Parses MLIR's textual syntax into the IR: types, attributes, generic and custom ops, aliases.

NOTE: the parser works on positions in one buffer (no token list), so a dialect body such as the
`<...>` of `!quant.uniform<...>` is parsed in place and its errors point at the right line and column.
Messages are upstream's (mlir/lib/AsmParser) wherever the rule is upstream's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from typing import NamedTuple

import numpy as np

from qconvert.errors import Diagnostic, Location, ParseError, VerifyError
from qconvert.ir import dialects as _dialects  # noqa: F401  (registers every op)
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
    OpaqueAttr,
    StringAttr,
    SymbolRefAttr,
    TypeAttr,
    UnitAttr,
)
from qconvert.ir.core import (
    OP_REGISTRY,
    REGISTERED_DIALECTS,
    Block,
    GenericOp,
    Operation,
    Region,
    Value,
    gc_paused,
)
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.float_format import bits_to_float, round_to_float_type
from qconvert.ir.quant_syntax import parse_quant_type
from qconvert.ir.types import (
    DYNAMIC,
    FLOAT_BIT_WIDTHS,
    FloatType,
    FunctionType,
    IndexType,
    IntegerType,
    NoneType,
    OpaqueType,
    RankedTensorType,
    Signedness,
    Type,
    UnrankedTensorType,
    VectorType,
)

MAX_INTEGER_WIDTH = 16777215  # IntegerType::kMaxWidth

# The most frequent kinds come first. Kinds that can start with the same character keep their relative
# order (`->` and `{-#` before punctuation, `#name` before `#-}`, float before integer), so the order
# changes no token.
TOKEN = re.compile(
    r"""
    (?P<percent>%[a-zA-Z0-9_$.\-]+)
  | (?P<bare>[a-zA-Z_][a-zA-Z0-9_$.]*)
  | (?P<arrow>->)
  | (?P<metadata_begin>\{-\#)
  | (?P<punct>[(){}\[\]<>,:=?*+\-|])
  | (?P<caret>\^[a-zA-Z0-9_$.\-]+)
  | (?P<at>@(?:[a-zA-Z_][a-zA-Z0-9_$.\-]*|"(?:[^"\\\n]|\\.)*"))
  | (?P<hash>\#[a-zA-Z0-9_$.\-]+)
  | (?P<bang>![a-zA-Z_][a-zA-Z0-9_$.\-]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<float>[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?)
  | (?P<integer>0x[0-9a-fA-F]+|[0-9]+)
  | (?P<metadata_end>\#-\})
    """,
    re.VERBOSE,
)
SKIP = re.compile(r"(?:\s+|//[^\n]*)*")
# SKIP then TOKEN in a single match. The skip is possessive (`*+`): a token can never start inside what
# was skipped (a comment's text must not become tokens when no token follows it).
LEX = re.compile(r"\s*+(?://[^\n]*+\s*+)*+(?:" + TOKEN.pattern + ")", re.VERBOSE)
_lex_match = LEX.match
# `%name = op.name` (one result, whitespace only in between): the three tokens parse_operation would lex,
# in one match. Anything else (`%a:2`, `%a, %b`, comments, a generic op) takes the token-by-token path.
RESULT_AND_OP_NAME = re.compile(r"%[a-zA-Z0-9_$.\-]+\s*=\s*([a-zA-Z_][a-zA-Z0-9_$.]*)")
# What `_scan_dialect_body` looks at: brackets, strings, and `->` (whose `>` closes nothing).
BODY_CHARACTER = re.compile(r'->|[<\[({>\])}"]')
STRING_REST = re.compile(r'(?:[^"\\\n]|\\.)*"')
DIMENSIONS = re.compile(r"(?:(?:\?|[0-9]+)x)*")
INTEGER_TYPE = re.compile(r"(si|ui|i)([0-9]+)\Z")
SIMPLE_TYPES: dict[str, Type] = {"index": IndexType(), "none": NoneType()}


class Token(NamedTuple):
    kind: str
    text: str
    start: int
    end: int


_new_token = tuple.__new__


class OperandReference(NamedTuple):
    """A use of `%name` or `%name#index` not yet resolved to a value (its type comes later)."""

    name: str
    index: int  # pyright: ignore[reportIncompatibleMethodOverride]  (a field, not tuple.index)
    start: int


@dataclass(frozen=True, slots=True)
class ParserOptions:
    allow_unregistered_dialect: bool = False


class Parser:
    """Recursive-descent parser over one source buffer (or one `--split-input-file` chunk of it)."""

    def __init__(
        self, text: str, filename: str = "-", *, line_offset: int = 0, options: ParserOptions | None = None
    ) -> None:
        self.text = text
        self.filename = filename
        self.line_offset = line_offset
        self.options = options or ParserOptions()
        self.limit = len(text)
        # `location` counts lines from the last position it was asked about (ops come in source order).
        self._line_position = 0
        self._line_number = 1
        # Types by their exact source text: a type's text always parses to the same (immutable) type, since
        # aliases cannot be redefined; only successful parses are stored.
        self._type_cache: dict[str, Type] = {}
        self._last_close_end = -1
        self.token = self._lex(0)
        self.type_aliases: dict[str, Type] = {}
        self.attribute_aliases: dict[str, Attribute] = {}
        self.value_scopes: list[dict[str, tuple[list[Value], int]] | None] = []
        self.default_dialects: list[str] = ["builtin"]
        self.resources: dict[str, str] = {}

    # Lexing --------------------------------------------------------------------------------------
    def _lex(self, position: int) -> Token:
        match = _lex_match(self.text, position, self.limit)
        if match is None:
            position = SKIP.match(self.text, position).end()
            if position >= self.limit:
                return _new_token(Token, ("eof", "", self.limit, self.limit))
            return _new_token(Token, ("error", self.text[position], position, position + 1))
        kind = match.lastgroup
        text = match[kind]  # type: ignore[index]
        end = match.end()
        return _new_token(Token, (kind, text, end - len(text), end))

    def advance(self) -> Token:
        token = self.token
        self.token = self._lex(token.end)
        return token

    def reset(self, position: int) -> None:
        self.token = self._lex(position)

    def location(self, position: int | None = None) -> Location:
        position = self.token.start if position is None else position
        text = self.text
        if position >= self._line_position:
            line = self._line_number + text.count("\n", self._line_position, position)
        else:
            line = text.count("\n", 0, position) + 1
        self._line_position, self._line_number = position, line
        line_start = text.rfind("\n", 0, position) + 1
        return Location(self.filename, line + self.line_offset, position - line_start + 1)

    def error(
        self, message: str, position: int | None = None, related: Sequence[Diagnostic] = ()
    ) -> ParseError:
        return ParseError(message, self.location(position), tuple(related))

    # Token helpers ---------------------------------------------------------------------------------
    def peek(self, text: str) -> bool:
        token = self.token
        return token.text == text and token.kind in ("punct", "arrow", "bare")

    def try_consume(self, text: str) -> bool:
        token = self.token
        if token.text == text and (token.kind == "punct" or token.kind == "arrow"):
            self.token = self._lex(token.end)
            return True
        return False

    def expect(self, text: str) -> None:
        token = self.token  # try_consume, inlined: this runs a few times per op
        if token.text == text and (token.kind == "punct" or token.kind == "arrow"):
            self.token = self._lex(token.end)
            return
        raise self.error(f"expected '{text}'")

    def expect_keyword(self, keyword: str) -> None:
        if self.token.kind == "bare" and self.token.text == keyword:
            self.advance()
            return
        raise self.error(f"expected '{keyword}'")

    def parse_optional_keyword(self, keywords: Sequence[str]) -> str | None:
        if self.token.kind == "bare" and self.token.text in keywords:
            return self.advance().text
        return None

    def parse_keyword(self) -> str:
        if self.token.kind != "bare":
            raise self.error("expected valid keyword")
        return self.advance().text

    def parse_integer(self, bits: int = 64) -> int:
        """integer ::= `-`? decimal-or-hex-literal, which must fit a signed integer of `bits` bits."""
        start = self.token.start
        negative = self.try_consume("-")
        token = self.token
        if token.kind != "integer":
            raise self.error("expected integer value")
        value = int(self.advance().text, 0)
        value = -value if negative else value
        if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            raise self.error("integer value too large", start)
        return value

    def parse_float(self) -> float:
        """A float literal, an integer, or a hex integer read as the bits of an f64 (MLIR's parseFloat)."""
        negative = self.try_consume("-")
        token = self.token
        if token.kind == "float":
            value = float(self.advance().text)
        elif token.kind == "integer" and token.text.startswith("0x"):
            if negative:
                raise self.error("hexadecimal float literal should not have a leading minus", token.start)
            bits = int(token.text, 16)
            if bits >= 1 << 64:
                raise self.error("hexadecimal float constant out of range for type", token.start)
            self.advance()
            value = bits_to_float(bits, "f64")
        elif token.kind == "integer":
            raise self.error("unexpected decimal integer literal for a floating point value", token.start)
        else:
            raise self.error("expected floating point literal")
        return -value if negative else value

    def parse_string(self) -> str:
        if self.token.kind != "string":
            raise self.error("expected string")
        return unescape_string(self.advance().text)

    # Types -------------------------------------------------------------------------------------
    def parse_type(self) -> Type:
        """type ::= function-type | non-function-type"""
        token = self.token
        if token.kind == "bare":  # parse_non_function_type's first steps, inlined for `f32`, `tensor<...>`
            cached = self._type_cache.get(token.text)
            if cached is not None:
                self.token = self._lex(token.end)
                return cached
            if token.text == "tensor":
                return self._parse_tensor_type_cached()
        elif token.text == "(" and token.kind == "punct":
            return self.parse_function_type()
        return self.parse_non_function_type()

    def parse_function_type(self) -> FunctionType:
        """function-type ::= `(` type-list? `)` `->` (type | `(` type-list? `)`)"""
        self.expect("(")
        inputs = [] if self.try_consume(")") else self._type_list_until(")")
        self.expect("->")
        return FunctionType(tuple(inputs), tuple(self.parse_function_result_types()))

    def parse_function_result_types(self) -> list[Type]:
        if self.try_consume("("):
            return [] if self.try_consume(")") else self._type_list_until(")")
        return [self.parse_non_function_type()]

    def _type_list_until(self, close: str) -> list[Type]:
        types = [self.parse_type()]
        while self.try_consume(","):
            types.append(self.parse_type())
        self.expect(close)
        return types

    def parse_type_list_no_parens(self) -> list[Type]:
        types = [self.parse_type()]
        while self.try_consume(","):
            types.append(self.parse_type())
        return types

    def parse_non_function_type(self) -> Type:
        token = self.token
        if token.kind == "bare":
            text = token.text
            cached = self._type_cache.get(text)
            if cached is not None:  # `f32`, `i8`, `index`: a keyword seen before
                self.token = self._lex(token.end)
                return cached
            if text in FLOAT_BIT_WIDTHS:
                self.advance()
                from qconvert.ir.types import FloatType

                type_: Type = FloatType(text)
                self._type_cache[text] = type_
                return type_
            match = INTEGER_TYPE.match(text)
            if match is not None:
                width = int(match.group(2))
                if width > MAX_INTEGER_WIDTH:
                    raise self.error("invalid integer width")
                self.advance()
                signedness = {"i": Signedness.SIGNLESS, "si": Signedness.SIGNED, "ui": Signedness.UNSIGNED}
                type_ = IntegerType(width, signedness[match.group(1)])
                self._type_cache[text] = type_
                return type_
            if text in SIMPLE_TYPES:
                self.advance()
                return SIMPLE_TYPES[text]
            if text == "tensor":
                return self._parse_tensor_type_cached()
            if text == "vector":
                return self._parse_vector_type()
        if token.kind == "bang":
            return self._parse_extended_type()
        raise self.error("expected non-function type")

    def _parse_tensor_type_cached(self) -> Type:
        """A `tensor<...>` type, looked up by its source text first (100k ops repeat a handful of types)."""
        start, position = self.token.start, self.token.end
        text = self.text
        if not text.startswith("<", position):
            return self._parse_tensor_type()
        close = text.find(">", position, self.limit)
        if close > 0 and text.count("<", position, close) == 1 and text[close - 1] != "-":
            end: int | None = close + 1  # no nested `<`: the first `>` closes (a quote makes no difference:
            # a wrong end only gives a key that is not stored, since the parse will not end there)
        else:
            end = self._angle_bracket_end(position)
        if end is None:
            return self._parse_tensor_type()
        key = self.text[start:end]
        cached = self._type_cache.get(key)
        if cached is not None:
            self.reset(end)
            return cached
        type_ = self._parse_tensor_type()
        if self._last_close_end == end and shareable(type_):  # the parse ended where the scan did
            self._type_cache[key] = type_
        return type_

    def _angle_bracket_end(self, start: int) -> int | None:
        """Where the `<...>` opening at `start` closes (None when it does not, or when a string is inside).

        The first `>` (not of a `->`) after which as many `<` as `>` have been seen since `start`.
        """
        text, limit = self.text, self.limit
        closes = 0
        search = start
        while True:
            close = text.find(">", search, limit)
            if close < 0:
                return None
            search = close + 1
            if text[close - 1] == "-":  # `->`
                continue
            closes += 1
            if text.count("<", start, close) == closes:
                return None if text.find('"', start, close) >= 0 else close + 1

    def _parse_tensor_type(self) -> Type:
        self.advance()
        if self.token.text != "<":
            raise self.error("expected '<' in tensor type")
        position = self.token.end
        if self.text.startswith("*", position):
            self.reset(position + 1)
            if not (self.token.kind == "bare" and self.token.text.startswith("x")):
                raise self.error("expected 'x' in unranked tensor type")
            self.reset(self.token.start + 1)
            element_type = self.parse_non_function_type()
            self._last_close_end = self.token.end
            self.expect(">")
            return UnrankedTensorType(element_type)
        match = DIMENSIONS.match(self.text, SKIP.match(self.text, position).end())
        shape = tuple(DYNAMIC if d == "?" else int(d) for d in match.group().split("x")[:-1])
        self.reset(match.end())
        element_type = self.parse_non_function_type()
        encoding = self.parse_attribute() if self.try_consume(",") else None
        self._last_close_end = self.token.end
        self.expect(">")
        return RankedTensorType(shape, element_type, encoding)

    def _parse_vector_type(self) -> Type:
        vector_position = self.advance().start
        self.expect("<")
        shape: list[int] = []
        scalable: list[bool] = []
        while True:
            position = self.token.start
            scalable_dim = self.text.startswith("[", position)
            match = re.compile(r"\[?([0-9]+)\]?x").match(self.text, position)
            if match is None:
                break
            shape.append(int(match.group(1)))
            scalable.append(scalable_dim)
            self.reset(match.end())
        element_type = self.parse_non_function_type()
        if not isinstance(element_type, IntegerType | FloatType | IndexType):
            raise self.error(
                "failed to verify 'elementType': VectorElementTypeInterface instance", vector_position
            )
        self.expect(">")
        return VectorType(tuple(shape), element_type, tuple(scalable) if any(scalable) else ())

    def _parse_extended_type(self) -> Type:
        """extended-type ::= `!` alias-name | `!` dialect `.` name body? | `!` dialect `<` body `>`"""
        token = self.advance()
        identifier = token.text[1:]
        dialect, dot, _ = identifier.partition(".")
        has_body = self.text.startswith("<", token.end)
        if not has_body and not dot:
            if identifier not in self.type_aliases:
                raise self.error(f"undefined symbol alias id '{identifier}'", token.start)
            return self.type_aliases[identifier]
        body_end = self._scan_dialect_body(token.end) if has_body else token.end
        key = self.text[token.start : body_end]
        cached = self._type_cache.get(key)
        if cached is not None:
            self.reset(body_end)
            return cached
        type_ = self._parse_dialect_type(token, dialect, dot, body_end)
        if shareable(type_):
            self._type_cache[key] = type_
        return type_

    def _parse_dialect_type(self, token: Token, dialect: str, dot: str, body_end: int) -> Type:
        if dialect == "quant":
            body_start = token.start + 1 + len(dialect) + (1 if dot else 0)
            if not dot:
                body_start += 1  # `!quant<uniform<...>>`: the body inside the outer angles
            saved_limit = self.limit
            self.limit = body_end - (0 if dot else 1)
            self.reset(body_start)
            try:
                type_ = parse_quant_type(self)
                if self.token.kind != "eof":
                    raise self.error("expected '>'")
            finally:
                self.limit = saved_limit
            self.reset(body_end)
            return type_
        self.reset(body_end)
        return OpaqueType(dialect, self.text[token.start + 1 : body_end])

    def _scan_dialect_body(self, start: int) -> int:
        """Find the end of a `<...>` dialect body by balancing `<([{` (MLIR's parseDialectSymbolBody).

        Jumps from one bracket, quote or `->` to the next (a body of 65,536 scales is one regex search).
        """
        nesting: list[str] = []
        position = start
        closing = {">": "<", "]": "[", ")": "(", "}": "{"}
        text = self.text
        while True:
            match = BODY_CHARACTER.search(text, position)
            if match is None:
                if nesting:
                    raise self.error(f"unbalanced '{nesting[-1]}' character in pretty dialect name", start)
                raise self.error("unexpected nul or EOF in pretty dialect name", start)
            char = match.group()
            position = match.end()
            if char in "<[({":
                nesting.append(char)
                continue
            if char == "->":
                continue
            if char in closing:
                if nesting[-1] != closing[char]:
                    raise self.error(f"unbalanced '{nesting[-1]}' character in pretty dialect name", start)
                nesting.pop()
                if not nesting:
                    return position
            else:  # `"`
                string = STRING_REST.match(text, position)
                if string is None:
                    raise self.error("expected '\"' in string literal", position - 1)
                position = string.end()

    # Attributes ----------------------------------------------------------------------------------
    def parse_attribute(self, type_hint: Type | None = None) -> Attribute:
        token = self.token
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
                value = bits_to_float(int(token.text, 16), float_type.name)
            else:
                value = round_to_float_type(float(token.text), float_type.name)
            return FloatAttr(-value if negative else value, float_type)
        type_ = type_ if type_ is not None else IntegerType(64)
        value = self.fit_integer(-int(token.text, 0) if negative else int(token.text, 0), type_, token.start)
        if isinstance(type_, IntegerType) and type_.width == 1 and type_.is_signless:
            return BoolAttr(bool(value))
        return IntegerAttr(value, type_)

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
        self.advance()
        self.expect("<")
        start = self.token.start
        literal: object = None
        hex_blob: str | None = None
        if self.token.kind == "string":
            hex_blob = self.parse_string()
        elif not self.peek(">"):
            literal = self._parse_dense_literal()
        self.expect(">")
        self.expect(":")
        type_ = self.parse_type()
        if not isinstance(type_, RankedTensorType | VectorType):
            raise self.error("elements literal must be a shaped type", start)
        dtype = numpy_dtype(type_.element_type)
        shape = tuple(type_.shape)
        if hex_blob is not None:
            array = np.frombuffer(bytes.fromhex(hex_blob[2:]), dtype=dtype)
            array = np.broadcast_to(array, shape) if array.size == 1 else array.reshape(shape)
        else:
            array = self._dense_array(literal, type_, dtype, start)
        array = np.array(array)
        array.setflags(write=False)
        return DenseElementsAttr(array, type_)

    def _parse_dense_literal(self) -> object:
        if self.try_consume("["):
            items: list[object] = []
            if not self.try_consume("]"):
                items.append(self._parse_dense_literal())
                while self.try_consume(","):
                    items.append(self._parse_dense_literal())
                self.expect("]")
            return items
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
                    bits_to_float(int(body, 16), element_type.name) if body.startswith("0x") else float(body)
                )
                return -value if text.startswith("-") else value
            value = int(text, 0) if not text.lstrip("-").startswith("0x") else int(text, 16)
            return self.fit_integer(value, element_type, start, "type")

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
        if shape == ():
            return np.full(type_.shape, values[0], dtype=dtype)
        if tuple(shape) != tuple(type_.shape):
            raise self.error(
                f"inferred shape of elements literal ([{', '.join(map(str, shape))}]) does not match type "
                f"([{', '.join(map(str, type_.shape))}])",
                start,
            )
        return np.array(values, dtype=dtype).reshape(shape)

    def _parse_dense_resource(self) -> DenseResourceAttr:
        self.advance()
        self.expect("<")
        name = self.parse_keyword()
        self.expect(">")
        self.expect(":")
        return DenseResourceAttr(name, self.parse_type())

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

    # Symbols and operands ----------------------------------------------------------------------------
    def parse_symbol_name(self) -> str:
        if self.token.kind != "at":
            raise self.error("expected valid '@'-identifier for symbol name")
        text = self.advance().text[1:]
        return unescape_string(text) if text.startswith('"') else text

    def parse_optional_symbol_name(self) -> str | None:
        return self.parse_symbol_name() if self.token.kind == "at" else None

    def parse_operand_reference(self) -> OperandReference:
        token = self.token
        if token.kind != "percent":
            raise self.error("expected SSA operand")
        following = self.token = self._lex(token.end)
        index = 0
        if following.kind == "hash" and following.start == token.end and following.text[1:].isdigit():
            index = int(self.advance().text[1:])
        return _new_token(OperandReference, (token.text, index, token.start))  # type: ignore[return-value]

    def parse_operand_references(self) -> list[OperandReference]:
        if self.token.kind != "percent":
            return []
        references = [self.parse_operand_reference()]
        while self.token.text == "," and self._lex(self.token.end).kind == "percent":
            self.advance()
            references.append(self.parse_operand_reference())
        return references

    def lookup_value(self, reference: OperandReference) -> Value:
        scope = self.value_scopes[-1]
        if scope is not None:  # the common case: a value of the innermost region, result 0
            entry = scope.get(reference.name)
            if entry is not None and reference.index < len(entry[0]):
                return entry[0][reference.index]
        for scope in reversed(self.value_scopes):
            if scope is None:
                break
            entry = scope.get(reference.name)
            if entry is not None:
                values, _ = entry
                if reference.index >= len(values):
                    raise self.error("reference to invalid result number", reference.start)
                return values[reference.index]
        raise self.error("use of undeclared SSA value name", reference.start)

    def resolve_operand(self, reference: OperandReference, type_: Type) -> Value:
        scope = self.value_scopes[-1]
        entry = scope.get(reference.name) if scope is not None else None
        if entry is not None and reference.index < len(entry[0]):  # lookup_value's common case, inlined
            value = entry[0][reference.index]
        else:
            value = self.lookup_value(reference)
        if value.type is not type_ and value.type != type_:
            raise self.error(
                f"use of value '{reference.name}' expects different type than prior uses: '{type_}' vs "
                f"'{value.type}'",
                reference.start,
            )
        return value

    def resolve_operands(self, references: Sequence[OperandReference], types: Sequence[Type]) -> list[Value]:
        if len(references) != len(types):
            raise self.error(f"{len(references)} operands present, but expected {len(types)}")
        return [self.resolve_operand(r, t) for r, t in zip(references, types, strict=True)]

    def parse_conversion(self, separator: str) -> tuple[Value, dict[str, Attribute], Type]:
        """`%x {attrs}? : T <separator> U`: the operand, its attributes and the result type."""
        reference = self.parse_operand_reference()
        attributes = self.parse_optional_attr_dict()
        self.expect(":")
        input_type = self.parse_type()
        if separator == "->":
            self.expect("->")
        else:
            self.expect_keyword(separator)
        return self.resolve_operand(reference, input_type), attributes, self.parse_type()

    def parse_values_with_types(self) -> list[Value]:
        """`(%a, %b : T, U)?` after a terminator's name."""
        references = self.parse_operand_references()
        if not references:
            return []
        self.expect(":")
        return self.resolve_operands(references, self.parse_type_list_no_parens())

    def define_values(self, name: str, values: list[Value], position: int) -> None:
        scope = self.value_scopes[-1]
        assert scope is not None
        if name in scope:
            raise self.error(f"redefinition of SSA value '{name}'", position)
        scope[name] = (values, position)

    # Functions (shared by func.func and friends) --------------------------------------------------
    def parse_function_arguments(
        self,
    ) -> tuple[list[tuple[str, Type, int]] | None, list[Type], list[DictionaryAttr]]:
        """`(%a: T {attrs}, ...)` (named) or `(T, ...)` (a declaration's types only)."""
        self.expect("(")
        named: list[tuple[str, Type, int]] = []
        types: list[Type] = []
        attrs: list[DictionaryAttr] = []
        is_named = self.token.kind == "percent"
        if not self.try_consume(")"):
            while True:
                if is_named:
                    token = self.token
                    if token.kind != "percent":
                        raise self.error("expected SSA identifier")
                    self.advance()
                    self.expect(":")
                    type_ = self.parse_type()
                    named.append((token.text, type_, token.start))
                else:
                    type_ = self.parse_type()
                types.append(type_)
                attrs.append(DictionaryAttr(tuple(self.parse_optional_attr_dict().items())))
                if self.token.kind == "bare" and self.token.text == "loc":
                    self._skip_location()
                if not self.try_consume(","):
                    break
            self.expect(")")
        return (named if is_named or not types else None), types, attrs

    def parse_function_result_list(self) -> tuple[list[Type], list[DictionaryAttr]]:
        if not self.try_consume("("):
            return [self.parse_non_function_type()], [DictionaryAttr(())]
        types: list[Type] = []
        attrs: list[DictionaryAttr] = []
        if self.try_consume(")"):
            return types, attrs
        while True:
            types.append(self.parse_type())
            attrs.append(DictionaryAttr(tuple(self.parse_optional_attr_dict().items())))
            if not self.try_consume(","):
                break
        self.expect(")")
        return types, attrs

    def _skip_location(self) -> None:
        """Trailing `loc(...)`: parsed for balance, not kept."""
        self.advance()
        if self.token.text != "(":
            raise self.error("expected '(' in location")
        depth = 0
        while True:
            token = self.advance()
            if token.kind == "eof":
                raise self.error("unbalanced location")
            if token.text == "(":
                depth += 1
            elif token.text == ")":
                depth -= 1
                if depth == 0:
                    return

    # Operations, blocks and regions --------------------------------------------------------------------
    def parse_region(
        self, owner: Operation, entry_arguments: Sequence[tuple[str, Type, int]] | None
    ) -> Region:
        """region ::= `{` entry-block? block* `}`; `entry_arguments` are the names from the op's signature."""
        self.expect("{")
        region = Region()
        isolated = isinstance(owner, ModuleOp) or owner.name == "func.func"
        self.value_scopes.append(None if isolated else {})
        if isolated:
            self.value_scopes.append({})
        default = getattr(owner, "default_dialect", None)
        self.default_dialects.append(default or ("" if not isolated else self.default_dialects[-1]))
        try:
            if self.try_consume("}"):
                return region
            block = Block()
            region.append(block)
            if entry_arguments:
                for name, type_, position in entry_arguments:
                    self.define_values(name, [block.add_argument(type_)], position)
            if self.token.kind == "caret":
                if entry_arguments:
                    raise self.error("invalid block name in region with named arguments")
                self._parse_block_label(block)
            blocks_by_name: dict[str, Block] = {}
            while True:
                ops = block.ops
                while True:
                    token = self.token
                    kind = token.kind
                    if kind == "caret" or kind == "eof" or (token.text == "}" and kind == "punct"):
                        break
                    op = self.parse_operation()
                    op.parent = block  # Block.append, inlined
                    ops.append(op)
                if self.try_consume("}"):
                    break
                if self.token.kind == "eof":
                    raise self.error("expected '}' to end region")
                block = blocks_by_name.setdefault(self.token.text, Block())
                region.append(block)
                self._parse_block_label(block)
            return region
        finally:
            self.default_dialects.pop()
            self.value_scopes.pop()
            if isolated:
                self.value_scopes.pop()

    def _parse_block_label(self, block: Block) -> None:
        self.advance()
        if self.try_consume("(") and not self.try_consume(")"):
            while True:
                token = self.token
                if token.kind != "percent":
                    raise self.error("expected SSA identifier")
                self.advance()
                self.expect(":")
                argument = block.add_argument(self.parse_type())
                self.define_values(token.text, [argument], token.start)
                if not self.try_consume(","):
                    break
            self.expect(")")
        self.expect(":")

    def parse_operation(self) -> Operation:
        """operation ::= (op-result (`,` op-result)* `=`)? (generic-operation | custom-operation)"""
        token = self.token
        start = token.start
        result_groups: list[tuple[str, int, int]] = []
        num_results = 0
        fast = RESULT_AND_OP_NAME.match(self.text, start, self.limit) if token.kind == "percent" else None
        if fast is not None:
            result_groups.append((token.text, 1, start))
            num_results = 1
            name_start, name_end = fast.span(1)
            self.token = _new_token(Token, ("bare", fast[1], name_start, name_end))
        elif token.kind == "percent":
            while True:
                token = self.advance()
                count = 1
                following = self.token
                if following.text == ":" and following.start == token.end:
                    self.advance()
                    count = self.parse_integer()
                    following = self.token
                result_groups.append((token.text, count, token.start))
                num_results += count
                if not (following.text == "," and following.kind == "punct"):  # try_consume(",")
                    break
                self.token = self._lex(following.end)
            self.expect("=")
        token = self.token
        op_start = token.start
        if token.kind == "bare":
            op = self._parse_custom_operation(num_results)
        elif token.kind == "string":
            op = self._parse_generic_operation()
        else:
            raise self.error("expected operation name in quotes")
        op.location = self.location(op_start)
        token = self.token
        if token.kind == "bare" and token.text == "loc" and self.text.startswith("(", token.end):
            self._skip_location()
        if result_groups:
            results = op.results
            if len(results) != num_results:
                raise self.error(
                    f"operation defines {len(results)} results but was provided {num_results} to bind",
                    start,
                )
            index = 0
            for name, count, position in result_groups:
                self.define_values(name, list(results[index : index + count]), position)
                index += count
        return op

    def _parse_generic_operation(self) -> Operation:
        token = self.advance()
        name = unescape_string(token.text)
        cls = OP_REGISTRY.get(name)
        if cls is None:
            dialect = name.split(".", 1)[0] if "." in name else ""
            if dialect in REGISTERED_DIALECTS and dialect != "test":
                raise self.error(
                    f"unregistered operation '{name}' found in dialect ('{dialect}') that does not allow "
                    "unknown operations",
                    token.start,
                )
            if not self.options.allow_unregistered_dialect and dialect != "test":
                raise self.error(
                    "operation being parsed with an unregistered dialect. If this is intended, please use "
                    "-allow-unregistered-dialect with the MLIR tool used",
                    token.start,
                )
        self.expect("(")
        references = self.parse_operand_references()
        self.expect(")")
        successors: list[Block] = []
        if self.try_consume("["):
            raise self.error("successors are not supported")
        attributes: dict[str, Attribute] = {}
        if self.peek("<") and self.text.startswith("<{", self.token.start):
            self.advance()
            attributes.update(self.parse_attr_dict())
            self.expect(">")
        op = cls.__new__(cls) if cls is not None else GenericOp.__new__(GenericOp)
        if cls is None:
            op.name = name  # type: ignore[misc]
        regions: list[Region] = []
        if self.try_consume("("):
            while True:
                regions.append(self.parse_region(op, entry_arguments=None))
                if not self.try_consume(","):
                    break
            self.expect(")")
        attributes.update(self.parse_optional_attr_dict())
        self.expect(":")
        function_type = self.parse_function_type()
        operands = self.resolve_operands(references, function_type.inputs)
        Operation.__init__(op, operands, function_type.results, attributes, regions, successors)
        return op

    def _parse_custom_operation(self, num_results: int) -> Operation:
        token = self.token
        self.token = self._lex(token.end)
        name = token.text
        cls = OP_REGISTRY.get(name)
        if cls is None and "." not in name:
            default = self.default_dialects[-1] if self.default_dialects else ""
            cls = OP_REGISTRY.get(f"{default}.{name}") if default else None
        if cls is None or not cls.has_custom_syntax:
            raise self.error(f"custom op '{name}' is unknown", token.start)
        return cls.parse_custom(self, num_results)

    def parse_top_level(self) -> ModuleOp:
        """A whole file (or chunk): aliases, resources and ops; bare ops are wrapped in a `module`."""
        module = ModuleOp.create()
        self.value_scopes = [None, {}]
        ops: list[Operation] = []
        while self.token.kind != "eof":
            token = self.token
            if token.kind == "bang" and self._lex(token.end).text == "=":
                self._parse_alias_definition(self.type_aliases, token, is_type=True)
            elif token.kind == "hash" and self._lex(token.end).text == "=":
                self._parse_alias_definition(self.attribute_aliases, token, is_type=False)
            elif token.kind == "metadata_begin":
                self._skip_metadata()
            else:
                ops.append(self.parse_operation())
        if len(ops) == 1 and isinstance(ops[0], ModuleOp):
            return ops[0]
        for op in ops:
            module.body.append(op)
        return module

    def _parse_alias_definition(self, table: dict, token: Token, *, is_type: bool) -> None:  # type: ignore[type-arg]
        name = token.text[1:]
        if name in table:
            kind = "type" if is_type else "attribute"
            raise self.error(f"redefinition of {kind} alias id '{name}'", token.start)
        self.advance()
        self.expect("=")
        table[name] = self.parse_type() if is_type else self.parse_attribute()

    def _skip_metadata(self) -> None:
        start = self.token.start
        end = self.text.find("#-}", start)
        if end < 0:
            raise self.error("expected '#-}' to end file metadata")
        self.reset(end + 3)


def shareable(value: object) -> bool:
    """Whether every parse of the text of `value` gives a value equal to it, so that one object may stand
    for all of them (the parser's type cache).

    Not so for a NaN compared field by field (NaN != NaN: two parses of `!quant.uniform<i8:f32, 0x7FF8...>`
    are different types, and a use of a value of that type is an error), nor for anything compared by
    identity (`dense_resource` attributes).
    """
    if value is None or isinstance(value, str | int | Enum):
        return True
    if isinstance(value, float):
        return value == value
    if isinstance(value, tuple):  # scales and zero points: 65,536 of them in a large per-axis type
        for item in value:
            kind = type(item)
            if kind is float:
                if item != item:
                    return False
            elif kind is not int and not shareable(item):
                return False
        return True
    if isinstance(value, np.ndarray):
        return True  # held by a class whose `==` compares arrays NaN-safely (bytes, or equal_nan)
    cls = type(value)
    if is_dataclass(cls) and cls.__eq__ is not object.__eq__:
        return all(shareable(getattr(value, f.name)) for f in fields(cls))
    return False


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not nested in parentheses or brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return parts


def unescape_string(token_text: str) -> str:
    """The value of a quoted string token: `\\XX` hex escapes, `\\n`, `\\t`, `\\"`, `\\\\`."""
    body = token_text[1:-1]
    if "\\" not in body:
        return body
    out = bytearray()
    index = 0
    simple = {"n": b"\n", "t": b"\t", '"': b'"', "\\": b"\\"}
    while index < len(body):
        char = body[index]
        if char == "\\" and index + 1 < len(body):
            following = body[index + 1]
            if following in simple:
                out += simple[following]
                index += 2
                continue
            out.append(int(body[index + 1 : index + 3], 16))
            index += 3
            continue
        out += char.encode()
        index += 1
    return out.decode("utf-8", errors="replace")


def numpy_dtype(element_type: Type) -> np.dtype:
    """The numpy dtype holding elements of a builtin type (`index` as int64, `i1` as bool)."""
    from qconvert.ir.quant_types import EXPRESSED_DTYPES, FLOAT_STORAGE_DTYPES
    from qconvert.ir.types import FloatType

    if isinstance(element_type, FloatType):
        dtype = EXPRESSED_DTYPES.get(element_type.name) or FLOAT_STORAGE_DTYPES.get(element_type.name)
        if dtype is None:
            raise VerifyError(f"no numpy dtype for {element_type.name}")
        return dtype
    if isinstance(element_type, IndexType):
        return np.dtype(np.int64)
    if isinstance(element_type, IntegerType):
        if element_type.width == 1:
            return np.dtype(np.bool_)
        unsigned = element_type.is_unsigned
        for width in (8, 16, 32, 64):
            if element_type.width <= width:
                return np.dtype(f"{'u' if unsigned else ''}int{width}")
    raise VerifyError(f"no numpy dtype for {element_type}")


def parse_module(
    text: str, filename: str = "-", *, line_offset: int = 0, options: ParserOptions | None = None
) -> ModuleOp:
    """Parse a whole buffer into a module (ops, not yet verified)."""
    with gc_paused():
        return Parser(text, filename, line_offset=line_offset, options=options).parse_top_level()


def parse_type(text: str, filename: str = "<type>") -> Type:
    """Parse one type, such as `tensor<4x!quant.uniform<i8:f32, 0.5>>`; trailing text is an error."""
    parser = Parser(text, filename)
    type_ = parser.parse_type()
    if parser.token.kind != "eof":
        raise parser.error(f"found trailing characters: '{text[parser.token.start :]}'")
    return type_
