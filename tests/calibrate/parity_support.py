"""Shared by the calibration tests: the same batches, onnxruntime's MinMax ranges, Q/DQ parameter readers, the
bert_mask model's builder and its mask tensors.

NOTE: not a test module; tests/calibrate/test_minmax_parity.py explains the comparison.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
from conftest import require_module

from qconvert.calibrate.ranges import CalibrationRanges, TensorRange
from qconvert.calibrate.scheme import DEFAULT_OP_TYPES
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


def load_bert_mask_builder() -> ModuleType:
    """models/build_bert_mask.py as a module (models/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("build_bert_mask", MODELS / "build_bert_mask.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def mask_tensors(model: onnx.ModelProto) -> tuple[set[str], set[str], set[str]]:
    """bert_mask's float-min Constant output(s), the mask (the Mul by one) and the Adds of scores + mask."""
    constants = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
                 if n.op_type == "Constant"}  # fmt: skip
    constants.update({t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer})
    float_min = {name for name, value in constants.items() if np.any(value <= -1e38)}
    masks = {n.output[0] for n in model.graph.node if n.op_type == "Mul" and float_min & set(n.input)}
    adds = {n.output[0] for n in model.graph.node if n.op_type == "Add" and masks & set(n.input)}
    return float_min - {t.name for t in model.graph.initializer}, masks, adds


def save_npz(path: Path, batches: list[dict[str, np.ndarray]]) -> Path:
    """The batches as one .npz (samples on axis 0), as `qconvert calibrate --data` reads it."""
    np.savez(path, **{name: np.concatenate([b[name] for b in batches]) for name in batches[0]})
    return path


def lowest_cosines(
    float_path: Path, quantized_path: Path, feeds: list[dict[str, np.ndarray]], level: str = "ORT_ENABLE_ALL"
) -> dict[str, float]:
    """Per graph output: the lowest cosine over `feeds` of the quantized model's output to the float
    model's, both run by onnxruntime at graph optimization `level` (a GraphOptimizationLevel name)."""
    ort = require_module("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    reference = ort.InferenceSession(str(float_path), options, providers=["CPUExecutionProvider"])
    quantized = ort.InferenceSession(str(quantized_path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in reference.get_outputs()]
    lowest = dict.fromkeys(names, 1.0)
    for feed in feeds:
        for name, want, got in zip(names, reference.run(names, feed), quantized.run(names, feed)):
            want, got = want.ravel().astype(np.float64), got.ravel().astype(np.float64)
            lowest[name] = min(lowest[name], float(want @ got / (np.linalg.norm(want) * np.linalg.norm(got))))
    return lowest


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


def op_zoo_model() -> onnx.ModelProto:
    """One of most op types with a placement rule of their own (reference §2.6), in a small graph:
    ConvTranspose, BatchNormalization, Clip, Pad (constant 0 and reflect), MaxPool, Resize, AveragePool,
    Split, Sigmoid, Mul by a scalar constant, Concat, Where, Transpose, Slice, MatMul, LeakyRelu, Relu.
    Initializer names avoid `<tensor>_scale` / `_zero_point`, which onnxruntime's own names would shadow."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(3)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    def constant(name: str, value: object, dtype: type = np.float32) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, dtype), name)

    initializers = [
        constant("ct_w", normal(4, 3, 3, 3) * 0.3),
        constant("ct_b", normal(3)),
        constant("bn_gamma", np.abs(normal(3)) + 0.5),
        constant("bn_beta", normal(3)),
        constant("bn_mean", normal(3)),
        constant("bn_var", np.abs(normal(3)) + 0.5),
        constant("pads", [0, 0, 1, 1, 0, 0, 1, 1], np.int64),
        constant("zero", 0.0),
        constant("clip_lo", 0.0),
        constant("clip_hi", 6.0),
        constant("split_sizes", [2, 1], np.int64),
        constant("half", 0.5),
        constant("starts", [0], np.int64),
        constant("ends", [2], np.int64),
        constant("axes", [1], np.int64),
        constant("mm_w", normal(3, 4) * 0.5),
        constant("roi", np.zeros(0)),
        constant("resize_scales", [1, 1, 2, 2]),
    ]
    node = helper.make_node
    nodes = [
        node("ConvTranspose", ["x", "ct_w", "ct_b"], ["ct"], name="ct"),
        node("BatchNormalization", ["ct", "bn_gamma", "bn_beta", "bn_mean", "bn_var"], ["bn"], name="bn"),
        node("Clip", ["bn", "clip_lo", "clip_hi"], ["clip"], name="clip"),
        node("Pad", ["clip", "pads", "zero"], ["pad"], name="pad", mode="constant"),
        node("Pad", ["pad", "pads"], ["pad2"], name="pad2", mode="reflect"),
        node("MaxPool", ["pad2"], ["mp"], name="mp", kernel_shape=[2, 2], strides=[2, 2]),
        node("Resize", ["mp", "roi", "resize_scales"], ["rs"], name="rs", mode="nearest"),
        node("AveragePool", ["rs"], ["ap"], name="ap", kernel_shape=[2, 2], strides=[2, 2]),
        node("Split", ["ap", "split_sizes"], ["s1", "s2"], name="split", axis=1),
        node("Sigmoid", ["s1"], ["sig"], name="sig"),
        node("Mul", ["s2", "half"], ["mul"], name="mul"),
        node("Concat", ["sig", "mul"], ["cat"], name="cat", axis=1),
        node("Greater", ["cat", "zero"], ["cond"], name="gt"),
        node("Mul", ["cat", "half"], ["halved"], name="halve"),
        node("Where", ["cond", "cat", "halved"], ["wh"], name="where"),
        node("Transpose", ["wh"], ["tr"], name="tr", perm=[0, 2, 3, 1]),
        node("Slice", ["tr", "starts", "ends", "axes"], ["sl"], name="sl"),
        node("MatMul", ["sl", "mm_w"], ["mm"], name="mm"),
        node("LeakyRelu", ["mm"], ["lr"], name="lr", alpha=0.1),
        node("Relu", ["lr"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "zoo",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4, 6, 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializers,
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    )
    onnx.checker.check_model(model)
    return model
