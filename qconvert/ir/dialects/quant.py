"""The `quant` dialect's ops: `quant.qcast`, `quant.dcast`, `quant.scast` (QuantOps.td / QuantOps.cpp).

Verification runs in upstream's order: operand/result type constraints, the shape trait, then the op's
own checks; per-axis and sub-channel rules are one shared check for all three ops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from qconvert.ir.core import Operation, Value, register_op
from qconvert.ir.dialects.common import ConversionOp
from qconvert.ir.quant_types import (
    CalibratedQuantizedType,
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
)
from qconvert.ir.types import (
    DYNAMIC,
    FloatType,
    RankedTensorType,
    Type,
    UnrankedTensorType,
    element_type_of,
    is_signless_integer,
    is_tensor,
)

if TYPE_CHECKING:
    pass


def is_scalar_or_tensor_of(
    type_: Type, predicate: type | tuple[type, ...] | None, *, signless: bool = False
) -> bool:
    """ODS `quant_ScalarOrTensorOf`: the type, or a tensor of it, satisfies the element constraint."""
    element = element_type_of(type_) if is_tensor(type_) else type_
    if signless and is_signless_integer(element):
        return True
    return predicate is not None and isinstance(element, predicate)


def check_same_scalar_or_tensor_shape(op: Operation, input_type: Type, result_type: Type) -> None:
    """Both scalars, both unranked tensors, or ranked tensors of identical shape (`?` matches only `?`)."""
    if not is_tensor(input_type) and not is_tensor(result_type):
        return
    if isinstance(input_type, UnrankedTensorType) and isinstance(result_type, UnrankedTensorType):
        return
    if (
        isinstance(input_type, RankedTensorType)
        and isinstance(result_type, RankedTensorType)
        and input_type.shape == result_type.shape
    ):
        return
    raise op.error(
        "failed to verify that input and result are both scalars or both tensors with matching shape"
    )


def check_per_axis_quantization(op: Operation, quantized_type: QuantizedType, container_type: Type) -> None:
    """Upstream `verifyPerAxisQuantization`: the axis must exist and match the number of scales."""
    if not isinstance(quantized_type, UniformQuantizedPerAxisType):
        return
    if not is_tensor(container_type):
        raise op.emit_error("scalar types may not use per-axis quantization")
    if not isinstance(container_type, RankedTensorType):
        return
    axis = quantized_type.quantized_dimension
    if axis >= container_type.rank:
        raise op.emit_error("quantized dimension must be less than tensor rank")
    size = container_type.shape[axis]
    if size != DYNAMIC and size != len(quantized_type.scales):
        raise op.emit_error("quantized dimension size does not match number of scales")


def check_sub_channel_quantization(
    op: Operation, quantized_type: QuantizedType, container_type: Type
) -> None:
    """Upstream `verifySubChannelQuantization`: blocks tile the tensor and the scales table matches it."""
    if not isinstance(quantized_type, UniformQuantizedSubChannelType):
        return
    if not is_tensor(container_type):
        raise op.emit_error("scalar types may not use sub-channel quantization")
    if not isinstance(container_type, RankedTensorType):
        raise op.emit_error("tensor containing the sub-channel quantized type must be ranked")
    shape, rank = container_type.shape, container_type.rank
    for axis, block_size in quantized_type.block_size_info:
        if axis >= rank:
            raise op.emit_error(f"quantized dimension {axis} must be less than tensor rank {rank}")
        if shape[axis] != DYNAMIC and shape[axis] % block_size != 0:
            raise op.emit_error(
                f"tensor dimension size {shape[axis]} at axis {axis} must be divisible by the "
                f"corresponding block size {block_size}"
            )
    if 0 in shape:
        raise op.emit_error("tensor dimension size of zero is not allowed with sub-channel quantization")
    scales_shape = quantized_type.scales.shape
    if len(scales_shape) != rank:
        raise op.emit_error(f"Rank of scales {len(scales_shape)} must match the rank of the tensor {rank}")
    block_sizes = dict(quantized_type.block_size_info)
    for axis in range(rank):
        if axis not in block_sizes:
            expected = 1  # an axis without blocks has one scale, whatever its size
        elif shape[axis] == DYNAMIC:
            continue
        else:
            expected = shape[axis] // block_sizes[axis]
        if scales_shape[axis] != expected:
            # Upstream prints the expected size twice; the actual size is never shown.
            raise op.emit_error(
                f"dimension size {expected} of scales tensor at axis {axis} should match "
                f"(tensor dimension at axis / block sizes at axis) = {expected}"
            )


def check_quantization(op: Operation, quantized_type: QuantizedType, container_type: Type) -> None:
    check_per_axis_quantization(op, quantized_type, container_type)
    check_sub_channel_quantization(op, quantized_type, container_type)


class QuantCastOp(ConversionOp):
    """Shared syntax of the three casts: `quant.qcast %x : f32 to !quant.uniform<...>`."""

    __slots__ = ()
    is_pure = True
    has_custom_syntax = True
    input_constraint: ClassVar[tuple[str, type | tuple[type, ...] | None, bool]]
    result_constraint: ClassVar[tuple[str, type | tuple[type, ...] | None, bool]]

    def fold(self) -> Value | None:
        """The value this cast folds to (upstream's `fold`), or None when it does not fold."""
        return None

    def verify(self) -> None:
        for label, value, (description, predicate, signless) in (
            ("operand", self.input, self.input_constraint),
            ("result", self.result, self.result_constraint),
        ):
            if not is_scalar_or_tensor_of(value.type, predicate, signless=signless):
                raise self.error(f"{label} #0 must be {description}, but got '{value.type}'")
        check_same_scalar_or_tensor_shape(self, self.input.type, self.result.type)


def check_expressed_type_matches(op: Operation, quantized_container: Type, float_container: Type) -> None:
    quantized_type = element_type_of(quantized_container)
    assert isinstance(quantized_type, QuantizedType | CalibratedQuantizedType)
    if quantized_type.expressed_type != element_type_of(float_container):
        raise op.emit_error("expressed type in quantized type expected to match float type")
    if isinstance(quantized_type, QuantizedType):
        check_quantization(op, quantized_type, quantized_container)


QUANTIZED = ("scalar or tensor of quantized type", (QuantizedType, CalibratedQuantizedType), False)
FLOATING_POINT = ("scalar or tensor of floating-point", FloatType, False)
INTEGER_OR_QUANTIZED = ("scalar or tensor of signless integer or quantized type", QuantizedType, True)


@register_op
class DequantizeCastOp(QuantCastOp):
    """`quant.dcast`: quantized -> expressed float values: (q - zero_point) * scale."""

    __slots__ = ()
    name: ClassVar[str] = "quant.dcast"
    input_constraint = QUANTIZED
    result_constraint = FLOATING_POINT

    def verify(self) -> None:
        QuantCastOp.verify(self)
        check_expressed_type_matches(self, self.input.type, self.result.type)

    def fold(self) -> Value | None:
        """Upstream's folder: `dcast(qcast(x))` is `x` (the two types of `x` are equal by verification)."""
        source = self.input.owner_op()
        return source.input if isinstance(source, QuantizeCastOp) else None


@register_op
class QuantizeCastOp(QuantCastOp):
    """`quant.qcast`: expressed float values -> quantized values."""

    __slots__ = ()
    name: ClassVar[str] = "quant.qcast"
    input_constraint = FLOATING_POINT
    result_constraint = QUANTIZED

    def verify(self) -> None:
        QuantCastOp.verify(self)
        check_expressed_type_matches(self, self.result.type, self.input.type)

    def fold(self) -> Value | None:
        """Upstream's folder: `qcast(dcast(x))` is `x` when `x` already has this op's quantized type."""
        source = self.input.owner_op()
        if isinstance(source, DequantizeCastOp) and source.input.type == self.result.type:
            return source.input
        return None


@register_op
class StorageCastOp(QuantCastOp):
    """`quant.scast`: storage integers <-> quantized values of the same shape; no arithmetic."""

    __slots__ = ()
    name: ClassVar[str] = "quant.scast"
    input_constraint = INTEGER_OR_QUANTIZED
    result_constraint = INTEGER_OR_QUANTIZED

    def verify(self) -> None:
        QuantCastOp.verify(self)
        input_element = element_type_of(self.input.type)
        result_element = element_type_of(self.result.type)
        input_is_quantized = isinstance(input_element, QuantizedType)
        if input_is_quantized == isinstance(result_element, QuantizedType):
            raise self.error(
                "failed to verify that input must be integer and result must be quantized, or vice versa"
            )
        quantized_container, integer_container = (
            (self.input.type, self.result.type) if input_is_quantized else (self.result.type, self.input.type)
        )
        quantized_type = element_type_of(quantized_container)
        assert isinstance(quantized_type, QuantizedType)
        if quantized_type.storage_type != element_type_of(integer_container):
            raise self.emit_error("storage type in quantized type expected to match integer type")
        check_quantization(self, quantized_type, quantized_container)

    def fold(self) -> Value | None:
        """Upstream's folder: `scast(scast(x))` is `x` when the two casts invert each other."""
        source = self.input.owner_op()
        if isinstance(source, StorageCastOp) and source.input.type == self.result.type:
            return source.input
        return None
