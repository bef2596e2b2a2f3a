"""MinMax parity: our calibrate -> finalize gives onnxruntime's `quantize_static` scales and zero points.

Same model, same data, same settings: onnxruntime's `quantize_static` (MinMax, QDQ) on one side; on the
other, per-tensor min/max over the same batches (onnxruntime runs the float model with the tensors its
calibrator observes exposed, graph optimizations off), `attach_ranges`, `finalize`. Every
QuantizeLinear / DequantizeLinear is matched by node name (`<tensor>_QuantizeLinear`,
`<tensor>_DequantizeLinear`: onnxruntime's naming, which finalize reproduces), and the scale, zero point,
zero-point type and axis must be equal bit for bit; the sets of Q and DQ nodes must be equal too.

Known, deliberate differences (none is exercised by these models' default settings):
- onnxruntime quantizes 16-bit / 4-bit types below opset 21 with com.microsoft Q/DQ; we raise the opset.
- `keep_float` tensors are never quantized; a bias whose input or weight stays float stays float;
  blocked weights of rank != 2 fall back to per-channel / per-tensor (onnxruntime raises on all three).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module

from qconvert.calibrate.finalize import finalize
from qconvert.calibrate.placement import DEFAULT_OP_TYPES
from qconvert.calibrate.ranges import CalibrationRanges, TensorRange, attach_ranges
from qconvert.calibrate.scheme import Scheme
from qconvert.frontends.onnx import import_onnx
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
            if name and name not in initializers and name not in names and types.get(name) == 1:
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


# name: (onnxruntime quantize_static settings, our scheme, models it applies to)
BOTH = ("digits_cnn", "tiny_encoder")
VARIANTS: dict[str, tuple[dict, Scheme, tuple[str, ...]]] = {
    "default": ({}, Scheme(), BOTH),
    "per_channel": ({"per_channel": True}, Scheme(per_channel=True), BOTH),
    "uint8": (
        {"activation_type": "QUInt8", "weight_type": "QUInt8"},
        Scheme(activation_type="uint8", weight_type="uint8"),
        BOTH,
    ),
    "symmetric_activations": (
        {"per_channel": True, "extra_options": {"ActivationSymmetric": True}},
        Scheme(per_channel=True, activation_symmetric=True),
        BOTH,
    ),
    "reduce_range": (
        {"per_channel": True, "reduce_range": True},
        Scheme(per_channel=True, reduce_range=True),
        BOTH,
    ),
    "int16": ({"activation_type": "QInt16"}, Scheme(activation_type="int16"), BOTH),
    "uint16_uint8": (
        {"activation_type": "QUInt16", "weight_type": "QUInt8"},
        Scheme(activation_type="uint16", weight_type="uint8"),
        ("digits_cnn",),
    ),
    "int4_weights": (
        {"weight_type": "QInt4", "per_channel": True},
        Scheme(weight_type="int4", per_channel=True),
        BOTH,
    ),
    "uint4_weights": (
        {"activation_type": "QUInt8", "weight_type": "QUInt4"},
        Scheme(activation_type="uint8", weight_type="uint4"),
        ("tiny_encoder",),
    ),
    "weight_symmetric_uint8": (
        {"activation_type": "QUInt8", "weight_type": "QUInt8", "extra_options": {"WeightSymmetric": True}},
        Scheme(activation_type="uint8", weight_type="uint8", weight_symmetric=True),
        ("digits_cnn",),
    ),
    "min_real_range": (
        {"extra_options": {"MinimumRealRange": 0.5}},
        Scheme(min_real_range=0.5),
        ("digits_cnn",),
    ),
    "keep_relu": (
        {"extra_options": {"QDQKeepRemovableActivations": True}},
        Scheme(keep_removable_activations=True),
        ("digits_cnn",),
    ),
    "no_weight_adjust": (
        {"extra_options": {"QDQDisableWeightAdjustForInt32Bias": True}},
        Scheme(adjust_weight_scale_for_int32_bias=False),
        ("digits_cnn",),
    ),
    "no_bias": ({"extra_options": {"QuantizeBias": False}}, Scheme(quantize_bias=False), BOTH),
    "op_types": (
        {"op_types_to_quantize": ["MatMul", "Conv", "Gemm"]},
        Scheme(op_types_to_quantize={"MatMul", "Conv", "Gemm"}),
        BOTH,
    ),
    "nodes_excluded": (
        {"nodes_to_exclude": ["/conv2/Conv", "/Relu", "/layers.0/q/MatMul", "/layers.1/Softmax"]},
        Scheme(nodes_to_exclude={"/conv2/Conv", "/Relu", "/layers.0/q/MatMul", "/layers.1/Softmax"}),
        BOTH,
    ),
    "force_no_input_check": (
        {"extra_options": {"ForceQuantizeNoInputCheck": True}},
        Scheme(force_quantize_no_input_check=True),
        BOTH,
    ),
    "outputs_excluded": (
        {"extra_options": {"OpTypesToExcludeOutputQuantization": ["MatMul", "Conv"]}},
        Scheme(op_types_to_exclude_output_quantization={"MatMul", "Conv"}),
        BOTH,
    ),
    # onnxruntime blocks rank-2 weights only (it raises on the Conv and LayerNormalization weights).
    "blocked_16": (
        {"op_types_to_quantize": ["MatMul"], "extra_options": {"BlockSize": 16}},
        Scheme(op_types_to_quantize={"MatMul"}, block_size=16),
        ("tiny_encoder",),
    ),
    # A 32-block on a 2-wide axis is one block; we write it as a block of 2 (same numbers).
    "blocked_int4_per_channel": (
        {
            "op_types_to_quantize": ["MatMul"],
            "per_channel": True,
            "weight_type": "QInt4",
            "extra_options": {"BlockSize": 32},
        },
        Scheme(op_types_to_quantize={"MatMul"}, per_channel=True, weight_type="int4", block_size=32),
        ("tiny_encoder",),
    ),
    "blocked_uint4": (
        {
            "op_types_to_quantize": ["MatMul"],
            "activation_type": "QUInt8",
            "weight_type": "QUInt4",
            "extra_options": {"BlockSize": 32},
        },
        Scheme(op_types_to_quantize={"MatMul"}, activation_type="uint8", weight_type="uint4", block_size=32),
        ("tiny_encoder",),
    ),
}
CASES = [(model, variant) for variant, (_, _, models) in VARIANTS.items() for model in models]


def quantize_both(model_name: str, variant: str, tmp_path: Path) -> tuple[dict[str, QdqParams], object]:
    """onnxruntime's Q/DQ parameters, and our finalized module, for one model and variant."""
    quantization = require_module("onnxruntime.quantization")
    path = MODELS / f"{model_name}.onnx"
    data = batches(model_name)
    settings, scheme, _ = VARIANTS[variant]
    settings = dict(settings)
    for key in ("activation_type", "weight_type"):
        if key in settings:
            settings[key] = getattr(quantization.QuantType, settings[key])
    expected = onnxruntime_qdq(path, data, tmp_path, **settings)
    module = import_onnx(path)
    assert attach_ranges(module, minmax_ranges(path, data)) == []
    finalize(module, scheme)
    return expected, module


@pytest.mark.parametrize(("model_name", "variant"), CASES)
def test_minmax_matches_quantize_static(model_name: str, variant: str, tmp_path: Path) -> None:
    expected, module = quantize_both(model_name, variant, tmp_path)
    ours = finalized_qdq(module)
    assert sorted(ours) == sorted(expected)
    mismatched = {name: (ours[name], expected[name]) for name in expected if ours[name] != expected[name]}
    assert not mismatched
    assert len(expected) > 10  # the comparison covered real work


def test_float_min_sentinel_tensor_can_be_kept_in_float(tmp_path: Path) -> None:
    """keep_float removes a tensor's Q/DQ (and nothing else) relative to the default placement."""
    path = MODELS / "tiny_encoder.onnx"
    data = batches("tiny_encoder", 2)
    ranges = minmax_ranges(path, data)
    baseline = import_onnx(path)
    attach_ranges(baseline, ranges)
    finalize(baseline, Scheme())
    kept = import_onnx(path)
    attach_ranges(kept, ranges)
    notes: list[str] = []
    finalize(kept, Scheme(keep_float={"/layers.0/Div_output_0": "adds float-min"}), notes)
    base_names, kept_names = set(finalized_qdq(baseline)), set(finalized_qdq(kept))
    assert base_names - kept_names == {
        "/layers.0/Div_output_0_QuantizeLinear",
        "/layers.0/Div_output_0_DequantizeLinear",
    }
    assert kept_names <= base_names
    assert any("/layers.0/Div_output_0" in note and "adds float-min" in note for note in notes)
