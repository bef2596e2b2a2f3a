"""ONNX's quantization node tests through import_onnx -> write_onnx: the written model passes the full
checker, and onnxruntime computes the same bits on it as on the original node model.

The cases come from tests/frontend/onnx_cases.py (scale and zero point as initializers). Most are at
opset 28, which onnxruntime 1.32 cannot run for Q/DQ: the original is run at the lowest opset onnxruntime
supports for its types (as the frontend tests do); the writer itself lowers the model to 25.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from frontend.onnx_cases import constant_inputs_model, quantization_cases, rewrite_opset, to_array
from onnx import TensorProto, helper, numpy_helper

from qconvert.backends.onnx import write_onnx
from qconvert.frontends.onnx import import_onnx

CASES = quantization_cases()
ORT_CANNOT_RUN = {
    "test_quantizelinear_float4e2m1": "onnxruntime 1.32 CPU has no QuantizeLinear kernel to float4e2m1",
    "test_dequantizelinear_float4e2m1": "onnxruntime 1.32 CPU has no DequantizeLinear kernel from float4e2m1",
    "test_convinteger_with_padding": "onnxruntime 1.32 ConvInteger takes only a per-tensor w_zero_point",
}
# Types onnxruntime's Python API can neither take nor return: inputs become initializers, outputs are
# read through a DequantizeLinear (scale 1) or a Cast to float appended to both models.
DEQUANTIZE_TO_READ = {TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2}
CAST_TO_READ = {TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2FNUZ}


def ort_opset(model: onnx.ModelProto) -> int:
    types = {t.data_type for t in model.graph.initializer}
    types |= {i.type.tensor_type.elem_type for i in (*model.graph.input, *model.graph.output)}
    if types & {TensorProto.INT2, TensorProto.UINT2}:
        return 25
    return 23 if TensorProto.FLOAT4E2M1 in types else 21


def runnable(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy with every graph input an initializer of its feed value, and every output readable."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    for info in graph.input:
        tensor = numpy_helper.from_array(feed[info.name], info.name)
        if tensor.data_type != info.type.tensor_type.elem_type:  # e.g. uint4 values held as numpy uint8
            tensor = helper.make_tensor(
                info.name, info.type.tensor_type.elem_type, feed[info.name].shape, feed[info.name].flatten()
            )
        graph.initializer.append(tensor)
    del graph.input[:]
    for output in graph.output:
        elem_type = output.type.tensor_type.elem_type
        if elem_type not in DEQUANTIZE_TO_READ | CAST_TO_READ:
            continue
        raw = f"{output.name}__raw"
        for node in graph.node:
            node.output[:] = [raw if name == output.name else name for name in node.output]
        if elem_type in DEQUANTIZE_TO_READ:
            graph.initializer.append(
                numpy_helper.from_array(np.array(1.0, np.float32), f"{output.name}__one")
            )
            graph.node.append(
                helper.make_node("DequantizeLinear", [raw, f"{output.name}__one"], [output.name])
            )
        else:
            graph.node.append(helper.make_node("Cast", [raw], [output.name], to=TensorProto.FLOAT))
        output.type.tensor_type.elem_type = TensorProto.FLOAT
    return copy


def run_onnxruntime(model: onnx.ModelProto) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(value) for value in session.run(None, {})]


def assert_runs_as_the_original(original: onnx.ModelProto, written: onnx.ModelProto, feed: dict) -> None:
    expected = run_onnxruntime(runnable(original, feed))
    actual = run_onnxruntime(runnable(written, feed))
    for want, got in zip(expected, actual, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), f"ours {got!r}, original {want!r}"


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_node_case_writes_back_and_runs_as_the_original(case_name: str) -> None:
    model, feed = constant_inputs_model(CASES[case_name])
    written = write_onnx(import_onnx(model))  # checks with full_check=True
    onnx.checker.check_model(written, full_check=True)
    kept = [n.op_type for n in model.graph.node if n.op_type != "Constant"]  # Constants: initializers
    assert [n.op_type for n in written.graph.node] == kept
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in written.graph.node):
        assert written.opset_import[0].version <= 25
    if case_name in ORT_CANNOT_RUN:
        pytest.skip(f"written and checked; not run: {ORT_CANNOT_RUN[case_name]}")
    original = model
    if model.graph.node[0].op_type in ("QuantizeLinear", "DequantizeLinear"):
        original = rewrite_opset(model, ort_opset(model))
    assert_runs_as_the_original(original, written, feed)


# The QOperator cases with their parameters as initializers take the frontend's qconvert.* path.
QOPERATOR_DATA_INPUTS = {"QLinearConv": (0, 3), "QLinearMatMul": (0, 3), "MatMulInteger": (0, 1)}
QOPERATOR_DATA_INPUTS |= {"ConvInteger": (0, 1), "DynamicQuantizeLinear": (0,)}
QOPERATOR_CASES = sorted(
    name
    for name, case in CASES.items()
    if not name.endswith("_expanded") and case.model.graph.node[0].op_type in QOPERATOR_DATA_INPUTS  # type: ignore[attr-defined]
)


def parameters_as_initializers(case: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The case's model with every input but its data operands as an initializer, and the feed."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)  # type: ignore[attr-defined]
    inputs, _ = case.data_sets[0]  # type: ignore[attr-defined]
    graph = model.graph
    data = QOPERATOR_DATA_INPUTS[graph.node[0].op_type]
    kept, feed = [], {}
    for position, (info, value) in enumerate(zip(list(graph.input), inputs)):
        if position in data:
            kept.append(info)
            feed[info.name] = to_array(value)
        else:
            graph.initializer.append(numpy_helper.from_array(to_array(value), info.name))
    del graph.input[:]
    graph.input.extend(kept)
    return model, feed


@pytest.mark.parametrize("case_name", QOPERATOR_CASES)
def test_lifted_qoperator_case_writes_back_and_runs_as_the_original(case_name: str) -> None:
    model, feed = parameters_as_initializers(CASES[case_name])
    module = import_onnx(model)
    assert any(op.name.startswith("qconvert.") for op in module.walk())  # type: ignore[attr-defined]
    written = write_onnx(module)
    assert [n.op_type for n in written.graph.node] == [n.op_type for n in model.graph.node]
    if case_name in ORT_CANNOT_RUN:
        pytest.skip(f"written and checked; not run: {ORT_CANNOT_RUN[case_name]}")
    assert_runs_as_the_original(model, written, feed)
