"""Every quantization node test of ONNX's backend suite, converted to StableHLO and run on XLA:CPU.

Each case is lifted the way the frontend tests lift it (tests/frontend/onnx_cases.py: Q/DQ parameters as
initializers, other ops' inputs kept as graph inputs), converted in the `integer` and the `quantized`
form, run on XLA:CPU, and compared bit for bit with the suite's expected outputs and with onnxruntime.
A case StableHLO cannot express is listed in `NOT_EXPRESSIBLE` with the reason, and the converter must
still refuse it with the matching error: the list cannot rot (a case that starts converting fails here
until it moves to the exact list), and every case is in exactly one of the two lists.

DynamicQuantizeLinear and MatMulInteger / ConvInteger with run-time zero points (generic `onnx.*` ops)
lower as onnxruntime's kernels (onnx_integer.py) and run in the exact list. `QOPERATOR_LOWERED`: with
constant scales (as in a QOperator model) the frontend lifts QLinearConv / QLinearMatMul / *Integer /
DynamicQuantizeLinear to quant-typed `qconvert.*` ops, lowered by onnx_qoperator.py / onnx_integer.py;
those run bit for bit too. QLinearConv / QLinearMatMul with run-time scales stay generic and refused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from conftest import require_module
from frontend.onnx_cases import (
    LIFTED_AS_QUANT,
    ORT_CANNOT_RUN,
    as_compared,
    bits_equal,
    constant_inputs_model,
    expected_outputs,
    ort_opset,
    parameters_as_initializers,
    quantization_cases,
    readable_outputs,
    rewrite_opset,
    run_onnxruntime,
)
from onnx import ModelProto

from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx

pytestmark = pytest.mark.engine

CASES = quantization_cases()
FORMS = ("integer", "quantized")

FLOAT4 = (
    "float4 storage: StableHLO has no f4E2M1FN element type at all (its quantized storage types are "
    "integers; float8 and blocked scales are written out as arithmetic, float4 has nothing to be stored in)"
)
RUN_TIME_SCALE = (
    "scale and zero point are run-time graph inputs in this test: the frontend keeps a generic onnx.{op} "
    "(no quant type), and StableHLO quantized types need compile-time scales"
)
EXPANDED = (
    "the scale is computed in the graph (ReduceMin/ReduceMax/Div/Round): the frontend keeps a generic "
    "onnx.QuantizeLinear (no quant type); StableHLO quantized types need compile-time scales"
)
# Case -> (reason, pattern the converter's error must match in both forms).
NOT_EXPRESSIBLE: dict[str, tuple[str, str]] = {
    "test_dequantizelinear_float4e2m1": (FLOAT4, r"StableHLO has no f4E2M1FN element type"),
    "test_quantizelinear_float4e2m1": (FLOAT4, r"StableHLO has no f4E2M1FN element type"),
    "test_dynamicquantizelinear_expanded": (EXPANDED, r"onnx\.QuantizeLinear: no StableHLO lowering"),
    "test_dynamicquantizelinear_max_adjusted_expanded": (EXPANDED, r"onnx\.QuantizeLinear: no StableHLO"),
    "test_dynamicquantizelinear_min_adjusted_expanded": (EXPANDED, r"onnx\.QuantizeLinear: no StableHLO"),
    **{
        name: (RUN_TIME_SCALE.format(op=op), rf"onnx\.{op}: no StableHLO lowering")
        for name, op in [
            ("test_qlinearconv", "QLinearConv"),
            *[(n, "QLinearMatMul") for n in sorted(CASES) if n.startswith("test_qlinearmatmul_")],
        ]
    },
}
EXACT = sorted(set(CASES) - set(NOT_EXPRESSIBLE))

# With constant scales (what a QOperator model has): the lifted quant-typed op each case lowers through.
QOPERATOR_LOWERED: dict[str, str] = {
    **{n: "qconvert.qlinear_matmul" for n in sorted(CASES) if n.startswith("test_qlinearmatmul_")},
    "test_qlinearconv": "qconvert.qlinear_conv",
    "test_matmulinteger": "qconvert.matmul_integer",
    "test_convinteger_with_padding": "qconvert.conv_integer",
    "test_convinteger_without_padding": "qconvert.conv_integer",
    "test_dynamicquantizelinear": "qconvert.dynamic_quantize_linear",
    "test_dynamicquantizelinear_max_adjusted": "qconvert.dynamic_quantize_linear",
    "test_dynamicquantizelinear_min_adjusted": "qconvert.dynamic_quantize_linear",
}
INTEGER_KERNELS = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"}
"""Run in the exact list as onnxruntime's kernels (their zero points at run time, or computed)."""


@pytest.fixture(scope="module")
def stablehlo() -> tuple[Callable[..., str], Callable[..., list[np.ndarray]]]:
    """`stablehlo_text` and `run`, imported after the engine check."""
    require_module("jax")
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.backends.stablehlo.run import run

    return stablehlo_text, run


def convert(stablehlo_text: Callable[..., str], model: ModelProto, form: str) -> str:
    return stablehlo_text(import_onnx(model, resource_threshold=0), form)


def test_every_case_is_either_exact_or_listed_with_a_reason() -> None:
    assert len(CASES) == 45  # shared/engines/README.md: 45 node tests concern quantization
    assert set(NOT_EXPRESSIBLE) <= set(CASES), sorted(set(NOT_EXPRESSIBLE) - set(CASES))
    assert set(QOPERATOR_LOWERED) <= set(CASES)
    kinds = {CASES[name].model.graph.node[0].op_type for name in EXACT}  # type: ignore[attr-defined]
    assert kinds == LIFTED_AS_QUANT | INTEGER_KERNELS  # Q/DQ with integer storage, the integer kernels
    # Integer storage from 2 to 16 bits, float8 storage and blocked scales all run (the last two written out).
    assert {"test_quantizelinear_int2", "test_dequantizelinear_uint4", "test_quantizelinear_e5m2"} <= set(
        EXACT
    )
    assert {"test_dequantizelinear_blocked", "test_quantizelinear_blocked_symmetric"} <= set(EXACT)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case_name", EXACT)
def test_node_case_runs_on_xla_bit_exactly(
    stablehlo: tuple[Callable[..., str], Callable[..., list[np.ndarray]]], case_name: str, form: str
) -> None:
    stablehlo_text, run = stablehlo
    model, feed = constant_inputs_model(CASES[case_name])
    text = convert(stablehlo_text, model, form)
    if form == "integer":
        assert "!quant." not in text  # no quant types at all in the integer form
    outputs = run(text, [feed[i.name] for i in model.graph.input], "xla")
    expected = expected_outputs(CASES[case_name])
    assert len(outputs) == len(expected)
    for info, actual in zip(model.graph.output, outputs):
        want = expected[info.name]
        assert bits_equal(actual, want), f"{info.name}: XLA {actual!r} ({actual.dtype}), expected {want!r}"
    onnxruntime_outputs = _onnxruntime(case_name)
    if onnxruntime_outputs is not None:
        for info, actual in zip(model.graph.output, outputs):
            ours = as_compared(actual, info.type.tensor_type.elem_type)
            theirs = onnxruntime_outputs[info.name]
            assert bits_equal(ours, theirs), f"{info.name}: XLA {ours!r}, onnxruntime {theirs!r}"


def _onnxruntime(case_name: str) -> dict[str, np.ndarray] | None:
    """onnxruntime's outputs for a Q/DQ case, read the way the frontend tests read them (float32 for
    types its Python API cannot return); None where onnxruntime has no kernel."""
    if case_name in ORT_CANNOT_RUN:
        return None
    model, feed = constant_inputs_model(CASES[case_name], data_inputs=0)
    model = rewrite_opset(model, ort_opset(model))
    names = [o.name for o in model.graph.output]
    return dict(zip(names, run_onnxruntime(readable_outputs(model), feed)))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case_name", sorted(NOT_EXPRESSIBLE))
def test_listed_case_still_cannot_be_converted(
    stablehlo: tuple[Callable[..., str], Callable[..., list[np.ndarray]]], case_name: str, form: str
) -> None:
    stablehlo_text, _ = stablehlo
    model, _ = constant_inputs_model(CASES[case_name])
    _, pattern = NOT_EXPRESSIBLE[case_name]
    with pytest.raises(InputError, match=pattern):
        convert(stablehlo_text, model, form)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case_name", sorted(QOPERATOR_LOWERED))
def test_qoperator_case_with_constant_scales_runs_on_xla_bit_exactly(
    stablehlo: tuple[Callable[..., str], Callable[..., list[np.ndarray]]], case_name: str, form: str
) -> None:
    stablehlo_text, run = stablehlo
    model, feed = parameters_as_initializers(CASES[case_name])  # constant scales, as in a real model
    module = import_onnx(model, resource_threshold=0)
    assert QOPERATOR_LOWERED[case_name] in [op.name for op in module.walk()]  # type: ignore[attr-defined]
    text = stablehlo_text(module, form)
    outputs = run(text, [feed[i.name] for i in model.graph.input], "xla")
    expected = expected_outputs(CASES[case_name])
    assert len(outputs) == len(expected)
    for info, actual in zip(model.graph.output, outputs):
        want = expected[info.name]
        assert bits_equal(actual, want), f"{info.name}: XLA {actual!r} ({actual.dtype}), expected {want!r}"
