"""Initializer weights located in a model file's wire format (wire.py) instead of parsed: the proto parsed
without them equals protobuf's own parse with raw_data cleared, the views hold raw_data's bytes, and any
layout the walk does not expect falls back to protobuf's parse (and its errors)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import ModelProto, TensorProto, helper, numpy_helper

from qconvert.errors import InputError
from qconvert.frontends.onnx import load
from qconvert.frontends.onnx.load import LoadedModel, load_model, read_model_mapped
from qconvert.frontends.onnx.wire import MODEL_GRAPH, strip_raw_data

MODELS = Path(__file__).resolve().parents[2] / "models"


def whole_parse_without_raw_data(path: Path) -> tuple[ModelProto, dict[int, bytes]]:
    """protobuf's parse of `path`, its main-graph initializers' raw_data taken out by position."""
    model = onnx.load_model(str(path), load_external_data=False)
    raw_data = {}
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.HasField("raw_data"):
            raw_data[index] = tensor.raw_data
            tensor.ClearField("raw_data")
    return model, raw_data


def assert_stripped_like_protobuf(path: Path) -> None:
    stripped = strip_raw_data(path)
    assert stripped is not None
    expected, raw_data = whole_parse_without_raw_data(path)
    assert stripped.model == expected
    assert {index: bytes(view) for index, view in stripped.raw_data.items()} == raw_data


@pytest.mark.parametrize("name", sorted(path.name for path in MODELS.glob("*.onnx")))
def test_the_sample_models_parse_as_protobuf_parses_them(name: str) -> None:
    assert_stripped_like_protobuf(MODELS / name)


def tensor_bytes_raw_data_first(array: np.ndarray, name: str) -> bytes:
    """A TensorProto whose raw_data field comes before its name and dims (protobuf writes fields in number
    order; concatenated messages merge, so this is a valid tensor with the fields in another order)."""
    head = TensorProto(raw_data=array.tobytes())
    rest = TensorProto(name=name, dims=array.shape, data_type=TensorProto.FLOAT)
    return head.SerializeToString() + rest.SerializeToString()


def mixed_model() -> ModelProto:
    """Initializers of every kind between the raw ones: typed fields, external data, a raw_data field
    before the name, and an If branch holding an initializer of its own (not the main graph's)."""
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3)]
    branch = helper.make_graph(
        [helper.make_node("Identity", ["inner"], ["branch_out"])],
        "branch",
        [],
        [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, [8, 8])],
        [numpy_helper.from_array(weights[2], "inner")],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["a"]),
        helper.make_node("MatMul", ["a", "w1"], ["b"]),
        helper.make_node("Add", ["b", "typed"], ["c"]),
        helper.make_node("Mul", ["c", "external"], ["d"]),
        helper.make_node("If", ["flag"], ["e"], then_branch=branch, else_branch=branch),
        helper.make_node("Add", ["d", "e"], ["y"]),
    ]
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [8], np.arange(8, dtype=np.float32).tolist())
    external = TensorProto(name="external", dims=[8], data_type=TensorProto.FLOAT)
    external.data_location = TensorProto.EXTERNAL
    external.external_data.add(key="location", value="external.bin")
    graph = helper.make_graph(
        nodes,
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])],
        [
            numpy_helper.from_array(weights[0], "w0"),
            typed,
            external,
            numpy_helper.from_array(np.array(True), "flag"),
        ],
    )
    graph.initializer.add().ParseFromString(tensor_bytes_raw_data_first(weights[1], "w1"))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def write_raw_data_first(model: ModelProto, path: Path) -> Path:
    """`model` written with its last initializer's raw_data field ahead of its name, as built."""
    last = model.graph.initializer[-1]
    rest = ModelProto()
    rest.CopyFrom(model)
    del rest.graph.initializer[-1]
    # One graph field: the graph without its last initializer, then that initializer's field, re-framed.
    graph = rest.graph.SerializeToString()
    array = numpy_helper.to_array(last)
    tensor = tensor_bytes_raw_data_first(array, last.name)
    graph += bytes([5 << 3 | 2]) + varint(len(tensor)) + tensor
    rest.ClearField("graph")
    path.write_bytes(rest.SerializeToString() + bytes([MODEL_GRAPH << 3 | 2]) + varint(len(graph)) + graph)
    (path.parent / "external.bin").write_bytes(np.ones(8, np.float32).tobytes())
    return path


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def test_every_kind_of_initializer_parses_as_protobuf_parses_it(tmp_path: Path) -> None:
    path = write_raw_data_first(mixed_model(), tmp_path / "mixed.onnx")
    assert_stripped_like_protobuf(path)
    stripped = strip_raw_data(path)
    assert stripped is not None
    # w0, flag and w1 (raw_data ahead of its name) are views; typed and external have no raw_data.
    names = [stripped.model.graph.initializer[i].name for i in stripped.raw_data]
    assert names == ["w0", "flag", "w1"]
    # The If branch's initializer is not the main graph's: protobuf parsed it with its raw_data.
    branch = stripped.model.graph.node[4].attribute[0].g
    assert branch.initializer[0].HasField("raw_data")


def load_parsed_whole(
    path: Path, detach: Callable[..., bool], monkeypatch: pytest.MonkeyPatch
) -> LoadedModel:
    """load_model as it was before wire.py: the file parsed whole, raw_data taken out of the proto."""
    with monkeypatch.context() as patch:
        patch.setattr(load, "strip_raw_data", lambda path: None)
        loaded = load_model(path, detach=detach, map_file=True)
    assert all(isinstance(raw, bytes) for raw in loaded.detached.values())
    return loaded


def test_load_model_detaches_views_of_the_file_equal_to_a_whole_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_raw_data_first(mixed_model(), tmp_path / "mixed.onnx")

    def detach(tensor: TensorProto, raw_data: bytes | memoryview) -> bool:
        return tensor.name != "w0"  # w0 stays in the proto, as a whole parse has it

    mapped = load_model(path, detach=detach, map_file=True)
    whole = load_parsed_whole(path, detach, monkeypatch)
    assert mapped.model == whole.model
    assert mapped.model.graph.initializer[0].HasField("raw_data")  # w0
    assert {name: bytes(raw) for name, raw in mapped.detached.items()} == whole.detached
    assert sorted(mapped.detached) == ["flag", "w1"]
    assert all(isinstance(raw, memoryview) for raw in mapped.detached.values())


def test_a_name_given_twice_is_detached_once_as_by_a_whole_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = mixed_model()
    twin = model.graph.initializer.add()
    twin.CopyFrom(model.graph.initializer[0])  # a second w0
    onnx.save(model, tmp_path / "twin.onnx")
    (tmp_path / "external.bin").write_bytes(np.ones(8, np.float32).tobytes())
    mapped = load_model(tmp_path / "twin.onnx", detach=lambda tensor, raw: True, map_file=True)
    whole = load_parsed_whole(tmp_path / "twin.onnx", lambda tensor, raw: True, monkeypatch)
    assert mapped.model == whole.model
    assert mapped.model.graph.initializer[-1].HasField("raw_data")  # the second w0 stays


def unexpected_layouts(model: ModelProto) -> dict[str, bytes]:
    data = model.SerializeToString()
    graph = model.graph.SerializeToString()
    # the second raw_data as large as the first tensor's dims need (a wrong size is refused, validate.py)
    size = int(np.prod(model.graph.initializer[0].dims)) * 4
    tensor = (
        model.graph.initializer[0].SerializeToString()
        + TensorProto(raw_data=b"\0" * size).SerializeToString()
    )
    two_raw = ModelProto()
    two_raw.CopyFrom(model)
    two_raw.ClearField("graph")
    tensor_field = bytes([5 << 3 | 2]) + varint(len(tensor)) + tensor
    graph_with_two_raw = graph + tensor_field
    return {
        # protobuf merges a repeated message field; the walk does not
        "two graph fields": data + bytes([MODEL_GRAPH << 3 | 2]) + varint(len(graph)) + graph,
        # a tensor with two raw_data fields (protobuf keeps the last)
        "two raw_data": two_raw.SerializeToString()
        + bytes([MODEL_GRAPH << 3 | 2])
        + varint(len(graph_with_two_raw))
        + graph_with_two_raw,
        # an unknown field of a deprecated wire type, which protobuf keeps
        "a group": data + varint(100 << 3 | 3) + varint(100 << 3 | 4),
        "truncated": data[: len(data) // 2],
        "empty": b"",
    }


@pytest.mark.parametrize("layout", ["two graph fields", "two raw_data", "a group", "truncated", "empty"])
def test_an_unexpected_layout_falls_back_to_protobufs_parse(layout: str, tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(unexpected_layouts(mixed_model())[layout])
    assert strip_raw_data(path) is None
    if layout in ("two graph fields", "two raw_data", "a group"):  # valid protobuf: parsed whole
        model, _, mapped = read_model_mapped(path)
        assert mapped is None
        assert model == onnx.load_model(str(path), load_external_data=False)
    else:
        with pytest.raises(InputError, match=r"model\.onnx: not a valid ONNX model"):
            read_model_mapped(path)


@pytest.mark.filterwarnings("ignore:The onnxtxt format is experimental")
def test_a_text_format_model_is_parsed_by_onnx(tmp_path: Path) -> None:
    path = tmp_path / "model.onnxtxt"
    onnx.save(mixed_model(), path, format="onnxtxt")
    model, _, mapped = read_model_mapped(path)
    assert mapped is None
    assert model == onnx.load_model(str(path), load_external_data=False)


def test_a_tensor_of_many_fields_is_left_whole(tmp_path: Path) -> None:
    """A string tensor is one field per string (so are unpacked numbers): past TENSOR_FIELDS the walk
    leaves the tensor as it is, raw_data included (protobuf writes it after string_data, and accepts it
    there), and protobuf parses it with the rest."""
    model = mixed_model()
    strings = helper.make_tensor("strings", TensorProto.STRING, [1000], [b"s%d" % k for k in range(1000)])
    strings.raw_data = b"\0" * 16
    model.graph.initializer.append(strings)
    path = tmp_path / "many.onnx"
    path.write_bytes(model.SerializeToString())
    (tmp_path / "external.bin").write_bytes(np.ones(8, np.float32).tobytes())
    stripped = strip_raw_data(path)
    assert stripped is not None
    names = [stripped.model.graph.initializer[i].name for i in stripped.raw_data]
    assert names == ["w0", "flag", "w1"]  # not strings
    expected = onnx.load_model(str(path), load_external_data=False)
    for index in stripped.raw_data:
        expected.graph.initializer[index].ClearField("raw_data")
    assert stripped.model == expected
    assert stripped.model.graph.initializer[-1].raw_data == b"\0" * 16


LIFT_THEN_OVERWRITE = """
import sys
import onnx
from qconvert.frontends.onnx import import_onnx
from qconvert.ir import print_module
path = sys.argv[1]
module = import_onnx(path, resource_threshold=1)
before = print_module(module)
onnx.save(onnx.helper.make_model(onnx.helper.make_graph([], "empty", [], [])), path)  # truncated in place
assert print_module(module) == before
"""


def test_a_lifted_module_does_not_depend_on_its_file(tmp_path: Path) -> None:
    """The lifter parses the file whole: a module outlives a rewrite of the model in place (a mapping
    of the file would end the process with SIGBUS when printing its weights)."""
    path = tmp_path / "model.onnx"
    path.write_bytes((MODELS / "digits_cnn.onnx").read_bytes())
    done = subprocess.run(
        [sys.executable, "-c", LIFT_THEN_OVERWRITE, str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
