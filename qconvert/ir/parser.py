"""Parses MLIR's textual syntax into the IR: ops, blocks, regions, SSA values and the top level of a file.

The layers, one noun each: `lexer` (tokens), `type_parser` (types), `attribute_parser` (attributes), and
this module (operations). `Parser` is all of them; dialect ops' `parse_custom(parser, ...)` receive it.
Messages are upstream's (mlir/lib/AsmParser) wherever the rule is upstream's.

    toplevel        ::= (operation | type-alias-def | attribute-alias-def | file-metadata)*
    operation       ::= (op-result (`,` op-result)* `=`)? (generic-operation | custom-operation) trailing-loc?
    op-result       ::= ssa-id (`:` integer)?
    generic-operation ::= string-literal `(` value-use-list? `)` (`<` attr-dict `>`)?
                          (`(` region (`,` region)* `)`)? attr-dict? `:` function-type
    custom-operation ::= bare-id custom-operation-format
    region          ::= `{` entry-block? block* `}`
    block           ::= caret-id (`(` ssa-id `:` type (`,` ssa-id `:` type)* `)`)? `:` operation*
    value-use       ::= ssa-id (`#` digit+)?
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np

from qconvert.errors import InputError, QConvertError
from qconvert.ir import dialects as _dialects  # noqa: F401  (registers every op)
from qconvert.ir.attribute_parser import AttributeParser
from qconvert.ir.attributes import Attribute, DenseResourceAttr, DictionaryAttr, LazyElements
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
from qconvert.ir.lexer import (
    MAX_NESTING,
    SIMPLE_PUNCTUATION,
    Token,
    new_token,
    split_top_level,
    unescape_string,
)
from qconvert.ir.type_parser import numpy_dtype
from qconvert.ir.types import FloatType, IntegerType, RankedTensorType, Type

__all__ = [
    "OperandReference",
    "Parser",
    "ParserOptions",
    "numpy_dtype",
    "parse_module",
    "parse_type",
    "split_top_level",
    "unescape_string",
]

# `%name = op.name %operand?` (one result, whitespace only in between): the three or four tokens
# parse_operation would lex, in one match. Anything else (`%a:2`, `%a, %b`, comments, a generic op) takes
# the token-by-token path.
RESULT_AND_OP_NAME = re.compile(
    r"%[a-zA-Z0-9_$.\-]+\s*=\s*([a-zA-Z_][a-zA-Z0-9_$.]*)(?:\s*(%[a-zA-Z0-9_$.\-]+))?"
)


class OperandReference(NamedTuple):
    """A use of `%name` or `%name#index` not yet resolved to a value (its type comes later)."""

    name: str
    index: int  # pyright: ignore[reportIncompatibleMethodOverride]  (a field, not tuple.index)
    start: int


@dataclass(frozen=True, slots=True)
class ParserOptions:
    allow_unregistered_dialect: bool = False


class Parser(AttributeParser):
    """Recursive-descent parser over one source buffer (or one `--split-input-file` chunk of it)."""

    def __init__(
        self, text: str, filename: str = "-", *, line_offset: int = 0, options: ParserOptions | None = None
    ) -> None:
        super().__init__(text, filename, line_offset=line_offset)
        self.options = options or ParserOptions()
        self.value_scopes: list[dict[str, Sequence[Value]] | None] = []  # by SSA name
        self.default_dialects: list[str] = ["builtin"]
        # `dense_resource` blobs of the file-metadata section: name -> (start, end) of the hex digits
        # after `0x` in `text` (decoded on first use), and the attributes that refer to them.
        self.resources: dict[str, tuple[int, int]] = {}
        self.resource_attributes: list[tuple[DenseResourceAttr, int]] = []
        self._resource_elements: dict[tuple[str, Type], LazyElements] = {}
        self.region_nesting = 0  # regions open around the current op, the implicit module's included

    # Symbols and operands ----------------------------------------------------------------------------
    def parse_operand_reference(self) -> OperandReference:
        token = self.token
        if token.kind != "percent":
            raise self.error("expected SSA operand")
        end = token.end
        char = self.text[end : end + 1]
        if char in SIMPLE_PUNCTUATION and end < self.limit:  # `%a,` `%a)`: `_lex`'s first step, inlined
            self.token = new_token(Token, ("punct", char, end, end + 1))
            return new_token(OperandReference, (token.text, 0, token.start))  # type: ignore[return-value]
        following = self.token = self._lex(end)
        index = 0
        if following.kind == "hash" and following.start == token.end and following.text[1:].isdigit():
            digits = following.text[1:].lstrip("0") or "0"
            if len(digits) > 9:
                raise self.error("invalid SSA value result number", following.start)
            index = int(self.advance().text[1:])
        return new_token(OperandReference, (token.text, index, token.start))  # type: ignore[return-value]

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
            values = scope.get(reference.name)
            if values is not None and reference.index < len(values):
                return values[reference.index]
        for scope in reversed(self.value_scopes):
            if scope is None:
                break
            values = scope.get(reference.name)
            if values is not None:
                if reference.index >= len(values):
                    raise self.error("reference to invalid result number", reference.start)
                return values[reference.index]
        raise self.error("use of undeclared SSA value name", reference.start)

    def resolve_operand(self, reference: OperandReference, type_: Type) -> Value:
        scope = self.value_scopes[-1]
        values = scope.get(reference.name) if scope is not None else None
        if values is not None and reference.index < len(values):  # lookup_value's common case, inlined
            value = values[reference.index]
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

    def define_values(self, name: str, values: Sequence[Value], position: int) -> None:
        scope = self.value_scopes[-1]
        assert scope is not None
        if name in scope:
            raise self.error(f"redefinition of SSA value '{name}'", position)
        scope[name] = values

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
        # Counted apart from types and attributes, which alias definitions can move into or out of regions.
        self.region_nesting += 1
        try:
            if self.region_nesting > MAX_NESTING:
                raise self.error(f"regions nested too deep (more than {MAX_NESTING} levels)")
            return self._parse_region(owner, entry_arguments)
        finally:
            self.region_nesting -= 1

    def _parse_region(
        self, owner: Operation, entry_arguments: Sequence[tuple[str, Type, int]] | None
    ) -> Region:
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
        if token.kind == "percent":  # `%name = dialect.op ...`: most ops of a module, in one regex
            fast = RESULT_AND_OP_NAME.match(self.text, token.start, self.limit)
            if fast is not None:
                cls = OP_REGISTRY.get(fast[1])
                if cls is not None and cls.has_custom_syntax:
                    return self._parse_custom_operation_with_result(token, cls, fast)
        return self._parse_operation(token)

    def _parse_custom_operation_with_result(
        self, result: Token, cls: type[Operation], fast: re.Match[str]
    ) -> Operation:
        """`parse_operation` for one result and a registered op name (no default dialect needed)."""
        operand = fast[2]
        if operand is not None:  # the first operand's token, already matched
            start, end = fast.span(2)
            self.token = new_token(Token, ("percent", operand, start, end))
        else:
            self.token = self._lex(fast.end(1))
        op = cls.parse_custom(self, 1)
        op._location = fast.start(1)  # an offset: see `Operation.location`
        op._source = self.source
        token = self.token
        if token.kind == "bare" and token.text == "loc" and self.text.startswith("(", token.end):
            self._skip_location()
        results = op.results
        if len(results) != 1:
            raise self.error(
                f"operation defines {len(results)} results but was provided 1 to bind", result.start
            )
        scope = self.value_scopes[-1]
        assert scope is not None
        if result.text in scope:
            raise self.error(f"redefinition of SSA value '{result.text}'", result.start)
        scope[result.text] = results
        return op

    def _parse_operation(self, token: Token) -> Operation:
        """`parse_operation` for any number of results (token by token), generic ops and short names."""
        start = token.start
        result_groups: list[tuple[str, int, int]] = []
        num_results = 0
        if token.kind == "percent":
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
        op._location = op_start  # an offset: see `Operation.location`
        op._source = self.source
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
                self._parse_file_metadata()
            else:
                # A bare op is in the module the printer writes around it: one region deep, as the ops of
                # an explicit top-level module are, so printed text parses at the depth its source did.
                explicit_module = token.text in ("module", '"builtin.module"')
                self.region_nesting = 0 if explicit_module else 1
                ops.append(self.parse_operation())
        self._bind_resources()
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

    # File metadata: `{-# dialect_resources: {builtin: {name: "0x..."}} #-}` -----------------------------
    def _parse_file_metadata(self) -> None:
        """Record where each `builtin` resource blob lies (no bytes are decoded here); other dialects'
        resources and `external_resources` are skipped."""
        start = self.token.start
        end = self.text.find("#-}", start, self.limit)
        if end < 0:
            raise self.error("expected '#-}' to end file metadata")
        text = self.text
        section = _DIALECT_RESOURCES.search(text, start + 3, end)
        builtin = _BUILTIN_RESOURCES.search(text, section.end(), end) if section else None
        if builtin is not None:
            position = builtin.end()
            while True:
                closing = _CLOSE_BRACE.match(text, position, end)
                if closing:
                    break
                entry = _RESOURCE_ENTRY.match(text, position, end)
                if entry is None:
                    raise self.error('expected a resource entry `name: "0x..."`', position)
                name = entry["bare"] or unescape_string(entry["quoted"])
                if name in self.resources:
                    raise self.error(f"redefinition of resource '{name}'", entry.start(1))
                quote = text.find('"', entry.end(), end)
                if quote < 0:
                    raise self.error("expected '\"' to end the resource blob", entry.end())
                self.resources[name] = (entry.end(), quote)
                position = quote + 1
                separator = _COMMA.match(text, position, end)
                if separator:
                    position = separator.end()
                elif not _CLOSE_BRACE.match(text, position, end):
                    raise self.error("expected ',' or '}' after a resource blob", position)
        self.reset(end + 3)

    def resource_elements(self, name: str, type_: Type) -> LazyElements | None:
        if name == ELIDED_RESOURCE:
            return None
        dtype = resource_dtype(type_)
        if dtype is None:
            return None
        key = (name, type_)
        elements = self._resource_elements.get(key)
        if elements is None:
            shape = tuple(type_.shape)  # type: ignore[attr-defined]
            elements = LazyElements(
                shape, dtype, partial(_decode_blob, self.text, self.resources, name, dtype, shape)
            )
            self._resource_elements[key] = elements
        return elements

    def _parse_dense_resource(self) -> DenseResourceAttr:
        start = self.token.start
        attribute = super()._parse_dense_resource()
        if attribute.elements is not None:
            self.resource_attributes.append((attribute, start))
        return attribute

    def _bind_resources(self) -> None:
        """Check each blob's size against its type; a name the file has no blob for stays without data
        (as in MLIR, which parses it and prints it back without a resource section)."""
        for attribute, start in self.resource_attributes:
            span = self.resources.get(attribute.name)
            if span is None:
                object.__setattr__(attribute, "elements", None)  # still private to this parser
                continue
            elements = attribute.elements
            assert elements is not None
            expected = int(np.prod(elements.shape, dtype=np.int64)) * elements.dtype.itemsize
            digits = span[1] - span[0] - 8  # after the 4-byte alignment prefix
            if digits != 2 * expected:
                raise self.error(
                    f"resource '{attribute.name}' holds {max(digits, 0) // 2} bytes, but its type "
                    f"{attribute.type} needs {expected}",
                    start,
                )


ELIDED_RESOURCE = "__elided__"
_DIALECT_RESOURCES = re.compile(r"(?<![\w$.])dialect_resources\s*:\s*\{")
_BUILTIN_RESOURCES = re.compile(r"(?<![\w$.])builtin\s*:\s*\{")
_RESOURCE_ENTRY = re.compile(r'\s*(?:(?P<bare>[a-zA-Z_][\w$.]*)|"(?P<quoted>(?:[^"\\]|\\.)*)")\s*:\s*"0x')
_CLOSE_BRACE = re.compile(r"\s*\}")
_COMMA = re.compile(r"\s*,")


def resource_dtype(type_: Type) -> np.dtype | None:
    """The numpy dtype of a `dense_resource` blob's elements, or None when the type cannot have one
    here: a static-shaped tensor of whole-byte integers (i8..i64) or floats (f16, bf16, f32, f64, f8*)."""
    if not isinstance(type_, RankedTensorType) or any(d < 0 for d in type_.shape):
        return None
    element = type_.element_type
    if isinstance(element, IntegerType):
        return numpy_dtype(element) if element.width in (8, 16, 32, 64) else None
    if isinstance(element, FloatType):
        try:
            dtype = numpy_dtype(element)
        except QConvertError:
            return None
        return dtype if dtype.itemsize * 8 == _FLOAT_WIDTHS.get(element.name, 0) else None
    return None


_FLOAT_WIDTHS = {
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "f64": 64,
    "f8E5M2": 8,
    "f8E4M3": 8,
    "f8E4M3FN": 8,
    "f8E5M2FNUZ": 8,
    "f8E4M3FNUZ": 8,
    "f8E4M3B11FNUZ": 8,
    "f8E3M4": 8,
    "f8E8M0FNU": 8,
}


def _decode_blob(
    text: str, resources: dict[str, tuple[int, int]], name: str, dtype: np.dtype, shape: tuple[int, ...]
) -> np.ndarray:
    span = resources.get(name)
    if span is None:
        raise InputError(f"dense_resource<{name}>: the file has no resource blob of that name")
    try:
        data = bytes.fromhex(text[span[0] + 8 : span[1]])
    except ValueError:
        raise InputError(f"resource '{name}': the blob is not hexadecimal") from None
    return np.frombuffer(data, dtype=dtype).reshape(shape)


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
