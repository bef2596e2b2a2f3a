"""qconvert/check/ort_large.py: a model past protobuf's limit runs in onnxruntime with its large weights
passed beside the proto, and the caller's model is left as it was. The limit is lowered here so a small
model takes that path (a real 2.5 GiB model: tests/large/)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconvert.check import ort_large


def _model() -> tuple[object, np.ndarray]:
    weight = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)  # 2 MiB: detached
    bias = np.arange(1024, dtype=np.float32)  # 4 KiB: stays in the proto
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1024])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weight


def test_past_the_limit_the_weights_go_beside_the_proto(monkeypatch: pytest.MonkeyPatch) -> None:
    model, weight = _model()
    model.graph.initializer[0].data_location = TensorProto.DEFAULT  # pyright: ignore[reportAttributeAccessIssue]
    before = model.SerializeToString()  # pyright: ignore[reportAttributeAccessIssue]
    whole = ort.InferenceSession(before, providers=["CPUExecutionProvider"])
    monkeypatch.setattr(ort_large, "PROTOBUF_LIMIT", 10_000)
    session = ort_large.inference_session(model, ort.SessionOptions(), ["CPUExecutionProvider"])  # pyright: ignore[reportArgumentType]
    assert len(session.qconvert_initializers) == 1  # the 2 MiB weight only
    x = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], whole.run(None, {"x": x})[0])
    assert model.SerializeToString() == before  # pyright: ignore[reportAttributeAccessIssue]
    assert weight.nbytes > ort_large.DETACH_BYTES
