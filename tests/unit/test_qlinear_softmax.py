"""numerics' com.microsoft QLinearSoftmax rule pinned against onnxruntime's CPU kernel, bit for bit."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from qconvert.numerics.onnxruntime_kernels import qlinear_softmax_onnxruntime

CASES = [  # (shape, axis, opset)
    ((4, 16), -1, 13),
    ((2, 3, 5, 16), -1, 13),
    ((2, 7, 5), 1, 13),  # softmax along a middle axis: onnxruntime transposes
    ((3, 4, 6), 1, 12),  # opset < 13: rows are everything from the axis on
    ((2, 130), -1, 13),  # a long row
]


def onnxruntime_softmax(
    x: np.ndarray, x_scale: float, x_zero: int, y_scale: float, y_zero: int, axis: int, opset: int
) -> np.ndarray:
    dtype = x.dtype
    node = helper.make_node(
        "QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft", axis=axis, opset=opset
    )
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", elem, list(x.shape))],
        [helper.make_tensor_value_info("y", elem, list(x.shape))],
        [
            numpy_helper.from_array(np.float32(x_scale), "xs"),
            numpy_helper.from_array(np.array(x_zero, dtype), "xz"),
            numpy_helper.from_array(np.float32(y_scale), "ys"),
            numpy_helper.from_array(np.array(y_zero, dtype), "yz"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("shape", "axis", "opset"), CASES)
def test_qlinear_softmax_matches_onnxruntime(
    dtype: type, shape: tuple[int, ...], axis: int, opset: int
) -> None:
    rng = np.random.default_rng(21)
    info = np.iinfo(dtype)
    for trial in range(6):
        x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        if trial == 1:  # one dominant element per row: the probability saturates (int8 wraps past 127)
            x = np.full(shape, info.min, dtype)
            x.reshape(-1)[:: shape[-1]] = info.max
        x_scale = float(np.float32(rng.uniform(0.01, 0.3)))
        y_scale = [1 / 256, 1 / 255, 1 / 128, float(np.float32(rng.uniform(0.002, 0.02)))][trial % 4]
        y_zero = int(info.min) if trial % 2 == 0 else int(rng.integers(info.min, info.min + 20))
        expected = onnxruntime_softmax(x, x_scale, 0, y_scale, y_zero, axis, opset)
        ours = qlinear_softmax_onnxruntime(x, x_scale, y_scale, y_zero, np.dtype(dtype), axis, opset)
        assert ours.dtype == expected.dtype
        mismatches = int(np.sum(ours != expected))
        assert mismatches == 0, f"trial {trial}: {mismatches} of {expected.size} differ"
