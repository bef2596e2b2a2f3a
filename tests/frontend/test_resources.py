"""Weights as `dense_resource` blobs: lifted lazily (external data memory-mapped), printed in MLIR's
file-metadata section, parsed back (by us and by MLIR itself) and interpreted to the same outputs.

A model over 2 GB cannot be built in test time; the path it takes (external data, memory-mapped, never
loaded whole; shape inference on the proto alone) is the one `test_external_data_is_memory_mapped`
exercises with a small model saved with `save_as_external_data=True`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.cli import main
from qconvert.errors import InputError, ParseError
from qconvert.frontends.onnx import import_onnx
from qconvert.frontends.onnx.summary import elide_weights
from qconvert.interpret import interpret
from qconvert.ir import ParserOptions, parse_module, print_module
from qconvert.ir.attributes import DenseResourceAttr, LazyElements
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.printer import print_resources

MODELS = Path(__file__).resolve().parents[2] / "models"
SAMPLES = ["tiny_encoder.qdq.onnx", "tiny_encoder.qop.onnx", "digits_cnn.qdq.onnx", "digits_cnn.qop.onnx"]
UNREGISTERED = ParserOptions(allow_unregistered_dialect=True)


def resources_of(module: object) -> list[DenseResourceAttr]:
    return [
        op.value
        for op in module.walk()  # type: ignore[attr-defined]
        if isinstance(op, ConstantOp) and isinstance(op.value, DenseResourceAttr)
    ]


def sample_inputs(name: str) -> dict[str, np.ndarray]:
    stem = name.split(".")[0]
    with np.load(MODELS / f"{stem}.inputs.npz") as data:
        return {k: data[k] for k in data.files}


def matmul_model(weight: np.ndarray, bias: np.ndarray) -> onnx.ModelProto:
    """x @ dequantize(w, per-column scale) + bias: an int8 weight and a float bias, both resources."""
    columns = weight.shape[1]
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=1, name="dq_w"),
        helper.make_node("MatMul", ["x", "wf"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "/b:ias"], ["y"], name="add"),
    ]
    initializers = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(np.linspace(0.01, 0.02, columns, dtype=np.float32), "ws"),
        numpy_helper.from_array(bias, "/b:ias"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, columns])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_resource_section_has_mlirs_format() -> None:
    text = print_resources({"blob1": np.array([1, 2, 3, 4], np.int8), "w_2": np.array([1, 2], np.float32)})
    assert text == (
        "\n{-#\n  dialect_resources: {\n    builtin: {\n"
        '      blob1: "0x0100000001020304",\n'
        '      w_2: "0x040000000000803F00000040"\n'
        "    }\n  }\n#-}\n"
    )


@pytest.mark.parametrize("name", SAMPLES)
def test_import_round_trips_and_interprets_the_same(name: str) -> None:
    lifted = import_onnx(MODELS / name)
    assert resources_of(lifted), "the sample's weights should be dense_resource blobs"
    text = print_module(lifted)
    assert "\n{-#\n  dialect_resources: {\n    builtin: {\n" in text
    parsed = parse_module(text, options=UNREGISTERED)
    assert print_module(parsed) == text
    assert all(r.elements is not None for r in resources_of(parsed))
    inputs = sample_inputs(name)
    ours, again = interpret(lifted, inputs), interpret(parsed, inputs)
    inline = interpret(import_onnx(MODELS / name, resource_threshold=0), inputs)
    for key in ours:
        np.testing.assert_array_equal(ours[key], again[key])
        np.testing.assert_array_equal(ours[key], inline[key])


def test_cli_import_then_opt_prints_identical_text(tmp_path: Path) -> None:
    out, again = tmp_path / "x.mlir", tmp_path / "y.mlir"
    assert main(["import", str(MODELS / "tiny_encoder.qdq.onnx"), "-o", str(out)]) == 0
    text = out.read_text()
    assert "dense_resource<layers.0.ff1.bias_quantized> : tensor<256xi8>" in text
    assert main(["opt", str(out), "--allow-unregistered-dialect", "-o", str(again)]) == 0
    assert again.read_text() == text + "\n"  # opt ends its output with a blank line, as mlir-opt does
    assert os.stat(out).st_mode & 0o044 == 0o644 & ~_umask() & 0o044  # not a 0600 temporary file


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_mlir_parses_our_resource_section_and_prints_the_same(tmp_path: Path) -> None:
    ir = require_module("torch_mlir.ir")
    text = print_module(import_onnx(MODELS / "tiny_encoder.qdq.onnx"))
    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        theirs = str(ir.Module.parse(text))
    assert theirs == text


def test_elide_weights_prints_mlirs_elided_form(tmp_path: Path) -> None:
    out = tmp_path / "x.mlir"
    assert main(["import", str(MODELS / "tiny_encoder.qdq.onnx"), "-o", str(out), "--elide-weights"]) == 0
    text = out.read_text()
    assert "dense_resource<__elided__>" in text and "{-#" not in text
    parsed = parse_module(text, options=UNREGISTERED)
    assert print_module(parsed) == text
    assert all(r.elements is None for r in resources_of(parsed))
    with pytest.raises(InputError, match="elided or without data"):
        interpret(parsed, sample_inputs("tiny_encoder.qdq.onnx"))


def test_names_are_made_bare_identifiers_and_unique(tmp_path: Path) -> None:
    weight = np.arange(-64, 64, dtype=np.int8).reshape(8, 16)
    model = matmul_model(weight, np.linspace(-1, 1, 16, dtype=np.float32).repeat(1))
    model.graph.initializer[0].name = "_b_ias"  # collides with the sanitized "/b:ias"
    model.graph.node[0].input[0] = "_b_ias"
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    names = [r.name for r in resources_of(import_onnx(path, resource_threshold=16))]
    assert sorted(names) == ["_b_ias", "_b_ias_1"]


def test_threshold_keeps_small_constants_inline(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(matmul_model(np.ones((4, 8), np.int8), np.zeros(8, np.float32)), str(path))
    assert not resources_of(import_onnx(path))  # 32 and 8 elements, under the default 64
    assert len(resources_of(import_onnx(path, resource_threshold=8))) == 2
    out = tmp_path / "x.mlir"
    assert main(["import", str(path), "-o", str(out), "--resource-threshold", "0"]) == 0
    assert "dense_resource" not in out.read_text()
    assert main(["import", str(path), "-o", str(out), "--resource-threshold", "-1"]) == 2


def test_external_data_is_memory_mapped(tmp_path: Path) -> None:
    weight = np.random.default_rng(0).integers(-128, 128, size=(32, 64), dtype=np.int8)
    bias = np.linspace(-1, 1, 64, dtype=np.float32)
    path = tmp_path / "m.onnx"
    onnx.save_model(
        matmul_model(weight, bias), str(path), save_as_external_data=True, location="m.data", size_threshold=0
    )
    module = import_onnx(path)
    resources = {r.name: r for r in resources_of(module)}
    assert set(resources) == {"w", "_b_ias"}
    elements = resources["w"].elements
    assert isinstance(elements, LazyElements) and not elements._cache  # nothing read while lifting
    array = elements.get()
    assert isinstance(array, np.memmap) and not array.flags.writeable
    np.testing.assert_array_equal(array, weight)
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    inline = matmul_model(weight, bias)
    expected = interpret(import_onnx(inline, resource_threshold=0), {"x": x})["y"]
    np.testing.assert_array_equal(interpret(module, {"x": x})["y"], expected)
    text = print_module(module)
    assert print_module(parse_module(text, options=UNREGISTERED)) == text
    assert print_module(import_onnx(inline)) == text  # external or in-proto: the same blobs


def test_external_data_outside_the_folder_is_refused_naming_tensor_and_path(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    model = matmul_model(np.ones((8, 16), np.int8), np.zeros(16, np.float32))
    onnx.save_model(
        model, str(folder / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0
    )
    (tmp_path / "x.bin").write_bytes((folder / "m.data").read_bytes())
    loaded = onnx.load_model(str(folder / "m.onnx"), load_external_data=False)
    for tensor in loaded.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../x.bin"
    onnx.save_model(loaded, str(folder / "m.onnx"))
    with pytest.raises(InputError, match=r"initializer 'w': external data location '\.\./x\.bin' is outside"):
        import_onnx(folder / "m.onnx")
    out = tmp_path / "out.mlir"
    assert main(["import", str(folder / "m.onnx"), "-o", str(out)]) == 2
    assert not out.exists()


def test_truncated_external_data_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    model = matmul_model(np.ones((8, 16), np.int8), np.zeros(16, np.float32))
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    data = tmp_path / "m.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(InputError, match=r"initializer '(w|ws|/b:ias)'"):
        import_onnx(path)


def test_parser_checks_blob_sizes_and_keeps_missing_blobs_without_data() -> None:
    body = "func.func @f() -> tensor<4xi8> {\n  %0 = arith.constant dense_resource<b> : tensor<4xi8>\n"
    body += "  return %0 : tensor<4xi8>\n}\n"
    short = body + '{-#\n  dialect_resources: {\n    builtin: {\n      b: "0x0100000001"\n    }\n  }\n#-}\n'
    with pytest.raises(ParseError, match="resource 'b' holds 1 bytes, but its type tensor<4xi8> needs 4"):
        parse_module(short)
    missing = parse_module(body)
    (resource,) = resources_of(missing)
    assert resource.elements is None and "{-#" not in print_module(missing)
    blob = '      b: "0x0100000001020304"\n'
    good = body + "{-#\n  dialect_resources: {\n    builtin: {\n" + blob + "    }\n  }\n#-}\n"
    (resource,) = resources_of(parse_module(good))
    assert resource.elements is not None
    np.testing.assert_array_equal(resource.elements.get(), np.array([1, 2, 3, 4], np.int8))


def test_elide_weights_counts_resources() -> None:
    module = import_onnx(MODELS / "digits_cnn.qdq.onnx")
    count = len(resources_of(module))
    assert elide_weights(module) >= count
    assert all(r.name == "__elided__" for r in resources_of(module))
