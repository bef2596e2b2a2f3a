"""Shared by the `--target-cosine` search tests: the model whose small channels int8 crushes.

NOTE: not a test module; tests/calibrate/test_target_cosine.py and test_search_fixes.py use it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def write_crushed_channels_model(folder: Path) -> tuple[Path, Path]:
    """x -> MatMul -> h -> MatMul -> y; half of h's channels are ~50x the others (large weight columns) and
    the second MatMul ignores them (zero weight rows), so int8 on h crushes the channels y is made of. Half
    the channels large: the median channel is large too, so the outlier-channel default (max / median
    channel) does not widen h by itself. Returns (model, 64 samples as .npz)."""
    rng = np.random.default_rng(0)
    first = rng.normal(size=(16, 16)).astype(np.float32)
    first[:, :8] *= 50
    second = rng.normal(size=(16, 8)).astype(np.float32)
    second[:8] = 0
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2"),
        ],
        "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(first, "w1"), numpy_helper.from_array(second, "w2")],
    )
    model = folder / "outlier.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    data = folder / "data.npz"
    np.savez(data, x=rng.normal(size=(64, 16)).astype(np.float32))
    return model, data
