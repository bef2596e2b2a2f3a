"""The lexer under the IR text parser: tokens read one at a time from positions in one buffer.

NOTE: there is no token list. Every parse function asks for the token at a position, so a dialect body
(the `<...>` of `!quant.uniform<...>`) is parsed in place, with a narrowed `limit`, and its errors point at
the right line and column. Token kinds follow MLIR's Lexer (mlir/lib/AsmParser/Lexer.cpp):

    bare-id        ::= (letter | `_`) (letter | digit | `_` | `$` | `.`)*
    ssa-id         ::= `%` suffix-id            caret-id ::= `^` suffix-id
    symbol-ref-id  ::= `@` (suffix-id | string-literal)
    hash-id        ::= `#` suffix-id            bang-id  ::= `!` bare-id-with-dashes
    string-literal ::= `"` ([^"\\\n] | `\\` any)* `"`
    float-literal  ::= digit+ `.` digit* ([eE] [-+]? digit+)?
    integer        ::= `0x` hex-digit+ | digit+
    punctuation    ::= `->` | `{-#` | `#-}` | one of `(){}[]<>,:=?*+-|`

Whitespace and `//` comments separate tokens.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import NamedTuple

from qconvert.errors import Diagnostic, Location, ParseError
from qconvert.ir.float_format import bits_to_float

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
NEWLINE = re.compile("\n")
SKIP = re.compile(r"(?:\s+|//[^\n]*)*")
# SKIP then TOKEN in a single match. The skip is possessive (`*+`): a token can never start inside what
# was skipped (a comment's text must not become tokens when no token follows it).
LEX = re.compile(r"\s*+(?://[^\n]*+\s*+)*+(?:" + TOKEN.pattern + ")", re.VERBOSE)
_lex_match = LEX.match
# The fast path of `Lexer._lex`: punctuation that starts no longer token (not `-` of `->`, not `{` of
# `{-#`), and the alternatives of `TOKEN` that a first character selects, in `TOKEN`'s order.
SIMPLE_PUNCTUATION = frozenset("()}[]<>,:=?*+|")
_PERCENT = re.compile(r"(?P<percent>%[a-zA-Z0-9_$.\-]+)").match
_BARE = re.compile(r"(?P<bare>[a-zA-Z_][a-zA-Z0-9_$.]*)").match
_NUMBER = re.compile(
    r"(?P<float>[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?)|(?P<integer>0x[0-9a-fA-F]+|[0-9]+)"
).match
# First character -> (kind, or None to take the group's name; the `match` of the alternatives it starts).
TOKEN_BY_FIRST_CHARACTER: dict[str, tuple[str | None, Callable[[str, int, int], re.Match[str] | None]]] = {
    "%": ("percent", _PERCENT),
    **dict.fromkeys("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_", ("bare", _BARE)),
    **dict.fromkeys("0123456789", (None, _NUMBER)),
}


# Python refuses int <-> str conversions of more than 4,300 decimal digits (sys.get_int_max_str_digits) and
# the printer must write back what the parser read: a literal of more digits is "integer value too large".
MAX_DECIMAL_DIGITS = 4_000
MAX_HEX_DIGITS = 3_300  # 13,200 bits: printed in decimal, under MAX_DECIMAL_DIGITS digits
# How deeply regions may nest, and apart from them types, attributes and brackets (MLIR has no limit; its
# C++ stack has one). Each level takes a few Python frames in the parser, the verifier, the passes and the
# printer: both limits at once stay below Python's recursion limit, and no real module comes close.
MAX_NESTING = 64


def integer_literal_value(text: str) -> int | None:
    """The value of an integer token, `0x` hex or decimal, or None when it has too many digits.

    Decimal literals may have leading zeros (`01` is 1, as MLIR reads it: base 10, not octal).
    """
    if text.startswith("0x"):
        return int(text, 16) if len(text) - 2 <= MAX_HEX_DIGITS else None
    digits = text.lstrip("0")
    return int(digits or "0") if len(digits) <= MAX_DECIMAL_DIGITS else None


def integer_width(digits: str) -> int:
    """The width written after `i`, `si`, `ui` or `u`: 1 << 30 (above any width allowed) when it has too
    many digits to be one; the caller reports the width as invalid."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 9 else 1 << 30


class Token(NamedTuple):
    kind: str
    text: str
    start: int
    end: int


new_token = tuple.__new__


class SourceText:
    """One buffer, its file name and the lines before it: turns a character offset into a `Location`.

    Ops keep `(source, offset)` and ask for their location only when a diagnostic needs it, so the
    index of line starts is built at the first request, not while parsing.
    """

    __slots__ = ("text", "filename", "line_offset", "_line_starts")

    def __init__(self, text: str, filename: str, line_offset: int) -> None:
        self.text = text
        self.filename = filename
        self.line_offset = line_offset
        self._line_starts: list[int] | None = None

    def location(self, position: int) -> Location:
        starts = self._line_starts
        if starts is None:
            starts = self._line_starts = [0, *(match.end() for match in NEWLINE.finditer(self.text))]
        line = bisect_right(starts, position)  # the line holding `position`, 1-based
        return Location(self.filename, line + self.line_offset, position - starts[line - 1] + 1)


class Lexer:
    """The token at the current position of one source buffer, and the helpers that read simple tokens.

    The parsers of types, attributes and ops (`TypeParser`, `AttributeParser`, `Parser`) build on it.
    """

    def __init__(self, text: str, filename: str = "-", *, line_offset: int = 0) -> None:
        self.text = text
        self.filename = filename
        self.line_offset = line_offset
        self.limit = len(text)
        self.source = SourceText(text, filename, line_offset)
        self.nesting = 0  # open types, attributes and brackets being parsed (see `enter_nesting`)
        self.token = self._lex(0)

    # Lexing --------------------------------------------------------------------------------------
    def _lex(self, position: int) -> Token:
        """The token at `position` (after whitespace and comments), or `eof` at `limit`.

        One space, simple punctuation, `%name`, bare identifiers and numbers (most tokens of a module) take
        a path that looks at the first character; anything else, and any comment, takes `LEX`. Both give
        the same token: a first character decides which of `TOKEN`'s alternatives can match.
        """
        text = self.text
        limit = self.limit
        if position < limit:
            char = text[position]
            if char == " ":  # one space, as between most tokens
                position += 1
                char = text[position] if position < limit else ""
            if char in SIMPLE_PUNCTUATION:
                return new_token(Token, ("punct", char, position, position + 1))
            kind_and_pattern = TOKEN_BY_FIRST_CHARACTER.get(char)
            if kind_and_pattern is not None:
                kind, pattern = kind_and_pattern
                match = pattern(text, position, limit)
                if match is not None:
                    end = match.end()
                    return new_token(Token, (kind or match.lastgroup, text[position:end], position, end))
        return self._lex_any(position)

    def _lex_any(self, position: int) -> Token:
        match = _lex_match(self.text, position, self.limit)
        if match is None:
            position = skip_end(self.text, position)
            if position >= self.limit:
                return new_token(Token, ("eof", "", self.limit, self.limit))
            return new_token(Token, ("error", self.text[position], position, position + 1))
        kind = match.lastgroup
        text = match[kind]  # type: ignore[index]
        end = match.end()
        return new_token(Token, (kind, text, end - len(text), end))

    def advance(self) -> Token:
        token = self.token
        self.token = self._lex(token.end)
        return token

    def reset(self, position: int) -> None:
        self.token = self._lex(position)

    def location(self, position: int | None = None) -> Location:
        """The `file:line:col` of `position` (by default, of the current token)."""
        return self.source.location(self.token.start if position is None else position)

    def error(
        self, message: str, position: int | None = None, related: Sequence[Diagnostic] = ()
    ) -> ParseError:
        return ParseError(message, self.location(position), tuple(related))

    # Nesting ---------------------------------------------------------------------------------------
    def enter_nesting(self, position: int | None = None) -> None:
        """One level deeper (a nested type, attribute or bracket); pair with `exit_nesting` in a `finally`.

        Past MAX_NESTING levels this is a diagnostic at `position` rather than Python's RecursionError.
        """
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"nesting too deep (more than {MAX_NESTING} levels)", position)

    def exit_nesting(self) -> None:
        self.nesting -= 1

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
        value = integer_literal_value(self.advance().text)
        if value is None:
            raise self.error("integer value too large", start)
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


def skip_end(text: str, position: int) -> int:
    """Where the whitespace and comments starting at `position` end."""
    return SKIP.match(text, position).end()  # pyright: ignore[reportOptionalMemberAccess]  (`*` matches)


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
