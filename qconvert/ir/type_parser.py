"""Type syntax: builtin types (`f32`, `i8`, `tensor<4x?xf32>`, `vector<[4]xi8>`, function types), type
aliases, and dialect types (`!quant.uniform<...>` parsed in place by `quant_syntax`, others kept opaque).

    type                  ::= function-type | non-function-type
    function-type         ::= `(` type-list? `)` `->` (non-function-type | `(` type-list? `)`)
    non-function-type     ::= float-type | integer-type | `index` | `none` | tensor-type | vector-type
                            | extended-type
    integer-type          ::= (`i` | `si` | `ui`) digit+
    tensor-type           ::= `tensor` `<` (dimension `x`)* type (`,` attribute)? `>`
                            | `tensor` `<` `*` `x` type `>`
    vector-type           ::= `vector` `<` ((digit+ | `[` digit+ `]`) `x`)* type `>`
    extended-type         ::= `!` alias-name | `!` dialect `.` name body? | `!` dialect `<` body `>`

Parsed types are cached by their source text (100k ops repeat a handful of types); see `shareable`.
"""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import TYPE_CHECKING, cast

import numpy as np

from qconvert.errors import VerifyError
from qconvert.ir.lexer import Lexer, Token, integer_width, skip_end
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

if TYPE_CHECKING:
    from qconvert.ir.attributes import Attribute
    from qconvert.ir.parser import Parser

MAX_INTEGER_WIDTH = 16777215  # IntegerType::kMaxWidth
# What `_scan_dialect_body` looks at: brackets, strings, and `->` (whose `>` closes nothing).
BODY_CHARACTER = re.compile(r'->|[<\[({>\])}"]')
STRING_REST = re.compile(r'(?:[^"\\\n]|\\.)*"')
DIMENSIONS = re.compile(r"(?:(?:\?|[0-9]+)x)*")
INTEGER_TYPE = re.compile(r"(si|ui|i)([0-9]+)\Z")
SIMPLE_TYPES: dict[str, Type] = {"index": IndexType(), "none": NoneType()}
VECTOR_DIMENSION = re.compile(r"\[?([0-9]+)\]?x")
MAX_DIMENSION = (1 << 63) - 1


class TypeParser(Lexer):
    """The type productions, over a `Lexer`; `AttributeParser` adds the attributes a type may hold."""

    def __init__(self, text: str, filename: str = "-", *, line_offset: int = 0) -> None:
        super().__init__(text, filename, line_offset=line_offset)
        # Types by their exact source text: a type's text always parses to the same (immutable) type, since
        # aliases cannot be redefined; only successful parses are stored.
        self._type_cache: dict[str, Type] = {}
        self._last_close_end = -1
        self.type_aliases: dict[str, Type] = {}

    def parse_attribute(self, type_hint: Type | None = None) -> Attribute:
        """A tensor's encoding is an attribute; `AttributeParser` defines this."""
        raise NotImplementedError

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
        self.enter_nesting()
        try:
            self.expect("(")
            inputs = [] if self.try_consume(")") else self._type_list_until(")")
            self.expect("->")
            return FunctionType(tuple(inputs), tuple(self.parse_function_result_types()))
        finally:
            self.exit_nesting()

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
                width = integer_width(match.group(2))
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
        # A stored key is a whole type whose parse ended at its last `>`, so text that starts with it
        # parses to it. Keys end in `>`: try the text up to the first `>`, and each `>` right after it.
        type_cache = self._type_cache
        end = close + 1
        while end:
            cached = type_cache.get(text[start:end])
            if cached is not None:
                self.reset(end)
                return cached
            if not text.startswith(">", end):
                break
            end += 1
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
        closes = opens = 0
        search = start
        while True:
            close = text.find(">", search, limit)
            if close < 0:
                return None
            opens += text.count("<", search, close)  # counted once each: linear in the body's length
            search = close + 1
            if text[close - 1] == "-":  # `->`
                continue
            closes += 1
            if opens == closes:
                return None if text.find('"', start, close) >= 0 else close + 1

    def _parse_tensor_type(self) -> Type:
        self.enter_nesting()
        try:
            return self._parse_tensor_type_body()
        finally:
            self.exit_nesting()

    def _parse_tensor_type_body(self) -> Type:
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
        dimensions = DIMENSIONS.match(self.text, skip_end(self.text, position))
        assert dimensions is not None  # `(...)*` always matches
        shape = tuple(
            DYNAMIC if d == "?" else self.dimension_size(d, position)
            for d in dimensions.group().split("x")[:-1]
        )
        self.reset(dimensions.end())
        element_type = self.parse_non_function_type()
        encoding = self.parse_attribute() if self.try_consume(",") else None
        self._last_close_end = self.token.end
        self.expect(">")
        return RankedTensorType(shape, element_type, encoding)

    def dimension_size(self, digits: str, position: int) -> int:
        """A static dimension: at most int64's largest value (MLIR's `invalid dimension` otherwise)."""
        digits = digits.lstrip("0") or "0"
        if len(digits) > 19 or int(digits) > MAX_DIMENSION:
            raise self.error("invalid dimension", position)
        return int(digits)

    def _parse_vector_type(self) -> Type:
        self.enter_nesting()
        try:
            return self._parse_vector_type_body()
        finally:
            self.exit_nesting()

    def _parse_vector_type_body(self) -> Type:
        vector_position = self.advance().start
        self.expect("<")
        shape: list[int] = []
        scalable: list[bool] = []
        while True:
            position = self.token.start
            scalable_dim = self.text.startswith("[", position)
            match = VECTOR_DIMENSION.match(self.text, position)
            if match is None:
                break
            shape.append(self.dimension_size(match.group(1), position))
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
                type_ = parse_quant_type(cast("Parser", self))  # quant_syntax reads only tokens
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
