"""The IR -> StableHLO conversion framework: the lowering table, the context lowerings get, the driver.

Contract for lowering authors
=============================

A lowering converts ONE op of the lifted IR (`"onnx.Conv"(...)`, `quant.qcast`, ...) into `stablehlo.*`
ops of a new module, and returns the new values that replace the op's results, in order:

    LoweringFn = Callable[[LoweringContext, Operation], Sequence[Value]]

- Mark it with `@lowers("onnx.Add", "onnx.Sub", ...)` (or an op class) in a module
  `backends/stablehlo/onnx_<group>.py`; `@lowers_folding(...)` for ONNX ops: the driver then first folds
  the op when its inputs are constants and requires static input shapes. The decorators register
  nothing: `convert.stablehlo_lowerings()` builds the table from the modules `convert.LOWERING_MODULES`
  lists (a new module is one line there). A name in the table twice is a bug (AssertionError).
- Read inputs with `ctx.operands(op)` (the already-lowered values of the present inputs) or
  `ctx.input(op, position)` (by ONNX input position; None for an absent optional input). Read a
  compile-time input (Reshape's shape, Slice's starts, Gather's indices...) with
  `ctx.constant_array(op, position)`: the numpy array when the input is a constant, else None. A
  constant is emitted only when some lowering asks for it as a value, so shape tensors vanish.
- ONNX attributes: `ctx.attribute(op, "axis", 0)` gives Python values (int, float, str, list of ints
  or floats, numpy array for a tensor attribute), the default when absent.
- Build ops with the constructors of `backends/stablehlo/ops.py` at `ctx.builder` (imported as
  `from qconvert.backends.stablehlo import ops as hlo`). Helpers: `ctx.constant(array, element_type)`,
  `ctx.scalar(value, element_type)` (a `tensor<T>`), `ctx.splat(value, element_type, shape)`,
  `ctx.broadcast_to(value, shape)` (numpy rules: right-aligned, size-1 dims stretch),
  `ctx.broadcast_operands(values)`, `ctx.convert(value, element_type)` (no-op when equal),
  `ctx.result_type(op, index)` (the op's result type as it must be in StableHLO).
- Return exactly one value per result, of type `ctx.result_type(op, i)` (the driver checks it when the
  source type is static). The values between a `quant.dcast` and a `quant.qcast` are plain float
  tensors in every form: lowerings of onnx ops never see quant types, the quant lowerings
  (`lower_quant.py`) and the fusion (`--form quantized`) take care of them.
- When an op cannot be lowered (an attribute value StableHLO cannot express, a dynamic shape, ...),
  call `ctx.unsupported("auto_pad=SAME_LOWER with dilations")`: it raises, the driver records the op
  (name, `onnx.node_name`, reason), keeps going with placeholder values, and reports every such op
  at once in one InputError, grouped by op name and reason (so keep node names and types out of the
  reason); ops that fail on a shape known only at run time are one line. Never emit something
  approximately right.
- Rounding rules are never written inline: quantization arithmetic goes through `lower_quant.py`, which
  calls `qconvert.numerics` for anything evaluated at conversion time.

A complete example (onnx.Add with numpy-style broadcasting; `tests/backends/stablehlo/test_forms.py`
adds it under a test name to a table of its own and runs it on jaxlib):

    from qconvert.backends.stablehlo import ops as hlo
    from qconvert.backends.stablehlo.lowering import LoweringContext, lowers

    @lowers("onnx.Add")
    def lower_add(ctx: LoweringContext, op: Operation) -> list[Value]:
        lhs, rhs = ctx.broadcast_operands(ctx.operands(op), ctx.result_type(op).shape)
        return [hlo.add(ctx.builder, lhs, rhs)]

    table = LoweringTable()
    table.add("test.Add", lower_add)       # or table.add_module(module), as stablehlo_lowerings() does
    converted, ctx = lower_module(module, table)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import NoReturn

import numpy as np

from qconvert.errors import InputError
from qconvert.ir.attributes import (
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
)
from qconvert.ir.core import Block, Builder, Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp, ReturnOp
from qconvert.ir.dialects.onnx import (
    is_unsigned,
    main_function,
    node_name,
    onnx_input,
    present_positions,
    signature_names,
)
from qconvert.ir.dialects.qconvert import NOTE
from qconvert.ir.quant_types import QuantizedType
from qconvert.ir.types import (
    DYNAMIC,
    FloatType,
    FunctionType,
    IntegerType,
    RankedTensorType,
    Signedness,
    Type,
    element_type_of,
    with_element_type,
)
from qconvert.problem_groups import NAMES_SHOWN, ProblemGroup, group_problems, listing

from . import ops as hlo
from .engine_profile import JAXLIB, EngineProfile
from .forms import Form, Semantics

LoweringFn = Callable[["LoweringContext", Operation], Sequence[Value]]
Folder = Callable[["LoweringContext", Operation], Sequence[Value] | None]
"""The values an op's results fold to at conversion time (constants), or None when it does not fold."""
LoweringKey = str | type[Operation]
"""What a lowering is registered for: an op name (`"onnx.Conv"`), or an op class (its `name` is used)."""
_MARK = "__stablehlo_lowers__"


def _key_name(key: LoweringKey) -> str:
    return key if isinstance(key, str) else key.name


def _mark(function: LoweringFn, keys: Sequence[LoweringKey], folds: bool) -> LoweringFn:
    marks = getattr(function, _MARK, ())
    setattr(function, _MARK, (*marks, *((_key_name(key), folds) for key in keys)))
    return function


def lowers(*keys: LoweringKey) -> Callable[[LoweringFn], LoweringFn]:
    """Decorator: mark the function as the lowering of each op name or class. It registers nothing: the
    table builder (`convert.stablehlo_lowerings`) collects the marked functions of the modules it lists."""
    return lambda function: _mark(function, keys, folds=False)


def lowers_folding(*keys: LoweringKey) -> Callable[[LoweringFn], LoweringFn]:
    """`@lowers(...)` for onnx lowerings: the driver first tries the table's folder (constant inputs give
    constant results, no ops), then requires static shapes of the present inputs, then calls the lowering."""
    return lambda function: _mark(function, keys, folds=True)


@dataclass(frozen=True, slots=True)
class LoweringRule:
    """One entry of a table: the lowering, and whether the driver folds and checks shapes before it."""

    function: LoweringFn
    folds: bool = False


class LoweringTable:
    """Op name -> its lowering rule, built explicitly (`add`, `add_module`); a name added twice is a bug.

    `folder` is what `lowers_folding` rules try first (`onnx_fold.fold` in the StableHLO table).
    """

    def __init__(self, folder: Folder | None = None) -> None:
        self.folder = folder
        self._rules: dict[str, LoweringRule] = {}

    def add(self, key: LoweringKey, function: LoweringFn, *, folds: bool = False) -> None:
        name = _key_name(key)
        assert name not in self._rules, f"lowering for {name} registered twice"
        self._rules[name] = LoweringRule(function, folds)

    def add_module(self, module: ModuleType) -> None:
        """Add every function `module` defines with a `@lowers` / `@lowers_folding` mark."""
        for value in vars(module).values():
            if callable(value) and getattr(value, "__module__", None) == module.__name__:
                for name, folds in getattr(value, _MARK, ()):
                    self.add(name, value, folds=folds)

    def replace(self, key: LoweringKey, function: LoweringFn, *, folds: bool = False) -> None:
        """Swap one rule of a table you built (tests: a broken or an example lowering)."""
        self._rules[_key_name(key)] = LoweringRule(function, folds)

    def rule(self, name: str) -> LoweringRule | None:
        return self._rules.get(name)

    def names(self) -> list[str]:
        return list(self._rules)

    def __contains__(self, key: LoweringKey) -> bool:
        return _key_name(key) in self._rules


class CannotLower(Exception):
    """Raised by `LoweringContext.unsupported` when one op cannot be lowered; the driver collects it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class UnsupportedOp:
    """One op the driver could not lower: its name, ONNX node name and why."""

    op_name: str
    node_name: str | None
    reason: str

    def __str__(self) -> str:
        node = f" (node '{self.node_name}')" if self.node_name else ""
        return f"{self.op_name}{node}: {self.reason}"


def storage_element_type(quant_type: QuantizedType) -> Type:
    """The StableHLO integer type holding `quant_type`'s stored values: `i8`, or `ui8` for `u8` storage."""
    storage = quant_type.storage_type
    if isinstance(storage, IntegerType) and not quant_type.is_signed:
        return IntegerType(storage.width, Signedness.UNSIGNED)
    return storage


def has_stablehlo_type(quant_type: QuantizedType) -> bool:
    """StableHLO's quantized element types: per-tensor or per-axis, integer storage. Sub-channel (blocked)
    and float8 / float4 storage exist only as their storage values, quantized by written-out arithmetic."""
    from qconvert.ir.quant_types import UniformQuantizedPerAxisType, UniformQuantizedType

    is_uniform = isinstance(quant_type, UniformQuantizedType | UniformQuantizedPerAxisType)
    return is_uniform and isinstance(quant_type.storage_type, IntegerType)


def python_value(attribute: Attribute) -> object:
    """An ONNX attribute as the frontend stored it -> a plain Python / numpy value."""
    if isinstance(attribute, IntegerAttr | FloatAttr | StringAttr | BoolAttr):
        return attribute.value
    if isinstance(attribute, DenseArrayAttr):
        return list(attribute.values)
    if isinstance(attribute, DenseElementsAttr):
        return attribute.array
    if isinstance(attribute, ArrayAttr):
        return [python_value(e) for e in attribute.elements]
    return attribute


@dataclass(slots=True)
class LoweringContext:
    """What a lowering gets: the insertion point, the value mapping, the form, and small builders."""

    builder: Builder
    form: Form
    semantics: Semantics
    inline_weights: bool = False
    # What the engines that will run the module get wrong (written out instead); None: the pure form.
    engine_profile: EngineProfile | None = JAXLIB
    value_map: dict[Value, Value] = field(default_factory=dict)
    # Source constants not emitted yet (emitted on first use as a value, see `_materialize`).
    pending_constants: dict[Value, Operation] = field(default_factory=dict)
    # A quantized value emitted as ONNX-exact arithmetic -> the float value it quantizes (for the fusion).
    quantize_sources: dict[Value, Value] = field(default_factory=dict)
    # A float value dequantized by written-out arithmetic -> the quantized value it came from.
    dequantize_sources: dict[Value, Value] = field(default_factory=dict)

    # Types ------------------------------------------------------------------------------------
    def convert_type(self, type_: Type) -> Type:
        """A source type as StableHLO holds it in this form: quant elements become storage in `integer`."""
        element = element_type_of(type_)
        if isinstance(element, QuantizedType) and (
            self.form is Form.INTEGER or not has_stablehlo_type(element)
        ):
            return with_element_type(type_, storage_element_type(element))
        return type_

    def result_type(self, op: Operation, index: int = 0) -> RankedTensorType:
        """The StableHLO type of `op`'s result `index` (ranked; `ctx.unsupported` when it is not)."""
        type_ = self.convert_type(op.results[index].type)
        if not isinstance(type_, RankedTensorType):
            self.unsupported(f"result #{index} has type {type_}, StableHLO needs ranked tensors")
        if not type_.has_static_shape():
            self.unsupported(f"result #{index} has a dynamic shape {type_}")
        return type_

    # Operands ---------------------------------------------------------------------------------
    def value(self, source: Value) -> Value:
        """The lowered value of a source value (emitting a pending constant on first use)."""
        found = self.value_map.get(source)
        if found is not None:
            return found
        constant_op = self.pending_constants.get(source)
        assert constant_op is not None, "operand not lowered yet: ops must be lowered in order"
        lowered = self._materialize(constant_op)
        self.value_map[source] = lowered
        return lowered

    def operands(self, op: Operation) -> list[Value]:
        """The lowered values of `op`'s present operands, in order."""
        return [self.value(v) for v in op.operands]

    def source_input(self, op: Operation, position: int) -> Value | None:
        """The source value at ONNX input `position`, or None when that optional input is absent."""
        return onnx_input(op, position)

    def input(self, op: Operation, position: int) -> Value | None:
        """The lowered value at ONNX input `position`, or None when that optional input is absent."""
        source = self.source_input(op, position)
        return None if source is None else self.value(source)

    def constant_array(self, op: Operation, position: int) -> np.ndarray | None:
        """The numpy value of ONNX input `position` when it is a constant (read lazily), else None."""
        source = self.source_input(op, position)
        if source is None:
            return None
        producer = source.owner_op()
        if not isinstance(producer, ConstantOp):
            return None
        return constant_attribute_array(producer.attributes["value"])

    def attribute(self, op: Operation, name: str, default: object = None) -> object:
        """ONNX attribute `name` of `op` as a Python value (see `python_value`), or `default`."""
        attribute = op.attributes.get(name)
        return default if attribute is None else python_value(attribute)

    def integer_list(self, op: Operation, name: str, default: Sequence[int]) -> list[int]:
        """ONNX ints attribute `name` of `op` (kernel_shape, strides, pads...) as a list, or `default`."""
        value = self.attribute(op, name)
        return list(default) if value is None else [int(v) for v in value]  # type: ignore[union-attr]

    # Builders ---------------------------------------------------------------------------------
    def constant(self, array: np.ndarray | float | int, element_type: Type) -> Value:
        """A `stablehlo.constant` holding `array` (converted to `element_type`'s numpy dtype)."""
        return dense_constant(self.builder, array, element_type)

    def scalar(self, value: float | int, element_type: Type) -> Value:
        """A rank-0 constant `tensor<T>`."""
        return self.constant(np.asarray(value), element_type)

    def splat(self, value: float | int, element_type: Type, shape: Sequence[int]) -> Value:
        """A constant of `shape` whose elements are all `value` (printed `dense<v>`)."""
        return self.constant(np.full(tuple(shape), value, dtype=numpy_dtype(element_type)), element_type)

    def broadcast_to(self, value: Value, shape: Sequence[int]) -> Value:
        """`value` broadcast to `shape` by numpy's rules (right-aligned; size-1 dims stretch)."""
        source = hlo.tensor_type(value).shape
        shape = tuple(shape)
        if source == shape:
            return value
        offset = len(shape) - len(source)
        if offset < 0 or any(d not in (1, shape[offset + i]) for i, d in enumerate(source)):
            self.unsupported(f"cannot broadcast {list(source)} to {list(shape)}")
        # broadcast_in_dim stretches operand dims of size 1 itself (spec C5), so no reshape is needed.
        return hlo.broadcast_in_dim(self.builder, value, shape, [offset + i for i in range(len(source))])

    def broadcast_operands(self, values: Sequence[Value], shape: Sequence[int] | None = None) -> list[Value]:
        """Every value broadcast to `shape` (default: numpy's broadcast of their shapes)."""
        if shape is None:
            try:
                shape = np.broadcast_shapes(*(hlo.tensor_type(v).shape for v in values))
            except ValueError as error:
                self.unsupported(str(error))
        return [self.broadcast_to(v, shape) for v in values]

    def convert(self, value: Value, element_type: Type) -> Value:
        """`stablehlo.convert` to `element_type`, or `value` itself when it already has it."""
        if element_type_of(value.type) == element_type:
            return value
        return hlo.convert(self.builder, value, element_type)

    def note(self, value: Value, text: str) -> None:
        """Attach `qconvert.note = "..."` to the op that produced `value` (why it was emitted that way)."""
        attach_note(value, text)

    def unsupported(self, reason: str) -> NoReturn:
        """Give up on the current op: the driver records `reason` with the op and keeps going."""
        raise CannotLower(reason)

    def _materialize(self, constant_op: Operation) -> Value:
        attribute = constant_op.attributes["value"]
        result_type = self.convert_type(constant_op.result.type)
        if isinstance(attribute, DenseElementsAttr | DenseResourceAttr):
            element = element_type_of(result_type)
            if isinstance(element, IntegerType) and is_unsigned(constant_op):
                element = IntegerType(element.width, Signedness.UNSIGNED)
            attribute = retyped_constant(attribute, with_element_type(attribute.type, element))
            result_type = attribute.type
            if self.inline_weights and isinstance(attribute, DenseResourceAttr):
                return hlo.constant(self.builder, inline_resource(attribute), result_type)  # type: ignore[arg-type]
        return hlo.constant(self.builder, attribute, result_type)  # type: ignore[arg-type]


def dense_constant(builder: Builder, array: np.ndarray | float | int, element_type: Type) -> Value:
    """A `stablehlo.constant` holding `array` (converted to `element_type`'s numpy dtype), at `builder`."""
    values = np.asarray(array, dtype=numpy_dtype(element_type))
    attribute = DenseElementsAttr(values, RankedTensorType(tuple(values.shape), element_type))
    return hlo.constant(builder, attribute)


def attach_note(value: Value, text: str) -> None:
    """`qconvert.note = "..."` on the new op that produced `value` (why it was emitted that way)."""
    producer = value.owner_op()
    if producer is not None:
        producer.attributes[NOTE] = StringAttr(text)


# Shape guards -----------------------------------------------------------------------------------
def static_shape(ctx: LoweringContext, value: Value, what: str) -> tuple[int, ...]:
    """The static shape of a lowered value, or `ctx.unsupported` naming the dynamic dims."""
    type_ = value.type
    if not isinstance(type_, RankedTensorType) or not type_.has_static_shape():
        ctx.unsupported(f"{what} has a dynamic shape {type_}")
    return type_.shape


def source_shape(ctx: LoweringContext, op: Operation, position: int) -> tuple[int, ...]:
    """The static shape of ONNX input `position`: the source's type, or the lowered value's when only
    lowering knew it (ONNX infers no shape for some ops, e.g. Slice-1). No value is emitted for it."""
    source = ctx.source_input(op, position)
    assert source is not None
    type_ = source.type
    lowered = ctx.value_map.get(source)
    if not _is_static(type_) and lowered is not None:
        type_ = lowered.type
    if not isinstance(type_, RankedTensorType) or not type_.has_static_shape():
        where = f"input #{position} of node '{node_name(op)}'"
        ctx.unsupported(f"{where} has a dynamic shape {type_}")
    return type_.shape


# Constants ------------------------------------------------------------------------------------
def numpy_dtype(element_type: Type) -> np.dtype:
    """The numpy dtype of a StableHLO element type (i1 -> bool, ui8 -> uint8, bf16 -> ml_dtypes)."""
    import ml_dtypes

    if isinstance(element_type, IntegerType):
        if element_type.width == 1:
            return np.dtype(np.bool_)
        kind = "u" if element_type.is_unsigned else "i"
        if element_type.width in (2, 4):  # sub-byte storage (int4 weights): ml_dtypes' containers
            return np.dtype(getattr(ml_dtypes, f"{'u' if kind == 'u' else ''}int{element_type.width}"))
        return np.dtype(f"{kind}{element_type.width // 8}")
    if isinstance(element_type, FloatType):
        names = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16}
        if element_type.name in names:
            return np.dtype(names[element_type.name])
    raise AssertionError(f"no numpy dtype for {element_type}")


def constant_attribute_array(attribute: Attribute) -> np.ndarray | None:
    """The numpy array of a dense or (loaded) dense_resource attribute; None when elided or opaque."""
    if isinstance(attribute, DenseElementsAttr):
        return attribute.array
    if isinstance(attribute, DenseResourceAttr) and attribute.elements is not None:
        return attribute.elements.get()
    return None


def retyped_constant(
    attribute: DenseElementsAttr | DenseResourceAttr, type_: Type
) -> DenseElementsAttr | DenseResourceAttr:
    """The same elements under another (same-width) type; the array is shared, never copied."""
    if attribute.type == type_:
        return attribute
    if isinstance(attribute, DenseElementsAttr):
        return DenseElementsAttr(attribute.array, type_)
    return DenseResourceAttr(attribute.name, type_, attribute.elements)


def inline_resource(attribute: DenseResourceAttr) -> Attribute:
    """A dense_resource constant as `dense<"0x...">` text: jaxlib's XLA path refuses `dense_resource` and
    its interpreter misreads blobs parsed from text, so modules meant to run carry their weights inline."""
    assert attribute.elements is not None, f"weights of {attribute.name} are elided"
    array = np.ascontiguousarray(attribute.elements.get())
    element = element_type_of(attribute.type)
    if isinstance(element, IntegerType) and element.width == 1:
        return DenseElementsAttr(array.astype(np.bool_), attribute.type)
    return OpaqueAttr(
        f'dense<"0x{array.reshape(-1).view(np.uint8).tobytes().hex().upper()}"> : {attribute.type}'
    )


# The driver -------------------------------------------------------------------------------------
def find_main(module: ModuleOp) -> FuncOp:
    return main_function(module, "to convert")


def _signless(type_: Type) -> Type:
    element = element_type_of(type_)
    if isinstance(element, IntegerType) and element.is_unsigned:
        return with_element_type(type_, IntegerType(element.width))
    return type_


def _result_matches(expected: Type, actual: Type) -> bool:
    if not isinstance(expected, RankedTensorType) or not expected.has_static_shape():
        return True  # the source did not know the type: nothing to check
    # The IR's integers are signless; StableHLO spells unsigned storage `ui8`.
    return _signless(expected) == _signless(actual)


def _signature_type(type_: Type, attributes: Attribute | None) -> Type:
    """A function argument / result type, unsigned when the frontend marked it (`onnx.elem_type`)."""
    element = element_type_of(type_)
    if isinstance(element, IntegerType) and is_unsigned(attributes):
        return with_element_type(type_, IntegerType(element.width, Signedness.UNSIGNED))
    return type_


def _entry(attributes: Attribute | None, index: int) -> Attribute | None:
    return attributes.elements[index] if isinstance(attributes, ArrayAttr) else None


def _argument_label(function: FuncOp, index: int) -> str:
    name = signature_names(function)[index]
    return name if name is not None else f"#{index}"


def _is_static(type_: Type) -> bool:
    return isinstance(type_, RankedTensorType) and type_.has_static_shape()


def _dim_names(function: FuncOp, index: int) -> list[str]:
    """The argument's dim names as the frontend recorded them (`onnx.dim_params`, "" where unnamed)."""
    entry = _entry(function.attributes.get("arg_attrs"), index)
    names = dict(entry.entries).get("onnx.dim_params") if isinstance(entry, DictionaryAttr) else None
    if not isinstance(names, ArrayAttr):
        return []
    return [n.value if isinstance(n, StringAttr) else "" for n in names.elements]


def _shape_hint(type_: Type, names: Sequence[str]) -> str:
    """`2x<sequence>` for tensor<2x?xi64>: the static dims as they are, a placeholder for each dynamic one
    (its name in the model, else `d<position>`)."""
    if not isinstance(type_, RankedTensorType):
        return "<d0>x<d1>..."
    return "x".join(
        f"<{names[i] if i < len(names) and names[i] else f'd{i}'}>" if d == DYNAMIC else str(d)
        for i, d in enumerate(type_.shape)
    )


def check_static_inputs(function: FuncOp) -> None:
    """StableHLO here is static: one InputError naming every argument with a dynamic or unknown shape,
    with how many values of the function have a dynamic shape because of it, and the --input-shape to give."""
    dynamic = [i for i, t in enumerate(function.function_type.inputs) if not _is_static(t)]
    if not dynamic:
        return
    # Which dynamic arguments each value depends on, and how many dynamic-shaped values each one causes.
    depends: dict[Value, frozenset[int]] = {
        argument: frozenset({i}) if i in dynamic else frozenset()
        for i, argument in enumerate(function.body.arguments)
    }
    caused = dict.fromkeys(dynamic, 0)
    dynamic_values = 0
    for op in function.body.ops:
        sources = frozenset().union(*(depends.get(v, frozenset()) for v in op.operands))
        for result in op.results:
            depends[result] = sources
            if not _is_static(result.type):
                dynamic_values += 1
                for index in sources:
                    caused[index] += 1
    types = function.function_type.inputs
    lines = []
    for i in dynamic:
        named = [n for n in _dim_names(function, i) if n]
        dims = f" (dynamic dims {', '.join(repr(n) for n in named)})" if named else ""
        lines.append(
            f"  input '{_argument_label(function, i)}' has type {types[i]}{dims}: "
            f"{caused[i]:,} value(s) with a dynamic shape depend on it"
        )
    hint = " ".join(
        f"--input-shape {_argument_label(function, i)}={_shape_hint(types[i], _dim_names(function, i))}"
        for i in dynamic
    )
    raise InputError(
        f"cannot convert to StableHLO: static shapes needed, and {dynamic_values:,} value(s) have dynamic "
        f"ones, from {len(dynamic)} graph input(s) with dynamic dims:\n" + "\n".join(lines) + "\n"
        f"  fix them with {hint} (each <...> the size you will run with; dims of one name, one size)"
    )


def _group_line(group: ProblemGroup) -> str:
    """`onnx.ConvInteger x87 (nodes 'a', 'b', 'c' and 84 more): reason`; one op as `UnsupportedOp` prints."""
    count = len(group.names)
    names = group.names_text()
    if count == 1:
        return str(UnsupportedOp(group.kind, group.names[0] or None, group.reason))
    where = f" (nodes {names})" if names else ""
    return f"{group.kind} x{count:,}{where}: {group.reason}"


def unsupported_report(
    failures: Sequence[UnsupportedOp], dynamic: Sequence[UnsupportedOp], source: FuncOp
) -> str:
    """The InputError text for the ops that could not be lowered: a summary line, then one line per op type
    and reason (counts, a few node names, the largest group first); the ops that failed on shapes only known
    at run time are one line, naming the ops where the dynamic shapes start."""
    total = len(failures) + len(dynamic)
    groups = group_problems((f.op_name, f.node_name or "", f.reason) for f in failures)
    kinds = f" ({len(groups)} kind(s), the most frequent first)" if len(groups) > 1 else ""
    text = f"cannot convert to StableHLO: {total:,} unsupported op(s){kinds}:"
    if groups:
        text += "\n" + listing(groups, _group_line)
    if dynamic:
        roots = [
            op
            for op in source.body.ops
            if not all(_is_static(r.type) for r in op.results)
            and all(_is_static(v.type) for v in op.operands)
        ]
        named = ", ".join(f"'{node_name(op) or op.name}' ({op.name})" for op in roots[:NAMES_SHOWN])
        more = f" and {len(roots) - NAMES_SHOWN} more" if len(roots) > NAMES_SHOWN else ""
        text += (
            f"\n  {len(dynamic):,} op(s) have shapes unknown at conversion time (StableHLO here needs static "
            f"shapes): they start at {named}{more}, whose result shapes neither the input shapes nor shape "
            "inference determine (they depend on the data, or the op's shape is not inferred)"
        )
    return text


def lower_module(
    module: ModuleOp,
    table: LoweringTable,
    form: Form = Form.QUANTIZED,
    semantics: Semantics = Semantics.ONNX,
    *,
    inline_weights: bool = False,
    engine_profile: EngineProfile | None = JAXLIB,
) -> tuple[ModuleOp, LoweringContext]:
    """Convert `func.func @main` of a lifted module into a new module of `stablehlo.*` ops.

    Every op is dispatched by name to its rule in `table`: a folding rule first tries the table's folder,
    then requires static input shapes; every op without a rule or whose lowering calls `ctx.unsupported`
    is collected, and one InputError lists them all. Argument and result attributes (`onnx.name`) are
    kept. The source module is not modified; weights are shared, not copied.
    """
    source = find_main(module)
    check_static_inputs(source)
    context = LoweringContext(
        Builder(Block()), Form(form), Semantics(semantics), inline_weights, engine_profile=engine_profile
    )
    source_type = source.function_type
    arg_attrs, res_attrs = source.attributes.get("arg_attrs"), source.attributes.get("res_attrs")
    inputs = tuple(
        _signature_type(context.convert_type(t), _entry(arg_attrs, i))
        for i, t in enumerate(source_type.inputs)
    )
    results = tuple(
        _signature_type(context.convert_type(t), _entry(res_attrs, i))
        for i, t in enumerate(source_type.results)
    )
    function = FuncOp.create("main", FunctionType(inputs, results))
    for key in ("arg_attrs", "res_attrs"):
        if key in source.attributes:
            function.attributes[key] = source.attributes[key]
    block = function.regions[0].append(Block(inputs))
    context.builder = Builder(block)
    for old, new in zip(source.body.arguments, block.arguments, strict=True):
        context.value_map[old] = new

    failures: list[UnsupportedOp] = []
    dynamic_failures: list[UnsupportedOp] = []
    for op in source.body.ops:
        if isinstance(op, ConstantOp):
            context.pending_constants[op.result] = op
            continue
        if isinstance(op, ReturnOp):
            returned = context.operands(op)
            context.builder.insert(ReturnOp(returned))
            # A result type ONNX could not infer (e.g. some function ops) takes its lowering's type.
            known = [
                r if isinstance(r, RankedTensorType) and r.has_static_shape() else v.type
                for r, v in zip(results, returned, strict=True)
            ]
            function.function_type = FunctionType(inputs, tuple(known))
            continue
        rule = table.rule(op.name)
        has_dynamic_type = not all(_is_static(v.type) for v in [*op.operands, *op.results])
        try:
            if rule is None:
                raise CannotLower("no StableHLO lowering for this op")
            folded = table.folder(context, op) if rule.folds and table.folder is not None else None
            if folded is not None:
                lowered = list(folded)
            else:
                if rule.folds:
                    for position in present_positions(op):
                        source_shape(context, op, position)
                lowered = list(rule.function(context, op))
            if len(lowered) != len(op.results):
                raise AssertionError(
                    f"lowering of {op.name} returned {len(lowered)} values for {len(op.results)}"
                )
            for index, (old, new) in enumerate(zip(op.results, lowered, strict=True)):
                expected = context.convert_type(old.type)
                assert _result_matches(expected, new.type), (
                    f"lowering of {op.name} (node '{node_name(op)}') gave result #{index} type {new.type}, "
                    f"expected {expected}"
                )
        except CannotLower as error:
            failed = UnsupportedOp(op.name, node_name(op), error.reason)
            # An op whose lowering exists but fails on a dynamic shape is one of a kind: reported once.
            (dynamic_failures if has_dynamic_type and rule is not None else failures).append(failed)
            # Placeholders of the right type let the walk go on, so every unsupported op is reported.
            lowered = [Value(context.convert_type(r.type)) for r in op.results]
        for old, new in zip(op.results, lowered, strict=True):
            context.value_map[old] = new
    if failures or dynamic_failures:
        raise InputError(unsupported_report(failures, dynamic_failures, source))

    converted = ModuleOp.create(module.sym_name)
    converted.body.append(function)
    return converted, context
