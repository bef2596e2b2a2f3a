"""`--normalize-quant-types`: sub-channel quantized tensors that are really per-tensor or per-axis become so.

Runs on every `func.func` directly inside the module (upstream anchors the pass on `func::FuncOp`).
Inside such a function, every tensor type whose element type is a sub-channel `!quant.uniform` is
rewritten when its scales table allows it:

1. one scale (the table has one element) -> per-tensor;
2. exactly one table dimension is not 1 -> per-axis on that dimension, scales and zero points in order;
3. anything else stays sub-channel.

Where rule 2's dimension has a block size above 1 (`tensor<4x2x!quant.uniform<i4:f32:{0:2},
{{0.125},{0.25}}>>`), upstream (torch-mlir 20261001) writes a per-axis type with one scale per block, which
fails verification (`quantized dimension size does not match number of scales`). We write a type that
means the same values instead: per-tensor when every scale and zero point is equal, else per-axis with
each block's scale and zero point repeated over its block (`{1.25e-01,1.25e-01,2.5e-01,2.5e-01}`); a type
whose repetition would exceed MAX_REPEATED_SCALES entries stays sub-channel.

The storage type, its signedness flag, the storage bounds and the expressed type are kept. Sub-channel
zero points are held at the storage width and read signed, so a `u8` zero point written 200 becomes
`-56` (upstream sign-extends its APInt the same way). Scales are converted to f64 exactly: an f16 scale
0.3 becomes `0.300048828125`.

What is rewritten, as upstream's conversion does it: the signature and block arguments of the function
(a bodiless `private` declaration too) and of nested `func.func` ops, and every op that has a sub-channel
tensor among its operand or result types (call sites, returns and unknown ops alike): its results and the
block arguments of its regions. Attributes are not rewritten (an op's `{t = tensor<...>}` keeps its type),
nor are bare scalar sub-channel types, since a scalar cannot carry sub-channel quantization. No op is
added: the rewrite changes types, never values, except that a cast pair it would rewrite folds as
upstream folds it (`quant.dcast(quant.qcast(%x))` becomes `%x`; the qcast stays).

    func.func private @callee(tensor<?x?x!quant.uniform<i8:f32:{0:1,1:4}, {{2.0:127}}>>)
    func.func @f(%arg0: tensor<2x?x!quant.uniform<u8:f32:{0:1}, {{2.0:200}, {3.0}}>>) {
      %0 = "test.custom_op"(%arg0) : (tensor<2x?x!quant.uniform<u8:f32:{0:1}, {{2.0:200}, {3.0}}>>)
          -> tensor<2x?x!quant.uniform<u8:f32:{0:1}, {{2.0:200}, {3.0}}>>
      return
    }

becomes

    func.func private @callee(tensor<?x?x!quant.uniform<i8:f32, 2.000000e+00:127>>)
    func.func @f(%arg0: tensor<2x?x!quant.uniform<u8:f32:0, {2.000000e+00:-56,3.000000e+00}>>) {
      %0 = "test.custom_op"(%arg0) : (tensor<2x?x!quant.uniform<u8:f32:0, {2.000000e+00:-56,3.000000e+00}>>)
          -> tensor<2x?x!quant.uniform<u8:f32:0, {2.000000e+00:-56,3.000000e+00}>>
      return
    }

Ops in blocks that no branch reaches are not visited, as upstream does not visit them. The pass fails,
changing nothing, where upstream's does, for want of a cast between the two forms of a type: when an op
with a sub-channel type uses a sub-channel block argument of a region whose owner has none (such an
argument is not rewritten), and when an op that is not visited uses a rewritten value.
NOTE: upstream (torch-mlir 20261001) crashes on a function whose non-entry blocks take sub-channel
arguments; we rewrite those arguments like the entry block's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import ClassVar

from qconvert.errors import Location, VerifyError
from qconvert.ir.core import BlockArgument, Operation, OpResult, Value
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.quant_types import (
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
)
from qconvert.ir.types import FunctionType, RankedTensorType, Type, UnrankedTensorType
from qconvert.passes import ModulePass, PassResult, register_pass
from qconvert.passes.conversion import fold_casts, replace_folded, value_location, walk_in_conversion_order

# The most scales a per-axis type repeated from blocks may have: a type is printed at every use, and
# `{0:65535}` over two scales would print 131,070 of them each time (the fuzz run found it).
MAX_REPEATED_SCALES = 1 << 13

__all__ = [
    "NormalizeQuantTypesPass",
    "check_normalizable",
    "is_normalized",
    "is_normalized_op",
    "normalize_function_type",
    "normalize_functions",
    "normalize_op_types",
    "normalize_quant_type",
    "normalize_sub_channel_type",
    "upstream_writes_invalid",
]


def normalize_sub_channel_type(element: UniformQuantizedSubChannelType) -> QuantizedType:
    """The per-tensor or per-axis type equal to `element`, or `element` itself when there is none.

    `!quant.uniform<i8:f32:{0:1,1:4}, {{2.0:127}}>` -> `!quant.uniform<i8:f32, 2.000000e+00:127>`;
    `!quant.uniform<i8:f32:{0:1}, {{2.0:127}, {3.0:127}}>` -> `!quant.uniform<i8:f32:0, {2.0:127,3.0:127}>`.
    """
    # float() gives the exact f64 of each expressed-type scale, as APFloat::convertToDouble does.
    scales = tuple(float(scale) for scale in element.scales.array.reshape(-1))
    # Zero points are stored wrapped to the storage width and read signed: already sign-extended.
    zero_points = tuple(int(zero_point) for zero_point in element.zero_points.array.reshape(-1))
    common = {
        "storage_type": element.storage_type,
        "expressed_type": element.expressed_type,
        "is_signed": element.is_signed,
        "storage_type_min": element.storage_type_min,
        "storage_type_max": element.storage_type_max,
    }
    if len(scales) == 1:
        return UniformQuantizedType(scale=scales[0], zero_point=zero_points[0], **common)
    non_unit_dimensions = [axis for axis, size in enumerate(element.scales.shape) if size != 1]
    if len(non_unit_dimensions) != 1:
        return element
    axis = non_unit_dimensions[0]
    block_size = dict(element.block_size_info).get(axis, 1)
    if upstream_writes_invalid(element):  # one scale per block would be invalid IR: see the docstring
        if len(set(scales)) == 1 and len(set(zero_points)) == 1:
            return UniformQuantizedType(scale=scales[0], zero_point=zero_points[0], **common)
        if len(scales) * block_size > MAX_REPEATED_SCALES:
            return element
        scales = tuple(scale for scale in scales for _ in range(block_size))
        zero_points = tuple(zero_point for zero_point in zero_points for _ in range(block_size))
    return UniformQuantizedPerAxisType(
        scales=scales, zero_points=zero_points, quantized_dimension=axis, **common
    )


def upstream_writes_invalid(element: Type) -> bool:
    """True for a sub-channel type that upstream normalizes to invalid IR: its one dimension of several
    scales has blocks of several elements (upstream writes one scale per block on a per-axis type)."""
    if not isinstance(element, UniformQuantizedSubChannelType) or element.scales.array.size == 1:
        return False
    axes = [axis for axis, size in enumerate(element.scales.shape) if size != 1]
    return len(axes) == 1 and dict(element.block_size_info).get(axes[0], 1) != 1


def normalize_quant_type(type_: Type) -> Type:
    """The pass's type converter: a tensor of a sub-channel type gets its normalized element type.

    Every other type, a bare scalar sub-channel type included, is returned unchanged.
    """
    if not isinstance(type_, RankedTensorType | UnrankedTensorType):
        return type_
    element = type_.element_type
    if not isinstance(element, UniformQuantizedSubChannelType):
        return type_
    normalized = normalize_sub_channel_type(element)
    return type_ if normalized is element else type_.with_element_type(normalized)


def normalize_function_type(function_type: FunctionType) -> FunctionType:
    """`function_type` with every input and result normalized."""
    return FunctionType(
        tuple(map(normalize_quant_type, function_type.inputs)),
        tuple(map(normalize_quant_type, function_type.results)),
    )


def is_normalized(type_: Type) -> bool:
    """True when the type converter leaves `type_` as it is."""
    return normalize_quant_type(type_) is type_


def is_normalized_op(op: Operation) -> bool:
    """Upstream's legality: a function by its signature and block arguments, any other op by its operand
    and result types."""
    if isinstance(op, FuncOp):
        blocks = op.regions[0].blocks
        types = [*op.function_type.inputs, *op.function_type.results]
        types += [argument.type for block in blocks for argument in block.arguments]
    else:
        types = [*op.operand_types, *op.result_types]
    return all(map(is_normalized, types))


def check_normalizable(ops: Sequence[Operation], folded: Collection[Operation] = ()) -> None:
    """Raise where upstream's conversion fails, before anything is rewritten (so failure changes nothing).

    `ops` are the ops upstream visits, `folded` those it folds away. Upstream has no cast between a
    sub-channel type and its normalized form, so it fails where one would be needed:

    * a rewritten op uses a sub-channel block argument that stays: the argument of a region whose owner
      has no sub-channel type of its own (upstream rewrites block arguments only with their owner);
    * a rewritten value is used by an op upstream does not visit (one in a block no branch reaches).

    Raises:
        VerifyError: with upstream's message, at the first such value in conversion order.
    """
    visited = set(ops)
    rewritten = [op for op in ops if not is_normalized_op(op) and op not in folded]
    owners = set(rewritten)
    for op in rewritten:
        if not isinstance(op, FuncOp):
            for operand in op.operands:
                region = operand.owner.parent if isinstance(operand, BlockArgument) else None
                if region is not None and region.parent not in owners and not is_normalized(operand.type):
                    raise materialization_error("target", operand.type, op.location)
        for value in defined_values(op):
            if not is_normalized(value.type) and any(user not in visited for user, _ in value.uses):
                raise materialization_error("source", value.type, value_location(value))


def materialization_error(kind: str, type_: Type, location: Location | None) -> VerifyError:
    """Upstream's message for a cast it needed and could not build (`kind` is `source` or `target`)."""
    normalized = normalize_quant_type(type_)
    old, new = (normalized, type_) if kind == "source" else (type_, normalized)
    return VerifyError(
        f"failed to legalize unresolved {kind} materialization from ('{old}') to ('{new}') "
        "that remained live after conversion",
        location,
    )


def defined_values(op: Operation) -> list[Value]:
    """The values whose types rewriting `op` changes: its results and its regions' block arguments."""
    arguments = [argument for region in op.regions for block in region.blocks for argument in block.arguments]
    return [*op.results, *arguments]


def normalize_op_types(op: Operation) -> None:
    """Normalize the types `op` defines: a function's signature or an op's results, and in both cases the
    arguments of every block of its regions."""
    if isinstance(op, FuncOp):
        op.function_type = normalize_function_type(op.function_type)
    for value in defined_values(op):
        # A type change in place (MLIR's Value::setType): the normalized type means the same values, so no
        # use needs a cast, and every operand follows its definition.
        value.type = normalize_quant_type(value.type)


def normalize_functions(functions: Sequence[FuncOp]) -> bool:
    """Normalize the types in each of `functions` as upstream's conversion does; True if any changed.

    Ops are visited in upstream's order (reachable blocks only); each op that has a sub-channel type is
    rewritten, nested `func.func` ops included, unless it is a cast that folds (see `fold_casts`).

    Raises:
        VerifyError: where upstream fails (see `check_normalizable`); every function is then unchanged.
    """
    visits = [list(walk_in_conversion_order(function)) for function in functions]
    # Upstream marks every op legal or not (markUnknownOpDynamicallyLegal): only illegal casts fold.
    folds = [fold_casts(ops, lambda op: not is_normalized_op(op)) for ops in visits]
    folded_ops = [{result.owner for result in fold if isinstance(result, OpResult)} for fold in folds]
    for ops, folded in zip(visits, folded_ops, strict=True):
        check_normalizable(ops, folded)
    rewritten = [
        op
        for ops, folded in zip(visits, folded_ops, strict=True)
        for op in ops
        if not is_normalized_op(op) and op not in folded
    ]
    for op in rewritten:
        normalize_op_types(op)
    for folded in folds:
        replace_folded(folded)
    return bool(rewritten) or any(folds)


@register_pass
@dataclass(frozen=True, kw_only=True)
class NormalizeQuantTypesPass(ModulePass):
    """Rewrite sub-channel types that have a per-tensor or per-axis form, in every top-level function."""

    name: ClassVar[str] = "normalize-quant-types"
    anchor: ClassVar[type[Operation]] = FuncOp

    def run(self, module: Operation) -> PassResult:
        # Only the module's own functions: a func.func in a nested module is not an anchor.
        functions = [op for region in module.regions for block in region.blocks for op in block.ops]
        return PassResult(changed=normalize_functions([op for op in functions if isinstance(op, FuncOp)]))
