"""The last exit-3 classes of the ONNX fuzz harness (issue 23), each exit 2 through the CLI with a message
naming the node or input: an input type an op's schema does not allow (int8 into GlobalAveragePool, a
string into Relu, complex into Add, float + int8 into one Add), a declared output shape its node
contradicts, and a static graph input of more elements than the lowerings index."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconvert.cli import main


def one_node(
    op: str, inputs: list, output: onnx.ValueInfoProto, initializers: list | None = None
) -> onnx.ModelProto:
    node = helper.make_node(
        op, [i.name for i in inputs] + [t.name for t in initializers or []], ["y"], name="n"
    )
    graph = helper.make_graph([node], "g", inputs, [output], initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def info(name: str, elem_type: int, shape: list[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "int8 into GlobalAveragePool": lambda: one_node(
        "GlobalAveragePool", [info("x", TensorProto.INT8, [1, 2, 4, 4])], info("y", TensorProto.INT8, None)
    ),
    "string into Relu": lambda: one_node(
        "Relu", [info("x", TensorProto.STRING, [2, 4])], info("y", TensorProto.FLOAT, [2, 4])
    ),
    "complex into Add": lambda: one_node(
        "Add",
        [info("x", TensorProto.COMPLEX64, [2, 4]), info("x2", TensorProto.COMPLEX64, [2, 4])],
        info("y", TensorProto.COMPLEX64, [2, 4]),
    ),
    "float plus int8": lambda: one_node(
        "Add",
        [info("x", TensorProto.FLOAT, [2, 4])],
        info("y", TensorProto.FLOAT, [2, 4]),
        [numpy_helper.from_array(np.ones((2, 4), np.int8), "w")],
    ),
    "declared output shape contradicted": lambda: one_node(
        "Relu", [info("x", TensorProto.FLOAT, [2, 4])], info("y", TensorProto.FLOAT, [3, 4])
    ),
    "input of 2**32 x 2**32 elements": lambda: one_node(
        "Relu", [info("x", TensorProto.FLOAT, [2**32, 2**32])], info("y", TensorProto.FLOAT, None)
    ),
    # no element, but a dim the lowerings cannot index (a Conv of it made 2**32 x 16 x ... : fuzz seed 101)
    "input of 0 x 2**32 elements": lambda: one_node(
        "Relu", [info("x", TensorProto.FLOAT, [0, 2**32])], info("y", TensorProto.FLOAT, None)
    ),
    "input of 2**16 x 2**16 elements": lambda: one_node(
        "Relu", [info("x", TensorProto.FLOAT, [2**16, 2**16])], info("y", TensorProto.FLOAT, None)
    ),
}

MESSAGES = {
    "int8 into GlobalAveragePool": (
        "node 'n' (GlobalAveragePool): input 0 ('x') is int8, but GlobalAveragePool (opset 21) takes X of "
        "double, float, float16"
    ),
    "string into Relu": "node 'n' (Relu): input 0 ('x') is string, but Relu (opset 21) takes X of bfloat16",
    "complex into Add": "node 'n' (Add): input 0 ('x') is complex64, but Add (opset 21) takes A of",
    "float plus int8": (
        "node 'n' (Add): input 1 ('w') is int8, but input 'x' is float; Add takes both as one type T"
    ),
    "declared output shape contradicted": (
        "node 'n' (Relu): a declared shape of its output (graph output or value_info) contradicts what the "
        "node computes from its inputs: Inferred shape and existing shape differ in dimension 0: (2) vs (3)"
    ),
    "input of 2**32 x 2**32 elements": (
        "graph input 'x': shape [4294967296, 4294967296] has a dim over 2147483647 (2**31 - 1)"
    ),
    "input of 0 x 2**32 elements": "graph input 'x': shape [0, 4294967296] has a dim over 2147483647",
    "input of 2**16 x 2**16 elements": (
        "graph input 'x': shape [65536, 65536] holds 4294967296 elements, more than the 2147483647"
    ),
}

# check generates random inputs before it reads the model's nodes: a string or complex input is refused there
CHECK_MESSAGES = {
    "string into Relu": "graph input 'x': cannot generate random object values; give --data",
    "complex into Add": "graph input 'x': cannot generate random complex64 values; give --data",
}

VERBS = {
    "import": lambda model, tmp: ["import", str(model), "-o", str(tmp / "out.mlir")],
    "inspect": lambda model, tmp: ["inspect", str(model)],
    "convert": lambda model, tmp: ["convert", str(model), "--to", "stablehlo", "-o", str(tmp / "out.mlir")],
    "check": lambda model, tmp: ["check", str(model), "--quiet", "--allow-not-run"],
}


@pytest.mark.parametrize("verb", list(VERBS))
@pytest.mark.parametrize("case", list(MODELS))
def test_exit_2_naming_the_node_or_input(
    case: str, verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(MODELS[case](), str(path))
    code = main(VERBS[verb](path, tmp_path))
    err = capsys.readouterr().err
    message = CHECK_MESSAGES.get(case, MESSAGES[case]) if verb == "check" else MESSAGES[case]
    assert code == 2, err
    assert message in err
    assert "internal error" not in err and "Traceback" not in err
    assert not (tmp_path / "out.mlir").exists()


def test_an_allowed_type_still_lifts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The constraint check refuses only what the schema refuses: float GlobalAveragePool, int8 Relu lift."""
    for op, elem_type in (("GlobalAveragePool", TensorProto.FLOAT), ("Relu", TensorProto.INT8)):
        path = tmp_path / f"{op}.onnx"
        onnx.save(one_node(op, [info("x", elem_type, [1, 2, 4, 4])], info("y", elem_type, None)), str(path))
        assert main(["import", str(path), "-o", str(tmp_path / "out.mlir")]) == 0, capsys.readouterr().err
