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

import numpy as np

from qconvert.errors import InputError
from qconvert.ir.attributes import ArrayAttr, Attribute, DictionaryAttr, StringAttr
from qconvert.ir.core import Block, Builder, Operation, Value
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.dialects.onnx import main_function, node_name
from qconvert.ir.dialects.qconvert import NOTE, QOperatorOp
from qconvert.ir.printer import print_type, write_module_to
from qconvert.ir.quant_types import UniformQuantizedType
from qconvert.ir.types import F32, I8, I32, FloatType, FunctionType, RankedTensorType, Type, element_type_of
from qconvert.numerics.tosa import TosaRounding
from qconvert.passes.dce import erase_unused
from qconvert.passes.inline import clone_op
from qconvert.passes.qoperator_to_qdq import qoperator_to_qdq
from qconvert.passes.rewrite import apply_patterns

from . import ops
from .constant_sums import ConstantSumToTable
from .float_island import FloatIslandToTable, FloatLinearCombination, FloatPerChannelAffine
from .float_ops import Labels, float_patterns, island_nodes, labelled_lowerings, profile_note
from .index_ops import index_patterns, narrow_index_arguments, note_arguments
from .legalize import fold_patterns, legalize_patterns
from .legalize_quant import (
    FloatClampToClamp,
    FloatConvToQuantizedConv,
    FloatDotToQuantizedDot,
    FloatMeanToReduceSum,
    FloatProductToMul,
    FloatSumToAccumulatorAdd,
    PerChannelWeightZeroPoints,
    RequantizeToRescale,
    rescale_to,
    storage_zero_point,
)
from .options import TosaOptions
from .pool_ties import AveragePoolTiesToEven, FloatAveragePoolRequantized
from .softmax import IntegerSoftmax
from .storage import (
    CAST,
    Refusals,
    fold_casts,
    is_uniform,
    materialize,
    quant_type,
    storage_of,
    storage_type,
)

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


def signless_boundary(function: FuncOp) -> None:
    """Unsigned storage results (a uint8 graph output written by a QuantizeLinear, as check's group cases
    have) as the signless integers TOSA takes, the same bits: a result cast from signless storage returns
    that storage (signless_arguments does the inputs)."""
    body = function.body
    terminator = body.terminator
    assert terminator is not None
    results = list(function.function_type.results)
    for index, value in enumerate(list(terminator.operands)):
        producer = value.owner_op()
        if producer is None or producer.name != CAST or quant_type(value) is not None:
            continue
        source = producer.operands[0]
        if isinstance(value.type, RankedTensorType) and source.type == storage_type(value.type):
            terminator.set_operand(index, source)
            results[index] = source.type
    function.function_type = FunctionType(function.function_type.inputs, tuple(results))
    while fold_casts(list(body.ops)):
        pass
    erase_unused(body, lambda op: not op.is_terminator)


def signless_arguments(function: FuncOp) -> None:
    """Unsigned storage arguments (not quantized on entry) take the signless type of their bits before the
    patterns run, seen as before by their users through a cast, so that every op built on them is signless."""
    body = function.body
    inputs = list(function.function_type.inputs)
    for index, argument in enumerate(body.arguments):
        if not isinstance(argument.type, RankedTensorType) or quant_type(argument) is not None:
            continue
        unsigned, signless = argument.type, storage_type(argument.type)
        if signless == unsigned:
            continue
        users = list(argument.uses)
        argument.type = inputs[index] = signless
        builder = Builder.at_start(body)
        for user, operand_index in users:
            if user.name == "stablehlo.bitcast_convert" and quant_type(user.results[0]) is not None:
                # the storage of a quantized value: the signless bits, as storage_of reads them
                user.results[0].replace_all_uses_with(materialize(builder, argument, user.results[0].type))
                user.erase()
            else:
                user.set_operand(operand_index, materialize(builder, argument, unsigned))
    function.function_type = FunctionType(tuple(inputs), function.function_type.results)


def _float_constant(b: Builder, value: float, rank: int) -> Value:
    """A float constant of `rank` dims of 1 (TOSA's elementwise ops take operands of one rank)."""
    return _note(ops.const(b, np.array(value, np.float32).reshape([1] * rank), F32), _BOUNDARY_NOTE)


def _boundary_params(type_: Type) -> tuple[float, int] | None:
    """Scale and zero point of a per-tensor quantized type with 8-bit signed storage, else None."""
    element = quant_type(type_)
    if not isinstance(element, UniformQuantizedType) or not element.is_signed:
        return None
    if element.storage_type.width != 8:  # type: ignore[union-attr]
        return None
    return float(element.scale), int(element.zero_point)


def _note(value: Value, text: str) -> Value:
    producer = value.owner_op()
    assert producer is not None
    producer.attributes[NOTE] = StringAttr(text)
    return value


_BOUNDARY_NOTE = "float boundary (PRO-FP)"
_QUANTIZE_NOTE = (
    "float boundary (PRO-FP): ONNX QuantizeLinear as x * (1/s) cast to i32 (round half even), + zp"
)
_DEQUANTIZE_NOTE = "float boundary (PRO-FP): ONNX DequantizeLinear (q - zp) * s in f32"


def float_boundary(function: FuncOp, rounding: TosaRounding) -> list[str]:
    """Quantize float arguments and dequantize results in TOSA float ops at the edges (PRO-FP), each noted;
    returns why an edge could not be done so (then it stays a StableHLO op, reported)."""
    body = function.body
    problems = []
    for argument in body.arguments:
        users = [user for user, _ in argument.uses if user.name == "stablehlo.uniform_quantize"]
        for user in users:
            params = _boundary_params(user.result.type)
            if params is None:
                problems.append(f"an input quantized to {user.result.type} (per-tensor signed 8-bit only)")
                continue
            scale, zero_point = params
            b = Builder.before(user)
            rank = len(user.result.type.shape)  # type: ignore[attr-defined]
            scaled = ops.mul(b, argument, _float_constant(b, 1.0 / scale, rank), ops.zero_point(b, 0, I8))
            # clamped to the storage's range less zp (as QuantizeFromFloat): a huge or infinite input would
            # cast to +-2**31 and overflow the rescale's apply_scale_32 (REQUIRE: UNPREDICTABLE)
            target = user.result.type.element_type  # type: ignore[attr-defined]
            low, high = target.storage_type_min - zero_point, target.storage_type_max - zero_point
            clamped = _note(ops.clamp(b, _note(scaled, _QUANTIZE_NOTE), low, high), _QUANTIZE_NOTE)
            rounded = _note(ops.cast(b, clamped, I32), _QUANTIZE_NOTE)
            storage = rescale_to(
                b, rounded, np.array([1.0]), 0, zero_point, storage_type(user.result.type), rounding
            )
            user.result.replace_all_uses_with(materialize(b, storage, user.result.type))
            user.erase()
    terminator = body.terminator
    assert terminator is not None
    for index, value in enumerate(list(terminator.operands)):
        producer = value.owner_op()
        if producer is None or producer.name != "stablehlo.uniform_dequantize":
            continue
        params = _boundary_params(producer.operands[0].type)
        if params is None:
            problems.append(f"an output of {producer.operands[0].type} (per-tensor signed 8-bit only)")
            continue
        scale, zero_point = params
        b = Builder.before(terminator)
        rank = len(value.type.shape)  # type: ignore[attr-defined]
        real = _note(ops.cast(b, storage_of(b, producer.operands[0]), F32), _DEQUANTIZE_NOTE)
        centred = _note(ops.sub(b, real, _float_constant(b, float(zero_point), rank)), _DEQUANTIZE_NOTE)
        scaled = ops.mul(b, centred, _float_constant(b, scale, rank), ops.zero_point(b, 0, I8))
        terminator.set_operand(index, _note(scaled, _DEQUANTIZE_NOTE))
    return problems


def _not_legalized(body: Block) -> list[Operation]:
    """The ops left that are not TOSA or are float TOSA (PRO-INT has none); the casts between storage and
    quantized types are the legalization's own glue around them, not ops of the model."""
    return [
        op
        for op in body.ops
        if not op.is_terminator
        and op.name not in (CAST, "tosa.const", "tosa.const_shape")  # constants of the ops listed
        and (not op.name.startswith("tosa.") or (_is_float(op) and NOTE not in op.attributes))
    ]


def _is_float(op: Operation) -> bool:
    types = [value.type for value in [*op.operands, *op.results]]
    return any(isinstance(element_type_of(type_), FloatType) for type_ in types)


def _refusal_message(left: list[Operation], refusals: Refusals, allow_float: bool = False) -> str:
    lines = []
    counts = Counter((op.name, refusals.reason(op) or _default_reason(op)) for op in left)
    for (name, reason), count in counts.items():
        times = f" (x{count})" if count > 1 else ""
        lines.append(f"  {name}{times}: {reason}")
    if allow_float:
        return (
            "cannot convert to TOSA, even with float islands (--allow-float); these ops remain:\n"
            + "\n".join(lines)
        )
    hint = "\n(--allow-float keeps what cannot be integer as float TOSA ops: PRO-INT + PRO-FP)"
    return "cannot convert to integer-only TOSA; these ops remain:\n" + "\n".join(lines) + hint


def _default_reason(op: Operation) -> str:
    if op.name == "stablehlo.uniform_quantize" or op.name == "stablehlo.uniform_dequantize":
        return "the edge of a float region (integer TOSA has no float values)"
    if op.name.startswith("tosa."):
        return "a float TOSA op (PRO-INT has none)"
    if _is_float(op):
        return "float arithmetic the quantized form leaves unfused (PRO-INT has no float ops)"
    return "no TOSA lowering yet"


def _as_qdq(module: ModuleOp) -> ModuleOp:
    """A copy of `module` whose QOperator ops are the QDQ form of their ONNX definitions (qoperator-to-qdq):
    the StableHLO backend writes QLinear ops out as onnxruntime's kernels, which no TOSA pattern reads,
    while its quantized form of dcast -> op -> qcast is what legalize_quant.py rescales. Without QOperator
    ops, `module` itself."""
    if not any(isinstance(op, QOperatorOp) for op in module.walk()):
        return module
    copied = clone_op(module, {})
    assert isinstance(copied, ModuleOp)
    qoperator_to_qdq(copied)
    return copied


def convert_to_tosa(module: ModuleOp, options: TosaOptions | None = None) -> ModuleOp:
    """A new module holding `@main` as integer-only TOSA 1.0 ops (storage in and out).

    Raises InputError listing every op that cannot be integer TOSA (and for options not supported yet)."""
    from qconvert.backends.stablehlo import convert_to_stablehlo

    options = options if options is not None else TosaOptions()
    _refuse_asymmetric_16_bit(module)
    labels: Labels = {}  # --allow-float: StableHLO op -> the ONNX node it computes, for the islands' notes
    rounding = TosaRounding(options.rounding)
    converted = convert_to_stablehlo(
        _as_qdq(module),
        "quantized",
        "stablehlo",
        fuse_arithmetic=True,
        engine_profile=None,
        lowerings=labelled_lowerings(labels) if options.allow_float else None,  # type: ignore[arg-type]
    )
    function = main_function(converted, "to convert")
    if options.float_boundary:
        float_boundary(function, rounding)
    else:
        storage_boundary(function)
    narrowed = narrow_index_arguments(function)  # i64 token ids: i32, TOSA's gather index
    signless_arguments(function)
    body = function.body
    refusals = Refusals()
    if options.constant_sum_tables:  # before the accumulator add's lowering takes the add
        apply_patterns(body, [ConstantSumToTable()], nested=False)
        erase_unused(body, lambda op: not op.is_terminator)  # the constants' quantizes, now unread
    patterns = [
        *([IntegerSoftmax(refusals)] if options.integer_softmax else []),  # before its pieces' patterns
        PerChannelWeightZeroPoints(refusals),  # before conv2d / matmul, which take one weight zero point
        *legalize_patterns(refusals),  # first: a quantize of a plain dequantize is no float island
        RequantizeToRescale(rounding, refusals),
        FloatAveragePoolRequantized(rounding, refusals),  # a pool to another scale than its input's
        FloatClampToClamp(refusals),  # before the tables: a Relu of one type in and out is a clamp
        FloatMeanToReduceSum(rounding, refusals),
        FloatProductToMul(rounding, refusals),
        FloatDotToQuantizedDot(refusals),
        FloatConvToQuantizedConv(refusals),
        FloatSumToAccumulatorAdd(refusals),
        FloatIslandToTable(refusals),
        FloatPerChannelAffine(rounding, refusals),
        FloatLinearCombination(refusals),
        *index_patterns(refusals),
    ]
    apply_patterns(body, patterns, nested=False)
    if options.allow_float:  # what the integer patterns left, as float TOSA (PRO-FP), each op noted
        apply_patterns(body, float_patterns(refusals, labels), nested=False)
    while fold_casts(list(body.ops)):
        pass
    erase_unused(body, lambda op: not op.is_terminator)
    apply_patterns(body, [AveragePoolTiesToEven()], nested=False)  # onnxruntime's ties on 2**k windows
    apply_patterns(body, fold_patterns(), nested=False)
    erase_unused(body, lambda op: not op.is_terminator)
    signless_boundary(function)
    left = _not_legalized(body)
    if left:
        raise InputError(_refusal_message(left, refusals, options.allow_float))
    note_arguments(function, narrowed)
    if options.allow_float:
        converted.attributes[NOTE] = StringAttr(profile_note(island_nodes(body)))
    return converted


def _refuse_asymmetric_16_bit(module: ModuleOp) -> None:
    """Before converting: every 16-bit quantized value with a non-zero zero point, named (the ONNX node that
    makes it, and the tensor a QuantizeLinear quantizes), in one InputError that says the fix."""
    found: dict[str, int] = {}
    for op in module.walk():
        for value in op.results:
            type_ = quant_type(value)
            if type_ is None or getattr(type_.storage_type, "width", 0) != 16 or not is_uniform(type_):
                continue
            zero_points = storage_zero_point(type_)
            if (zero_points == 0).all():
                continue
            name = (
                node_name(op) or op.name
            )  # our calibrate and onnxruntime name a Q node TENSOR_QuantizeLinear
            found.setdefault(name.removesuffix("_QuantizeLinear"), int(zero_points[zero_points != 0][0]))
    if not found:
        return
    listed = ", ".join(f"'{name}' (zero point {zero_point})" for name, zero_point in list(found.items())[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    raise InputError(
        f"cannot convert to TOSA: 16-bit activations with a non-zero zero point: {listed}{more}. TOSA's "
        "int16 ops take zero point 0: calibrate them symmetric (`qconvert calibrate --overrides` "
        'with {"quant_type": "QInt16", "symmetric": true} for each, or onnxruntime\'s '
        "ActivationSymmetric=True)"
    )


def write_tosa(converted: ModuleOp, output: str | IO[str]) -> None:
    """Write a converted module to a stream, or to a path atomically (temporary file, then rename)."""
    write_module_to(converted, output)
