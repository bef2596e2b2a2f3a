"""What `qconvert inspect` and `qconvert import --elide-weights` need from a lifted module.

`summarize(module)` counts ops by name and quantized tensors by scheme (per-tensor, per-axis,
sub-channel) and storage type; `elide_weights(module)` replaces large constants by MLIR's elided
form, `dense_resource<__elided__>`, which parses back (with no data) like upstream's
`--mlir-elide-elementsattrs-if-larger`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from qconvert.interpret import input_names, output_names
from qconvert.ir.attributes import DenseElementsAttr, DenseResourceAttr
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp
from qconvert.ir.quant_types import (
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
)
from qconvert.ir.types import element_type_of

ELIDED = "__elided__"


@dataclass
class ModuleSummary:
    """Counts that describe a lifted model; `lines()` is the text `qconvert inspect` prints."""

    inputs: list[str]
    outputs: list[str]
    ops: Counter[str] = field(default_factory=Counter)
    schemes: Counter[str] = field(default_factory=Counter)
    storage_types: Counter[str] = field(default_factory=Counter)
    constants: int = 0
    constant_bytes: int = 0

    def lines(self) -> list[str]:
        out = [f"inputs: {', '.join(self.inputs)}", f"outputs: {', '.join(self.outputs)}"]
        out.append(f"constants: {self.constants} ({self.constant_bytes} bytes)")
        out.append("ops:")
        out += [f"  {name}: {count}" for name, count in sorted(self.ops.items())]
        out.append("quantized tensors by scheme (quant.qcast / quant.dcast):")
        out += [f"  {name}: {count}" for name, count in sorted(self.schemes.items())] or ["  none"]
        out.append("storage types:")
        out += [f"  {name}: {count}" for name, count in sorted(self.storage_types.items())] or ["  none"]
        return out


def scheme_of(quant_type: QuantizedType) -> str:
    if isinstance(quant_type, UniformQuantizedPerAxisType):
        return "per-axis"
    if isinstance(quant_type, UniformQuantizedSubChannelType):
        return "sub-channel (blocked)"
    return "per-tensor"


def summarize(module: ModuleOp) -> ModuleSummary:
    summary = ModuleSummary(input_names(module), output_names(module))
    for op in module.walk():
        if op is module or op.name in ("func.func", "func.return"):
            continue
        summary.ops[op.name] += 1
        if isinstance(op, ConstantOp) and isinstance(op.value, DenseElementsAttr):
            summary.constants += 1
            summary.constant_bytes += op.value.array.nbytes
        elif isinstance(op, ConstantOp) and isinstance(op.value, DenseResourceAttr):
            elements = op.value.elements  # shape and dtype only: the blob is not read
            summary.constants += 1
            if elements is not None:
                summary.constant_bytes += (
                    int(np.prod(elements.shape, dtype=np.int64)) * elements.dtype.itemsize
                )
        quantized = None
        if isinstance(op, QuantizeCastOp):
            quantized = element_type_of(op.result.type)
        elif isinstance(op, DequantizeCastOp):
            quantized = element_type_of(op.input.type)
        if isinstance(quantized, QuantizedType):
            summary.schemes[scheme_of(quantized)] += 1
            summary.storage_types[quantized.storage_type_spelling] += 1
    return summary


def elide_weights(module: ModuleOp, threshold: int = 16) -> int:
    """Replace constants of more than `threshold` elements, and every `dense_resource` blob, by
    `dense_resource<__elided__>` (no data; MLIR prints elided resources so); the count."""
    elided = 0
    for op in module.walk():
        value = op.attributes.get("value") if isinstance(op, ConstantOp) else None
        if (isinstance(value, DenseElementsAttr) and value.array.size > threshold) or (
            isinstance(value, DenseResourceAttr) and value.name != ELIDED
        ):
            op.attributes["value"] = DenseResourceAttr(ELIDED, value.type)
            elided += 1
    return elided
