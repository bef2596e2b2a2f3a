"""The `shape` ops that `lower-quant-ops` emits for unranked tensors: shape_of, num_elements, split_at."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from qconvert.ir.core import Operation, register_op
from qconvert.ir.dialects.common import ConversionOp

if TYPE_CHECKING:
    pass


class UnaryShapeOp(ConversionOp):
    """`shape.<op> %x : T -> R`."""

    __slots__ = ()
    is_pure = True
    separator = "->"


@register_op
class ShapeOfOp(UnaryShapeOp):
    """`shape.shape_of %t : tensor<*xf32> -> tensor<?xindex>`."""

    __slots__ = ()
    name: ClassVar[str] = "shape.shape_of"


@register_op
class NumElementsOp(UnaryShapeOp):
    """`shape.num_elements %s : tensor<?xindex> -> index`."""

    __slots__ = ()
    name: ClassVar[str] = "shape.num_elements"


@register_op
class SplitAtOp(Operation):
    """`"shape.split_at"(%shape, %index)`: the shape before and from `index`; printed in generic form."""

    __slots__ = ()
    is_pure = True
    name: ClassVar[str] = "shape.split_at"

    def result_names(self) -> list[str | None]:
        return ["head", "tail"]
