"""Shared by the calibration tests: the same batches, onnxruntime's MinMax ranges, Q/DQ parameter readers.

NOTE: not a test module; tests/calibrate/test_minmax_parity.py explains the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from conftest import require_module

from qconvert.calibrate.placement import DEFAULT_OP_TYPES
from qconvert.calibrate.ranges import CalibrationRanges, TensorRange
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp
from qconvert.ir.quant_types import UniformQuantizedPerAxisType, UniformQuantizedSubChannelType
from qconvert.ir.types import element_type_of

MODELS = Path(__file__).resolve().parents[2] / "models"

# onnxruntime's integer element types by our storage names, for the zero point's ONNX type.
ZERO_POINT_TYPES = {
    "int8": onnx.TensorProto.INT8,
    "uint8": onnx.TensorProto.UINT8,
    "int16": onnx.TensorProto.INT16,
    "uint16": onnx.TensorProto.UINT16,
    "int4": onnx.TensorProto.INT4,
    "uint4": onnx.TensorProto.UINT4,
    "int32": onnx.TensorProto.INT32,
}


def batches(model_name: str, count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(2026)
    if model_name == "digits_cnn":
        first = dict(np.load(MODELS / "digits_cnn.inputs.npz"))
        noise = [{"image": rng.random((8, 1, 8, 8), dtype=np.float32)} for _ in range(count - 1)]
        return [first, *noise]
    return [{"input_ids": rng.integers(0, 32, (2, 16), dtype=np.int64)} for _ in range(count)]


def observed_tensors(model: onnx.ModelProto) -> list[str]:
    """The tensors onnxruntime's calibrator observes: float, non-initializer inputs/outputs of the nodes
    whose op type is in the default op list (reference §2.2)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    }
    initializers = {i.name for i in model.graph.initializer}
    names: list[str] = []
    for node in model.graph.node:
        if node.op_type not in DEFAULT_OP_TYPES:
            continue
        for name in [*node.input, *node.output]:
            if name and name not in initializers and name not in names and types.get(name) in (1, 10):
                names.append(name)
    return names


def minmax_ranges(path: Path, data: list[dict[str, np.ndarray]]) -> CalibrationRanges:
    ort = require_module("onnxruntime")
    model = onnx.load(path)
    names = observed_tensors(model)
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in outputs)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    output_names = [o.name for o in session.get_outputs()]
    low: dict[str, np.float32] = {}
    high: dict[str, np.float32] = {}
    for batch in data:
        for name, value in zip(output_names, session.run(None, batch), strict=True):
            if name in names:
                low[name] = min(low.get(name, np.float32(np.inf)), value.min())
                high[name] = max(high.get(name, np.float32(-np.inf)), value.max())
    ranges = CalibrationRanges(metadata={"model": str(path), "method": "minmax"})
    for name in names:
        ranges.add(TensorRange(name, low[name], high[name], samples=len(data)))
    return ranges


class Reader:
    def __init__(self, data: list[dict[str, np.ndarray]]) -> None:
        self.items = iter(data)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.items, None)


@dataclass(frozen=True)
class QdqParams:
    scale: tuple[float, ...]  # float32 values (as float64) in order
    zero_point: tuple[int, ...]
    zero_point_type: int
    axis: int | None  # None for per-tensor


def onnxruntime_qdq(path: Path, data: list, tmp_path: Path, **settings: object) -> dict[str, QdqParams]:
    quantization = require_module("onnxruntime.quantization")
    out = tmp_path / "ort.qdq.onnx"
    quantization.quantize_static(
        str(path), str(out), Reader(data), quant_format=quantization.QuantFormat.QDQ, **settings
    )
    return written_qdq(onnx.load(out))


def written_qdq(model: onnx.ModelProto) -> dict[str, QdqParams]:
    """Q/DQ node name -> parameters, from a QDQ ONNX model."""
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    constants = {
        n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
        for n in model.graph.node
        if n.op_type == "Constant"
    }
    initializers.update(constants)
    types = {i.name: i.data_type for i in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        scale = initializers[node.input[1]].astype(np.float32).reshape(-1)
        zero_point = initializers[node.input[2]].astype(np.int64).reshape(-1)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        found[node.name] = QdqParams(
            tuple(float(s) for s in scale),
            tuple(int(z) for z in zero_point),
            types[node.input[2]],
            axis if scale.size > 1 else None,
        )
    return found


def finalized_qdq(module: object) -> dict[str, QdqParams]:
    """Q/DQ node name -> parameters, read from the finalized IR's `!quant.uniform` types."""
    found = {}
    for op in module.walk():  # type: ignore[attr-defined]
        if not isinstance(op, QuantizeCastOp | DequantizeCastOp):
            continue
        quantized = op.result.type if isinstance(op, QuantizeCastOp) else op.input.type
        element = element_type_of(quantized)
        signed = "int" if element.is_signed else "uint"
        zero_point_type = ZERO_POINT_TYPES[f"{signed}{element.storage_type.width}"]
        if isinstance(element, UniformQuantizedSubChannelType):
            (axis,) = (d for d, b in element.block_size_info if b > 1)
            mask = -1 if element.is_signed else (1 << element.storage_type.width) - 1
            params = QdqParams(
                tuple(float(s) for s in element.scales.array.reshape(-1)),
                # Sub-channel zero points are stored as signed two's complement of the storage width.
                tuple(int(z) & mask for z in element.zero_points.array.reshape(-1)),
                zero_point_type,
                axis,
            )
        elif isinstance(element, UniformQuantizedPerAxisType):
            params = QdqParams(
                tuple(float(np.float32(s)) for s in element.scales),
                tuple(element.zero_points),
                zero_point_type,
                element.quantized_dimension if len(element.scales) > 1 else None,
            )
        else:
            params = QdqParams(
                (float(np.float32(element.scale)),), (element.zero_point,), zero_point_type, None
            )
        found[op.attributes["onnx.node_name"].value] = params
    return found
