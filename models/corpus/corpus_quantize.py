"""The corpus's quantization styles: onnxruntime's quantizers as users call them, weight-only int8 by hand.

- `quantize_dynamic_model`: onnxruntime `quantize_dynamic` with its defaults (per tensor, QInt8 weights;
  QUInt8 for models with Conv, since onnxruntime's ConvInteger kernel takes uint8 weights only).
- `quantize_static_model`: onnxruntime `quantize_static`, QDQ or QOperator, per-channel weights, MinMax
  calibration on a seeded reader, otherwise its defaults (int8 activations and weights); the nodes that
  compute Gather indices are excluded, as users must for T5 (see index_computing_nodes).
- `weight_only_int8`: every float weight initializer of MatMul / Gemm / Conv / LSTM / GRU becomes an int8
  initializer -> Cast(to float) -> Mul(scale), symmetric per output channel (the pattern of hand-written
  weight-only exports), or a per-axis DequantizeLinear of it; activations stay float.
- `quantize_nbits_model`: onnxruntime's MatMulNBitsQuantizer, 4-bit blocks (MatMulNBits, or int4 QDQ).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)


class ListReader(CalibrationDataReader):
    """Feeds a fixed list of input dicts to onnxruntime's calibrator, once."""

    def __init__(self, batches: Sequence[dict[str, np.ndarray]]) -> None:
        self._batches = list(batches)
        self._iterator: Iterator[dict[str, np.ndarray]] = iter(self._batches)

    def get_next(self) -> dict[str, np.ndarray] | None:  # pyright: ignore[reportIncompatibleMethodOverride]
        return next(self._iterator, None)

    def rewind(self) -> None:
        self._iterator = iter(self._batches)


class _InFolder:
    """Run the quantizer inside a temporary folder: its calibrator writes augmented models into the cwd."""

    def __enter__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self._cwd = os.getcwd()
        os.chdir(self._tmp.name)

    def __exit__(self, *exc: object) -> None:
        os.chdir(self._cwd)
        self._tmp.cleanup()


def quantize_dynamic_model(
    float_path: Path, out_path: Path, weight_type: str, per_channel: bool = False
) -> None:
    """quantize_dynamic; `per_channel` also sets reduce_range (7-bit weights), as onnxruntime's docs advise
    for per-channel weights on machines without VNNI."""
    with _InFolder():
        quantize_dynamic(
            str(float_path),
            str(out_path),
            weight_type=QuantType[weight_type],
            per_channel=per_channel,
            reduce_range=per_channel,
        )


def quantize_nbits_model(float_path: Path, out_path: Path, quant_format: str) -> None:
    """4-bit block-wise weights of every MatMul (onnxruntime's MatMulNBitsQuantizer, blocks of 32,
    symmetric): `nbits` writes com.microsoft MatMulNBits, `nbits_qdq` an int4 DequantizeLinear with
    block_size feeding the MatMul (the quantizer raises the model to opset 21)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(float_path)),
        bits=4,
        block_size=32,
        is_symmetric=True,
        quant_format=QuantFormat.QDQ if quant_format == "nbits_qdq" else QuantFormat.QOperator,
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(out_path))


def index_computing_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes that compute a Gather's indices (e.g. T5's relative position buckets).

    Quantizing them corrupts the indices: T5's Log(0) = -inf calibrates to an infinite range, and the
    bucket Gather then reads out of bounds. Users exclude them (`nodes_to_exclude`); so does the corpus.
    """
    producers = {output: node for node in model.graph.node for output in node.output}
    found: dict[str, None] = {}
    pending = [node.input[1] for node in model.graph.node if node.op_type == "Gather" and len(node.input) > 1]
    while pending:
        node = producers.get(pending.pop())
        if node is None or node.name in found:
            continue
        found[node.name] = None
        if node.op_type not in ("Shape", "Size"):  # a tensor's shape does not depend on its values
            pending.extend(node.input)
    return list(found)


def quantize_static_model(
    float_path: Path, out_path: Path, batches: Sequence[dict[str, np.ndarray]], quant_format: str
) -> None:
    """quantize_static: `qdq` / `qop` with onnxruntime's default types (int8 activations and weights) and
    per-channel weights; `qdq_u8` with uint8 activations and uint8 per-tensor weights (asymmetric), the
    defaults of older onnxruntime releases that many shipped models still carry."""
    excluded = index_computing_nodes(onnx.load(str(float_path)))
    with _InFolder():
        quantize_static(
            str(float_path),
            str(out_path),
            ListReader(batches),
            quant_format=QuantFormat.QOperator if quant_format == "qop" else QuantFormat.QDQ,
            per_channel=quant_format != "qdq_u8",
            activation_type=QuantType.QUInt8 if quant_format == "qdq_u8" else QuantType.QInt8,
            weight_type=QuantType.QUInt8 if quant_format == "qdq_u8" else QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=excluded,
        )


# Which input of each op is a weight, and its output-channel axis (Gemm's depends on transB).
WEIGHT_INPUTS: dict[str, tuple[tuple[int, int], ...]] = {
    "MatMul": ((1, -1),),  # B [K, N]: one scale per output column
    "Conv": ((1, 0),),  # W [M, C/g, kH, kW]: one scale per output channel
    "LSTM": ((1, 1), (2, 1)),  # W [dirs, 4H, in], R [dirs, 4H, H]: one scale per gate row
    "GRU": ((1, 1), (2, 1)),
}


def _weight_slots(node: onnx.NodeProto) -> tuple[tuple[int, int], ...]:
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return ((1, 0 if trans_b else 1),)
    return WEIGHT_INPUTS.get(node.op_type, ())


def weight_only_int8(model: onnx.ModelProto, form: str = "cast_mul") -> onnx.ModelProto:
    """Weight-only int8: each float weight initializer (rank >= 2) of MatMul / Gemm / Conv / LSTM / GRU
    -> an int8 initializer dequantized per output channel, symmetric, in [-127, 127]: by Cast(to float)
    and Mul by a float scale (`form="cast_mul"`), or by a per-axis DequantizeLinear with zero point 0
    (`form="dequantize_linear"`, opset 13 or later).

    A weight shared by several consumers is quantized once. Returns a new model; `model` is unchanged.
    """
    if form not in ("cast_mul", "dequantize_linear"):
        raise ValueError(f"unknown weight-only form {form!r}")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    replaced: dict[str, str] = {}
    new_nodes: dict[int, list[onnx.NodeProto]] = {}
    for index, node in enumerate(graph.node):
        for slot, axis in _weight_slots(node):
            if slot >= len(node.input) or node.input[slot] not in initializers:
                continue
            name = node.input[slot]
            if name not in replaced:
                weight = numpy_helper.to_array(initializers[name])
                if weight.dtype != np.float32 or weight.ndim < 2:
                    continue
                channel_axis = axis % weight.ndim
                reduce_axes = tuple(a for a in range(weight.ndim) if a != channel_axis)
                largest = np.abs(weight).max(axis=reduce_axes, keepdims=True)
                scale = np.where(largest > 0, largest / 127.0, 1.0).astype(np.float32)
                quantized = np.clip(np.rint(weight / scale), -127, 127).astype(np.int8)
                graph.initializer.append(numpy_helper.from_array(quantized, f"{name}_int8"))
                replaced[name] = f"{name}_dequantized"
                if form == "dequantize_linear":  # one scale per channel along `channel_axis`, zero point 0
                    graph.initializer.append(numpy_helper.from_array(scale.reshape(-1), f"{name}_scale"))
                    graph.initializer.append(
                        numpy_helper.from_array(np.zeros(scale.size, np.int8), f"{name}_zero_point")
                    )
                    dequantize = helper.make_node(
                        "DequantizeLinear",
                        [f"{name}_int8", f"{name}_scale", f"{name}_zero_point"],
                        [replaced[name]],
                        name=f"{name}_DequantizeLinear",
                        axis=channel_axis,
                    )
                    new_nodes.setdefault(index, []).append(dequantize)
                else:
                    graph.initializer.append(numpy_helper.from_array(scale, f"{name}_scale"))
                    cast = helper.make_node(
                        "Cast", [f"{name}_int8"], [f"{name}_float"], name=f"{name}_Cast", to=TensorProto.FLOAT
                    )
                    multiply = helper.make_node(
                        "Mul", [f"{name}_float", f"{name}_scale"], [replaced[name]], name=f"{name}_Mul"
                    )
                    new_nodes.setdefault(index, []).extend([cast, multiply])
            node.input[slot] = replaced[name]
    nodes = list(graph.node)
    graph.ClearField("node")
    for index, node in enumerate(nodes):
        graph.node.extend(new_nodes.get(index, []))
        graph.node.append(node)
    still_read = {name for node in graph.node for name in node.input}  # e.g. a tied embedding's Gather
    kept = [init for init in graph.initializer if init.name not in replaced or init.name in still_read]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    # value_info of the old float weights no longer describes a graph value; shapes are re-inferred
    graph.ClearField("value_info")
    return onnx.shape_inference.infer_shapes(model)
