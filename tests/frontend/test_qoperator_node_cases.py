"""ONNX's own node tests of the QOperator ops, with scales and zero points as initializers so that they
take the lifted `qconvert.*` path: each lifts, prints, parses back and interprets to onnxruntime's
outputs bit for bit (its CPU kernels, graph optimizations off), and to ONNX's expected outputs."""

from __future__ import annotations

import numpy as np
import pytest
from frontend.onnx_cases import (
    ORT_CANNOT_RUN,
    expected_outputs,
    parameters_as_initializers,
    qoperator_case_names,
    quantization_cases,
    run_onnxruntime,
)

from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import interpret
from qconvert.ir import ParserOptions, parse_module, print_module, verify
from qconvert.ir.dialects.qconvert import FloatStorageCastOp, QOperatorOp

CASES = {name: quantization_cases()[name] for name in qoperator_case_names()}


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_qoperator_node_case_lifts_and_matches_onnxruntime(case_name: str) -> None:
    case = CASES[case_name]
    model, feed = parameters_as_initializers(case, weights_too=True)  # weights are initializers too
    module = import_onnx(model)
    names = [op.name for op in module.walk()]  # type: ignore[attr-defined]
    assert any(n.startswith("qconvert.") for n in names) and not any(n.startswith("onnx.") for n in names), (
        names
    )
    text = print_module(module)
    parsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    verify(parsed)  # the qconvert dialect's verifier accepts what ONNX's own cases lift to
    dialect_ops = [op for op in parsed.walk() if op.name.startswith("qconvert.")]
    assert all(isinstance(op, QOperatorOp | FloatStorageCastOp) for op in dialect_ops), dialect_ops
    ours = interpret(parsed, feed)  # type: ignore[arg-type]
    expected = expected_outputs(case)
    if case_name not in ORT_CANNOT_RUN:
        for output, reference in zip(model.graph.output, run_onnxruntime(model, feed)):
            np.testing.assert_array_equal(np.asarray(ours[output.name]), reference)
            assert np.asarray(ours[output.name]).dtype == reference.dtype
    for name, reference in expected.items():
        np.testing.assert_array_equal(np.asarray(ours[name]), reference)


def test_every_qoperator_node_case_is_covered() -> None:
    assert {CASES[n].model.graph.node[0].op_type for n in CASES} == {  # type: ignore[attr-defined]
        "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "DynamicQuantizeLinear"
    }  # fmt: skip
