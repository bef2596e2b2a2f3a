"""Malformed ONNX models and data files (issue 23): each is exit 2 with a message naming the file and the
tensor / node / value at fault, through every verb that reads it; never exit 3, never a traceback, and
never exit 0 with a wrong lift. onnxruntime's own log lines stay off stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconvert.cli import main

ModelMaker = Callable[[Path], Path]
MICROSOFT = "com.microsoft"


def save(path: Path, nodes: list, inputs: list, outputs: list, initializers: list, opset: int = 21) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def dequantize_of(weight: TensorProto, path: Path, output_shape: list | None = None, **attributes) -> Path:
    """DequantizeLinear(weight, 0.5, 0) -> y."""
    parameters = [numpy_helper.from_array(np.array(0.5, np.float32), "s")]
    inputs = [weight.name, "s"]
    if weight.data_type == TensorProto.INT8:
        parameters.append(numpy_helper.from_array(np.array(0, np.int8), "z"))
        inputs.append("z")
    node = helper.make_node("DequantizeLinear", inputs, ["y"], name="dq", **attributes)
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)
    return save(path, [node], [], [output], [weight, *parameters])


def raw_tensor(data_type: int, dims: list[int], raw: bytes) -> TensorProto:
    tensor = TensorProto(name="w", data_type=data_type, dims=dims)
    tensor.raw_data = raw
    return tensor


def axis_string(path: Path) -> Path:
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], name="dq")
    node.attribute.append(helper.make_attribute("axis", "abc"))
    return save(
        path,
        [node],
        [helper.make_tensor_value_info("x", TensorProto.INT8, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.int8), "z"),
        ],
    )


def no_inputs(path: Path) -> Path:
    node = helper.make_node("DequantizeLinear", [], ["y"], name="dq")
    return save(path, [node], [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [])


def int32_data_short(path: Path) -> Path:
    weight = TensorProto(name="w", data_type=TensorProto.INT8, dims=[16])
    weight.int32_data.extend([1, 2])
    return dequantize_of(weight, path)


def external(offset: int, length: int | None = None) -> ModelMaker:
    def make(path: Path) -> Path:
        (path.parent / "w.bin").write_bytes(bytes(range(256)) * 4)
        weight = TensorProto(name="w", data_type=TensorProto.INT8, dims=[128])
        weight.data_location = TensorProto.EXTERNAL
        entries = {"location": "w.bin", "offset": str(offset)}
        if length is not None:
            entries["length"] = str(length)
        for key, value in entries.items():
            weight.external_data.add(key=key, value=value)
        return dequantize_of(weight, path, [128])

    return make


def negative_input_dim(path: Path) -> Path:
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], name="dq")
    return save(
        path,
        [node],
        [helper.make_tensor_value_info("x", TensorProto.INT8, [-5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.int8), "z"),
        ],
    )


def qlinearconv_uint8_weight_zero_point(path: Path) -> Path:
    parameters = {
        "xs": np.array(0.1, np.float32),
        "xz": np.array(128, np.uint8),
        "w": np.ones((1, 1, 3, 3), np.int8),
        "ws": np.array(0.1, np.float32),
        "wz": np.array(0, np.uint8),  # int8 weights need an int8 zero point
        "ys": np.array(0.2, np.float32),
        "yz": np.array(128, np.uint8),
    }
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="conv")
    return save(
        path,
        [node],
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(value, name) for name, value in parameters.items()],
        opset=13,
    )


def name_not_utf8(path: Path) -> Path:
    """The graph output's name made invalid UTF-8 in the serialized bytes (protobuf reads it as bytes)."""
    node = helper.make_node("Relu", ["x"], ["yy"], name="relu")
    save(
        path,
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("yy", TensorProto.FLOAT, [4])],
        [],
    )
    path.write_bytes(path.read_bytes().replace(b"yy", b"y\xfe"))
    return path


def string_attribute_not_utf8(path: Path) -> Path:
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    node.attribute.append(helper.make_attribute("note", b"\x80abc"))
    return save(
        path,
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [],
    )


def quantize_of_float8e8m0(path: Path) -> Path:
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q")
    return save(
        path,
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT8E8M0, [4])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [4])],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.int8), "z"),
        ],
    )


def block_size_string_at_opset_13(path: Path) -> Path:
    """opset 13's DequantizeLinear has no block_size (so no schema says its kind); the lifter reads it."""
    weight = numpy_helper.from_array(np.ones(4, np.int8), "w")
    node = helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"], name="dq")
    node.attribute.append(helper.make_attribute("block_size", b""))
    return save(
        path,
        [node],
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [
            weight,
            numpy_helper.from_array(np.array(0.5, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.int8), "z"),
        ],
        opset=13,
    )


def qlinear_add_float8_zero_point(path: Path) -> Path:
    """A QLinearAdd whose A and zero point are float8e4m3fn: onnxruntime's QOperator kernels are integer."""
    qlinear_add_int8_zero_point_on_uint8(path)
    model = onnx.load(str(path))
    zero = next(t for t in model.graph.initializer if t.name == "az")
    zero.CopyFrom(helper.make_tensor("az", TensorProto.FLOAT8E4M3FN, [], [0.0]))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT8E4M3FN
    onnx.save(model, str(path))
    return path


def qlinear_add_int8_zero_point_on_uint8(path: Path) -> Path:
    """com.microsoft QLinearAdd (no ONNX schema, so onnx's inference cannot say): A is uint8, its zero
    point int8."""
    parameters = {
        "as": np.array(0.1, np.float32),
        "az": np.array(0, np.int8),
        "bs": np.array(0.1, np.float32),
        "bz": np.array(128, np.uint8),
        "cs": np.array(0.2, np.float32),
        "cz": np.array(128, np.uint8),
    }
    node = helper.make_node(
        "QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["c"], name="add", domain=MICROSOFT
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(name, TensorProto.UINT8, [4]) for name in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.UINT8, [4])],
        [numpy_helper.from_array(value, name) for name, value in parameters.items()],
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid(MICROSOFT, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def relu_of_three_inputs(path: Path) -> Path:
    node = helper.make_node("Relu", ["x", "x", "x"], ["y"], name="relu")
    return save(
        path,
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [],
    )


def input_elem_type_0(path: Path) -> Path:
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    return save(
        path,
        [node],
        [helper.make_tensor_value_info("x", 0, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [],
    )


CASES: dict[str, tuple[ModelMaker, str]] = {
    "graph input elem_type 0": (input_elem_type_0, "graph input 'x': elem_type 0 is not an ONNX element"),
    "float8 zero point on a QLinearAdd": (
        qlinear_add_float8_zero_point,
        "node 'add' (QLinearAdd, opset 13): 'az' is float8e4m3fn; a QOperator op takes integer storage",
    ),
    "int8 zero point on uint8 QLinearAdd input": (
        qlinear_add_int8_zero_point_on_uint8,
        "node 'add' (QLinearAdd, opset 13): zero point 'az' is int8 but its data 'a' is uint8",
    ),
    "Relu of three inputs": (
        relu_of_three_inputs,
        "node 'relu' (Relu): 3 inputs, but Relu (opset 21) takes at most 1",
    ),
    "QuantizeLinear of float8e8m0": (quantize_of_float8e8m0, "node 'q' (QuantizeLinear"),
    "block_size STRING at opset 13": (
        block_size_string_at_opset_13,
        "node 'dq' (DequantizeLinear): attribute 'block_size' is a STRING, not an INT",
    ),
    "tensor name not UTF-8": (name_not_utf8, "a graph value name b'y\\xfe' is not valid UTF-8"),
    "string attribute not UTF-8": (
        string_attribute_not_utf8,
        "node 'relu' (Relu): attribute 'note' string b'\\x80abc' is not valid UTF-8",
    ),
    "axis STRING": (axis_string, "node 'dq' (DequantizeLinear): attribute 'axis' is a STRING"),
    "DequantizeLinear without inputs": (no_inputs, "node 'dq' (DequantizeLinear): required input 0 ('x')"),
    "int32_data shorter than dims": (
        int32_data_short,
        "initializer 'w': int32_data holds 2 entries, but dims [16] of int8 need 16",
    ),
    "dims product overflows": (
        lambda path: dequantize_of(raw_tensor(TensorProto.INT8, [2**32] * 3, b"\1" * 8), path),
        "initializer 'w': raw_data holds 8 bytes, but dims [4294967296, 4294967296, 4294967296]",
    ),
    "data_type 0": (
        lambda path: dequantize_of(raw_tensor(0, [4], b"\1" * 4), path),
        "initializer 'w': data_type 0 is not an ONNX element type",
    ),
    "data_type 999": (
        lambda path: dequantize_of(raw_tensor(999, [4], b"\1" * 4), path),
        "initializer 'w': data_type 999 is not an ONNX element type",
    ),
    "external offset -4096": (external(-4096), "initializer 'w': external data offset -4096 in 'w.bin'"),
    "external offset past the end": (
        external(100_000),
        "initializer 'w': external data 'w.bin' holds 1024 bytes, fewer than offset 100000 + 128",
    ),
    "external length past the end": (
        external(0, 100_000),
        "initializer 'w': external data length 100000 in 'w.bin' does not match dims [128]",
    ),
    "input dim -5": (negative_input_dim, "graph input 'x': shape [-5] has a negative dim"),
    "initializer dims [-1, 32]": (
        lambda path: dequantize_of(raw_tensor(TensorProto.INT8, [-1, 32], b"\1" * 320), path),
        "initializer 'w': dims [-1, 32] have a negative dim",
    ),
    "int4 raw_data one byte too many": (
        lambda path: dequantize_of(raw_tensor(TensorProto.INT4, [8], b"\x11" * 5), path, [8]),
        "initializer 'w': raw_data holds 5 bytes, but dims [8] of int4 need 4",
    ),
    "uint8 zero point on int8 QLinearConv weights": (
        qlinearconv_uint8_weight_zero_point,
        "node name: conv): [TypeInferenceError] weight and zero_point pair is expected to have same type",
    ),
}

# `check` asks onnxruntime first where our checks would come later (in the lifter): its reason is named.
# (exit code, text on stderr or stdout). onnxruntime runs a model whose declared output shape its node
# contradicts: the check runs the nodes, and the end to end output the lift refuses is not run (exit 1).
CHECK_MESSAGES = {
    "uint8 zero point on int8 QLinearConv weights": (2, "(QLinearConv) bound to different types"),
    "int8 zero point on uint8 QLinearAdd input": (2, "(QLinearAdd) bound to different types"),
    "float8 zero point on a QLinearAdd": (2, "graph input 'a': cannot generate random float8_e4m3fn values"),
    "QuantizeLinear of float8e8m0": (2, "graph input 'x': cannot generate random float8_e8m0fnu values"),
    "block_size STRING at opset 13": (2, "Unrecognized attribute: block_size for operator DequantizeLinear"),
}

VERBS = {
    "import": lambda model, tmp: ["import", str(model), "-o", str(tmp / "out.mlir")],
    "inspect": lambda model, tmp: ["inspect", str(model)],
    "convert": lambda model, tmp: ["convert", str(model), "--to", "stablehlo", "-o", str(tmp / "out.mlir")],
    "check": lambda model, tmp: ["check", str(model), "--quiet"],
}


@pytest.mark.parametrize("verb", list(VERBS))
@pytest.mark.parametrize("case", list(CASES))
def test_malformed_model_is_exit_2_naming_what(
    case: str, verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make, message = CASES[case]
    expected_code = 2
    if verb == "check":
        expected_code, message = CHECK_MESSAGES.get(case, (2, message))
    model = make(tmp_path / "m.onnx")
    code = main(VERBS[verb](model, tmp_path))
    captured = capsys.readouterr()
    err = captured.err
    assert code == expected_code, err
    assert message in (err if code == 2 else captured.out)
    assert code == 1 or str(model) in err or "node '" in err or "graph input '" in err  # what is named
    assert "internal error" not in err and "Traceback" not in err
    assert not (tmp_path / "out.mlir").exists()


def test_onnxruntime_log_lines_stay_off_stderr(tmp_path: Path) -> None:
    """A model onnxruntime refuses while initializing (its safeint overflow logs an [E:onnxruntime:...]
    line by default): stderr holds our one message, with onnxruntime's reason and no C++ source path."""
    weight = raw_tensor(TensorProto.INT8, [2**20], b"\1" * 2**20)
    model = dequantize_of(weight, tmp_path / "m.onnx")

    script = (
        "import onnx, sys\n"
        "from qconvert.check.oracle import ort_session\n"
        "from qconvert.errors import InputError\n"
        "m = onnx.load(sys.argv[1])\n"
        "m.graph.initializer[0].dims[:] = [2**32, 2**32, 2**32]\n"  # after our own checks: onnxruntime's
        "try:\n    ort_session(m, False, sys.argv[1])\n"
        "except InputError as e:\n    print(e, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(model)], capture_output=True, text=True, timeout=120, check=False
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "onnxruntime cannot load the model" in lines[0]
    assert "overflow" in lines[0].lower()
    assert "onnxruntime_src" not in lines[0] and "[E:onnxruntime" not in result.stderr


def test_input_shape_on_a_static_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--input-shape on an input that is already static: accepted when it agrees, exit 2 when not."""
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    model = save(
        tmp_path / "m.onnx",
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [],
    )
    out = tmp_path / "out.mlir"
    assert main(["convert", str(model), "--to", "stablehlo", "--input-shape", "x=2,4", "-o", str(out)]) == 0
    assert "tensor<2x4xf32>" in out.read_text()
    out.unlink()
    code = main(["convert", str(model), "--to", "stablehlo", "--input-shape", "x=3,4", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "contradicts the model's static [2, 4]" in err and "internal error" not in err
    assert not out.exists()


def write_npy_header(path: Path, shape: tuple[int, ...]) -> None:
    """An .npy of float32 `shape`: its header, and a sparse file as long as the data (nothing written)."""
    with path.open("wb") as stream:
        np.lib.format.write_array_header_1_0(stream, {"descr": "<f4", "fortran_order": False, "shape": shape})
        offset = stream.tell()
    os.truncate(path, offset + 4 * int(np.prod(shape)))


def test_npy_declaring_16_gib_is_refused_from_its_header(tmp_path: Path) -> None:
    """A 16 GiB .npy (sparse) as --data of a dynamic model, under a 6 GB address-space limit: refused from
    the header before anything is allocated (was a MemoryError, exit 3)."""
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    model = save(
        tmp_path / "m.onnx",
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m"])],
        [],
    )
    for name, shape in (("big.npy", (4, 2**30)), ("mid.npy", (4, 2**28))):
        data = tmp_path / name
        write_npy_header(data, shape)
        limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, resource.RLIM_INFINITY))"
        script = f"{limit}\nimport sys\nfrom qconvert.cli import main\nsys.exit(main(sys.argv[1:]))"
        result = subprocess.run(
            [sys.executable, "-c", script, "check", str(model), "--data", str(data), "--quiet"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert f"{data}" in result.stderr
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr
