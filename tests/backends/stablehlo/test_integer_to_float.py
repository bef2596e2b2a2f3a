"""com.microsoft MatMulIntegerToFloat (qconvert/interpret_integer_to_float.py, backends/stablehlo/
onnx_integer_to_float.py) bit for bit against onnxruntime's CPU kernel: one node with run-time A scale and
zero point (as DynamicQuantizeLinear gives them) and per-tensor or per-column B parameters, and a
quantize_dynamic model saved by onnxruntime's own graph optimizer (`optimized_model_filepath`,
ORT_ENABLE_EXTENDED), which is where users' MatMulIntegerToFloat nodes come from: three projections of one
input share a DynamicQuantizeLinear, so they are not fused into DynamicQuantizeMatMul."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import require_module
from frontend.test_qoperator import MS, onnxruntime_outputs
from onnx import TensorProto, helper, numpy_helper

from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import interpret

pytestmark = pytest.mark.engine

FORMS = ("quantized", "integer", "qdq")


def outputs_everywhere(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    """The model's outputs on qconvert's interpreter and, in each StableHLO form, on XLA and StableHLO's
    interpreter."""
    require_module("jax")
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text

    module = import_onnx(model, {name: array.shape for name, array in inputs.items()})
    interpreted = interpret(module, inputs)
    results = {"qconvert interpreter": [interpreted[o.name] for o in model.graph.output]}
    for form in FORMS:
        text = stablehlo_text(module, form=form, inline_weights=True)
        for engine in ("xla", "interpreter"):
            outputs = run.run(text, list(inputs.values()), engine=engine)
            results[f"{engine}, {form}"] = [np.asarray(a) for a in outputs]
    return results


def assert_all_bit_exact(results: dict[str, list[np.ndarray]], expected: list[np.ndarray]) -> None:
    for label, outputs in results.items():
        assert len(outputs) == len(expected), label
        for index, (actual, reference) in enumerate(zip(outputs, expected)):
            reference = np.asarray(reference)
            assert actual.shape == reference.shape and actual.dtype == reference.dtype, (label, index)
            differ = int(np.sum(actual.view(np.uint32) != reference.view(np.uint32)))
            assert differ == 0, (
                f"{label}, output {index}: {differ} of {reference.size} differ from onnxruntime"
            )


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype", "per_column", "bias"),
    [(np.uint8, np.int8, False, True), (np.uint8, np.uint8, True, False), (np.int8, np.int8, True, True)],
)
def test_matmul_integer_to_float_bit_exact(
    a_dtype: type, b_dtype: type, per_column: bool, bias: bool
) -> None:
    rng = np.random.default_rng(7)
    a_info, b_info = np.iinfo(a_dtype), np.iinfo(b_dtype)
    k, n = 40, 12
    inputs = {
        "a": rng.integers(a_info.min, a_info.max + 1, (2, 5, k)).astype(a_dtype),
        "a_scale": np.array(0.0123, np.float32),
        "a_zero": np.array(a_info.min + 131, a_dtype),
    }
    b_parameters = (n,) if per_column else ()
    initializers = {
        "b": rng.integers(b_info.min, b_info.max + 1, (k, n)).astype(b_dtype),
        "b_scale": rng.uniform(0.001, 0.05, b_parameters).astype(np.float32),
        "b_zero": rng.integers(b_info.min, b_info.max + 1, b_parameters).astype(b_dtype),
    }
    names = ["a", "b", "a_scale", "b_scale", "a_zero", "b_zero"]
    if bias:
        initializers["bias"] = rng.standard_normal(n).astype(np.float32)
        names.append("bias")
    node = helper.make_node("MatMulIntegerToFloat", names, ["y"], name="mmitf", domain=MS)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for name, a in inputs.items()
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    expected = onnxruntime_outputs(model, inputs)
    assert_all_bit_exact(outputs_everywhere(model, inputs), expected)


def test_onnxruntime_optimized_dynamic_model(tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(8)
    hidden = 32
    nodes, initializers, outputs = [], [], []
    for name in ("query", "key", "value"):
        weight = rng.standard_normal((hidden, hidden)).astype(np.float32)
        initializers += [
            numpy_helper.from_array(weight, f"{name}_w"),
            numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), f"{name}_b"),
        ]
        nodes += [
            helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_m"], name=f"{name}_matmul"),
            helper.make_node("Add", [f"{name}_m", f"{name}_b"], [name], name=f"{name}_add"),
        ]
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 6, hidden]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6, hidden])],
        outputs,
        initializers,
    )
    float_path, dynamic_path, optimized_path = tmp_path / "f.onnx", tmp_path / "d.onnx", tmp_path / "o.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), float_path)
    quantize_dynamic(float_path, dynamic_path, weight_type=QuantType.QInt8)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(optimized_path)
    ort.InferenceSession(str(dynamic_path), options, providers=["CPUExecutionProvider"])
    model = onnx.load(optimized_path)
    fused = [n for n in model.graph.node if n.op_type == "MatMulIntegerToFloat"]
    assert len(fused) == 3, [n.op_type for n in model.graph.node]
    inputs = {"x": rng.standard_normal((2, 6, hidden)).astype(np.float32)}
    expected = onnxruntime_outputs(model, inputs)
    assert_all_bit_exact(outputs_everywhere(model, inputs), expected)
