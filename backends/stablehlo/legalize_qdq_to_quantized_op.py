"""`stablehlo-legalize-qdq-to-quantized-op`: `uniform_dequantize -> op -> quantize` becomes the op on
quantized values, where that is exact; the `quantized` form of `convert_to_stablehlo` is the lowering
followed by this pass (then `dce`).

Upstream's pass of this name (openxla/stablehlo `StablehloLegalizeQDQToQuantizedOp.cpp`) matches an op
every operand of which is dequantized and whose result is quantized; here the patterns are restricted to
what is exact and what the engines run, each pattern a class of this module:

- data movement (`DATA_MOVEMENT_OPS`: reshape, transpose, broadcast_in_dim, slice, concatenate, gather) on
  one per-tensor type: exact in both semantics, since `quantize(dequantize(q)) == q` for equal parameters
  and these ops only move elements (`FuseDataMovement`);
- max pooling (`reduce_window` with a `maximum` body and a -inf init) of signed storage: max commutes with
  dequantize (`FuseMaxPool`);
- on request (`fuse-arithmetic`): dot_general / convolution [+ bias] and add, built through i32
  accumulators as onnxruntime's integer kernels compute them (`FuseContraction`, `FuseAdd`; the builders
  are quant_fusion.py's, shared with the QOperator lowerings). A chain that does not qualify stays
  unfused, its float op marked `qconvert.note = "not fused: ..."`.

Not fused, each for a reason measured or read in quant-to-math (reference §3.4): add / dot_general /
convolution straight to the i8 result type, as upstream writes them: quant-to-math requantizes each add
operand to the result scale with its own rounding (two roundings, 1 step off in 2 to 31 % of each
tiny_encoder add's outputs, measured), requantizes an i32 accumulator by a float multiply and a truncating
convert, while onnxruntime rounds half to even; besides, ONNX Conv/Gemm carry a bias add between op and
quantize.

Inside `convert_to_stablehlo` the patterns also see the quantizes and dequantizes the lowering wrote out
as arithmetic (ONNX-exact rounding, engine write-outs: `QdqSources`); run by `qconvert opt` on a parsed
module, they see `uniform_quantize` / `uniform_dequantize` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from qconvert.errors import InputError
from qconvert.ir.attributes import StringAttr
from qconvert.ir.core import Block, GenericOp, Operation, Value
from qconvert.ir.dialects.qconvert import NOTE
from qconvert.ir.quant_types import QuantizedType, UniformQuantizedPerAxisType, UniformQuantizedType
from qconvert.ir.types import F32, RankedTensorType, element_type_of
from qconvert.passes import ModulePass, PassResult, register_pass
from qconvert.passes.rewrite import PatternRewriter, Root, apply_patterns

from . import ops as hlo
from .dimension_numbers import ConvDimensionNumbers, DotDimensionNumbers
from .lowering import LoweringContext, Semantics, dense_constant, find_main, storage_element_type
from .quant_fusion import (
    I32,
    NotFused,
    accumulator_type,
    add_bias,
    per_tensor_signed_8bit,
    requantize,
    transpose_quantized,
    typed_op,
    weight_scales,
)

__all__ = [
    "DATA_MOVEMENT_OPS",
    "FuseAdd",
    "FuseContraction",
    "FuseDataMovement",
    "FuseMaxPool",
    "LegalizeQdqToQuantizedOpPass",
    "QdqSources",
    "arithmetic_patterns",
    "data_movement_patterns",
    "legalize_qdq_to_quantized_op",
]

DATA_MOVEMENT_OPS = (
    "stablehlo.reshape",
    "stablehlo.transpose",
    "stablehlo.broadcast_in_dim",
    "stablehlo.slice",
    "stablehlo.concatenate",
    "stablehlo.gather",
)
"""Ops fused into their quantized form when every float operand (all but gather's indices) is dequantized
from, and the result quantized to, one and the same per-tensor type (the engines run them on the storage
integers)."""

ADD_FRACTION_BITS = 15
"""The add's i32 accumulator scale is max(s_a, s_b) / 2**15: both operands requantize into it within half
a unit (2**-15 of the coarser input step), so the sum is the float sum to that precision and the single
requantize to the output rounds as the float path's QuantizeLinear does except within ~2**-15 output
steps of a tie. (Adding in the output type, quant-to-math rounds each operand to the output scale first:
two roundings, 1 step off in about a quarter of the elements, measured.) |q - zp| <= 255 keeps the
requantized operands below 2**24, exact in f32."""


@dataclass(slots=True)
class QdqSources:
    """What the patterns know beyond the IR: the quantizes and dequantizes the lowering wrote out as
    arithmetic (each quantized value -> the float it quantizes, each float -> the quantized value it
    dequantizes), the semantics requantizes follow, and how many ops were fused."""

    semantics: Semantics = Semantics.ONNX
    quantize_sources: dict[Value, Value] = field(default_factory=dict)
    dequantize_sources: dict[Value, Value] = field(default_factory=dict)
    fused: int = 0

    @classmethod
    def of(cls, ctx: LoweringContext) -> QdqSources:
        return cls(ctx.semantics, ctx.quantize_sources, ctx.dequantize_sources)

    def dequantized_source(self, value: Value) -> Value | None:
        """The quantized value `value` was dequantized from (uniform_dequantize or written out), else None."""
        producer = value.owner_op()
        if producer is not None and producer.name == "stablehlo.uniform_dequantize":
            return producer.operands[0]
        return self.dequantize_sources.get(value)

    def quantizations(self, value: Value) -> list[Value]:
        """The quantized values computed from float `value` (uniform_quantize, or ONNX-exact arithmetic)."""
        found: list[Value] = [
            owner.result
            for owner, _ in value.uses
            if owner.name == "stablehlo.uniform_quantize"
            and not isinstance(element_type_of(value.type), QuantizedType)
        ]
        found.extend(q for q, source in self.quantize_sources.items() if source is value)
        return found


# Data movement -------------------------------------------------------------------------------------
def _single_per_tensor_type(sources: list[Value | None]) -> UniformQuantizedType | None:
    """The one per-tensor type of `sources`, None when one is missing, types differ or it is per-axis
    (per-axis data movement needs axis bookkeeping; not needed by ONNX activations)."""
    if not sources or any(s is None for s in sources):
        return None
    quant_types = {element_type_of(s.type) for s in sources}  # type: ignore[union-attr]
    if len(quant_types) != 1:
        return None
    (quant_type,) = quant_types
    return quant_type if isinstance(quant_type, UniformQuantizedType) else None


@dataclass(frozen=True, slots=True)
class FuseDataMovement:
    """dequantize -> data-movement op -> quantize: the op on the quantized values, once per quantization."""

    roots: ClassVar[tuple[Root, ...]] = DATA_MOVEMENT_OPS
    sources: QdqSources

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        # Gather's indices are not data: they stay as they are.
        data_operands = op.operands[:1] if op.name == "stablehlo.gather" else op.operands
        sources = [self.sources.dequantized_source(v) for v in data_operands]
        quant_type = _single_per_tensor_type(sources)
        if quant_type is None:
            return False
        fused = False
        for quantized in self.sources.quantizations(op.result):
            if element_type_of(quantized.type) != quant_type:
                continue
            result_type = hlo.tensor_type(op.result).with_element_type(quant_type)
            operands = [*sources, *op.operands[len(sources) :]]
            new_op = rewriter.insert(GenericOp(op.name, operands, [result_type], dict(op.attributes)))
            rewriter.replace_all_uses_with(quantized, new_op.result)
            self.sources.fused += 1
            fused = True
        return fused


def is_max_pool(op: Operation) -> bool:
    """A reduce_window of one operand whose body is `maximum` and whose init is the constant -inf."""
    if len(op.operands) != 2 or len(op.regions) != 1:
        return False
    body = op.regions[0].entry.ops
    if len(body) != 2 or body[0].name != "stablehlo.maximum":
        return False
    init = op.operands[1].owner_op()
    if init is None or init.name != "stablehlo.constant":
        return False
    value = init.attributes.get("value")
    array = getattr(value, "array", None)
    return array is not None and array.size == 1 and bool(np.isneginf(array.reshape(-1)[0]))


@dataclass(frozen=True, slots=True)
class FuseMaxPool:
    """dequantize -> max pooling -> quantize: the pooling on quantized values (max commutes with dequantize,
    scale > 0); the padding value becomes qmin (every window holds a real element, so it never wins)."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.reduce_window",)
    sources: QdqSources

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if not is_max_pool(op):
            return False
        source = self.sources.dequantized_source(op.operands[0])  # the init is rebuilt, not data
        quant_type = _single_per_tensor_type([source])
        if quant_type is None or source is None:
            return False
        if not quant_type.is_signed:
            return False  # quant-to-math compares u8 storage as signed i8 (see lower_quant.NOTE_UNSIGNED)
        fused = False
        for quantized in self.sources.quantizations(op.result):
            if element_type_of(quantized.type) != quant_type:
                continue
            rewriter.replace_all_uses_with(quantized, self._pool(rewriter, op, source, quant_type))
            self.sources.fused += 1
            fused = True
        return fused

    @staticmethod
    def _pool(
        rewriter: PatternRewriter, op: Operation, source: Value, quant_type: UniformQuantizedType
    ) -> Value:
        init_storage = dense_constant(
            rewriter, np.asarray(quant_type.storage_type_min), storage_element_type(quant_type)
        )
        init = hlo.bitcast_convert(rewriter, init_storage, RankedTensorType((), quant_type))
        attributes = op.attributes
        return hlo.reduce_window(
            rewriter,
            source,
            init,
            window_dimensions=attributes["window_dimensions"].values,  # type: ignore[attr-defined]
            window_strides=attributes["window_strides"].values,  # type: ignore[attr-defined]
            padding=[tuple(p) for p in attributes["padding"].array.tolist()],  # type: ignore[attr-defined,misc]
            window_dilations=attributes["window_dilations"].values,  # type: ignore[attr-defined]
            body=hlo.maximum,
        )


# Contractions --------------------------------------------------------------------------------------
@dataclass(slots=True)
class Contraction:
    """A matched `dequantize -> dot_general / convolution [-> add bias] -> quantize` chain."""

    op: Operation
    lhs: Value
    rhs: Value
    output: Value  # the float value that is quantized (op's result, or the bias add's)
    bias: Value | None  # the quantized bias, as it is before any broadcast
    bias_dims: tuple[int, ...]  # the result dims the bias runs along (broadcast_in_dim's dimensions)
    quantized: list[Value]  # the quantized values to replace


def _unfusable(op: Operation) -> bool:
    """Already quantized, or dead: nothing to fuse."""
    return isinstance(element_type_of(op.result.type), QuantizedType) or not op.result.uses


def _note_not_fused(rewriter: PatternRewriter, op: Operation, reason: NotFused) -> bool:
    rewriter.set_attribute(op, NOTE, StringAttr(f"not fused: {reason}"))
    return False


@dataclass(frozen=True, slots=True)
class FuseContraction:
    """The QDQ chain around a dot_general / convolution as an i32-accumulator quantized op, its int32 bias
    added in that domain, then requantized to the output type (quant_fusion.py's builders)."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.dot_general", "stablehlo.convolution")
    sources: QdqSources

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if _unfusable(op):
            return False
        try:
            chain = self._match(op)
            if chain is None:
                return False
            self._fuse(chain, rewriter)
        except NotFused as reason:
            return _note_not_fused(rewriter, op, reason)
        self.sources.fused += 1
        return True

    def _match(self, op: Operation) -> Contraction | None:
        """The chain, None when it is not one (float operands or an unquantized result); raises NotFused
        when it is one that cannot be fused."""
        lhs, rhs = (self.sources.dequantized_source(v) for v in op.operands)
        if lhs is None or rhs is None:
            return None
        output, bias, bias_dims = op.result, None, ()
        users = [user for user, _ in op.result.uses]
        if len(users) == 1 and users[0].name == "stablehlo.add" and not self.sources.quantizations(op.result):
            add = users[0]
            other = add.operands[1] if add.operands[0] is op.result else add.operands[0]
            output, (bias, bias_dims) = add.result, self._bias_source(other)
            if bias is None:
                if not self.sources.quantizations(output):
                    return None
                raise NotFused("the value added to the result is not a dequantized int32 bias")
        quantized = [
            q
            for q in self.sources.quantizations(output)
            if isinstance(element_type_of(q.type), QuantizedType)
        ]
        if not quantized:
            raise NotFused(
                "the result is not quantized directly (a float result, or scaled / added to first)"
            )
        return Contraction(op, lhs, rhs, output, bias, bias_dims, quantized)

    def _bias_source(self, value: Value) -> tuple[Value | None, tuple[int, ...]]:
        """The quantized 1-D bias `value` is a broadcast of (or is) the dequantization of, and the result
        dims it runs along; (None, ()) when it is not one."""
        dims: tuple[int, ...] = (0,)
        producer = value.owner_op()
        if producer is not None and producer.name == "stablehlo.broadcast_in_dim":
            value = producer.operands[0]
            dims = tuple(producer.attributes["broadcast_dimensions"].values)  # type: ignore[attr-defined]
        source = self.sources.dequantized_source(value)
        if source is None or len(hlo.tensor_type(source).shape) != 1:
            return None, ()
        return source, dims

    def _fuse(self, chain: Contraction, rewriter: PatternRewriter) -> None:
        op = chain.op
        lhs_type = per_tensor_signed_8bit(chain.lhs.type, "the input (lhs)")
        types = {element_type_of(q.type) for q in chain.quantized}
        if len(types) != 1:
            raise NotFused("the result is quantized to more than one type")
        output_type = per_tensor_signed_8bit(chain.quantized[0].type, "the result")
        rhs_type = element_type_of(chain.rhs.type)
        assert isinstance(rhs_type, QuantizedType)
        rewriter.set_insertion_point_before(chain.quantized[0].owner_op() or op)
        if op.name == "stablehlo.dot_general":
            replacement = self._dot(chain, rewriter, lhs_type, rhs_type, output_type)
        else:
            replacement = self._convolution(chain, rewriter, lhs_type, rhs_type, output_type)
        for quantized in chain.quantized:
            rewriter.replace_all_uses_with(quantized, replacement)

    def _dot(
        self,
        chain: Contraction,
        rewriter: PatternRewriter,
        lhs_type: UniformQuantizedType,
        rhs_type: QuantizedType,
        output_type: UniformQuantizedType,
    ) -> Value:
        op = chain.op
        numbers = DotDimensionNumbers.parse(op.attributes["dot_dimension_numbers"])
        rhs_free = numbers.rhs_free(len(hlo.tensor_type(chain.rhs).shape))
        result_shape = hlo.tensor_type(op.result).shape
        # quant-to-math broadcasts per-axis parameters correctly only on the last dim (NOTE_AXIS).
        if len(rhs_free) != 1 and isinstance(rhs_type, UniformQuantizedPerAxisType):
            raise NotFused("a per-axis rhs needs exactly one free dim, the output features")
        scales, per_axis = weight_scales(rhs_type, rhs_free[0] if rhs_free else -1, "the rhs")
        axis = len(result_shape) - 1
        if chain.bias is not None and chain.bias_dims != (axis,):
            raise NotFused("the bias does not run along the output features")
        acc_element = accumulator_type(lhs_type, scales, per_axis, axis, result_shape[axis], chain.bias)
        acc = typed_op(
            rewriter,
            "stablehlo.dot_general",
            [chain.lhs, chain.rhs],
            RankedTensorType(result_shape, acc_element),
            dot_dimension_numbers=op.attributes["dot_dimension_numbers"],
        )
        if chain.bias is not None:
            acc = add_bias(rewriter, acc, chain.bias, axis)
        return requantize(self.sources, rewriter, acc, output_type, result_shape)

    def _convolution(
        self,
        chain: Contraction,
        rewriter: PatternRewriter,
        lhs_type: UniformQuantizedType,
        rhs_type: QuantizedType,
        output_type: UniformQuantizedType,
    ) -> Value:
        """In NHWC / HWIO: quant-to-math requires a per-axis kernel quantized on its last dim, so the input
        is transposed to NHWC, the kernel to HWIO, and the requantized result back to NCHW (exact)."""
        op = chain.op
        attributes = op.attributes
        if len(hlo.tensor_type(chain.lhs).shape) != 4:
            raise NotFused("only 2-D convolutions are fused")
        lhs_dilation = list(attributes["lhs_dilation"].values)  # type: ignore[attr-defined]
        if any(d != 1 for d in lhs_dilation):
            raise NotFused("quant-to-math needs lhs_dilation 1 (a transposed convolution)")
        if ConvDimensionNumbers.parse(attributes["dimension_numbers"]) != ConvDimensionNumbers.onnx(2):
            raise NotFused("not an NCHW / OIHW convolution")
        scales, per_axis = weight_scales(rhs_type, 0, "the kernel (rhs)")
        if chain.bias is not None and chain.bias_dims != (1,):
            raise NotFused("the bias does not run along the output channels")
        nchw_shape = hlo.tensor_type(op.result).shape
        nhwc_shape = (nchw_shape[0], nchw_shape[2], nchw_shape[3], nchw_shape[1])
        acc_element = accumulator_type(lhs_type, scales, per_axis, 3, nhwc_shape[3], chain.bias)
        lhs = transpose_quantized(rewriter, chain.lhs, [0, 2, 3, 1])
        kernel = transpose_quantized(rewriter, chain.rhs, [2, 3, 1, 0])
        new_attributes = dict(attributes)
        new_attributes["dimension_numbers"] = ConvDimensionNumbers.channels_last(2).attribute()
        new_attributes.pop(NOTE, None)
        result_type = RankedTensorType(nhwc_shape, acc_element)
        acc = rewriter.insert(
            GenericOp("stablehlo.convolution", [lhs, kernel], [result_type], new_attributes)
        )
        accumulated = acc.result
        if chain.bias is not None:
            accumulated = add_bias(rewriter, accumulated, chain.bias, 3)
        quantized = requantize(self.sources, rewriter, accumulated, output_type, nhwc_shape)
        return transpose_quantized(rewriter, quantized, [0, 3, 1, 2])


@dataclass(frozen=True, slots=True)
class FuseAdd:
    """dequantize(a) + dequantize(b) -> quantize: each operand requantized (uniform_quantize) to the i32
    accumulator type, a quantized i32 `add` (exact), then one requantize to the output type. A broadcast
    operand is broadcast as quantized values."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.add",)
    sources: QdqSources

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if _unfusable(op):
            return False
        try:
            fused = self._fuse(op, rewriter)
        except NotFused as reason:
            return _note_not_fused(rewriter, op, reason)
        self.sources.fused += int(fused)
        return fused

    def _fuse(self, op: Operation, rewriter: PatternRewriter) -> bool:
        sources: list[tuple[Value, Operation | None]] = []
        for operand in op.operands:
            source, broadcast = self.sources.dequantized_source(operand), None
            producer = operand.owner_op()
            if source is None and producer is not None and producer.name == "stablehlo.broadcast_in_dim":
                source, broadcast = self.sources.dequantized_source(producer.operands[0]), producer
            if source is None:
                return False
            sources.append((source, broadcast))
        quantized = [
            q
            for q in self.sources.quantizations(op.result)
            if isinstance(element_type_of(q.type), QuantizedType)
        ]
        if not quantized:
            return False
        if len({element_type_of(q.type) for q in quantized}) != 1:
            raise NotFused("the result is quantized to more than one type")
        output_type = per_tensor_signed_8bit(quantized[0].type, "the result")
        input_types = [per_tensor_signed_8bit(source.type, "an operand") for source, _ in sources]
        scale = max(t.scale for t in input_types) * 2.0**-ADD_FRACTION_BITS
        acc_type = UniformQuantizedType(
            storage_type=I32, expressed_type=F32, is_signed=True, scale=scale, zero_point=0
        )  # type: ignore[call-arg]
        shape = hlo.tensor_type(op.result).shape
        rewriter.set_insertion_point_before(quantized[0].owner_op() or op)
        operands = []
        for source, broadcast in sources:
            source_shape = hlo.tensor_type(source).shape
            widened = hlo.uniform_quantize(rewriter, source, RankedTensorType(source_shape, acc_type))
            if broadcast is not None:
                widened = typed_op(
                    rewriter,
                    "stablehlo.broadcast_in_dim",
                    [widened],
                    RankedTensorType(shape, acc_type),
                    broadcast_dimensions=broadcast.attributes["broadcast_dimensions"],
                )
            operands.append(widened)
        total = typed_op(rewriter, "stablehlo.add", operands, RankedTensorType(shape, acc_type))
        replacement = requantize(self.sources, rewriter, total, output_type, shape)
        for value in quantized:
            rewriter.replace_all_uses_with(value, replacement)
        return True


# The pass ------------------------------------------------------------------------------------------
def arithmetic_patterns(sources: QdqSources) -> tuple[FuseContraction, FuseAdd]:
    return (FuseContraction(sources), FuseAdd(sources))


def data_movement_patterns(sources: QdqSources) -> tuple[FuseDataMovement, FuseMaxPool]:
    return (FuseDataMovement(sources), FuseMaxPool(sources))


def legalize_qdq_to_quantized_op(body: Block, sources: QdqSources, *, fuse_arithmetic: bool = False) -> int:
    """Fuse the QDQ chains among `body`'s ops (one sweep each, the function's own ops: a fused op's float
    original stays for `dce`, and would match again); returns how many ops were fused."""
    fused_before = sources.fused
    if fuse_arithmetic:
        # Before data movement, which would otherwise claim the quantizes of reshapes that the contractions'
        # results feed.
        apply_patterns(body, arithmetic_patterns(sources), nested=False, max_sweeps=1)
    apply_patterns(body, data_movement_patterns(sources), nested=False, max_sweeps=1)
    return sources.fused - fused_before


@register_pass
@dataclass(frozen=True, kw_only=True)
class LegalizeQdqToQuantizedOpPass(ModulePass):
    """Fuse `@main`'s QDQ chains (see the module docstring); `fuse-arithmetic` adds the contractions and
    adds, `semantics` chooses how their requantize rounds (onnx: written out where it differs)."""

    name: ClassVar[str] = "stablehlo-legalize-qdq-to-quantized-op"
    fuse_arithmetic: bool = False
    semantics: str = Semantics.ONNX.value

    def __post_init__(self) -> None:
        if self.semantics not in {s.value for s in Semantics}:
            choices = ", ".join(s.value for s in Semantics)
            raise InputError(f"pass '{self.name}': semantics '{self.semantics}' is not one of {choices}")

    def run(self, module: Operation) -> PassResult:
        from qconvert.ir.dialects.builtin import ModuleOp

        assert isinstance(module, ModuleOp)
        sources = QdqSources(Semantics(self.semantics))
        body = find_main(module).body
        return PassResult(
            legalize_qdq_to_quantized_op(body, sources, fuse_arithmetic=self.fuse_arithmetic) > 0
        )
