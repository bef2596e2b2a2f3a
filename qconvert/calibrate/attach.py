"""Attaching calibrated ranges to the IR: a `!quant.calibrated` qcast/dcast pair on each observed value.

NOTE: `attach_ranges` puts each range on the lifted float IR as
`quant.qcast %v : tensor<..xf32> to tensor<..x!quant.calibrated<f32<min:max>>>` followed by `quant.dcast`
back to f32, every user of `%v` rerouted through the dcast: the shape a lifted QDQ pair has, so
`qconvert import`-style printing shows the range on each observed value and `finalize` only has to
swap the calibrated type for a `!quant.uniform` one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np
from onnx import ModelProto

from qconvert.calibrate.block_edit import BlockEdit
from qconvert.calibrate.ranges import CalibrationRanges, TensorRange
from qconvert.calibrate.tensor_names import TENSOR_NAME_ATTR, main_function, tensor_values
from qconvert.errors import InputError
from qconvert.ir.attributes import FloatAttr, StringAttr
from qconvert.ir.core import Builder, Operation, Value
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.onnx import NODE_NAME
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp
from qconvert.ir.quant_types import CalibratedQuantizedType
from qconvert.ir.types import F64, FloatType, element_type_of, with_element_type

STD_ATTR = "qconvert.std"
"""On a calibrated qcast: the observed standard deviation (float8e4m3fn scales need it)."""


def calibrated_type(expressed: FloatType, tensor_range: TensorRange) -> CalibratedQuantizedType:
    """`!quant.calibrated<f32<min:max>>`; a degenerate range (min == max) is widened to include zero,
    as every scale rule does anyway, so the type (which needs max > min) can hold it."""
    low, high = tensor_range.min, tensor_range.max
    if not high > low:
        low, high = min(low, 0.0), max(high, 0.0)
        if not high > low:  # all zeros: the smallest float32 above zero gives onnxruntime's (1.0, 0) params
            high = float(np.nextafter(np.float32(0), np.float32(1)))
    return CalibratedQuantizedType(expressed, low, high)


def attach_ranges(
    module: ModuleOp,
    ranges: CalibrationRanges | Mapping[str, TensorRange],
    model: ModelProto | str | os.PathLike[str] | None = None,
    *,
    values: Mapping[str, Value] | None = None,
) -> list[str]:
    """Insert a calibrated qcast/dcast pair on each observed float value of `module` (in place).

    `model` (ModelProto or path; default: `ranges.metadata["model"]`) names the intermediate values;
    graph inputs and outputs are named by the module itself. `values`: `tensor_values(module, model)`,
    when the caller has it already. Also records ONNX names on the IR
    (`onnx.name` on constants, `onnx.tensor_name` on the qcast) for finalize and the ONNX writer.
    Returns the names of ranges that matched no float value (e.g. integer tensors), sorted.
    """
    entries = ranges.ranges if isinstance(ranges, CalibrationRanges) else dict(ranges)
    if values is None:
        if model is None and isinstance(ranges, CalibrationRanges):
            stored = ranges.metadata.get("model")
            model = stored if isinstance(stored, str) else None
        values = tensor_values(module, model)
    edit = BlockEdit(main_function(module).regions[0].entry)
    unmatched = []
    for name, tensor_range in entries.items():
        value = values.get(name)
        expressed = element_type_of(value.type) if value is not None else None
        if value is None or not isinstance(expressed, FloatType):
            unmatched.append(name)
            continue
        if (
            math.isnan(tensor_range.min)
            or math.isnan(tensor_range.max)
            or tensor_range.min > tensor_range.max
        ):
            raise InputError(
                f"tensor '{name}': range [{tensor_range.min}, {tensor_range.max}] is not a range "
                f"(no finite value observed?)"
            )
        quantize = insert_calibrated_pair(value, calibrated_type(expressed, tensor_range), name, edit)
        if tensor_range.std is not None:
            quantize.attributes[STD_ATTR] = FloatAttr(tensor_range.std, F64)
    edit.commit()
    return sorted(unmatched)


def insert_calibrated_pair(
    value: Value, quant_type: CalibratedQuantizedType, name: str, edit: BlockEdit | None = None
) -> Operation:
    """qcast `value` to `quant_type` and dcast it back right after its definition; reroute its users.

    With `edit`, the two ops are recorded there (the caller commits); else they are inserted now.
    """
    users = list(value.uses)
    quantize = QuantizeCastOp(
        value,
        with_element_type(value.type, quant_type),
        attributes={
            NODE_NAME: StringAttr(f"{name}_QuantizeLinear"),
            TENSOR_NAME_ATTR: StringAttr(name),
        },
    )
    dequantize = DequantizeCastOp(
        quantize.result,
        value.type,
        attributes={NODE_NAME: StringAttr(f"{name}_DequantizeLinear")},
    )
    producer = value.owner_op()
    if edit is not None:
        edit.insert_after(producer, quantize, dequantize)
    else:
        if producer is not None:
            builder = Builder.after(producer)
        else:
            builder = Builder.at_start(value.owner)  # type: ignore[attr-defined]  # a block argument
        builder.insert(quantize)
        builder.insert(dequantize)
    for owner, index in users:
        owner.set_operand(index, dequantize.result)
    return quantize
