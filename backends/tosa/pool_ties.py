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
from qconvert.ir.core import Builder, Operation, Value
from qconvert.ir.quant_types import UniformQuantizedType
from qconvert.ir.types import I8, I32, IntegerType, RankedTensorType, element_type_of
from qconvert.numerics.tosa import TosaRounding
from qconvert.passes.rewrite import PatternRewriter, Root

from . import ops
from .float_island import ties_to_even
from .legalize_quant import I16, exact_to_i32, rescale_into, rescale_to, storage_zero_point
from .storage import Refusals, constant_of, quant_type, replace_with_storage, storage_of

__all__ = ["AveragePoolTiesToEven", "FloatAveragePoolRequantized", "window_sums"]


def _ints(op: Operation, name: str) -> list[int]:
    attribute = op.attributes[name]
    assert isinstance(attribute, DenseArrayAttr), f"{op.name} {name}"
    return [int(v) for v in attribute.values]


def window_sums(b: Builder, storage: Value, kernel: list[int], stride: list[int], zero_point: int) -> Value:
    """The i32 sums of `storage - zero_point` (NHWC, i8 / i16) over each unpadded `kernel` window: a depthwise
    conv2d with an all-ones i8 kernel (i48 for i16, then exactly to i32)."""
    storage_type = storage.type
    element = element_type_of(storage_type)
    assert isinstance(storage_type, RankedTensorType) and isinstance(element, IntegerType)
    wide = element.width == 16
    batch, height, width, channels = storage_type.shape
    out_shape = (
        batch,
        (height - kernel[0]) // stride[0] + 1,
        (width - kernel[1]) // stride[1] + 1,
        channels,
    )
    sums_type = RankedTensorType(out_shape, IntegerType(48) if wide else I32)
    sums = ops.depthwise_conv2d(
        b,
        storage,
        ops.const(b, np.ones((kernel[0], kernel[1], channels, 1), np.int8), I8),
        ops.const(b, np.zeros((1,), np.int64 if wide else np.int32), sums_type.element_type),
        ops.zero_point(b, zero_point, I16 if wide else I8),
        ops.zero_point(b, 0, I8),
        sums_type,
        pad=[0, 0, 0, 0],
        stride=stride,
        dilation=[1, 1],
        acc_type=sums_type.element_type,
    )
    return exact_to_i32(b, sums) if wide else sums


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
        result_type = result.type
        assert isinstance(result_type, RankedTensorType)
        sums = window_sums(rewriter, input_, kernel, stride, int(input_zp.reshape(-1)[0]))
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


def _producer(value: Value, name: str) -> Operation | None:
    producer = value.owner_op()
    return producer if producer is not None and producer.name == name else None


class FloatAveragePoolRequantized:
    """`uniform_quantize(reduce_window_add(uniform_dequantize(q)) / count)` to *another* per-tensor type than
    q's (tosa.avg_pool2d keeps its input's; onnxruntime's quantizer gives an AveragePool / QLinearAveragePool
    its own output scale), without padding: the window sums and one rescale by `s_in / (count * s_out)`,
    rounded once as onnxruntime's float mean quantized."""

    roots: ClassVar[tuple[Root, ...]] = ("stablehlo.uniform_quantize",)

    def __init__(self, rounding: TosaRounding, refusals: Refusals) -> None:
        self.rounding, self.refusals = rounding, refusals

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        target = quant_type(op.result)
        divide = _producer(op.operands[0], "stablehlo.divide")
        window_op = _producer(divide.operands[0], "stablehlo.reduce_window") if divide is not None else None
        if target is None or divide is None or window_op is None:
            return False
        body = window_op.regions[0].entry
        dequantize = _producer(window_op.operands[0], "stablehlo.uniform_dequantize")
        if len(body.ops) != 2 or body.ops[0].name != "stablehlo.add" or dequantize is None:
            return False
        source = dequantize.operands[0]
        source_type = quant_type(source)
        if source_type == target:
            return False  # legalize.py's tosa.avg_pool2d (then AveragePoolTiesToEven)
        for type_ in (source_type, target):
            if not isinstance(type_, UniformQuantizedType) or not type_.is_signed:
                return self.refusals.refuse(
                    op, "an average pool that requantizes other than signed per-tensor"
                )
        window = [int(v) for v in window_op.attributes["window_dimensions"].values]  # type: ignore[attr-defined]
        strides_attribute = window_op.attributes.get("window_strides")
        strides = [int(v) for v in strides_attribute.values] if strides_attribute is not None else [1] * 4  # type: ignore[attr-defined]
        padding = window_op.attributes.get("padding")
        if padding is not None and np.any(np.asarray(padding.array) != 0):  # type: ignore[attr-defined]
            return self.refusals.refuse(op, "an average pool that requantizes, with padding")
        if any(name in window_op.attributes for name in ("base_dilations", "window_dilations")) and any(
            int(v) != 1
            for name in ("base_dilations", "window_dilations")
            for v in getattr(window_op.attributes.get(name), "values", [])
        ):
            return self.refusals.refuse(op, "a dilated average pool")
        pooled = [d for d in range(4) if window[d] != 1 or strides[d] != 1]
        if len(window) != 4 or not set(pooled) <= {2, 3}:
            return self.refusals.refuse(op, f"an average pool over dims {pooled} (NCHW spatial dims only)")
        count = window[2] * window[3]
        divisor = constant_of(divide.operands[1])
        if divisor is None:
            producer = divide.operands[1].owner_op()
            if producer is not None and producer.name == "stablehlo.broadcast_in_dim":
                divisor = constant_of(producer.operands[0])
        if divisor is None or not np.all(np.asarray(divisor) == count):
            return False  # not a mean of whole windows
        storage = ops.transpose(rewriter, storage_of(rewriter, source), [0, 2, 3, 1])
        zero_point = int(storage_zero_point(source_type)[0])  # type: ignore[arg-type]
        sums = window_sums(rewriter, storage, window[2:], strides[2:], zero_point)
        sums_type = sums.type
        assert isinstance(sums_type, RankedTensorType)
        scale = float(source_type.scale) / (count * float(target.scale))  # type: ignore[union-attr]
        try:
            mean = rescale_into(
                rewriter,
                sums,
                np.array([scale]),
                0,
                target,
                sums_type.with_element_type(target),
                self.rounding,
            )
        except ValueError as error:
            return self.refusals.refuse(op, str(error))
        replace_with_storage(rewriter, op, [ops.transpose(rewriter, mean, [0, 3, 1, 2])])
        return True
