"""The TOSA backend's entry points: a lifted IR module -> integer-only TOSA 1.0 (our IR, generic form).

    from qconvert.backends.tosa import TosaOptions, convert_to_tosa, write_tosa
    tosa_module = convert_to_tosa(module, TosaOptions(rounding="double"))

The route upstream takes: StableHLO's quantized form (the StableHLO facade's `convert_to_stablehlo`, pure:
no engine write-outs, arithmetic fused so that every convolution / dot_general / bias add is on integers
and each requantization one `uniform_quantize`), then legalize_quant.py's rescales and legalize.py's
patterns, one per StableHLO op, then folds. No ONNX op is lowered here: their meaning is the StableHLO
backend's.

The function boundary takes and returns storage integers (strip-func-quant-types' semantics): an argument
whose every use quantizes it to one type becomes that type's storage, a result that is a dequantize
returns the storage it reads, each with `qconvert.quant_type = "!quant.uniform<...>"` among its
attributes. What remains float or StableHLO after the patterns is one InputError listing every op.
"""

from __future__ import annotations

from collections import Counter
from typing import IO

from qconvert.atomic_file import atomic_text_file
from qconvert.errors import InputError
from qconvert.ir.attributes import ArrayAttr, Attribute, DictionaryAttr, StringAttr
from qconvert.ir.core import Block, Builder, Operation
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.dialects.onnx import main_function
from qconvert.ir.printer import print_type, write_module
from qconvert.ir.types import FloatType, FunctionType, element_type_of
from qconvert.numerics.tosa import TosaRounding
from qconvert.passes.dce import erase_unused
from qconvert.passes.rewrite import apply_patterns

from .backend import TosaOptions
from .float_island import FloatIslandToTable
from .legalize import fold_patterns, legalize_patterns
from .legalize_quant import FloatMeanToReduceSum, FloatProductToMul, RequantizeToRescale
from .storage import CAST, Refusals, fold_casts, materialize, quant_type, storage_type

__all__ = ["QUANT_TYPE", "convert_to_tosa", "write_tosa"]

QUANT_TYPE = "qconvert.quant_type"
"""The attribute of a storage argument / result naming the quantized type its integers are."""


def _with_attribute(entries: Attribute | None, name: str, value: Attribute) -> DictionaryAttr:
    kept = entries.entries if isinstance(entries, DictionaryAttr) else ()
    return DictionaryAttr(tuple(sorted({**dict(kept), name: value}.items())))


def _attribute_list(function: FuncOp, key: str, count: int) -> list[Attribute | None]:
    existing = function.attributes.get(key)
    if isinstance(existing, ArrayAttr):
        return list(existing.elements)
    return [None] * count


def storage_boundary(function: FuncOp) -> None:
    """Arguments quantized on entry take their storage; results dequantized on exit return it."""
    body = function.body
    inputs = list(function.function_type.inputs)
    arg_attrs = _attribute_list(function, "arg_attrs", len(inputs))
    for index, argument in enumerate(body.arguments):
        users = [user for user, _ in argument.uses]
        if not users or any(user.name != "stablehlo.uniform_quantize" for user in users):
            continue
        types = {user.result.type for user in users}
        if len(types) != 1:
            continue
        (quantized,) = types
        argument.type = inputs[index] = storage_type(quantized)
        builder = Builder.at_start(body)
        as_quantized = materialize(builder, argument, quantized)
        for user in users:
            user.result.replace_all_uses_with(as_quantized)
            user.erase()
        element = quant_type(quantized)
        arg_attrs[index] = _with_attribute(arg_attrs[index], QUANT_TYPE, StringAttr(print_type(element)))
    terminator = body.terminator
    assert terminator is not None
    results = list(function.function_type.results)
    res_attrs = _attribute_list(function, "res_attrs", len(results))
    for index, value in enumerate(list(terminator.operands)):
        producer = value.owner_op()
        if producer is None or producer.name != "stablehlo.uniform_dequantize":
            continue
        quantized = producer.operands[0].type
        storage = materialize(Builder.before(terminator), producer.operands[0], storage_type(quantized))
        terminator.set_operand(index, storage)
        results[index] = storage.type
        element = quant_type(quantized)
        res_attrs[index] = _with_attribute(res_attrs[index], QUANT_TYPE, StringAttr(print_type(element)))
    function.function_type = FunctionType(tuple(inputs), tuple(results))
    empty = DictionaryAttr(())
    function.attributes["arg_attrs"] = ArrayAttr(tuple(a if a is not None else empty for a in arg_attrs))
    function.attributes["res_attrs"] = ArrayAttr(tuple(a if a is not None else empty for a in res_attrs))


def _not_legalized(body: Block) -> list[Operation]:
    """The ops left that are not TOSA or are float TOSA (PRO-INT has none); the casts between storage and
    quantized types are the legalization's own glue around them, not ops of the model."""
    return [
        op
        for op in body.ops
        if not op.is_terminator and op.name != CAST and (not op.name.startswith("tosa.") or _is_float(op))
    ]


def _is_float(op: Operation) -> bool:
    types = [value.type for value in [*op.operands, *op.results]]
    return any(isinstance(element_type_of(type_), FloatType) for type_ in types)


def _refusal_message(left: list[Operation], refusals: Refusals) -> str:
    lines = []
    counts = Counter((op.name, refusals.reason(op) or _default_reason(op)) for op in left)
    for (name, reason), count in counts.items():
        times = f" (x{count})" if count > 1 else ""
        lines.append(f"  {name}{times}: {reason}")
    return "cannot convert to integer-only TOSA; these ops remain:\n" + "\n".join(lines)


def _default_reason(op: Operation) -> str:
    if op.name == "stablehlo.uniform_quantize" or op.name == "stablehlo.uniform_dequantize":
        return "the edge of a float region (integer TOSA has no float values)"
    if op.name.startswith("tosa."):
        return "a float TOSA op (PRO-INT has none)"
    if _is_float(op):
        return "float arithmetic the quantized form leaves unfused (PRO-INT has no float ops)"
    return "no TOSA lowering yet"


def convert_to_tosa(module: ModuleOp, options: TosaOptions | None = None) -> ModuleOp:
    """A new module holding `@main` as integer-only TOSA 1.0 ops (storage in and out).

    Raises InputError listing every op that cannot be integer TOSA (and for options not supported yet)."""
    from qconvert.backends.stablehlo import convert_to_stablehlo

    options = options if options is not None else TosaOptions()
    if options.float_boundary or options.allow_float:
        raise InputError(
            "--float-boundary and --allow-float (float TOSA, PRO-FP) are not supported yet: the TOSA backend "
            "emits integer-only TOSA with storage inputs and outputs"
        )
    rounding = TosaRounding(options.rounding)
    converted = convert_to_stablehlo(
        module, "quantized", "stablehlo", fuse_arithmetic=True, engine_profile=None
    )
    function = main_function(converted, "to convert")
    storage_boundary(function)
    body = function.body
    refusals = Refusals()
    patterns = [
        RequantizeToRescale(rounding, refusals),
        FloatMeanToReduceSum(rounding, refusals),
        FloatProductToMul(rounding, refusals),
        FloatIslandToTable(refusals),
        *legalize_patterns(refusals),
    ]
    apply_patterns(body, patterns, nested=False)
    while fold_casts(list(body.ops)):
        pass
    erase_unused(body, lambda op: not op.is_terminator)
    apply_patterns(body, fold_patterns(), nested=False)
    erase_unused(body, lambda op: not op.is_terminator)
    left = _not_legalized(body)
    if left:
        raise InputError(_refusal_message(left, refusals))
    return converted


def write_tosa(converted: ModuleOp, output: str | IO[str]) -> None:
    """Write a converted module to a stream, or to a path atomically (temporary file, then rename)."""
    if not isinstance(output, str):
        write_module(converted, output)
        return
    with atomic_text_file(output) as stream:
        write_module(converted, stream)
