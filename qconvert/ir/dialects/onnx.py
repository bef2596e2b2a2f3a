"""The lifted-ONNX contract: what frontends/onnx/lift.py writes into the IR, read in one place.

The lifter keeps each ONNX node as a generic `onnx.<Op>` / `onnx.<domain>.<Op>` op and records ONNX
facts the IR has no field for as `onnx.*` attributes. Every reader (the interpreter, the backends,
calibration, check) goes through these accessors instead of decoding the attributes itself:

| where                      | attribute                              | accessor                            |
|----------------------------|----------------------------------------|-------------------------------------|
| module                     | `onnx.opset_import = {"ai.onnx" = 21}` | `opset_imports`, `default_opset`    |
| module                     | `func.func @main`                      | `main_function`                     |
| @main's arguments, results | `{onnx.name = "x"}`                    | `signature_names`                   |
| generic op                 | `onnx.node_name`                       | `node_name`, `node_label`,          |
|                            |                                        | `op_label`                          |
| generic op                 | `onnx.absent_inputs` / `_outputs`      | `onnx_input`, `present_positions`,  |
|                            |                                        | `absent_positions`, `by_position`   |
| constant, argument, result | `onnx.elem_type = "uint8"`             | `elem_type_name`, `is_unsigned`     |
| Cast's `to`, tensor types  | ONNX element-type enum values (ints)   | `ELEMENT_TYPES`, `element_type`     |

No `onnx` package import (qconvert/ir may not import one): the element-type enum values are written
here as plain ints, the values of onnx's `TensorProto.DataType` (tests compare them with onnx's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import ml_dtypes
import numpy as np

from qconvert.errors import InputError
from qconvert.ir.attributes import (
    ArrayAttr,
    Attribute,
    DenseArrayAttr,
    DictionaryAttr,
    IntegerAttr,
    StringAttr,
)
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.types import FloatType, IntegerType, OpaqueType, Type
from qconvert.onnx_semantics import DEFAULT_DOMAINS

# Opsets --------------------------------------------------------------------------------------------

OPSET_IMPORT = "onnx.opset_import"
DEFAULT_DOMAIN_KEY = "ai.onnx"  # how `onnx.opset_import` spells the default domain ("" in ONNX)
DEFAULT_OPSET = 21  # the default domain's opset of a module that records none (the lifter's own)


def opset_imports(module: ModuleOp) -> dict[str, int]:
    """`onnx.opset_import` as ONNX spells it (the default domain is ""); empty when the module has none."""
    entries = module.attributes.get(OPSET_IMPORT)
    opsets: dict[str, int] = {}
    if isinstance(entries, DictionaryAttr):
        for domain, version in entries.entries:
            if isinstance(version, IntegerAttr):
                opsets["" if domain == DEFAULT_DOMAIN_KEY else domain] = int(version.value)
    return opsets


def recorded_default_opset(module: ModuleOp) -> int | None:
    """The default domain's version in `onnx.opset_import`, None when the module records none."""
    return opset_imports(module).get("")


def default_opset(module: ModuleOp) -> int:
    """The default domain's opset of the module (DEFAULT_OPSET when it records none)."""
    recorded = recorded_default_opset(module)
    return DEFAULT_OPSET if recorded is None else recorded


def enclosing_module(op: Operation) -> ModuleOp | None:
    """The module holding `op` (None for a detached op)."""
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, ModuleOp):
        parent = parent.parent_op()
    return parent


def op_default_opset(op: Operation) -> int:
    """The default-domain opset of the module holding `op` (DEFAULT_OPSET when there is none)."""
    module = enclosing_module(op)
    return DEFAULT_OPSET if module is None else default_opset(module)


def op_domain(op: Operation) -> str:
    """The ONNX domain of a generic op: "" for `onnx.Add` (and `onnx.ai.onnx.Add`), "com.microsoft"
    for `onnx.com.microsoft.Gelu`."""
    _, _, qualified = op.name.partition(".")
    domain = qualified.rpartition(".")[0]
    return "" if domain == DEFAULT_DOMAIN_KEY else domain


# @main ---------------------------------------------------------------------------------------------


def main_function(module: ModuleOp, purpose: str = "") -> FuncOp:
    """The function a lifted module runs: its defined `func.func @main`, else its only defined function.

    `purpose` ("to interpret", "to convert") ends the error message when there is no such function.
    """
    functions = [op for op in module.body.ops if isinstance(op, FuncOp)]
    defined = [f for f in functions if not f.is_declaration]
    for function in defined:
        if function.sym_name == "main":
            return function
    if len(defined) == 1:
        return defined[0]
    names = ", ".join(f"@{f.sym_name}" for f in functions) or "none"
    what = f" {purpose}" if purpose else ""
    raise InputError(f"the module has no func.func @main{what} (functions: {names})")


# Graph input and output names ---------------------------------------------------------------------

TENSOR_NAME = "onnx.name"  # in a function's arg_attrs / res_attrs: the ONNX graph input / output name


def signature_names(function: FuncOp, kind: str = "inputs") -> list[str | None]:
    """The ONNX name (`onnx.name`) of each argument (`kind="inputs"`) or result (`"outputs"`) of the
    function, None where the lifter recorded none."""
    inputs = kind == "inputs"
    count = len(function.function_type.inputs if inputs else function.function_type.results)
    entries = function.attributes.get("arg_attrs" if inputs else "res_attrs")
    elements = entries.elements if isinstance(entries, ArrayAttr) else ()
    names: list[str | None] = []
    for index in range(count):
        entry = elements[index] if index < len(elements) else None
        name = dict(entry.entries).get(TENSOR_NAME) if isinstance(entry, DictionaryAttr) else None
        names.append(name.value if isinstance(name, StringAttr) else None)
    return names


# Node names ----------------------------------------------------------------------------------------

NODE_NAME = "onnx.node_name"


def node_name(op: Operation) -> str | None:
    """The ONNX node name the op was lifted from, None when it carries none."""
    attribute = op.attributes.get(NODE_NAME)
    return attribute.value if isinstance(attribute, StringAttr) else None


def node_label(op: Operation) -> str:
    """`node 'x'`, or `unnamed node`, for messages."""
    name = node_name(op)
    return f"node '{name}'" if name is not None else "unnamed node"


def op_label(op: Operation) -> str:
    """`'onnx.Conv' (node 'conv1')`, or `'onnx.Conv'` for an op without a node name, for messages."""
    name = node_name(op)
    return f"'{op.name}' (node '{name}')" if name else f"'{op.name}'"


# Absent optional inputs and outputs ----------------------------------------------------------------

ABSENT_INPUTS = "onnx.absent_inputs"
ABSENT_OUTPUTS = "onnx.absent_outputs"
_Item = TypeVar("_Item")


def absent_positions(op: Operation, kind: str = "inputs") -> set[int]:
    """The ONNX positions of the node's absent optional inputs (or outputs, `kind="outputs"`), which the
    lifter lists in `onnx.absent_inputs` / `onnx.absent_outputs`: the op has operands (results) for
    the others only."""
    attribute = op.attributes.get(f"onnx.absent_{kind}")
    return {int(v) for v in attribute.values} if isinstance(attribute, DenseArrayAttr) else set()


def present_positions(op: Operation, kind: str = "inputs") -> list[int]:
    """The ONNX position of each of the op's operands (results), in order, absent positions skipped."""
    absent = absent_positions(op, kind)
    count = len(op.operands) if kind == "inputs" else len(op.results)
    positions: list[int] = []
    position = 0
    while len(positions) < count:
        if position not in absent:
            positions.append(position)
        position += 1
    return positions


def onnx_input(op: Operation, position: int) -> Value | None:
    """The operand at ONNX input `position`, None when that optional input is absent or past the end."""
    absent = absent_positions(op)
    if position in absent:
        return None
    index = position - sum(1 for p in absent if p < position)
    return op.operands[index] if index < len(op.operands) else None


def by_position(op: Operation, items: Sequence[_Item], kind: str = "inputs") -> list[_Item | None]:
    """`items` (one per operand, or per result) at their ONNX positions, None at the absent ones."""
    absent = absent_positions(op, kind)
    present = iter(items)
    return [None if p in absent else next(present) for p in range(len(items) + len(absent))]


# Element types ---------------------------------------------------------------------------------------

ELEM_TYPE = "onnx.elem_type"


@dataclass(frozen=True, slots=True)
class OnnxElement:
    """One ONNX element type: its `TensorProto.DataType` value, ONNX name, IR type and numpy dtype.

    IR integers are signless (`uint8` and `int8` are both `i8`); `onnx.elem_type` keeps the name where
    a non-quantized unsigned tensor is visible (frontends/onnx/dtypes.py).
    """

    onnx_type: int
    name: str
    ir_type: Type
    dtype: np.dtype

    @property
    def is_unsigned_integer(self) -> bool:
        return self.name.startswith("uint")


def _element(onnx_type: int, name: str, ir_type: Type, dtype: object) -> OnnxElement:
    return OnnxElement(onnx_type, name, ir_type, np.dtype(dtype))  # type: ignore[call-overload]


ELEMENT_TYPES: dict[int, OnnxElement] = {
    e.onnx_type: e
    for e in (
        _element(1, "float", FloatType("f32"), np.float32),
        _element(2, "uint8", IntegerType(8), np.uint8),
        _element(3, "int8", IntegerType(8), np.int8),
        _element(4, "uint16", IntegerType(16), np.uint16),
        _element(5, "int16", IntegerType(16), np.int16),
        _element(6, "int32", IntegerType(32), np.int32),
        _element(7, "int64", IntegerType(64), np.int64),
        _element(8, "string", OpaqueType("onnx", "string"), np.object_),
        _element(9, "bool", IntegerType(1), np.bool_),
        _element(10, "float16", FloatType("f16"), np.float16),
        _element(11, "double", FloatType("f64"), np.float64),
        _element(12, "uint32", IntegerType(32), np.uint32),
        _element(13, "uint64", IntegerType(64), np.uint64),
        _element(14, "complex64", OpaqueType("onnx", "complex64"), np.complex64),
        _element(15, "complex128", OpaqueType("onnx", "complex128"), np.complex128),
        _element(16, "bfloat16", FloatType("bf16"), ml_dtypes.bfloat16),
        _element(17, "float8e4m3fn", FloatType("f8E4M3FN"), ml_dtypes.float8_e4m3fn),
        _element(18, "float8e4m3fnuz", FloatType("f8E4M3FNUZ"), ml_dtypes.float8_e4m3fnuz),
        _element(19, "float8e5m2", FloatType("f8E5M2"), ml_dtypes.float8_e5m2),
        _element(20, "float8e5m2fnuz", FloatType("f8E5M2FNUZ"), ml_dtypes.float8_e5m2fnuz),
        _element(21, "uint4", IntegerType(4), ml_dtypes.uint4),
        _element(22, "int4", IntegerType(4), ml_dtypes.int4),
        _element(23, "float4e2m1", FloatType("f4E2M1FN"), ml_dtypes.float4_e2m1fn),
        _element(24, "float8e8m0", FloatType("f8E8M0FNU"), ml_dtypes.float8_e8m0fnu),
        _element(25, "uint2", IntegerType(2), ml_dtypes.uint2),
        _element(26, "int2", IntegerType(2), ml_dtypes.int2),
    )
}
ELEMENT_TYPES_BY_NAME: dict[str, OnnxElement] = {e.name: e for e in ELEMENT_TYPES.values()}
FLOAT16 = 10  # TensorProto.FLOAT16


def element_type(onnx_type: int) -> OnnxElement | None:
    """The entry of an ONNX element-type enum value, None for UNDEFINED (0) or an unknown value."""
    return ELEMENT_TYPES.get(onnx_type)


def elem_type_name(source: Operation | Attribute | None) -> str | None:
    """The `onnx.elem_type` the lifter recorded on a constant (an op) or in an argument's / result's
    attribute dictionary; None when there is none."""
    if isinstance(source, Operation):
        attribute = source.attributes.get(ELEM_TYPE)
    elif isinstance(source, DictionaryAttr):
        attribute = dict(source.entries).get(ELEM_TYPE)
    else:
        attribute = None
    return attribute.value if isinstance(attribute, StringAttr) else None


def is_unsigned(source: Operation | Attribute | None) -> bool:
    """Whether the recorded `onnx.elem_type` (see `elem_type_name`) is an unsigned integer type."""
    name = elem_type_name(source)
    return name is not None and name.startswith("uint")


__all__ = [
    "ABSENT_INPUTS",
    "ABSENT_OUTPUTS",
    "DEFAULT_DOMAINS",
    "DEFAULT_DOMAIN_KEY",
    "DEFAULT_OPSET",
    "ELEMENT_TYPES",
    "ELEMENT_TYPES_BY_NAME",
    "ELEM_TYPE",
    "FLOAT16",
    "NODE_NAME",
    "OPSET_IMPORT",
    "TENSOR_NAME",
    "OnnxElement",
    "absent_positions",
    "by_position",
    "default_opset",
    "elem_type_name",
    "element_type",
    "enclosing_module",
    "is_unsigned",
    "main_function",
    "node_label",
    "node_name",
    "onnx_input",
    "op_default_opset",
    "op_label",
    "op_domain",
    "opset_imports",
    "present_positions",
    "recorded_default_opset",
    "signature_names",
]
