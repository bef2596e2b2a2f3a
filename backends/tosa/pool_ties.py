"""An average pool whose window holds 2**k elements, with onnxruntime's ties: `tosa.avg_pool2d` rounds the
window mean half up (its reciprocal scale and RESCALE), onnxruntime rounds the float mean half to even, and
a mean of 4 lands exactly on a half step for a quarter of the windows (measured: an int8 2x2 AveragePool 30
of 256 elements one step off, 2 with this pattern; int16 20 -> 6, the rest onnxruntime's float32 noise).

Without padding every window counts `kh * kw` elements, so the pool is its window sums (a depthwise conv2d
of the centred storage with an all-ones kernel, exact in i32 / i48), `ties_to_even` by that power of two,
and one rescale by `2**-k` to the output zero point: integer TOSA ops only.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from qconvert.ir.attributes import DenseArrayAttr
from qconvert.ir.core import Operation
from qconvert.ir.types import I8, I32, IntegerType, RankedTensorType, element_type_of
from qconvert.numerics.tosa import TosaRounding
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .float_island import ties_to_even
from .legalize_quant import I16, exact_to_i32, rescale_to
from .storage import constant_of

__all__ = ["AveragePoolTiesToEven"]


def _ints(op: Operation, name: str) -> list[int]:
    attribute = op.attributes[name]
    assert isinstance(attribute, DenseArrayAttr), f"{op.name} {name}"
    return [int(v) for v in attribute.values]


class AveragePoolTiesToEven:
    """`tosa.avg_pool2d` without padding over a window of 2**k elements as window sums, ties to even and a
    rescale by 2**-k (the module's docstring)."""

    roots: ClassVar[tuple[Root, ...]] = ("tosa.avg_pool2d",)

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        kernel, stride, pad = _ints(op, "kernel"), _ints(op, "stride"), _ints(op, "pad")
        count = kernel[0] * kernel[1]
        if any(pad) or count < 2 or count & (count - 1):
            return False  # counts that vary at the edges, or a mean that never lands on a half step
        input_zp, output_zp = constant_of(op.operands[1]), constant_of(op.operands[2])
        input_, result = op.operands[0], op.results[0]
        element = element_type_of(input_.type)
        if input_zp is None or output_zp is None or not isinstance(element, IntegerType):
            return False
        input_type, result_type = input_.type, result.type
        assert isinstance(input_type, RankedTensorType) and isinstance(result_type, RankedTensorType)
        wide = element.width == 16
        channels = input_type.shape[3]
        sums_type = result_type.with_element_type(IntegerType(48) if wide else I32)
        sums = ops.depthwise_conv2d(
            rewriter,
            input_,
            ops.const(rewriter, np.ones((kernel[0], kernel[1], channels, 1), np.int8), I8),
            ops.const(rewriter, np.zeros((1,), np.int64 if wide else np.int32), sums_type.element_type),
            ops.zero_point(rewriter, int(input_zp.reshape(-1)[0]), I16 if wide else I8),
            ops.zero_point(rewriter, 0, I8),
            sums_type,
            pad=[0, 0, 0, 0],
            stride=stride,
            dilation=[1, 1],
            acc_type=sums_type.element_type,
        )
        if wide:
            sums = exact_to_i32(rewriter, sums)
        shift = count.bit_length() - 1
        total = ties_to_even(rewriter, sums, shift, result_type.with_element_type(I32))
        mean = rescale_to(
            rewriter,
            total,
            np.array([2.0**-shift]),
            0,
            int(output_zp.reshape(-1)[0]),
            result_type,
            TosaRounding.SINGLE,  # an exact division by 2**k, half up (ties_to_even made the ties)
        )
        rewriter.replace_op(op, [mean])
        return True
