"""The quantization node tests of ONNX's backend suite, prepared for lifting (shared by the frontend tests).

`collect_testcases()` builds each case in memory: a one-node model (mostly at opset 28) and data sets
whose inputs include the scale and zero point. The IR holds scale and zero point in the quant type, so
`constant_inputs_model` turns every input but the data tensor into an initializer with the test's value
(what a real QDQ model has), and `rewrite_opset` writes the model at an opset onnxruntime runs.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
from onnx import ModelProto, TensorProto, numpy_helper

QUANT_OPS = {
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
    "MatMulInteger", "ConvInteger",
}  # fmt: skip
LIFTED_AS_QUANT = {"QuantizeLinear", "DequantizeLinear"}
"""Ops lifted to quant.qcast / quant.dcast; the rest of QUANT_OPS stay generic `onnx.*` ops for now."""


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
