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
from frontend.onnx_cases import constant_inputs_model, quantization_cases, rewrite_opset
from onnx import TensorProto, helper, numpy_helper

from qconvert.backends.onnx import write_onnx
from qconvert.errors import InputError
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
    return session.run(None, {})


def _is_lifted_qoperator(module: object) -> bool:
    return any(
        op.name.startswith("qconvert.") and op.name != "qconvert.storage_cast"
        for op in module.walk()  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_node_case_writes_back_and_runs_as_the_original(case_name: str) -> None:
    model, feed = constant_inputs_model(CASES[case_name])
    module = import_onnx(model)
    if _is_lifted_qoperator(module):  # DynamicQuantizeLinear: lifted to qconvert.dynamic_quantize_linear
        with pytest.raises(InputError, match=r"'qconvert\.\w+'.*cannot be written back to ONNX yet"):
            write_onnx(module)
        return
    written = write_onnx(module)  # checks with full_check=True
    onnx.checker.check_model(written, full_check=True)
    assert written.opset_import[0].version <= 25 or not any(
        n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in written.graph.node
    )
    if case_name in ORT_CANNOT_RUN:
        pytest.skip(f"written and checked; not run: {ORT_CANNOT_RUN[case_name]}")
    original = model
    if model.graph.node[0].op_type in ("QuantizeLinear", "DequantizeLinear"):
        original = rewrite_opset(model, ort_opset(model))
    expected = run_onnxruntime(runnable(original, feed))
    actual = run_onnxruntime(runnable(written, feed))
    for want, got in zip(expected, actual, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), f"ours {got!r}, original {want!r}"
