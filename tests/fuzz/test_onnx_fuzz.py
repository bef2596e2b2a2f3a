"""Fuzzing the ONNX side (issue 23): structure-aware mutations of small models through the CLI's
import, inspect, convert and check, and of .npy / .npz data through check.

Contract: every run ends with exit 0, 1 or 2 (never 3, qconvert's own bug; `main` turns any exception
that is not a QConvertError into 3), within a bounded time; the process's peak memory stays bounded.

Seeds: the sample models of models/ (digits_cnn in float, QDQ and QOperator form) and tiny generated
graphs (Q/DQ pairs, a blocked DequantizeLinear, an int4 weight, external data). Mutations: attributes of
another kind or value, inputs removed or blanked, initializer dims / data_type / raw_data changed,
external data offsets and lengths, graph input shapes and element types, op types and opsets.

Fixed seed and a ~60 s budget in CI (`QCONVERT_FUZZ_EXAMPLES`, default 400 models and 266 data files);
a longer run: `QCONVERT_FUZZ_EXAMPLES=2000 QCONVERT_FUZZ_SEED=7 pytest tests/fuzz/test_onnx_fuzz.py`.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import peak_memory, reset_peak_memory
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from onnx import ModelProto, TensorProto, helper, numpy_helper

from qconvert.cli import main

MODELS = Path(__file__).resolve().parents[2] / "models"
EXAMPLES = int(os.environ.get("QCONVERT_FUZZ_EXAMPLES", "400"))
SEED = int(os.environ.get("QCONVERT_FUZZ_SEED", "23"))
SECONDS_PER_RUN = 30.0  # a verb on a model of a few kilobytes
PEAK_GROWTH_BYTES = 3 * 2**30


def tiny_models() -> dict[str, ModelProto]:
    """Small graphs that reach the quantization paths: Q/DQ, per-axis, blocked, int4, Conv."""
    s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    z = numpy_helper.from_array(np.array(3, np.int8), "z")
    qdq = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq"),
            helper.make_node("Relu", ["d"], ["y"], name="relu"),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [s, z],
    )
    weight = numpy_helper.from_array(np.arange(-16, 16, dtype=np.int8).reshape(4, 8), "w")
    blocked = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=1, block_size=4, name="dq_w"),
            helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm"),
        ],
        "blocked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [weight, numpy_helper.from_array(np.full((4, 2), 0.25, np.float32), "ws")],
    )
    int4 = helper.make_tensor("w", TensorProto.INT4, [4, 8], np.arange(32) % 16 - 8)
    per_axis = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=1, name="dq_w"),
            helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm"),
        ],
        "int4",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [int4, numpy_helper.from_array(np.full(8, 0.125, np.float32), "ws")],
    )
    models = {}
    for graph in (qdq, blocked, per_axis):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        model.ir_version = 10
        models[graph.name] = model
    return models


def seeds() -> dict[str, ModelProto]:
    found = {
        path.name: onnx.load(str(path))
        for path in sorted(MODELS.glob("digits_cnn*.onnx"))
        if path.stat().st_size < 64 * 1024
    }
    return {**found, **tiny_models()}


SEEDS = seeds()
BEFORE_THE_RUNS: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def _peak_reset_before_the_runs() -> None:
    BEFORE_THE_RUNS["rss"] = reset_peak_memory()


ATTRIBUTE_VALUES = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.binary(max_size=8),
    st.lists(st.integers(-5, 70), min_size=1, max_size=6),
    st.lists(st.floats(-4, 4, width=32), min_size=1, max_size=4),
)
DIMS = st.lists(st.sampled_from([-5, -1, 0, 1, 2, 3, 4, 7, 8, 64, 2**32]), max_size=4)
# Graph inputs take every dim (a static input of 2**32 x ... elements is refused by name: validate.py) and
# every element type (string or complex into a numeric op: refused with the op's type constraint).
INPUT_DIMS = DIMS
DATA_TYPES = st.sampled_from([0, 999, *TensorProto.DataType.values()])
INPUT_TYPES = DATA_TYPES


@st.composite
def mutation(draw: st.DrawFn, model: ModelProto) -> tuple[str, ModelProto, bytes | None]:
    """(what was changed, the mutated model, external data for it or None)."""
    mutated = ModelProto()
    mutated.CopyFrom(model)
    graph = mutated.graph
    external: bytes | None = None
    kinds = [
        "attribute",
        "input",
        "dims",
        "data_type",
        "raw_data",
        "external",
        "graph_input",
        "graph_output",
        "op",
        "opset",
    ]
    kind = draw(st.sampled_from(kinds))
    nodes = list(graph.node)
    tensors = list(graph.initializer)
    if kind == "attribute" and nodes:
        node = draw(st.sampled_from(nodes))
        names = [a.name for a in node.attribute] + ["axis", "block_size", "saturate", "output_dtype"]
        name = draw(st.sampled_from(names))
        for index, attribute in enumerate(node.attribute):
            if attribute.name == name:
                del node.attribute[index]
                break
        node.attribute.append(helper.make_attribute(name, draw(ATTRIBUTE_VALUES)))
        return f"attribute {name} of {node.name}", mutated, external
    if kind == "input" and nodes:
        node = draw(st.sampled_from(nodes))
        if node.input and draw(st.booleans()):
            node.input[draw(st.integers(0, len(node.input) - 1))] = draw(st.sampled_from(["", "nowhere"]))
        else:
            del node.input[draw(st.integers(0, len(node.input))) :]
        return f"inputs of {node.name}", mutated, external
    if kind in ("dims", "data_type", "raw_data", "external") and tensors:
        tensor = draw(st.sampled_from(tensors))
        if kind == "dims":
            tensor.ClearField("dims")
            tensor.dims.extend(draw(DIMS))
        elif kind == "data_type":
            tensor.data_type = draw(DATA_TYPES)
        elif kind == "raw_data":
            data = numpy_helper.to_array(tensor).tobytes() if not tensor.raw_data else tensor.raw_data
            cut = draw(st.integers(-4, 4))
            tensor.ClearField("int32_data")
            tensor.ClearField("float_data")
            tensor.raw_data = data[:cut] if cut < 0 else data + b"\x7f" * cut
        else:
            data = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
            external = data + b"\0" * draw(st.integers(0, 16))
            tensor.ClearField("raw_data")
            tensor.ClearField("int32_data")
            tensor.ClearField("float_data")
            tensor.data_location = TensorProto.EXTERNAL
            entries = {"location": draw(st.sampled_from(["w.bin", "../w.bin", "/etc/passwd", "absent.bin"]))}
            entries["offset"] = str(draw(st.sampled_from([0, 0, 3, -4096, 10**6])))
            if draw(st.booleans()):
                entries["length"] = str(draw(st.sampled_from([len(data), len(data) + 1, 0, -1, 10**9])))
            for key, value in entries.items():
                tensor.external_data.add(key=key, value=value)
        return f"{kind} of initializer {tensor.name}", mutated, external
    if kind == "graph_input" and graph.input:
        info = draw(st.sampled_from(list(graph.input)))
        tensor_type = info.type.tensor_type
        if draw(st.booleans()):
            tensor_type.elem_type = draw(INPUT_TYPES)
        else:
            tensor_type.shape.ClearField("dim")
            for size in draw(INPUT_DIMS):
                tensor_type.shape.dim.add().dim_value = size
        # The declared output shapes stay: one its node now contradicts is refused by name (load.py).
        return f"graph input {info.name}", mutated, external
    if kind == "graph_output" and graph.output:  # a declared shape its node may contradict
        info = draw(st.sampled_from(list(graph.output)))
        info.type.tensor_type.shape.ClearField("dim")
        for size in draw(DIMS):
            info.type.tensor_type.shape.dim.add().dim_value = size
        return f"graph output {info.name}", mutated, external
    if kind == "op" and nodes:
        node = draw(st.sampled_from(nodes))
        node.op_type = draw(
            st.sampled_from(["QuantizeLinear", "DequantizeLinear", "QLinearConv", "MatMulInteger", "Relu"])
        )
        return f"op type of {node.name}", mutated, external
    version = draw(st.sampled_from([1, 10, 13, 19, 21, 23, 25, 99]))
    del mutated.opset_import[:]
    mutated.opset_import.append(helper.make_opsetid("", version))
    return f"opset {version}", mutated, external


def run_verb(arguments: list[str], capsys: pytest.CaptureFixture[str], what: str) -> None:
    start = time.monotonic()
    code = main(arguments)
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert code in (0, 1, 2), f"{what}: {' '.join(arguments[:2])} exit {code}: {err[-2000:]}"
    assert "Traceback" not in err, f"{what}: {err[-2000:]}"
    assert elapsed < SECONDS_PER_RUN, f"{what}: {' '.join(arguments[:2])} took {elapsed:.1f} s"


@seed(SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(data=st.data())
def test_mutated_models_never_crash(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    name = data.draw(st.sampled_from(sorted(SEEDS)))
    what, model, external = data.draw(mutation(SEEDS[name]))
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    if external is not None:
        (folder / "w.bin").write_bytes(external)
    label = f"{name}, {what}"
    run_verb(["import", str(path), "-o", str(folder / "out.mlir")], capsys, label)
    run_verb(["inspect", str(path)], capsys, label)
    run_verb(["convert", str(path), "--to", "stablehlo", "-o", str(folder / "out2.mlir")], capsys, label)
    if data.draw(st.integers(0, 3)) == 0:  # check runs onnxruntime and the interpreter: one model in four
        run_verb(["check", str(path), "--quiet", "--allow-not-run"], capsys, label)


NPY_HEADER_SHAPES = st.one_of(
    st.just("(8, 1, 8, 8)"),
    st.just("(2**40,)"),
    st.just("(8, 1, 8, 8, 99999999999)"),
    st.just("(-8, 1, 8, 8)"),
    st.just("()"),
    st.text(alphabet="(),0123456789- x'", max_size=20),
)


@st.composite
def data_file(draw: st.DrawFn) -> tuple[str, bytes]:
    """(suffix, bytes) of an .npy or .npz holding the digits model's input, then mutated."""
    image = np.zeros((8, 1, 8, 8), np.float32)
    stream = io.BytesIO()
    suffix = draw(st.sampled_from([".npy", ".npz"]))
    if suffix == ".npy":
        np.save(stream, image)
    else:
        np.savez(stream, image=image)
    data = bytearray(stream.getvalue())
    how = draw(st.sampled_from(["truncate", "flip", "header"]))
    if how == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            position = draw(st.integers(0, len(data) - 1))
            data[position] = draw(st.integers(0, 255))
    elif suffix == ".npy":
        header = data[10:128].decode("latin-1")
        shape = draw(NPY_HEADER_SHAPES)
        descr = draw(st.sampled_from(["<f4", "<f8", "|O", "<i8", "<U3", "V4"]))
        header = header.replace("(8, 1, 8, 8)", shape).replace("<f4", descr)
        data = data[:10] + header.encode("latin-1") + data[128:]
    return suffix, bytes(data)


@seed(SEED)
@settings(
    max_examples=max(1, EXAMPLES * 2 // 3),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(file=data_file())
def test_mutated_data_never_crash(
    file: tuple[str, bytes], tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    suffix, data = file
    folder = tmp_path_factory.mktemp("fuzzdata")
    path = folder / f"data{suffix}"
    path.write_bytes(data)
    model = str(MODELS / "digits_cnn.qdq.onnx")
    run_verb(["check", model, "--data", str(path), "--quiet", "--max-samples", "8"], capsys, f"{suffix} data")


def test_peak_memory_stayed_bounded() -> None:
    """After the runs above (module order): the process grew by less than PEAK_GROWTH_BYTES at its peak."""
    growth = peak_memory() - BEFORE_THE_RUNS["rss"]
    assert growth < PEAK_GROWTH_BYTES, f"grew by {growth / 2**30:.2f} GiB at the peak"
