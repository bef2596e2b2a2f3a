"""predicted_mismatch_float8 against onnxruntime's fp8 QuantizeLinear: where AscendQuant's float32 x·(1/s)
(the emulator, `ascend_quant`) and onnxruntime's x/s give different fp8 codes, the prediction says so, and
nowhere else. onnxruntime's Python API returns no float8_e5m2 tensor, so both types are read back through a
DequantizeLinear: y = float32(code · s) names its code exactly (s > 0, and float32 holds every fp8 value times
s far closer than half the fp8 spacing)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.numerics.ascendc import (
    AscendQuantMode,
    ascend_quant,
    predicted_mismatch_float8,
    quant_parameters_from_onnx,
)

SCALE = 0.0371
TYPES = {"float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e5m2": TensorProto.FLOAT8E5M2}


def _onnxruntime_codes(x: np.ndarray, name: str) -> np.ndarray:
    onnxruntime = require_module("onnxruntime")
    zero = helper.make_tensor("z", TYPES[name], (), [0.0])
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
        [numpy_helper.from_array(np.array(SCALE, np.float32), "s"), zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    (y,) = session.run(None, {"x": x})
    dtype = np.dtype(getattr(ml_dtypes, name))
    return (y.astype(np.float64) / np.float32(SCALE)).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("name", list(TYPES))
def test_float8_prediction_names_exactly_the_differing_codes(name: str) -> None:
    dtype = np.dtype(getattr(ml_dtypes, name))
    grid = np.unique(np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64))
    grid = grid[np.isfinite(grid)]
    midpoints = (grid[:-1] + grid[1:]) / 2  # where the rounded reciprocal can move x/s across a tie
    rng = np.random.default_rng(8)
    largest = float(ml_dtypes.finfo(dtype).max)
    x = np.concatenate(
        [
            midpoints * SCALE,
            np.nextafter((midpoints * SCALE).astype(np.float32), np.float32(np.inf)),
            np.array([2 * largest * SCALE, -2 * largest * SCALE, np.inf, -np.inf]),  # saturation
            rng.normal(0.0, 8.0, 1000),
        ]
    ).astype(np.float32)
    theirs = _onnxruntime_codes(x, name)
    reciprocal, offset = quant_parameters_from_onnx(SCALE, 0)  # the host's 1.0f / s, as the backend
    ours = ascend_quant(x, reciprocal, offset, mode=AscendQuantMode.PER_TENSOR, dst_dtype=dtype)
    differs = ours.view(np.uint8) != theirs.view(np.uint8)
    predicted = predicted_mismatch_float8(x, SCALE, dtype)
    assert np.array_equal(differs, predicted), (int(differs.sum()), int(predicted.sum()))
    assert 0 < int(differs.sum()) < midpoints.size  # the ties part some codes, never the random bulk
    bits = [codes.view(np.uint8).astype(np.int64) for codes in (ours, theirs)]
    ordinals = [np.where(b & 0x80, -(b & 0x7F), b) for b in bits]  # adjacent fp8 values differ by 1
    assert np.all(np.abs(ordinals[0] - ordinals[1])[differs] == 1)  # one fp8 step, never more
