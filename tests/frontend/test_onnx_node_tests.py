"""Every quantization node test of ONNX's backend suite: lift, print, parse back, verify, interpret, and
match both the suite's expected outputs and onnxruntime, bit for bit.

QuantizeLinear / DequantizeLinear lift to quant.qcast / quant.dcast; DynamicQuantizeLinear, QLinearConv,
QLinearMatMul, MatMulInteger and ConvInteger are not yet lifted to quant types: they stay generic
`onnx.*` ops (interpreted by onnx's reference implementation), and are tested as such. The three
`*_expanded` DynamicQuantizeLinear cases compute the scale at run time: their QuantizeLinear has no
static quant type and stays a generic `onnx.QuantizeLinear` op, checked as such.
"""

from __future__ import annotations

import numpy as np
import pytest
from frontend.onnx_cases import (
    LIFTED_AS_QUANT,
    ORT_CANNOT_RUN,
    as_compared,
    bits_equal,
    constant_inputs_model,
    expected_outputs,
    ort_opset,
    quantization_cases,
    readable_outputs,
    rewrite_opset,
    run_onnxruntime,
)

from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import interpret
from qconvert.ir import ParserOptions, parse_module, print_module, verify
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp

CASES = quantization_cases()
DYNAMIC_SCALE_CASES = sorted(name for name in CASES if name.endswith("_expanded"))
LIFTABLE = sorted(CASES)


def round_trip(case_name: str) -> tuple[object, object, dict[str, np.ndarray]]:
    model, feed = constant_inputs_model(CASES[case_name])
    module = import_onnx(model)
    verify(module)
    text = print_module(module)
    parsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    verify(parsed)
    assert print_module(parsed) == text, "print -> parse -> print is not a fixed point"
    return module, parsed, feed


@pytest.mark.parametrize("case_name", LIFTABLE)
def test_node_case_lifts_round_trips_and_interprets_bit_exactly(case_name: str) -> None:
    module, parsed, feed = round_trip(case_name)
    op_type = CASES[case_name].model.graph.node[0].op_type  # type: ignore[attr-defined]
    ops = list(module.walk())  # type: ignore[attr-defined]
    if case_name in DYNAMIC_SCALE_CASES:  # the scale is computed by the graph: a generic QuantizeLinear
        assert any(op.name == "onnx.QuantizeLinear" for op in ops)
    elif op_type == "QuantizeLinear":
        assert any(isinstance(op, QuantizeCastOp) for op in ops)
    elif op_type == "DequantizeLinear":
        assert any(isinstance(op, DequantizeCastOp) for op in ops)
    else:  # generic when its parameters are graph inputs; DynamicQuantizeLinear has none (qoperator.py)
        lifted_name = "qconvert.dynamic_quantize_linear" if op_type == "DynamicQuantizeLinear" else None
        assert any(op.name in (f"onnx.{op_type}", lifted_name) for op in ops)
    expected = expected_outputs(CASES[case_name])
    for label, lifted in (("lifted", module), ("parsed back", parsed)):
        actual = interpret(lifted, feed)  # type: ignore[arg-type]
        for name, value in expected.items():
            assert bits_equal(actual[name], value), (
                f"{label} module, output {name}: got {actual[name]!r} ({actual[name].dtype}), "
                f"expected {value!r} ({value.dtype})"
            )


@pytest.mark.parametrize("case_name", DYNAMIC_SCALE_CASES)
def test_run_time_scale_keeps_quantize_linear_generic(case_name: str) -> None:
    model, _ = constant_inputs_model(CASES[case_name])
    names = [op.name for op in import_onnx(model).walk()]  # type: ignore[attr-defined]
    assert "onnx.QuantizeLinear" in names and "quant.qcast" not in names


# onnxruntime ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("case_name", LIFTABLE)
def test_node_case_interpretation_matches_onnxruntime(case_name: str) -> None:
    if case_name in ORT_CANNOT_RUN:
        pytest.skip(ORT_CANNOT_RUN[case_name])
    case = CASES[case_name]
    model, feed = constant_inputs_model(case)
    ours = interpret(import_onnx(model), feed)
    is_quant = case.model.graph.node[0].op_type in LIFTED_AS_QUANT  # type: ignore[attr-defined]
    # onnxruntime's Python API cannot take int4 / int2 / float8 inputs either: the data input becomes an
    # initializer too (graph optimizations are off, so nothing is folded).
    ort_model, ort_feed = constant_inputs_model(case, data_inputs=0) if is_quant else (model, feed)
    if is_quant:
        ort_model = rewrite_opset(ort_model, ort_opset(ort_model))
    output_types = {o.name: o.type.tensor_type.elem_type for o in ort_model.graph.output}
    theirs = run_onnxruntime(readable_outputs(ort_model), ort_feed)
    for (name, elem_type), value in zip(output_types.items(), theirs):
        mine = as_compared(ours[name], elem_type)
        assert bits_equal(mine, np.asarray(value)), f"output {name}: ours {mine!r}, onnxruntime {value!r}"
