"""ONNX's own node tests of the QOperator ops, with scales and zero points as initializers so that they
take the lifted `qconvert.*` path: each lifts, prints, parses back and interprets to onnxruntime's
outputs bit for bit (its CPU kernels, graph optimizations off), and to ONNX's expected outputs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import ModelProto, numpy_helper

from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import interpret
from qconvert.ir import ParserOptions, parse_module, print_module

from .onnx_cases import expected_outputs, quantization_cases, to_array

QOPERATOR_DATA_INPUTS = {
    "QLinearConv": (0, 3),
    "QLinearMatMul": (0, 3),
    "MatMulInteger": (0, 1),
    "ConvInteger": (0, 1),
}
CASES = {
    name: case
    for name, case in quantization_cases().items()
    if not name.endswith("_expanded")
    and case.model.graph.node[0].op_type in {*QOPERATOR_DATA_INPUTS, "DynamicQuantizeLinear"}  # type: ignore[attr-defined]
}
# Cases onnxruntime cannot run (compared with ONNX's expected outputs only).
ORT_CANNOT_RUN = {
    "test_convinteger_with_padding": "onnxruntime 1.32 ConvInteger takes a per-tensor w_zero_point only"
}


def parameters_as_initializers(case: object) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """Every input but the data operands (A / B, x / w) becomes an initializer; weights too."""
    model = ModelProto()
    model.CopyFrom(case.model)  # type: ignore[attr-defined]
    inputs, _ = case.data_sets[0]  # type: ignore[attr-defined]
    graph = model.graph
    data = QOPERATOR_DATA_INPUTS.get(graph.node[0].op_type, (0,))[:1]
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


def onnxruntime_outputs(model: ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_qoperator_node_case_lifts_and_matches_onnxruntime(case_name: str) -> None:
    case = CASES[case_name]
    model, feed = parameters_as_initializers(case)
    module = import_onnx(model)
    names = [op.name for op in module.walk()]  # type: ignore[attr-defined]
    assert any(n.startswith("qconvert.") for n in names) and not any(n.startswith("onnx.") for n in names), (
        names
    )
    text = print_module(module)
    parsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    ours = interpret(parsed, feed)  # type: ignore[arg-type]
    expected = expected_outputs(case)
    if case_name not in ORT_CANNOT_RUN:
        for output, reference in zip(model.graph.output, onnxruntime_outputs(model, feed)):
            np.testing.assert_array_equal(np.asarray(ours[output.name]), reference)
            assert np.asarray(ours[output.name]).dtype == reference.dtype
    for name, reference in expected.items():
        np.testing.assert_array_equal(np.asarray(ours[name]), reference)


def test_every_qoperator_node_case_is_covered() -> None:
    assert {CASES[n].model.graph.node[0].op_type for n in CASES} == {  # type: ignore[attr-defined]
        "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "DynamicQuantizeLinear"
    }  # fmt: skip
