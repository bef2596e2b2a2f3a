"""ONNX's quantization node tests through import_onnx -> write_onnx: the written model passes the full
checker, and onnxruntime computes the same bits on it as on the original node model.

The cases come from tests/frontend/onnx_cases.py (scale and zero point as initializers). Most are at
opset 28, which onnxruntime 1.32 cannot run for Q/DQ: the original is run at the lowest opset onnxruntime
supports for its types (as the frontend tests do); the writer itself lowers the model to 25.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from frontend.onnx_cases import (
    ORT_CANNOT_RUN,
    constant_inputs_model,
    ort_opset,
    parameters_as_initializers,
    qoperator_case_names,
    quantization_cases,
    readable_outputs,
    rewrite_opset,
    run_onnxruntime,
)
from onnx import helper, numpy_helper

from qconvert.backends.onnx import write_onnx
from qconvert.frontends.onnx import import_onnx

CASES = quantization_cases()


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
    return readable_outputs(copy)


def assert_runs_as_the_original(original: onnx.ModelProto, written: onnx.ModelProto, feed: dict) -> None:
    expected = run_onnxruntime(runnable(original, feed), {})
    actual = run_onnxruntime(runnable(written, feed), {})
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
QOPERATOR_CASES = qoperator_case_names()


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
