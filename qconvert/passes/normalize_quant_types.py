"""`--normalize-quant-types`: sub-channel quantized tensors that are really per-tensor or per-axis become so.

Runs on every `func.func` directly inside the module (upstream anchors the pass on `func::FuncOp`).
Inside such a function, every tensor type whose element type is a sub-channel `!quant.uniform` is
rewritten when its scales table allows it:

1. one scale (the table has one element) -> per-tensor;
2. exactly one table dimension is not 1 -> per-axis on that dimension, scales and zero points in order;
3. anything else stays sub-channel.

The storage type, its signedness flag, the storage bounds and the expressed type are kept. Sub-channel
zero points are held at the storage width and read signed, so a `u8` zero point written 200 becomes
`-56` (upstream sign-extends its APInt the same way). Scales are converted to f64 exactly: an f16 scale
0.3 becomes `0.300048828125`.

What is rewritten: the signature of the function (a bodiless `private` declaration too), every block
argument of every block in it, and every op result in it (so every operand: call sites, returns and
unknown ops alike), including nested `func.func` ops. Attributes are not rewritten (an op's
`{t = tensor<...>}` keeps its sub-channel type), and neither are bare scalar sub-channel types, since a
scalar cannot carry sub-channel quantization. No op is added: the rewrite changes types, never values.

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

NOTE: upstream MLIR (torch-mlir 20261001) crashes on a function whose non-entry blocks carry sub-channel
arguments; we rewrite those arguments like all others, which keeps the IR consistent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qconvert.ir.core import Operation
from qconvert.ir.dialects.func import FuncOp
from qconvert.ir.quant_types import (
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
)
from qconvert.ir.types import FunctionType, RankedTensorType, Type, UnrankedTensorType
from qconvert.passes import ModulePass, PassResult, register_pass


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
    if len(non_unit_dimensions) == 1:
        return UniformQuantizedPerAxisType(
            scales=scales, zero_points=zero_points, quantized_dimension=non_unit_dimensions[0], **common
        )
    return element


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


def normalize_function(function: FuncOp) -> bool:
    """Normalize every type in `function` (signature, block arguments, op results); True if any changed.

    Nested `func.func` ops get their signatures normalized too, as upstream's conversion reaches them.
    """
    changed = False
    for op in function.walk():
        if isinstance(op, FuncOp):
            normalized = normalize_function_type(op.function_type)
            if normalized != op.function_type:
                op.function_type = normalized
                changed = True
        values = [argument for region in op.regions for block in region.blocks for argument in block.arguments]
        for value in [*values, *op.results]:
            normalized_type = normalize_quant_type(value.type)
            if normalized_type is not value.type:
                # A type change in place (MLIR's Value::setType): the normalized type means the same values,
                # so no use needs a cast and every operand follows its definition.
                value.type = normalized_type
                changed = True
    return changed


@register_pass
@dataclass(frozen=True, kw_only=True)
class NormalizeQuantTypesPass(ModulePass):
    """Rewrite sub-channel types that have a per-tensor or per-axis equivalent, in every top-level function."""

    name: ClassVar[str] = "normalize-quant-types"
    anchor: ClassVar[type[Operation]] = FuncOp

    def run(self, module: Operation) -> PassResult:
        changed = False
        for region in module.regions:
            for block in region.blocks:
                for op in block.ops:
                    # Only the module's own functions: a func.func in a nested module is not an anchor.
                    if isinstance(op, FuncOp):
                        changed |= normalize_function(op)
        return PassResult(changed=changed)
