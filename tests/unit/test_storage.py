"""qconvert.storage's quantize_inputs / dequantize_outputs against onnxruntime's Quantize/DequantizeLinear.

Each case builds a one-op source model (x -> QuantizeLinear -> q, or q -> DequantizeLinear -> y) and its
stripped copy by hand, following the storage contract (qconvert/storage_metadata.py): the boundary value
takes its storage type, an Identity stands for the model's body, and the parameters go to metadata_props.
What quantize_inputs gives the stripped model must be, bit for bit, what onnxruntime's QuantizeLinear gave
the source; what dequantize_outputs makes of the stored values, what its DequantizeLinear gave.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qconvert.errors import InputError
from qconvert.ir.parser import parse_type
from qconvert.storage import StorageBoundary, dequantize_outputs, quantize_inputs
from qconvert.storage_metadata import StorageEntry, StorageMetadata, sidecar_path

ONNX_TYPES = {
    "uint8": TensorProto.UINT8,
    "int8": TensorProto.INT8,
    "uint16": TensorProto.UINT16,
    "int16": TensorProto.INT16,
    "uint4": TensorProto.UINT4,
    "int4": TensorProto.INT4,
}
# (storage, quant type, axis): per tensor and per axis, signed and unsigned, 4 to 16 bits.
CASES = [
    ("uint8", "!quant.uniform<u8:f32, 0.0078125:128>", None),
    ("int8", "!quant.uniform<i8:f32, 0.05:-3>", None),
    ("uint16", "!quant.uniform<u16:f32, 0.00030517578125:32768>", None),
    ("int16", "!quant.uniform<i16:f32, 0.001:7>", None),
    ("int8", "!quant.uniform<i8:f32:1, {0.5:3,0.25:-1,0.125:0}>", 1),
    ("uint8", "!quant.uniform<u8:f32:0, {0.0625:10,0.03125:200}>", 0),
    ("int4", "!quant.uniform<i4:f32, 0.5:1>", None),
    ("uint4", "!quant.uniform<u4:f32:1, {0.5:3,0.25:8,1.0:0}>", 1),
]
SHAPE = (2, 3, 5)


def entry_of(quant_type: str) -> StorageEntry:
    return StorageEntry.of(parse_type(quant_type))


def params_initializers(entry: StorageEntry, storage: str) -> list[TensorProto]:
    dims = [len(entry.scale)] if entry.axis is not None else []
    return [
        helper.make_tensor("scale", TensorProto.FLOAT, dims, list(entry.scale)),
        helper.make_tensor("zero_point", ONNX_TYPES[storage], dims, list(entry.zero_point)),
    ]


def model_of(nodes: list, inputs: list, outputs: list, initializers: list, props: dict | None = None):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    for key, value in (props or {}).items():
        model.metadata_props.add(key=key, value=value)
    return model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def as_int8(storage: str, kind: int) -> tuple[list, int]:
    """onnxruntime's Python API returns no 4-bit tensors: the models cast them to int8 / uint8 first."""
    if storage in ("int4", "uint4"):
        cast = TensorProto.INT8 if storage == "int4" else TensorProto.UINT8
        return [helper.make_node("Cast", ["q"], ["q8"], to=cast)], cast
    return [helper.make_node("Identity", ["q"], ["q8"])], kind


def quantizing_models(storage: str, entry: StorageEntry) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The source (x -> QuantizeLinear -> q8) and its stripped copy (x as storage -> q8)."""
    kind = ONNX_TYPES[storage]
    attributes = {"axis": entry.axis} if entry.axis is not None else {}
    cast, out_kind = as_int8(storage, kind)
    quantize = helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["q"], **attributes)
    source = model_of(
        [quantize, *cast],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("q8", out_kind, SHAPE)],
        params_initializers(entry, storage),
    )
    props = StorageMetadata(inputs={"x": entry}).metadata_props()
    stripped = model_of(
        [helper.make_node("Identity", ["x"], ["q"]), *cast],
        [helper.make_tensor_value_info("x", kind, SHAPE)],
        [helper.make_tensor_value_info("q8", out_kind, SHAPE)],
        [],
        props,
    )
    return source, stripped


def dequantizing_models(storage: str, entry: StorageEntry) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The source (q -> DequantizeLinear -> y) and its stripped copy (q -> y as storage)."""
    kind = ONNX_TYPES[storage]
    attributes = {"axis": entry.axis} if entry.axis is not None else {}
    dequantize = helper.make_node("DequantizeLinear", ["q", "scale", "zero_point"], ["y"], **attributes)
    source = model_of(
        [dequantize],
        [helper.make_tensor_value_info("q", kind, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        params_initializers(entry, storage),
    )
    props = StorageMetadata(outputs={"y": entry}).metadata_props()
    stripped = model_of(
        [helper.make_node("Identity", ["q"], ["y"])],
        [helper.make_tensor_value_info("q", kind, SHAPE)],
        [helper.make_tensor_value_info("y", kind, SHAPE)],
        [],
        props,
    )
    return source, stripped


def float_inputs(entry: StorageEntry) -> np.ndarray:
    """Values around and beyond the range, with exact ties (k + 0.5 steps) and both signs."""
    rng = np.random.default_rng(7)
    scale = max(entry.scale)
    x = rng.normal(0.0, 40 * scale, SHAPE).astype(np.float32)
    ties = (np.arange(x.size).reshape(SHAPE) % 9 - 4 + 0.5).astype(np.float32) * np.float32(min(entry.scale))
    x[0, 0] = ties[0, 0]
    x[1, 2] = ties[1, 2]
    x[0, 1, 0] = 1e6
    x[0, 1, 1] = -1e6
    return x


@pytest.mark.parametrize(("storage", "quant_type", "axis"), CASES)
def test_quantize_inputs_is_onnxruntime_quantize_linear(
    storage: str, quant_type: str, axis: int | None
) -> None:
    entry = entry_of(quant_type)
    assert (entry.storage, entry.axis) == (storage, axis)
    source, stripped = quantizing_models(storage, entry)
    x = float_inputs(entry)
    (expected,) = run(source, {"x": x})
    feeds = quantize_inputs(stripped, {"x": x})
    assert feeds["x"].dtype == np.dtype(helper.tensor_dtype_to_np_dtype(ONNX_TYPES[storage]))
    assert np.array_equal(feeds["x"].astype(expected.dtype), expected)
    assert len(np.unique(expected)) > 4  # the values spread over the range, saturated at both ends
    if storage not in ("int4", "uint4"):  # onnxruntime's Python API takes no 4-bit arrays
        (fed,) = run(stripped, feeds)
        assert np.array_equal(fed, expected)


@pytest.mark.parametrize(("storage", "quant_type", "axis"), CASES)
def test_dequantize_outputs_is_onnxruntime_dequantize_linear(
    storage: str, quant_type: str, axis: int | None
) -> None:
    entry = entry_of(quant_type)
    source, stripped = dequantizing_models(storage, entry)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(ONNX_TYPES[storage]))
    low, high = (int(v) for v in (ml_dtypes.iinfo(dtype).min, ml_dtypes.iinfo(dtype).max))
    q = np.random.default_rng(3).integers(low, high + 1, SHAPE).astype(dtype)
    if storage in ("int4", "uint4"):  # no 4-bit arrays in onnxruntime's Python API:
        expected = dequantize_through_int8(storage, entry, q)  # the source fed an 8-bit copy
    else:
        (expected,) = run(source, {"q": q})
        (q_out,) = run(stripped, {"q": q})
        assert np.array_equal(q_out, q)
    floats = dequantize_outputs(stripped, {"y": q})
    assert floats["y"].dtype == np.float32
    assert np.array_equal(floats["y"], expected)
    assert np.array_equal(dequantize_outputs(stripped, [q])["y"], expected)  # session.run's list


def dequantize_through_int8(storage: str, entry: StorageEntry, q: np.ndarray) -> np.ndarray:
    """onnxruntime's DequantizeLinear of 4-bit values: fed as int8 / uint8, cast to 4 bits in the graph."""
    wide = TensorProto.INT8 if storage == "int4" else TensorProto.UINT8
    attributes = {"axis": entry.axis} if entry.axis is not None else {}
    model = model_of(
        [
            helper.make_node("Cast", ["q8"], ["q"], to=ONNX_TYPES[storage]),
            helper.make_node("DequantizeLinear", ["q", "scale", "zero_point"], ["y"], **attributes),
        ],
        [helper.make_tensor_value_info("q8", wide, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        params_initializers(entry, storage),
    )
    (y,) = run(model, {"q8": q.astype(np.int8 if storage == "int4" else np.uint8)})
    return y


def saved(model: onnx.ModelProto, tmp_path: Path, name: str = "stripped.onnx") -> Path:
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def test_a_path_a_sidecar_and_a_boundary_give_the_same_feeds(tmp_path: Path) -> None:
    entry = entry_of(CASES[0][1])
    _, stripped = quantizing_models("uint8", entry)
    x = float_inputs(entry)
    expected = quantize_inputs(stripped, {"x": x})["x"]
    path = saved(stripped, tmp_path)
    assert np.array_equal(quantize_inputs(path, {"x": x})["x"], expected)
    assert np.array_equal(quantize_inputs(StorageBoundary.of(path), {"x": x})["x"], expected)
    # A model whose metadata_props were dropped (a tool that rewrote it) reads the sidecar beside it.
    del stripped.metadata_props[:]
    bare = saved(stripped, tmp_path, "bare.onnx")
    sidecar_path(bare).write_text(StorageMetadata(inputs={"x": entry}).sidecar_text(), encoding="utf-8")
    assert np.array_equal(quantize_inputs(bare, {"x": x})["x"], expected)
    assert np.array_equal(quantize_inputs(sidecar_path(bare), {"x": x})["x"], expected)


def test_inputs_left_float_pass_through() -> None:
    entry = entry_of(CASES[1][1])
    _, stripped = quantizing_models("int8", entry)
    stripped.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.INT64, [2]))
    mask = np.array([1, 0], np.int64)
    feeds = quantize_inputs(stripped, {"x": float_inputs(entry), "mask": mask})
    assert feeds["mask"] is mask or np.array_equal(feeds["mask"], mask)
    assert feeds["mask"].dtype == np.int64 and feeds["x"].dtype == np.int8


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({}, r"missing feed\(s\) \['x'\]"),
        ({"x": np.zeros(SHAPE, np.float32), "y": np.zeros(2)}, r"unknown input\(s\) \['y'\]"),
        ({"x": np.zeros(SHAPE, np.int8)}, "input 'x' has dtype int8: quantize_inputs takes the float values"),
        ({"x": np.zeros((2, 3), np.float32)}, r"input 'x' has shape \[2, 3\]; the model expects \[2x3x5\]"),
    ],
)
def test_bad_feeds_are_input_errors(feeds: dict, message: str, tmp_path: Path) -> None:
    _, stripped = quantizing_models("uint8", entry_of(CASES[0][1]))
    path = saved(stripped, tmp_path)
    with pytest.raises(InputError, match=message) as error:
        quantize_inputs(path, feeds)
    assert str(path) in error.value.message


def test_per_axis_channel_count_is_checked_without_the_graph(tmp_path: Path) -> None:
    entry = entry_of(CASES[4][1])  # 3 scales along axis 1
    sidecar = tmp_path / "m.quant.json"
    sidecar.write_text(StorageMetadata(inputs={"x": entry}).sidecar_text(), encoding="utf-8")
    with pytest.raises(InputError, match=r"input 'x' has shape \[2, 4\]; its 3 scales run along axis 1"):
        quantize_inputs(sidecar, {"x": np.zeros((2, 4), np.float32)})


def test_a_model_without_metadata_is_an_input_error(tmp_path: Path) -> None:
    source, _ = quantizing_models("uint8", entry_of(CASES[0][1]))
    path = saved(source, tmp_path, "source.onnx")
    with pytest.raises(InputError, match=r"no qconvert\.storage metadata"):
        quantize_inputs(path, {"x": np.zeros(SHAPE, np.float32)})
    with pytest.raises(InputError, match="no such model file"):
        quantize_inputs(tmp_path / "absent.onnx", {})


def test_metadata_that_disagrees_with_the_graph_is_an_input_error(tmp_path: Path) -> None:
    _, stripped = quantizing_models("uint8", entry_of(CASES[0][1]))
    stripped.graph.input[0].type.tensor_type.elem_type = TensorProto.INT8
    with pytest.raises(InputError, match="input 'x' is int8 in the graph but uint8 in the metadata"):
        StorageBoundary.of(stripped)
    _, stripped = quantizing_models("uint8", entry_of(CASES[0][1]))
    value = json.loads(stripped.metadata_props[0].value)
    value["scale"] = [0.5]  # the quant_type says 0.0078125
    stripped.metadata_props[0].value = json.dumps(value)
    with pytest.raises(InputError, match="disagrees with the entry's other fields"):
        StorageBoundary.of(stripped)


def test_dequantize_outputs_refuses_values_not_of_the_storage_type() -> None:
    entry = entry_of(CASES[0][1])
    _, stripped = dequantizing_models("uint8", entry)
    with pytest.raises(InputError, match="output 'y' has dtype float32; its storage is uint8"):
        dequantize_outputs(stripped, {"y": np.zeros(SHAPE, np.float32)})
    with pytest.raises(InputError, match=r"unknown output\(s\) \['z'\]"):
        dequantize_outputs(stripped, {"z": np.zeros(SHAPE, np.uint8)})
    with pytest.raises(InputError, match="2 outputs given; the model has 1"):
        dequantize_outputs(stripped, [np.zeros(SHAPE, np.uint8)] * 2)


def test_an_unreadable_or_malformed_sidecar_is_an_input_error(tmp_path: Path) -> None:
    folder = tmp_path / "folder.quant.json"
    folder.mkdir()
    with pytest.raises(InputError, match="cannot read the sidecar"):
        quantize_inputs(folder, {})
    broken = tmp_path / "broken.quant.json"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(InputError, match="not JSON"):
        quantize_inputs(broken, {})
