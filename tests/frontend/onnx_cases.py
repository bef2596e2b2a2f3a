"""The quantization node tests of ONNX's backend suite, prepared for lifting (shared by the frontend tests).

`collect_testcases()` builds each case in memory: a one-node model (mostly at opset 28) and data sets
whose inputs include the scale and zero point. The IR holds scale and zero point in the quant type, so
`constant_inputs_model` turns every input but the data tensor into an initializer with the test's value
(what a real QDQ model has), and `rewrite_opset` writes the model at an opset onnxruntime runs.
`parameters_as_initializers` does the same for the QOperator cases (their lifted `qconvert.*` path).
`ort_opset`, `readable_outputs` and `run_onnxruntime` run a case on onnxruntime (the frontend, writer and
StableHLO tests compare with it), `as_compared` shows our output the way onnxruntime returns it.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

QUANT_OPS = {
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
    "MatMulInteger", "ConvInteger",
}  # fmt: skip
LIFTED_AS_QUANT = {"QuantizeLinear", "DequantizeLinear"}
"""Ops lifted to quant.qcast / quant.dcast; the rest of QUANT_OPS stay generic `onnx.*` ops for now."""
# The data operands of the QOperator ops (graph inputs in a real model); the rest are scales / zero points.
QOPERATOR_DATA_INPUTS = {
    "QLinearConv": (0, 3), "QLinearMatMul": (0, 3), "MatMulInteger": (0, 1), "ConvInteger": (0, 1),
    "DynamicQuantizeLinear": (0,),
}  # fmt: skip

ORT_CANNOT_RUN = {
    "test_quantizelinear_float4e2m1": "onnxruntime 1.32 CPU has no QuantizeLinear kernel to float4e2m1 "
    "(NOT_IMPLEMENTED at opsets 23-25)",
    "test_dequantizelinear_float4e2m1": "onnxruntime 1.32 CPU has no DequantizeLinear kernel from float4e2m1 "
    "(NOT_IMPLEMENTED at opsets 23-25)",
    "test_convinteger_with_padding": "onnxruntime 1.32 ConvInteger supports only a per-tensor w_zero_point "
    "(this case has one per output channel)",
}
# Output types onnxruntime's Python API cannot hand back: read them through an appended node.
INTEGER_VIA_DEQUANTIZE = {TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2}
FLOAT_VIA_CAST = {
    TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2FNUZ, TensorProto.FLOAT4E2M1,
}  # fmt: skip


@functools.cache
def quantization_cases() -> dict[str, object]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return {c.name: c for c in cases if any(n.op_type in QUANT_OPS for n in c.model.graph.node)}


def to_array(value: object) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value)


def to_tensor(value: object, name: str) -> TensorProto:
    if isinstance(value, TensorProto):
        tensor = TensorProto()
        tensor.CopyFrom(value)
        tensor.name = name
        return tensor
    return numpy_helper.from_array(np.asarray(value), name)


def constant_inputs_model(case: object, data_inputs: int = 1) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """The case's model with inputs after the first `data_inputs` as initializers, and the feed dict."""
    model = ModelProto()
    model.CopyFrom(case.model)  # type: ignore[attr-defined]
    inputs, _ = case.data_sets[0]  # type: ignore[attr-defined]
    graph = model.graph
    node = graph.node[0]
    if node.op_type not in LIFTED_AS_QUANT:
        data_inputs = len(graph.input)
    kept = list(graph.input)[:data_inputs]
    for info, value in list(zip(graph.input, inputs))[data_inputs:]:
        graph.initializer.append(to_tensor(value, info.name))
    del graph.input[:]
    graph.input.extend(kept)
    feed = {info.name: to_array(value) for info, value in zip(kept, inputs)}
    return model, feed


def qoperator_case_names() -> list[str]:
    """The QOperator cases with static parameters (not the `*_expanded` ones, which compute the scale)."""
    return sorted(
        name
        for name, case in quantization_cases().items()
        if not name.endswith("_expanded") and case.model.graph.node[0].op_type in QOPERATOR_DATA_INPUTS  # type: ignore[attr-defined]
    )


def parameters_as_initializers(
    case: object, weights_too: bool = False
) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """The QOperator case's model with its scale / zero-point inputs as initializers (as in a real model),
    and with its second data operand (the weight) too when `weights_too`; and the feed of the rest."""
    model = ModelProto()
    model.CopyFrom(case.model)  # type: ignore[attr-defined]
    inputs, _ = case.data_sets[0]  # type: ignore[attr-defined]
    graph = model.graph
    data = QOPERATOR_DATA_INPUTS[graph.node[0].op_type]
    if weights_too:
        data = data[:1]
    kept, feed = [], {}
    for position, (info, value) in enumerate(zip(list(graph.input), inputs)):
        if position in data:
            kept.append(info)
            feed[info.name] = to_array(value)
        else:
            graph.initializer.append(to_tensor(value, info.name))
    del graph.input[:]
    graph.input.extend(kept)
    return model, feed


def expected_outputs(case: object) -> dict[str, np.ndarray]:
    _, outputs = case.data_sets[0]  # type: ignore[attr-defined]
    return {info.name: to_array(v) for info, v in zip(case.model.graph.output, outputs)}  # type: ignore[attr-defined]


def rewrite_opset(model: ModelProto, version: int) -> ModelProto:
    """A copy of `model` importing the default domain at `version` (the node's attributes unchanged)."""
    copy = ModelProto()
    copy.CopyFrom(model)
    for entry in copy.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = version
    copy.ir_version = min(copy.ir_version, 10)
    return copy


def bits_equal(actual: np.ndarray, expected: np.ndarray) -> bool:
    """Same shape and same values bit for bit (NaN equal to NaN with the same bits, -0 != +0)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    return actual.tobytes() == expected.tobytes()


# onnxruntime ---------------------------------------------------------------------------------------
def ort_opset(model: ModelProto) -> int:
    """The lowest opset onnxruntime runs the case at: 21, or 23 / 25 for float4 / 2-bit types."""
    types = {t.data_type for t in model.graph.initializer}
    types |= {i.type.tensor_type.elem_type for i in (*model.graph.input, *model.graph.output)}
    if types & {TensorProto.INT2, TensorProto.UINT2}:
        return 25
    if TensorProto.FLOAT4E2M1 in types:
        return 23
    return 21


def readable_outputs(model: ModelProto) -> ModelProto:
    """Append DequantizeLinear(scale 1) / Cast(float) to outputs onnxruntime cannot return as numpy
    (in place; returns `model`)."""
    graph = model.graph
    for output in graph.output:
        elem_type = output.type.tensor_type.elem_type
        if elem_type not in INTEGER_VIA_DEQUANTIZE | FLOAT_VIA_CAST:
            continue
        raw = f"{output.name}__raw"
        for node in graph.node:
            node.output[:] = [raw if name == output.name else name for name in node.output]
        if elem_type in INTEGER_VIA_DEQUANTIZE:
            graph.initializer.append(
                numpy_helper.from_array(np.array(1.0, np.float32), f"{output.name}__one")
            )
            graph.node.append(
                helper.make_node("DequantizeLinear", [raw, f"{output.name}__one"], [output.name])
            )
        else:
            graph.node.append(helper.make_node("Cast", [raw], [output.name], to=TensorProto.FLOAT))
        output.type.tensor_type.elem_type = TensorProto.FLOAT
    return model


def as_compared(value: np.ndarray, elem_type: int) -> np.ndarray:
    """Our output as onnxruntime shows it: float32 for the types read through readable_outputs."""
    if elem_type in INTEGER_VIA_DEQUANTIZE | FLOAT_VIA_CAST:
        return value.astype(np.float32)
    if elem_type == TensorProto.FLOAT8E4M3FN:
        return value.view(np.uint8)  # onnxruntime returns e4m3fn as its raw bytes
    return value


def run_onnxruntime(model: ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's CPU outputs, graph optimizations off (the spec oracle: nothing folded or fused)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(value) for value in session.run(None, feed)]
