"""`--absorb-boundary-quant-casts`: @main takes the quantized values its inputs are quantized to, and returns
the quantized values its outputs are dequantized from.

The first half of strip-to-storage (issue 20; the second is `strip-func-quant-types`' signature rewrite,
`strip_storage_signature` below). On the `func.func @main` of a lifted ONNX model:

* an argument whose every use is a `quant.qcast` to one and the same type (or an `onnx.Shape` / `onnx.Size`,
  which read only the shape) takes that type; the qcasts go and their users read the argument;
* a result returned straight from a `quant.dcast` becomes the dcast's operand (the dcast goes when
  nothing else reads it).

    func.func @main(%arg0: tensor<4xf32> {onnx.name = "x"}) -> (tensor<4xf32> {onnx.name = "y"}) {
      %0 = quant.qcast %arg0 : tensor<4xf32> to tensor<4x!q>
      %1 = quant.dcast %0 : tensor<4x!q> to tensor<4xf32>
      %2 = "onnx.Relu"(%1) : (tensor<4xf32>) -> tensor<4xf32>
      %3 = quant.qcast %2 : tensor<4xf32> to tensor<4x!q>
      %4 = quant.dcast %3 : tensor<4x!q> to tensor<4xf32>
      return %4 : tensor<4xf32>
    }

becomes

    func.func @main(%arg0: tensor<4x!q> {onnx.name = "x"}) -> (tensor<4x!q> {onnx.name = "y"}) {
      %1 = quant.dcast %arg0 : tensor<4x!q> to tensor<4xf32>
      %2 = "onnx.Relu"(%1) : (tensor<4xf32>) -> tensor<4xf32>
      %3 = quant.qcast %2 : tensor<4xf32> to tensor<4x!q>
      return %3 : tensor<4x!q>
    }

An input or output stays float, with a reason per name (`Boundary.float_reasons`), when it is not
quantized on entry / dequantized on exit, when a float op reads the input beside its quantize, when its
quantizes disagree (mixed parameters), or when its type cannot cross the boundary
(`qconvert.storage_metadata.boundary_problem`: storage other than u8/i8/u16/i16/u4/i4, blocked
quantization, per-axis along a dynamic axis). `inputs` / `outputs` select names ("all" by default); a
name asked for by name that does not exist, or cannot be stripped, is an InputError that says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from qconvert.errors import InputError
from qconvert.ir.attributes import ArrayAttr, Attribute, DictionaryAttr, StringAttr
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp, ReturnOp
from qconvert.ir.dialects.onnx import ELEM_TYPE, main_function, op_label, signature_names
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp, StorageCastOp
from qconvert.ir.printer import print_type
from qconvert.ir.quant_types import QuantizedType
from qconvert.ir.types import FloatType, FunctionType, Type, element_type_of
from qconvert.passes import ModulePass, PassResult, register_pass
from qconvert.passes.strip_func_quant_types import (
    StorageCastRewriter,
    StripFunctionSignature,
    StripReturn,
    is_stripped_type,
)
from qconvert.storage_metadata import boundary_problem, storage_name

__all__ = [
    "ALL",
    "AbsorbBoundaryQuantCastsPass",
    "Boundary",
    "absorb_boundary_quant_casts",
    "parse_selection",
    "strip_storage_signature",
]

ALL = "all"
NONE = "none"
MAX_LISTED = 3  # consumers named in a reason
# Ops that read only their operand's shape, which the storage tensor shares: they may read a stripped input.
SHAPE_READERS = frozenset({"onnx.Shape", "onnx.Size"})


@dataclass
class Boundary:
    """What `absorb_boundary_quant_casts` did: the quantized type each absorbed input / output now has (in
    signature order), and why each other input / output stays float."""

    inputs: dict[str, Type] = field(default_factory=dict)
    outputs: dict[str, Type] = field(default_factory=dict)
    float_reasons: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs)

    def lines(self) -> list[str]:
        """The summary the CLI prints: `stripped input 'x': uint8 !quant.uniform<...>`, then the names kept
        float with why (`kept float 'ids': ...`)."""
        lines = []
        for kind, values in (("input", self.inputs), ("output", self.outputs)):
            for name, type_ in values.items():
                quant_type = element_type_of(type_)
                assert isinstance(quant_type, QuantizedType)
                lines.append(f"stripped {kind} '{name}': {storage_name(quant_type)} {print_type(quant_type)}")
        lines += [f"kept float '{name}': {reason}" for name, reason in self.float_reasons.items()]
        return lines


def parse_selection(text: str | Sequence[str] | None, what: str) -> tuple[str, ...] | None:
    """`"all"` / None -> None (every name); `"none"` -> (); `"a,b"` or ["a", "b"] -> ("a", "b")."""
    if text is None:
        return None
    if isinstance(text, str):
        if text.strip() == ALL:
            return None
        if text.strip() == NONE:
            return ()
        text = text.split(",")
    names = tuple(name.strip() for name in text)
    if not all(names):
        raise InputError(f"{what}: an empty name in {','.join(names)!r} (give all, none or NAME,NAME)")
    return names


def _check_names(asked: tuple[str, ...] | None, names: list[str], what: str) -> None:
    unknown = [name for name in asked or () if name not in names]
    if unknown:
        raise InputError(
            f"{what}: no graph {what.strip('-').rstrip('s')} named {', '.join(map(repr, unknown))}; "
            f"the model's are {', '.join(map(repr, names)) or 'none'}"
        )


def _listed(ops: Sequence[Operation]) -> str:
    labels = list(dict.fromkeys(op_label(op) for op in ops))
    more = f" and {len(labels) - MAX_LISTED} more" if len(labels) > MAX_LISTED else ""
    return ", ".join(labels[:MAX_LISTED]) + more


def input_problem(argument: Value) -> str | None:
    """Why `argument` cannot take the type it is quantized to; None when it can."""
    element = element_type_of(argument.type)
    users = [user for user, _ in argument.uses]
    if isinstance(element, QuantizedType):
        return f"already quantized ({argument.type})"
    if users and all(isinstance(user, StorageCastOp) for user in users):
        return f"already storage ({argument.type}, read as its quantized type)"
    if not isinstance(element, FloatType):
        return f"its type {argument.type} is not float: nothing quantizes it"
    if not users:
        return "unused"
    quantizes = [user for user in users if isinstance(user, QuantizeCastOp)]
    if not quantizes:
        return f"not quantized on entry (read by {_listed(users)})"
    floats = [
        user for user in users if not isinstance(user, QuantizeCastOp) and user.name not in SHAPE_READERS
    ]
    if floats:
        return f"a float consumer beside its QuantizeLinear: {_listed(floats)}"
    types = {quantize.result.type for quantize in quantizes}
    if len(types) > 1:
        described = "; ".join(
            f"{op_label(q)} to {print_type(element_type_of(q.result.type))}" for q in quantizes
        )
        return f"mixed parameters: {described}"
    if any("onnx.precision" in quantize.attributes for quantize in quantizes):
        return f"its QuantizeLinear sets precision: {_listed(quantizes)}"
    return boundary_problem(quantizes[0].result.type)


def output_problem(value: Value) -> str | None:
    """Why the returned `value` cannot be replaced by what its dequantize reads; None when it can."""
    producer = value.owner_op()
    if producer is None:
        return "a graph input returned as it is"
    if isinstance(element_type_of(value.type), QuantizedType):
        return f"already quantized ({value.type})"
    if isinstance(producer, StorageCastOp):
        return f"already storage ({value.type})"
    if not isinstance(producer, DequantizeCastOp):
        return f"not dequantized on exit (computed by {op_label(producer)})"
    return boundary_problem(producer.input.type)


def _set_signature_attribute(function: FuncOp, key: str, index: int, name: str, value: Attribute) -> None:
    """Set `name` in entry `index` of `arg_attrs` / `res_attrs` (`key`)."""
    entries = function.attributes.get(key)
    elements = list(entries.elements) if isinstance(entries, ArrayAttr) else []
    count = len(function.function_type.inputs if key == "arg_attrs" else function.function_type.results)
    elements += [DictionaryAttr(())] * (count - len(elements))
    entry = elements[index]
    items = dict(entry.entries) if isinstance(entry, DictionaryAttr) else {}
    items[name] = value
    elements[index] = DictionaryAttr(tuple(items.items()))
    function.attributes[key] = ArrayAttr(tuple(elements))


def absorb_boundary_quant_casts(
    module: ModuleOp,
    inputs: str | Sequence[str] | None = ALL,
    outputs: str | Sequence[str] | None = ALL,
) -> Boundary:
    """Absorb @main's entry quantizes and exit dequantizes into its signature (see the module doc).

    Raises InputError for a name of `inputs` / `outputs` that @main does not have, or that was asked for
    by name and cannot be absorbed (the message says why); with "all", such names stay float with a reason.
    """
    function = main_function(module, "to strip")
    asked_inputs = parse_selection(inputs, "--inputs")
    asked_outputs = parse_selection(outputs, "--outputs")
    input_names = [name or f"arg{i}" for i, name in enumerate(signature_names(function, "inputs"))]
    output_names = [name or f"result{i}" for i, name in enumerate(signature_names(function, "outputs"))]
    _check_names(asked_inputs, input_names, "--inputs")
    _check_names(asked_outputs, output_names, "--outputs")
    boundary = Boundary()
    refused: list[str] = []

    def absorbable(name: str, kind: str, asked: tuple[str, ...] | None, problem: str | None) -> bool:
        """Whether to absorb `name`; records why not (an error when it was asked for by name)."""
        if asked is not None and name not in asked:
            boundary.float_reasons.setdefault(name, f"not selected (--{kind}s)")
            return False
        if problem is None:
            return True
        if asked is not None:
            refused.append(f"{kind} '{name}' cannot be stripped: {problem}")
        boundary.float_reasons.setdefault(name, problem)
        return False

    arguments = [
        (index, argument, name)
        for index, (argument, name) in enumerate(zip(function.body.arguments, input_names, strict=True))
        if absorbable(name, "input", asked_inputs, input_problem(argument))
    ]
    returned = function.body.terminator
    assert isinstance(returned, ReturnOp), f"@{function.sym_name} ends without func.return"
    results = [
        (index, value, name)
        for index, (value, name) in enumerate(zip(returned.operands, output_names, strict=True))
        if absorbable(name, "output", asked_outputs, output_problem(value))
    ]
    if refused:  # before anything changes
        raise InputError("; ".join(refused))

    argument_types = list(function.function_type.inputs)
    for index, argument, name in arguments:
        quantizes = [user for user, _ in argument.uses if isinstance(user, QuantizeCastOp)]
        argument.type = argument_types[index] = quantizes[0].results[0].type
        for quantize in quantizes:
            quantize.results[0].replace_all_uses_with(argument)
            quantize.erase()
        boundary.inputs[name] = argument.type
    result_types = list(function.function_type.results)
    for index, value, name in results:
        dequantize = value.owner_op()
        assert isinstance(dequantize, DequantizeCastOp)
        returned.set_operand(index, dequantize.input)
        result_types[index] = dequantize.input.type
        boundary.outputs[name] = dequantize.input.type
    for _, value, _ in results:  # after every result moved: one dequantize may feed two results
        dequantize = value.owner_op()
        if dequantize is not None and dequantize.parent is not None and not dequantize.results[0].has_uses:
            dequantize.erase()
    function.function_type = FunctionType(tuple(argument_types), tuple(result_types))
    return boundary


def strip_storage_signature(module: ModuleOp) -> None:
    """`strip-func-quant-types`' signature rewrite on @main: quantized arguments and results become their
    storage (`tensor<..xi8>`, signless as upstream makes it) with `quant.scast` glue; an unsigned one gets
    `onnx.elem_type` ("uint8"), as the lifter marks unsigned graph inputs and outputs. A result that is a
    view of storage (an integer op's output) returns that storage, and `onnx.Shape` / `onnx.Size` read a
    stripped argument itself: the glue the lifter makes of the written model, no more.

    NOTE: the pass itself also folds every `dcast(qcast(x))` in the module, as upstream's conversion does
    (its target names only the func ops): that would drop the body's fake quantization, which is the
    model's arithmetic here. So only its patterns run, with a rewriter that folds nothing.
    """
    function = main_function(module, "to strip")
    argument_types = function.function_type.inputs
    result_types = function.function_type.results
    returned = function.body.terminator
    assert isinstance(returned, ReturnOp)
    rewriter = StorageCastRewriter()
    views = []
    for value in returned.operands:
        view = value.owner_op()
        if (
            isinstance(view, StorageCastOp)
            and is_stripped_type(view.input.type)
            and not is_stripped_type(value.type)
        ):
            # A result that is already a view of storage (an integer op's output, dequantized) returns that
            # storage: no cast back (upstream would fold the scast pair).
            rewriter.storage_twins[value] = view.input
            views.append(view)
    StripFunctionSignature().match_and_rewrite(function, rewriter)
    StripReturn().match_and_rewrite(returned, rewriter)
    rewriter.finish()
    for argument in function.body.arguments:
        for view, _ in list(argument.uses):
            if isinstance(view, StorageCastOp):  # the glue: shape readers read the storage (same shape)
                for user, index in list(view.result.uses):
                    if user.name in SHAPE_READERS:
                        user.set_operand(index, argument)
                views.append(view)
    for view in views:
        if view.parent is not None and not view.result.has_uses:
            view.erase()
    for key, types in (("arg_attrs", argument_types), ("res_attrs", result_types)):
        for index, type_ in enumerate(types):
            quant_type = element_type_of(type_)
            if isinstance(quant_type, QuantizedType) and not quant_type.is_signed:
                _set_signature_attribute(
                    function, key, index, ELEM_TYPE, StringAttr(storage_name(quant_type) or "")
                )


@register_pass
@dataclass(frozen=True, kw_only=True)
class AbsorbBoundaryQuantCastsPass(ModulePass):
    """@main takes its inputs' quantized types and returns its outputs' (`inputs` / `outputs`: all, none or
    NAME,NAME); `strip-storage=true` then strips the signature to storage types, as onnx-storage writes it."""

    name: ClassVar[str] = "absorb-boundary-quant-casts"
    inputs: str = ALL
    outputs: str = ALL
    strip_storage: bool = False

    def run(self, module: Operation) -> PassResult:
        assert isinstance(module, ModuleOp)
        boundary = absorb_boundary_quant_casts(module, self.inputs, self.outputs)
        if self.strip_storage and boundary:
            strip_storage_signature(module)
        return PassResult(changed=bool(boundary))
