"""Prints IR in MLIR's textual syntax, byte-identical to upstream's AsmPrinter for what we model.

NOTE: value names follow upstream's SSANameState: a region's own values are named first, nested regions
after, with counters carried in from the parent; `%cst_0`-style suffixes come from one conflict counter.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import IO

import numpy as np

from qconvert.atomic_file import atomic_text_file
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
from qconvert.ir.core import Block, Operation, Region, Value, gc_paused
from qconvert.ir.float_format import format_float
from qconvert.ir.quant_types import (
    AnyQuantizedType,
    CalibratedQuantizedType,
    QuantileQuantizedType,
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
)
from qconvert.ir.types import (
    DYNAMIC,
    FloatType,
    FunctionType,
    IndexType,
    IntegerType,
    NoneType,
    OpaqueType,
    RankedTensorType,
    Type,
    UnrankedTensorType,
    VectorType,
)

BARE_IDENTIFIER = re.compile(r"[a-zA-Z_][a-zA-Z0-9_$.]*\Z")
NAME_CHARACTERS = re.compile(r"[^a-zA-Z0-9_$.\-]")


# Types ------------------------------------------------------------------------------------------
def print_type(type_: Type) -> str:
    """The MLIR spelling of a type (quant types spelled out in full: the dialect defines no aliases)."""
    if isinstance(type_, FloatType):
        return type_.name
    if isinstance(type_, IntegerType):
        return f"{type_.signedness.value}i{type_.width}"
    if isinstance(type_, RankedTensorType):
        dims = "".join(("?" if d == DYNAMIC else str(d)) + "x" for d in type_.shape)
        encoding = f", {print_attribute(type_.encoding)}" if type_.encoding is not None else ""
        return f"tensor<{dims}{print_type(type_.element_type)}{encoding}>"
    if isinstance(type_, UnrankedTensorType):
        return f"tensor<*x{print_type(type_.element_type)}>"
    if isinstance(type_, IndexType):
        return "index"
    if isinstance(type_, QuantizedType | CalibratedQuantizedType | QuantileQuantizedType):
        return print_quant_type(type_)
    if isinstance(type_, FunctionType):
        return f"({', '.join(map(print_type, type_.inputs))}) -> {print_function_results(type_.results)}"
    if isinstance(type_, VectorType):
        dims = "".join(
            (f"[{d}]" if (type_.scalable and type_.scalable[i]) else str(d)) + "x"
            for i, d in enumerate(type_.shape)
        )
        return f"vector<{dims}{print_type(type_.element_type)}>"
    if isinstance(type_, NoneType):
        return "none"
    if isinstance(type_, OpaqueType):
        return f"!{type_.body}"
    raise TypeError(f"no printer for type {type_!r}")


def print_function_results(results: Sequence[Type]) -> str:
    if len(results) == 1 and not isinstance(results[0], FunctionType):
        return print_type(results[0])
    return f"({', '.join(map(print_type, results))})"


def print_storage_spec(type_: QuantizedType | QuantileQuantizedType) -> str:
    """storage-spec ::= storage-type (`<` min `:` max `>`)?  (bounds only when narrower than the type's)."""
    text = type_.storage_type_spelling
    if isinstance(type_, QuantizedType) and type_.has_storage_type_bounds:
        text += f"<{type_.storage_type_min}:{type_.storage_type_max}>"
    return text


def print_scale_zero_point(scale: float, zero_point: int, float_type: str = "f64") -> str:
    """scale-zero ::= scale (`:` zero-point)?  (a zero point of 0 is left out)."""
    text = format_float(scale, float_type)
    return f"{text}:{zero_point}" if zero_point else text


def print_quant_type(type_: Type) -> str:
    if isinstance(type_, UniformQuantizedType):
        return (
            f"!quant.uniform<{print_storage_spec(type_)}:{print_type(type_.expressed_type)}, "  # type: ignore[arg-type]
            f"{print_scale_zero_point(type_.scale, type_.zero_point)}>"
        )
    if isinstance(type_, UniformQuantizedPerAxisType):
        params = ",".join(map(print_scale_zero_point, type_.scales, type_.zero_points))
        return (
            f"!quant.uniform<{print_storage_spec(type_)}:{print_type(type_.expressed_type)}:"  # type: ignore[arg-type]
            f"{type_.quantized_dimension}, {{{params}}}>"
        )
    if isinstance(type_, UniformQuantizedSubChannelType):
        blocks = ", ".join(f"{a}:{b}" for a, b in type_.block_size_info)
        return (
            f"!quant.uniform<{print_storage_spec(type_)}:{print_type(type_.expressed_type)}:"  # type: ignore[arg-type]
            f"{{{blocks}}}, {print_dense_quant_parameters(type_)}>"
        )
    if isinstance(type_, AnyQuantizedType):
        expressed = f":{print_type(type_.expressed_type)}" if type_.expressed_type is not None else ""
        return f"!quant.any<{print_storage_spec(type_)}{expressed}>"
    if isinstance(type_, CalibratedQuantizedType):
        return (
            f"!quant.calibrated<{print_type(type_.expressed_type)}"
            f"<{format_float(type_.min)}:{format_float(type_.max)}>>"
        )
    if isinstance(type_, QuantileQuantizedType):
        values = ",".join(format_float(v) for v in type_.quantiles)
        text = (
            f"!quant.quantile<{type_.storage_type_spelling}:{print_type(type_.quantile_type)}, {{{values}}}"
        )
        if type_.has_explicit_range:  # upstream prints bounds whenever they were written
            text += f", <{type_.storage_type_min}:{type_.storage_type_max}>"
        return text + ">"
    raise TypeError(f"no printer for type {type_!r}")


def print_dense_quant_parameters(type_: UniformQuantizedSubChannelType) -> str:
    """scale-zero-tensor: nested braces, one level per dimension of the scales table, `", "` between."""
    float_type = type_.expressed_type.name  # type: ignore[union-attr]
    scales = type_.scales.array.reshape(-1)
    zero_points = type_.zero_points.array.reshape(-1)
    elements = [
        print_scale_zero_point(float(s), int(z), float_type) for s, z in zip(scales, zero_points, strict=True)
    ]
    return nest(elements, type_.scales.shape, ", ", "{", "}")


def nest(elements: Sequence[str], shape: Sequence[int], separator: str, open_: str, close: str) -> str:
    """Join flat elements into nested brackets following `shape` (row-major)."""
    if not shape:
        return elements[0]
    if len(shape) == 1:
        return open_ + separator.join(elements) + close
    stride = len(elements) // shape[0] if shape[0] else 0
    inner = [
        nest(elements[i * stride : (i + 1) * stride], shape[1:], separator, open_, close)
        for i in range(shape[0])
    ]
    return open_ + separator.join(inner) + close


# Attributes -------------------------------------------------------------------------------------
def print_attribute(attribute: Attribute, aliases: dict[Attribute, str] | None = None) -> str:
    """The MLIR spelling of an attribute; affine maps use their `#map` alias when `aliases` has one."""
    if isinstance(attribute, IntegerAttr):
        return f"{attribute.value} : {print_type(attribute.type)}"
    if isinstance(attribute, FloatAttr):
        return f"{format_float(attribute.value, attribute.type.name)} : {print_type(attribute.type)}"  # type: ignore[attr-defined]
    if isinstance(attribute, StringAttr):
        return quote_string(attribute.value)
    if isinstance(attribute, BoolAttr):
        return "true" if attribute.value else "false"
    if isinstance(attribute, TypeAttr):
        return print_type(attribute.value)
    if isinstance(attribute, ArrayAttr):
        return "[" + ", ".join(print_attribute(e, aliases) for e in attribute.elements) + "]"
    if isinstance(attribute, DictionaryAttr):
        return print_attribute_dict(dict(attribute.entries), aliases)
    if isinstance(attribute, AffineMapAttr):
        if aliases is not None and attribute in aliases:
            return aliases[attribute]
        return attribute.text
    if isinstance(attribute, SymbolRefAttr):
        return "::".join(print_symbol_name(s) for s in (attribute.root, *attribute.nested))
    if isinstance(attribute, DenseElementsAttr):
        return f"dense<{print_dense_elements(attribute)}> : {print_type(attribute.type)}"
    if isinstance(attribute, DenseArrayAttr):
        if not attribute.values:
            return f"array<{print_type(attribute.element_type)}>"
        if isinstance(attribute.element_type, FloatType):
            values = ", ".join(format_float(v, attribute.element_type.name) for v in attribute.values)
        elif attribute.element_type == IntegerType(1):
            values = ", ".join("true" if v else "false" for v in attribute.values)
        else:
            values = ", ".join(map(str, attribute.values))
        return f"array<{print_type(attribute.element_type)}: {values}>"
    if isinstance(attribute, DenseResourceAttr):
        if attribute.elements is not None and _resource_sinks:
            _resource_sinks[-1].setdefault(attribute.name, attribute.elements)
        return f"dense_resource<{attribute.name}> : {print_type(attribute.type)}"
    if isinstance(attribute, UnitAttr):
        return "unit"
    if isinstance(attribute, OpaqueAttr):
        return attribute.text
    raise TypeError(f"no printer for attribute {attribute!r}")


def print_attribute_dict(
    attributes: dict[str, Attribute], aliases: dict[Attribute, str] | None = None
) -> str:
    """`{a = 1 : i64, b}` with entries sorted by name; unit attributes print as the bare name."""
    parts = []
    for key in sorted(attributes):
        value = attributes[key]
        name = key if BARE_IDENTIFIER.match(key) else quote_string(key)
        parts.append(name if isinstance(value, UnitAttr) else f"{name} = {print_attribute(value, aliases)}")
    return "{" + ", ".join(parts) + "}"


def print_symbol_name(name: str) -> str:
    return "@" + (name if BARE_IDENTIFIER.match(name) else quote_string(name))


def quote_string(text: str) -> str:
    """MLIR's printEscapedString: printable ASCII as is, `\\` doubled, everything else as `\\XX` hex bytes."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char == "\\":
            out.append("\\\\")
        elif 0x20 <= byte < 0x7F and char != '"':
            out.append(char)
        else:
            out.append(f"\\{byte:02X}")
    return '"' + "".join(out) + '"'


def print_dense_elements(attribute: DenseElementsAttr) -> str:
    """The body of `dense<...>`: a splat value, or nested lists following the tensor shape."""
    array = attribute.array
    element_type = attribute.type.element_type  # type: ignore[attr-defined]
    flat = array.reshape(-1)
    if flat.size == 0:
        return "[]" if array.ndim else ""
    if attribute.is_splat:
        return print_element(flat[0], element_type)
    elements = [print_element(v, element_type) for v in flat]
    if array.ndim == 0:
        return elements[0]
    return nest(elements, array.shape, ", ", "[", "]")


def print_element(value: object, element_type: Type) -> str:
    if isinstance(element_type, FloatType):
        return format_float(float(value), element_type.name)  # type: ignore[arg-type]
    if isinstance(element_type, IntegerType):
        if element_type.width == 1:
            return "true" if value else "false"
        integer = int(value)  # type: ignore[call-overload]
        # Signless integers print signed, as MLIR's APInt does: 200 held in an i8 prints -56.
        if not element_type.is_unsigned and integer >= 1 << (element_type.width - 1):
            integer -= 1 << element_type.width
        return str(integer)
    return str(int(value))  # type: ignore[call-overload]


def collect_affine_map_aliases(ops: Iterable[Operation]) -> dict[Attribute, str]:
    """`#map`, `#map1`, ... for every affine map in the IR, numbered in order of first appearance."""
    aliases: dict[Attribute, str] = {}

    def visit(attribute: Attribute) -> None:
        if isinstance(attribute, AffineMapAttr):
            if attribute not in aliases:
                aliases[attribute] = "#map" + (str(len(aliases)) if aliases else "")
        elif isinstance(attribute, ArrayAttr):
            for element in attribute.elements:
                visit(element)
        elif isinstance(attribute, DictionaryAttr):
            for _, element in attribute.entries:
                visit(element)

    def visit_op(op: Operation) -> None:  # Operation.walk's pre-order, without a generator per op
        if op.attributes:
            for attribute in op.attributes.values():
                visit(attribute)
        for region in op.regions:
            for block in region.blocks:
                for nested in block.ops:
                    visit_op(nested)

    for top in ops:
        visit_op(top)
    return aliases


# Operations -------------------------------------------------------------------------------------
UNKNOWN_VALUE = "<<UNKNOWN SSA VALUE>>"  # upstream's text for a value defined outside what is printed
DEFAULT_RESULT_NAMES = Operation.result_names  # an op class that keeps it asks for no `%name` hints


class NameScope:
    """Upstream's SSANameState counters for one region being named."""

    __slots__ = ("next_value_id", "next_argument_id", "next_conflict_id", "used")

    def __init__(
        self, next_value_id: int, next_argument_id: int, next_conflict_id: int, used: set[str]
    ) -> None:
        self.next_value_id = next_value_id
        self.next_argument_id = next_argument_id
        self.next_conflict_id = next_conflict_id
        self.used = used


class Printer:
    """Prints one top-level op (usually `builtin.module`) with MLIR's names, aliases and indentation."""

    def __init__(self, aliases: dict[Attribute, str] | None = None) -> None:
        self.parts: list[str] = []
        self.names: dict[Value, str] = {}
        self.block_names: dict[Block, str] = {}
        self.indent = 0
        self.aliases = aliases or {}
        self.default_dialects: list[str] = []
        self.type_cache: dict[int, tuple[Type, str]] = {}
        self.attribute_cache: dict[int, tuple[Attribute, str]] = {}

    # Naming ----------------------------------------------------------------------------------
    def name_values(self, op: Operation) -> None:
        """Assign every value under `op` its name, in upstream's order."""
        root = NameScope(0, 0, 0, set())
        self._name_op_results(op, root)
        stack: list[tuple[Region, int, int, int, set[str]]] = [
            (region, root.next_value_id, root.next_argument_id, root.next_conflict_id, root.used)
            for region in op.regions
        ]
        while stack:
            region, value_id, argument_id, conflict_id, parent_used = stack.pop()
            scope = NameScope(value_id, argument_id, conflict_id, set(parent_used))
            self._name_region(region, scope)
            for block in region.blocks:
                for nested_op in block.ops:
                    for nested in nested_op.regions:
                        stack.append(
                            (
                                nested,
                                scope.next_value_id,
                                scope.next_argument_id,
                                scope.next_conflict_id,
                                scope.used,
                            )
                        )

    def _unique(self, name: str, scope: NameScope) -> str:
        name = NAME_CHARACTERS.sub("_", name)
        if name[:1].isdigit():
            name = "_" + name
        if name not in scope.used:
            scope.used.add(name)
            return name
        while True:
            probe = f"{name}_{scope.next_conflict_id}"
            scope.next_conflict_id += 1
            if probe not in scope.used:
                scope.used.add(probe)
                return probe

    def _name_region(self, region: Region, scope: NameScope) -> None:
        owner = region.parent
        for block_index, block in enumerate(region.blocks):
            self.block_names[block] = f"^bb{block_index}"
            hints = None
            if block_index == 0 and owner is not None:
                hints = owner.block_argument_names(owner.regions.index(region))
            for index, argument in enumerate(block.arguments):
                hint = hints[index] if hints is not None and index < len(hints) else None
                if hint:
                    self.names[argument] = "%" + self._unique(hint, scope)
                elif block_index == 0:
                    self.names[argument] = f"%arg{scope.next_argument_id}"
                    scope.next_argument_id += 1
                else:  # upstream keeps `%argN` for entry blocks; other blocks' arguments are numbered
                    self.names[argument] = f"%{scope.next_value_id}"
                    scope.next_value_id += 1
            for op in block.ops:
                self._name_op_results(op, scope)

    def _name_op_results(self, op: Operation, scope: NameScope) -> None:
        if not op.results:
            return
        if op.result_name_hint is None and type(op).result_names is DEFAULT_RESULT_NAMES:
            hints: Sequence[str | None] = ()  # no hints (most ops): numbered, without asking
        else:
            hints = op.result_names()
        if hints and all(hints) and len(hints) == len(op.results):
            for result, hint in zip(op.results, hints, strict=True):
                self.names[result] = "%" + self._unique(hint, scope)  # type: ignore[arg-type]
            return
        number = scope.next_value_id
        scope.next_value_id += 1
        if len(op.results) == 1:
            self.names[op.results[0]] = f"%{number}"
        else:
            for index, result in enumerate(op.results):
                self.names[result] = f"%{number}#{index}"

    # Helpers used by the ops' print_custom -----------------------------------------------------
    def write(self, text: str) -> None:
        self.parts.append(text)

    def value_name(self, value: Value) -> str:
        name = self.names.get(value)
        return name if name is not None else "<<UNKNOWN SSA VALUE>>"

    def operand_list(self, values: Sequence[Value]) -> str:
        names = self.names  # value_name, inlined (no value is named None)
        if len(values) == 2:  # binary ops
            return names.get(values[0], UNKNOWN_VALUE) + ", " + names.get(values[1], UNKNOWN_VALUE)
        return ", ".join([names.get(v, UNKNOWN_VALUE) for v in values])

    def type_text(self, type_: Type) -> str:
        cached = self.type_cache.get(id(type_))
        if cached is not None:
            return cached[1]
        text = print_type(type_)
        self.type_cache[id(type_)] = (type_, text)  # keep the type alive so its id stays unique
        return text

    def type_list(self, types: Sequence[Type]) -> str:
        return ", ".join([self.type_text(t) for t in types])

    def attribute_text(self, attribute: Attribute) -> str:
        """Cached by identity, as `type_text` is (the parser shares one object per repeated constant)."""
        cached = self.attribute_cache.get(id(attribute))
        if cached is not None:
            return cached[1]
        text = print_attribute(attribute, self.aliases)
        self.attribute_cache[id(attribute)] = (attribute, text)  # kept alive, so the id stays unique
        return text

    def attribute_dict_text(self, attributes: dict[str, Attribute]) -> str:
        return print_attribute_dict(attributes, self.aliases)

    def print_optional_attr_dict(
        self, attributes: dict[str, Attribute], elided: Iterable[str] = (), with_keyword: bool = False
    ) -> None:
        if not attributes:  # most ops: nothing to show, no dict to build
            return
        elided = set(elided)
        shown = {k: v for k, v in attributes.items() if k not in elided}
        if shown:
            self.write((" attributes " if with_keyword else " ") + self.attribute_dict_text(shown))

    def print_conversion(self, op: Operation, separator: str) -> None:
        """`name %x {attrs} : T to U` (casts) or `: T -> U` (shape queries): one operand, one result."""
        operand = op.operands[0]
        self.write(f"{op.name} {self.value_name(operand)}")
        self.print_optional_attr_dict(op.attributes)
        self.write(f" : {self.type_text(operand.type)} {separator} {self.type_text(op.results[0].type)}")

    def print_values_with_types(self, op: Operation) -> None:
        """`name %a, %b : T, U` (terminators); just the name when there are no operands."""
        self.write(self.op_name_in_context(op))
        if op.operands:
            self.write(f" {self.operand_list(op.operands)} : {self.type_list(op.operand_types)}")

    def op_name_in_context(self, op: Operation) -> str:
        """Ops of the enclosing op's default dialect drop the prefix (`return` inside `func.func`)."""
        dialect, _, short = op.name.partition(".")
        if self.default_dialects and self.default_dialects[-1] == dialect:
            return short
        return op.name

    # Structure ---------------------------------------------------------------------------------
    def print_region(self, region: Region, print_entry_block_args: bool = True) -> None:
        owner = region.parent
        default = getattr(owner, "default_dialect", None)
        self.default_dialects.append(default or "")
        self.write("{\n")
        self.indent += 1
        for index, block in enumerate(region.blocks):
            show_label = index > 0 or (print_entry_block_args and bool(block.arguments))
            if show_label:
                self.write("  " * (self.indent - 1) + self.block_names[block])
                if block.arguments:
                    arguments = ", ".join(
                        f"{self.value_name(a)}: {self.type_text(a.type)}" for a in block.arguments
                    )
                    self.write(f"({arguments})")
                self.write(":" + self.predecessor_note(block, is_entry=index == 0) + "\n")
            for op in block.ops:
                self.print_operation(op)
        self.indent -= 1
        self.write("  " * self.indent + "}")
        self.default_dialects.pop()

    def predecessor_note(self, block: Block, is_entry: bool) -> str:
        """Upstream's comment after a block label: `  // pred: ^bb0`, `  // 2 preds: ^bb0, ^bb1`, or
        `  // no predecessors` (left out for an entry block)."""
        region = block.parent
        assert region is not None
        predecessors = [
            other
            for other in region.blocks
            if other.terminator is not None
            for successor in other.terminator.successors
            if successor is block
        ]
        if not predecessors:
            return "" if is_entry else "  // no predecessors"
        if len(predecessors) == 1:
            return f"  // pred: {self.block_names[predecessors[0]]}"
        predecessors.sort(key=region.blocks.index)
        return f"  // {len(predecessors)} preds: " + ", ".join(self.block_names[b] for b in predecessors)

    def print_operation(self, op: Operation) -> None:
        parts = self.parts
        results = op.results
        if len(results) == 1:
            parts.append("  " * self.indent + self.names[results[0]] + " = ")
        else:
            parts.append("  " * self.indent)
            if results:
                names = [self.names[r] for r in results]
                if "#" in names[0]:
                    parts.append(f"{names[0].split('#')[0]}:{len(names)} = ")
                else:
                    parts.append(", ".join(names) + " = ")
        if op.has_custom_syntax:
            op.print_custom(self)
        else:
            self.print_generic(op)
        parts.append("\n")

    def print_generic(self, op: Operation) -> None:
        self.write(f'"{op.name}"({self.operand_list(op.operands)})')
        if op.successors:
            self.write("[" + ", ".join(self.block_names[b] for b in op.successors) + "]")
        if op.regions:
            self.write(" (")
            for index, region in enumerate(op.regions):
                if index:
                    self.write(", ")
                self.default_dialects.append("")
                self.print_region(region, print_entry_block_args=True)
                self.default_dialects.pop()
            self.write(")")
        if op.attributes:
            self.write(" " + self.attribute_dict_text(op.attributes))
        function_type = FunctionType(tuple(op.operand_types), tuple(op.result_types))
        self.write(" : " + print_type(function_type))

    def text(self) -> str:
        return "".join(self.parts)


def print_module(op: Operation) -> str:
    """The full text of a top-level op, preceded by its attribute alias definitions and followed by the
    `{-# dialect_resources #-}` section of the `dense_resource` blobs it uses (as MLIR prints it)."""
    buffer = io.StringIO()
    write_module(op, buffer)
    return buffer.getvalue()


def write_module(op: Operation, out: IO[str]) -> None:
    """`print_module` into a stream: the resource blobs are hex-encoded chunk by chunk, each loaded
    (memory-mapped, for ONNX external data) only while it is written, so a large model never exists
    as one string."""
    resources: dict[str, LazyElements] = {}
    _resource_sinks.append(resources)
    try:
        with gc_paused():
            aliases = collect_affine_map_aliases([op])
            printer = Printer(aliases)
            printer.name_values(op)
            for attribute, alias in aliases.items():
                printer.write(f"{alias} = {attribute.text}\n")  # type: ignore[attr-defined]
            printer.print_operation(op)
            text = printer.text()
    finally:
        _resource_sinks.pop()
    out.write(text)
    write_resources(resources, out)


def write_module_to(op: Operation, output: str | IO[str]) -> None:
    """`write_module` into a stream, or into the output `path` by qconvert.atomic_file's rules (`-` is
    stdout; a regular file is replaced only once the whole text is written)."""
    if not isinstance(output, str):
        write_module(op, output)
        return
    with atomic_text_file(output) as stream:
        write_module(op, stream)


# `print_attribute` records the `dense_resource` blobs it prints into the innermost `write_module` call's
# dictionary (name -> elements; the first one printed under a name wins, as names are unique per module).
_resource_sinks: list[dict[str, LazyElements]] = []

RESOURCE_CHUNK = 1 << 20  # bytes hex-encoded per write


def resource_alignment(dtype: np.dtype) -> int:
    """The blob alignment MLIR records for elements of `dtype`: their size in bytes (f32: 4, i8: 1)."""
    return max(int(dtype.itemsize), 1)


def write_resources(resources: Mapping[str, LazyElements | np.ndarray], out: IO[str]) -> None:
    """MLIR's file-metadata section, one `name: "0x<alignment: u32 little-endian><bytes, hex>"` per blob,
    inside `{-#`, `dialect_resources: {`, `builtin: {` ... `#-}` (each nesting indented by two spaces)."""
    if not resources:
        return
    out.write("\n{-#\n  dialect_resources: {\n    builtin: {\n")
    for index, (name, elements) in enumerate(resources.items()):
        if isinstance(elements, LazyElements):
            # A blob not loaded yet is read for this write only (not cached): printing a model keeps
            # one weight at a time in memory.
            array = elements._cache[0] if elements._cache else elements.load()
        else:
            array = elements
        key = name if BARE_IDENTIFIER.match(name) else quote_string(name)
        alignment = resource_alignment(array.dtype).to_bytes(4, "little").hex().upper()
        if index:
            out.write(",\n")
        out.write(f'      {key}: "0x{alignment}')
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data  # little-endian hosts
        for start in range(0, len(data), RESOURCE_CHUNK):
            out.write(data[start : start + RESOURCE_CHUNK].hex().upper())
        out.write('"')
        del array, data
    out.write("\n    }\n  }\n#-}\n")


def print_resources(resources: Mapping[str, LazyElements | np.ndarray]) -> str:
    """The `{-# dialect_resources: {builtin: {...}} #-}` section holding `dense_resource` blobs."""
    buffer = io.StringIO()
    write_resources(resources, buffer)
    return buffer.getvalue()
