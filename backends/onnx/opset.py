"""Which opset the written model gets, and getting the other nodes there (onnx.version_converter).

The default domain's opset is the model's own (`onnx.opset_import`; 21 for a module without one),
raised to what the Q/DQ nodes need (qdq.py: per-axis 13, float8 / f16 scales 19, int16 / int4 /
blocked 21, float4 23, int2 25), but never above 25 when the model has Q/DQ nodes: onnxruntime 1.32
has no QuantizeLinear / DequantizeLinear kernels past 25 (../shared/engines/README.md). A model at 26+
with Q/DQ nodes is lowered to 25. A changed opset goes through onnx.version_converter, which adapts the
other nodes (ReduceMean's `axes` attribute becomes an input at 18, ...) or fails, reported as such.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx import version_converter

from qconvert.errors import InputError
from qconvert.ir.dialects.onnx import DEFAULT_OPSET

MAX_QDQ_OPSET = 25


def choose_opset(model_opset: int | None, required: int, has_qdq: bool, requested: int | None) -> int:
    """The default domain's opset of the written model (`requested` wins, if the Q/DQ nodes allow it)."""
    if requested is not None:
        if requested < required:
            raise InputError(
                f"opset {requested} is too old for this model's quantization: its Q/DQ nodes need "
                f"opset {required} or newer"
            )
        if has_qdq and requested > MAX_QDQ_OPSET:
            raise InputError(
                f"opset {requested}: onnxruntime 1.32 has no QuantizeLinear/DequantizeLinear kernels "
                f"past opset {MAX_QDQ_OPSET}; ask for {MAX_QDQ_OPSET} or lower"
            )
        return requested
    target = max(DEFAULT_OPSET if model_opset is None else model_opset, required)
    return min(target, MAX_QDQ_OPSET) if has_qdq else target


DETACH_BYTES = 1024
"""Initializers at least this large are left out of the proto the version converter sees."""
DETACHED_LOCATION = "__qconvert_detached__"


def convert_opset(model: ir.Model, base: int, target: int) -> ir.Model:
    """`model`'s nodes (written at opset `base`) adapted to opset `target` by onnx.version_converter.

    The converter only needs the graph: weights are swapped for external-data stubs while it runs and
    put back by name afterwards, so a model of any size converts without its weights being copied.
    """
    model.graph.opset_imports[""] = base
    detached: dict[str, ir.TensorProtocol] = {}
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if tensor is not None and tensor.nbytes >= DETACH_BYTES:
            detached[name] = tensor
            value.const_value = ir.ExternalTensor(
                DETACHED_LOCATION,
                0,
                tensor.nbytes,
                tensor.dtype,
                shape=ir.Shape(tensor.shape.numpy()),
                name=name,
            )
    try:
        proto = ir.serde.serialize_model(model)
    finally:
        for name, tensor in detached.items():
            model.graph.initializers[name].const_value = tensor
    try:
        converted = ir.serde.deserialize_model(version_converter.convert_version(proto, target))
    except Exception as error:  # the converter raises RuntimeError / ValueError / its own types
        raise InputError(
            f"cannot convert the model from opset {base} to opset {target} (needed by its Q/DQ nodes, or "
            f"asked for): onnx.version_converter failed: {error}"
        ) from None
    for name, tensor in detached.items():
        converted.graph.initializers[name].const_value = tensor
    return converted
